//! The MCS imports in `status`: every ServiceImport of ours in the watched namespaces that
//! carries the annotation `cross-cluster-controller.fair.com/endpoints`, with each exporting
//! cluster's ready and published endpoints and whether it is cut off or stale, as the daemon
//! wrote them (see `desired::mcs`'s `readiness`). An annotation someone edited into something
//! else is shown as unreadable.
use kube::api::ObjectMeta;
use kube::{Api, Client};
use serde::Serialize;

use super::StatusError;
use crate::client::pages::{api_in, scopes};
use crate::desired::mcs::{
    ClusterEndpoints, ENDPOINTS_ANNOTATION, EndpointCounts, ServiceImport, import_selector,
    read_endpoints,
};

/// One import, as its annotation tells it.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct ImportStatus {
    pub namespace: String,
    pub name: String,
    /// the annotation, parsed: per cluster its `ready` and `total` endpoints, `cutOff` and
    /// `stale` when true (null when unreadable)
    pub endpoints: Option<EndpointCounts>,
    /// why the annotation could not be read
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Pure: the imports that carry the annotation, sorted by namespace and name.
pub fn imports(metas: &[ObjectMeta]) -> Vec<ImportStatus> {
    let mut out: Vec<ImportStatus> = metas
        .iter()
        .filter_map(|m| {
            let value = m.annotations.as_ref()?.get(ENDPOINTS_ANNOTATION)?;
            let (endpoints, unreadable) = match read_endpoints(value) {
                Ok(e) => (Some(e), None),
                Err(e) => (None, Some(e.to_string())),
            };
            Some(ImportStatus {
                namespace: m.namespace.clone().unwrap_or_default(),
                name: m.name.clone().unwrap_or_default(),
                endpoints,
                unreadable,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// One cluster as a cell reads it: `east 2/2`, `north 0/2 cut off`, `south 0/2 stale`.
fn cluster(name: &str, c: &ClusterEndpoints) -> String {
    let mut s = format!("{name} {}/{}", c.ready, c.total);
    let flags: Vec<&str> = [(c.cut_off, "cut off"), (c.stale, "stale")]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect();
    if !flags.is_empty() {
        s.push(' ');
        s.push_str(&flags.join(" and "));
    }
    s
}

/// What the ENDPOINTS column says of one import.
fn endpoints_cell(i: &ImportStatus) -> String {
    match (&i.endpoints, &i.unreadable) {
        (Some(e), _) if e.is_empty() => "no cluster exports it".into(),
        (Some(e), _) => e
            .iter()
            .map(|(name, c)| cluster(name, c))
            .collect::<Vec<_>>()
            .join(", "),
        (None, why) => format!(
            "unreadable ({ENDPOINTS_ANNOTATION}: {})",
            why.as_deref().unwrap_or("?")
        ),
    }
}

/// The section of the table (empty when there is no import).
pub fn section(imports: &[ImportStatus]) -> String {
    if imports.is_empty() {
        return String::new();
    }
    let rows: Vec<(String, String)> = imports
        .iter()
        .map(|i| (format!("{}/{}", i.namespace, i.name), endpoints_cell(i)))
        .collect();
    let width = rows
        .iter()
        .map(|r| r.0.len())
        .max()
        .unwrap_or(0)
        .max("IMPORT".len());
    let mut out = format!(
        "\n{:<width$}  ENDPOINTS (ready/total per cluster)\n",
        "IMPORT"
    );
    for (name, cell) in rows {
        out.push_str(&format!("{name:<width$}  {cell}\n"));
    }
    out
}

/// Lists our ServiceImports (metadata only) in the watched namespaces; none where the MCS API
/// is not installed (404).
pub async fn list(c: &Client, namespaces: &[String]) -> Result<Vec<ObjectMeta>, StatusError> {
    let mut out = Vec::new();
    for ns in scopes(namespaces) {
        let api: Api<ServiceImport> = api_in(c, ns);
        match super::list_meta(api, &import_selector()).await {
            Ok(metas) => out.extend(metas),
            Err(StatusError::List { source, .. }) if source.api_code() == Some(404) => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
