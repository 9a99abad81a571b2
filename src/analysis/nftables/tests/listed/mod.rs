//! Each owner's ruleset as nft lists it (the fixtures of tests/fixtures/nftables-dumps,
//! loaded into a namespace once and listed by `nft -a list ruleset`, kept in `listed/`): the
//! findings expected, and none on the healthy ones.

use super::*;

/// The owners' rulesets (tests/fixtures/nftables-dumps) as `nft -a list ruleset` printed
/// them once loaded (nft 1.0.6), read by `model::ruleset::parse_text`.
fn fixture(name: &str) -> Ruleset {
    let text = std::fs::read_to_string(format!(
        "{}/src/analysis/nftables/tests/listed/{name}.nft",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    crate::model::ruleset::parse_text(&text).unwrap()
}

fn on(rs: &Ruleset, listeners: &[u16], live: &[&str]) -> Vec<NftFinding> {
    check(
        rs,
        &host(listeners.iter().map(|p| listener(*p)).collect(), live),
    )
}

#[test]
fn owners_dumps_as_nft_lists_them() {
    let endpoints = ["10.180.0.1", "10.180.0.3", "10.180.0.4", "10.180.0.5"];
    let kp = fixture("kube-proxy");
    let found = on(&kp, &[22, 30080, 30081], &endpoints);
    assert_eq!(
        kinds(&found),
        [
            (NftKind::RejectedListener, 30080),
            (NftKind::HijackedListener, 30081)
        ],
        "{found:#?}"
    );
    assert_eq!(
        found[0].fix,
        ["nft delete element ip kube-proxy no-endpoint-nodeports { tcp . 30080 }"]
    );
    assert_eq!(
        found[1].fix,
        ["nft delete element ip kube-proxy service-nodeports { tcp . 30081 }"]
    );
    assert!(on(&kp, &[22], &endpoints).is_empty());

    let nv = fixture("netavark");
    let found = on(&nv, &[22], &["10.88.0.117", "10.88.0.80"]);
    assert_eq!(
        kinds(&found),
        [(NftKind::Shadowed, 8080), (NftKind::DeadTarget, 8080)],
        "{found:#?}"
    );
    assert_eq!(
        found[0].fix,
        ["nft delete rule inet netavark nv_2f259bab_10_88_0_0_nm16_dnat handle 32"]
    );
    assert_eq!(found[1].place.handle, Some(32));

    // firewalld's defaults reject what no zone allows, for every port alike: not a finding.
    let fw = fixture("firewalld");
    assert!(on(&fw, &[22, 8080], &["192.168.0.50", "fd00::50"]).is_empty());
    // Its forward port to an address nothing holds is a dead target.
    let dead = on(&fw, &[], &[]);
    assert!(
        dead.iter()
            .any(|f| f.kind == NftKind::DeadTarget && f.port == 2222),
        "{dead:#?}"
    );
    let docker = fixture("docker");
    assert!(on(&docker, &[22], &["172.17.0.2"]).is_empty());
}
