//! `gateway.toml` (`config::parse`) on arbitrary text.
//!
//! Properties: nothing panics, however malformed; a config that compiles
//! also gives its summary and warnings without panicking; one that does not
//! lists at least one problem, and a problem located in the text names a
//! line of it.
//!
//! Relative paths in the text (certificates, key files, RLS rules) resolve
//! against the working directory: scripts/fuzz.sh runs this target in an
//! empty scratch directory.
#![no_main]

use std::path::Path;

use leasegate::config::{parse, ConfigError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(Path::new("fuzz.toml"), text) {
        Ok(config) => {
            let _ = config.summary();
            let _ = config.warnings();
            let _ = config.inputs_sha256();
        }
        Err(ConfigError::Invalid(problems)) => {
            assert!(!problems.is_empty(), "invalid, with no problem given");
            let lines = text.lines().count() + 1;
            for p in &problems {
                let _ = p.to_string();
                if p.file == "fuzz.toml" {
                    if let Some(line) = p.line {
                        assert!((1..=lines).contains(&line), "line {line} of {lines}: {p}");
                    }
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
