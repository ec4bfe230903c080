//! What a request costs under a limit with `cost = { reserve, settle }`:
//! the reserve taken at admission ([`Reserve`], from a number, a request
//! header or a field of the JSON request body), and what the response says
//! it really cost ([`Settle`], read by a [`meter::Meter`] as the body
//! streams past). At the end of the response the difference goes to the
//! key's lease ([`Settlement`]): a refund to spend again, or a charge that
//! may leave the key owing the store. No store call is made for it.
//!
//! Rooms: `api` (the LLM API presets), `rewrite` (the `openai` preset's
//! request and stream rewrites), `meter` (reading the cost from a
//! response), `settle` (the refund or the debt).

pub mod api;
mod json_scan;
pub mod meter;
pub mod rewrite;
mod settle;

pub use api::{Api, ApiRequest, ApiSettle, Endpoint};
pub use settle::{Settlement, Settlements};

/// What a request reserves under each of its limits with a cost: the
/// limit and its tokens (inline for two).
pub type Reserves = smallvec::SmallVec<[(std::sync::Arc<super::LimitRuntime>, u64); 2]>;

use http::{HeaderMap, HeaderName};

/// A limit's cost rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    pub reserve: Reserve,
    /// `None`: the reserve is the cost.
    pub settle: Option<Settle>,
    /// What an upstream's failure costs when it reports no usage.
    pub errors: OnError,
    /// The preset the rules came from, if any (`api = "openai"`).
    pub api: Option<Api>,
    /// What a request whose field is absent (or whose body cannot be
    /// read) reserves: beside a preset's prompt estimate, or for a
    /// `json:`/`header:` reserve.
    pub reserve_default: u64,
    /// What a cost that never arrives is charged.
    pub unsettled: OnUnsettled,
}

/// `unsettled`: what a response whose cost never arrived (cut, missing,
/// oversized) is charged. Never less than its reserve, nor than what it
/// showed before it was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnsettled {
    /// The larger of the reserve and an estimate of what the upstream
    /// sent: the prompt estimate plus its content bytes ÷ 4 (the default
    /// for the presets).
    Estimate,
    /// The reserve stands (the default for explicit rules).
    Reserve,
    /// This many tokens.
    Fixed(u64),
}

impl OnUnsettled {
    /// As written in the config.
    pub fn describe(self) -> String {
        match self {
            OnUnsettled::Estimate => "estimate".into(),
            OnUnsettled::Reserve => "reserve".into(),
            OnUnsettled::Fixed(n) => n.to_string(),
        }
    }

    /// What a request that reserved `reserve` and never settled is
    /// charged: `seen`, what it showed of its cost before it was cut;
    /// `estimate`, the prompt estimate plus the content it sent ÷ 4.
    pub fn charge(self, reserve: u64, seen: Option<u64>, estimate: u64) -> u64 {
        let floor = reserve.max(seen.unwrap_or(0));
        match self {
            OnUnsettled::Estimate => floor.max(estimate),
            OnUnsettled::Reserve => floor,
            OnUnsettled::Fixed(n) => n.max(seen.unwrap_or(0)),
        }
    }
}

impl Cost {
    /// A cost of `reserve`, settled by `settle`, with the defaults for the
    /// rest (`errors = "free"`, an absent field reserving 1, the reserve
    /// standing for a cost that never arrives).
    pub fn new(reserve: Reserve, settle: Option<Settle>) -> Cost {
        Cost {
            reserve,
            settle,
            errors: OnError::Free,
            api: None,
            reserve_default: 1,
            unsettled: OnUnsettled::Reserve,
        }
    }

    /// Whether requests' JSON bodies are read for it (a `json:` reserve,
    /// a preset's).
    pub fn reads_body(&self) -> bool {
        self.reserve.needs_body()
    }
}

/// `errors`: what a request costs whose upstream answered with an error
/// (status 400 or more) reporting no usage, or gave no answer at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Nothing: the reserve goes back (providers do not bill failed
    /// requests, and during an incident a client must not lose its budget
    /// to requests that served nothing).
    #[default]
    Free,
    /// The reserve stands.
    Reserve,
}

