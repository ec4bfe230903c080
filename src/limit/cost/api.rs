//! The LLM API presets (`cost = { api = "openai" | "anthropic" |
//! "ollama" }`): which endpoints each API has (known by how the forwarded
//! path ends, so a route may put any prefix in front), what a request to
//! one reserves (its output limit, or `reserve_default`, plus an estimate
//! of its prompt from the body's size, read or not), where its response
//! reports its usage (JSON, an event stream, or Ollama's NDJSON), and
//! which of its strings are the generated content an estimate counts.
//!
//! Pure: bytes in, numbers out.

use std::sync::Arc;

use super::JsonFields;

/// An API whose requests and responses a preset reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    OpenAi,
    Anthropic,
    Ollama,
}

/// An endpoint of an [`Api`] that generates (and reports usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `…/chat/completions`
    ChatCompletions,
    /// `…/completions` (the legacy API)
    Completions,
    /// `…/embeddings`: no output, usage in the JSON answer.
    Embeddings,
    /// `…/responses`: usage in the JSON answer, or in the stream's
    /// `response.completed` event (always sent).
    Responses,
    /// `…/messages` (Anthropic)
    Messages,
    /// `…/api/chat`, `…/api/generate` (Ollama): NDJSON streams by default.
    OllamaChat,
}

/// The prompt estimate: one token per this many bytes of request body.
pub const BYTES_PER_TOKEN: u64 = 4;

/// The keys whose string values are generated content, for an estimate
/// of what a response that never reported its usage sent: OpenAI's
/// `content`, `refusal`, tool calls' `arguments` and the Responses API's
/// `delta`/`text`; Anthropic's `text`, `partial_json` and `thinking`;
/// Ollama's `content` and `response`; reasoning models' `reasoning` and
/// `reasoning_content`.
pub const CONTENT_KEYS: [&str; 10] = [
    "content",
    "text",
    "arguments",
    "partial_json",
    "thinking",
    "reasoning",
    "reasoning_content",
    "refusal",
    "response",
    "delta",
];

crate::spelling::spellings!(Api {
    OpenAi => "openai",
    Anthropic => "anthropic",
    Ollama => "ollama",
});

impl Api {
    /// What a request whose output field is absent reserves by default,
    /// beside its prompt estimate: about a long answer of each API's
    /// common models (documented with the presets).
    pub fn reserve_default(self) -> u64 {
        match self {
            Api::OpenAi => 1024,
            Api::Anthropic => 1024,
            Api::Ollama => 1024,
        }
    }

    /// The endpoint a request for `path` reaches, by how the path ends
    /// (ASCII case and trailing slashes ignored, as upstream routers that
    /// redirect or fold them would); `None` for a path that generates
    /// nothing (`/v1/models`), which costs as a plain request.
    pub fn endpoint(self, path: &str) -> Option<Endpoint> {
        let path = path.trim_end_matches('/');
        let ends = |suffix: &str| {
            path.len() >= suffix.len()
                && path.is_char_boundary(path.len() - suffix.len())
                && path[path.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
        };
        match self {
            Api::OpenAi => {
                if ends("/chat/completions") {
                    Some(Endpoint::ChatCompletions)
                } else if ends("/completions") {
                    Some(Endpoint::Completions)
                } else if ends("/embeddings") {
                    Some(Endpoint::Embeddings)
                } else if ends("/responses") {
                    Some(Endpoint::Responses)
                } else {
                    None
                }
            }
            Api::Anthropic => ends("/messages").then_some(Endpoint::Messages),
            Api::Ollama => (ends("/api/chat") || ends("/api/generate")).then_some(Endpoint::OllamaChat),
        }
    }

    /// The request fields that bound its output, the first present wins.
    fn output_fields(self) -> &'static [&'static str] {
        match self {
            Api::OpenAi => &["max_completion_tokens", "max_tokens", "max_output_tokens"],
            Api::Anthropic => &["max_tokens"],
            Api::Ollama => &["options.num_predict"],
        }
    }
}

/// What a preset read of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRequest {
    pub endpoint: Endpoint,
    /// The tokens reserved: the prompt estimate plus the output limit (or
    /// the default).
    pub reserve: u64,
    /// The prompt estimate alone, the floor of what the request costs.
    pub prompt: u64,
    /// A streaming OpenAI request that did not ask for its usage: it is
    /// forwarded asking for it, and the chunk that brings it is removed
    /// from what the client receives.
    pub add_usage: bool,
}

