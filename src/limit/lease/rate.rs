//! A key's rates, read and written on store calls only, never on the
//! spending path: the request rate that sizes the next lease (estimated
//! from what was spent since the last grant, with no counter on the
//! spending path) and the admitted rate, a one-minute average that is the
//! local fallback's base while the store is away.

use std::sync::atomic::{AtomicU64, Ordering};

use super::tokens::Tokens;

/// Time constant of the admitted-rate average, ms.
const ADMITTED_TAU_MS: f64 = 60_000.0;

/// Exponentially weighted rate: each new sample counts for half.
pub fn ewma(previous: f64, sample: f64) -> f64 {
    if previous <= 0.0 {
        sample
    } else {
        0.5 * previous + 0.5 * sample
    }
}

/// The rate estimate and the admitted-rate average of one lease.
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct RateEstimate {
    /// Tokens at hand right after the last grant: what was spent since is
    /// the rate estimate's sample, with no counter on the spending path.
    level_at_grant: AtomicU64,
    /// When the last store call was made, ms.
    sampled_at: AtomicU64,
    /// Smoothed requests per second, as f64 bits.
    qps: AtomicU64,
    /// Tokens spent, decayed with a one-minute time constant, as f64 bits:
    /// this instance's recent admitted rate for the key (the fallback's base).
    admitted: AtomicU64,
    /// When `admitted` was last brought up to date, ms.
    admitted_at: AtomicU64,
    /// When `admitted` began counting, ms (a young average is corrected).
    admitted_since: AtomicU64,
    /// Tokens spent but not yet in `admitted`: recorded when the store next
    /// answers, so calls that fail (an outage) neither add nor decay.
    unrecorded: AtomicU64,
}

impl RateEstimate {
    /// A grant left `level` tokens at hand: the next sample starts there.
    pub(super) fn granted(&self, level: u64) {
        self.level_at_grant.store(level, Ordering::Relaxed);
    }

    /// Tokens added to those at hand outside a grant (a reservation's, as
    /// they come due) raise the level the sample starts from: they are
    /// not spent yet.
    pub(super) fn added(&self, tokens: u64) {
        self.level_at_grant.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Tokens taken out unspent (expired, released, evicted) leave the
    /// level the rate sample starts from: they were not spent. Nothing
    /// taken, nothing written (the sweep asks every lease, most unexpired).
    pub(super) fn untake(&self, taken: u64) {
        if taken == 0 {
            return;
        }
        let _ = self
            .level_at_grant
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(l.saturating_sub(taken)));
    }

    /// Updates the rate estimate from what was spent from `tokens` since
    /// the last grant and returns it, in requests per second; `asking` is 1
    /// when a request without a token is asking (its hit counts too), 0 for
    /// a background refill.
    pub(super) fn next_qps(&self, tokens: &Tokens, lookahead_ms: u64, now_ms: u64, asking: u64) -> f64 {
        let level = self.level_at_grant.swap(0, Ordering::Relaxed);
        // Spent since the grant, plus the request asking now.
        let hits = level.saturating_sub(tokens.available()) + asking;
        let since = self.sampled_at.swap(now_ms, Ordering::Relaxed);
        if since != 0 {
            // Spent tokens were admitted; the asking request is not, yet.
            self.unrecorded.fetch_add(hits - asking, Ordering::Relaxed);
        }
        // A rate is never measured over less than half the lookahead: a
        // burst of n requests at one instant earns a lease of at most 2n,
        // not n per millisecond (the wake-up of a queue would otherwise look
        // like a flood and earn full-size leases). Steady traffic refills at
        // the low watermark, 3/4 of a lookahead apart, so it is not biased.
        let elapsed_ms = now_ms.saturating_sub(since).max(lookahead_ms / 2).max(1);
        let previous = f64::from_bits(self.qps.load(Ordering::Relaxed));
        // A first sample, or one after a long silence, says little: damp it.
        let sample = if since == 0 {
            0.0
        } else {
            hits as f64 * 1_000.0 / elapsed_ms as f64
        };
        let qps = ewma(previous, sample);
        self.qps.store(qps.to_bits(), Ordering::Relaxed);
        qps
    }

    /// The store answered: tokens spent since the last answer, plus
    /// `admitted_now`, join the decayed admitted count.
    pub(super) fn record_admitted(&self, admitted_now: u64, now_ms: u64) {
        let hits = self.unrecorded.swap(0, Ordering::Relaxed) + admitted_now;
        if self.admitted_since.load(Ordering::Relaxed) == 0 {
            self.admitted_since.store(now_ms.max(1), Ordering::Relaxed);
            self.admitted_at.store(now_ms, Ordering::Relaxed);
        }
        let decayed = self.admitted_decayed(now_ms);
        self.admitted
            .store((decayed + hits as f64).to_bits(), Ordering::Relaxed);
        self.admitted_at.store(now_ms, Ordering::Relaxed);
    }

    fn admitted_decayed(&self, now_ms: u64) -> f64 {
        let count = f64::from_bits(self.admitted.load(Ordering::Relaxed));
        let at = self.admitted_at.load(Ordering::Relaxed);
        let dt = now_ms.saturating_sub(at) as f64;
        count * (-dt / ADMITTED_TAU_MS).exp()
    }

    /// Admitted in about the last minute, as of the store's last answer:
    /// the decayed count, not scaled up while young.
    pub(super) fn admitted_last_minute(&self) -> f64 {
        f64::from_bits(self.admitted.load(Ordering::Relaxed)) * 60_000.0 / ADMITTED_TAU_MS
    }

    /// The admitted rate, per second, as of the store's last answer; an
    /// average younger than a minute is scaled up by the share of the
    /// minute it has seen (at least a second).
    pub(super) fn admitted_rate(&self) -> f64 {
        let since = self.admitted_since.load(Ordering::Relaxed);
        if since == 0 {
            return 0.0;
        }
        let at = self.admitted_at.load(Ordering::Relaxed);
        let age_ms = at.saturating_sub(since).max(1_000) as f64;
        let seen = 1.0 - (-age_ms / ADMITTED_TAU_MS).exp();
        f64::from_bits(self.admitted.load(Ordering::Relaxed)) * 1_000.0 / (ADMITTED_TAU_MS * seen)
    }
}
