//! The house's one rule, held by a test: a room imports only rooms on a
//! floor below its own. The floors are written once, in the `floors`
//! block of `docs/architecture.md`; this test reads every `crate::` path
//! in the code of `src/` (tests aside) and fails on one that points up or
//! sideways, as linkerd bans imports in its clippy config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const ARCHITECTURE: &str = include_str!("../docs/architecture.md");

/// Top-level module → floor, from the `floors` block: one line per floor,
/// `N: room room ...`.
fn floors() -> BTreeMap<String, u32> {
    let block = ARCHITECTURE
        .split("```floors\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/architecture.md has a ```floors block");
    let mut out = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (floor, rooms) = line.split_once(':').expect("a floor line is `N: rooms`");
        let floor: u32 = floor.trim().parse().expect("a floor is a number");
        for room in rooms.split_whitespace() {
            assert!(out.insert(room.to_string(), floor).is_none(), "{room} is on two floors");
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            // `tests/` directories hold unit tests only.
            if path.file_name().is_some_and(|n| n != "tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and without the item after each
/// `#[cfg(test)]` (rustfmt closes an item at its own indentation).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut skip_until: Option<String> = None;
    let mut after_cfg_test = false;
    for (n, line) in text.lines().enumerate() {
        if let Some(close) = &skip_until {
            if line == close.as_str() {
                skip_until = None;
            }
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            after_cfg_test = true;
            continue;
        }
        if after_cfg_test {
            if trimmed.starts_with("#[") {
                continue;
            }
            after_cfg_test = false;
            if !line.trim_end().ends_with(';') {
                let indent = &line[..line.len() - trimmed.len()];
                skip_until = Some(format!("{indent}}}"));
            }
            continue;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push((n + 1, code.to_string()));
    }
    out
}

/// Every top-level room a piece of code names: `crate::room` paths, and
/// the rooms of a `use crate::{a::x, b::y}` group.
fn rooms_named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first name of each item at the group's own depth.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        item_start = false;
                        let name: String = group[i..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if name != "self" {
                            out.push(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// `use crate::{` groups may span lines: joined, with the first line's number.
fn statements(lines: Vec<(usize, String)>) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in lines {
        if let Some((first, mut text)) = open.take() {
            text.push_str(&line);
            if line.contains("};") {
                out.push((first, text));
            } else {
                open = Some((first, text));
            }
        } else if line.contains("crate::{") && !line.contains('}') {
            open = Some((n, line));
        } else {
            out.push((n, line));
        }
    }
    out
}

#[test]
fn every_room_imports_only_rooms_below_it() {
    let floors = floors();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src/");
        let first = rel.components().next().expect("a path").as_os_str().to_string_lossy();
        let room = first.trim_end_matches(".rs").to_string();
        // The binary, the crate root and this test stand outside the house.
        if ["main", "lib", "architecture"].contains(&room.as_str()) {
            continue;
        }
        let Some(&floor) = floors.get(&room) else {
            wrong.push(format!(
                "src/{}: room `{room}` has no floor in docs/architecture.md",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (line, code) in statements(code_lines(&text)) {
            for other in rooms_named(&code) {
                if other == room {
                    continue;
                }
                match floors.get(&other) {
                    Some(&f) if f < floor => {}
                    Some(&f) => wrong.push(format!(
                        "src/{}:{line}: `{room}` (floor {floor}) imports `{other}` (floor {f})",
                        rel.display()
                    )),
                    None => wrong.push(format!(
                        "src/{}:{line}: `{other}` has no floor in docs/architecture.md",
                        rel.display()
                    )),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a room imports only rooms on a lower floor (docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_sees_what_it_must() {
    assert_eq!(rooms_named("use crate::limit::key::Facts;"), ["limit"]);
    assert_eq!(
        rooms_named("use crate::{config::Limit, quota::{Rate, Spec}, self};"),
        ["config", "quota"]
    );
    assert_eq!(
        rooms_named("x = crate::clock::now() + crate::quota::MAX;"),
        ["clock", "quota"]
    );
    let text =
        "use crate::a::X;\n// crate::b::Y\n#[cfg(test)]\nmod tests {\n    use crate::c::Z;\n}\nuse crate::d::W;\n";
    let named: Vec<String> = code_lines(text).iter().flat_map(|(_, c)| rooms_named(c)).collect();
    assert_eq!(named, ["a", "d"]);
    let grouped = statements(vec![
        (3, "use crate::{".into()),
        (4, "    a::X,".into()),
        (5, "};".into()),
    ]);
    assert_eq!(grouped.len(), 1);
    assert_eq!(rooms_named(&grouped[0].1), ["a"]);
}
