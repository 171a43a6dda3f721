//! The house's rules, checked on the code itself: every module path of `src/` that another file
//! uses (`crate::`, `super::`, a `mod.rs` re-exporting its children) is an import. The rooms and
//! their order come from the table in docs/architecture.md, so the page and the code cannot drift
//! apart: a room may import only from rooms listed before it, and no files may import each other
//! in a circle. Test modules (`#[cfg(test)]` to the end of a file) and the test-only
//! `src/fixtures.rs` are left out, as they are not part of the house.
//!
//! `cargo test --test architecture -- --nocapture` prints the figures (files, layers, imports,
//! imports running up, cycles).
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under src/ as a path relative to it (`reconcile/pass.rs`).
fn files() -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(&src(), &src(), &mut out);
    out.retain(|f| {
        f != "fixtures.rs" && !f.ends_with("test_support.rs") && !f.ends_with("_tests.rs")
    });
    out
}

/// The room of a file: its top folder, or the file's stem at the top.
fn room(file: &str) -> String {
    match file.split_once('/') {
        Some((dir, _)) => format!("{dir}/"),
        None => file.to_string(),
    }
}

/// The module path of a file (`["reconcile", "pass"]`; `mod.rs` is its folder; lib/main: []).
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(String::from).collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// The file that defines the longest prefix of `path` that is a module of src/.
fn resolve(path: &[String], known: &BTreeSet<String>) -> Option<String> {
    for n in (1..=path.len()).rev() {
        let p = path[..n].join("/");
        for f in [format!("{p}.rs"), format!("{p}/mod.rs")] {
            if known.contains(&f) {
                return Some(f);
            }
        }
    }
    None
}

