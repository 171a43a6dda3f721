//! Test fixtures (compiled for unit tests only): object builders and an API server verifier in
//! the style of kube-rs/controller-rs.
//!
//! A decision (a reconcile, a write, a lease round, a sweep) runs against a [`kube::Client`]
//! whose transport is a `tower_test` mock. The test plays the API server with [`ApiServer`]:
//! it states, in order, each request the decision must send ([`ApiServer::expect`]: method,
//! path, the query parameters that matter) and the canned answer (an object, a list page, or a
//! `metav1.Status` error), and it can read what was sent (the body, the Accept header).
//! [`run`] drives the decision and the scenario together: a request other than the expected
//! one, a decision that ends with expected requests unsent, or any request after the scenario
//! (while the decision still runs or in a short window after it) fails the test. No test here
//! needs a real API server; the end-to-end tests keep running on real ones.
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::watcher::Event;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::{Mutex, watch};
use tower_test::mock::{self, Handle, SendResponse};

use crate::desired::{DEFAULT_LABEL_KEY, EndpointsMode, Options};
use crate::reconcile::writer::Writer;
use crate::reconcile::{Ctx, EventLimiter};
use crate::runtime::lease::Leadership;
use crate::runtime::metrics::Metrics;
use crate::state::cache::Cache;
use crate::state::{LocalState, RemoteState};

/// How long the verifier waits for a request it expects before failing the test: a bound on a
/// decision that hangs or never sends, not a wait for a condition.
const EXPECT_WITHIN: Duration = Duration::from_secs(10);
/// How long [`ApiServer::assert_idle`] watches for a request nobody expected.
const IDLE_WINDOW: Duration = Duration::from_millis(300);

/// The remote cluster name the builders use.
pub const REMOTE: &str = "remote-a";

/// Where namespace `shop`'s Services, EndpointSlices and Events are (the builders' namespace).
pub mod shop {
    pub const SERVICES: &str = "/api/v1/namespaces/shop/services";
    pub const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";
    pub const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";
}

type MockHandle = Handle<Request<Body>, Response<Body>>;

/// A client whose every request goes to the returned [`ApiServer`].
pub fn client(name: &'static str) -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let inner = Inner {
        handle,
        served: 0,
        hanging: Vec::new(),
    };
    (
        Client::new(service, "default"),
        ApiServer {
            name,
            inner: Mutex::new(inner),
        },
    )
}

/// The test's side of the API: receives requests in order and answers them. Its methods take
/// `&self`, so a scenario and [`run`] can both hold it.
pub struct ApiServer {
    name: &'static str,
    inner: Mutex<Inner>,
}

struct Inner {
    handle: MockHandle,
    served: usize,
    /// requests left unanswered on purpose, until the server is dropped
    hanging: Vec<SendResponse<Response<Body>>>,
}

/// A request as the API server received it.
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub accept: Option<String>,
    /// the JSON body (`Value::Null` when there was none)
    pub body: Value,
}

impl fmt::Debug for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, " {:?}", self.query)?;
        }
        if !self.body.is_null() {
            write!(f, " body {}", self.body)?;
        }
        Ok(())
    }
}

impl Seen {
    async fn read(req: Request<Body>) -> Self {
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect_bytes()
            .await
            .expect("the request body can be read");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("the request body is JSON")
        };
        Seen {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parse_query(parts.uri.query().unwrap_or_default()),
            accept: parts
                .headers
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
        }
    }
}

/// The request a scenario expects next.
pub struct Expect {
    method: Method,
    path: String,
    query: Vec<(String, Option<String>)>,
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        for (k, v) in &self.query {
            match v {
                Some(v) => write!(f, " {k}={v}")?,
                None => write!(f, " (no {k})")?,
            }
        }
        Ok(())
    }
}

fn expect(method: Method, path: &str) -> Expect {
    Expect {
        method,
        path: path.to_string(),
        query: Vec::new(),
    }
}

pub fn get(path: &str) -> Expect {
    expect(Method::GET, path)
}

