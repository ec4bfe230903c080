//! The `openai` preset's two rewrites. A streaming Chat Completions (or
//! Completions) request that did not ask for its usage is forwarded asking
//! for it (`stream_options.include_usage = true`, every other byte of the
//! body kept), because OpenAI-style APIs report a stream's usage only
//! then; and the chunk that brings it (`"choices": []` with `usage`) is
//! removed from that client's stream ([`UsageFilter`]), so the client
//! receives what it asked for: the upstream's stream, byte for byte, less
//! exactly that event.
//!
//! Pure: bytes in, bytes out.

use bytes::{Bytes, BytesMut};

/// Whether the JSON object `doc` streams (`"stream": true`) without
/// asking for its usage (`stream_options.include_usage` not `true`). The
/// last of duplicate keys counts, as in the upstream's parser.
pub fn lacks_usage(doc: &[u8]) -> bool {
    // JSON is UTF-8 (serde skips a string it ignores without checking).
    let Ok(text) = std::str::from_utf8(skip_bom(doc)) else {
        return false;
    };
    if serde_json::from_str::<serde::de::IgnoredAny>(text).is_err() {
        return false;
    }
    let Some(top) = members(doc, 0) else { return false };
    let streams = last(&top, "stream").is_some_and(|m| &doc[m.value.clone()] == b"true");
    if !streams {
        return false;
    }
    let asked = last(&top, "stream_options")
        .and_then(|so| members(doc, so.value.start))
        .and_then(|inner| last(&inner, "include_usage").map(|m| &doc[m.value.clone()] == b"true"))
        .unwrap_or(false);
    !asked
}

