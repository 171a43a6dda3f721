//! Smoke tests proving the test bed is made of real, separate kube-apiservers with real RBAC.
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::{LOCAL, REMOTE, client, config, eventually, namespace, obj};

fn service(name: &str) -> Service {
    obj(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
}

#[tokio::test]
async fn a_service_lives_in_one_cluster_only_and_gets_a_cluster_ip() {
    let ns = namespace("bed-separate").await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);

    let created = east
        .create(&PostParams::default(), &service("only-east"))
        .await
        .unwrap();
    let ip = created
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the API server allocates a ClusterIP");
    assert!(
        ip.starts_with("10.96."),
        "east allocates from its own range 10.96.0.0/16, got {ip}"
    );

    assert!(east.get_opt("only-east").await.unwrap().is_some());
    assert!(
        west.get_opt("only-east").await.unwrap().is_none(),
        "west is a separate cluster"
    );
}

async fn token_for(sa: &str, ns: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client(REMOTE).await, ns);
    sas.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": sa}})),
    )
    .await
    .unwrap();
    support::mint_token(REMOTE, ns, sa).await
}

#[tokio::test]
async fn rbac_is_enforced_for_a_token_from_token_request() {
    let ns = namespace("bed-rbac").await;
    let token = token_for("reader", &ns.name).await;

    let mut cfg = config(REMOTE).await;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let as_reader: Api<Service> = Api::namespaced(Client::try_from(cfg).unwrap(), &ns.name);

    let err = as_reader
        .list(&ListParams::default())
        .await
        .expect_err("no RBAC yet");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 403, "forbidden without a binding: {s:?}"),
        other => panic!("expected 403, got {other:?}"),
    }

    let admin = client(REMOTE).await;
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns.name);
    roles
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "list-services"},
                "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]})),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin, &ns.name);
    bindings
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-services"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns.name}]})),
        )
        .await
        .unwrap();

    eventually(
        "the RoleBinding to take effect",
        Duration::from_secs(20),
        || async {
            as_reader
                .list(&ListParams::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

#[tokio::test]
async fn tokens_of_one_cluster_are_not_valid_in_the_other() {
    let ns = namespace("bed-tokens").await;
    let token = token_for("stranger", &ns.name).await;
    let mut cfg = config(LOCAL).await;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let api: Api<Service> = Api::namespaced(Client::try_from(cfg).unwrap(), &ns.name);
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 401, "east's token is unknown to west: {s:?}")
        }
        other => panic!("expected 401 Unauthorized, got {other:?}"),
    }
}

fn slice(name: &str, endpoints: usize) -> EndpointSlice {
    let eps: Vec<_> = (0..endpoints)
        .map(|i| json!({"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)]}))
        .collect();
    obj(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "big"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps
    }))
}

#[tokio::test]
async fn an_endpoint_slice_holds_at_most_1000_endpoints() {
    let ns = namespace("bed-slice-limit").await;
    let api: Api<EndpointSlice> = Api::namespaced(client(REMOTE).await, &ns.name);
    let ok = api
        .create(&PostParams::default(), &slice("full", 1000))
        .await
        .expect("1000 fit");
    assert_eq!(ok.endpoints.len(), 1000);
    match api
        .create(&PostParams::default(), &slice("over", 1001))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "1001 endpoints are invalid: {s:?}"),
        other => panic!("expected 422 Invalid for 1001 endpoints, got {other:?}"),
    }
}
