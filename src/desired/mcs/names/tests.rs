use super::*;

fn remote(name: &str) -> Identity {
    Identity::remote(name, Some(&format!("id-{name}")))
}

fn claim(who: &Identity, wants: Option<&str>) -> Claim {
    Claim {
        who: who.clone(),
        wants: wants.map(str::to_string),
    }
}

fn none() -> BTreeSet<String> {
    BTreeSet::new()
}

fn named(n: &str) -> Grant {
    Grant::Named(n.into())
}

fn refused(n: &str, holder: &Identity) -> Grant {
    Grant::Refused {
        wanted: n.into(),
        holder: holder.clone(),
    }
}

#[test]
fn a_newcomer_claiming_a_held_name_is_refused_and_the_holder_keeps_it() {
    let (east, north) = (remote("east"), remote("north"));
    let mut h = Holders::default();
    let g = h.settle(
        &[claim(&east, Some("east")), claim(&north, Some("north"))],
        Some(&none()),
    );
    assert_eq!(g[&east], named("east"));
    assert_eq!(g[&north], named("north"));
    // north now claims east's name
    let claims = [claim(&east, Some("east")), claim(&north, Some("east"))];
    let g = h.settle(&claims, Some(&none()));
    assert_eq!(g[&east], named("east"), "the holder keeps it");
    assert_eq!(g[&north], refused("east", &east));
    // east unreachable: its claim is not read again, and it keeps its name
    let g = h.settle(
        &[claim(&east, None), claim(&north, Some("east"))],
        Some(&none()),
    );
    assert_eq!(g[&east], named("east"));
    assert_eq!(g[&north], refused("east", &east));
    // north withdraws: its own name again
    let g = h.settle(
        &[claim(&east, None), claim(&north, Some("north"))],
        Some(&none()),
    );
    assert_eq!(g[&north], named("north"));
    assert_eq!(h.holder("east"), Some(&east));
}

#[test]
fn the_local_cluster_always_holds_its_own_name() {
    let east = remote("east");
    let mut h = Holders::default();
    let g = h.settle(
        &[
            claim(&Identity::Local, Some("west")),
            claim(&east, Some("west")),
        ],
        Some(&none()),
    );
    assert_eq!(g[&Identity::Local], named("west"));
    assert_eq!(g[&east], refused("west", &Identity::Local));
    // the local cluster renames itself to a name a remote holds: the remote loses it
    let mut h = Holders::default();
    h.settle(
        &[
            claim(&Identity::Local, Some("west")),
            claim(&east, Some("east")),
        ],
        Some(&none()),
    );
    let g = h.settle(
        &[
            claim(&Identity::Local, Some("east")),
            claim(&east, Some("east")),
        ],
        Some(&none()),
    );
    assert_eq!(g[&Identity::Local], named("east"));
    assert_eq!(g[&east], refused("east", &Identity::Local));
}

#[test]
fn a_name_given_by_the_operator_waits_for_its_remote_and_goes_to_it() {
    let (east, north) = (remote("east"), remote("north"));
    let mut h = Holders::default();
    // a restart: north's claim of east's name is read before east's own
    let g = h.settle(
        &[claim(&east, None), claim(&north, Some("east"))],
        Some(&none()),
    );
    assert_eq!(g[&north], Grant::Pending, "waits for east's word");
    assert_eq!(g[&east], Grant::Pending);
    let g = h.settle(
        &[claim(&east, Some("east")), claim(&north, Some("east"))],
        Some(&none()),
    );
    assert_eq!(g[&east], named("east"));
    assert_eq!(g[&north], refused("east", &east));
}

#[test]
fn nothing_is_granted_before_every_source_of_remotes_is_listed() {
    let north = remote("north");
    let mut h = Holders::default();
    let claims = [
        claim(&Identity::Local, Some("west")),
        claim(&north, Some("east")),
    ];
    let g = h.settle(&claims, None);
    assert_eq!(
        g[&Identity::Local],
        named("west"),
        "the local name needs no one"
    );
    assert_eq!(g[&north], Grant::Pending);
    // the Secrets listed: east is not among them, so its name is free
    let g = h.settle(&claims, Some(&none()));
    assert_eq!(g[&north], named("east"));
}

#[test]
fn a_name_a_remote_secret_gives_waits_while_that_remote_cannot_be_read() {
    let north = remote("north");
    let mut h = Holders::default();
    // east's Secret is listed, but its server does not answer: east is not read here
    let named = BTreeSet::from(["east".to_string(), "north".to_string()]);
    let g = h.settle(&[claim(&north, Some("east"))], Some(&named));
    assert_eq!(g[&north], Grant::Pending);
    let g = h.settle(&[claim(&north, Some("north"))], Some(&named));
    assert_eq!(g[&north], Grant::Named("north".into()));
}

#[test]
fn among_newcomers_the_operators_name_then_the_first_remote_name_wins() {
    let (a, b, c) = (remote("a"), remote("b"), remote("c"));
    let mut h = Holders::default();
    let g = h.settle(
        &[claim(&c, Some("shared")), claim(&b, Some("shared"))],
        Some(&none()),
    );
    assert_eq!(g[&b], named("shared"));
    assert_eq!(g[&c], refused("shared", &b));
    let mut h = Holders::default();
    let g = h.settle(&[claim(&a, Some("c")), claim(&c, Some("c"))], Some(&none()));
    assert_eq!(g[&c], named("c"), "c's own name, though a sorts first");
    assert_eq!(g[&a], refused("c", &c));
}

#[test]
fn a_holder_that_leaves_or_renames_frees_its_name() {
    let (east, north) = (remote("east"), remote("north"));
    let mut h = Holders::default();
    h.settle(
        &[claim(&east, Some("east")), claim(&north, Some("east"))],
        Some(&none()),
    );
    // east goes by another name: the name is free, and north's claim gets it
    let g = h.settle(
        &[claim(&east, Some("cluster-e")), claim(&north, Some("east"))],
        Some(&none()),
    );
    assert_eq!(g[&east], named("cluster-e"));
    assert_eq!(g[&north], named("east"));
    // north leaves: its name is free
    h.settle(&[claim(&east, Some("cluster-e"))], Some(&none()));
    assert_eq!(h.holder("east"), None);
}

#[test]
fn another_cluster_behind_the_same_remote_name_is_another_identity() {
    let (was, now) = (
        Identity::remote("east", Some("uid-1")),
        Identity::remote("east", Some("uid-2")),
    );
    assert_ne!(was, now);
    let mut h = Holders::default();
    h.settle(&[claim(&was, Some("east"))], Some(&none()));
    let g = h.settle(&[claim(&now, Some("east"))], Some(&none()));
    assert_eq!(g[&now], named("east"), "the first one is not read any more");
    assert_eq!(
        now.to_string(),
        "remote east (cluster id uid-2)",
        "how a refusal names it"
    );
}
