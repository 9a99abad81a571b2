//! Held ports ([`Held`]): a live attachment in another network namespace holding the port.
//! - `a_second_attachment_stacks_in_front_and_the_older_keeps_its_rules`: CNI ADD stacks
//!   (its DNAT inserted first, nothing of the older deleted or rewritten), the newer's DEL
//!   deletes only its own rules, the older's manifest is as it was.
//! - `an_older_added_again_goes_in_front_and_the_newer_no_longer_names_it`: `stacked_on`
//!   says who is in front, also after the older's re-ADD.
//! - `with_refuse_the_second_attachment_is_refused_and_writes_nothing`: `Held::Refuse`.
//! - `a_hook_container_is_refused_over_a_live_attachment`: the hooks refuse (Docker's,
//!   podman's and Kubernetes' users expect it); a CNI ADD over a hook container stacks.
//! - `a_dead_holder_is_still_replaced`: its rules deleted and its manifest gone first.
//! - `a_member_of_the_holders_namespace_still_shares`: sharing is unchanged by `Stack`.
//! - `a_holder_in_another_backend_is_named_so`: the newest first holds within one backend only.
//! - `a_hook_container_joins_a_namespace_whose_holder_is_stacked_on_another` and
//!   `a_cni_joiner_of_a_stacked_holder_shares_and_stacks_on_nothing`: a holder the joiner's
//!   in-namespace holder stacks on is no claim against the joiner; a joiner that only shares
//!   records no `stacked_on`; a port of its own still stacks (or, hooks, refuses); a holder in
//!   front of the joiner's still refuses a hook container.

use super::*;
use crate::backend::{Backend, Driver};
use crate::model::oci::ContainerId;
use crate::model::portspec::parse_mappings;
use crate::ops::testing::*;
use crate::ops::{Removed, remove_recorded};
use crate::state::ledger::{CniAttachment, Ledger};
use crate::state::sharing::Membership;

const NFT: Backend = Backend::IptablesNft;

fn id(s: &str) -> ContainerId {
    s.parse().unwrap()
}

/// A host where [`PID`] runs in namespace 1 ([`NETNS_PATH`]), and `/run/netns/b` names
/// namespace 2.
fn two_namespaces() -> FakeHost {
    fake_host().with_namespace("/run/netns/b", netns(2))
}

/// ADD of attachment `name`+eth0 at namespace path `path`, address `addr`, asking 8080:80.
fn add(ctx: &Context, name: &str, path: &str, addr: &str, held: Held) -> Result<Created, Error> {
    add_ports(ctx, (name, path, addr), "8080:80", held)
}

/// ADD of attachment `name`+eth0 at namespace path `path`, address `addr`, asking `ports`.
fn add_ports(
    ctx: &Context,
    (name, path, addr): (&str, &str, &str),
    ports: &str,
    held: Held,
) -> Result<Created, Error> {
    let addr: IpAddr = addr.parse().unwrap();
    let addresses = move || Ok(vec![addr.into()]);
    let path = std::path::PathBuf::from(path);
    create(
        ctx,
        &Creating {
            id: id(&format!("{name}+eth0")),
            pid: None,
            bundle: None,
            mappings: parse_mappings(ports).unwrap(),
            addresses: &addresses,
            refuse_conflicts: false,
            held,
            pod: None,
            netns: ctx.host.netns_at(&path).ok(),
            cni: Some(CniAttachment {
                container_id: name.into(),
                ifname: "eth0".into(),
                network: "net".into(),
                netns_path: Some(path),
                deleted: false,
            }),
        },
    )
}

/// The driver's calls since the last look, of one kind.
fn asked(fake: &FakeDriver, kind: fn(&Call) -> bool) -> usize {
    fake.take_calls().iter().filter(|c| kind(c)).count()
}

fn install(call: &Call) -> bool {
    matches!(call, Call::Install(..))
}

fn remove(call: &Call) -> bool {
    matches!(call, Call::Remove(..))
}

/// The first rule of the DNAT chain in the IPv4 nat table.
fn first_dnat(fake: &FakeDriver) -> String {
    let nat = fake.lines(crate::model::family::Family::Ipv4, "nat");
    let first = nat
        .iter()
        .find(|l| l.starts_with("-A NATLEDGER-HOSTPORTS "));
    first.cloned().unwrap_or_default()
}

