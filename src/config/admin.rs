//! `[admin]`: who may use the admin listener.
//!
//! With `token_file`, every admin path but `/healthz` and `/readyz` needs
//! `Authorization: Bearer <token>`. The token is read when the config is
//! loaded (at start and at every reload), never shown (not in `Debug`, not
//! in `/config`), and compared in constant time: both sides are hashed
//! with SHA-256 and the digests compared byte by byte without an early
//! exit, so neither the token's length nor a matching prefix shows in the
//! time an answer takes.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// Shortest token accepted: guessing one must be out of reach.
pub const MIN_TOKEN_LEN: usize = 16;

/// The admin listener's bearer token, as its digest.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
    /// Where it was read from, resolved against gateway.toml's directory.
    pub file: PathBuf,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl AdminToken {
    pub fn new(token: &str, file: PathBuf) -> AdminToken {
        AdminToken {
            digest: Sha256::digest(token.as_bytes()).into(),
            file,
        }
    }

    /// Whether an `Authorization` header value presents this token
    /// (`Bearer <token>`, the scheme in any case).
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let presented = match value.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &value[7..],
            _ => return false,
        };
        let presented: [u8; 32] = Sha256::digest(presented).into();
        presented
            .iter()
            .zip(self.digest.iter())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bearer_token_itself_is_admitted() {
        let t = AdminToken::new("0123456789abcdef-secret", PathBuf::from("admin.token"));
        assert!(t.admits(Some(b"Bearer 0123456789abcdef-secret")));
        assert!(t.admits(Some(b"bearer 0123456789abcdef-secret")));
        for wrong in [
            &b"Bearer 0123456789abcdef-secreT"[..],
            b"Bearer 0123456789abcdef-secret ",
            b"Bearer 0123456789abcdef",
            b"Basic 0123456789abcdef-secret",
            b"0123456789abcdef-secret",
            b"Bearer ",
            b"",
        ] {
            assert!(!t.admits(Some(wrong)), "{}", String::from_utf8_lossy(wrong));
        }
        assert!(!t.admits(None));
        assert!(!format!("{t:?}").contains("secret"));
    }
}
