//! `[events]`: where shadow and soft events go, and how often per key.

use std::net::SocketAddr;
use std::time::Duration;

use toml::Spanned;

use super::{in_range, Check};
use crate::config::raw;
use crate::events::Settings as Events;

/// Default `min_interval_ms`: one event per key per 10 s.
pub(super) const MIN_INTERVAL_MS: u64 = 10_000;

pub(super) fn events(c: &mut Check, e: &Spanned<raw::Events>) -> Option<Events> {
    let raw = e.get_ref();
    let min_interval = in_range(
        c,
        &raw.min_interval_ms,
        "events.min_interval_ms",
        100,
        86_400_000,
        MIN_INTERVAL_MS,
    );
    let Some(addr) = &raw.dogstatsd else {
        c.at(
            e.span(),
            "events.dogstatsd",
            "missing: set the agent's UDP address, such as \"127.0.0.1:8125\" (or remove [events])",
        );
        return None;
    };
    let dogstatsd = match addr.get_ref().parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 => a,
        Ok(_) => {
            c.at(
                addr.span(),
                "events.dogstatsd",
                "port 0 is not an agent's port: use 8125",
            );
            return None;
        }
        Err(_) => {
            c.at(
                addr.span(),
                "events.dogstatsd",
                format!(
                    "{:?} is not a socket address such as \"127.0.0.1:8125\" or \"[::1]:8125\" (no host names)",
                    addr.get_ref()
                ),
            );
            return None;
        }
    };
    Some(Events {
        dogstatsd,
        min_interval: Duration::from_millis(min_interval),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{parse, ConfigError, Problem};

    const BASE: &str = "[listeners]\nhttp = \"127.0.0.1:0\"\n";

    fn problems(text: &str) -> Vec<Problem> {
        match parse(Path::new("gateway.toml"), text) {
            Err(ConfigError::Invalid(p)) => p,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn absent_means_no_events_and_defaults_apply() {
        assert!(parse(Path::new("g.toml"), BASE).unwrap().events.is_none());
        let c = parse(
            Path::new("g.toml"),
            &format!("{BASE}[events]\ndogstatsd = \"127.0.0.1:8125\"\n"),
        )
        .unwrap();
        let e = c.events.clone().unwrap();
        assert_eq!(e.dogstatsd, "127.0.0.1:8125".parse().unwrap());
        assert_eq!(e.min_interval.as_millis(), 10_000);
        assert!(c
            .summary()
            .contains("events    dogstatsd 127.0.0.1:8125, at most one per key per 10000 ms"));
        let c = parse(
            Path::new("g.toml"),
            &format!("{BASE}[events]\ndogstatsd = \"[::1]:9125\"\nmin_interval_ms = 500\n"),
        )
        .unwrap();
        assert_eq!(c.events.unwrap().min_interval.as_millis(), 500);
    }

    #[test]
    fn bad_values_name_their_line_and_key() {
        let p = problems(&format!(
            "{BASE}[events]\ndogstatsd = \"datadog-agent:8125\"\nmin_interval_ms = 5\n"
        ));
        assert_eq!(p.len(), 2, "{p:?}");
        let addr = p.iter().find(|p| p.key == "events.dogstatsd").unwrap();
        assert_eq!(addr.line, Some(4));
        assert!(addr.reason.contains("not a socket address"), "{}", addr.reason);
        let interval = p.iter().find(|p| p.key == "events.min_interval_ms").unwrap();
        assert_eq!(interval.line, Some(5));
        assert!(interval.reason.contains("use 100 to 86400000"), "{}", interval.reason);

        let p = problems(&format!("{BASE}[events]\nmin_interval_ms = 1000\n"));
        assert_eq!((p[0].key.as_str(), p[0].line), ("events.dogstatsd", Some(3)));
        assert!(p[0].reason.contains("missing"), "{}", p[0].reason);

        let p = problems(&format!("{BASE}[events]\ndogstatsd = \"127.0.0.1:0\"\n"));
        assert_eq!((p[0].key.as_str(), p[0].line), ("events.dogstatsd", Some(4)));

        // Unknown keys are errors, as everywhere.
        let p = problems(&format!(
            "{BASE}[events]\ndogstatsd = \"127.0.0.1:8125\"\ninterval = 3\n"
        ));
        assert_eq!(p.len(), 1, "{p:?}");
    }
}