#[test]
fn a_second_attachment_stacks_in_front_and_the_older_keeps_its_rules() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", NETNS_PATH, "10.77.0.2", Held::Stack).unwrap();
    let older = ctx.ledger.load(&id("a+eth0")).unwrap().unwrap();

    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let created = add(&ctx, "b", "/run/netns/b", "10.77.0.3", Held::Stack).unwrap();
    assert_eq!(created, Created::Installed { rules: 4 });
    let calls = fake.calls();
    assert_eq!(asked(&fake, install), 1, "one install: {calls:?}");
    assert!(!calls.iter().any(remove), "nothing of the older removed");
    let first = first_dnat(&fake);
    assert!(
        first.starts_with("-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080")
            && first.contains("natledger:b+eth0"),
        "{first}"
    );
    assert_eq!(fake.holding("natledger:a+eth0"), 4);
    assert_eq!(ctx.ledger.load(&id("a+eth0")).unwrap().unwrap(), older);
    let newer = ctx.ledger.load(&id("b+eth0")).unwrap().unwrap();
    assert_eq!(newer.stacked_on, [id("a+eth0")]);

    // The newer's DEL deletes its own rules only; the older's manifest stays as it was.
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    assert!(matches!(
        remove_recorded(&ctx, &id("b+eth0")).unwrap(),
        Removed::Done { .. }
    ));
    assert!(asked(&fake, remove) > 0);
    assert_eq!(fake.holding("natledger:b+eth0"), 0);
    assert_eq!(fake.holding("natledger:a+eth0"), 4);
    assert_eq!(ctx.ledger.load(&id("a+eth0")).unwrap().unwrap(), older);
    assert!(ctx.ledger.load(&id("b+eth0")).unwrap().is_none());
}

#[test]
fn with_refuse_the_second_attachment_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", NETNS_PATH, "10.77.0.2", Held::Stack).unwrap();

    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let err = add(&ctx, "b", "/run/netns/b", "10.77.0.3", Held::Refuse).unwrap_err();
    assert!(matches!(err, Error::PortClaimed { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "host port 8080:80/tcp is held by live container a+eth0 \
         (cni net=net ifname=eth0 container=a) in another network namespace"
    );
    assert!(fake.calls().is_empty(), "nothing run");
    assert!(ctx.ledger.load(&id("b+eth0")).unwrap().is_none());
}

#[test]
fn a_hook_container_is_refused_over_a_live_attachment() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", "/run/netns/b", "10.77.0.2", Held::Stack).unwrap();

    // The hook container c1 (PID, namespace 1) asks for 8080:80.
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let err = create_runtime(&ctx, &input(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("held by live container a+eth0")
            && err.ends_with("in another network namespace"),
        "{err}"
    );
    assert!(fake.calls().is_empty());
    assert!(ctx.ledger.load(&id("c1")).unwrap().is_none());

    // The other way round, a CNI ADD over a live hook container stacks.
    let dir = tempfile::tempdir().unwrap();
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &input(dir.path())).unwrap();
    add(&ctx, "a", "/run/netns/b", "10.77.0.3", Held::Stack).unwrap();
    assert_eq!(fake.calls().len(), 2);
    assert_eq!(ctx.ledger.list().unwrap().len(), 2);
}

#[test]
fn a_dead_holder_is_still_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", "/run/netns/b", "10.77.0.2", Held::Stack).unwrap();
    // Its namespace goes (`ip netns del`).
    host.set_namespace(
        std::path::Path::new("/run/netns/b"),
        Err(std::io::ErrorKind::NotFound),
    );

    // Two restores delete the dead holder's rules, one writes the new ones.
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "b", NETNS_PATH, "10.77.0.3", Held::Stack).unwrap();
    let calls = fake.calls();
    let removed_first = calls.iter().position(remove) < calls.iter().position(install);
    assert!(calls.iter().any(remove) && removed_first, "{calls:?}");
    assert_eq!(fake.holding("natledger:a+eth0"), 0);
    assert_eq!(fake.holding("natledger:b+eth0"), 4);
    assert!(ctx.ledger.load(&id("a+eth0")).unwrap().is_none());
}

#[test]
fn a_member_of_the_holders_namespace_still_shares() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", NETNS_PATH, "10.77.0.2", Held::Stack).unwrap();
    // The hook container c1 runs in namespace 1, the attachment's.
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    assert_eq!(
        create_runtime(&ctx, &input(dir.path())).unwrap(),
        Created::Installed { rules: 0 }
    );
    assert!(fake.calls().is_empty());
    let c1 = ctx.ledger.load(&id("c1")).unwrap().unwrap();
    assert_eq!(c1.shares[0].holder, id("a+eth0"));
    assert_eq!(
        ctx.ledger.load(&id("a+eth0")).unwrap().unwrap().shared_by,
        [id("c1")]
    );
}

#[test]
fn an_older_added_again_goes_in_front_and_the_newer_no_longer_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", NETNS_PATH, "10.77.0.2", Held::Stack).unwrap();
    add(&ctx, "b", "/run/netns/b", "10.77.0.3", Held::Stack).unwrap();
    // a again (the runtime retries it): its earlier rules go (one restore per table), its
    // new ones go in front of b's.
    add(&ctx, "a", NETNS_PATH, "10.77.0.2", Held::Stack).unwrap();
    let a = ctx.ledger.load(&id("a+eth0")).unwrap().unwrap();
    let b = ctx.ledger.load(&id("b+eth0")).unwrap().unwrap();
    assert_eq!(a.stacked_on, [id("b+eth0")]);
    assert!(b.stacked_on.is_empty(), "{:?}", b.stacked_on);
}

