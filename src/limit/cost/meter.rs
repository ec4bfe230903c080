//! Reading a response's real cost as its body streams to the client: a
//! header or trailer, a field of a JSON body (read as it passes, none of
//! it kept, whatever its size: [`JsonScan`]), the last
//! `text/event-stream` event or NDJSON line holding the field (scanned line
//! by line, only events that mention the field parsed), or bytes counted.
//! Beside it, when asked, the meter counts the content the upstream sent
//! (for an estimate of a cost that never arrives). Nothing here holds the
//! body back: the meter only looks at each frame on its way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};

use super::api::content_bytes;
use super::json_scan::JsonScan;
use super::{JsonFields, Settle};

/// Why a response's cost never arrived: its reserve stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsettled {
    /// The response ended without the header, trailer or field.
    Missing,
    /// A body too large to read (no longer produced: a JSON body of any
    /// size is read as it passes; the label stays for dashboards).
    TooLarge,
    /// The body broke off, or the client went away, before its end.
    Cut,
    /// The upstream failed: no response at all.
    UpstreamError,
    /// The upstream answered with an error status (400 or more) that
    /// reported no cost.
    UpstreamStatus,
}

impl Unsettled {
    /// The `reason` label of `leasegate_cost_unsettled_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Unsettled::Missing => "missing",
            Unsettled::TooLarge => "too_large",
            Unsettled::Cut => "cut",
            Unsettled::UpstreamError => "upstream_error",
            Unsettled::UpstreamStatus => "upstream_status",
        }
    }
}

/// One limit's reading of one response.
#[derive(Debug)]
pub struct Meter {
    kind: Kind,
    /// Most bytes of a JSON body (or of one event) kept for parsing.
    max_body: usize,
    /// The content bytes the upstream sent, when counted: the strings
    /// under content keys of each event, or the body's bytes.
    content: Option<u64>,
}

#[derive(Debug)]
enum Kind {
    Header {
        name: HeaderName,
        value: Option<u64>,
    },
    /// A JSON body, read as it passes (none of it kept, whatever its size).
    Json(Box<JsonScan>),
    Sse(Box<Sse>),
    ResponseBytes(u64),
    RequestBytes(Arc<AtomicU64>),
}

/// A `text/event-stream` (or an NDJSON stream: each line an event) being
/// scanned.
#[derive(Debug)]
struct Sse {
    fields: Arc<JsonFields>,
    /// NDJSON: a line is a whole event, its data the line itself.
    ndjson: bool,
    /// Count each event's content into the meter's.
    content: Option<u64>,
    /// The line read so far.
    line: Vec<u8>,
    /// The current event's `data:` lines, joined by `\n`.
    data: Vec<u8>,
    /// The event outgrew the bound: skipped up to its end.
    skipping: bool,
    /// Each term's value in the last event that held it.
    last: Vec<Option<u64>>,
}

impl Meter {
    /// A meter for `rule` on a response with `headers`; `request_bytes`
    /// counts the request body as it went upstream (`request_bytes` rules);
    /// `estimate`: count the content it sends too ([`Meter::content`]).
    pub fn new(
        rule: &Settle,
        headers: &HeaderMap,
        request_bytes: Option<Arc<AtomicU64>>,
        max_body: usize,
        estimate: bool,
    ) -> Meter {
        let stream = stream_kind(headers);
        let fields = match rule {
            Settle::Json(fields) => Some(fields.clone()),
            Settle::Api(api) if stream.is_some() => Some(api.events.clone()),
            Settle::Api(api) => Some(api.json.clone()),
            _ => None,
        };
        let content = estimate.then_some(0);
        let kind = match (rule, fields) {
            (Settle::Header(name), _) => Kind::Header {
                name: name.clone(),
                value: header_number(headers, name),
            },
            (_, Some(fields)) if stream.is_some() => Kind::Sse(Box::new(Sse {
                last: vec![None; fields.0.len()],
                fields,
                ndjson: stream == Some(Stream::Ndjson),
                content,
                line: Vec::new(),
                data: Vec::new(),
                skipping: false,
            })),
            (_, Some(fields)) => Kind::Json(Box::new(JsonScan::new(fields))),
            (Settle::RequestBytes, _) => Kind::RequestBytes(request_bytes.unwrap_or_default()),
            _ => Kind::ResponseBytes(0),
        };
        Meter {
            kind,
            max_body,
            content,
        }
    }

