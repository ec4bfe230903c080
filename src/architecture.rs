//! The house's one rule, held by a test: a room imports only rooms on a
//! floor below its own. The floors are written once, in the `floors`
//! block of `docs/architecture.md`; this test reads every `crate::` path
//! in the code of `src/` (tests aside) and fails on one that points up or
//! sideways, as linkerd bans imports in its clippy config. Within the
//! rooms, files import one another one way too: no circle of files.

use std::collections::{BTreeMap, BTreeSet};
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
            out.extend(
                group_heads(group)
                    .into_iter()
                    .filter(|n| *n != "self")
                    .map(String::from),
            );
        } else {
            let name: String = rest.chars().take_while(|&c| is_word(c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The first name of each item of a `{...}` group (`group` starts after
/// its `{`), at the group's own depth: `a::x, b::{y, z}, self` gives `a`,
/// `b`, `self`.
fn group_heads(group: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && is_word(c) => {
                item_start = false;
                let len = group[i..].find(|c: char| !is_word(c)).unwrap_or(group.len() - i);
                out.push(&group[i..i + len]);
            }
            _ => {}
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

/// A file's module path under `src/` (`gateway/serve.rs` → `gateway::serve`,
/// `quota/mod.rs` → `quota`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_string();
    }
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// Every module path a piece of code names from `crate::` or `super::`
/// (each `super` one step up from `here`, the module whose code it is;
/// a file's own module for `a.rs`, its parent's for `a/mod.rs` alike),
/// with a `{...}` group's first names each appended.
fn paths_named(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(j) = code[i..].find(['c', 's']).map(|j| i + j) {
        i = j + 1;
        if j > 0 && code[..j].chars().next_back().is_some_and(|c| is_word(c) || c == ':') {
            continue;
        }
        let rest = &code[j..];
        let (mut path, mut rest) = if let Some(r) = rest.strip_prefix("crate::") {
            (Vec::new(), r)
        } else if rest.starts_with("super::") {
            let mut path = here.to_vec();
            let mut r = rest;
            while let Some(after) = r.strip_prefix("super::") {
                path.pop();
                r = after;
            }
            (path, r)
        } else {
            continue;
        };
        loop {
            let name: String = rest.chars().take_while(|&c| is_word(c)).collect();
            if name.is_empty() {
                break;
            }
            rest = &rest[name.len()..];
            path.push(name);
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        if let Some(group) = rest.strip_prefix('{') {
            for name in group_heads(group) {
                let mut p = path.clone();
                if name != "self" {
                    p.push(name.to_string());
                }
                out.push(p);
            }
        } else {
            out.push(path);
        }
    }
    out
}

/// The circles among `edges` (module → modules it imports), each as the
/// path around it.
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    // 0 unseen, 1 on the current path, 2 done.
    fn visit<'a>(
        m: &'a Vec<String>,
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<&'a Vec<String>, u8>,
        path: &mut Vec<&'a Vec<String>>,
        out: &mut Vec<Vec<Vec<String>>>,
    ) {
        state.insert(m, 1);
        path.push(m);
        for next in edges.get(m).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                0 => visit(next, edges, state, path, out),
                1 => {
                    let from = path.iter().position(|p| *p == next).unwrap_or(0);
                    let mut circle: Vec<Vec<String>> = path[from..].iter().map(|p| (*p).clone()).collect();
                    circle.push(next.clone());
                    out.push(circle);
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m, 2);
    }
    let mut state = BTreeMap::new();
    let mut out = Vec::new();
    for m in edges.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            visit(m, edges, &mut state, &mut Vec::new(), &mut out);
        }
    }
    out
}

/// `src/` and every Rust file under it (unit-test directories aside).
fn source_files() -> (PathBuf, Vec<PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    (src, files)
}

#[test]
fn no_circle_of_files() {
    let (src, files) = source_files();
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(f.strip_prefix(&src).expect("under src/")), f.clone()))
        .filter(|(m, _)| !m.is_empty() && m[0] != "main" && m[0] != "lib" && m[0] != "architecture")
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        // `super` in `a/b.rs` and in `a/b/mod.rs` both mean `a`.
        for (_, code) in statements(code_lines(&text)) {
            for mut path in paths_named(&code, module) {
                // The longest prefix that is a file of ours.
                while !path.is_empty() && !modules.contains_key(&path) {
                    path.pop();
                }
                // A module and its own parent or children are one concern.
                let nested = path.starts_with(module) || module.starts_with(&path);
                if !path.is_empty() && !nested {
                    edges.entry(module.clone()).or_default().insert(path);
                }
            }
        }
    }
    let found: Vec<String> = circles(&edges)
        .iter()
        .map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" → "))
        .collect();
    assert!(
        found.is_empty(),
        "files import one another one way; move the shared type down:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_circle_finder_sees_what_it_must() {
    let here: Vec<String> = ["gateway", "serve"].map(String::from).to_vec();
    let named = paths_named(
        "use super::cost::{self, Watcher}; use crate::proxy::{body::Body, pool};",
        &here,
    );
    let named: Vec<String> = named.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        named,
        ["gateway::cost", "gateway::cost::Watcher", "proxy::body", "proxy::pool"]
    );
    assert_eq!(
        paths_named("x = super::super::clock::now();", &here)[0],
        ["clock", "now"]
    );
    assert!(paths_named("let supercrate = my_crate::x;", &here).is_empty());
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let mut edges = BTreeMap::new();
    edges.insert(m("a::x"), BTreeSet::from([m("a::y")]));
    edges.insert(m("a::y"), BTreeSet::from([m("b")]));
    assert!(circles(&edges).is_empty());
    edges.insert(m("b"), BTreeSet::from([m("a::x")]));
    assert_eq!(circles(&edges), vec![vec![m("a::x"), m("a::y"), m("b"), m("a::x")]]);
}

