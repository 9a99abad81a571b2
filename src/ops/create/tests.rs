use super::*;
use crate::backend::{Backend, Driver};
use crate::model::oci::ContainerId;
use crate::model::portspec::parse_mappings;
use crate::ops::testing::*;
use crate::state::ledger::Ledger;
use crate::state::ledger::Shared;

/// One install per family, the manifest written around it (the restore batch it makes on
/// iptables-nft: `backend::write`'s tests).
#[test]
fn create_installs_through_the_driver_once_per_family() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let created = create_runtime(&ctx, &input(dir.path())).unwrap();
    assert_eq!(created, Created::Installed { rules: 4 });
    let calls = fake.calls();
    assert_eq!(
        calls,
        [Call::Install(crate::model::family::Family::Ipv4, 4)]
    );
    let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert_eq!(manifest.phase, Phase::Installed);
    assert_eq!(manifest.rules.len(), 4);
    assert_eq!(manifest.rules[0].table_name(), "filter");
}

#[test]
fn a_failed_install_leaves_no_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    // The nat table cannot be written: nothing was applied, so the rollback only drops the
    // manifest.
    let fake = FakeDriver::new(Backend::IptablesNft);
    fake.fail(crate::model::family::Family::Ipv4, "nat");
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let err = create_runtime(&ctx, &input(dir.path())).unwrap_err();
    assert!(err.to_string().contains("failing on demand"), "{err}");
    assert!(!ctx.ledger.has_manifest(&"c1".parse().unwrap()));
    assert!(fake.holding("natledger:c1") == 0, "nothing left written");
}

#[test]
fn a_filter_table_that_cannot_be_written_costs_only_the_accept() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let fake = FakeDriver::new(Backend::IptablesNft);
    fake.fail(crate::model::family::Family::Ipv4, "filter");
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let created = create_runtime(&ctx, &input(dir.path())).unwrap();
    assert_eq!(created, Created::Installed { rules: 3 });
    let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert!(
        manifest.rules.iter().all(|r| r.table_name() == "nat"),
        "{manifest:?}"
    );
    assert_eq!(manifest.phase, Phase::Installed);
}

#[test]
fn no_annotation_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let mut plain = input(dir.path());
    plain.annotations.clear();
    assert_eq!(create_runtime(&ctx, &plain).unwrap(), Created::Skipped);
    assert!(fake.calls().is_empty());
    assert!(!dir.path().join("containers").exists());
}

#[test]
fn tags_name_the_container() {
    assert_eq!(crate::model::layout::tag("abc"), "natledger:abc");
}

/// A hook input for container `id` of pod `pod`, whose process is this test's own: every such
/// container is in one network namespace, and alive.
pub(super) fn pod_member(dir: &std::path::Path, id: &str, pod: &str, ports: &str) -> HookInput {
    let mut input = input(dir);
    input.id = id.parse().unwrap();
    input.pid = Some(PID);
    input
        .annotations
        .insert("io.natledger.ports".into(), ports.into());
    input
        .annotations
        .insert(crate::model::oci::CRI_SANDBOX_ID.into(), pod.into());
    input
}

