use super::*;
use serde_json::json;

fn slice(address_type: &str, addresses: &[&str]) -> EndpointSlice {
    let endpoints: Vec<_> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": "shop"},
        "addressType": address_type,
        "endpoints": endpoints,
    }))
    .expect("a slice")
}

fn local() -> LocalNetworks {
    let mut l = LocalNetworks::default();
    l.add_address("10.250.2.1".parse().unwrap(), Refusal::LocalApiServer);
    l.add_address("192.168.1.10".parse().unwrap(), Refusal::LocalNode);
    l.add_net("10.202.0.0/16".parse().unwrap(), Refusal::LocalPodNetwork);
    l.add_net(
        "10.96.0.0/12".parse().unwrap(),
        Refusal::LocalServiceNetwork,
    );
    l.add_net("fd00:2::/64".parse().unwrap(), Refusal::LocalPodNetwork);
    l
}

fn addresses(s: &EndpointSlice) -> Vec<&str> {
    s.endpoints
        .iter()
        .flat_map(|e| e.addresses.iter().map(String::as_str))
        .collect()
}

#[test]
fn local_addresses_are_refused_whatever_the_allowlist() {
    let open = AddressPolicy::default();
    let wide = AddressPolicy {
        allowed: parse_cidrs("0.0.0.0/0,::/0").unwrap(),
        strict: true,
    };
    for policy in [&open, &wide] {
        let l = local();
        assert_eq!(policy.judge("10.250.2.1", &l), Err(Refusal::LocalApiServer));
        assert_eq!(policy.judge("192.168.1.10", &l), Err(Refusal::LocalNode));
        assert_eq!(
            policy.judge("10.202.7.9", &l),
            Err(Refusal::LocalPodNetwork)
        );
        assert_eq!(
            policy.judge("10.96.0.10", &l),
            Err(Refusal::LocalServiceNetwork)
        );
        assert_eq!(policy.judge("fd00:2::5", &l), Err(Refusal::LocalPodNetwork));
        // an IPv4-mapped IPv6 address is the IPv4 address it maps
        assert_eq!(
            policy.judge("::ffff:10.202.7.9", &l),
            Err(Refusal::LocalPodNetwork)
        );
        assert_eq!(policy.judge("127.0.0.1", &l), Err(Refusal::Reserved));
        assert_eq!(policy.judge("169.254.169.254", &l), Err(Refusal::Reserved));
        assert_eq!(policy.judge("fe80::1", &l), Err(Refusal::Reserved));
        assert_eq!(policy.judge("0.0.0.0", &l), Err(Refusal::Reserved));
        assert_eq!(
            policy.judge("db.example.com", &l),
            Err(Refusal::NotAnAddress)
        );
        // a node's address is refused exactly: its neighbour may be another cluster's pod
        assert_eq!(policy.judge("192.168.1.11", &l), Ok(()));
        assert_eq!(policy.judge("10.201.0.5", &l), Ok(()));
    }
}

#[test]
fn an_allowlist_admits_only_its_networks_and_strict_mode_needs_one() {
    let l = local();
    let east = AddressPolicy {
        allowed: parse_cidrs(" 10.201.0.0/16 , fd00:1::/64").unwrap(),
        strict: false,
    };
    assert_eq!(east.judge("10.201.3.4", &l), Ok(()));
    assert_eq!(east.judge("fd00:1::9", &l), Ok(()));
    assert_eq!(east.judge("10.203.0.1", &l), Err(Refusal::NotAllowed));
    let strict = AddressPolicy {
        allowed: vec![],
        strict: true,
    };
    assert_eq!(strict.judge("10.201.3.4", &l), Err(Refusal::NoAllowlist));
    let strict_east = AddressPolicy {
        strict: true,
        ..east
    };
    assert_eq!(strict_east.judge("10.201.3.4", &l), Ok(()));
}

#[test]
fn cidrs_parse_or_say_why_in_one_bounded_line() {
    assert_eq!(parse_cidrs("").unwrap(), vec![]);
    assert_eq!(
        parse_cidrs("10.20.1.7/16").unwrap(),
        vec!["10.20.0.0/16".parse::<IpNet>().unwrap()]
    );
    let bare = parse_cidrs("10.20.0.1").unwrap_err();
    assert!(bare.contains("is not a CIDR"), "{bare}");
    let hostile = parse_cidrs(&format!("{}\nlevel=error", "x".repeat(500))).unwrap_err();
    assert!(!hostile.contains('\n') && hostile.len() < 200, "{hostile}");
}

#[test]
fn admit_borrows_a_clean_slice_and_drops_refused_endpoints() {
    let l = local();
    let open = AddressPolicy::default();
    let clean = slice("IPv4", &["10.201.0.5", "10.201.0.6"]);
    let (s, refused) = admit(&clean, &open, &l);
    assert!(matches!(s, Cow::Borrowed(_)));
    assert!(refused.is_empty());

    let hostile = slice(
        "IPv4",
        &[
            "10.201.0.5",
            "10.250.2.1",
            "10.202.0.9",
            "10.202.0.10",
            "10.96.0.1",
            "127.0.0.1",
        ],
    );
    let (s, refused) = admit(&hostile, &open, &l);
    assert_eq!(addresses(&s), vec!["10.201.0.5"]);
    assert_eq!(refused.total(), 5);
    assert_eq!(refused.counts[&Refusal::LocalPodNetwork], 2);
    assert_eq!(refused.examples.len(), EXAMPLES);
    let line = refused.describe();
    assert!(
        line.starts_with("5 address(es) refused: 10.250.2.1 (the local API server)"),
        "{line}"
    );
    assert!(line.ends_with(" and 1 more"), "{line}");
}

#[test]
fn fqdn_slices_are_refused_whole() {
    let l = local();
    let fqdn = slice("FQDN", &["db.example.com"]);
    let (s, refused) = admit(&fqdn, &AddressPolicy::default(), &l);
    assert!(s.endpoints.is_empty());
    assert_eq!(refused.counts[&Refusal::Fqdn], 1);
    assert_eq!(refused.examples[0].0, "(not an address)");
}

#[test]
fn every_reason_is_listed() {
    let all = [
        Refusal::LocalNode,
        Refusal::LocalPodNetwork,
        Refusal::LocalServiceNetwork,
        Refusal::LocalApiServer,
        Refusal::LocalConfigured,
        Refusal::Reserved,
        Refusal::NotAllowed,
        Refusal::NoAllowlist,
        Refusal::Fqdn,
        Refusal::NotAnAddress,
    ];
    let reasons: Vec<&str> = all.iter().map(|r| r.reason()).collect();
    assert_eq!(reasons, Refusal::REASONS);
}
