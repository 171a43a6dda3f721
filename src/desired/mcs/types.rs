//! The objects of the Multi-Cluster Services API (mcs-api v0.5.0, `multicluster.x-k8s.io/v1beta1`)
//! and of the About API (`about.k8s.io/v1alpha1` ClusterProperty), as plain serde structs.
//!
//! `k8s_openapi::Resource` is implemented by hand (kube's blanket impl gives `kube::Resource`), not derived: kube's `derive`
//! feature would add kube-derive, schemars and their proc-macro build to the tree (none of which
//! is in Cargo.lock today) to generate CRD schemas we never publish (the CRDs are mcs-api's own).
//! Three small impls cost less than that compile on every cold build.
//!
//! Field names and optionality follow the Go types (`pkg/apis/v1beta1` of mcs-api v0.5.0): a Go
//! `string` with `omitempty` is a `String` left out when empty, a slice with `omitempty` a `Vec`
//! left out when empty. Every object serialises its `apiVersion` and `kind` (the API server
//! decodes custom resources as unstructured objects, which need both) and ignores them when read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::SessionAffinityConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

/// The MCS API's group.
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// The MCS API version we read and write.
pub const MCS_VERSION: &str = "v1beta1";
/// `<group>/<version>` of ServiceExport and ServiceImport.
pub const MCS_API_VERSION: &str = "multicluster.x-k8s.io/v1beta1";
/// The About API's group (KEP-2149).
pub const ABOUT_GROUP: &str = "about.k8s.io";
/// The About API version we read.
pub const ABOUT_VERSION: &str = "v1alpha1";

/// `ServiceImport.spec.type` of a Service reached through its clusterset IP.
pub const CLUSTER_SET_IP: &str = "ClusterSetIP";
/// `ServiceImport.spec.type` of a headless Service.
pub const HEADLESS: &str = "Headless";

/// Declares that the Service of the same namespace/name should be consumable from other
/// clusters of the ClusterSet. Written by users; we write only its status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceExport {
    pub metadata: ObjectMeta,
    pub spec: ServiceExportSpec,
    pub status: Option<ServiceExportStatus>,
}

/// What an export asks for beyond the Service itself.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceExportSpec {
    /// Labels to put on the ServiceImport (optional for implementations; we do).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub exported_labels: BTreeMap<String, String>,
    /// Annotations to put on the ServiceImport.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub exported_annotations: BTreeMap<String, String>,
}

/// The export's conditions (Valid, Ready, Conflict), written by the exporting cluster's daemon.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceExportStatus {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A Service imported from the clusters of the ClusterSet: written by us in every cluster that
/// has the namespace.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceImport {
    pub metadata: ObjectMeta,
    pub spec: ServiceImportSpec,
    pub status: Option<ServiceImportStatus>,
}

/// How the imported Service is consumed.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceImportSpec {
    /// Required by the CRD, so always written (possibly empty).
    pub ports: Vec<ServicePort>,
    /// The clusterset IPs (ClusterSetIP only), in the order of `ip_families`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// [`CLUSTER_SET_IP`] or [`HEADLESS`]; required by the CRD.
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub session_affinity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_families: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
}

/// A port of an imported Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    pub port: i32,
}

/// The clusters an import is made of, and conditions (which we do not set).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceImportStatus {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One exporting cluster of an import.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterStatus {
    pub cluster: String,
}

/// A cluster-scoped property of this cluster (KEP-2149); its name is the property's key.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterProperty {
    pub metadata: ObjectMeta,
    pub spec: ClusterPropertySpec,
}

/// The property's value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterPropertySpec {
    pub value: String,
}

/// `k8s_openapi::Resource` and `Metadata` (kube's blanket impl then supplies `kube::Resource`,
/// and the writer its `KIND`), and a Serialize that writes `apiVersion` and `kind` first.
macro_rules! resource {
    ($ty:ident, $kind:literal, $plural:literal, $group:literal, $version:literal, $scope:ty,
     [$($field:ident: $json:literal),*], [$($optional:ident: $ojson:literal),*]) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut s = serializer.serialize_struct($kind, 6)?;
                s.serialize_field("apiVersion", concat!($group, "/", $version))?;
                s.serialize_field("kind", $kind)?;
                s.serialize_field("metadata", &self.metadata)?;
                $(s.serialize_field($json, &self.$field)?;)*
                $(match &self.$optional {
                    Some(value) => s.serialize_field($ojson, value)?,
                    None => s.skip_field($ojson)?,
                })*
                s.end()
            }
        }
    };
}