#[test]
fn a_holder_in_another_backend_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let host = two_namespaces();
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "a", NETNS_PATH, "10.77.0.2", Held::Stack).unwrap();
    let holder = ctx.ledger.load(&id("a+eth0")).unwrap().unwrap();
    let mapping = &holder.mappings[0];
    let judge = |backend| {
        let newer = id("b+eth0");
        held::judge(
            Held::Stack,
            backend,
            &newer,
            mapping,
            &holder,
            &holder,
            Membership::OtherNamespace,
        )
        .unwrap()
    };
    assert_eq!(judge(NFT).elsewhere, None);
    assert_eq!(judge(Backend::OwnNftables).elsewhere, Some(NFT));
}

/// A host where attachment a is in namespace 3 (`/run/netns/a`), b in namespace 1
/// ([`NETNS_PATH`], where the hook container [`PID`] runs too) stacked on a, both on 8080.
fn b_stacked_on_a(dir: &std::path::Path) -> FakeHost {
    let host = fake_host().with_namespace("/run/netns/a", netns(3));
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir), &fake, &drivers, &host);
    add(&ctx, "a", "/run/netns/a", "10.77.0.2", Held::Stack).unwrap();
    add(&ctx, "b", NETNS_PATH, "10.77.0.3", Held::Stack).unwrap();
    let b = ctx.ledger.load(&id("b+eth0")).unwrap().unwrap();
    assert_eq!(b.stacked_on, [id("a+eth0")]);
    host
}

#[test]
fn a_hook_container_joins_a_namespace_whose_holder_is_stacked_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let host = b_stacked_on_a(dir.path());
    // c1 (PID, namespace 1, b's) asks 8080:80: it shares b's rules, a is no claim on it.
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    assert_eq!(
        create_runtime(&ctx, &input(dir.path())).unwrap(),
        Created::Installed { rules: 0 }
    );
    assert!(fake.calls().is_empty(), "nothing written");
    let c1 = ctx.ledger.load(&id("c1")).unwrap().unwrap();
    assert_eq!(c1.shares[0].holder, id("b+eth0"));
    assert!(c1.stacked_on.is_empty());

    // With a port of its own that a holds too (8081), the hook still refuses.
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host().with_namespace("/run/netns/a", netns(3));
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let a = ("a", "/run/netns/a", "10.77.0.2");
    add_ports(&ctx, a, "8080-8081:80-81", Held::Stack).unwrap();
    add(&ctx, "b", NETNS_PATH, "10.77.0.3", Held::Stack).unwrap();
    let mut both = input(dir.path());
    both.annotations
        .insert("io.natledger.ports".into(), "8080-8081:80-81".into());
    let err = create_runtime(&ctx, &both).unwrap_err().to_string();
    assert!(
        err.starts_with("host port 8081:81/tcp is held by live container a+eth0"),
        "{err}"
    );

    // A holder in front of b's (c, stacked on b) still refuses the hook container.
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host().with_namespace("/run/netns/c", netns(3));
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    add(&ctx, "b", NETNS_PATH, "10.77.0.3", Held::Stack).unwrap();
    add(&ctx, "c", "/run/netns/c", "10.77.0.4", Held::Stack).unwrap();
    let err = create_runtime(&ctx, &input(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("held by live container c+eth0"), "{err}");
}

#[test]
fn a_cni_joiner_of_a_stacked_holder_shares_and_stacks_on_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let host = b_stacked_on_a(dir.path());
    // j, another attachment in namespace 1 (b's), asks 8080:80: it shares b's rules.
    let fake = FakeDriver::new(NFT);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let j = ("j", NETNS_PATH, "10.77.0.3");
    assert_eq!(
        add_ports(&ctx, j, "8080:80", Held::Stack).unwrap(),
        Created::Installed { rules: 0 }
    );
    assert!(fake.calls().is_empty(), "nothing written");
    let joiner = ctx.ledger.load(&id("j+eth0")).unwrap().unwrap();
    assert_eq!(joiner.shares[0].holder, id("b+eth0"));
    assert!(joiner.stacked_on.is_empty(), "{:?}", joiner.stacked_on);
    // Refuse changes nothing for a port only shared.
    let k = ("k", NETNS_PATH, "10.77.0.3");
    add_ports(&ctx, k, "8080:80", Held::Refuse).unwrap();

    // A port of its own that a holds too (8081) still stacks on a, for that port.
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host().with_namespace("/run/netns/a", netns(3));
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let a = ("a", "/run/netns/a", "10.77.0.2");
    add_ports(&ctx, a, "8080-8081:80-81", Held::Stack).unwrap();
    add(&ctx, "b", NETNS_PATH, "10.77.0.3", Held::Stack).unwrap();
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let l = ("l", NETNS_PATH, "10.77.0.3");
    add_ports(&ctx, l, "8080-8081:80-81", Held::Stack).unwrap();
    let joiner = ctx.ledger.load(&id("l+eth0")).unwrap().unwrap();
    assert_eq!(joiner.mappings, parse_mappings("8081:81").unwrap());
    assert_eq!(joiner.stacked_on, [id("a+eth0")]);
}