crate::spelling::spellings!(OnError {
    Free => "free",
    Reserve => "reserve",
});

/// What a request reserves at admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// A number of tokens.
    Fixed(u64),
    /// An integer request header (1 when absent).
    Header(HeaderName),
    /// A numeric field of the JSON request body (`reserve_default` when
    /// absent): the body is read first, up to `[gateway]
    /// max_cost_body_bytes`.
    Json(JsonFields),
    /// A preset's: the prompt estimate (the body's bytes ÷ 4) plus the
    /// request's output limit, or `reserve_default` ([`api::read_request`]).
    Api(Api),
}

/// Where the real cost is read once the response ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// A response header, or a trailer.
    Header(HeaderName),
    /// A numeric field of the JSON response body; of a
    /// `text/event-stream`, the last `data:` event that holds it. Shared:
    /// each response's meter holds it.
    Json(std::sync::Arc<JsonFields>),
    /// The response body's bytes.
    ResponseBytes,
    /// The request body's bytes.
    RequestBytes,
    /// A preset's usage fields, by how the response comes (JSON, an event
    /// stream, NDJSON).
    Api(ApiSettle),
}

/// One or more numeric fields of a JSON document, added up:
/// `usage.total_tokens`, or `usage.input_tokens+usage.output_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonFields(pub Vec<JsonPath>);

/// A field's path: object keys and array indices, dot-separated
/// (`choices.0.usage.total_tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPath(pub Vec<String>);

/// Why a cost rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    #[error("reserve {0} is out of range: use 1 or more")]
    ReserveRange(i64),
    #[error("{0:?}: expected N, \"header:NAME\" or \"json:PATH\"")]
    Reserve(String),
    #[error("{0:?}: expected \"header:NAME\", \"json:PATH\", \"response_bytes\" or \"request_bytes\"")]
    Settle(String),
    #[error("{0:?} is not a valid header name")]
    HeaderName(String),
    #[error("{0:?}: a JSON path is dot-separated field names, such as usage.total_tokens (terms joined by +)")]
    Path(String),
}

/// Why a request's reserve could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error("the {0} header must be a whole number of tokens")]
    NotANumber(HeaderName),
}

impl Reserve {
    /// `N`, `"header:NAME"` or `"json:PATH"`.
    pub fn parse(text: &str) -> Result<Reserve, CostError> {
        if let Some(name) = text.strip_prefix("header:") {
            return header_name(name).map(Reserve::Header);
        }
        if let Some(path) = text.strip_prefix("json:") {
            return JsonFields::parse(path).map(Reserve::Json);
        }
        Err(CostError::Reserve(text.to_string()))
    }

    /// A number of tokens (1 or more).
    pub fn fixed(n: i64) -> Result<Reserve, CostError> {
        match u64::try_from(n) {
            Ok(n @ 1..) => Ok(Reserve::Fixed(n)),
            _ => Err(CostError::ReserveRange(n)),
        }
    }

    /// The request's reserve, from its headers and (for a `json:` reserve)
    /// its body as read (a byte order mark skipped): at least 1, at most
    /// `capacity` (more could never fit). An absent header or field, or a
    /// body that is not JSON, reserves `default`: the settle charges the
    /// rest. A preset's reserve is [`api::read_request`]'s (the caller
    /// reads it: it needs the request's path).
    pub fn of_request(
        &self,
        headers: &HeaderMap,
        body: Option<&[u8]>,
        default: u64,
        capacity: u64,
    ) -> Result<u64, ReserveError> {
        let n = match self {
            Reserve::Fixed(n) => *n,
            Reserve::Header(name) => match headers.get(name) {
                None => default,
                Some(v) => v
                    .to_str()
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .ok_or_else(|| ReserveError::NotANumber(name.clone()))?,
            },
            Reserve::Json(fields) => body.and_then(|b| fields.read(rewrite::skip_bom(b))).unwrap_or(default),
            Reserve::Api(_) => default,
        };
        Ok(n.clamp(1, capacity.max(1)))
    }

