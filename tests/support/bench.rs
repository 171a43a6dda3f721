//! What the benchmarks written as test targets (`test = false`: tests/bench_datapath.rs,
//! tests/bench_failover.rs, run by scripts/bench) share: percentiles, the machine's load, and
//! their sections of bench/results.md and keys of results.json.
use serde_json::{Value, json};

use super::repo_root;

/// The heading of the data-path section, always the last of results.md (examples/bench keeps
/// the order).
pub const LAST: &str = "## Data path";

/// Percentile `q` (0..=1, nearest rank) of `v`; NaN when `v` is empty.
pub fn pct(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// The number in environment variable `var`, or `default` when it is not set (or not a number).
pub fn env_number(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The machine's 1-minute load average.
pub fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Where `md`'s section `heading` begins, if it has one.
fn section_at(md: &str, heading: &str) -> Option<usize> {
    match md.find(&format!("\n{heading}\n")) {
        Some(i) => Some(i + 1),
        None => md.starts_with(heading).then_some(0),
    }
}

/// results.md (`old`) with `section` (whose first line is its `## ` heading) in place of the
/// section of that heading, which ends where the next `## ` heading begins; a new section goes
/// before the data-path section, which stays the last, or at the end.
pub fn with_section(old: &str, section: &str) -> String {
    let heading = section.lines().next().unwrap_or_default();
    let (before, after) = match section_at(old, heading) {
        Some(i) => {
            let rest = &old[i + heading.len()..];
            let end = rest
                .find("\n## ")
                .map_or(old.len(), |e| i + heading.len() + e + 1);
            (&old[..i], &old[end..])
        }
        None => match section_at(old, LAST) {
            Some(i) => (&old[..i], &old[i..]),
            None => (old, ""),
        },
    };
    let mut md = format!("{}\n\n{}\n", before.trim_end(), section.trim_end());
    if !after.trim().is_empty() {
        md += &format!("\n{}\n", after.trim_end());
    }
    md.trim_start().to_string()
}

/// Writes `section` into results.md ([`with_section`]) and `value` as `key` of results.json, in
/// XCC_BENCH_OUT as scripts/bench takes it (relative to the repository, default bench/); the
/// rest of both files stays.
pub fn write_results(section: &str, key: &str, value: Value) {
    let out = repo_root().join(std::env::var("XCC_BENCH_OUT").unwrap_or_else(|_| "bench".into()));
    std::fs::create_dir_all(&out).expect("bench dir");
    let md_path = out.join("results.md");
    let old = std::fs::read_to_string(&md_path).unwrap_or_default();
    std::fs::write(&md_path, with_section(&old, section)).expect("write results.md");
    let json_path = out.join("results.json");
    let mut j: Value = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    j[key] = value;
    std::fs::write(&json_path, serde_json::to_string_pretty(&j).expect("json"))
        .expect("write results.json");
}
