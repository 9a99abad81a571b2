use super::listeners::parse_socket_addr;
use super::*;
use crate::model::portspec::Protocol;
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::symlink;

const ID_A: &str = "fb7cdb0a4f8da673da0a9818ec9a1576f953a8e8decf87a081827c11e4aa7138";
const ID_B: &str = "0961bad27f1a52a28701b7038120b8188e7a78df21f57a08428f021ab3c071e2";

/// An address as the socket tables print it: each 32-bit word in host order.
fn sock_hex(ip: &str) -> String {
    let octets = match ip.parse().unwrap() {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let words = octets
        .chunks(4)
        .map(|w| u32::from_ne_bytes(w.try_into().unwrap()));
    words.map(|w| format!("{w:08X}")).collect()
}

/// A socket table: header, then one line per (address, port, state, inode).
fn table(rows: &[(&str, u16, &str, u64)]) -> String {
    let mut t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   \
                 uid  timeout inode\n"
        .to_string();
    for (ip, port, st, inode) in rows {
        let (local, remote) = (
            sock_hex(ip),
            "0".repeat(if ip.contains(':') { 32 } else { 8 }),
        );
        t += &format!(
            "   0: {local}:{port:04X} {remote}:0000 {st} 00000000:00000000 00:00000000 \
             00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
        );
    }
    t
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn roots(dir: &Path) -> Roots {
    Roots {
        proc: dir.join("proc"),
        net: dir.join("net"),
        sysctl_net: dir.join("sys/net"),
        cni_networks: dir.join("cni"),
        runtime_state: vec![dir.join("run/runc"), dir.join("run/containerd/runc")],
        local_addresses: Some(vec!["192.0.2.7".parse().unwrap()]),
        xtables_lock: dir.join("run/xtables.lock"),
    }
}

#[test]
fn listeners_in_a_fake_tree_with_owners() {
    let tmp = tempfile::tempdir().unwrap();
    let r = roots(tmp.path());
    let tcp = [
        ("0.0.0.0", 8080, "0A", 1111),
        ("127.0.0.1", 53, "0A", 2222),
        ("10.0.0.1", 40000, "01", 3333), // established: not a listener
    ];
    write(&r.net.join("tcp"), &table(&tcp));
    write(&r.net.join("tcp6"), &table(&[("::", 443, "0A", 4444)]));
    let udp = [("0.0.0.0", 5353, "07", 5555), ("10.0.0.1", 99, "01", 6666)];
    write(&r.net.join("udp"), &table(&udp)); // and no udp6 at all
    let links = [
        ("1234/fd/0", "/dev/null"),
        ("1234/fd/3", "socket:[1111]"),
        ("1234/fd/4", "socket:[5555]"),
        ("4321/fd/3", "socket:[1111]"), // shared with a child: the lower pid is named
        ("4321/fd/5", "socket:[4444]"),
        ("self/fd/7", "socket:[2222]"), // not a pid
    ];
    for (link, target) in links {
        fs::create_dir_all(r.proc.join(link).parent().unwrap()).unwrap();
        symlink(target, r.proc.join(link)).unwrap();
    }
    write(&r.proc.join("1234/comm"), "nginx\n");
    fs::create_dir_all(r.proc.join("77")).unwrap(); // no fd dir: vanished or unreadable

    let show = |l: &Listener| format!("{} {} {} {}", l.protocol, l.addr, l.port, l.inode);
    let show = |l: &Listener| format!("{} {:?} {:?}", show(l), l.pid, l.command);
    let got: Vec<String> = listeners(&r).iter().map(show).collect();
    let want = [
        "tcp 127.0.0.1 53 2222 None None",
        "tcp :: 443 4444 Some(4321) None",
        "udp 0.0.0.0 5353 5555 Some(1234) Some(\"nginx\")",
        "tcp 0.0.0.0 8080 1111 Some(1234) Some(\"nginx\")",
    ];
    assert_eq!(got, want);
    assert!(listeners(&roots(&tmp.path().join("nothing"))).is_empty());
    let lo = if cfg!(target_endian = "little") {
        "0100007F"
    } else {
        "7F000001"
    };
    assert_eq!(parse_socket_addr(lo), "127.0.0.1".parse().ok());
    let mapped = sock_hex("::ffff:10.1.2.3");
    assert_eq!(
        parse_socket_addr(&mapped),
        "10.1.2.3".parse().ok(),
        "given as IPv4"
    );
    assert_eq!(parse_socket_addr("0100007"), None);
}

#[test]
fn real_proc_finds_this_process_listening() {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    let found = listeners(&Roots::default());
    let me = found
        .iter()
        .find(|l| l.protocol == Protocol::Tcp && l.port == port)
        .expect("own listener found");
    assert_eq!(me.addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(me.pid, Some(std::process::id() as i32));
    let comm = fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(me.command.as_deref(), Some(comm.trim()));
}

#[test]
fn cni_reservations_from_host_local_files() {
    let tmp = tempfile::tempdir().unwrap();
    let r = roots(tmp.path());
    assert!(!cni_networks_present(&r) && cni_reservations(&r).is_empty());
    let files = [
        ("cbr0/10.88.0.5", format!("{ID_A}\neth0")),
        ("cbr0/fd00::5", format!("{ID_A}\r\neth0\n")),
        ("cbr0/10.88.0.3", format!("{ID_B}\n")),
        ("cbr0/last_reserved_ip.0", "10.88.0.5".into()),
        ("cbr0/lock", "".into()),
        ("podman/10.89.0.2", "".into()),
        ("podman/10.89.0.9", "abc".into()),
    ];
    for (name, text) in files {
        write(&r.cni_networks.join(name), &text);
    }
    assert!(cni_networks_present(&r));
    let show = |v: &Reservation| format!("{} {} {}", v.network, v.addr, v.container_id);
    let got: Vec<String> = cni_reservations(&r).iter().map(show).collect();
    let want = [
        format!("cbr0 10.88.0.3 {ID_B}"),
        format!("cbr0 10.88.0.5 {ID_A}"),
        format!("cbr0 fd00::5 {ID_A}"),
        "podman 10.89.0.9 abc".into(),
    ];
    assert_eq!(got, want);
    let interfaces: Vec<_> = cni_reservations(&r)
        .into_iter()
        .map(|v| v.interface)
        .collect();
    assert_eq!(
        interfaces,
        [None, Some("eth0".into()), Some("eth0".into()), None]
    );
}

#[test]
fn runtime_containers_and_liveness() {
    let tmp = tempfile::tempdir().unwrap();
    let r = roots(tmp.path());
    assert!(!runtime_state_present(&r));
    for (pid, state, start) in [(1234, "S", 5555), (666, "Z", 7)] {
        let stat = format!("{pid} (a (b) c) {state} 1 {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0");
        let stat = format!("{stat} 20 0 1 0 {start} 100 10\n");
        write(&r.proc.join(format!("{pid}/stat")), &stat);
    }
    let json = |id: &str, pid, start: &str| {
        let start = format!(r#""init_process_start":{start}"#);
        format!(r#"{{"id":"{id}","init_process_pid":{pid},{start},"x":1}}"#)
    };
    let files = [
        (format!("runc/{ID_A}"), json(ID_A, 1234, "5555")),
        ("runc/stopped".into(), json("stopped", 4321, "5555")),
        ("runc/zombie".into(), json("zombie", 666, "7")),
        ("runc/garbage".into(), "{not json".into()),
        // containerd's layout; the pid was reused (start time as a string, as old runc)
        (
            format!("containerd/runc/k8s.io/{ID_B}"),
            json(ID_B, 1234, "\"999\""),
        ),
        (
            "containerd/runc/moby/noid".into(),
            r#"{"init_process_pid":1234}"#.into(),
        ),
    ];
    for (dir, text) in &files {
        write(&tmp.path().join("run").join(dir).join("state.json"), text);
    }
    assert!(runtime_state_present(&r));
    let all = runtime_containers(&r);
    let got: Vec<String> = all
        .iter()
        .map(|c| format!("{} {:?} {}", c.id, c.pid, c.alive))
        .collect();
    let want = [
        format!("{ID_B} Some(1234) false"),
        format!("{ID_A} Some(1234) true"),
        "noid Some(1234) true".into(), // id from the directory; no start time recorded
        "stopped Some(4321) false".into(),
        "zombie Some(666) false".into(),
    ];
    assert_eq!(got, want);
    let reused = format!("run/containerd/runc/k8s.io/{ID_B}/state.json");
    assert_eq!(all[0].state_file, tmp.path().join(reused));

    let alive = |id: &str| container_id_alive(id, &all);
    assert_eq!(alive(ID_A), Some(true));
    assert_eq!(alive(&ID_A[..12]), Some(true));
    assert_eq!(alive(&ID_B[..12]), Some(false));
    assert_eq!(alive(&ID_A[..11]), None, "too short");
    assert_eq!(alive("stopped"), Some(false), "exact id");
    assert_eq!(alive("deadbeefdeadbeef"), None, "unknown");
    assert_eq!(alive(""), None);
    let mut twins = all.clone();
    twins[0].id = format!("{}ffff", &ID_A[..20]);
    assert_eq!(container_id_alive(&ID_A[..12], &twins), None, "ambiguous");
}

// As this kernel prints them (x86: IPv4 in little-endian host order).
const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
eth0\t00000A0A\t050200C0\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0
*\t0000FE0A\t00000000\t0201\t0\t0\t0\t0000FFFF\t0\t0\t0
";
const IPV6_ROUTE: &str = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000002 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000004 00000000 80200001     eth0
fd770000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001  br-natl
20010db8000000000000000000000000 20 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";

#[cfg(target_endian = "little")]
#[test]
fn routes_skip_default_reject_and_local_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = roots(tmp.path());
    write(&r.net.join("route"), ROUTE);
    write(&r.net.join("ipv6_route"), IPV6_ROUTE);
    let inet6 = "fd000000000000000000000000000002 04 40 00 82     eth0\n";
    write(&r.net.join("if_inet6"), inet6);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let show = |r: Route| {
        format!(
            "{}/{} {} {:?}",
            r.dest, r.prefix_len, r.interface, r.gateway
        )
    };
    let route = |s: &str| route_to(&r, ip(s)).map(show).unwrap();
    assert_eq!(route("172.17.0.2"), "172.17.0.0/16 docker0 None");
    assert_eq!(route("10.10.3.4"), "10.10.0.0/16 eth0 Some(192.0.2.5)");
    assert_eq!(route("fd77::2"), "fd77::/64 br-natl None");
    assert!(has_route(&r, ip("192.0.2.99")) && has_route(&r, ip("fd00::9")));
    assert!(!has_route(&r, ip("8.8.8.8")), "only the default route");
    assert!(!has_route(&r, ip("10.254.0.1")), "unreachable route");
    assert!(!has_route(&r, ip("2001:db8::1")), "unreachable on lo");
    assert!(!has_route(&r, ip("2a00::1")) && !has_route(&r, ip("::1")));
    assert_eq!(routes(&r).len(), 6);
    assert_eq!(default_interface(&r, false).as_deref(), Some("eth0"));
    assert_eq!(default_interface(&r, true).as_deref(), Some("eth0"));
    write(
        &r.net.join("route"),
        &ROUTE.replace("eth0\t00000000\t", "ens3\t00000000\t"),
    );
    assert_eq!(default_interface(&r, false).as_deref(), Some("ens3"));
    write(&r.net.join("route"), "");
    assert_eq!(default_interface(&r, false), None);
    write(&r.net.join("route"), ROUTE);

    assert!(is_local_address(&r, ip("192.0.2.7")), "injected");
    assert!(is_local_address(&r, ip("127.0.0.9")));
    assert!(!is_local_address(&r, ip("192.0.2.8")));
    r.local_addresses = None;
    assert!(is_local_address(&r, ip("fd00::2")), "from if_inet6");
    assert!(!is_local_address(&r, ip("fd00::3")));
    assert!(is_local_address(&r, ip("::1")));
    assert!(!is_local_address(&r, ip("203.0.113.254")), "not here");
}

#[test]
fn container_ids_from_comments() {
    let ids = |c: &str| comment_container_ids(c);
    assert_eq!(ids(&format!(r#"dnat name: "cbr0" id: "{ID_A}""#)), [ID_A]);
    let saved = format!(r#""dnat name: \"cbr0\" id: \"{ID_A}\"""#);
    assert_eq!(ids(&saved), [ID_A], "as iptables-save quotes it");
    assert_eq!(ids("dnat name: podman id: 3f2a8e"), ["3f2a8e"]); // netavark
    assert_eq!(ids("name: podman id: c1"), ["c1"]);
    assert_eq!(ids("natledger:web-1.a"), ["web-1.a"]);
    let both = format!("kube {ID_B} and natledger:{ID_B} then {ID_A}");
    assert_eq!(ids(&both), [ID_B, ID_A]);
    let nones = [
        "natledger",
        "natledger:",
        "hostname: x id: y",
        "KUBE-SVC-X ns/web:http",
    ];
    for none in nones {
        assert!(ids(none).is_empty(), "{none}");
    }
    assert!(ids(&format!("{ID_A}0")).is_empty(), "65 hex digits");
}

/// Other programs' files doctor reads (runtime state, CNI reservations) are read only when
/// regular: a FIFO planted there is skipped at once instead of blocking doctor forever.
#[test]
fn fifos_among_other_programs_files_are_skipped_without_waiting() {
    let tmp = tempfile::tempdir().unwrap();
    let r = roots(tmp.path());
    let fifo = |path: &Path| {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    };
    fifo(
        &tmp.path()
            .join("run/containerd/runc/k8s.io")
            .join(ID_A)
            .join("state.json"),
    );
    fifo(&tmp.path().join("cni/cbr0/10.88.0.5"));
    write(
        &tmp.path().join("cni/cbr0/10.88.0.6"),
        &format!("{ID_B}\neth0"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send((runtime_containers(&r).len(), cni_reservations(&r).len()));
    });
    let found = rx.recv_timeout(std::time::Duration::from_secs(5));
    assert_eq!(found, Ok((0, 1)), "blocked on a FIFO, or read it");
}

#[test]
fn route_localnet_per_interface_and_all() {
    let tmp = tempfile::tempdir().unwrap();
    let r = roots(tmp.path());
    assert_eq!(route_localnet(&r), RouteLocalnet::default());
    for (iface, value) in [
        ("all", "0"),
        ("default", "1"),
        ("lo", "1"),
        ("eth0", "0"),
        ("br0", "1\n"),
        ("docker0", "1"),
    ] {
        write(
            &tmp.path()
                .join(format!("sys/net/ipv4/conf/{iface}/route_localnet")),
            value,
        );
    }
    let found = route_localnet(&r);
    assert_eq!(
        (found.all, found.interfaces),
        (false, vec!["br0".into(), "docker0".into()])
    );
    write(
        &tmp.path().join("sys/net/ipv4/conf/all/route_localnet"),
        "1",
    );
    let found = route_localnet(&r);
    assert_eq!(
        (found.all, found.interfaces),
        (true, vec!["br0".into(), "docker0".into(), "eth0".into()])
    );
}
