//! Pure translation of remote leader objects into the desired local follower objects, and the
//! "does the live local object need a write?" comparisons.
//!
//! Nothing in this module performs I/O: it only maps Kubernetes objects to Kubernetes objects.
//!
//! * [`follower`] turns a remote leader Service and all of its remote EndpointSlices into a
//!   [`Follower`]: the selectorless follower Service, the follower EndpointSlices and/or the
//!   legacy core/v1 Endpoints, depending on [`EndpointsMode`].
//! * [`merge`] makes one follower of the exports of several remotes (same namespace/name).
//! * [`recorded`] and [`slice_recorded`] tell which remotes an existing local object records.
//! * [`service_change`], [`slice_change`] and [`endpoints_change`] compare a live local object
//!   with the desired one, ignoring everything the API server defaults and everything other
//!   managers added, and return the object to write (if any).

mod endpoints;
mod merge;
mod meta;
mod service;
mod slices;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub use endpoints::endpoints_change;
pub use merge::{Conflict, ConflictKind, Export, Merged, merge, not_ready};
pub use service::{ServiceChange, service_change};
pub use slices::{set_slice_owner, slice_change};

/// Value of the `endpointslice.kubernetes.io/managed-by` label on the slices we write.
pub const MANAGED_BY: &str = "cross-cluster-controller.fair.com";
/// Most endpoints we put into one follower EndpointSlice.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;
/// Most addresses (ready plus not ready) the API keeps in one core/v1 Endpoints object.
pub const MAX_ENDPOINTS_ADDRESSES: usize = 1000;

/// The label key used when none is configured.
pub const DEFAULT_LABEL_KEY: &str = "fair.com/cross-cluster";
/// Value of the label key on remote Services that should be mirrored.
pub const LEADER_VALUE: &str = "true";
/// Value of the label key on the local objects we write.
pub const FOLLOWER_VALUE: &str = "follower";

/// The MCS API's label naming the cluster an EndpointSlice's endpoints come from (KEP-1645).
pub const MCS_SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";
/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Suffix of the annotation recording the label keys copied from the leader.
pub const COPIED_LABELS_SUFFIX: &str = "copied-labels";
/// `endpointslice.kubernetes.io/managed-by` of the slices kube-controller-manager makes for
/// selector Services.
pub const KCM_SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
/// Label naming the controller that manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Label telling kube-controller-manager not to mirror an Endpoints object into slices.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Annotation set on an Endpoints object whose addresses were truncated.
pub const OVER_CAPACITY_ANNOTATION: &str = "endpoints.kubernetes.io/over-capacity";
/// Value of [`OVER_CAPACITY_ANNOTATION`] when addresses were dropped.
pub const OVER_CAPACITY_TRUNCATED: &str = "truncated";

/// Which local endpoint objects we write for a follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointsMode {
    /// Only discovery.k8s.io/v1 EndpointSlices.
    Slices,
    /// Only legacy core/v1 Endpoints (kube-controller-manager mirrors them into slices).
    Endpoints,
    /// Both; the Endpoints are labelled so that they are not mirrored.
    Both,
}

impl EndpointsMode {
    /// Whether follower EndpointSlices are written in this mode.
    pub fn writes_slices(self) -> bool {
        matches!(self, EndpointsMode::Slices | EndpointsMode::Both)
    }

    /// Whether a follower core/v1 Endpoints object is written in this mode.
    pub fn writes_endpoints(self) -> bool {
        matches!(self, EndpointsMode::Endpoints | EndpointsMode::Both)
    }
}

/// Settings that shape the desired objects.
#[derive(Clone, Debug)]
pub struct Options {
    /// Label key marking leaders (`<key>=true`) and followers (`<key>=follower`).
    pub label_key: String,
    /// Name of the REMOTE cluster the followers come from, recorded in an annotation.
    pub cluster_name: String,
    /// Which local endpoint objects to write.
    pub endpoints_mode: EndpointsMode,
    /// The remote cluster's id (its kube-system uid), recorded in an annotation when known, so a
    /// remote's name can never be taken over by another cluster unseen, even across restarts.
    pub cluster_id: Option<String>,
}

impl Options {
    /// Label selector matching remote leader Services: `<key>=true`.
    pub fn leader_selector(&self) -> String {
        format!("{}={LEADER_VALUE}", self.label_key)
    }