    /// The content bytes the upstream has sent so far (0 when not
    /// counted): for an event stream the strings under content keys
    /// ([`super::api::CONTENT_KEYS`]) of its events, else the body's bytes.
    pub fn content(&self) -> u64 {
        match &self.kind {
            Kind::Sse(sse) => sse.content.unwrap_or(0),
            _ => self.content.unwrap_or(0),
        }
    }

    /// A data frame on its way to the client.
    pub fn data(&mut self, chunk: &Bytes) {
        if let Some(n) = &mut self.content {
            *n = n.saturating_add(chunk.len() as u64);
        }
        match &mut self.kind {
            Kind::Header { .. } | Kind::RequestBytes(_) => {}
            Kind::ResponseBytes(n) => *n = n.saturating_add(chunk.len() as u64),
            Kind::Json(scan) => scan.feed(chunk),
            Kind::Sse(sse) => sse.scan(chunk, self.max_body),
        }
    }

    /// The response's trailers: a `header:` rule's value may come here.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        if let Kind::Header { name, value } = &mut self.kind {
            if let Some(v) = header_number(trailers, name) {
                *value = Some(v);
            }
        }
    }

    /// What the response has shown of its cost so far, for a response cut
    /// short: a header's value, the bytes counted, the events read whole;
    /// `None` for a JSON body (half a document says nothing).
    pub fn seen(&self) -> Option<u64> {
        match &self.kind {
            Kind::Header { value, .. } => *value,
            Kind::ResponseBytes(n) => Some(*n),
            Kind::RequestBytes(n) => Some(n.load(Ordering::Acquire)),
            Kind::Json(_) => None,
            Kind::Sse(sse) => sse.last.iter().flatten().copied().reduce(u64::saturating_add),
        }
    }

    /// The response ended: what it cost, or why that is not known.
    pub fn finish(self) -> Result<u64, Unsettled> {
        match self.kind {
            Kind::Header { value, .. } => value.ok_or(Unsettled::Missing),
            Kind::ResponseBytes(n) => Ok(n),
            Kind::RequestBytes(n) => Ok(n.load(Ordering::Acquire)),
            Kind::Json(scan) => scan.finish().ok_or(Unsettled::Missing),
            Kind::Sse(mut sse) => {
                // A stream may end without the blank line after its last event.
                sse.end_line(self.max_body);
                sse.dispatch();
                let mut found = None;
                for v in sse.last.iter().flatten() {
                    found = Some(found.unwrap_or(0u64).saturating_add(*v));
                }
                found.ok_or(Unsettled::Missing)
            }
        }
    }
}

impl Sse {
    fn scan(&mut self, chunk: &[u8], max: usize) {
        let mut rest = chunk;
        while let Some(at) = memchr::memchr(b'\n', rest) {
            if self.line.is_empty() {
                // The whole line is in this chunk: read where it lies.
                self.line_done(&rest[..at], max);
            } else {
                self.push_line(&rest[..at], max);
                let line = std::mem::take(&mut self.line);
                self.line_done(&line, max);
                self.line = line;
                self.line.clear();
            }
            rest = &rest[at + 1..];
        }
        self.push_line(rest, max);
    }

    /// Part of a line, the rest of which is in a later chunk.
    fn push_line(&mut self, bytes: &[u8], max: usize) {
        if self.skipping {
            // Inside an oversized event only a blank line matters (empty,
            // or a lone CR of a CRLF): the line's first two bytes tell.
            let keep = 2usize.saturating_sub(self.line.len()).min(bytes.len());
            self.line.extend_from_slice(&bytes[..keep]);
            return;
        }
        if self.line.len() + bytes.len() > max {
            // Skipped up to the event's end; this line is not blank.
            self.skipping = true;
            self.line.clear();
            self.line.extend_from_slice(b"xx");
            self.data.clear();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    /// Ends the line held in part, when the stream ends without a newline.
    fn end_line(&mut self, max: usize) {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line, max);
        }
    }