    /// Whether the request body must be read before the decision.
    pub fn needs_body(&self) -> bool {
        matches!(self, Reserve::Json(_) | Reserve::Api(_))
    }

    /// As written in the config.
    pub fn describe(&self) -> String {
        match self {
            Reserve::Fixed(n) => n.to_string(),
            Reserve::Header(h) => format!("header:{h}"),
            Reserve::Json(f) => format!("json:{f}"),
            Reserve::Api(api) => format!("{} (prompt bytes / 4 + output limit)", api.as_str()),
        }
    }
}

impl Settle {
    /// `"header:NAME"`, `"json:PATH"`, `"response_bytes"` or
    /// `"request_bytes"`.
    pub fn parse(text: &str) -> Result<Settle, CostError> {
        match text {
            "response_bytes" => return Ok(Settle::ResponseBytes),
            "request_bytes" => return Ok(Settle::RequestBytes),
            _ => {}
        }
        if let Some(name) = text.strip_prefix("header:") {
            return header_name(name).map(Settle::Header);
        }
        if let Some(path) = text.strip_prefix("json:") {
            return JsonFields::parse(path).map(|f| Settle::Json(std::sync::Arc::new(f)));
        }
        Err(CostError::Settle(text.to_string()))
    }

    /// As written in the config.
    pub fn describe(&self) -> String {
        match self {
            Settle::Header(h) => format!("header:{h}"),
            Settle::Json(f) => format!("json:{f}"),
            Settle::ResponseBytes => "response_bytes".into(),
            Settle::RequestBytes => "request_bytes".into(),
            Settle::Api(a) => {
                if a.json == a.events {
                    format!("json:{}", a.json)
                } else {
                    format!("json:{} (streams: json:{})", a.json, a.events)
                }
            }
        }
    }

    /// Whether it reads the response body's JSON (which must then come
    /// uncompressed).
    pub fn reads_json(&self) -> bool {
        matches!(self, Settle::Json(_) | Settle::Api(_))
    }
}

impl Cost {
    /// `reserve N, settle RULE` (or the reserve alone), and what differs
    /// from the defaults, for `explain` and `check`.
    pub fn describe(&self) -> String {
        let mut out = match self.api {
            Some(api) => format!("api {}: ", api.as_str()),
            None => String::new(),
        };
        out.push_str(&format!("reserve {}", self.reserve.describe()));
        let reads = self.reserve.needs_body() || matches!(self.reserve, Reserve::Header(_));
        if reads && (self.api.is_some() || self.reserve_default != 1) {
            out.push_str(&format!(" (absent: {})", self.reserve_default));
        }
        if let Some(s) = &self.settle {
            out.push_str(&format!(", settle {}", s.describe()));
            if self.errors != OnError::Free {
                out.push_str(&format!(", errors {}", self.errors.as_str()));
            }
            if self.unsettled != OnUnsettled::Reserve {
                out.push_str(&format!(", unsettled {}", self.unsettled.describe()));
            }
        }
        out
    }
}

fn header_name(name: &str) -> Result<HeaderName, CostError> {
    HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| CostError::HeaderName(name.to_string()))
}

impl JsonFields {
    /// `a.b` or `a.b+c.d`.
    pub fn parse(text: &str) -> Result<JsonFields, CostError> {
        let bad = || CostError::Path(text.to_string());
        let mut terms = Vec::new();
        for term in text.split('+') {
            let parts: Vec<String> = term.trim().split('.').map(str::to_string).collect();
            if parts.iter().any(|p| p.is_empty() || p.len() > 128) || parts.len() > 16 {
                return Err(bad());
            }
            terms.push(JsonPath(parts));
        }
        if terms.is_empty() || terms.len() > 8 {
            return Err(bad());
        }
        Ok(JsonFields(terms))
    }