/// The methods declared in `impl <ty>` blocks of `text` (not trait
/// impls, not generic ones): the names, in order.
fn inherent_methods(text: &str, ty: &str) -> Vec<String> {
    methods_under(text, &[format!("impl {ty} {{"), format!("impl super::{ty} {{")])
}

/// The methods declared in the blocks opened by one of `heads` (whole
/// lines) in `text`, their names in order.
fn methods_under(text: &str, heads: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for (_, line) in code_lines(text) {
        if heads.contains(&line) {
            inside = true;
        } else if inside && line == "}" {
            inside = false;
        } else if inside && line.starts_with("    ") && !line.starts_with("     ") {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let Some(at) = words.iter().position(|w| *w == "fn") {
                let head = &words[..at];
                if head
                    .iter()
                    .all(|w| w.starts_with("pub") || *w == "async" || *w == "const")
                {
                    if let Some(name) = words.get(at + 1) {
                        out.push(name.split(['(', '<']).next().unwrap_or(name).to_string());
                    }
                }
            }
        }
    }
    out
}

/// Issue 41's bound: the `Limiter` decides (`try_check`, `resume`,
/// `settle`, the leases and what a decision needs); the Envoy fronts, the
/// sweeper and the operator's reads go through views of their own
/// (`Limiter::keyed`, `sweeper`, `report`), and the tasks (heartbeat,
/// overrides follower, slot renewer) are types the composition root starts.
#[test]
fn the_limiter_decides_and_nothing_else() {
    let (src, files) = source_files();
    let mut methods = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let rel = file.strip_prefix(&src).expect("under src/").display().to_string();
        methods.extend(
            inherent_methods(&text, "Limiter")
                .into_iter()
                .map(|m| format!("{rel}: {m}")),
        );
    }
    assert!(
        methods.len() >= 5,
        "the reader found the limiter's methods: {methods:?}"
    );
    assert!(
        methods.len() <= 30,
        "impl Limiter holds {} methods (at most 30); give a concern a type of its own:\n{}",
        methods.len(),
        methods.join("\n")
    );
}

/// The store contract a type checks: `QuotaStore` is grant, release,
/// ping, name (and one more if it earns it); the fleet's capabilities are
/// `FleetTables`, which a front that needs them takes by type.
#[test]
fn the_quota_store_is_small() {
    let text = include_str!("store/mod.rs");
    let methods = methods_under(text, &["pub trait QuotaStore: Send + Sync + 'static {".to_string()]);
    assert!(
        (1..=5).contains(&methods.len()),
        "QuotaStore declares {methods:?}: at most 5, the fleet's capabilities in FleetTables"
    );
}

#[test]
fn the_method_reader_sees_what_it_must() {
    let text = "impl Limiter {\n    pub fn a(&self) {}\n    pub(super) async fn b<'l>(&self) {\n        fn inner() {}\n    }\n    const X: u8 = 1;\n}\nimpl Debug for Limiter {\n    fn fmt(&self) {}\n}\nimpl super::Limiter {\n    fn c(&self) {}\n}\n#[cfg(test)]\nimpl Limiter {\n    fn test_only(&self) {}\n}\n";
    assert_eq!(inherent_methods(text, "Limiter"), ["a", "b", "c"]);
}

/// Where the request path and the decision core address a limit by its
/// position in a table (`snapshot.limits.get(i)`, `config.limits[i]`):
/// each such line, `file:line: code`. A limit is a handle there
/// ([`crate::limit::LimitRef`]); positions become handles once, in
/// `runtime.rs`.
fn limits_by_position(code: &[(usize, String)]) -> Vec<(usize, String)> {
    // The tables wherever they are reached from; `all` (a slice of every
    // limit) as a name of its own.
    let indexed = |line: &str, table: &str, whole: bool| {
        [".get(", "["].iter().any(|index| {
            line.match_indices(&format!("{table}{index}"))
                .any(|(at, _)| !whole || !line[..at].ends_with(|c: char| is_word(c) || c == '.'))
        })
    };
    code.iter()
        .filter(|(_, line)| {
            indexed(line, "snapshot.limits", false)
                || indexed(line, "config.limits", false)
                || indexed(line, "all", true)
        })
        .cloned()
        .collect()
}

#[test]
fn limits_are_handles_in_the_request_path_and_the_core() {
    let (src, files) = source_files();
    let mut found = Vec::new();
    let checked = |f: &&PathBuf| {
        (f.starts_with(src.join("gateway")) || f.starts_with(src.join("limit")))
            // The tests' fixtures pick limits by position, as tests do.
            && f.file_name().is_some_and(|n| n != "testing.rs")
    };
    for file in files.iter().filter(checked) {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let rel = file.strip_prefix(&src).expect("under src/").display().to_string();
        for (n, line) in limits_by_position(&code_lines(&text)) {
            found.push(format!("{rel}:{n}: {}", line.trim()));
        }
    }
    assert!(found.is_empty(), "limits addressed by position:\n{}", found.join("\n"));
}

#[test]
fn the_position_reader_sees_what_it_must() {
    let lines = |text: &str| -> Vec<usize> {
        let code: Vec<(usize, String)> = text.lines().map(String::from).enumerate().collect();
        limits_by_position(&code).into_iter().map(|(n, _)| n).collect()
    };
    let text = "let a = snapshot.limits.get(i)?;\n\
                let b = r.snapshot.config.limits[i].name;\n\
                let c = verdict.limits.get(at);\n\
                let d = all.get(w);\n\
                let e = overall.get(w);\n\
                let f = self.snapshot.limits.iter();\n";
    assert_eq!(lines(text), [0, 1, 3]);
}