    /// A whole line was read: a field of the event, or its end.
    fn line_done(&mut self, line: &[u8], max: usize) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if self.ndjson {
            // A line is an event; one too long to hold is not read.
            if self.skipping {
                self.skipping = false;
            } else if line.len() <= max {
                self.data.clear();
                self.data.extend_from_slice(line);
                self.dispatch();
            }
            return;
        }
        if line.is_empty() {
            if self.skipping {
                self.skipping = false;
            } else {
                self.dispatch();
            }
            return;
        }
        if self.skipping {
            return;
        }
        if line.len() > max {
            self.skipping = true;
            self.data.clear();
            return;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.data.len() + value.len() + 1 > max {
                self.skipping = true;
                self.data.clear();
            } else {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
        }
    }

    /// The event ended: its data is parsed if it mentions a field (and its
    /// content counted, when asked).
    fn dispatch(&mut self) {
        if let Some(n) = &mut self.content {
            if !self.data.is_empty() {
                *n = n.saturating_add(content_bytes(&self.data));
            }
        }
        if !self.data.is_empty() && self.fields.leaves().any(|leaf| contains(&self.data, leaf.as_bytes())) {
            for (slot, path) in self.last.iter_mut().zip(&self.fields.0) {
                if let Some(n) = path.number_in(&self.data) {
                    *slot = Some(n);
                }
            }
        }
        self.data.clear();
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(hay, needle).is_some()
}

/// A body made of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `text/event-stream`
    Sse,
    /// `application/x-ndjson` (Ollama), `application/jsonl` and their
    /// kin: one JSON document a line.
    Ndjson,
}

/// Whether the response with `headers` is a stream of events, and which.
pub fn stream_kind(headers: &HeaderMap) -> Option<Stream> {
    let v = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let t = v.split(';').next()?.trim();
    if t.eq_ignore_ascii_case("text/event-stream") {
        Some(Stream::Sse)
    } else if [
        "application/x-ndjson",
        "application/ndjson",
        "application/jsonl",
        "application/x-jsonlines",
    ]
    .iter()
    .any(|n| t.eq_ignore_ascii_case(n))
    {
        Some(Stream::Ndjson)
    } else {
        None
    }
}