    /// The sum of the fields `doc` holds, parsed as JSON; `None` when it is
    /// not JSON or holds none of them.
    pub fn read(&self, doc: &[u8]) -> Option<u64> {
        let mut found = None;
        for path in &self.0 {
            if let Some(n) = path.number_in(doc) {
                found = Some(found.unwrap_or(0u64).saturating_add(n));
            }
        }
        found
    }

    /// The last words of each path: a `data:` event that holds none of
    /// them cannot hold the fields, and is not parsed.
    pub(crate) fn leaves(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| p.0.last().map(String::as_str))
    }
}

impl JsonPath {
    /// The non-negative number at this path in the JSON document `doc` (a
    /// fraction rounds up); `None` when `doc` is not one JSON value, or the
    /// path is absent or not such a number. Walks the document without
    /// building it: only the path's keys are compared, everything else is
    /// skipped, and nothing is allocated for a plain key.
    pub fn number_in(&self, doc: &[u8]) -> Option<u64> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(doc);
        let found = walk::Walk(&self.0).deserialize(&mut de).ok()?;
        de.end().ok()?;
        found
    }
}

/// The path walk over a JSON document, as serde visitors.
mod walk {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    /// The number at the rest of a path, from the value at hand.
    pub(super) struct Walk<'p>(pub(super) &'p [String]);

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = Option<u64>;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_u64<E>(self, v: u64) -> Result<Option<u64>, E> {
            Ok(self.0.is_empty().then_some(v))
        }

        fn visit_i64<E>(self, v: i64) -> Result<Option<u64>, E> {
            Ok(u64::try_from(v).ok().filter(|_| self.0.is_empty()))
        }

        fn visit_f64<E>(self, v: f64) -> Result<Option<u64>, E> {
            let ok = self.0.is_empty() && v.is_finite() && v >= 0.0;
            Ok(ok.then(|| v.ceil().min(u64::MAX as f64) as u64))
        }

        fn visit_bool<E>(self, _: bool) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_str<E>(self, _: &str) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
            let mut found = None;
            let Some((first, rest)) = self.0.split_first() else {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(None);
            };
            // The last of duplicate keys wins, as in a parsed document.
            while let Some(hit) = map.next_key_seed(KeyIs(first))? {
                if hit {
                    found = map.next_value_seed(Walk(rest))?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u64>, A::Error> {
            let index = self.0.first().and_then(|p| p.parse::<usize>().ok());
            let mut found = None;
            let mut i = 0usize;
            loop {
                if index == Some(i) {
                    match seq.next_element_seed(Walk(&self.0[1..]))? {
                        Some(v) => found = v,
                        None => break,
                    }
                } else if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                i += 1;
            }
            Ok(found)
        }
    }

    /// Whether an object's key is the one looked for.
    struct KeyIs<'p>(&'p str);

    impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
        type Value = bool;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for KeyIs<'_> {
        type Value = bool;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a key")
        }

        fn visit_str<E>(self, v: &str) -> Result<bool, E> {
            Ok(v == self.0)
        }
    }
}