/// The code of a file without its trailing test module and comments.
fn code(file: &str) -> String {
    let text = fs::read_to_string(src().join(file)).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .filter(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers after a path prefix: `crate::a::b::{c, d}` gives [a, b, c] and [a, b, d].
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| ident(c) || c == ':') {
            continue;
        }
        let mut path = Vec::new();
        let mut s = rest;
        loop {
            let end = s.find(|c: char| !ident(c)).unwrap_or(s.len());
            if end == 0 {
                break;
            }
            path.push(s[..end].to_string());
            s = &s[end..];
            if let Some(next) = s.strip_prefix("::") {
                s = next;
                if let Some(group) = s.strip_prefix('{') {
                    let close = group.find('}').unwrap_or(group.len());
                    for item in group[..close].split(',') {
                        let name: String = item.trim().chars().take_while(|c| ident(*c)).collect();
                        if !name.is_empty() && name != "self" {
                            let mut p = path.clone();
                            p.push(name);
                            out.push(p);
                        }
                    }
                    break;
                }
            } else {
                break;
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    out
}

/// file -> the files it imports (never itself).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let all = files();
    let known: BTreeSet<String> = all.iter().cloned().collect();
    let mut graph = BTreeMap::new();
    for f in &all {
        let code = code(f);
        let here = module_of(f);
        let is_mod = f.ends_with("mod.rs") || !f.contains('/');
        // `super::` is the parent of a file's module; in a mod.rs, the parent of its folder
        let parent: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
        let mut targets = BTreeSet::new();
        let mut add = |path: Vec<String>| {
            if let Some(t) = resolve(&path, &known)
                && &t != f
            {
                targets.insert(t);
            }
        };
        for p in paths_after(&code, "crate::") {
            add(p);
        }
        for p in paths_after(&code, "cross_cluster_controller::") {
            add(p);
        }
        for p in paths_after(&code, "super::") {
            add(parent.iter().cloned().chain(p).collect());
        }
        if is_mod {
            // a folder's mod.rs using its children (`pub use merge::...`, `self::x`)
            for prefix in ["use ", "self::"] {
                for p in paths_after(&code, prefix) {
                    let child: Vec<String> = here.iter().cloned().chain(p).collect();
                    if child.len() > here.len() {
                        add(child);
                    }
                }
            }
        }
        graph.insert(f.clone(), targets);
    }
    graph
}

/// The rooms in the order of the table in docs/architecture.md (`| `desired/` | ... |`), a row
/// naming several rooms (`span.rs`, `error.rs`) putting them on one level.
fn documented_rooms() -> Vec<Vec<String>> {
    let page =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .unwrap();
    let section = page
        .split("\n## Rooms")
        .nth(1)
        .expect("docs/architecture.md has a Rooms section");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| room"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let first = row.split('|').nth(1).unwrap_or_default();
            first
                .split(',')
                .map(|r| {
                    r.trim()
                        .trim_matches('`')
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .map(|r| {
                    if r.ends_with('/') {
                        r
                    } else {
                        format!("{r}.rs")
                    }
                })
                .collect()
        })
        .collect()
}

/// Groups of files that import each other in a circle (strongly connected, more than one file).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // reachability is enough at this size (some 60 files)
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|f| (f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for f in graph.keys() {
        if done.contains(f) {
            continue;
        }
        let group: Vec<String> = graph
            .keys()
            .filter(|g| *g == f || (reaches[f].contains(*g) && reaches[*g].contains(f)))
            .cloned()
            .collect();
        done.extend(group.iter().cloned());
        if group.len() > 1 {
            out.push(group);
        }
    }
    out
}

/// A file's layer: 1 for a file that imports nothing of ours, else one above the highest it
/// imports (meaningful only without cycles, which the test asserts first).
fn layers(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, usize> {
    let mut layer: BTreeMap<String, usize> = graph.keys().map(|f| (f.clone(), 1)).collect();
    for _ in 0..graph.len() {
        let mut changed = false;
        for (f, ts) in graph {
            let want = ts
                .iter()
                .map(|t| layer[t] + 1)
                .max()
                .unwrap_or(1)
                .min(graph.len());
            if want > layer[f] {
                layer.insert(f.clone(), want);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    layer
}

#[test]
fn every_room_imports_only_from_rooms_listed_before_it_and_no_files_import_each_other_in_a_circle()
{
    let graph = imports();
    let order = documented_rooms();
    let rank = |file: &str| {
        let r = room(file);
        order.iter().position(|level| level.contains(&r))
    };
    let undocumented: BTreeSet<String> = graph
        .keys()
        .filter(|f| !matches!(f.as_str(), "lib.rs" | "main.rs") && rank(f).is_none())
        .map(|f| room(f))
        .collect();
    let mut up = Vec::new();
    for (f, ts) in &graph {
        for t in ts {
            if let (Some(a), Some(b)) = (rank(f), rank(t))
                && b > a
            {
                up.push(format!("{f} -> {t}"));
            }
        }
    }
    let circles = cycles(&graph);
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    let depth = layers(&graph).values().copied().max().unwrap_or(0);
    println!(
        "src/: {} files on {} layers, {} imports, {} running up (against docs/architecture.md), {} cycles",
        graph.len(),
        depth,
        edges,
        up.len(),
        circles.len()
    );
    assert!(
        undocumented.is_empty(),
        "rooms missing from the table in docs/architecture.md: {undocumented:?}"
    );
    assert!(
        up.is_empty(),
        "imports from a room to one listed after it: {up:#?}"
    );
    assert!(
        circles.is_empty(),
        "files importing each other in a circle: {circles:#?}"
    );
}

#[test]
fn the_import_reader_sees_paths_groups_and_parents() {
    let code = "use crate::reconcile::{self, Ctx, sweep};\nfn f() { crate::desired::in_scope(); x::crate::no(); }";
    let got = paths_after(code, "crate::");
    assert!(got.contains(&vec!["reconcile".to_string(), "sweep".to_string()]));
    assert!(got.contains(&vec!["reconcile".to_string(), "Ctx".to_string()]));
    assert!(got.contains(&vec!["desired".to_string(), "in_scope".to_string()]));
    assert!(
        !got.iter().any(|p| p[0] == "no"),
        "a path inside another is not ours: {got:?}"
    );

    let known: BTreeSet<String> = ["reconcile/mod.rs", "reconcile/sweep.rs", "desired/mod.rs"]
        .into_iter()
        .map(String::from)
        .collect();
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        resolve(&path(&["reconcile", "sweep", "Sweeper"]), &known).as_deref(),
        Some("reconcile/sweep.rs")
    );
    assert_eq!(
        resolve(&path(&["reconcile", "Ctx"]), &known).as_deref(),
        Some("reconcile/mod.rs")
    );
    assert_eq!(resolve(&path(&["nothing"]), &known), None);

    // a cycle and a clean chain
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    let mut chain = g.clone();
    chain.insert("c".into(), BTreeSet::new());
    assert!(cycles(&chain).is_empty());
    let l = layers(&chain);
    assert_eq!((l["c"], l["b"], l["a"], l["d"]), (1, 2, 3, 4));
}
