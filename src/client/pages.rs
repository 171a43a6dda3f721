//! Paginated listing and scoped Apis: how every listing of ours asks the API server.
use std::time::Duration;

use kube::api::{ListMeta, ListParams, ObjectMeta};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Objects per listing page.
pub const PAGE: u32 = 500;

/// The parameters of one page of a listing by `selector`, continuing at `token`.
pub fn page(selector: &str, token: Option<String>) -> ListParams {
    let mut lp = ListParams::default().labels(selector).limit(PAGE);
    lp.continue_token = token;
    lp
}

/// Where the next page starts (None: that was the last one).
pub fn next_token(meta: &ListMeta) -> Option<String> {
    meta.continue_.clone().filter(|t| !t.is_empty())
}

/// The scopes to list one namespace at a time: each mirrored namespace, or (None) the whole
/// cluster when all are mirrored.
pub fn scopes(namespaces: &[String]) -> Vec<Option<&str>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    }
}

/// An Api of one scope from [`scopes`].
pub fn api_in<K>(client: &Client, scope: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One mirrored namespace: a namespaced Api. Several or all: a cluster-wide one (a cache takes
/// one complete listing at a time), and the caller ignores what is outside the list.
pub fn scoped_api<K>(client: &Client, namespaces: &[String]) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespaces {
        [only] => api_in(client, Some(only)),
        _ => api_in(client, None),
    }
}

/// Lists the metadata of every object matching the selector, page by page, and keeps what
/// `keep` takes of each; an error or a page slower than `timeout` fails the whole listing.
/// Metadata is all a sweep reads (names, ownership labels and annotations, uids): a
/// metadata-only listing leaves the endpoints of thousands of slices on the server instead of
/// in our memory, and `keep` leaves only one page of whole metadata alive at a time.
pub async fn list_all<K, T>(
    api: &Api<K>,
    selector: &str,
    timeout: Duration,
    mut keep: impl FnMut(ObjectMeta) -> Option<T>,
) -> Result<Vec<T>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let lp = page(selector, token.take());
        let listed = tokio::time::timeout(timeout, api.list_metadata(&lp))
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "listing {} took longer than {timeout:?}",
                    K::kind(&())
                ))
            })??;
        token = next_token(&listed.metadata);
        out.extend(listed.items.into_iter().filter_map(|o| keep(o.metadata)));
        if token.is_none() {
            return Ok(out);
        }
    }
}
