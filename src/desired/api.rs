//! Words of the Kubernetes API that the desired state compares and writes (Service types and
//! fields, protocols, IP families), so each is spelled once.
pub(crate) const TYPE_CLUSTER_IP: &str = "ClusterIP";
pub(crate) const TYPE_EXTERNAL_NAME: &str = "ExternalName";
/// `spec.clusterIP` of a headless Service.
pub(crate) const CLUSTER_IP_NONE: &str = "None";
pub(crate) const AFFINITY_NONE: &str = "None";
pub(crate) const AFFINITY_CLIENT_IP: &str = "ClientIP";
/// The API server's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub(crate) const DEFAULT_CLIENT_IP_TIMEOUT: i32 = 10800;
/// The API server's default protocol of a port.
pub(crate) const PROTOCOL_TCP: &str = "TCP";
pub(crate) const SINGLE_STACK: &str = "SingleStack";
pub(crate) const PREFER_DUAL_STACK: &str = "PreferDualStack";
/// The default `internalTrafficPolicy`.
pub(crate) const ITP_CLUSTER: &str = "Cluster";
pub(crate) const IPV4: &str = "IPv4";
pub(crate) const IPV6: &str = "IPv6";
