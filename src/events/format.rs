//! The DogStatsD event datagram (pure).
//!
//! `_e{<title bytes>,<text bytes>}:<title>|<text>|t:<alert type>|k:<aggregation key>|s:leasegate|#<tags>`,
//! lengths in UTF-8 bytes of what is sent. Values a client can influence
//! (the identity, and in principle configured names) are sanitised here:
//! no `|`, `#`, `,` or control characters in tags, no `|` or line breaks in
//! the text, every field cut to a bounded length on a character boundary,
//! so one event is one well-formed datagram whatever the request carried.

use std::fmt::Write as _;

/// Which rollout stage refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Shadow,
    Soft,
}

impl Kind {
    pub fn title(self) -> &'static str {
        match self {
            Kind::Shadow => "RateLimitShadowBlock",
            Kind::Soft => "RateLimitSoftBlock",
        }
    }

    /// Shadow is information for whoever rolls the limit out; soft warns
    /// clients already, so the event warns too.
    pub fn alert_type(self) -> &'static str {
        match self {
            Kind::Shadow => "info",
            Kind::Soft => "warning",
        }
    }

    fn mode(self) -> &'static str {
        match self {
            Kind::Shadow => crate::limit::policy::Mode::Shadow.as_str(),
            Kind::Soft => crate::limit::policy::Mode::Soft.as_str(),
        }
    }
}

/// One over-quota decision worth telling the event pipeline about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub limit: String,
    pub route: String,
    /// `user`, `key`, `fingerprint`, `subnet`.
    pub tier: &'static str,
    /// `<tier>:<value>`: client-influenced, sanitised when formatted.
    pub identity: String,
    pub over_percent: u64,
    pub instance: String,
}

/// Longest tag value kept (Datadog truncates tags at 200 characters).
pub const MAX_TAG: usize = 100;
/// Longest identity kept in the text.
pub const MAX_IDENTITY: usize = 128;

/// The datagram for `e`. At most a few hundred bytes, whatever its inputs.
pub fn datagram(e: &Event) -> String {
    let limit = tag_value(&e.limit);
    let route = tag_value(&e.route);
    let instance = tag_value(&e.instance);
    let text = format!(
        "limit {limit} ({mode}) on route {route}: {identity} is {pct}% over quota (instance {instance})",
        mode = e.kind.mode(),
        identity = text_value(&e.identity, MAX_IDENTITY),
        pct = e.over_percent,
    );
    let title = e.kind.title();
    let mut out = String::with_capacity(64 + title.len() + text.len() + 3 * MAX_TAG);
    let _ = write!(
        out,
        "_e{{{},{}}}:{title}|{text}|t:{}|k:{}|s:leasegate|#limit:{limit},route:{route},tier:{},instance:{}",
        title.len(),
        text.len(),
        e.kind.alert_type(),
        tag_value(&format!("{}:{}", e.limit, e.identity)),
        tag_value(e.tier),
        instance,
    );
    out
}

/// A tag value: separators of the datagram (`|`, `#`, `,`), whitespace and
/// control characters become `_`, cut to [`MAX_TAG`] bytes.
pub fn tag_value(s: &str) -> String {
    clean(s, MAX_TAG, |c| {
        if c == '|' || c == '#' || c == ',' || c.is_whitespace() || c.is_control() {
            '_'
        } else {
            c
        }
    })
}

/// Text: `|` and control characters (line breaks included) become `_`, cut
/// to `max` bytes.
pub fn text_value(s: &str, max: usize) -> String {
    clean(s, max, |c| if c == '|' || c.is_control() { '_' } else { c })
}

fn clean(s: &str, max: usize, map: impl Fn(char) -> char) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for c in s.chars().map(map) {
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(identity: &str) -> Event {
        Event {
            kind: Kind::Shadow,
            limit: "per_client".into(),
            route: "api".into(),
            tier: "key",
            identity: identity.into(),
            over_percent: 40,
            instance: "gw-a".into(),
        }
    }

    /// Parses a datagram the way an agent does: the lengths first.
    fn parse(d: &str) -> (String, String, Vec<String>) {
        let rest = d.strip_prefix("_e{").unwrap();
        let (lens, rest) = rest.split_once("}:").unwrap();
        let (t, x) = lens.split_once(',').unwrap();
        let (t, x): (usize, usize) = (t.parse().unwrap(), x.parse().unwrap());
        let title = &rest[..t];
        assert_eq!(&rest[t..t + 1], "|");
        let text = &rest[t + 1..t + 1 + x];
        let fields: Vec<String> = rest[t + 1 + x..].split('|').skip(1).map(String::from).collect();
        (title.into(), text.into(), fields)
    }

    #[test]
    fn a_shadow_event_is_one_well_formed_datagram() {
        let d = datagram(&event("key:acme"));
        let (title, text, fields) = parse(&d);
        assert_eq!(title, "RateLimitShadowBlock");
        assert_eq!(
            text,
            "limit per_client (shadow) on route api: key:acme is 40% over quota (instance gw-a)"
        );
        assert_eq!(
            fields,
            [
                "t:info",
                "k:per_client:key:acme",
                "s:leasegate",
                "#limit:per_client,route:api,tier:key,instance:gw-a"
            ]
        );
        assert!(d.starts_with("_e{20,"), "{d}");
    }

    #[test]
    fn soft_events_warn() {
        let mut e = event("user:bob");
        e.kind = Kind::Soft;
        let (title, text, fields) = parse(&datagram(&e));
        assert_eq!(title, "RateLimitSoftBlock");
        assert!(text.contains("(soft)") && text.contains("40% over quota"), "{text}");
        assert_eq!(fields.first().map(String::as_str), Some("t:warning"));
    }

    #[test]
    fn client_values_cannot_break_the_datagram() {
        let nasty = "user:x|t:error|#admin:true\nsecond line\r,é";
        let d = datagram(&event(nasty));
        assert!(!d.contains('\n') && !d.contains('\r'), "{d}");
        let (_, text, fields) = parse(&d);
        assert!(text.contains("user:x_t:error_#admin:true_second line_,é"), "{text}");
        // Exactly the four fields we wrote: nothing injected.
        assert_eq!(fields.len(), 4, "{fields:?}");
        assert_eq!(fields[1], "k:per_client:user:x_t:error__admin:true_second_line__é");
        // The tags hold only our four keys.
        let tags: Vec<&str> = fields[3].trim_start_matches('#').split(',').collect();
        assert_eq!(tags.len(), 4, "{tags:?}");
    }

    #[test]
    fn lengths_count_bytes_and_long_values_are_cut_on_char_boundaries() {
        let long = format!("user:{}", "é".repeat(500));
        let d = datagram(&event(&long));
        let (_, text, fields) = parse(&d);
        assert!(text.contains(&"é".repeat(61)), "{text}");
        assert!(!text.contains(&"é".repeat(62)), "{text}");
        assert!(fields[1].len() <= 2 + MAX_TAG, "{}", fields[1]);
        assert!(d.len() < 1_000, "{}", d.len());
        assert_eq!(tag_value(&"x".repeat(300)).len(), MAX_TAG);
        assert_eq!(text_value("ab|c\td", 4), "ab_c");
    }
}