#[test]
fn containers_of_one_network_namespace_share_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let ledger = || Ledger::new(dir.path());
    let nft = crate::backend::Backend::IptablesNft;
    let id = |s: &str| -> ContainerId { s.parse().unwrap() };

    let fake = FakeDriver::new(nft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(ledger(), &fake, &drivers, &host);
    let sandbox = pod_member(dir.path(), "sandbox", "sandbox", "8080:80");
    assert_eq!(
        create_runtime(&ctx, &sandbox).unwrap(),
        Created::Installed { rules: 4 }
    );

    // The app container asks for the same mapping: it shares, and runs nothing.
    fake.take_calls();
    let ctx = fake_context(ledger(), &fake, &drivers, &host);
    let app = pod_member(dir.path(), "app", "sandbox", "8080:80");
    assert_eq!(
        create_runtime(&ctx, &app).unwrap(),
        Created::Installed { rules: 0 }
    );
    assert!(fake.calls().is_empty());
    let app_manifest = ctx.ledger.load(&id("app")).unwrap().unwrap();
    assert!(app_manifest.mappings.is_empty() && app_manifest.rules.is_empty());
    assert_eq!(
        app_manifest.shares,
        [Shared {
            holder: id("sandbox"),
            mappings: parse_mappings("8080:80").unwrap(),
        }]
    );
    assert_eq!(app_manifest.pod.as_deref(), Some("sandbox"));
    assert!(app_manifest.netns.is_some());
    let holder = ctx.ledger.load(&id("sandbox")).unwrap().unwrap();
    assert_eq!(holder.shared_by, [id("app")]);
    assert_eq!(holder.netns, app_manifest.netns);

    // Another pod on the same network namespace (hostNetwork pods) does not share.
    let err = create_runtime(&ctx, &pod_member(dir.path(), "other", "pod-2", "8080:80"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("held by live container sandbox") && err.ends_with("of another pod"),
        "{err}"
    );
    // The same port mapped elsewhere in the same pod is refused, naming both mappings.
    let err = create_runtime(&ctx, &pod_member(dir.path(), "app2", "sandbox", "8080:81"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("8080:81") && err.contains("8080:80"), "{err}");
    assert!(!ctx.ledger.has_manifest(&id("other")) && !ctx.ledger.has_manifest(&id("app2")));

    // A sidecar with a port of its own: that one is its own rule, the shared one is shared.
    fake.take_calls();
    let ctx = fake_context(ledger(), &fake, &drivers, &host);
    let sidecar = pod_member(dir.path(), "sidecar", "sandbox", "8080:80,9090:90");
    assert_eq!(
        create_runtime(&ctx, &sidecar).unwrap(),
        Created::Installed { rules: 4 }
    );
    let own: Vec<String> = (fake
        .lines(crate::model::family::Family::Ipv4, "nat")
        .into_iter())
    .filter(|l| l.contains("natledger:sidecar"))
    .collect();
    let port = |p: &str| own.iter().any(|l| l.contains(&format!("--dport {p} ")));
    assert!(port("9090") && !port("8080"), "{own:?}");
    let m = ctx.ledger.load(&id("sidecar")).unwrap().unwrap();
    assert_eq!(m.mappings, parse_mappings("9090:90").unwrap());
    assert_eq!(m.shares[0].mappings, parse_mappings("8080:80").unwrap());
    let holder = ctx.ledger.load(&id("sandbox")).unwrap().unwrap();
    assert_eq!(holder.shared_by, [id("app"), id("sidecar")]);

    // The holder's poststop keeps its rules while a sharer lives, and runs nothing.
    fake.take_calls();
    let ctx = fake_context(ledger(), &fake, &drivers, &host);
    let stopped = |id: &str| crate::model::oci::State {
        id: id.into(),
        status: "stopped".into(),
        // As a runtime that names the stopped process (this test's own).
        pid: Some(PID),
        bundle: Some(dir.path().into()),
        annotations: None,
    };
    let kept = crate::ops::poststop(&ctx, &stopped("sandbox")).unwrap();
    assert_eq!(
        kept,
        crate::ops::Removed::Kept {
            rules: 4,
            sharers: vec![id("app"), id("sidecar")],
        }
    );
    assert!(ctx.ledger.has_manifest(&id("sandbox")));
    // A sharer's poststop removes only its manifest while the holder's rules are needed.
    assert_eq!(
        crate::ops::poststop(&ctx, &stopped("app")).unwrap(),
        crate::ops::Removed::Done { rules: 0 }
    );
    assert!(!ctx.ledger.has_manifest(&id("app")));
    assert!(fake.calls().is_empty());
}

/// Container `id`'s recorded process is made another one (as after it exited).
fn mark_dead(dir: &std::path::Path, id: &str) {
    let ledger = Ledger::new(dir);
    let locked = ledger.lock().unwrap();
    let mut m = ledger.load(&id.parse().unwrap()).unwrap().unwrap();
    m.pid_start_time = Some(1);
    locked.store(&m).unwrap();
}

fn stopped(dir: &std::path::Path, id: &str) -> crate::model::oci::State {
    crate::model::oci::State {
        id: id.into(),
        status: "stopped".into(),
        // As a runtime that names the stopped process (this test's own).
        pid: Some(PID),
        bundle: Some(dir.into()),
        annotations: None,
    }
}

/// A holder created again under its id (a restart) while a container of its namespace
/// shares its rules takes them over where they are: nothing is deleted or written, and its
/// next poststop still keeps them for the sharer.
#[test]
fn a_holder_restarted_while_a_sharer_lives_keeps_its_rules_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let nft = crate::backend::Backend::IptablesNft;
    let id = |s: &str| -> ContainerId { s.parse().unwrap() };
    let fake = FakeDriver::new(nft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &pod_member(dir.path(), "sandbox", "p", "8080:80")).unwrap();
    create_runtime(&ctx, &pod_member(dir.path(), "app", "p", "8080:80")).unwrap();
    let before = ctx.ledger.load(&id("sandbox")).unwrap().unwrap();
    assert!(matches!(
        crate::ops::poststop(&ctx, &stopped(dir.path(), "sandbox")).unwrap(),
        crate::ops::Removed::Kept { .. }
    ));
    mark_dead(dir.path(), "sandbox");

    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let again = create_runtime(&ctx, &pod_member(dir.path(), "sandbox", "p", "8080:80"));
    assert_eq!(again.unwrap(), Created::Installed { rules: 4 });
    assert!(fake.calls().is_empty(), "nothing deleted or written");
    let after = ctx.ledger.load(&id("sandbox")).unwrap().unwrap();
    assert_eq!(after.rules, before.rules);
    assert_eq!(after.shared_by, [id("app")]);
    assert_eq!(after.phase, Phase::Installed);
    assert!(matches!(
        crate::ops::poststop(&ctx, &stopped(dir.path(), "sandbox")).unwrap(),
        crate::ops::Removed::Kept { .. }
    ));
}

/// Sharing in a chain: the sandbox holds 8080, the sidecar shares it and holds 9090, `t`
/// shares 9090. The sandbox stops first (kept for the sidecar). The sidecar's poststop keeps
/// its own rules (`t` shares them) but releases the sandbox's, which only it still needed;
/// `t`'s poststop, the last member's, takes the sidecar's.
#[test]
fn each_holder_goes_with_the_last_member_that_needed_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let nft = crate::backend::Backend::IptablesNft;
    let id = |s: &str| -> ContainerId { s.parse().unwrap() };
    let fake = FakeDriver::new(nft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &pod_member(dir.path(), "sandbox", "p", "8080:80")).unwrap();
    create_runtime(
        &ctx,
        &pod_member(dir.path(), "sidecar", "p", "8080:80,9090:90"),
    )
    .unwrap();
    create_runtime(&ctx, &pod_member(dir.path(), "t", "p", "9090:90")).unwrap();
    let poststop = |id: &str| {
        fake.take_calls();
        let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
        let removed = crate::ops::poststop(&ctx, &stopped(dir.path(), id)).unwrap();
        mark_dead(dir.path(), id);
        let removes = fake.take_calls().into_iter();
        (
            removed,
            removes.filter(|c| matches!(c, Call::Remove(..))).count(),
        )
    };
    let (removed, removes) = poststop("sandbox");
    assert!(matches!(removed, crate::ops::Removed::Kept { .. }) && removes == 0);
    assert_eq!(fake.holding("natledger:sandbox"), 4);
    let (removed, removes) = poststop("sidecar");
    assert!(matches!(removed, crate::ops::Removed::Kept { .. }));
    assert!(!ctx.ledger.has_manifest(&id("sandbox")));
    assert!(removes > 0 && fake.holding("natledger:sandbox") == 0);
    assert_eq!(
        fake.holding("natledger:sidecar"),
        4,
        "only the sandbox's went"
    );
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    crate::ops::poststop(&ctx, &stopped(dir.path(), "t")).unwrap();
    for gone in ["t", "sidecar", "sandbox"] {
        assert!(!ctx.ledger.has_manifest(&id(gone)), "{gone}'s manifest");
    }
    assert_eq!(fake.holding("natledger:sidecar"), 0);
}