/// Reads a request to `endpoint` whose body is `body` (a UTF-8 BOM
/// skipped) of `len` bytes (`len` counts even when the body could not be
/// read: an unreadable body still reserves its size).
pub fn read_request(api: Api, endpoint: Endpoint, body: Option<&[u8]>, len: u64, reserve_default: u64) -> ApiRequest {
    let prompt = len.div_ceil(BYTES_PER_TOKEN);
    let doc = body.map(super::rewrite::skip_bom);
    let output = if endpoint == Endpoint::Embeddings {
        Some(0)
    } else {
        doc.and_then(|d| {
            api.output_fields().iter().find_map(|f| {
                let path = super::JsonPath(f.split('.').map(str::to_string).collect());
                path.number_in(d)
            })
        })
    };
    let add_usage = api == Api::OpenAi
        && matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions)
        && doc.is_some_and(super::rewrite::lacks_usage);
    ApiRequest {
        endpoint,
        reserve: prompt.saturating_add(output.unwrap_or(reserve_default)),
        prompt,
        add_usage,
    }
}

/// Where a preset's responses report their usage: the fields of a JSON
/// answer, and of a stream's events (the last event holding each),
/// added up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiSettle {
    pub api: Api,
    pub json: Arc<JsonFields>,
    pub events: Arc<JsonFields>,
}

impl ApiSettle {
    pub fn new(api: Api) -> ApiSettle {
        let fields = |text: &str| Arc::new(JsonFields::parse(text).unwrap_or(JsonFields(Vec::new())));
        let (json, events) = match api {
            // A chat or completions stream's last chunk, and the Responses
            // API's `response.completed` event; one of the two is there.
            Api::OpenAi => (
                "usage.total_tokens",
                "usage.total_tokens+response.usage.total_tokens",
            ),
            // Cache writes and reads are input tokens too, billed as such.
            Api::Anthropic => (
                "usage.input_tokens+usage.cache_creation_input_tokens+usage.cache_read_input_tokens+usage.output_tokens",
                "message.usage.input_tokens+message.usage.cache_creation_input_tokens+message.usage.cache_read_input_tokens+usage.output_tokens",
            ),
            // The `done` line of an NDJSON stream, or the JSON answer.
            Api::Ollama => ("prompt_eval_count+eval_count", "prompt_eval_count+eval_count"),
        };
        ApiSettle {
            api,
            json: fields(json),
            events: fields(events),
        }
    }
}

/// The bytes of the string values under [`CONTENT_KEYS`] in the JSON
/// document `doc` (at any depth), as they are written; 0 when it is not
/// JSON.
pub fn content_bytes(doc: &[u8]) -> u64 {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(doc);
    count::Count(false).deserialize(&mut de).unwrap_or(0)
}

/// The content count over a JSON document, as serde visitors.
mod count {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    /// The content bytes in the value at hand; `.0`: it sits under a
    /// content key.
    pub(super) struct Count(pub(super) bool);

