//! A pod member sharing part of a holder's mappings when either side's consecutive ports
//! were merged into a range (`portspec::bounds::coalesce`), adopted from review 2:
//! - `one_port_of_a_holders_merged_run_is_shared`: holder 8080-8081, member 8081.
//! - `a_run_over_a_held_port_shares_it_and_holds_the_rest`: holder 8081, member 8080-8082.
//! - `a_member_of_a_pod_recorded_before_ranges_shares_its_singles`: the holder's singles,
//!   recorded by a release before ranges, against the same annotation merged now.
//! - `a_piece_of_a_run_forwarded_otherwise_is_refused`: 8080-8081 against a held 8081:81.

use super::tests::pod_member;
use super::*;
use crate::backend::{Backend, Driver};
use crate::model::oci::ContainerId;
use crate::model::portspec::parse_mappings;
use crate::ops::testing::*;
use crate::state::ledger::Ledger;
use crate::state::ledger::Shared;

fn id(s: &str) -> ContainerId {
    s.parse().unwrap()
}

fn list(spec: &str) -> Vec<PortMapping> {
    parse_mappings(spec).unwrap()
}

const NFT: Backend = Backend::IptablesNft;

/// The pod's sandbox holding `spec` (one restore), in a fresh state directory.
fn sandbox(dir: &std::path::Path, spec: &str) {
    let host = fake_host();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir), &fake, &drivers, &host);
    create_runtime(&ctx, &pod_member(dir, "sandbox", "sandbox", spec)).unwrap();
}

/// A member asking for `spec`; what it did, and how many installs it asked of the driver
/// (one restore each on iptables-nft).
fn member(dir: &std::path::Path, spec: &str) -> (Result<Created, String>, usize) {
    let host = fake_host();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir), &fake, &drivers, &host);
    let created =
        create_runtime(&ctx, &pod_member(dir, "app", "sandbox", spec)).map_err(|e| e.to_string());
    let installs = fake.calls().into_iter();
    (
        created,
        installs.filter(|c| matches!(c, Call::Install(..))).count(),
    )
}

fn load(dir: &std::path::Path, name: &str) -> Manifest {
    Ledger::new(dir).load(&id(name)).unwrap().unwrap()
}

#[test]
fn one_port_of_a_holders_merged_run_is_shared() {
    let dir = tempfile::tempdir().unwrap();
    sandbox(dir.path(), "8080:8080,8081:8081");
    assert_eq!(
        load(dir.path(), "sandbox").mappings,
        list("8080-8081:8080-8081")
    );
    let (created, calls) = member(dir.path(), "8081:8081");
    assert_eq!(created, Ok(Created::Installed { rules: 0 }));
    assert_eq!(calls, 0, "sharing writes no rule");
    let app = load(dir.path(), "app");
    assert!(app.mappings.is_empty() && app.rules.is_empty());
    assert_eq!(
        app.shares,
        [Shared {
            holder: id("sandbox"),
            mappings: list("8081:8081"),
        }]
    );
    assert_eq!(load(dir.path(), "sandbox").shared_by, [id("app")]);
}

#[test]
fn a_run_over_a_held_port_shares_it_and_holds_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    sandbox(dir.path(), "8081:8081");
    let (created, calls) = member(dir.path(), "8080:8080,8081:8081,8082:8082");
    // Two mappings of its own, 4 rules each on iptables-nft.
    assert_eq!(created, Ok(Created::Installed { rules: 8 }));
    assert_eq!(calls, 1);
    let app = load(dir.path(), "app");
    assert_eq!(app.mappings, list("8080:8080,8082:8082"));
    assert_eq!(app.shares[0].mappings, list("8081:8081"));
    let dports: Vec<String> = app
        .rules
        .iter()
        .flat_map(|r| {
            r.args()
                .windows(2)
                .filter(|w| w[0] == "--dport")
                .map(|w| w[1].clone())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        dports.iter().any(|p| p == "8080") && dports.iter().any(|p| p == "8082"),
        "{dports:?}"
    );
    assert!(!dports.iter().any(|p| p.contains("8081")), "{dports:?}");
}

/// A pod created before the upgrade (its holder recorded the singles, as every release
/// before issue 22 did); a member (re)created after it asks for the same annotation, which
/// create now merges. CRI-O copies the pod's annotations to every container.
#[test]
fn a_member_of_a_pod_recorded_before_ranges_shares_its_singles() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "8080:8080,8081:8081";
    sandbox(dir.path(), spec);
    {
        let ledger = Ledger::new(dir.path());
        let locked = ledger.lock().unwrap();
        let mut m = load(dir.path(), "sandbox");
        m.mappings = list(spec);
        locked.store(&m).unwrap();
    }
    let (created, calls) = member(dir.path(), spec);
    assert_eq!(created, Ok(Created::Installed { rules: 0 }));
    assert_eq!(calls, 0);
    let app = load(dir.path(), "app");
    assert!(app.mappings.is_empty());
    assert_eq!(app.shares[0].mappings, list(spec));
}

#[test]
fn a_piece_of_a_run_forwarded_otherwise_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    sandbox(dir.path(), "8081:81");
    let (created, calls) = member(dir.path(), "8080:8080,8081:8081");
    let err = created.unwrap_err();
    assert!(
        err.starts_with("host port 8081:8081/tcp differs from 8081:81/tcp"),
        "{err}"
    );
    assert_eq!(calls, 0);
    assert!(!Ledger::new(dir.path()).has_manifest(&id("app")));
}
