//! Metadata helpers shared by the Service, EndpointSlice and Endpoints translations:
//! our labels and annotations, API-server validation rules, ownership and map comparisons.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::containment::{LabelRefusal, Refused};
use super::limits::LabelsHeld;
use super::options::{FIELD_MANAGER, FOLLOWER_VALUE, Options, Recorded, Skip};

/// The API server's limit on the total size of an object's annotation keys and values.
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

pub(crate) type StringMap = BTreeMap<String, String>;

/// The remote labels a follower Service may carry, with `<key>=follower` on top, and how many
/// were refused (reserved prefixes, the operator's deny or allow list: see [`Containment`]).
/// When the labels left are over `--remote-max-label-bytes`, none is carried (all counted as
/// [`LabelRefusal::OverLimit`]) and the third part says so: the follower's labels are then
/// kept as they were (see [`super::limits`]).
///
/// [`Containment`]: super::containment::Containment
pub(crate) fn follower_labels(
    remote: Option<&StringMap>,
    opts: &Options,
) -> (StringMap, Refused, Option<LabelsHeld>) {
    let mut refused = Refused::new();
    let mut labels: StringMap = remote
        .into_iter()
        .flatten()
        // the label key itself is replaced by `=follower` (not counted: every export has it)
        .filter(|(key, _)| *key != &opts.label_key)
        .filter(
            |(key, _)| match opts.containment.refuses(key, &opts.label_key) {
                Some(why) => {
                    *refused.entry(why).or_default() += 1;
                    false
                }
                None => true,
            },
        )
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let held = opts.containment.limits.labels(&labels);
    if held.is_some() {
        let n = u32::try_from(labels.len()).unwrap_or(u32::MAX);
        *refused.entry(LabelRefusal::OverLimit).or_default() += n;
        labels.clear();
    }
    labels.insert(opts.label_key.clone(), FOLLOWER_VALUE.to_string());
    (labels, refused, held)
}

/// The annotation recording which label keys we copied from the leader: comma-separated, sorted.
/// A key listed there and no longer on the exported Service is removed from the follower; labels others
/// added locally are not listed, so they are kept.
pub(crate) fn record_copied_labels(
    annotations: &mut StringMap,
    labels: &StringMap,
    opts: &Options,
) {
    let keys: Vec<&str> = labels
        .keys()
        .map(String::as_str)
        .filter(|k| *k != opts.label_key)
        .collect();
    annotations.insert(opts.copied_labels_annotation(), keys.join(","));
}

/// The copied-labels annotation among a desired object's annotations (all of which are ours).
fn copied_labels_key(desired: &ObjectMeta) -> Option<&str> {
    desired
        .annotations
        .as_ref()?
        .keys()
        .map(String::as_str)
        .find(|k| k.ends_with(super::options::COPIED_LABELS_SUFFIX))
}

/// Labels the live object got from its exported Service at our last write that the exported Service has dropped.
fn dropped_labels<'a>(actual: &'a ObjectMeta, desired: &ObjectMeta) -> Vec<&'a str> {
    let Some(record) =
        copied_labels_key(desired).and_then(|key| actual.annotations.as_ref()?.get(key))
    else {
        return Vec::new();
    };
    let desired_labels = desired.labels.as_ref();
    let actual_labels = actual.labels.as_ref();
    record
        .split(',')
        .filter(|k| !k.is_empty())
        .filter(|k| !desired_labels.is_some_and(|d| d.contains_key(*k)))
        .filter(|k| actual_labels.is_some_and(|a| a.contains_key(*k)))
        .collect()
}

/// Whether the live object's labels and annotations are as desired: every desired entry
/// present, and no label left over that the exported Service dropped.
pub(crate) fn metadata_matches(actual: &ObjectMeta, desired: &ObjectMeta) -> bool {
    map_contains(actual.labels.as_ref(), desired.labels.as_ref())
        && map_contains(actual.annotations.as_ref(), desired.annotations.as_ref())
        && dropped_labels(actual, desired).is_empty()
}