    impl<'de> DeserializeSeed<'de> for Count {
        type Value = u64;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Count {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_str<E>(self, v: &str) -> Result<u64, E> {
            Ok(if self.0 { v.len() as u64 } else { 0 })
        }

        fn visit_u64<E>(self, _: u64) -> Result<u64, E> {
            Ok(0)
        }

        fn visit_i64<E>(self, _: i64) -> Result<u64, E> {
            Ok(0)
        }

        fn visit_f64<E>(self, _: f64) -> Result<u64, E> {
            Ok(0)
        }

        fn visit_bool<E>(self, _: bool) -> Result<u64, E> {
            Ok(0)
        }

        fn visit_unit<E>(self) -> Result<u64, E> {
            Ok(0)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
            let mut n = 0u64;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let content = super::CONTENT_KEYS.contains(&key.as_ref());
                n = n.saturating_add(map.next_value_seed(Count(content))?);
            }
            Ok(n)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
            let mut n = 0u64;
            while let Some(v) = seq.next_element_seed(Count(self.0))? {
                n = n.saturating_add(v);
            }
            Ok(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_known_by_how_the_path_ends() {
        let openai = Api::OpenAi;
        assert_eq!(openai.endpoint("/v1/chat/completions"), Some(Endpoint::ChatCompletions));
        assert_eq!(
            openai.endpoint("/openai/deployments/gpt/chat/completions/"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(openai.endpoint("/V1/CHAT/COMPLETIONS"), Some(Endpoint::ChatCompletions));
        assert_eq!(openai.endpoint("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(openai.endpoint("/v1/embeddings"), Some(Endpoint::Embeddings));
        assert_eq!(openai.endpoint("/v1/responses"), Some(Endpoint::Responses));
        assert_eq!(openai.endpoint("/v1/models"), None);
        assert_eq!(openai.endpoint("/"), None);
        assert_eq!(Api::Anthropic.endpoint("/v1/messages"), Some(Endpoint::Messages));
        assert_eq!(Api::Anthropic.endpoint("/v1/messages/count_tokens"), None);
        assert_eq!(Api::Ollama.endpoint("/api/chat"), Some(Endpoint::OllamaChat));
        assert_eq!(Api::Ollama.endpoint("/ollama/api/generate"), Some(Endpoint::OllamaChat));
        assert_eq!(Api::Ollama.endpoint("/api/tags"), None);
        assert_eq!(Api::Ollama.endpoint("é"), None);
    }

    #[test]
    fn a_request_reserves_its_prompt_and_its_output() {
        let body = br#"{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}"#;
        let len = body.len() as u64;
        let r = read_request(Api::OpenAi, Endpoint::ChatCompletions, Some(body), len, 1024);
        assert_eq!(r.prompt, len.div_ceil(4));
        assert_eq!(r.reserve, r.prompt + 500);
        assert!(!r.add_usage, "not streamed");
        // max_completion_tokens wins over max_tokens.
        let body = br#"{"max_tokens":500,"max_completion_tokens":70,"stream":true}"#;
        let r = read_request(Api::OpenAi, Endpoint::ChatCompletions, Some(body), 60, 1024);
        assert_eq!(r.reserve, 15 + 70);
        assert!(r.add_usage);
        // Absent: the default. Unreadable (NaN, not JSON): the default and
        // the body's size, read or not.
        let r = read_request(
            Api::OpenAi,
            Endpoint::ChatCompletions,
            Some(br#"{"stream":true}"#),
            15,
            300,
        );
        assert_eq!(r.reserve, 4 + 300);
        let r = read_request(Api::OpenAi, Endpoint::ChatCompletions, Some(br#"{"t":NaN}"#), 4000, 300);
        assert_eq!(r.reserve, 1000 + 300);
        let r = read_request(Api::OpenAi, Endpoint::ChatCompletions, None, 4000, 300);
        assert_eq!(r.reserve, 1300);
        // A BOM is skipped.
        let r = read_request(
            Api::OpenAi,
            Endpoint::Completions,
            Some(b"\xEF\xBB\xBF{\"max_tokens\":9}"),
            20,
            300,
        );
        assert_eq!(r.reserve, 5 + 9);
        // Embeddings generate nothing; Anthropic and Ollama read their own.
        let r = read_request(Api::OpenAi, Endpoint::Embeddings, Some(br#"{"input":"x"}"#), 40, 300);
        assert_eq!(r.reserve, 10);
        let r = read_request(
            Api::Anthropic,
            Endpoint::Messages,
            Some(br#"{"max_tokens":64}"#),
            8,
            300,
        );
        assert_eq!(r.reserve, 2 + 64);
        let body = br#"{"options":{"num_predict":128}}"#;
        let r = read_request(Api::Ollama, Endpoint::OllamaChat, Some(body), 32, 300);
        assert_eq!((r.reserve, r.add_usage), (8 + 128, false));
        let r = read_request(
            Api::Ollama,
            Endpoint::OllamaChat,
            Some(br#"{"options":{"num_predict":-1}}"#),
            8,
            300,
        );
        assert_eq!(r.reserve, 2 + 300, "-1 (no limit) reserves the default");
    }

    #[test]
    fn content_is_the_strings_under_content_keys() {
        let chunk = br#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}"#;
        assert_eq!(content_bytes(chunk), 5);
        let tool = br#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}"#;
        assert_eq!(content_bytes(tool), 7);
        let anthropic = br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi there"}}"#;
        assert_eq!(
            content_bytes(anthropic),
            8,
            "an object under a content key: its own keys decide"
        );
        assert_eq!(content_bytes(br#"{"model":"llama3","response":"abc","done":false}"#), 3);
        assert_eq!(content_bytes(b"[DONE]"), 0);
    }
}
