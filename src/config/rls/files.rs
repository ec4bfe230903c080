//! The files behind `[rls] config`: one YAML file or a directory of them,
//! read whole into rules, and what the reload watcher compares (their
//! digest and metadata).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{parse_into, RlsRules};
use crate::config::Problem;

/// The YAML files of `path`: the file itself, or a directory's `*.yaml` and
/// `*.yml` files in name order.
pub(super) fn files_of(path: &Path) -> Result<Vec<PathBuf>, Problem> {
    let problem = |reason: String| Problem {
        file: path.display().to_string(),
        line: None,
        key: "rls.config".into(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| problem(format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| problem(format!("cannot list the directory: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| e == "yaml" || e == "yml")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(problem("the directory holds no *.yaml or *.yml file".into()));
    }
    Ok(files)
}

/// Reads and compiles the rules at `path`; every problem found, located.
pub fn load(path: &Path) -> Result<RlsRules, Vec<Problem>> {
    let files = files_of(path).map_err(|p| vec![p])?;
    let mut rules = RlsRules {
        files: files.clone(),
        ..RlsRules::default()
    };
    let mut problems = Vec::new();
    let mut digest = Sha256::new();
    for file in &files {
        let name = file.display().to_string();
        let text = match std::fs::read_to_string(file) {
            Ok(t) => {
                digest_file(&mut digest, file, t.as_bytes());
                t
            }
            Err(e) => {
                problems.push(Problem {
                    file: name,
                    line: None,
                    key: "(document)".into(),
                    reason: format!("cannot read: {e}"),
                });
                continue;
            }
        };
        let known: Vec<String> = rules.domains.keys().cloned().collect();
        if let Err(mut p) = parse_into(&mut rules, &name, &text) {
            problems.append(&mut p);
        }
        let sha: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        for domain in rules.domains.keys().filter(|d| !known.contains(d)) {
            rules.domain_sha256.insert(domain.clone(), sha.clone());
        }
    }
    rules.digest = digest.finalize().into();
    if problems.is_empty() {
        Ok(rules)
    } else {
        Err(problems)
    }
}

fn digest_file(digest: &mut Sha256, file: &Path, bytes: &[u8]) {
    digest.update(file.as_os_str().as_encoded_bytes());
    digest.update([0]);
    digest.update((bytes.len() as u64).to_le_bytes());
    digest.update(bytes);
}

/// The digest [`load`] would record for the files at `path` now; `None`
/// when they cannot be read.
pub fn digest_of(path: &Path) -> Option<[u8; 32]> {
    let mut digest = Sha256::new();
    for file in files_of(path).ok()? {
        let bytes = std::fs::read(&file).ok()?;
        digest_file(&mut digest, &file, &bytes);
    }
    Some(digest.finalize().into())
}

/// What changes when one of the files at `path` changes, cheaply: their
/// names, modification times, sizes and inodes.
pub fn fingerprint_of(path: &Path) -> Vec<(PathBuf, Option<std::time::SystemTime>, u64, u64)> {
    files_of(path)
        .unwrap_or_default()
        .into_iter()
        .map(|f| {
            let m = std::fs::metadata(&f).ok();
            let modified = m.as_ref().and_then(|m| m.modified().ok());
            #[cfg(unix)]
            let inode = m.as_ref().map_or(0, std::os::unix::fs::MetadataExt::ino);
            #[cfg(not(unix))]
            let inode = 0;
            let len = m.map_or(0, |m| m.len());
            (f, modified, len, inode)
        })
        .collect()
}
