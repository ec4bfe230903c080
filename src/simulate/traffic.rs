//! Seeded traffic: which client (hence key) sends each request, and which
//! instance receives it.

use super::Spread;

/// A cumulative distribution to draw indices from.
struct Cdf(Vec<f64>);

impl Cdf {
    /// Weights `1/(i+1)^s` over `n` items (s = 0: uniform).
    fn zipf(n: u64, s: f64) -> Cdf {
        let mut acc = 0.0;
        let mut v = Vec::with_capacity(n as usize);
        for i in 0..n {
            acc += 1.0 / ((i + 1) as f64).powf(s);
            v.push(acc);
        }
        Cdf(v)
    }

    fn draw(&self, rng: &mut fastrand::Rng) -> usize {
        let total = self.0.last().copied().unwrap_or(0.0);
        let u = rng.f64() * total;
        self.0.partition_point(|&c| c <= u).min(self.0.len().saturating_sub(1))
    }
}

pub struct Traffic {
    rng: fastrand::Rng,
    clients: Cdf,
    keys: u64,
    instances: Option<Cdf>,
    n: usize,
}

impl Traffic {
    pub fn new(seed: u64, clients: u64, keys: u64, zipf: f64, spread: Spread, instances: u64) -> Traffic {
        Traffic {
            rng: fastrand::Rng::with_seed(seed),
            clients: Cdf::zipf(clients, zipf),
            keys,
            instances: (spread == Spread::Skewed).then(|| Cdf::zipf(instances, 1.0)),
            n: instances as usize,
        }
    }

    /// The next request's client, and its key (client mod keys).
    pub fn client(&mut self) -> (u64, usize) {
        let c = self.clients.draw(&mut self.rng) as u64;
        (c, (c % self.keys) as usize)
    }

    /// The next request's instance, among the live ones (the next live
    /// one after a dead draw).
    pub fn instance(&mut self, live: &[bool]) -> usize {
        let first = match &self.instances {
            Some(cdf) => cdf.draw(&mut self.rng),
            None => self.rng.usize(..self.n),
        };
        (0..self.n)
            .map(|d| (first + d) % self.n)
            .find(|&i| live[i])
            .unwrap_or(first)
    }
}

/// Requests arriving in millisecond `t` (0-based) at `rate` per second:
/// evenly paced, the fractions carried over.
pub fn arrivals(rate: f64, t: u64) -> u64 {
    let upto = |ms: u64| (rate * ms as f64 / 1000.0).floor() as u64;
    upto(t + 1) - upto(t)
}