/// A createRuntime state without a usable pid is refused before anything runs or is written:
/// nothing could ever show such a container gone.
#[test]
fn a_create_without_a_usable_pid_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    for (pid, says) in [
        (None, "has no pid"),
        (Some(0), "pid 0 in the createRuntime state"),
        (Some(-1), "pid -1 in the createRuntime state"),
    ] {
        let mut pidless = input(dir.path());
        pidless.pid = pid;
        let err = create_runtime(&ctx, &pidless).unwrap_err().to_string();
        assert!(err.contains("container c1") && err.contains(says), "{err}");
    }
    assert!(fake.calls().is_empty());
    assert!(!dir.path().join("containers").exists());
}

/// A poststop for c1 while c1's recorded process (this test's) runs, not naming it, is an
/// earlier instance's: nothing runs, the manifest stays. Naming it, the rules go.
#[test]
fn a_poststop_while_the_recorded_process_runs_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let nft = crate::backend::Backend::IptablesNft;
    let fake = FakeDriver::new(nft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &input(dir.path())).unwrap();
    let me = PID;
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    for named in [None, Some(0), Some(me + 1)] {
        let mut state = stopped(dir.path(), "c1");
        state.pid = named;
        let removed = crate::ops::poststop(&ctx, &state).unwrap();
        assert_eq!(removed, crate::ops::Removed::Stale { pid: me }, "{named:?}");
    }
    assert!(fake.calls().is_empty(), "nothing deleted");
    assert!(ctx.ledger.has_manifest(&"c1".parse().unwrap()));
    fake.take_calls();
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let removed = crate::ops::poststop(&ctx, &stopped(dir.path(), "c1")).unwrap();
    assert_eq!(removed, crate::ops::Removed::Done { rules: 4 });
    assert!(!ctx.ledger.has_manifest(&"c1".parse().unwrap()));
}

