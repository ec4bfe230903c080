//! A JSON document read as its bytes pass, none of them kept: the numbers
//! at a few paths are noted as they go by, everything else is skipped. So
//! a JSON response settles whatever its size (a `json:` settle of a body
//! larger than `[gateway] max_cost_body_bytes`), holding a few bytes per
//! level of nesting, and the answer does not depend on how the frames cut
//! the document.
//!
//! Its answers are [`super::JsonFields::read`]'s on the whole document
//! (the property test below holds the two together): the sum of the
//! fields found, the last of duplicate keys winning, a fraction rounded
//! up, nothing for a document that is not one JSON value.

use std::sync::Arc;

use super::JsonFields;

/// Deeper documents are not read (serde_json's own limit is 128).
const MAX_DEPTH: usize = 128;
/// Longer keys match no path (a path's keys are at most 128 bytes).
const MAX_KEY: usize = 256;
/// Longer numbers are not numbers a cost is made of.
const MAX_NUMBER: usize = 64;

/// One level of nesting: the key or index the value at hand sits at.
#[derive(Debug)]
enum Level {
    /// The key of the member being read (`None`: too long to match).
    Object(Option<String>),
    Array(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value, after optional whitespace.
    Value,
    /// A key or `}` (just after `{`).
    KeyOrEnd,
    /// A key (after `,` in an object).
    Key,
    /// `:` after a key.
    Colon,
    /// `,` or the end of the container, after a value.
    After,
    /// Inside a string (a key's, or a value's).
    Str { key: bool, escape: bool },
    /// A number's characters.
    Number,
    /// `true`, `false` or `null`: the letters left.
    Literal(&'static [u8]),
    /// The document's value is whole: only whitespace may follow.
    Done,
    /// Not JSON.
    Failed,
}

/// The numbers at `fields`' paths in a JSON document fed in pieces.
#[derive(Debug)]
pub struct JsonScan {
    fields: Arc<JsonFields>,
    found: Vec<Option<u64>>,
    stack: Vec<Level>,
    state: State,
    /// The key or number being read.
    token: Vec<u8>,
    /// The key being read is too long to match.
    long: bool,
    /// The number being read sits at this term's path.
    target: Option<usize>,
}

impl JsonScan {
    pub fn new(fields: Arc<JsonFields>) -> JsonScan {
        let found = vec![None; fields.0.len()];
        JsonScan {
            fields,
            found,
            stack: Vec::new(),
            state: State::Value,
            token: Vec::new(),
            long: false,
            target: None,
        }
    }

    /// The next bytes of the document.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match self.state {
                State::Failed => return,
                State::Str { key, escape } => {
                    // The rest of a string up to its quote or escape, at once.
                    if escape {
                        self.keep(key, b);
                        self.state = State::Str { key, escape: false };
                        i += 1;
                        continue;
                    }
                    match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                        None => {
                            self.keep_all(key, &bytes[i..]);
                            return;
                        }
                        Some(k) => {
                            self.keep_all(key, &bytes[i..i + k]);
                            i += k;
                            if bytes[i] == b'\\' {
                                self.keep(key, b'\\');
                                self.state = State::Str { key, escape: true };
                            } else {
                                self.string_end(key);
                            }
                            i += 1;
                        }
                    }
                    continue;
                }
                State::Number => {
                    if matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                        if self.token.len() < MAX_NUMBER {
                            self.token.push(b);
                        } else {
                            self.target = None;
                        }
                        i += 1;
                        continue;
                    }
                    self.number_end();
                    // `b` is read again in the state after the number.
                    continue;
                }
                State::Literal(rest) => {
                    match rest.split_first() {
                        Some((&c, tail)) if c == b => {
                            self.state = if tail.is_empty() {
                                self.value_end();
                                self.state
                            } else {
                                State::Literal(tail)
                            };
                        }
                        _ => self.state = State::Failed,
                    }
                    i += 1;
                    continue;
                }
                _ => {}
            }
            i += 1;
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                continue;
            }
            self.structural(b);
        }
    }

    /// A byte outside strings, numbers and literals.
    fn structural(&mut self, b: u8) {
        self.state = match (self.state, b) {
            (State::Value, b'{') => self.open(Level::Object(None), State::KeyOrEnd),
            (State::Value, b'[') => self.open(Level::Array(0), State::Value),
            (State::Value, b']') if matches!(self.stack.last(), Some(Level::Array(0))) => {
                // `[]`: an empty array ends where its first value would be.
                self.stack.pop();
                self.value_end();
                self.state
            }
            (State::Value, b'"') => State::Str {
                key: false,
                escape: false,
            },
            (State::Value, b'-' | b'0'..=b'9') => {
                self.token.clear();
                self.token.push(b);
                self.target = self.at_target();
                State::Number
            }
            (State::Value, b't') => State::Literal(b"rue"),
            (State::Value, b'f') => State::Literal(b"alse"),
            (State::Value, b'n') => State::Literal(b"ull"),
            (State::KeyOrEnd, b'}') => {
                self.stack.pop();
                self.value_end();
                self.state
            }
            (State::KeyOrEnd | State::Key, b'"') => {
                self.token.clear();
                self.long = false;
                State::Str {
                    key: true,
                    escape: false,
                }
            }
            (State::Colon, b':') => State::Value,
            (State::After, b',') => match self.stack.last_mut() {
                Some(Level::Object(_)) => State::Key,
                Some(Level::Array(n)) => {
                    *n += 1;
                    State::Value
                }
                None => State::Failed,
            },
            (State::After, b'}') if matches!(self.stack.last(), Some(Level::Object(_))) => {
                self.stack.pop();
                self.value_end();
                self.state
            }
            (State::After, b']') if matches!(self.stack.last(), Some(Level::Array(_))) => {
                self.stack.pop();
                self.value_end();
                self.state
            }
            _ => State::Failed,
        };
    }

    fn open(&mut self, level: Level, next: State) -> State {
        if self.stack.len() >= MAX_DEPTH {
            return State::Failed;
        }
        self.stack.push(level);
        next
    }

    fn keep(&mut self, key: bool, b: u8) {
        if key {
            if self.token.len() < MAX_KEY {
                self.token.push(b);
            } else {
                self.long = true;
            }
        }
    }

    fn keep_all(&mut self, key: bool, bytes: &[u8]) {
        if key {
            if self.token.len() + bytes.len() <= MAX_KEY {
                self.token.extend_from_slice(bytes);
            } else {
                self.long = true;
            }
        }
    }

    fn string_end(&mut self, key: bool) {
        if !key {
            self.value_end();
            return;
        }
        let name = if self.long {
            None
        } else if self.token.contains(&b'\\') {
            // Escapes decoded as serde_json decodes them.
            let mut quoted = Vec::with_capacity(self.token.len() + 2);
            quoted.push(b'"');
            quoted.extend_from_slice(&self.token);
            quoted.push(b'"');
            match serde_json::from_slice::<String>(&quoted) {
                Ok(s) => Some(s),
                Err(_) => {
                    self.state = State::Failed;
                    return;
                }
            }
        } else {
            match std::str::from_utf8(&self.token) {
                Ok(s) => Some(s.to_string()),
                Err(_) => {
                    self.state = State::Failed;
                    return;
                }
            }
        };
        if let Some(Level::Object(k)) = self.stack.last_mut() {
            *k = name;
        }
        self.state = State::Colon;
    }

    fn number_end(&mut self) {
        let Some(term) = self.target.take() else {
            self.value_end();
            return;
        };
        let text = std::str::from_utf8(&self.token).unwrap_or("");
        let n = match text.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => text
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .map(|v| {
                    if v >= 0.0 {
                        Some(v.ceil().min(u64::MAX as f64) as u64)
                    } else {
                        None
                    }
                })
                .unwrap_or(None),
        };
        // A negative integer, or one past u64, is no cost (as serde's walk).
        let n = if text.starts_with('-') && !text.contains(['.', 'e', 'E']) {
            text.parse::<i64>().ok().and_then(|v| u64::try_from(v).ok())
        } else {
            n
        };
        if let Some(slot) = self.found.get_mut(term) {
            // The last of duplicates wins, a value that is no number too.
            *slot = n;
        }
        self.value_end();
    }

    /// A value ended: what comes after it.
    fn value_end(&mut self) {
        if self.target.is_none() && self.state != State::Number {
            // A value at a term's path that is not a number: nothing there
            // (the last of duplicate keys wins).
            if let Some(term) = self.at_target() {
                if let Some(slot) = self.found.get_mut(term) {
                    *slot = None;
                }
            }
        }
        self.state = if self.stack.is_empty() {
            State::Done
        } else {
            State::After
        };
    }

    /// The term whose path the value at hand sits at.
    fn at_target(&self) -> Option<usize> {
        self.fields.0.iter().position(|path| {
            path.0.len() == self.stack.len()
                && path.0.iter().zip(&self.stack).all(|(part, level)| match level {
                    Level::Object(Some(k)) => k == part,
                    Level::Object(None) => false,
                    Level::Array(n) => part.parse::<usize>().ok() == Some(*n),
                })
        })
    }

    /// The document ended: the sum of the fields found, or `None` when it
    /// was not one whole JSON value or held none of them.
    pub fn finish(mut self) -> Option<u64> {
        if self.state == State::Number && self.stack.is_empty() {
            self.number_end();
        }
        if self.state != State::Done {
            return None;
        }
        self.found.iter().flatten().copied().reduce(u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan(rule: &str, doc: &[u8], piece: usize) -> Option<u64> {
        let mut s = JsonScan::new(Arc::new(JsonFields::parse(rule).unwrap()));
        for chunk in doc.chunks(piece.max(1)) {
            s.feed(chunk);
        }
        s.finish()
    }

    #[test]
    fn fields_are_found_as_the_bytes_pass() {
        let rule = "usage.total_tokens";
        let doc = br#"{"id":"x","choices":[{"text":"a \"usage\": {\"total_tokens\": 9}"}],"usage":{"prompt_tokens":3,"total_tokens":57}}"#;
        for piece in 1..doc.len() {
            assert_eq!(scan(rule, doc, piece), Some(57), "pieces of {piece}");
        }
        assert_eq!(
            scan(rule, br#"{"usage":{"total_tokens":1}} x"#, 4),
            None,
            "not one value"
        );
        assert_eq!(scan(rule, br#"{"usage":{"total_tokens":1}"#, 4), None, "not whole");
        assert_eq!(scan(rule, br#"{"us\u0061ge":{"total_tokens":9}}"#, 3), Some(9));
        assert_eq!(
            scan(rule, br#"{"usage":{"total_tokens":1,"total_tokens":2}}"#, 3),
            Some(2)
        );
        assert_eq!(scan(rule, br#"{"usage":{"total_tokens":1.5e1}}"#, 3), Some(15));
        assert_eq!(scan("choices.1.n", br#"{"choices":[{"n":1},{"n":2.5}]}"#, 2), Some(3));
        assert_eq!(scan("choices.1.n", br#"{"choices":[[],{"n":-1}]}"#, 2), None);
        let two = "usage.input_tokens+usage.output_tokens";
        assert_eq!(
            scan(two, br#" {"usage":{"output_tokens":32,"input_tokens":10}} "#, 5),
            Some(42)
        );
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            (0u64..1_000).prop_map(serde_json::Value::from),
            (-10.0f64..1e6).prop_map(serde_json::Value::from),
            "[a-z\"\\\\]{0,6}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::vec(
                    (
                        prop_oneof![Just("usage".to_string()), Just("n".to_string()), "[a-z]{1,3}"],
                        inner
                    ),
                    0..4
                )
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The same answers as serde's walk over the whole document, cut
        /// anywhere.
        #[test]
        fn answers_as_the_whole_document_does(doc in json(), piece in 1usize..16, pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_vec_pretty(&doc) } else { serde_json::to_vec(&doc) }.unwrap();
            for rule in ["usage.n", "n", "usage.0.n+n", "0.usage"] {
                let fields = JsonFields::parse(rule).unwrap();
                prop_assert_eq!(scan(rule, &text, piece), fields.read(&text), "{} in {}", rule, String::from_utf8_lossy(&text));
            }
        }
    }
}