    /// Label selector matching the remote EndpointSlices the leader selector misses: those with
    /// a `kubernetes.io/service-name`, not made by kube-controller-manager's EndpointSlice
    /// controller (which copies the Service's labels, leader label included, onto its slices),
    /// and carrying neither `<key>=true` (the leader-labelled watch has them) nor
    /// `<key>=follower` (another instance's followers in that cluster). Unrelated slices of
    /// selector Services, the bulk of a cluster's slices, are filtered out by the API server.
    pub fn foreign_slice_selector(&self) -> String {
        format!(
            "{MANAGED_BY_LABEL}!={KCM_SLICE_CONTROLLER},{SERVICE_NAME_LABEL},{} notin ({LEADER_VALUE},{FOLLOWER_VALUE})",
            self.label_key
        )
    }

    /// Label selector matching local follower objects: `<key>=follower`.
    pub fn follower_selector(&self) -> String {
        format!("{}={FOLLOWER_VALUE}", self.label_key)
    }

    /// Annotation naming the remote cluster a follower comes from.
    pub fn origin_cluster_annotation(&self) -> String {
        self.annotation("origin-cluster")
    }

    /// Annotation holding the id of the remote cluster a follower comes from.
    pub fn origin_cluster_id_annotation(&self) -> String {
        self.annotation("origin-cluster-id")
    }

    /// Annotation listing every remote a merged follower Service carries (comma-separated,
    /// sorted): the remotes whose proof its deletion needs.
    pub fn origin_clusters_annotation(&self) -> String {
        self.annotation("origin-clusters")
    }

    /// Label on a follower EndpointSlice naming the remote it mirrors (when the name is a
    /// valid label value; the annotation of the same key always names it).
    pub fn origin_cluster_label(&self) -> String {
        self.annotation("origin-cluster")
    }

    /// Annotation holding `namespace/name` of the remote leader Service.
    pub fn origin_object_annotation(&self) -> String {
        self.annotation("origin-object")
    }

    /// Annotation listing the label keys copied from the leader (see `record_copied_labels`).
    pub fn copied_labels_annotation(&self) -> String {
        self.annotation(COPIED_LABELS_SUFFIX)
    }

    /// Annotation holding the uid of the remote leader Service.
    pub fn origin_uid_annotation(&self) -> String {
        self.annotation("origin-uid")
    }

    /// `<prefix>/cross-cluster-<suffix>` when the label key has a prefix, else `<key>-<suffix>`.
    pub fn annotation(&self, suffix: &str) -> String {
        match self.label_key.split_once('/') {
            Some((prefix, _)) => format!("{prefix}/cross-cluster-{suffix}"),
            None => format!("{}-{suffix}", self.label_key),
        }
    }
}

/// Everything the local cluster should hold for one remote leader.
#[derive(Clone, Debug, PartialEq)]
pub struct Follower {
    /// The selectorless follower Service.
    pub service: Service,
    /// Follower EndpointSlices, sorted by name; empty in [`EndpointsMode::Endpoints`], for
    /// ExternalName leaders and for leaders without endpoints.
    pub slices: Vec<EndpointSlice>,
    /// The follower core/v1 Endpoints; `None` in [`EndpointsMode::Slices`] and for ExternalName
    /// leaders.
    pub endpoints: Option<Endpoints>,
}

/// Why a remote object cannot be mirrored. The variants are bounded categories, usable as
/// metric labels through [`Skip::reason`].
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Skip {
    /// The remote Service does not carry `<key>=true`.
    #[error("remote Service does not carry the leader label {label}")]
    NotLeader {
        /// The expected `<key>=true` selector.
        label: String,
    },
    /// The remote Service has no name.
    #[error("remote Service has no name")]
    MissingName,
    /// The remote Service has no namespace.
    #[error("remote Service has no namespace")]
    MissingNamespace,
    /// A label of a desired object would be rejected by the API server.
    #[error("label {key:?} is invalid: {message}")]
    LabelsInvalid {
        /// The offending label key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// An annotation key of a desired object would be rejected by the API server.
    #[error("annotation {key:?} is invalid: {message}")]
    AnnotationsInvalid {
        /// The offending annotation key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// The annotations of a desired object exceed the API server's 256 KiB limit.
    #[error("annotations take {size} bytes, more than the {limit} bytes allowed")]
    AnnotationsTooLarge {
        /// Total size of the annotation keys and values.
        size: usize,
        /// The API server's limit.
        limit: usize,
    },
}

impl Skip {
    /// Every reason [`Skip::reason`] returns.
    pub const REASONS: [&'static str; 6] = [
        "NotLeader",
        "MissingName",
        "MissingNamespace",
        "LabelsInvalid",
        "AnnotationsInvalid",
        "AnnotationsTooLarge",
    ];

    /// Short CamelCase reason, usable as a Kubernetes Event reason and as a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Skip::NotLeader { .. } => "NotLeader",
            Skip::MissingName => "MissingName",
            Skip::MissingNamespace => "MissingNamespace",
            Skip::LabelsInvalid { .. } => "LabelsInvalid",
            Skip::AnnotationsInvalid { .. } => "AnnotationsInvalid",
            Skip::AnnotationsTooLarge { .. } => "AnnotationsTooLarge",
        }
    }
}

