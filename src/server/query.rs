//! The query string of an admin request (`/limits/state?key=...`, the
//! status page's `?key=`): pairs, values percent-decoded. Shared by the
//! admin endpoints and the status page.

/// The pairs of a query string, names raw, values percent-decoded (`+` is a
/// space); a value that is not UTF-8 once decoded is `None`.
pub fn query_pairs(query: &str) -> impl Iterator<Item = (&str, Option<String>)> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (name, percent_decode(value))
    })
}

fn percent_decode(s: &str) -> Option<String> {
    decode(s, true)
}

/// A path segment, percent-decoded (`+` stays a `+`); `None` when not
/// UTF-8 once decoded.
pub fn path_decode(s: &str) -> Option<String> {
    decode(s, false)
}

fn decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_decoded_and_keys_may_repeat() {
        let pairs: Vec<_> = query_pairs("key=rl%3A%7Bfive%3Aa%7D&x=1&key=rl:{b+c}&key=%FF&&key").collect();
        assert_eq!(
            pairs,
            [
                ("key", Some("rl:{five:a}".to_string())),
                ("x", Some("1".to_string())),
                ("key", Some("rl:{b c}".to_string())),
                ("key", None),
                ("key", Some(String::new())),
            ]
        );
        assert_eq!(percent_decode("100%"), Some("100%".into()));
        assert_eq!(percent_decode("%4"), Some("%4".into()));
        assert_eq!(path_decode("key:a+b%2Fc"), Some("key:a+b/c".into()));
    }
}
