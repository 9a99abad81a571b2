//! What `natledger::kernel::conntrack` relies on in the kernel, asked directly: the rules of
//! ctnetlink's dump filter (`CTA_FILTER`), pinned so that a kernel that changes them fails
//! here; and the cost of `forget` by entries present, per dump path (ignored: prints
//! figures).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use natledger::kernel::conntrack::{self, Flows};
use natledger::kernel::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST, Socket};
use natledger::model::family::Family as AddrFamily;

/// The ctnetlink dump filter (`CTA_FILTER`, kernel >= 5.9) as `forget` relies on it, asked
/// directly: a filter needs a family (`EOPNOTSUPP` for `AF_UNSPEC`), a port needs the
/// protocol's flag (`EINVAL`), an undefined flag is refused (what `DUMP_ENV=refused` uses),
/// an entry of any zone passes a filter that names none, ports are compared for UDP but not
/// for SCTP, and the IPv6 address comparison is inverted (why `forget` never filters by an
/// IPv6 address): asked for fd78::1, the kernel dumps every other address.
#[test]
fn the_kernels_dump_filter_rules() {
    const PROTO_NUM: u32 = 1 << 3;
    const DST_PORT: u32 = 1 << 5;
    const IP_DST: u32 = 1 << 1;
    let topo = Topology::new();
    let node = topo.node().to_string();
    let sctp = "-p sctp --state ESTABLISHED --orig-vtag 1 --reply-vtag 2";
    load_entries(
        &node,
        &[
            "-I -t 600 -p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41001 --dport 5353".to_string(),
            "-I -t 600 -p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41002 --dport 5353 -w 7".into(),
            "-I -t 600 -p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41003 --dport 5354".into(),
            format!("-I -t 600 {sctp} -s 10.78.0.2 -d 10.78.0.1 --sport 41004 --dport 5354"),
            "-I -t 600 -p udp -s fd78::2 -d fd78::1 --sport 41005 --dport 5353".into(),
            "-I -t 600 -p udp -s fd78::2 -d fd78::9 --sport 41006 --dport 5353".into(),
        ]
        .join("\n"),
    );
    // (family, flags, destination, protocol, port) -> the dumped (source port, zone)s, or
    // the errno.
    let ask = |family: i32, flags: u32, dst: Option<IpAddr>, proto: u8, port: Option<u16>| {
        in_netns(&node, || {
            let mut sock = Socket::netfilter().unwrap();
            let seq = sock.next_seq();
            let mut m = Vec::new();
            let start = netlink::begin(&mut m, 0x0101, NLM_F_REQUEST | NLM_F_DUMP, seq);
            m.extend([family as u8, 0, 0, 0]);
            let tuple = netlink::begin_nest(&mut m, 1); // CTA_TUPLE_ORIG
            if let Some(dst) = dst {
                let ip = netlink::begin_nest(&mut m, 1); // CTA_TUPLE_IP
                match dst {
                    IpAddr::V4(a) => netlink::put_attr(&mut m, 2, &a.octets()),
                    IpAddr::V6(a) => netlink::put_attr(&mut m, 4, &a.octets()),
                }
                netlink::end_nest(&mut m, ip);
            }
            let p = netlink::begin_nest(&mut m, 2); // CTA_TUPLE_PROTO
            netlink::put_attr(&mut m, 1, &[proto]);
            if let Some(port) = port {
                netlink::put_attr(&mut m, 3, &port.to_be_bytes());
            }
            netlink::end_nest(&mut m, p);
            netlink::end_nest(&mut m, tuple);
            let filter = netlink::begin_nest(&mut m, 25); // CTA_FILTER
            netlink::put_attr(&mut m, 1, &flags.to_ne_bytes()); // CTA_FILTER_ORIG_FLAGS
            netlink::end_nest(&mut m, filter);
            netlink::finish(&mut m, start);
            let mut dumped = BTreeSet::new();
            sock.dump(seq, &m, |message| {
                let e = conntrack::parse_entry(message.payload).unwrap();
                dumped.insert((e.src_port, e.zone));
                Ok(())
            })
            .map(|()| dumped)
            .map_err(|e| e.raw_os_error().unwrap())
        })
    };
    let (inet, inet6) = (libc::AF_INET, libc::AF_INET6);
    let set = |ports: &[(u16, Option<u16>)]| Ok(ports.iter().copied().collect::<BTreeSet<_>>());

    assert_eq!(
        ask(libc::AF_UNSPEC, PROTO_NUM, None, 17, None),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(ask(inet, DST_PORT, None, 17, Some(5353)), Err(libc::EINVAL));
    let undefined = ask(inet, PROTO_NUM | 1 << 31, None, 17, None);
    assert!(
        matches!(undefined, Err(libc::EINVAL | libc::EOPNOTSUPP)),
        "{undefined:?}"
    );
    // UDP to 5353 in every zone; SCTP whatever its port.
    let v4 = Some(IpAddr::V4(NODE_V4));
    let udp5353 = set(&[(41001, None), (41002, Some(7))]);
    assert_eq!(
        ask(inet, PROTO_NUM | DST_PORT, None, 17, Some(5353)),
        udp5353
    );
    assert_eq!(
        ask(inet, IP_DST | PROTO_NUM | DST_PORT, v4, 17, Some(5353)),
        udp5353
    );
    assert_eq!(
        ask(inet, PROTO_NUM | DST_PORT, None, 132, Some(5353)),
        set(&[(41004, None)])
    );
    // IPv6: the port narrows; the address is matched inverted.
    assert_eq!(
        ask(inet6, PROTO_NUM | DST_PORT, None, 17, Some(5353)),
        set(&[(41005, None), (41006, None)])
    );
    assert_eq!(
        ask(
            inet6,
            IP_DST | PROTO_NUM,
            Some(IpAddr::V6(NODE_V6)),
            17,
            None
        ),
        set(&[(41006, None)]),
        "the kernel's IPv6 address filter works now: forget may use it where it does"
    );
}

/// The cost of `forget` in a namespace, on each dump path: a `forget` that finds nothing
/// (its dumps alone, as median of 21) with 0 to 50,000 entries present, mostly TCP (to port
/// 443, as on a busy host) or mostly UDP (to port 6000), for UDP flows of one family (5353,
/// IPv4) and of both (5353, IPv4 and IPv6); then the deletion of 10,000 matching entries.
/// Each path (`unfiltered`, `filtered`, and `adaptive`: `forget`'s own choice) runs in a
/// child process ([`conntrack::DUMP_ENV`]). Prints figures: run with
/// `cargo test --release --test it -- --ignored --nocapture conntrack_kernel::cost_of_forget`.
#[test]
#[ignore = "measurement: prints figures"]
fn cost_of_forget() {
    const RUNS: usize = 21;
    const COUNTS: [u32; 8] = [0, 1_000, 2_000, 3_000, 4_000, 5_000, 10_000, 50_000];
    let Some(path) = std::env::var_os(conntrack::DUMP_ENV) else {
        for path in ["unfiltered", "filtered", "adaptive"] {
            let out = Command::new(std::env::current_exe().unwrap())
                .env(conntrack::DUMP_ENV, path)
                .args([
                    "--ignored",
                    "--exact",
                    "conntrack_kernel::cost_of_forget",
                    "--nocapture",
                ])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{path}: {stderr}");
            stderr
                .lines()
                .filter(|l| l.starts_with("cost_of_forget"))
                .for_each(|l| eprintln!("{l}"));
        }
        return;
    };
    let path = path.to_string_lossy();
    let dump = natledger::entry::settings::Settings::from_env(&|name| std::env::var_os(name))
        .unwrap()
        .conntrack_dump;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let one = [udp_flows((5353, 5353), AddrFamily::Ipv4, None)];
    let both = [one[0], udp_flows((5353, 5353), AddrFamily::Ipv6, None)];
    // Each run on a thread in the namespace with its own socket, as a hook would; only the
    // call is timed.
    let time_forget = |node: &str, flows: &[Flows]| {
        in_netns(node, || {
            let mut sock = Socket::netfilter().unwrap();
            let start = Instant::now();
            let n = conntrack::forget(&mut sock, flows, dump).unwrap();
            (start.elapsed(), n)
        })
    };
    let dumps = |node: &str, flows: &[Flows]| {
        median((0..RUNS).map(|_| time_forget(node, flows).0).collect())
    };
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);

    let topo = Topology::new();
    let node = topo.node().to_string();
    let empty_check = in_netns(&node, || {
        let start = Instant::now();
        assert!(conntrack::table_is_empty());
        start.elapsed()
    });
    eprintln!("cost_of_forget {path}: table_is_empty {empty_check:?}");
    eprintln!(
        "cost_of_forget {path}: ms per forget (its dumps) by entries present: \
         mix, entries, one family, both families"
    );
    // The hash table is shared by every namespace, and a deleted namespace's entries are
    // killed in the background: each mix gets a namespace of its own, after the previous
    // one's entries are gone.
    let settle = |topo: Topology| {
        drop(topo);
        thread::sleep(Duration::from_secs(3));
    };
    settle(topo);
    for (mix, port) in [("tcp", 443), ("udp", 6000)] {
        let topo = Topology::new();
        let node = topo.node().to_string();
        let mut present = 0;
        for count in COUNTS {
            load_entries(&node, &entry_lines(present..count, mix, "10.78.0.1", port));
            present = count;
            let (one, both) = (dumps(&node, &one), dumps(&node, &both));
            eprintln!(
                "cost_of_forget {path}: {mix} {count:>6} {:>7} {:>7}",
                ms(one),
                ms(both)
            );
        }
        settle(topo);
    }

    let topo = Topology::new();
    let node = topo.node().to_string();
    let count = 10_000;
    load_entries(&node, &entry_lines(0..count, "udp", "10.78.0.1", 6000));
    let dump = dumps(&node, &one);
    let (all, deleted) = time_forget(&node, &[udp_flows((6000, 6000), AddrFamily::Ipv4, None)]);
    assert_eq!(deleted, count as usize);
    let per = all.saturating_sub(dump) / count;
    eprintln!(
        "cost_of_forget {path}: {count} udp entries, none matching: {dump:?}; all matching: \
         {all:?}, {per:?} per deleted entry"
    );
}
