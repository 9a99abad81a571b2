//! What create reads of the host, through the seam (`crate::kernel::machine::Host`), on a
//! fake host: the container's process and namespace recorded, its addresses read from its
//! namespace, a listener on a mapped port warned about or refused, `route_localnet` asked
//! for the container's IPv4 address.

use std::net::IpAddr;

use super::*;
use crate::backend::{Backend, Driver};
use crate::kernel::machine::fake::{BOOT_ID, PID_NAMESPACE};
use crate::model::oci::PORT_CONFLICT_ANNOTATION;
use crate::model::portspec::Protocol;
use crate::ops::testing::*;
use crate::state::ledger::Ledger;

/// c1 with `io.natledger.port-conflict` set: the host's setting (the environment) is not
/// read then.
fn conflicts(dir: &std::path::Path, setting: &str) -> HookInput {
    let mut input = input(dir);
    input
        .annotations
        .insert(PORT_CONFLICT_ANNOTATION.into(), setting.into());
    input
}

fn listener(command: &str, pid: i32) -> Listener {
    Listener {
        protocol: Protocol::Tcp,
        addr: "0.0.0.0".parse().unwrap(),
        port: 8080,
        inode: 99,
        pid: Some(pid),
        command: Some(command.into()),
    }
}

#[test]
fn the_manifest_records_the_process_and_namespace_the_host_shows() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &input(dir.path())).unwrap();
    let m = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert_eq!(
        (m.pid, m.pid_start_time, m.pid_namespace),
        (Some(PID), Some(START), Some(PID_NAMESPACE))
    );
    assert_eq!(m.boot_id.as_deref(), Some(BOOT_ID));
    assert_eq!(m.netns, Some(netns(1)));
    assert!(m.alive(&host));
    // The localhost path: route_localnet towards the container, once the guard is in.
    assert_eq!(
        *host.route_localnet.borrow(),
        ["10.77.0.2".parse::<std::net::Ipv4Addr>().unwrap()]
    );
}

/// The namespace is recorded with its cookie where the host gives one (Linux 5.14+), so
/// the container's namespace is told from a later one reusing its inode.
#[test]
fn the_namespace_is_recorded_with_its_cookie() {
    use crate::kernel::machine::fake::netns_cookie;
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::default().with_process(PID, START, netns_cookie(1, 77));
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &input(dir.path())).unwrap();
    let m = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert_eq!(m.netns, Some(netns_cookie(1, 77)));
}

#[test]
fn a_container_whose_process_is_gone_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::default();
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let err = create_runtime(&ctx, &input(dir.path())).unwrap_err();
    assert!(matches!(err, Error::NotRunning { pid: PID, .. }), "{err}");
    assert!(fake.calls().is_empty());
}

#[test]
fn addresses_come_from_the_containers_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let found: Vec<IpAddr> = vec!["10.77.0.9".parse().unwrap(), "fd77::9".parse().unwrap()];
    let mut plain = input(dir.path());
    plain.annotations.remove(IP_ANNOTATION);

    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    let err = create_runtime(&ctx, &plain).unwrap_err();
    assert!(matches!(err, Error::NoAddress { pid: PID, .. }), "{err}");
    assert!(fake.calls().is_empty());

    let with_prefixes = vec![
        IfAddr {
            addr: found[0],
            prefix: Some(24),
        },
        IfAddr {
            addr: found[1],
            prefix: Some(64),
        },
    ];
    host.addresses.borrow_mut().insert(PID, with_prefixes);
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &plain).unwrap();
    let m = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert_eq!(m.addresses, found);
    // The subnets are in the hairpin masquerades (the manifest's addresses stay bare).
    let sources: Vec<String> = m
        .rules
        .iter()
        .filter(|r| r.chain == "NATLEDGER-MASQ")
        .filter_map(|r| Some(r.rule()?.source?.to_string()))
        .collect();
    assert!(sources.contains(&"10.77.0.0/24".to_string()), "{sources:?}");
    assert!(sources.contains(&"fd77::/64".to_string()), "{sources:?}");
}

/// A process listening on a mapped port loses its connections: a warning, or with
/// `io.natledger.port-conflict=refuse` a refusal before anything is written. A port keeper
/// holds the port for another owner's forward: the same.
#[test]
fn a_listener_on_a_mapped_port_is_warned_about_or_refused() {
    for (command, pid) in [("python3", 77), ("docker-proxy", 78)] {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host().with_listener(listener(command, pid));
        let fake = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&fake];
        let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
        let err = create_runtime(&ctx, &conflicts(dir.path(), "refuse")).unwrap_err();
        let who = format!("{command} (pid {pid})");
        assert!(
            matches!(&err, Error::PortInUse { who: w, .. } if *w == who),
            "{err}"
        );
        assert!(fake.calls().is_empty());
        assert!(!ctx.ledger.has_manifest(&"c1".parse().unwrap()));

        let fake = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&fake];
        let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
        let created = create_runtime(&ctx, &conflicts(dir.path(), "warn")).unwrap();
        assert_eq!(created, Created::Installed { rules: 4 });
    }
    // A listener on another port is no conflict.
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host().with_listener(Listener {
        port: 8081,
        ..listener("python3", 77)
    });
    let fake = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&fake];
    let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
    create_runtime(&ctx, &conflicts(dir.path(), "refuse")).unwrap();
}
