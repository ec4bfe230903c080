//! An [`Explanation`] as `leasegate explain` prints it: plain text for
//! people, JSON for scripts (the same facts, and the live state of each
//! key when `--admin` asked a running gateway).

use crate::limit::report::KeyState;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::Explanation;

impl Explanation {
    /// For people: one line per fact, aligned.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let Some(route) = &self.route else {
            let _ = writeln!(
                s,
                "no route matches {} {}: the gateway answers 404, and no limit applies",
                self.method, self.path
            );
            return s;
        };
        let host = route.host.as_deref().map(|h| format!(", host {h}")).unwrap_or_default();
        let case = if route.case_sensitive { "" } else { " in any case" };
        let _ = writeln!(
            s,
            "route     {} (path_prefix {}{case}{host}; {}; on_store_failure {})",
            route.name, route.path_prefix, route.action, route.on_store_failure
        );
        let _ = writeln!(s, "request   x-request-id {}", request_id_text(self.request_id));
        if let Some(why) = &self.rejected {
            let _ = writeln!(
                s,
                "identity  rejected: {why}\n          the gateway answers 401 before any limit is checked ({})",
                self.rejected_by
            );
            return s;
        }
        let Some(id) = &self.identity else { return s };
        let mut about = Vec::new();
        if let Some(t) = &id.tenant {
            about.push(format!("tenant {t}"));
        }
        if let Some(p) = &id.plan {
            about.push(format!("plan {p}"));
        }
        about.push(format!("client {}", id.client_ip));
        let _ = writeln!(s, "identity  {} ({})", id.value, about.join(", "));
        for (tier, why) in &id.passed_over {
            let _ = writeln!(s, "          not {tier}: {why}");
        }
        if self.limits.is_empty() && self.skipped.is_empty() {
            let _ = writeln!(s, "limits    none on this route");
        }
        for l in &self.limits {
            let mut mode = l.mode.to_string();
            if let Some(on) = l.canary_enforcing {
                mode.push_str(if on {
                    " (enforces on this instance)"
                } else {
                    " (does not enforce on this instance)"
                });
            }
            let mut notes = Vec::new();
            if let Some(p) = &l.plan {
                notes.push(format!("plan {p}"));
            }
            if let Some((i, n)) = l.shard {
                notes.push(format!("shard {i} of {n}"));
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join(", "))
            };
            let quota = if l.algorithm == "concurrency" {
                format!("max {} in flight", l.capacity)
            } else {
                format!("{} capacity {}", l.rate, l.capacity)
            };
            let _ = writeln!(
                s,
                "limit     {} {mode} {} {quota}{notes}\n          key {}",
                l.name, l.algorithm, l.key
            );
            // The default, every response, goes without saying.
            if l.headers != "all" {
                let _ = writeln!(s, "          headers {}", headers_text(l.headers));
            }
            if let Some(cost) = &l.cost {
                let _ = writeln!(s, "          cost {cost}");
            }
            if self.live_from.is_some() {
                let _ = writeln!(s, "          live {}", live_text(l.live.as_ref()));
            }
        }
        for (name, why) in &self.skipped {
            let _ = writeln!(s, "skipped   {name}: {why}");
        }
        if let Some(from) = &self.live_from {
            let _ = writeln!(s, "live      from {from}");
        }
        s
    }

    /// For scripts: `route`, `identity` (`tier:value`) and `limits[]`
    /// (`name`, `mode`, `algorithm`, `rate`, `capacity`, `key`), plus the
    /// details the text shows. `route` and `identity` are `null` when no
    /// route matches (or the identity is rejected).
    pub fn to_json(&self) -> Value {
        let mut v = self.json_without_live();
        if self.live_from.is_some() {
            if let Some(limits) = v.get_mut("limits").and_then(Value::as_array_mut) {
                for (out, l) in limits.iter_mut().zip(&self.limits) {
                    if let Some(o) = out.as_object_mut() {
                        o.insert("live".into(), json!(l.live));
                    }
                }
            }
        }
        v
    }

    fn json_without_live(&self) -> Value {
        json!({
            "method": self.method,
            "path": self.path,
            "route": self.route.as_ref().map(|r| r.name.clone()),
            "route_detail": self.route.as_ref().map(|r| json!({
                "name": r.name,
                "path_prefix": r.path_prefix,
                "case_sensitive": r.case_sensitive,
                "host": r.host,
                "action": r.action,
                "on_store_failure": r.on_store_failure,
            })),
            "identity": self.identity.as_ref().map(|i| i.value.clone()),
            "identity_detail": self.identity.as_ref().map(|i| json!({
                "tier": i.tier,
                "value": i.value,
                "tenant": i.tenant,
                "plan": i.plan,
                "client_ip": i.client_ip.to_string(),
                "passed_over": i.passed_over.iter().map(|(tier, why)| json!({"tier": tier, "reason": why})).collect::<Vec<_>>(),
            })),
            "rejected": self.rejected,
            "limits": self.limits.iter().map(|l| json!({
                "name": l.name,
                "mode": l.mode,
                "canary_enforcing": l.canary_enforcing,
                "algorithm": l.algorithm,
                "rate": l.rate,
                "capacity": l.capacity,
                "plan": l.plan,
                "shard": l.shard.map(|(i, _)| i),
                "shards": l.shard.map(|(_, n)| n),
                "key": l.key,
                "key_hash": l.key_hash,
                "cost": l.cost,
                "headers": l.headers,
            })).collect::<Vec<_>>(),
            "request_id": self.request_id,
            "live_from": self.live_from,
            "skipped": self.skipped.iter().map(|(name, why)| json!({"name": name, "reason": why})).collect::<Vec<_>>(),
        })
    }
}