fn header_number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_meter(rule: &str, content_type: &str) -> Meter {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        Meter::new(&Settle::parse(rule).unwrap(), &h, None, 1 << 20, false)
    }

    #[test]
    fn a_json_body_in_pieces_settles_from_its_field() {
        let mut m = json_meter("json:usage.total_tokens", "application/json");
        for part in [
            &br#"{"id":"x","usage":{"prompt"#[..],
            br#"_tokens":3,"total_tokens":"#,
            b"57}}",
        ] {
            m.data(&Bytes::copy_from_slice(part));
        }
        assert_eq!(m.finish(), Ok(57));
        let mut m = json_meter("json:usage.total_tokens", "application/json");
        m.data(&Bytes::from_static(br#"{"error":"overloaded"}"#));
        assert_eq!(m.finish(), Err(Unsettled::Missing));
    }

    #[test]
    fn an_event_stream_settles_from_the_last_event_holding_the_field() {
        let stream = concat!(
            "event: message_start\r\n",
            "data: {\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n",
            "data: {\"delta\":{\"text\":\"hi\"}}\n\n",
            ": a comment\n",
            "data: {\"usage\":{\"output_tokens\":10}}\n\n",
            "data: {\"usage\":{\"output_tokens\":15}}\n",
        );
        // Cut anywhere, in every size of piece: the same answer.
        for size in [1, 2, 7, 64, stream.len()] {
            let mut m = json_meter(
                "json:message.usage.input_tokens+usage.output_tokens",
                "text/event-stream; charset=utf-8",
            );
            for piece in stream.as_bytes().chunks(size) {
                m.data(&Bytes::copy_from_slice(piece));
            }
            assert_eq!(m.finish(), Ok(40), "pieces of {size}");
        }
        let mut m = json_meter("json:usage.total_tokens", "text/event-stream");
        m.data(&Bytes::from_static(b"data: [DONE]\n\n"));
        assert_eq!(m.finish(), Err(Unsettled::Missing));
    }

    #[test]
    fn an_ndjson_stream_settles_from_its_done_line_and_counts_its_content() {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, "application/x-ndjson".parse().unwrap());
        let rule = Settle::Api(super::super::api::ApiSettle::new(super::super::api::Api::Ollama));
        let stream = concat!(
            "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"done\":false}\n",
            "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"lo\"},\"done\":false}\r\n",
            "{\"model\":\"llama3\",\"done\":true,\"prompt_eval_count\":26,\"eval_count\":290}",
        );
        for size in [1, 3, 50, stream.len()] {
            let mut m = Meter::new(&rule, &h, None, 1 << 20, true);
            for piece in stream.as_bytes().chunks(size) {
                m.data(&Bytes::copy_from_slice(piece));
            }
            assert_eq!(m.content(), 5, "pieces of {size}");
            assert_eq!(m.finish(), Ok(316), "pieces of {size}");
        }
        // Cut before the done line: nothing seen, the content counted.
        let mut m = Meter::new(&rule, &h, None, 1 << 20, true);
        m.data(&Bytes::from_static(b"{\"response\":\"abcd\",\"done\":false}\n{\"resp"));
        assert_eq!((m.seen(), m.content()), (None, 4));
        // The same preset on a JSON answer.
        h.insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
        let mut m = Meter::new(&rule, &h, None, 1 << 20, true);
        m.data(&Bytes::from_static(
            b"{\"done\":true,\"prompt_eval_count\":2,\"eval_count\":3}",
        ));
        assert_eq!(m.content(), 50, "a JSON body's content is its bytes");
        assert_eq!(m.finish(), Ok(5));
    }

    #[test]
    fn bodies_past_the_bound_are_not_kept() {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
        // A JSON body larger than the bound still settles: nothing of it is kept.
        let mut m = Meter::new(&Settle::parse("json:n").unwrap(), &h, None, 8, false);
        m.data(&Bytes::from_static(br#"{"pad": "....", "n": 1}"#));
        assert_eq!(m.finish(), Ok(1));
        h.insert(http::header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        let mut m = Meter::new(&Settle::parse("json:n").unwrap(), &h, None, 16, false);
        m.data(&Bytes::from_static(
            b"data: {\"n\": 1, \"pad\": \"........\"}\n\ndata: {\"n\":2}\n\n",
        ));
        assert_eq!(m.finish(), Ok(2), "the oversized event is skipped, the next read");
    }

    #[test]
    fn headers_trailers_and_bytes() {
        let mut h = HeaderMap::new();
        h.insert("x-cost", "12".parse().unwrap());
        let rule = Settle::parse("header:x-cost").unwrap();
        assert_eq!(Meter::new(&rule, &h, None, 64, false).finish(), Ok(12));
        let mut m = Meter::new(&rule, &HeaderMap::new(), None, 64, false);
        m.trailers(&h);
        assert_eq!(m.finish(), Ok(12));
        assert_eq!(
            Meter::new(&rule, &HeaderMap::new(), None, 64, false).finish(),
            Err(Unsettled::Missing)
        );
        let mut m = Meter::new(&Settle::ResponseBytes, &h, None, 64, false);
        m.data(&Bytes::from_static(b"hello"));
        m.data(&Bytes::from_static(b" world"));
        assert_eq!(m.finish(), Ok(11));
        let counted = Arc::new(AtomicU64::new(300));
        assert_eq!(
            Meter::new(&Settle::RequestBytes, &h, Some(counted), 64, false).finish(),
            Ok(300)
        );
    }
}