/// What an existing local object records about its origin (see [`recorded`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// No follower label (or, for a slice, not managed by us): never ours.
    NotOurs,
    /// Follower label without origin annotations (left by the old Go controller): adoptable.
    GoEra,
    /// A follower of these remotes (a slice names exactly one).
    From(std::collections::BTreeSet<String>),
}

impl Recorded {
    /// Whether the object is a follower and records the remote `cluster`.
    pub fn names(&self, cluster: &str) -> bool {
        matches!(self, Recorded::From(set) if set.contains(cluster))
    }
}

/// Remote leader Service (must carry `<key>=true`) plus ALL remote EndpointSlices of it ->
/// the desired local objects.
///
/// Slices whose namespace or `kubernetes.io/service-name` label name another Service are
/// ignored. Slices and Endpoints get no ownerReferences here: see [`set_slice_owner`].
pub fn follower(
    remote: &Service,
    remote_slices: &[&EndpointSlice],
    opts: &Options,
) -> Result<Follower, Skip> {
    let leader = remote
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(&opts.label_key));
    if leader.map(String::as_str) != Some(LEADER_VALUE) {
        return Err(Skip::NotLeader {
            label: opts.leader_selector(),
        });
    }
    let name = non_empty(remote.metadata.name.as_deref()).ok_or(Skip::MissingName)?;
    let namespace =
        non_empty(remote.metadata.namespace.as_deref()).ok_or(Skip::MissingNamespace)?;

    let service = service::desired_service(remote, name, namespace, opts);
    meta::validate(&service.metadata)?;

    if service::is_external_name(&service) {
        return Ok(Follower {
            service,
            slices: Vec::new(),
            endpoints: None,
        });
    }

    let relevant: Vec<&EndpointSlice> = remote_slices
        .iter()
        .copied()
        .filter(|slice| slices::belongs_to(slice, name, namespace))
        .collect();
    let groups = slices::group_endpoints(&relevant);
    let labels = service.metadata.labels.clone().unwrap_or_default();

    let mut desired_slices = Vec::new();
    if opts.endpoints_mode.writes_slices() {
        desired_slices = slices::desired_slices(&groups, name, namespace, &labels, opts);
        for slice in &desired_slices {
            meta::validate(&slice.metadata)?;
        }
    }

    let mut desired_endpoints = None;
    if opts.endpoints_mode.writes_endpoints() {
        let ep = endpoints::desired_endpoints(&groups, name, namespace, &labels, opts);
        meta::validate(&ep.metadata)?;
        desired_endpoints = Some(ep);
    }

    Ok(Follower {
        service,
        slices: desired_slices,
        endpoints: desired_endpoints,
    })
}

/// The remotes a local Service or Endpoints object records (its metadata is enough).
pub fn recorded(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    opts: &Options,
) -> Recorded {
    meta::recorded(metadata, opts)
}

/// The remote a local EndpointSlice records: as for a Service, but a slice whose
/// `endpointslice.kubernetes.io/managed-by` label is not [`MANAGED_BY`] is never ours (slices
/// mirrored by kube-controller-manager from our Endpoints carry the follower label too).
pub fn slice_recorded(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    opts: &Options,
) -> Recorded {
    let managed_by = metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL));
    if managed_by.map(String::as_str) != Some(MANAGED_BY) {
        return Recorded::NotOurs;
    }
    meta::recorded(metadata, opts)
}

/// Whether `s` is a lowercase RFC 1123 subdomain (an object name the API server accepts).
pub fn meta_is_dns1123_subdomain(s: &str) -> bool {
    meta::is_dns1123_subdomain(s)
}