/// `doc` (a JSON object that [`lacks_usage`]) asking for its usage: a
/// `stream_options` member added or completed, `include_usage` set to
/// `true`; nothing else changed. `None` when it cannot be (a
/// `stream_options` that is not an object or null, which the upstream
/// refuses anyway).
pub fn ask_usage(doc: &[u8]) -> Option<Vec<u8>> {
    let top = members(doc, 0)?;
    let open = skip_ws(doc, 0);
    let mut out = Vec::with_capacity(doc.len() + 40);
    match last(&top, "stream_options") {
        None => {
            out.extend_from_slice(&doc[..=open]);
            out.extend_from_slice(br#""stream_options":{"include_usage":true}"#);
            if !top.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(&doc[open + 1..]);
        }
        Some(so) if &doc[so.value.clone()] == b"null" => {
            out.extend_from_slice(&doc[..so.value.start]);
            out.extend_from_slice(br#"{"include_usage":true}"#);
            out.extend_from_slice(&doc[so.value.end..]);
        }
        Some(so) if doc.get(so.value.start) == Some(&b'{') => {
            let inner = members(doc, so.value.start)?;
            match last(&inner, "include_usage") {
                Some(iu) => {
                    out.extend_from_slice(&doc[..iu.value.start]);
                    out.extend_from_slice(b"true");
                    out.extend_from_slice(&doc[iu.value.end..]);
                }
                None => {
                    out.extend_from_slice(&doc[..=so.value.start]);
                    out.extend_from_slice(br#""include_usage":true"#);
                    if !inner.is_empty() {
                        out.push(b',');
                    }
                    out.extend_from_slice(&doc[so.value.start + 1..]);
                }
            }
        }
        Some(_) => return None,
    }
    (!lacks_usage(&out)).then_some(out)
}

/// One member of a JSON object: its key (unescaped) and its value's bytes.
struct Member {
    key: String,
    value: std::ops::Range<usize>,
}

fn last<'m>(members: &'m [Member], key: &str) -> Option<&'m Member> {
    members.iter().rev().find(|m| m.key == key)
}

/// The members of the object at `at` in `doc`, a valid JSON document;
/// `None` when no object is there.
fn members(doc: &[u8], at: usize) -> Option<Vec<Member>> {
    let mut i = skip_ws(doc, at);
    if doc.get(i) != Some(&b'{') {
        return None;
    }
    let mut out = Vec::new();
    i = skip_ws(doc, i + 1);
    if doc.get(i) == Some(&b'}') {
        return Some(out);
    }
    loop {
        let key_end = string_end(doc, i)?;
        let raw = &doc[i..key_end];
        let key = if raw.contains(&b'\\') {
            serde_json::from_slice::<String>(raw).ok()?
        } else {
            String::from_utf8_lossy(&raw[1..raw.len() - 1]).into_owned()
        };
        i = skip_ws(doc, key_end);
        if doc.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(doc, i + 1);
        let end = value_end(doc, start)?;
        out.push(Member { key, value: start..end });
        i = skip_ws(doc, end);
        match doc.get(i) {
            Some(b',') => i = skip_ws(doc, i + 1),
            Some(b'}') => return Some(out),
            _ => return None,
        }
    }
}

fn skip_ws(doc: &[u8], mut i: usize) -> usize {
    if i == 0 {
        // A byte order mark in front of the document.
        if doc.starts_with(b"\xEF\xBB\xBF") {
            i = 3;
        }
    }
    while doc.get(i).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Past the string that starts at `i` (its opening quote).
fn string_end(doc: &[u8], i: usize) -> Option<usize> {
    if doc.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        let at = j + memchr::memchr2(b'"', b'\\', doc.get(j..)?)?;
        if doc[at] == b'\\' {
            j = at + 2;
        } else {
            return Some(at + 1);
        }
    }
}

/// Past the value that starts at `i`.
fn value_end(doc: &[u8], i: usize) -> Option<usize> {
    match doc.get(i)? {
        b'"' => string_end(doc, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < doc.len() {
                match doc[j] {
                    b'"' => {
                        j = string_end(doc, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while doc
                .get(j)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                j += 1;
            }
            Some(j)
        }
    }
}

/// Removes the usage-only chunk (`"choices": []` with a `usage` object)
/// from a `text/event-stream` on its way to a client that did not ask for
/// it. Each event is handed on once it is whole (its blank line seen), the
/// usage chunk not at all; everything else passes byte for byte, however
/// the frames cut it. An event larger than `max` bytes is not held: from
/// it on the stream passes as it comes.
#[derive(Debug)]
pub struct UsageFilter {
    /// The event begun and not yet ended.
    pending: BytesMut,
    /// How far `pending` was scanned, and the length of its current line.
    scanned: usize,
    line: usize,
    max: usize,
    passing: bool,
    /// The usage chunks removed so far.
    pub removed: u32,
}

impl UsageFilter {
    pub fn new(max: usize) -> UsageFilter {
        UsageFilter {
            pending: BytesMut::new(),
            scanned: 0,
            line: 0,
            max,
            passing: false,
            removed: 0,
        }
    }

    /// A frame of the upstream's stream: what to hand on now.
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        if self.passing {
            return chunk;
        }
        let buf = if self.pending.is_empty() {
            chunk
        } else {
            self.pending.extend_from_slice(&chunk);
            self.pending.split().freeze()
        };
        self.events(buf, false)
    }

    /// The upstream's stream ended: what is left to hand on.
    pub fn finish(&mut self) -> Bytes {
        let rest = self.pending.split().freeze();
        if self.passing || rest.is_empty() {
            return rest;
        }
        self.events(rest, true)
    }

    /// The whole events in `buf` that pass; the rest kept for later (all
    /// of it handed on when `end`).
    fn events(&mut self, buf: Bytes, end: bool) -> Bytes {
        let mut kept: Option<BytesMut> = None;
        // Events from `start` to `whole` pass as one slice.
        let (mut start, mut whole) = (0usize, 0usize);
        let mut i = self.scanned;
        self.scanned = 0;
        while i < buf.len() {
            let Some(at) = memchr::memchr2(b'\n', b'\r', &buf[i..]).map(|k| i + k) else {
                self.line += buf.len() - i;
                i = buf.len();
                break;
            };
            self.line += at - i;
            let next = match buf[at] {
                b'\r' if at + 1 == buf.len() && !end => {
                    // A CR at the end: a CRLF's half, perhaps. Later.
                    i = at;
                    break;
                }
                b'\r' if buf.get(at + 1) == Some(&b'\n') => at + 2,
                _ => at + 1,
            };
            let blank = self.line == 0;
            self.line = 0;
            i = next;
            if blank {
                // An event ends at `next`.
                if is_usage_chunk(&buf[whole..next]) {
                    self.removed += 1;
                    let out = kept.get_or_insert_with(BytesMut::new);
                    out.extend_from_slice(&buf[start..whole]);
                    start = next;
                }
                whole = next;
            }
        }
        let rest = buf.slice(whole..);
        if end {
            whole = buf.len();
        } else if rest.len() > self.max {
            // An event too large to hold: the stream passes from here.
            self.passing = true;
            whole = buf.len();
        } else {
            self.scanned = i - whole;
            self.pending.extend_from_slice(&rest);
        }
        match kept {
            None => buf.slice(start..whole),
            Some(mut out) => {
                out.extend_from_slice(&buf[start..whole]);
                out.freeze()
            }
        }
    }
}

/// Whether an event (its lines, with the blank one) is the usage-only
/// chunk: a `data:` JSON object whose `choices` is empty and whose
/// `usage` is not null.
fn is_usage_chunk(event: &[u8]) -> bool {
    if memchr::memmem::find(event, b"\"usage\"").is_none() {
        return false;
    }
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        if let Some(v) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(v.strip_prefix(b" ").unwrap_or(v));
        }
    }
    #[derive(serde::Deserialize)]
    struct Chunk {
        #[serde(default)]
        choices: Option<Vec<serde::de::IgnoredAny>>,
        #[serde(default)]
        usage: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Chunk>(&data).is_ok_and(|c| c.choices.is_some_and(|ch| ch.is_empty()) && c.usage.is_some())
}

/// A JSON document without its UTF-8 byte order mark, which serde_json
/// refuses and upstreams skip.
pub fn skip_bom(doc: &[u8]) -> &[u8] {
    doc.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(doc: &str) -> String {
        String::from_utf8(ask_usage(doc.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn a_stream_without_usage_is_made_to_ask_for_it() {
        assert!(lacks_usage(br#"{"model":"m","stream":true}"#));
        assert!(!lacks_usage(br#"{"model":"m","stream":false}"#));
        assert!(!lacks_usage(br#"{"model":"m"}"#));
        assert!(!lacks_usage(
            br#"{"stream":true,"stream_options":{"include_usage":true}}"#
        ));
        assert!(lacks_usage(
            br#"{"stream":true,"stream_options":{"include_usage":false}}"#
        ));
        assert!(lacks_usage(br#"{"str\u0065am":true}"#), "an escaped key is the key");
        assert!(!lacks_usage(br#"{"stream":true,"stream":false}"#), "the last wins");
        assert!(!lacks_usage(br#"{"stream":true"#), "not JSON: nothing to do");
        assert!(lacks_usage(b"\xEF\xBB\xBF{\"stream\":true}"), "a BOM is skipped");
        assert!(!lacks_usage(b"{\"stream\":true,\"m\xdf\":1}"), "not UTF-8: not JSON");
        assert_eq!(
            asked(r#"{"model":"m","stream":true}"#),
            r#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#
        );
        assert_eq!(
            asked(" {\n \"stream\": true, \"stream_options\": null }"),
            " {\n \"stream\": true, \"stream_options\": {\"include_usage\":true} }"
        );
        assert_eq!(
            asked(r#"{"stream":true,"stream_options":{}}"#),
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            asked(r#"{"stream":true,"stream_options":{"x":[1,{"y":"}"}]}}"#),
            r#"{"stream":true,"stream_options":{"include_usage":true,"x":[1,{"y":"}"}]}}"#
        );
        assert_eq!(
            asked(r#"{"stream":true,"stream_options":{"include_usage" : false}}"#),
            r#"{"stream":true,"stream_options":{"include_usage" : true}}"#
        );
        assert_eq!(
            asked("\u{feff}{\"stream\":true}"),
            "\u{feff}{\"stream_options\":{\"include_usage\":true},\"stream\":true}"
        );
        assert!(ask_usage(br#"{"stream":true,"stream_options":"x"}"#).is_none());
    }

    const STREAM: &str = concat!(
        "data: {\"id\":\"1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
        ": keep-alive\r\n\r\n",
        "data: {\"id\":\"1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\r\n\r\n",
        "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":9}}\n\n",
        "data: [DONE]\n\n",
    );

    fn filtered(stream: &[u8], size: usize) -> Vec<u8> {
        let mut f = UsageFilter::new(1 << 16);
        let mut out = Vec::new();
        for piece in stream.chunks(size.max(1)) {
            out.extend_from_slice(&f.push(Bytes::copy_from_slice(piece)));
        }
        out.extend_from_slice(&f.finish());
        out
    }

    #[test]
    fn the_usage_chunk_alone_is_removed_however_the_frames_cut() {
        let usage = "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":9}}\n\n";
        let expected = STREAM.replace(usage, "");
        for size in 1..=STREAM.len() {
            assert_eq!(
                String::from_utf8(filtered(STREAM.as_bytes(), size)).unwrap(),
                expected,
                "pieces of {size}"
            );
        }
        // A stream that ends without its blank line passes whole.
        assert_eq!(filtered(b"data: x\n", 3), b"data: x\n");
        // A usage chunk with choices is not the usage-only chunk.
        let both = "data: {\"choices\":[{}],\"usage\":{\"total_tokens\":3}}\n\n";
        assert_eq!(filtered(both.as_bytes(), 5), both.as_bytes());
    }

    #[test]
    fn an_event_too_large_to_hold_passes_as_it_comes() {
        let mut f = UsageFilter::new(8);
        let mut out = Vec::new();
        for piece in STREAM.as_bytes().chunks(4) {
            out.extend_from_slice(&f.push(Bytes::copy_from_slice(piece)));
        }
        out.extend_from_slice(&f.finish());
        assert_eq!(out, STREAM.as_bytes());
    }
}