/// The rules are in, then the manifest cannot be updated (here its temp file's name is taken
/// by a directory, as a full state directory refuses it): the create fails, its rules are
/// deleted and its manifest removed.
#[test]
fn a_manifest_update_that_fails_rolls_the_rules_back() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let tmp = dir.path().join("containers/.c1.tmp");
    let fake = FakeDriver::new(Backend::IptablesNft);
    // Once the install ran, nothing can take the temp file's place.
    let blocked = tmp.clone();
    fake.after_install(move || std::fs::create_dir(&blocked).unwrap());
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let err = create_runtime(&ctx, &input(dir.path())).unwrap_err();
    assert!(err.to_string().contains(".c1.tmp"), "{err}");
    assert!(!ctx.ledger.has_manifest(&"c1".parse().unwrap()));
    let calls = fake.calls();
    assert!(matches!(calls[0], Call::Install(..)), "{calls:?}");
    assert!(
        calls[1..].iter().any(|c| matches!(c, Call::Remove(..))),
        "{calls:?}"
    );
    assert_eq!(fake.holding("natledger:c1"), 0, "the rules are undone");
}

#[test]
fn consecutive_mappings_are_one_range_and_too_many_are_refused_before_the_lock() {
    use crate::model::portspec::bounds::Bound;
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let state = dir.path().join("state");
    let with_ports = |spec: String| {
        let mut input = input(dir.path());
        input
            .annotations
            .insert("io.natledger.ports".to_string(), spec);
        input
            .annotations
            .insert("io.natledger.ip".to_string(), "10.77.0.2,fd77::2".into());
        input
    };
    // Refused: nothing run, not even the state directory made (the lock is in it).
    for (backend, spec, refused) in [
        (
            Backend::IptablesLegacy,
            (1..=2000)
                .map(|p| format!("{}:{p}", p * 2))
                .collect::<Vec<_>>(),
            Bound::Mappings {
                given: 2000,
                merged: 2000,
            },
        ),
        // 600 dual-stack mappings: 4,200 rules on iptables (3,000 on nftables).
        (
            Backend::IptablesNft,
            (1..=600).map(|p| format!("{}:{p}", p * 2)).collect(),
            Bound::Rules {
                mappings: 600,
                rules: 4200,
            },
        ),
        // A shifted run merges on iptables, not on nftables.
        (
            Backend::OwnNftables,
            (1..=1025).map(|p| format!("{}:{p}", p + 1000)).collect(),
            Bound::Mappings {
                given: 1025,
                merged: 1025,
            },
        ),
    ] {
        let fake = FakeDriver::new(backend);
        let drivers: [&dyn Driver; 1] = [&fake];
        let ctx = fake_context(Ledger::new(&state), &fake, &drivers, &host);
        match create_runtime(&ctx, &with_ports(spec.join(","))) {
            Err(Error::TooLarge { id, bound }) => {
                assert_eq!(id.to_string(), "c1");
                assert_eq!(bound, refused, "{backend}");
            }
            other => panic!("{backend}: {other:?}"),
        }
        assert!(fake.calls().is_empty());
        assert!(!state.exists(), "{backend}: nothing made");
    }

    // The same shifted run on iptables: one range mapping, its seven rules (two families).
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(&state), &fake, &drivers, &host);
    let spec: Vec<String> = (1..=1025).map(|p| format!("{}:{p}", p + 1000)).collect();
    let created = create_runtime(&ctx, &with_ports(spec.join(","))).unwrap();
    assert_eq!(created, Created::Installed { rules: 7 });
    let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert_eq!(
        manifest.mappings,
        parse_mappings("1001-2025:1-1025").unwrap()
    );
}
