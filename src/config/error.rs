//! Config errors that name the file, the line, the key and what is wrong.

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
/// the table header above it.
pub fn from_toml(file: &str, source: &str, err: &toml::de::Error) -> Problem {
    let message = err.message().trim().to_string();
    let span = err.span();
    let line = span.as_ref().map(|s| line_of(source, s.start));
    let named = field_in_message(&message);
    let key = match &span {
        Some(span) => key_at(source, span, named),
        None => named.unwrap_or("(document)").to_string(),
    };
    Problem {
        file: file.to_string(),
        line,
        key,
        reason: message,
    }
}

/// "unknown field `foo`, expected ..." and "missing field `bar`" name the field.
fn field_in_message(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// The dotted key at a span: `section.key`, from the nearest table header
/// above the span and the `key =` on its own line.
fn key_at(source: &str, span: &Range<usize>, named: Option<&str>) -> String {
    let start = span.start.min(source.len());
    let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = source[start..].find('\n').map_or(source.len(), |i| start + i);
    let line = source[line_start..line_end].trim();
    let header = |l: &str| -> Option<String> {
        let l = l.trim();
        if l.starts_with('[') {
            let name = l.trim_start_matches('[');
            let name = name.split(']').next().unwrap_or("").trim();
            Some(name.to_string())
        } else {
            None
        }
    };
    // A span on a header line is about the table itself.
    if let Some(h) = header(line) {
        return match named {
            Some(field) => format!("{h}.{field}"),
            None => h,
        };
    }
    let section = source[..line_start].lines().rev().find_map(header);
    let key = match named {
        Some(field) => field.to_string(),
        None => match line.split_once('=') {
            Some((k, _)) => k.trim().to_string(),
            None => line.to_string(),
        },
    };
    match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(key_at(src, &(at..at + 3), None), "store.timeout_ms");
        assert_eq!(key_at(src, &(0..7), Some("nope")), "store.nope");
    }
}