pub fn post(path: &str) -> Expect {
    expect(Method::POST, path)
}

pub fn put(path: &str) -> Expect {
    expect(Method::PUT, path)
}

pub fn delete(path: &str) -> Expect {
    expect(Method::DELETE, path)
}

impl Expect {
    /// The request must carry this query parameter with this (decoded) value.
    pub fn query(mut self, key: &str, value: &str) -> Self {
        self.query.push((key.to_string(), Some(value.to_string())));
        self
    }

    /// The request must not carry this query parameter.
    pub fn no_query(mut self, key: &str) -> Self {
        self.query.push((key.to_string(), None));
        self
    }

    fn check(&self, server: &str, n: usize, seen: &Seen) {
        let matches = seen.method == self.method
            && seen.path == self.path
            && self
                .query
                .iter()
                .all(|(k, v)| seen.query.get(k) == v.as_ref());
        assert!(
            matches,
            "{server} API server, request #{n}: expected {self}, got {seen:?}"
        );
    }
}

/// A canned answer.
pub enum Reply {
    Json(StatusCode, Value),
    /// the connection fails (no HTTP response at all)
    ConnectionError,
}

/// 200 with this object or list.
pub fn ok(body: Value) -> Reply {
    Reply::Json(StatusCode::OK, body)
}

/// 201 with this object.
pub fn created(body: Value) -> Reply {
    Reply::Json(StatusCode::CREATED, body)
}

/// 201 with an Event in namespace `shop`, as the events API answers a create.
pub fn event_created() -> Reply {
    created(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                   "metadata": {"name": "web.1", "namespace": "shop"},
                   "eventTime": "2025-01-01T00:00:00.000000Z"}))
}

/// An error the way the API server sends it: a `metav1.Status` body with this code and reason
/// (404 NotFound, 409 AlreadyExists or Conflict, 410 Expired, 500 InternalError...).
pub fn status(code: u16, reason: &str) -> Reply {
    let code = StatusCode::from_u16(code).expect("a valid HTTP status code");
    Reply::Json(
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{reason} (from the test's API server)"),
            "reason": reason, "code": code.as_u16(),
        }),
    )
}

/// 403 as the API server refuses a create in a namespace being deleted (the admission
/// plugin NamespaceLifecycle's own words).
pub fn terminating(namespace: &str) -> Reply {
    Reply::Json(
        StatusCode::FORBIDDEN,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("unable to create new content in namespace {namespace} because it is being terminated"),
            "reason": "Forbidden", "code": 403,
            "details": {"causes": [{"reason": "NamespaceTerminating",
                                    "message": format!("namespace {namespace} is being terminated")}]},
        }),
    )
}

/// A `metav1.PartialObjectMetadataList` page (what `list_metadata` reads) holding these
/// objects' metadata, with a `continue` token when more pages follow.
pub fn metadata_page(objects: &[Value], continue_token: Option<&str>) -> Reply {
    let items: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                   "metadata": o["metadata"].clone()})
        })
        .collect();
    ok(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "100", "continue": continue_token.unwrap_or_default()},
        "items": items,
    }))
}

fn respond(tx: SendResponse<Response<Body>>, reply: Reply) {
    match reply {
        Reply::Json(code, body) => {
            let bytes = serde_json::to_vec(&body).expect("a JSON reply serializes");
            let response = Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(bytes))
                .expect("a valid response");
            tx.send_response(response);
        }
        Reply::ConnectionError => tx.send_error("connection reset (from the test's API server)"),
    }
}

impl ApiServer {
    async fn receive(&self, e: &Expect) -> (Seen, SendResponse<Response<Body>>) {
        let mut inner = self.inner.lock().await;
        inner.served += 1;
        let (name, n) = (self.name, inner.served);
        let next = tokio::time::timeout(EXPECT_WITHIN, inner.handle.next_request())
            .await
            .unwrap_or_else(|_| {
                panic!("{name} API server, request #{n}: expected {e}, none arrived")
            });
        let (req, tx) = next.unwrap_or_else(|| {
            panic!("{name} API server, request #{n}: expected {e}, the client is gone")
        });
        let seen = Seen::read(req).await;
        e.check(name, n, &seen);
        (seen, tx)
    }