impl std::fmt::Display for JsonFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            f.write_str(&p.0.join("."))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_print_as_written() {
        for (text, ok) in [
            ("header:x-cost", true),
            ("json:usage.total_tokens", true),
            ("json:usage.input_tokens+usage.output_tokens", true),
            ("response_bytes", true),
            ("request_bytes", true),
            ("json:", false),
            ("json:a..b", false),
            ("header:bad header", false),
            ("bytes", false),
        ] {
            let parsed = Settle::parse(text);
            assert_eq!(parsed.is_ok(), ok, "{text}: {parsed:?}");
            if let Ok(s) = parsed {
                assert_eq!(s.describe(), text);
            }
        }
        assert!(Reserve::parse("response_bytes").is_err());
        assert_eq!(Reserve::fixed(0), Err(CostError::ReserveRange(0)));
        assert_eq!(Reserve::parse("json:max_tokens").unwrap().describe(), "json:max_tokens");
    }

    #[test]
    fn a_reserve_is_read_from_the_request_and_kept_within_the_capacity() {
        let mut h = HeaderMap::new();
        let by_header = Reserve::parse("header:x-tokens").unwrap();
        assert_eq!(by_header.of_request(&h, None, 1, 100), Ok(1), "absent: 1");
        assert_eq!(by_header.of_request(&h, None, 30, 100), Ok(30), "absent: the default");
        h.insert("x-tokens", "40".parse().unwrap());
        assert_eq!(by_header.of_request(&h, None, 1, 100), Ok(40));
        h.insert("x-tokens", "4000".parse().unwrap());
        assert_eq!(
            by_header.of_request(&h, None, 1, 100),
            Ok(100),
            "capped at the capacity"
        );
        h.insert("x-tokens", "-3".parse().unwrap());
        assert!(by_header.of_request(&h, None, 1, 100).is_err());
        let by_body = Reserve::parse("json:max_tokens").unwrap();
        assert_eq!(by_body.of_request(&h, Some(br#"{"max_tokens": 64}"#), 1, 100), Ok(64));
        assert_eq!(
            by_body.of_request(&h, Some(b"\xEF\xBB\xBF{\"max_tokens\": 64}"), 1, 100),
            Ok(64)
        );
        assert_eq!(by_body.of_request(&h, Some(b"not json"), 1, 100), Ok(1));
        assert_eq!(by_body.of_request(&h, Some(b"{\"max_tokens\": NaN}"), 50, 100), Ok(50));
        assert_eq!(by_body.of_request(&h, Some(br#"{"max_tokens": 0}"#), 1, 100), Ok(1));
        assert_eq!(Reserve::Fixed(7).of_request(&h, None, 1, 5), Ok(5));
    }

    #[test]
    fn a_cost_that_never_arrives_is_charged_by_the_rule() {
        // Reserve 100; the cut stream showed 120; the estimate says 300.
        assert_eq!(OnUnsettled::Estimate.charge(100, Some(120), 300), 300);
        assert_eq!(
            OnUnsettled::Estimate.charge(100, None, 30),
            100,
            "never below the reserve"
        );
        assert_eq!(OnUnsettled::Reserve.charge(100, Some(120), 300), 120);
        assert_eq!(OnUnsettled::Reserve.charge(100, None, 300), 100);
        assert_eq!(OnUnsettled::Fixed(40).charge(100, None, 300), 40);
        assert_eq!(OnUnsettled::Fixed(40).charge(100, Some(70), 300), 70);
    }

    #[test]
    fn fields_are_found_by_path_and_added_up() {
        let f = JsonFields::parse("usage.input_tokens+usage.output_tokens").unwrap();
        assert_eq!(f.read(br#"{"usage":{"input_tokens":10,"output_tokens":32}}"#), Some(42));
        assert_eq!(f.read(br#"{"usage":{"output_tokens":32}}"#), Some(32));
        assert_eq!(f.read(br#"{"usage":{}}"#), None);
        assert_eq!(f.read(b"[1,2"), None);
        let indexed = JsonFields::parse("choices.1.n").unwrap();
        assert_eq!(indexed.read(br#"{"choices":[{"n":1},{"n":2.5}]}"#), Some(3));
        assert_eq!(indexed.read(br#"{"choices":[{"n":-1},{"n":"2"}]}"#), None);
        // Escaped keys, nesting to skip, duplicates (the last wins), and a
        // document with something after it (not JSON: nothing).
        let f = JsonFields::parse("usage.total_tokens").unwrap();
        assert_eq!(
            f.read(br#"{"a":[{"b":[1,{"c":null}]}],"us\u0061ge":{"total_tokens":9}}"#),
            Some(9)
        );
        assert_eq!(f.read(br#"{"usage":{"total_tokens":1,"total_tokens":2}}"#), Some(2));
        assert_eq!(f.read(br#"{"usage":{"total_tokens":1}} x"#), None);
        assert_eq!(f.read(br#"{"usage":{"total_tokens":1.5e1}}"#), Some(15));
    }
}