fn non_empty(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use serde_json::{Value, json};

    pub fn opts(mode: EndpointsMode) -> Options {
        Options {
            label_key: DEFAULT_LABEL_KEY.to_string(),
            cluster_name: "remote-a".to_string(),
            endpoints_mode: mode,
            cluster_id: None,
        }
    }

    pub fn service(spec: Value) -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": "remote-uid-1",
                "resourceVersion": "42",
                "labels": {"app": "web", "fair.com/cross-cluster": "true"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"remote\":true}"
                },
            },
            "spec": spec,
        }))
        .unwrap()
    }

    pub fn cluster_ip_service() -> Service {
        service(json!({
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "selector": {"app": "web"},
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {"name": "grpc", "port": 9090, "protocol": "TCP", "targetPort": "grpc",
                 "appProtocol": "kubernetes.io/h2c"},
            ],
        }))
    }

    pub fn endpoint(ip: &str) -> Value {
        json!({
            "addresses": [ip],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": "node-1",
            "zone": "zone-a",
            "targetRef": {"kind": "Pod", "name": format!("pod-{ip}"), "namespace": "shop"},
        })
    }

    pub fn slice(
        name: &str,
        address_type: &str,
        ports: Value,
        endpoints: Vec<Value>,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "labels": {
                    "kubernetes.io/service-name": "web",
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": address_type,
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    pub fn web_ports() -> Value {
        json!([
            {"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "grpc", "port": 9090, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    #[test]
    fn options_selectors_and_annotations() {
        let o = opts(EndpointsMode::Slices);
        assert_eq!(o.leader_selector(), "fair.com/cross-cluster=true");
        assert_eq!(o.follower_selector(), "fair.com/cross-cluster=follower");
        assert_eq!(
            o.foreign_slice_selector(),
            "endpointslice.kubernetes.io/managed-by!=endpointslice-controller.k8s.io,\
             kubernetes.io/service-name,fair.com/cross-cluster notin (true,follower)"
        );
        assert_eq!(
            o.origin_cluster_annotation(),
            "fair.com/cross-cluster-origin-cluster"
        );
        assert_eq!(
            o.origin_object_annotation(),
            "fair.com/cross-cluster-origin-object"
        );
        assert_eq!(
            o.origin_uid_annotation(),
            "fair.com/cross-cluster-origin-uid"
        );

        let bare = Options {
            label_key: "mirror".to_string(),
            ..o
        };
        assert_eq!(bare.origin_cluster_annotation(), "mirror-origin-cluster");
        assert_eq!(bare.origin_object_annotation(), "mirror-origin-object");
        assert_eq!(bare.origin_uid_annotation(), "mirror-origin-uid");
    }

    #[test]
    fn modes_produce_the_right_objects() {
        let svc = cluster_ip_service();
        let s = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);

        let f = follower(&svc, &[&s], &opts(EndpointsMode::Slices)).unwrap();
        assert_eq!(f.slices.len(), 1);
        assert!(f.endpoints.is_none());

        let f = follower(&svc, &[&s], &opts(EndpointsMode::Endpoints)).unwrap();
        assert!(f.slices.is_empty());
        let ep = f.endpoints.unwrap();
        let labels = ep.metadata.labels.unwrap();
        assert!(!labels.contains_key(SKIP_MIRROR_LABEL));
        assert_eq!(labels["fair.com/cross-cluster"], "follower");

        let f = follower(&svc, &[&s], &opts(EndpointsMode::Both)).unwrap();
        assert_eq!(f.slices.len(), 1);
        let labels = f.endpoints.unwrap().metadata.labels.unwrap();
        assert_eq!(labels[SKIP_MIRROR_LABEL], "true");
        // The slices never carry skip-mirror.
        assert!(
            !f.slices[0]
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(SKIP_MIRROR_LABEL)
        );
    }

    #[test]
    fn skips_non_leaders_and_unnamed_services() {
        let o = opts(EndpointsMode::Slices);
        let mut svc = cluster_ip_service();
        svc.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("fair.com/cross-cluster".into(), "follower".into());
        let err = follower(&svc, &[], &o).unwrap_err();
        assert_eq!(err.reason(), "NotLeader");

        let mut svc = cluster_ip_service();
        svc.metadata.name = None;
        assert_eq!(follower(&svc, &[], &o).unwrap_err(), Skip::MissingName);

        let mut svc = cluster_ip_service();
        svc.metadata.namespace = Some(String::new());
        let err = follower(&svc, &[], &o).unwrap_err();
        assert_eq!(err, Skip::MissingNamespace);
        assert_eq!(err.reason(), "MissingNamespace");
    }

    #[test]
    fn annotations_too_large_are_skipped() {
        let mut o = opts(EndpointsMode::Both);
        o.cluster_name = "x".repeat(300 * 1024);
        let err = follower(&cluster_ip_service(), &[], &o).unwrap_err();
        assert!(matches!(err, Skip::AnnotationsTooLarge { .. }), "{err:?}");
        assert_eq!(err.reason(), "AnnotationsTooLarge");
        assert!(err.to_string().contains("262144"));
    }

    #[test]
    fn invalid_labels_are_skipped() {
        let mut svc = cluster_ip_service();
        svc.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "y".repeat(64));
        let err = follower(&svc, &[], &opts(EndpointsMode::Slices)).unwrap_err();
        assert_eq!(err.reason(), "LabelsInvalid");
        assert!(matches!(err, Skip::LabelsInvalid { ref key, .. } if key == "team"));

        let mut svc = cluster_ip_service();
        svc.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("bad key!".into(), "v".into());
        let err = follower(&svc, &[], &opts(EndpointsMode::Slices)).unwrap_err();
        assert_eq!(err.reason(), "LabelsInvalid");
    }

    #[test]
    fn invalid_annotation_keys_are_skipped() {
        let mut o = opts(EndpointsMode::Slices);
        // A bare label key is a valid label key, but the derived annotation names exceed 63.
        o.label_key = "k".repeat(60);
        let mut svc = cluster_ip_service();
        svc.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(o.label_key.clone(), "true".into());
        let err = follower(&svc, &[], &o).unwrap_err();
        assert_eq!(err.reason(), "AnnotationsInvalid");
    }

    #[test]
    fn recorded_origin_cases() {
        let o = opts(EndpointsMode::Both);
        let meta = |labels: serde_json::Value, annotations: serde_json::Value| -> ObjectMeta {
            serde_json::from_value(json!({"name": "web", "namespace": "shop",
                                          "labels": labels, "annotations": annotations}))
            .unwrap()
        };
        let from = |names: &[&str]| Recorded::From(names.iter().map(|n| n.to_string()).collect());
        let follower_label = json!({"fair.com/cross-cluster": "follower"});
        let one = json!({"fair.com/cross-cluster-origin-cluster": "remote-a"});
        let merged = json!({"fair.com/cross-cluster-origin-cluster": "remote-a",
                            "fair.com/cross-cluster-origin-clusters": "remote-a,remote-b"});

        assert_eq!(
            recorded(&meta(follower_label.clone(), one.clone()), &o),
            from(&["remote-a"])
        );
        assert_eq!(
            recorded(&meta(follower_label.clone(), merged), &o),
            from(&["remote-a", "remote-b"])
        );
        assert_eq!(
            recorded(&meta(follower_label.clone(), json!({})), &o),
            Recorded::GoEra
        );
        assert_eq!(
            recorded(
                &meta(json!({"fair.com/cross-cluster": "true"}), one.clone()),
                &o
            ),
            Recorded::NotOurs
        );
        assert_eq!(
            recorded(&meta(json!(null), json!(null)), &o),
            Recorded::NotOurs
        );

        let slice = |managed_by: &str, annotations: serde_json::Value| -> ObjectMeta {
            meta(
                json!({"fair.com/cross-cluster": "follower",
                       "endpointslice.kubernetes.io/managed-by": managed_by}),
                annotations,
            )
        };
        assert_eq!(
            slice_recorded(&slice(MANAGED_BY, one.clone()), &o),
            from(&["remote-a"])
        );
        assert_eq!(
            slice_recorded(&slice(MANAGED_BY, json!({})), &o),
            Recorded::GoEra
        );
        assert_eq!(
            slice_recorded(&slice("endpointslicemirroring-controller.k8s.io", one), &o),
            Recorded::NotOurs
        );
    }

    #[test]
    fn generated_objects_record_their_remote() {
        let o = opts(EndpointsMode::Both);
        let s = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let f = follower(&cluster_ip_service(), &[&s], &o).unwrap();
        assert!(recorded(&f.service.metadata, &o).names("remote-a"));
        assert!(slice_recorded(&f.slices[0].metadata, &o).names("remote-a"));
        assert!(recorded(&f.endpoints.as_ref().unwrap().metadata, &o).names("remote-a"));
        let labels = f.slices[0].metadata.labels.as_ref().unwrap();
        assert_eq!(labels["fair.com/cross-cluster-origin-cluster"], "remote-a");
    }

    #[test]
    fn slices_of_other_services_are_ignored() {
        let o = opts(EndpointsMode::Slices);
        let mine = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let mut foreign = slice("api-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.2")]);
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.into(), "api".into());
        let mut elsewhere = slice("web-xyz", "IPv4", web_ports(), vec![endpoint("10.0.0.3")]);
        elsewhere.metadata.namespace = Some("other".into());
        let f = follower(&cluster_ip_service(), &[&mine, &foreign, &elsewhere], &o).unwrap();
        assert_eq!(f.slices.len(), 1);
        assert_eq!(f.slices[0].endpoints.len(), 1);
        assert_eq!(f.slices[0].endpoints[0].addresses, vec!["10.0.0.1"]);
    }
}