    /// Waits for the next request, fails the test unless it is `e`, answers it with `reply` and
    /// returns what was sent.
    pub async fn expect(&self, e: Expect, reply: Reply) -> Seen {
        let (seen, tx) = self.receive(&e).await;
        respond(tx, reply);
        seen
    }

    /// Like [`expect`](Self::expect), with the answer made from what was sent (an API server
    /// that echoes a create or a replace, with what it adds).
    pub async fn answer(&self, e: Expect, reply: impl FnOnce(&Seen) -> Reply) -> Seen {
        let (seen, tx) = self.receive(&e).await;
        respond(tx, reply(&seen));
        seen
    }

    /// Like [`expect`](Self::expect), but the request is never answered (it hangs until the
    /// server is dropped): the caller's own timeout must fire.
    pub async fn expect_hang(&self, e: Expect) -> Seen {
        let (seen, tx) = self.receive(&e).await;
        self.inner.lock().await.hanging.push(tx);
        seen
    }

    /// The next request, if one arrives within `within` (None also when the client is gone).
    async fn next_within(&self, within: Duration) -> Option<Seen> {
        let mut inner = self.inner.lock().await;
        let (req, _tx) = tokio::time::timeout(within, inner.handle.next_request())
            .await
            .ok()
            .flatten()?;
        Some(Seen::read(req).await)
    }

    /// Fails the test if any further request arrives within a short window (a client that is
    /// gone, or silence, passes). A bounded check, not a wait for a condition.
    pub async fn assert_idle(&self) {
        if let Some(seen) = self.next_within(IDLE_WINDOW).await {
            panic!(
                "{} API server: unexpected request after the scenario: {seen:?}",
                self.name
            );
        }
    }

    /// Awaits `fut` (bounded), failing the test if any request arrives meanwhile.
    pub async fn idle_while<T>(&self, what: &str, fut: impl Future<Output = T>) -> T {
        tokio::select! {
            out = within(what, fut) => out,
            seen = self.unexpected() => panic!("unexpected request while awaiting {what}: {seen}"),
        }
    }

    /// Waits (unbounded) for any request; used while a decision that should send nothing more
    /// is still running.
    async fn unexpected(&self) -> String {
        let mut inner = self.inner.lock().await;
        match inner.handle.next_request().await {
            Some((req, _tx)) => format!("{} API server: {:?}", self.name, Seen::read(req).await),
            None => std::future::pending().await,
        }
    }
}