/// Sets the desired labels and annotations on `actual`, removes the labels the exported Service dropped,
/// and keeps everything else (what others added locally).
pub(crate) fn merge_metadata(actual: &mut ObjectMeta, desired: &ObjectMeta) {
    let dropped: Vec<String> = dropped_labels(actual, desired)
        .into_iter()
        .map(str::to_string)
        .collect();
    if let Some(labels) = actual.labels.as_mut() {
        for k in &dropped {
            labels.remove(k);
        }
    }
    merge_map(&mut actual.labels, desired.labels.as_ref());
    merge_map(&mut actual.annotations, desired.annotations.as_ref());
}

/// Origin-cluster and origin-object annotations (the ones every follower object carries).
pub(crate) fn origin_annotations(namespace: &str, name: &str, opts: &Options) -> StringMap {
    let mut annotations = StringMap::new();
    annotations.insert(opts.origin_cluster_annotation(), opts.cluster_name.clone());
    if let Some(id) = &opts.cluster_id {
        annotations.insert(opts.origin_cluster_id_annotation(), id.clone());
    }
    annotations.insert(
        opts.origin_object_annotation(),
        format!("{namespace}/{name}"),
    );
    annotations
}

/// The annotation `kubectl apply` (client side) leaves on what it applied.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Whether an object carries `<key>=follower`.
pub(crate) fn is_follower(meta: &ObjectMeta, opts: &Options) -> bool {
    meta.labels
        .as_ref()
        .and_then(|labels| labels.get(&opts.label_key))
        .is_some_and(|value| value == FOLLOWER_VALUE)
}

/// Why a local user has taken an object over, judged by its metadata, if they have: `kubectl
/// apply` left its record on it, or another field manager than ours owns its selector or
/// declared (server-side apply) fields of its spec. Our writer only ever updates (operation
/// `Update`), so an `Apply` entry is never ours. The caches hold no managedFields (memory), so a
/// pass sees the first sign only; the sweeper's listings and a read after a 409 see all.
pub(crate) fn taken_over(meta: &ObjectMeta) -> Option<&'static str> {
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LAST_APPLIED_ANNOTATION))
    {
        return Some("kubectl apply");
    }
    for entry in meta.managed_fields.iter().flatten() {
        if entry.manager.as_deref() == Some(FIELD_MANAGER) {
            continue;
        }
        let Some(spec) = entry.fields_v1.as_ref().and_then(|f| f.0.get("f:spec")) else {
            continue;
        };
        if spec.get("f:selector").is_some() {
            return Some("another field manager owns its selector");
        }
        if entry.operation.as_deref() == Some("Apply") {
            return Some("another field manager applied its spec");
        }
    }
    None
}

/// What a local object records about where it came from, judged by its follower label and
/// origin annotations: the remotes listed in `origin-clusters` (a merged follower), else the one
/// in `origin-cluster`, else none (a follower the Go controller left). One a local user has
/// taken over ([`taken_over`]) is not ours any more.
pub(crate) fn recorded(meta: &ObjectMeta, opts: &Options) -> Recorded {
    if !is_follower(meta, opts) || taken_over(meta).is_some() {
        return Recorded::NotOurs;
    }
    let annotations = meta.annotations.as_ref();
    let get = |key: String| annotations.and_then(|a| a.get(&key));
    if let Some(list) = get(opts.origin_clusters_annotation()) {
        let set: std::collections::BTreeSet<String> = list
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        if !set.is_empty() {
            return Recorded::From(set);
        }
    }
    match get(opts.origin_cluster_annotation()) {
        Some(cluster) => Recorded::From([cluster.clone()].into()),
        None => Recorded::GoEra,
    }
}

/// Checks one deny or allow list entry: a label key, or a DNS subdomain followed by `/`.
pub(crate) fn check_label_entry(entry: &str) -> Result<(), String> {
    match entry.strip_suffix('/') {
        Some(domain) if is_dns1123_subdomain(domain) => Ok(()),
        Some(_) => Err(format!("{entry:?} is not a DNS subdomain followed by '/'")),
        None => validate_qualified_name(entry)
            .map_err(|why| format!("{entry:?} is not a label key: {why}")),
    }
}

/// Whether `s` is a valid label value (what the API server accepts).
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || (s.len() <= LABEL_VALUE_MAX && is_qualified_name_part(s))
}

