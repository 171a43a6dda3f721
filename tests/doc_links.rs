//! Every relative link of the README, the CHANGELOG, docs/ and the chart's README resolves: the
//! file exists, and an anchor (`page.md#section`, `#section`) names a heading of that page, as
//! GitHub makes anchors from headings. Links to other sites are not followed (no network here).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pages whose links are checked.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("CHANGELOG.md"),
        root().join("charts/cross-cluster-controller/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's anchor for a heading: lower case; letters, digits, `-` and `_` kept, spaces become
/// `-`, everything else dropped; a repeated anchor gets `-1`, `-2`, ...
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let mut anchor = base.clone();
                let mut n = 0;
                while out.contains(&anchor) {
                    n += 1;
                    anchor = format!("{base}-{n}");
                }
                out.insert(anchor);
            }
            _ => {}
        }
    }
    out
}

/// The link and image targets of a page (outside code, as a Markdown renderer sees them).
fn targets(text: &str) -> Vec<String> {
    Parser::new(text)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// What is wrong with one relative link of `page` (whose text is `text`), or None.
fn broken(page: &Path, text: &str, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let (linked, linked_text) = if file.is_empty() {
        (page.to_path_buf(), text.to_string())
    } else {
        let path = page.parent().expect("a page's folder").join(file);
        if !path.exists() {
            return Some(format!("{target}: no file {}", path.display()));
        }
        let text = if path.extension().is_some_and(|e| e == "md") {
            std::fs::read_to_string(&path).unwrap_or_default()
        } else {
            String::new()
        };
        (path, text)
    };
    let anchor = anchor?;
    if linked.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "{target}: an anchor into a file that is not Markdown"
        ));
    }
    let have = anchors(&linked_text);
    (!have.contains(anchor)).then(|| {
        format!(
            "{target}: {} has no heading with the anchor #{anchor} (its anchors: {have:?})",
            linked.display()
        )
    })
}

/// Every broken relative link of the pages, and how many relative links were checked.
fn check(pages: &[PathBuf]) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages {
        let text = std::fs::read_to_string(page)
            .unwrap_or_else(|e| panic!("read {}: {e}", page.display()));
        for target in targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            if let Some(p) = broken(page, &text, &target) {
                problems.push(format!("{}: {p}", page.display()));
            }
        }
    }
    (problems, checked)
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let pages = pages();
    assert!(
        pages.len() >= 8,
        "expected the README, CHANGELOG, chart README and docs/: {pages:?}"
    );
    let (problems, checked) = check(&pages);
    // a parser that found no link would pass vacuously: the README alone links a dozen pages
    assert!(checked >= 40, "only {checked} relative links found");
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_catches_a_missing_file_a_missing_anchor_and_a_link_in_code_is_not_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let other = dir.path().join("other.md");
    std::fs::write(
        &other,
        "# Other\n\n## Health at 3 a.m.: `kubectl` and `status`\n\n## Dup\n\n## Dup\n",
    )
    .expect("write");
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "# Page\n\n## Local one\n\n\
         [ok](other.md#health-at-3-am-kubectl-and-status) [ok](other.md#dup-1) [ok](#local-one) \
         [ok](other.md) [web](https://example.invalid/x#y)\n\n\
         [gone](missing.md) [no anchor](other.md#dup-2) [no local](#nowhere)\n\n\
         `[in code](missing-too.md)`\n\n```\n[in a block](missing-three.md)\n```\n",
    )
    .expect("write");
    let (problems, checked) = check(&[page]);
    assert_eq!(checked, 7, "{problems:?}");
    assert_eq!(problems.len(), 3, "{problems:#?}");
    for want in ["missing.md", "#dup-2", "#nowhere"] {
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{want} not reported: {problems:#?}"
        );
    }
}

#[test]
fn headings_of_every_level_are_anchors() {
    let text = "# A\n## B c\n### D: e.f\n#### `G`\n";
    let want: BTreeSet<String> = ["a", "b-c", "d-ef", "g"].map(String::from).into();
    assert_eq!(anchors(text), want);
}

/// docs/mcs.md's MCS spec table, as the committed conformance reports give it: every spec of
/// each group with its result on two and on three clusters.
fn mcs_spec_table(two: &serde_yaml::Value, three: &serde_yaml::Value) -> String {
    let result = |report: &serde_yaml::Value, group: &str, desc: &str| -> String {
        let tests = report["groups"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter(|g| g["name"].as_str() == Some(group))
            .flat_map(|g| g["tests"].as_sequence().cloned().unwrap_or_default());
        for t in tests {
            if t["desc"].as_str() == Some(desc) {
                return match (t["passed"].as_bool(), t["skipped"].as_bool()) {
                    (Some(true), _) => "passed".into(),
                    (_, Some(true)) => "skipped".into(),
                    _ => "FAILED".into(),
                };
            }
        }
        "not run".into()
    };
    let mut rows = vec![
        "| group | spec | two clusters | three clusters |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    for g in two["groups"].as_sequence().into_iter().flatten() {
        let group = g["name"].as_str().unwrap_or_default();
        for t in g["tests"].as_sequence().into_iter().flatten() {
            let desc = t["desc"].as_str().unwrap_or_default();
            let words = desc.split_whitespace().collect::<Vec<_>>().join(" ");
            rows.push(format!(
                "| {group} | {words} | {} | {} |",
                result(two, group, desc),
                result(three, group, desc)
            ));
        }
    }
    rows.join("\n")
}

#[test]
fn the_mcs_spec_table_is_the_committed_reports() {
    let read = |phase: &str| -> serde_yaml::Value {
        let path = root().join(format!("docs/mcs-conformance/{phase}/report.yaml"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_yaml::from_str(&text).expect("a report")
    };
    let (two, three) = (read("two"), read("three"));
    for (phase, r) in [("two", &two), ("three", &three)] {
        assert_eq!(
            r["total"].as_u64(),
            Some(27),
            "{phase}: the suite's 27 specs"
        );
    }
    let table = mcs_spec_table(&two, &three);
    let mcs = std::fs::read_to_string(root().join("docs/mcs.md")).expect("docs/mcs.md");
    assert!(
        mcs.contains(&table),
        "docs/mcs.md's MCS spec table differs from docs/mcs-conformance/*/report.yaml; it should read:\n{table}"
    );
    // the README says it in one line, and links to the table
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        readme.contains("all 27 specs") && readme.contains("(docs/mcs.md#conformance)"),
        "README.md names the 27 specs and links to docs/mcs.md#conformance"
    );
}

/// The README is read in two minutes: under 12 KB, with the install and the two commands
/// (the demo and the full test command) on its first screen (its first 50 lines).
#[test]
fn the_readme_is_short_and_starts_with_install_and_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        readme.len() < 12 * 1024,
        "README.md is {} bytes",
        readme.len()
    );
    let first: String = readme.lines().take(50).collect::<Vec<_>>().join("\n");
    for want in [
        "helm install",
        "remote-access",
        "scripts/demo",
        "scripts/test",
    ] {
        assert!(
            first.contains(want),
            "{want} is not on the README's first screen"
        );
    }
}
