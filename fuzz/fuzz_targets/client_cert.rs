//! The `cert` tier's reader of a client certificate's subject
//! (`identity::client_cert::identity_of`) on arbitrary DER.
//!
//! Properties: nothing panics; an identity is never empty and holds no
//! control character (it becomes part of a store key and a log line).
#![no_main]

use leasegate::identity::client_cert::identity_of;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(id) = identity_of(data) {
        assert!(!id.is_empty(), "an empty identity");
        assert!(!id.chars().any(char::is_control), "a control character in {id:?}");
    }
});
