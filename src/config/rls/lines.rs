//! Where each key of a ratelimit YAML file is: its path
//! (`descriptors[2].rate_limit.unit`, as problems name keys) and its line.
//!
//! The YAML parser keeps no positions once a value is read, so the
//! problems found after parsing (a bad unit, a duplicate key) would have
//! no line, and serde stops at the first unknown field. This reads the
//! file's block structure itself: indentation, `key:` lines, `- ` items,
//! and the keys of a one-line `{flow: map}`. Anything it cannot follow
//! (anchors, multi-line flow maps, quoted keys) it skips: a problem there
//! falls back to the nearest enclosing path it did see.

use std::collections::HashMap;

/// Every key and list item seen, by path, with its 1-based line.
#[derive(Debug, Default)]
pub struct Lines {
    at: HashMap<String, usize>,
    /// The same paths, in the file's order.
    order: Vec<String>,
}

enum Frame {
    /// A `key:` at this indent.
    Key { indent: usize, path: String, items: usize },
    /// A `- ` item whose dash is at `dash`.
    Item { dash: usize, path: String },
}

impl Frame {
    fn path(&self) -> &str {
        match self {
            Frame::Key { path, .. } | Frame::Item { path, .. } => path,
        }
    }
}

/// A `name:` at the start of `s` (letters, digits, `_`, `-`): the name and
/// what follows the colon.
fn key_of(s: &str) -> Option<(&str, &str)> {
    let end = s.find(':')?;
    let name = &s[..end];
    let rest = &s[end + 1..];
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (plain && (rest.is_empty() || rest.starts_with(' '))).then_some((name, rest.trim()))
}

impl Lines {
    pub fn of(text: &str) -> Lines {
        let mut lines = Lines::default();
        let mut stack: Vec<Frame> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let indent = raw.len() - raw.trim_start_matches(' ').len();
            let mut content = raw[indent..].trim_end();
            if content.is_empty() || content.starts_with('#') || content == "---" {
                continue;
            }
            let mut at = indent;
            if let Some(item) = content.strip_prefix("- ").or((content == "-").then_some("")) {
                // A sibling item, or the first of a key's list (which may
                // sit at the key's own indent).
                while let Some(top) = stack.last() {
                    let pop = match top {
                        Frame::Key { indent: i, .. } => *i > at,
                        Frame::Item { dash, .. } => *dash >= at,
                    };
                    if !pop {
                        break;
                    }
                    stack.pop();
                }
                let path = match stack.last_mut() {
                    Some(Frame::Key { path, items, .. }) => {
                        *items += 1;
                        format!("{path}[{}]", *items - 1)
                    }
                    _ => continue,
                };
                lines.record(&path, line);
                stack.push(Frame::Item { dash: at, path });
                let skipped = item.len() - item.trim_start().len();
                at += 2 + skipped;
                content = item.trim_start();
                if content.is_empty() {
                    continue;
                }
            }
            let Some((name, rest)) = key_of(content) else { continue };
            while let Some(top) = stack.last() {
                let pop = match top {
                    Frame::Key { indent: i, .. } => *i >= at,
                    Frame::Item { dash, .. } => *dash >= at,
                };
                if !pop {
                    break;
                }
                stack.pop();
            }
            let path = match stack.last() {
                Some(f) => format!("{}.{name}", f.path()),
                None => name.to_string(),
            };
            lines.record(&path, line);
            // `{unit: hour, requests_per_unit: 5}` on the key's own line.
            if let Some(flow) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
                for part in flow.split(',') {
                    if let Some((inner, _)) = key_of(part.trim()) {
                        lines.record(&format!("{path}.{inner}"), line);
                    }
                }
            }
            stack.push(Frame::Key {
                indent: at,
                path,
                items: 0,
            });
        }
        lines
    }

    fn record(&mut self, path: &str, line: usize) {
        if !self.at.contains_key(path) {
            self.at.insert(path.to_string(), line);
            self.order.push(path.to_string());
        }
    }

    /// The line of `path`, else of the nearest enclosing path seen.
    pub fn line_of(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(&l) = self.at.get(p) {
                return Some(l);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }

    /// Every key path seen, in the file's order, with its line.
    pub fn keys(&self) -> impl Iterator<Item = (&str, usize)> {
        self.order
            .iter()
            .filter(|p| !p.ends_with(']'))
            .map(|p| (p.as_str(), self.at[p]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "\
domain: edge # the domain
descriptors:
  - key: a
    rate_limit:
      unit: hour

      requests_per_unit: 5
  - key: b
    rate_limit: {unit: fortnight, requests_per_unit: 3}
    descriptors:
    - key: c
      value: x
  -
    key: d
replaces_at_top:
  - name: n
";

    #[test]
    fn paths_carry_their_own_lines() {
        let l = Lines::of(YAML);
        let at = |p: &str| l.line_of(p);
        assert_eq!(at("domain"), Some(1));
        assert_eq!(at("descriptors"), Some(2));
        assert_eq!(at("descriptors[0]"), Some(3));
        assert_eq!(at("descriptors[0].key"), Some(3));
        assert_eq!(at("descriptors[0].rate_limit.unit"), Some(5));
        assert_eq!(at("descriptors[0].rate_limit.requests_per_unit"), Some(7));
        assert_eq!(at("descriptors[1].key"), Some(8));
        assert_eq!(at("descriptors[1].rate_limit.unit"), Some(9));
        assert_eq!(at("descriptors[1].rate_limit.requests_per_unit"), Some(9));
        // A list at its key's own indent.
        assert_eq!(at("descriptors[1].descriptors[0].key"), Some(11));
        assert_eq!(at("descriptors[1].descriptors[0].value"), Some(12));
        // An item whose first key is on the next line.
        assert_eq!(at("descriptors[2].key"), Some(14));
        assert_eq!(at("replaces_at_top[0].name"), Some(16));
        // Unseen: the nearest enclosing path.
        assert_eq!(at("descriptors[1].rate_limit.replaces"), Some(9));
        assert_eq!(at("nowhere"), None);
        let keys: Vec<&str> = l.keys().map(|(p, _)| p).collect();
        assert_eq!(keys[..3], ["domain", "descriptors", "descriptors[0].key"]);
    }

    #[test]
    fn anything_goes_without_a_panic() {
        for text in [
            "- - -\n  :\n",
            ":\n- a: {b, : c}\n",
            "a:\n\t- b\n",
            "  - x\n- y: [\n",
            "\u{feff}a: ü:\n",
        ] {
            let l = Lines::of(text);
            let _ = l.line_of("a.b[0]");
            let _ = l.keys().count();
        }
    }
}