resource!(ServiceExport, "ServiceExport", "serviceexports", "multicluster.x-k8s.io", "v1beta1",
    NamespaceResourceScope, [spec: "spec"], [status: "status"]);
resource!(ServiceImport, "ServiceImport", "serviceimports", "multicluster.x-k8s.io", "v1beta1",
    NamespaceResourceScope, [spec: "spec"], [status: "status"]);
resource!(ClusterProperty, "ClusterProperty", "clusterproperties", "about.k8s.io", "v1alpha1",
    ClusterResourceScope, [spec: "spec"], []);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn resource_identity() {
        assert_eq!(ServiceExport::api_version(&()), MCS_API_VERSION);
        assert_eq!(<ServiceImport as k8s_openapi::Resource>::GROUP, MCS_GROUP);
        assert_eq!(
            <ServiceExport as k8s_openapi::Resource>::VERSION,
            MCS_VERSION
        );
        assert_eq!(
            <ClusterProperty as k8s_openapi::Resource>::GROUP,
            ABOUT_GROUP
        );
        assert_eq!(
            <ClusterProperty as k8s_openapi::Resource>::VERSION,
            ABOUT_VERSION
        );
        assert_eq!(ServiceImport::kind(&()), "ServiceImport");
        assert_eq!(
            ServiceImport::url_path(&(), Some("shop")),
            "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceimports"
        );
        assert_eq!(
            ServiceExport::url_path(&(), Some("shop")),
            "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceexports"
        );
        assert_eq!(
            ClusterProperty::url_path(&(), None),
            "/apis/about.k8s.io/v1alpha1/clusterproperties"
        );
    }

    #[test]
    fn service_import_round_trips_the_crd_field_names() {
        let wire = json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1",
            "kind": "ServiceImport",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "ports": [{"name": "http", "protocol": "TCP", "appProtocol": "http", "port": 80}],
                "ips": ["10.96.0.9", "fd00::9"],
                "type": "ClusterSetIP",
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10}},
                "ipFamilies": ["IPv4", "IPv6"],
                "internalTrafficPolicy": "Cluster",
                "trafficDistribution": "PreferClose",
            },
            "status": {"clusters": [{"cluster": "east"}, {"cluster": "west"}]},
        });
        let si: ServiceImport = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(si.spec.type_, CLUSTER_SET_IP);
        assert_eq!(si.spec.ports[0].app_protocol.as_deref(), Some("http"));
        assert_eq!(si.status.as_ref().unwrap().clusters[1].cluster, "west");
        assert_eq!(serde_json::to_value(&si).unwrap(), wire);
    }

    #[test]
    fn required_fields_are_written_and_empty_ones_left_out() {
        let si = ServiceImport {
            spec: ServiceImportSpec {
                type_: HEADLESS.into(),
                ..ServiceImportSpec::default()
            },
            ..ServiceImport::default()
        };
        assert_eq!(
            serde_json::to_value(&si).unwrap(),
            json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
                   "metadata": {}, "spec": {"ports": [], "type": "Headless"}})
        );
        let port = ServicePort {
            port: 53,
            ..ServicePort::default()
        };
        assert_eq!(serde_json::to_value(&port).unwrap(), json!({"port": 53}));
    }

    #[test]
    fn service_export_and_cluster_property_read() {
        let se: ServiceExport = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1",
            "kind": "ServiceExport",
            "metadata": {"name": "web", "namespace": "shop",
                         "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"exportedLabels": {"tier": "gold"},
                     "exportedAnnotations": {"note": "x"}},
            "status": {"conditions": [{"type": "Valid", "status": "True", "reason": "Valid",
                                       "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        assert_eq!(se.spec.exported_labels["tier"], "gold");
        assert_eq!(se.status.as_ref().unwrap().conditions[0].type_, "Valid");
        let written = serde_json::to_value(&se).unwrap();
        assert_eq!(written["kind"], "ServiceExport");
        assert_eq!(written["spec"]["exportedAnnotations"]["note"], "x");

        // a bare export (no spec, no status) reads too
        let bare: ServiceExport =
            serde_json::from_value(json!({"metadata": {"name": "web"}})).unwrap();
        assert!(bare.status.is_none());

        let cp: ClusterProperty = serde_json::from_value(json!({
            "apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
            "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "east"},
        }))
        .unwrap();
        assert_eq!(cp.spec.value, "east");
        assert_eq!(
            serde_json::to_value(&cp).unwrap()["apiVersion"],
            "about.k8s.io/v1alpha1"
        );
    }
}
