//! The vocabulary every other part of `desired` speaks: the labels and annotations we write,
//! the options, why an object cannot be mirrored ([`Skip`]) and what a local object records
//! ([`Recorded`]).
/// Value of the `endpointslice.kubernetes.io/managed-by` label on the slices we write.
pub const MANAGED_BY: &str = "cross-cluster-controller.fair.com";
/// The field manager of every write of ours (always an update, never an apply).
pub const FIELD_MANAGER: &str = "cross-cluster-controller";
/// Most endpoints we put into one follower EndpointSlice.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;
/// Most addresses (ready plus not ready) the API keeps in one core/v1 Endpoints object.
pub const MAX_ENDPOINTS_ADDRESSES: usize = 1000;

/// The label key used when none is configured.
pub const DEFAULT_LABEL_KEY: &str = "fair.com/cross-cluster";
/// Value of the label key on remote Services that should be mirrored.
pub const EXPORT_VALUE: &str = "true";
/// Value of the label key on the local objects we write.
pub const FOLLOWER_VALUE: &str = "follower";

/// The MCS API's label naming the cluster an EndpointSlice's endpoints come from (KEP-1645).
pub const MCS_SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";
/// The MCS API's label naming the Service an EndpointSlice (or a derived Service) belongs to.
pub const MCS_SERVICE_NAME_LABEL: &str = "multicluster.kubernetes.io/service-name";
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
    /// Label key marking exported Services (`<key>=true`) and followers (`<key>=follower`).
    pub label_key: String,
    /// Name of the REMOTE cluster the followers come from, recorded in an annotation.
    pub cluster_name: String,
    /// Which local endpoint objects to write.
    pub endpoints_mode: EndpointsMode,
    /// The remote cluster's id (its kube-system uid), recorded in an annotation when known, so a
    /// remote's name can never be taken over by another cluster unseen, even across restarts.
    pub cluster_id: Option<String>,
    /// Label lists and protected namespaces (the operator's, shared by every remote).
    pub containment: std::sync::Arc<super::containment::Containment>,
    /// Whether this remote may export ExternalName Services (refused by default: a CNAME to
    /// any host under a local name).
    pub allow_external_name: bool,
}

/// Whether `namespace` is mirrored: the list of mirrored namespaces holds it, or is empty (all).
pub fn in_scope(namespaces: &[String], namespace: &str) -> bool {
    namespaces.is_empty() || namespaces.iter().any(|n| n == namespace)
}

impl Options {
    /// The options every remote starts from: the label key and which endpoint objects to write.
    pub fn new(label_key: impl Into<String>, endpoints_mode: EndpointsMode) -> Self {
        Self {
            label_key: label_key.into(),
            cluster_name: String::new(),
            endpoints_mode,
            cluster_id: None,
            containment: Default::default(),
            allow_external_name: false,
        }
    }

    /// These options with the operator's containment settings.
    pub fn with_containment(self, containment: super::containment::Containment) -> Self {
        Self {
            containment: std::sync::Arc::new(containment),
            ..self
        }
    }

    /// These options for one remote: its name and, when known, its cluster id.
    pub fn for_remote(&self, name: &str, cluster_id: Option<String>) -> Self {
        Self {
            cluster_name: name.to_string(),
            cluster_id,
            ..self.clone()
        }
    }

    /// Whether the daemon never writes in `namespace` (`--protected-namespaces`).
    pub fn protected(&self, namespace: &str) -> bool {
        self.containment.protected(namespace)
    }

    /// Why no follower may be `namespace/name` (a top-level domain), if none may.
    pub fn public_name(&self, namespace: &str, name: &str) -> Option<super::names::PublicName> {
        self.containment.public_name(namespace, name)
    }

    /// Label selector matching remote exported Services: `<key>=true`.
    pub fn export_selector(&self) -> String {
        format!("{}={EXPORT_VALUE}", self.label_key)
    }

    /// Label selector matching the remote EndpointSlices the exported Service selector misses: those with
    /// a `kubernetes.io/service-name`, not made by kube-controller-manager's EndpointSlice
    /// controller (which copies the Service's labels, export label included, onto its slices),
    /// and carrying neither `<key>=true` (the export-labelled watch has them) nor
    /// `<key>=follower` (another instance's followers in that cluster), nor the MCS
    /// `multicluster.kubernetes.io/service-name` (the MCS slices written there: imports, not exports). Unrelated slices of
    /// selector Services, the bulk of a cluster's slices, are filtered out by the API server.
    pub fn foreign_slice_selector(&self) -> String {
        format!(
            "{MANAGED_BY_LABEL}!={KCM_SLICE_CONTROLLER},{SERVICE_NAME_LABEL},{} notin ({EXPORT_VALUE},{FOLLOWER_VALUE}),!{}",
            self.label_key, MCS_SERVICE_NAME_LABEL
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

    /// Annotation holding `namespace/name` of the remote exported Service.
    pub fn origin_object_annotation(&self) -> String {
        self.annotation("origin-object")
    }

    /// Annotation listing the label keys copied from the exported Service (see `record_copied_labels`).
    pub fn copied_labels_annotation(&self) -> String {
        self.annotation(COPIED_LABELS_SUFFIX)
    }

    /// Annotation holding the uid of the remote exported Service.
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

/// Why a remote object cannot be mirrored. The variants are bounded categories, usable as
/// metric labels through [`Skip::reason`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, strum::IntoStaticStr, strum::VariantNames)]
pub enum Skip {
    /// The remote Service does not carry `<key>=true`.
    #[error("remote Service does not carry the export label {label}")]
    NotExported {
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
    /// An ExternalName Service, from a remote not allowed them (a CNAME to any host).
    #[error(
        "ExternalName Services are refused from this remote (a local name would point at any host); allow them with the Secret annotation fair.com/cross-cluster-allow-external-name: \"true\" or --remote-allow-external-name"
    )]
    ExternalNameRefused,
    /// One remote's export of a Service names more ports than `--remote-max-ports-per-service`
    /// (kube-proxy programs every port of every endpoint on every node).
    #[error(
        "{ports} ports in {what}, more than {limit} (--remote-max-ports-per-service): what the follower has of this remote is kept as it was"
    )]
    TooManyPorts {
        /// the ports found
        ports: u64,
        /// the limit
        limit: u64,
        /// where: "its Service" or "its EndpointSlices"
        what: &'static str,
    },
    /// One remote's endpoints of a Service would make more follower slices than
    /// `--remote-max-slices-per-service` (each distinct port set is a slice of its own).
    #[error(
        "its EndpointSlices would make {slices} follower slices, more than {limit} (--remote-max-slices-per-service): what the follower has of this remote is kept as it was"
    )]
    TooManySlices {
        /// the follower slices they would make
        slices: u64,
        /// the limit
        limit: u64,
    },
}

impl Skip {
    /// Every reason [`Skip::reason`] returns: the variants' names.
    pub const REASONS: &'static [&'static str] = <Self as strum::VariantNames>::VARIANTS;

    /// Short CamelCase reason, usable as a Kubernetes Event reason and as a metric label: the
    /// variant's name.
    pub fn reason(&self) -> &'static str {
        self.into()
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
