//! `[gateway] access_log_fields`: which fields an access-log line carries.
//!
//! A set of bits, one per field, checked as each field is written: no
//! allocation, one test per field. `timestamp` and `level` are always
//! written.

/// Every field an access-log line may carry, in the order it is written.
pub const NAMES: [&str; 20] = [
    "request_id",
    "route",
    "method",
    "path",
    "status",
    "identity",
    "outcome",
    "limit",
    "key",
    "upstream",
    "ms",
    "client",
    "tenant",
    "key_id",
    "bytes_in",
    "bytes_out",
    "upstream_target",
    "upstream_ms",
    "cost",
    "aborted",
];

/// One field of [`NAMES`], by its index there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Field {
    RequestId = 0,
    Route,
    Method,
    Path,
    Status,
    Identity,
    Outcome,
    Limit,
    Key,
    Upstream,
    Ms,
    Client,
    Tenant,
    KeyId,
    BytesIn,
    BytesOut,
    UpstreamTarget,
    UpstreamMs,
    Cost,
    Aborted,
}

/// The fields a line carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fields(u32);

impl Default for Fields {
    fn default() -> Self {
        Fields::ALL
    }
}

/// Why an `access_log_fields` list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldsError {
    #[error("unknown access-log field {0:?}: use one of {list}", list = NAMES.join(", "))]
    Unknown(String),
    #[error("{0:?} mixes fields to keep with fields to drop (\"-name\"): list either the fields to keep, or the ones to drop")]
    Mixed(String),
}

impl Fields {
    pub const ALL: Fields = Fields((1 << NAMES.len()) - 1);
    /// The fields lines carried before `client` and the others were added.
    pub const FIRST: Fields = Fields((1 << (Field::Ms as u32 + 1)) - 1);

    pub fn has(self, f: Field) -> bool {
        self.0 & (1 << f as u32) != 0
    }

    pub fn without(self, f: Field) -> Fields {
        Fields(self.0 & !(1 << f as u32))
    }

    /// `access_log_fields` as written: the names of the fields to keep
    /// (`["request_id", "status"]`), or of the fields to drop, each with a
    /// leading `-` (`["-client", "-key_id"]`); empty: every field.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Fields, FieldsError> {
        let dropping = names.first().is_some_and(|n| n.as_ref().starts_with('-'));
        let mut bits = if dropping || names.is_empty() { Fields::ALL.0 } else { 0 };
        for n in names {
            let n = n.as_ref();
            let (drop, name) = match n.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, n),
            };
            if drop != dropping {
                return Err(FieldsError::Mixed(n.to_string()));
            }
            let i = NAMES
                .iter()
                .position(|f| *f == name)
                .ok_or_else(|| FieldsError::Unknown(name.to_string()))?;
            if drop {
                bits &= !(1 << i);
            } else {
                bits |= 1 << i;
            }
        }
        Ok(Fields(bits))
    }

    /// The names of the fields kept, for `/config`.
    pub fn names(self) -> Vec<&'static str> {
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_or_drop_lists_and_their_errors() {
        assert_eq!(Fields::parse::<&str>(&[]).unwrap(), Fields::ALL);
        let kept = Fields::parse(&["status", "path"]).unwrap();
        assert!(kept.has(Field::Status) && kept.has(Field::Path));
        assert!(!kept.has(Field::Client));
        assert_eq!(kept.names(), ["path", "status"]);
        let dropped = Fields::parse(&["-client", "-key_id"]).unwrap();
        assert!(!dropped.has(Field::Client) && !dropped.has(Field::KeyId));
        assert!(dropped.has(Field::Tenant));
        assert_eq!(
            Fields::parse(&["status", "clinet"]),
            Err(FieldsError::Unknown("clinet".into()))
        );
        assert_eq!(
            Fields::parse(&["-client", "status"]),
            Err(FieldsError::Mixed("status".into()))
        );
        assert_eq!(NAMES[Field::Aborted as usize], "aborted");
        assert_eq!(NAMES[Field::Ms as usize], "ms");
        assert_eq!(Fields::FIRST.names().last(), Some(&"ms"));
    }
}