/// Checks the labels and annotations of a desired object the way the API server would.
pub(crate) fn validate(meta: &ObjectMeta) -> Result<(), Skip> {
    for (key, value) in meta.labels.iter().flatten() {
        validate_label(key, value).map_err(|message| Skip::LabelsInvalid {
            key: key.clone(),
            message,
        })?;
    }
    let mut size = 0usize;
    for (key, value) in meta.annotations.iter().flatten() {
        validate_qualified_name(key).map_err(|message| Skip::AnnotationsInvalid {
            key: key.clone(),
            message,
        })?;
        size = size.saturating_add(key.len()).saturating_add(value.len());
    }
    if size > TOTAL_ANNOTATION_SIZE_LIMIT {
        return Err(Skip::AnnotationsTooLarge {
            size,
            limit: TOTAL_ANNOTATION_SIZE_LIMIT,
        });
    }
    Ok(())
}

pub(crate) fn validate_label(key: &str, value: &str) -> Result<(), String> {
    validate_qualified_name(key)?;
    if value.len() > LABEL_VALUE_MAX {
        return Err(format!(
            "value is {} characters long, at most {LABEL_VALUE_MAX} are allowed",
            value.len()
        ));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        return Err(format!(
            "value {value:?} must consist of alphanumerics, '-', '_' or '.', and start and end \
             with an alphanumeric"
        ));
    }
    Ok(())
}

/// `[prefix/]name` with a DNS-1123 subdomain prefix and a name of at most 63 characters.
pub(crate) fn validate_qualified_name(key: &str) -> Result<(), String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() {
                return Err("prefix part must be non-empty".to_string());
            }
            if !is_dns1123_subdomain(prefix) {
                return Err(format!(
                    "prefix {prefix:?} must be a lowercase DNS-1123 subdomain"
                ));
            }
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err("name part must be non-empty".to_string());
    }
    if name.len() > QUALIFIED_NAME_MAX {
        return Err(format!(
            "name part is {} characters long, at most {QUALIFIED_NAME_MAX} are allowed",
            name.len()
        ));
    }
    if !is_qualified_name_part(name) {
        return Err(format!(
            "name part {name:?} must consist of alphanumerics, '-', '_' or '.', and start and \
             end with an alphanumeric"
        ));
    }
    Ok(())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Lowercase RFC 1123 subdomain of at most 253 characters.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS1123_SUBDOMAIN_MAX
        && s.split('.').all(|label| {
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    is_lower_alnum(*first)
                        && is_lower_alnum(*last)
                        && bytes.iter().all(|b| is_lower_alnum(*b) || *b == b'-')
                }
                _ => false,
            }
        })
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Whether every entry of `desired` is present with the same value in `actual`.
pub(crate) fn map_contains(actual: Option<&StringMap>, desired: Option<&StringMap>) -> bool {
    desired.into_iter().flatten().all(|(key, value)| {
        actual
            .and_then(|actual| actual.get(key))
            .is_some_and(|v| v == value)
    })
}

/// Sets every entry of `desired` on `actual`, keeping the other entries of `actual`.
pub(crate) fn merge_map(actual: &mut Option<StringMap>, desired: Option<&StringMap>) {
    let Some(desired) = desired.filter(|d| !d.is_empty()) else {
        return;
    };
    let target = actual.get_or_insert_with(StringMap::new);
    for (key, value) in desired {
        target.insert(key.clone(), value.clone());
    }
}

/// Makes `key` on `actual` follow `desired`: set when desired has it, removed when not.
/// Used for the keys we set only conditionally.
pub(crate) fn sync_conditional_key(
    actual: &mut Option<StringMap>,
    desired: Option<&StringMap>,
    key: &str,
) {
    match desired.and_then(|d| d.get(key)) {
        Some(value) => {
            actual
                .get_or_insert_with(StringMap::new)
                .insert(key.to_string(), value.clone());
        }
        None => {
            if let Some(map) = actual.as_mut() {
                map.remove(key);
            }
        }
    }
}

/// Whether a conditionally set `key` is in the state `desired` asks for.
pub(crate) fn conditional_key_matches(
    actual: Option<&StringMap>,
    desired: Option<&StringMap>,
    key: &str,
) -> bool {
    actual.and_then(|a| a.get(key)) == desired.and_then(|d| d.get(key))
}