/// `[gateway] request_id`, for people.
fn request_id_text(mode: &str) -> String {
    let what = match mode {
        "generate" => "the client's if sane, else one made here; sent upstream and returned in place of the upstream's",
        "forward" => "the client's if sane, else one made here; sent upstream, and returned only if the response has none of its own",
        "off" => "none made or set: passed as the client and the upstream send it",
        _ => "",
    };
    format!("{mode} ({what})")
}

/// A limit's `headers`, for people.
fn headers_text(headers: &str) -> String {
    let what = match headers {
        "all" => "RateLimit* fields on every response",
        "refusals" => "RateLimit* fields on 429s only",
        "none" => "no RateLimit* field; its 429 says Retry-After only",
        _ => "",
    };
    format!("{headers} ({what})")
}

/// One line of a key's live state, for people.
pub(super) fn live_text(state: Option<&KeyState>) -> String {
    let Some(st) = state else {
        return "unknown: the gateway's answer did not name this key".to_string();
    };
    let mut parts = Vec::new();
    if st.tracked {
        parts.push(format!("{} token(s) at hand", st.tokens_at_hand));
        if st.tokens_reserved > 0 {
            parts.push(format!(
                "{} reserved in the drained bucket, spent here as they come due",
                st.tokens_reserved
            ));
        }
    } else {
        parts.push("not tracked on this instance (no lease, no block): its next request asks the store".to_string());
    }
    if st.blocked_for_ms > 0 {
        parts.push(format!(
            "blocked for {} ms, Retry-After {} ms",
            st.blocked_for_ms, st.retry_after_ms
        ));
    } else if st.tracked {
        parts.push("not blocked".to_string());
    }
    if st.tracked {
        parts.push(format!(
            "store: {} left, whole in {} ms",
            st.store_remaining, st.reset_ms
        ));
    }
    if let Some(f) = &st.last_store_failure {
        parts.push(format!("last store failure: {f}"));
    }
    if let Some(o) = &st.overridden {
        parts.push(format!(
            "override for {} in force: {} burst {}{}, not the file's rate",
            o.who,
            o.rate,
            o.burst,
            o.expires.as_ref().map_or(String::new(), |e| format!(" until {e}"))
        ));
    }
    parts.join("; ")
}
