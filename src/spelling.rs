//! One spelling table per config enum: the names the config accepts and
//! the name a value prints as come from the same lines, so they cannot
//! drift apart.
//!
//! ```ignore
//! spellings!(Mode { Shadow => "shadow", Soft => "soft" });
//! ```
//!
//! gives `Mode::SPELLINGS` (for the config's `choice`, in the order the
//! docs list them), `Mode::as_str` and `Mode::from_spelling`.

/// Implements `SPELLINGS`, `as_str` and `from_spelling` for an enum from
/// one table of `Variant => "name"` lines.
macro_rules! spellings {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value as written in the config.
            pub const SPELLINGS: &'static [(&'static str, $ty)] = &[$(($name, $ty::$variant)),+];

            /// As written in the config.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// The value written `name` in the config, if any.
            pub fn from_spelling(name: &str) -> Option<$ty> {
                match name {
                    $($name => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

pub(crate) use spellings;

#[cfg(test)]
mod tests {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Fruit {
        Apple,
        Plum,
    }
    spellings!(Fruit {
        Apple => "apple",
        Plum => "plum",
    });

    #[test]
    fn one_table_spells_both_ways() {
        for &(name, value) in Fruit::SPELLINGS {
            assert_eq!(value.as_str(), name);
            assert_eq!(Fruit::from_spelling(name), Some(value));
        }
        assert_eq!(Fruit::from_spelling("pear"), None);
        assert_eq!(Fruit::SPELLINGS.len(), 2);
    }
}