fn same_owner(a: &OwnerReference, b: &OwnerReference) -> bool {
    a.api_version == b.api_version
        && a.kind == b.kind
        && a.name == b.name
        && a.uid == b.uid
        && a.controller.unwrap_or(false) == b.controller.unwrap_or(false)
}

/// Whether every desired ownerReference is on `actual` and no other controller reference is.
pub(crate) fn owners_match(
    actual: Option<&[OwnerReference]>,
    desired: Option<&[OwnerReference]>,
) -> bool {
    let actual = actual.unwrap_or_default();
    let desired = desired.unwrap_or_default();
    if desired.is_empty() {
        return true;
    }
    let all_present = desired
        .iter()
        .all(|d| actual.iter().any(|a| same_owner(a, d)));
    let wants_controller = desired.iter().any(|d| d.controller == Some(true));
    let foreign_controller = wants_controller
        && actual
            .iter()
            .any(|a| a.controller == Some(true) && !desired.iter().any(|d| same_owner(a, d)));
    all_present && !foreign_controller
}

/// `actual`'s ownerReferences with the desired ones set: references to the same owner (by
/// kind and name, e.g. with a stale uid) and, when we set a controller, other controller
/// references are replaced.
pub(crate) fn merge_owners(
    actual: &mut Option<Vec<OwnerReference>>,
    desired: Option<&[OwnerReference]>,
) {
    let desired = desired.unwrap_or_default();
    if desired.is_empty() {
        return;
    }
    let wants_controller = desired.iter().any(|d| d.controller == Some(true));
    let mut merged: Vec<OwnerReference> = actual
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| {
            let replaced = desired
                .iter()
                .any(|d| a.api_version == d.api_version && a.kind == d.kind && a.name == d.name);
            let competing_controller = wants_controller && a.controller == Some(true);
            !replaced && !competing_controller
        })
        .collect();
    merged.extend(desired.iter().cloned());
    *actual = Some(merged);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_validation() {
        assert!(validate_label("app", "web").is_ok());
        assert!(validate_label("fair.com/cross-cluster", "follower").is_ok());
        assert!(validate_label("a/b", "").is_ok());
        assert!(validate_label(&"k".repeat(63), &"v".repeat(63)).is_ok());
        assert!(validate_label(&"k".repeat(64), "v").is_err());
        assert!(validate_label("app", &"v".repeat(64)).is_err());
        assert!(validate_label("app", "-web").is_err());
        assert!(validate_label("Upper.Case/app", "v").is_err());
        assert!(validate_label("/app", "v").is_err());
        assert!(validate_label("a/b/c", "v").is_err());
        assert!(validate_label("", "v").is_err());
    }

    #[test]
    fn list_entries_are_checked() {
        assert!(check_label_entry("team").is_ok());
        assert!(check_label_entry("example.com/").is_ok());
        assert!(check_label_entry("example.com/team").is_ok());
        assert!(check_label_entry("Example.com/").is_err());
        assert!(check_label_entry("bad key").is_err());
    }

    #[test]
    fn subdomain_validation() {
        assert!(is_dns1123_subdomain("web-1a2b3c4d-0"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a-"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
    }

    #[test]
    fn owners() {
        let ours = OwnerReference {
            api_version: "v1".into(),
            kind: "Service".into(),
            name: "web".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let stale = OwnerReference {
            uid: "u0".into(),
            ..ours.clone()
        };
        let other = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "x".into(),
            uid: "u9".into(),
            controller: None,
            block_owner_deletion: None,
        };
        let desired = vec![ours.clone()];
        assert!(owners_match(None, None));
        assert!(!owners_match(None, Some(&desired)));
        assert!(owners_match(
            Some(&[other.clone(), ours.clone()]),
            Some(&desired)
        ));
        assert!(!owners_match(
            Some(&[stale.clone(), ours.clone()]),
            Some(&desired)
        ));

        let mut actual = Some(vec![stale, other.clone()]);
        merge_owners(&mut actual, Some(&desired));
        assert_eq!(actual, Some(vec![other, ours]));
    }
}