/// Runs a decision against the API servers it talks to, with the servers' side of the scenario
/// (a series of [`ApiServer::expect`]), and returns the decision's result. Fails the test when
/// a request differs from the expected one, when the decision finishes with requests of the
/// scenario still unsent, when it sends any request the scenario did not expect (during the
/// decision or in a short window after it), or when it does not finish within a bound.
pub async fn run<T>(
    servers: &[&ApiServer],
    decision: impl Future<Output = T>,
    scenario: impl Future<Output = ()>,
) -> T {
    let decision = tokio::time::timeout(EXPECT_WITHIN, decision);
    tokio::pin!(decision, scenario);
    let first = tokio::select! {
        out = &mut decision => Some(out),
        () = &mut scenario => None,
    };
    let out = match first {
        Some(out) => {
            // finished first: the scenario must still complete (it fails on a missing request)
            scenario.await;
            out
        }
        None => {
            assert!(!servers.is_empty(), "run() needs the servers to watch");
            let any = futures::future::select_all(servers.iter().map(|s| Box::pin(s.unexpected())));
            tokio::select! {
                out = &mut decision => out,
                (what, _, _) = any => panic!("unexpected request after the scenario: {what}"),
            }
        }
    };
    let out =
        out.unwrap_or_else(|_| panic!("the decision did not finish within {EXPECT_WITHIN:?}"));
    for s in servers {
        s.assert_idle().await;
    }
    out
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// `application/x-www-form-urlencoded` decoding, as kube encodes query parameters.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => match s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(v) => {
                    out.push(v);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Awaits `fut`, failing the test if it takes longer than a generous bound (a bounded check on
/// something the test caused, not a sleep).
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(EXPECT_WITHIN, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {EXPECT_WITHIN:?}"))
}

/// Leadership as the election task would publish it. Keep the sender alive for the whole test:
/// dropping it reads as an ended election task, i.e. not the leader.
pub fn leadership(leader: bool) -> (watch::Sender<Option<Instant>>, Leadership) {
    let until = leader.then(|| Instant::now() + Duration::from_secs(3600));
    let (tx, rx) = watch::channel(until);
    (tx, Leadership::from_receiver(rx))
}

/// The options the builders assume: default label key, remote [`REMOTE`], slices only.
pub fn opts() -> Options {
    Options {
        label_key: DEFAULT_LABEL_KEY.to_string(),
        cluster_name: REMOTE.to_string(),
        endpoints_mode: EndpointsMode::Slices,
        cluster_id: None,
        containment: Default::default(),
        allow_external_name: false,
    }
}

/// Any Kubernetes object from JSON.
pub fn obj<K: DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("a valid object")
}

/// A Service whose labels and annotations make it one of our followers.
pub fn follower_meta(ns: &str, name: &str, uid: &str) -> Value {
    json!({"metadata": {
        "namespace": ns, "name": name, "uid": uid, "resourceVersion": "1",
        "labels": {DEFAULT_LABEL_KEY: "follower"},
        "annotations": {"fair.com/cross-cluster-origin-cluster": REMOTE},
    }})
}

/// A cache that completed a listing holding exactly `objects`.
pub fn loaded<K: kube::Resource + Serialize + DeserializeOwned>(
    cache: &parking_lot::RwLock<Cache<K>>,
    objects: impl IntoIterator<Item = K>,
) {
    let mut c = cache.write();
    c.apply(Event::Init);
    for o in objects {
        c.apply(Event::InitApply(o));
    }
    c.apply(Event::InitDone);
}

/// A reconcile context over `client` (writes and Events both go there), with these caches.
pub fn ctx(
    client: Client,
    leader: Leadership,
    remotes: Vec<Arc<RemoteState>>,
    local: Arc<LocalState>,
) -> Ctx {
    let metrics = Arc::new(Metrics::default());
    let registry = crate::state::Remotes::default();
    for state in remotes {
        registry.insert(crate::state::Member {
            state,
            client: client.clone(),
            cluster_id: None,
            origin: crate::state::Origin::Static,
            cancel: tokio_util::sync::CancellationToken::new(),
        });
    }
    // the fixtures' namespace `shop` is a top-level domain: allowed, as an operator would
    // (`--allow-tld-names=shop`)
    let allowed = crate::desired::containment::Containment {
        allowed_tld_names: vec!["shop".into()],
        ..Default::default()
    };
    Ctx {
        opts: opts().with_containment(allowed),
        namespaces: Vec::new(),
        remotes: Arc::new(registry),
        local,
        writer: Writer::new(client, leader, false, Arc::clone(&metrics)).with_reporter(Reporter {
            controller: "cross-cluster-controller-test".into(),
            instance: None,
        }),
        metrics,
        create_namespaces: false,
        fallback_ref: ObjectReference::default(),
        events_sent: parking_lot::Mutex::new(EventLimiter::new(Duration::from_secs(300))),
        export_conflicts: parking_lot::Mutex::default(),
        taken_over: parking_lot::Mutex::default(),
        mcs: None,
    }
}

mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        let q = parse_query(
            "&labelSelector=fair.com%2Fcross-cluster%3Dfollower&limit=500&continue=a+b%3D",
        );
        assert_eq!(q["labelSelector"], "fair.com/cross-cluster=follower");
        assert_eq!(q["limit"], "500");
        assert_eq!(q["continue"], "a b=");
    }
}
