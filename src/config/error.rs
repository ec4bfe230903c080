//! Config errors that name the file, the line, the key and what is wrong.

use super::raw;
use std::fmt;
use std::ops::Range;

/// Why a config file could not become the running config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read the file: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// One or more problems, each located in the file.
    #[error("{}", Problems(.0))]
    Invalid(Vec<Problem>),
}

/// One thing wrong with the file: where, which key, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub line: Option<usize>,
    pub key: String,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}: {}", self.file, line, self.key, self.reason),
            None => write!(f, "{}: {}: {}", self.file, self.key, self.reason),
        }
    }
}

struct Problems<'a>(&'a [Problem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            ConfigError::Read { .. } => &[],
        }
    }
}

/// 1-based line of a byte offset.
pub fn line_of(source: &str, offset: usize) -> usize {
    let end = offset.min(source.len());
    source.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Turns a TOML parse or schema error into a located problem. The TOML crate
/// gives a span and a message; the key is recovered from the span's line and
/// the table header above it (with the index of an array of tables), and the
/// message is put in the file's words rather than serde's Rust type names.
pub fn from_toml(file: &str, source: &str, err: &toml::de::Error) -> Problem {
    let message = err.message().trim().to_string();
    let span = err.span();
    let line = span.as_ref().map(|s| line_of(source, s.start));
    let named = field_in_message(&message);
    let (key, is_table) = match &span {
        Some(span) => key_at(source, span, named),
        None => (named.unwrap_or("(document)").to_string(), false),
    };
    Problem {
        file: file.to_string(),
        line,
        key,
        reason: reword(&message, is_table),
    }
}

/// Most problems of key types and names listed from one file.
const MAX_TOML_PROBLEMS: usize = 50;

/// Every problem of a file whose syntax is sound, not only the first: serde
/// stops at the first key of a wrong type or name, so that key's lines are
/// blanked (offsets kept, so later lines keep their numbers) and the file
/// is read again, until it reads or [`MAX_TOML_PROBLEMS`]. A key it took
/// away is no more "missing" than the user's file said: such follow-ups are
/// dropped. A syntax error is the only problem listed (past it, nothing
/// can be read reliably).
pub fn every_toml_problem(file: &str, source: &str, first: toml::de::Error) -> Vec<Problem> {
    let mut problems = vec![from_toml(file, source, &first)];
    if source.parse::<toml::Table>().is_err() {
        return problems;
    }
    let mut text = source.to_string();
    let mut err = first;
    let mut blanked: Vec<std::ops::Range<usize>> = Vec::new();
    while problems.len() < MAX_TOML_PROBLEMS {
        let Some(span) = err.span().filter(|s| s.start < s.end && s.end <= text.len()) else {
            break;
        };
        // The whole lines of the key and its value; of an unknown table,
        // its every line, or its keys would be read as the table above's.
        let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
        let end = text[span.end..].find('\n').map_or(text.len(), |i| span.end + i);
        let end = match unknown_table(&text[start..end], field_in_message(err.message())) {
            Some(segments) => table_end(&text, end, &segments),
            None => end,
        };
        if blanked.iter().any(|b| b.start <= start && end <= b.end) {
            break; // the same lines again: nothing more to learn
        }
        let spaces: String = text[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        // Multi-byte characters become one space each: pad to keep offsets.
        let pad = (end - start).saturating_sub(spaces.len());
        text.replace_range(start..end, &(spaces + &" ".repeat(pad)));
        blanked.push(start..end);
        match toml::from_str::<raw::File>(&text) {
            Ok(_) => break,
            Err(e) => {
                let follow_up = e.message().starts_with("missing field");
                if !follow_up {
                    problems.push(from_toml(file, source, &e));
                }
                err = e;
                if follow_up {
                    break;
                }
            }
        }
    }
    problems.sort_by_key(|p| p.line);
    problems
}

/// The path of the table `line` opens when `named` (the unknown field)
/// is that table's own name: `[[limit]]` for `limit`.
fn unknown_table(line: &str, named: Option<&str>) -> Option<Vec<String>> {
    let (segments, _) = header(line)?;
    (segments.last().map(String::as_str) == named && named.is_some()).then_some(segments)
}

/// Where the table `segments` opened above `from` ends: at the next header
/// outside it (its own sub-tables, `[limit.response]`, are in it), or at
/// the end of the file.
fn table_end(text: &str, from: usize, segments: &[String]) -> usize {
    let mut at = from;
    while at < text.len() {
        let line_start = at + 1;
        let line_end = text[line_start.min(text.len())..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i);
        if let Some((other, _)) = header(&text[line_start.min(text.len())..line_end]) {
            if !other.starts_with(segments) {
                return at;
            }
        }
        at = line_end;
    }
    text.len()
}

/// "unknown field `foo`, expected ..." and "missing field `bar`" name the field.
fn field_in_message(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// serde's messages, in the words of the file: `unknown field` becomes an
/// unknown key or table with the nearest known name, Rust integer types
/// become whole numbers with their range.
fn reword(message: &str, is_table: bool) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (field, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known = backticked(expected);
        let what = if is_table { "table" } else { "key" };
        let mut out = format!("unknown {what} `{field}`");
        if let Some(near) = did_you_mean(field, &known) {
            out.push_str(&format!(", did you mean `{near}`?"));
        }
        if known.is_empty() {
            out.push_str(" (this table takes no keys)");
        } else {
            out.push_str(&format!(" (known here: {})", known.join(", ")));
        }
        return out;
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or(rest);
        return format!("missing field `{field}`: it is required here");
    }
    // An integer too large for any field (TOML's are 64-bit).
    if let Some(rest) = message.strip_prefix("invalid type: integer `") {
        if let Some((value, tail)) = rest.split_once('`') {
            if tail.starts_with(" as i128") && tail.contains("expected i64") {
                return format!("{value} is out of range: too large for any setting");
            }
        }
    }
    if let Some(rest) = message.strip_prefix("invalid value: integer `") {
        if let Some((value, ty)) = rest.split_once("`, expected ") {
            if let Some((lo, hi)) = integer_range(ty) {
                return format!("{value} is out of range: use {lo} to {hi}");
            }
        }
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!("expected {}, found {found}", type_in_words(expected));
        }
    }
    message.to_string()
}

fn integer_range(ty: &str) -> Option<(i128, i128)> {
    Some(match ty {
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" | "usize" => (0, u64::MAX.into()),
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" | "isize" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    })
}

fn type_in_words(ty: &str) -> String {
    match ty {
        t if integer_range(t).is_some() => "a whole number".to_string(),
        "f32" | "f64" => "a number".to_string(),
        "a sequence" => "a list such as [\"a\", \"b\"]".to_string(),
        "a map" => "a table".to_string(),
        t if t.starts_with("struct ") => "a table".to_string(),
        t => t.to_string(),
    }
}

/// The names between backticks: serde's "expected one of `a`, `b`".
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

/// The known name nearest to `word`, when it is near enough to be a typo.
pub fn did_you_mean<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let (best, distance) = known
        .iter()
        .map(|k| (*k, edit_distance(&word, &k.to_ascii_lowercase())))
        .min_by_key(|&(_, d)| d)?;
    if distance <= (word.chars().count() / 3).max(2) {
        return Some(best);
    }
    // A name without its unit or with a word too many: `leeway` for
    // `leeway_secs`, `timeout_ms` for `timeout`.
    known
        .iter()
        .filter(|k| {
            let k = k.to_ascii_lowercase();
            word.len().min(k.len()) >= 4 && (k.starts_with(&word) || word.starts_with(&k))
        })
        .min_by_key(|k| k.len().abs_diff(word.len()))
        .copied()
}

/// Levenshtein distance, with a swap of two neighbours counted as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Rows i-2, i-1 and i of the table.
    let mut older = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(older[j - 2] + 1);
            }
            cur[j] = d;
        }
        std::mem::swap(&mut older, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The segments of a table header line (`[a.b]`, `[[a]]`), or `None` for
/// any other line.
fn header(line: &str) -> Option<(Vec<String>, bool)> {
    let l = line.trim();
    if !l.starts_with('[') {
        return None;
    }
    let array = l.starts_with("[[");
    let name = l.trim_start_matches('[');
    let name = name.split(']').next().unwrap_or("");
    let segments = name
        .split('.')
        .map(|s| s.trim().trim_matches('"').to_string())
        .collect();
    Some((segments, array))
}

/// The dotted path of the header on the line starting at `at`, with the
/// index of every array of tables in it (`routes[1].response`), counted from
/// the `[[...]]` headers up to that line. `open_last`: the last segment is
/// the unknown name itself, which has no index.
fn indexed_path(source: &str, at: usize, segments: &[String], open_last: bool) -> String {
    let upto = source[at..].find('\n').map_or(source.len(), |i| at + i);
    let arrays: Vec<Vec<String>> = source[..upto]
        .lines()
        .filter_map(header)
        .filter(|(_, array)| *array)
        .map(|(s, _)| s)
        .collect();
    let mut out = String::new();
    for (i, seg) in segments.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(seg);
        if open_last && i + 1 == segments.len() {
            break;
        }
        let prefix = &segments[..=i];
        let n = arrays.iter().filter(|a| a.as_slice() == prefix).count();
        if n > 0 {
            out.push_str(&format!("[{}]", n - 1));
        }
    }
    out
}

