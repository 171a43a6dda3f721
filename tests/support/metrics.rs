//! Reads of a metrics page (the daemon's OpenMetrics text, or an API server's Prometheus text)
//! by exact series: a sample name and its whole label set. A series that is not on the page is
//! an error, never 0, so a renamed metric or label fails the read instead of passing an `== 0`
//! assertion; and nothing is summed by a partial match.

/// One sample of the page.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Sorted by label name.
    pub labels: Labels,
    pub value: f64,
}

/// `name{k="v",...}` as written on a page (labels in the order given).
pub fn series_text(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// Label pairs (name, value).
type Labels = Vec<(String, String)>;

/// A label set `{k="v",...}` after the name: the pairs, and the rest of the line.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((out, rest));
        }
        let (key, rest) = s
            .split_once("=\"")
            .ok_or_else(|| format!("no `=\"` after a label name in {s:?}"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("a label value ends in `\\`: {rest:?}")),
                },
                Some((_, c)) => value.push(c),
                None => return Err(format!("an unterminated label value: {rest:?}")),
            }
        };
        out.push((key.trim().to_string(), value));
        s = &rest[end + 1..];
    }
}

/// Every sample of the page; a line that is not a comment and cannot be read is an error.
pub fn samples(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find(['{', ' ']) {
            Some(i) if line[i..].starts_with('{') => {
                let (labels, rest) = parse_labels(&line[i + 1..])
                    .map_err(|e| format!("metrics line {line:?}: {e}"))?;
                (&line[..i], labels, rest)
            }
            Some(i) => (&line[..i], Vec::new(), &line[i..]),
            None => return Err(format!("metrics line {line:?} has no value")),
        };
        let value = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("metrics line {line:?} has no number after the series"))?;
        let mut labels = labels;
        labels.sort();
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(out)
}

/// The value of the one series `name` with exactly `labels` (every label it carries, in any
/// order). Absent, or a page that cannot be read: an error that shows the series of that name
/// the page does have (a renamed label shows there).
pub fn series_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    want.sort();
    let all = samples(text)?;
    let mut matching = all.iter().filter(|s| s.name == name && s.labels == want);
    match (matching.next(), matching.next()) {
        (Some(s), None) => Ok(s.value),
        (Some(_), Some(_)) => Err(format!(
            "{} appears twice on the page",
            series_text(name, labels)
        )),
        (None, _) => {
            let same_name: Vec<String> = all
                .iter()
                .filter(|s| s.name == name)
                .map(|s| {
                    let l: Vec<(&str, &str)> = s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    series_text(&s.name, &l)
                })
                .collect();
            Err(format!(
                "no series {} on the page; series named {name}: [{}]",
                series_text(name, labels),
                same_name.join(", ")
            ))
        }
    }
}

/// Every series on the page that names `remote` (its `remote` label, or the `cluster` label of
/// the watch requests), as `name{labels} value` lines: what must be gone once it left.
pub fn series_of_remote(text: &str, remote: &str) -> Result<Vec<String>, String> {
    Ok(samples(text)?
        .iter()
        .filter(|s| {
            s.labels
                .iter()
                .any(|(k, v)| (k == "remote" || k == "cluster") && v == remote)
        })
        .map(|s| {
            let l: Vec<(&str, &str)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            format!("{} {}", series_text(&s.name, &l), s.value)
        })
        .collect())
}

/// The sum of every series of `name`, whatever its labels: only for "nothing at all happened"
/// (every series counts, so a renamed label cannot hide one). The family must be published
/// (`# TYPE`): an absent family is an error, not 0. prometheus-client names a counter's family
/// without `_total` and its samples with it; an API server names both `x_total`.
pub fn family_total(text: &str, name: &str) -> Result<f64, String> {
    let family = name.strip_suffix("_total").unwrap_or(name);
    let published = text.lines().any(|l| {
        l.strip_prefix("# TYPE ")
            .and_then(|rest| rest.split(' ').next())
            .is_some_and(|f| f == family || f == name)
    });
    if !published {
        return Err(format!(
            "the page publishes no metric family {family} (renamed, or a page that is not the \
             daemon's):\n{text}"
        ));
    }
    Ok(samples(text)?
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum())
}

/// The sum of every series of `name` whose labels include each of `having`; 0 when there is
/// none, the family included (prometheus-client publishes a labelled family only once it has a
/// series: for a counter of failures, none is the point). The page must be the daemon's (it
/// publishes `xcc_build_info`): any other page panics, never reads as 0.
pub fn series_sum(text: &str, name: &str, having: &[(&str, &str)]) -> f64 {
    family_total(text, "xcc_build_info").unwrap_or_else(|e| panic!("{e}"));
    samples(text)
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            having
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|s| s.value)
        .sum()
}

/// The sum of the series `name` with each of the label sets, every one of which must be on the
/// page (a sum over an explicit list, never over whatever matches).
pub fn sum_of(text: &str, name: &str, label_sets: &[Vec<(&str, &str)>]) -> Result<f64, String> {
    assert!(!label_sets.is_empty(), "a sum of no series");
    label_sets.iter().map(|l| series_value(text, name, l)).sum()
}

/// Kinds of the follower objects the writer counts in `xcc_writes_total`.
pub const FOLLOWER_KINDS: [&str; 3] = ["Service", "EndpointSlice", "Endpoints"];
/// Kinds the writer creates, updates and deletes (Namespaces and Events are only created).
pub const WRITE_KINDS: [&str; 4] = ["Service", "EndpointSlice", "Endpoints", "Lease"];
/// The writer's verbs.
pub const VERBS: [&str; 3] = ["create", "update", "delete"];

/// The label sets `{kind, verb}` of `kinds` x `verbs`.
pub fn writes_of<'a>(kinds: &[&'a str], verbs: &[&'a str]) -> Vec<Vec<(&'a str, &'a str)>> {
    kinds
        .iter()
        .flat_map(|k| verbs.iter().map(move |v| vec![("kind", *k), ("verb", *v)]))
        .collect()
}