/// The dotted key at a span, `section[index].key`, from the nearest table
/// header above the span and the `key =` on its own line; and whether the
/// span is on a table's header (an unknown name there is a table).
fn key_at(source: &str, span: &Range<usize>, named: Option<&str>) -> (String, bool) {
    let start = span.start.min(source.len());
    let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = source[start..].find('\n').map_or(source.len(), |i| start + i);
    let line = source[line_start..line_end].trim();
    // A span on a header line is about the table itself.
    if let Some((segments, _)) = header(line) {
        let unknown_table = named.is_some_and(|n| segments.last().is_some_and(|l| l == n));
        let path = indexed_path(source, line_start, &segments, unknown_table);
        return match named {
            Some(field) if !unknown_table => (format!("{path}.{field}"), false),
            _ => (path, unknown_table),
        };
    }
    // The header above, and where its line starts.
    let mut section = None;
    let mut at = line_start;
    while at > 0 {
        let prev_start = source[..at - 1].rfind('\n').map_or(0, |i| i + 1);
        if let Some((segments, _)) = header(&source[prev_start..at - 1]) {
            section = Some(indexed_path(source, prev_start, &segments, false));
            break;
        }
        at = prev_start;
    }
    let line_key = line.split_once('=').map(|(k, _)| k.trim().to_string());
    let key = match (named, line_key) {
        // An unknown or missing key inside an inline table: `response = { bdy = .. }`.
        (Some(field), Some(k)) if k != field && line.contains('{') => format!("{k}.{field}"),
        (Some(field), _) => field.to_string(),
        (None, Some(k)) => k,
        (None, None) => line.to_string(),
    };
    let key = match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key,
    };
    (key, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table under a misspelt name is one problem: its keys are not
    /// read as the table above's (the route's, with 18 wrong lines), and
    /// its sub-tables go with it, while problems past it still count.
    #[test]
    fn an_unknown_table_is_one_problem_not_one_per_key() {
        let text = "[listeners]\nhttp = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"api\"\ntargets = [\"http://127.0.0.1:9\"]\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstream = \"api\"\nlimits = [\"per_ip\"]\n\n[[limit]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"10/s\"\nalgorithm = \"token_bucket\"\nburst = 20\n\n[limit.response]\nstatus = 429\n\n[[limits]]\nname = \"per_ip\"\nrate = \"10/s\"\nbrust = 3\n";
        let problems = match crate::config::parse(std::path::Path::new("gateway.toml"), text) {
            Err(ConfigError::Invalid(p)) => p,
            other => panic!("expected invalid, got {other:?}"),
        };
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:#?}");
        assert!(
            shown[0].starts_with("gateway.toml:14: limit: unknown table `limit`, did you mean `limits`?"),
            "{shown:#?}"
        );
        assert!(
            shown[1].starts_with("gateway.toml:27: limits[0].brust: unknown key `brust`, did you mean `burst`?"),
            "{shown:#?}"
        );
    }

    #[test]
    fn lines_are_one_based() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
    }

    #[test]
    fn key_comes_from_section_and_line() {
        let src = "[store]\nbackend = \"memory\"\ntimeout_ms = \"x\"\n";
        let at = src.find("\"x\"").unwrap();
        assert_eq!(key_at(src, &(at..at + 3), None).0, "store.timeout_ms");
        assert_eq!(key_at(src, &(0..7), Some("nope")).0, "store.nope");
    }

    #[test]
    fn keys_in_arrays_of_tables_carry_their_index() {
        let src = "[[routes]]\nname = \"a\"\n\n[[limits]]\nname = \"x\"\n\n[[routes]]\nname = \"b\"\nshards = -5\n\n[routes.response]\nstatus = 1\n";
        let at = src.find("-5").unwrap();
        assert_eq!(key_at(src, &(at..at + 2), None).0, "routes[1].shards");
        let at = src.find("status").unwrap();
        assert_eq!(key_at(src, &(at..at + 6), None).0, "routes[1].response.status");
        let at = src.find("[routes.response]").unwrap();
        assert_eq!(key_at(src, &(at..at + 5), Some("bdy")).0, "routes[1].response.bdy");
        // A misspelled table is named once, as a table.
        let src = "[listener]\nhttp = \"x\"\n";
        assert_eq!(key_at(src, &(0..10), Some("listener")), ("listener".to_string(), true));
        let src = "[[route]]\nname = \"x\"\n";
        assert_eq!(key_at(src, &(0..9), Some("route")), ("route".to_string(), true));
        let src = "[[routes]]\nresponse = { status = 200, bdy = \"x\" }\n";
        let at = src.find("bdy").unwrap();
        assert_eq!(key_at(src, &(at..at + 3), Some("bdy")).0, "routes[0].response.bdy");
    }

    #[test]
    fn typos_get_the_nearest_known_name() {
        let top = [
            "gateway",
            "listeners",
            "tls",
            "store",
            "leasing",
            "identity",
            "upstreams",
            "routes",
            "limits",
        ];
        assert_eq!(did_you_mean("listener", &top), Some("listeners"));
        assert_eq!(did_you_mean("route", &top), Some("routes"));
        assert_eq!(did_you_mean("Limits", &top), Some("limits"));
        assert_eq!(
            did_you_mean("path_prefx", &["name", "path_prefix"]),
            Some("path_prefix")
        );
        assert_eq!(did_you_mean("laesing", &top), Some("leasing"));
        assert_eq!(did_you_mean("frobnicate", &top), None);
        let jwt = ["algorithms", "secret", "leeway_secs"];
        assert_eq!(did_you_mean("leeway", &jwt), Some("leeway_secs"));
        assert_eq!(did_you_mean("leeway_seconds", &jwt), Some("leeway_secs"));
        assert_eq!(did_you_mean("timeout", &["timeout_ms", "url"]), Some("timeout_ms"));
        assert_eq!(did_you_mean("ur", &["url"]), Some("url"));
        assert_eq!(did_you_mean("sec", &jwt), None);
        assert_eq!(did_you_mean("x", &[]), None);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("ab", "ba"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn serde_messages_are_put_in_words() {
        assert_eq!(
            reword("unknown field `listener`, expected one of `gateway`, `listeners`", true),
            "unknown table `listener`, did you mean `listeners`? (known here: gateway, listeners)"
        );
        assert_eq!(
            reword("unknown field `zzz`, expected `a` or `b`", false),
            "unknown key `zzz` (known here: a, b)"
        );
        assert_eq!(
            reword("invalid value: integer `-5`, expected u32", false),
            "-5 is out of range: use 0 to 4294967295"
        );
        assert_eq!(
            reword(
                "invalid type: integer `99999999999999999999` as i128, expected i64",
                false
            ),
            "99999999999999999999 is out of range: too large for any setting"
        );
        assert_eq!(
            reword("invalid type: string \"ten\", expected i64", false),
            "expected a whole number, found string \"ten\""
        );
        assert_eq!(
            reword("invalid type: string \"ip\", expected a sequence", false),
            "expected a list such as [\"a\", \"b\"], found string \"ip\""
        );
    }
}
