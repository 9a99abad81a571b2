//! The `nftables` backend's own proofs (issue 15), each with real TCP and UDP traffic and
//! full before/after dumps (`*-save` of every iptables pair and `nft list ruleset`):
//!
//! - a host where no iptables tool is installed (a private mount namespace hides every
//!   `*tables*` file of natledger's tool directories): `--backend auto` picks nftables and
//!   says why, create + traffic + poststop + `sweep --all` work, and no process is started;
//! - a mixed host: stale DNATs for the same host port in iptables-nft (kube-proxy's chains),
//!   iptables-legacy and a native nftables table (`table ip kube-proxy`, priority dstnat):
//!   natledger's chains (priority -110) win while its mapping lives, the foreign rules come
//!   back into effect after poststop, and none of them is touched;
//! - a shifted port range is refused at create, nothing written, no manifest.
//!
//! The other proofs of this backend: `tests/it/nftables/tables.rs` (sweep, poststop, rules
//! added by hand, the localhost guard) and `tests/it/nftables/encoding.rs` (expressions as
//! `nft -f` encodes them).
//!
//! Submodules: `encoding` (natledger's netlink encoding against nft's), `review` (the
//! adversarial review), `tables` (its tables over their life) and `untracked` (the localhost
//! guard against untracked packets).

mod encoding;
mod review;
mod tables;
mod untracked;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
const PORTS: (&str, &str) = ("io.natledger.ports", "8080:80,8080:80/udp");

/// TCP and UDP servers on port `port` of both of the container's addresses, answering
/// "`name` tcp" / "`name` udp".
fn serve(c: &Container, port: u16, name: &str) -> Vec<Server> {
    let mut servers = Vec::new();
    for addr in [c.sock_v4(port), c.sock_v6(port)] {
        servers.push(serve_tcp(&c.ns, addr, &format!("{name} tcp")));
        servers.push(serve_udp(&c.ns, addr, &format!("{name} udp")));
    }
    servers
}

/// What a TCP connection and a UDP request from `ns` to `dst` get back.
fn ask(ns: &str, dst: SocketAddr) -> (Option<String>, Option<String>) {
    (tcp_request(ns, dst, T).ok(), udp_request(ns, dst, T).ok())
}

/// The paths to host port 8080: from outside to the node's IPv4 and IPv6 address, and from
/// the node itself to its own address.
fn outside_and_node(node: &Node) -> Vec<(String, SocketAddr)> {
    let (ext, host) = (node.topo.ext().to_string(), node.topo.node().to_string());
    vec![
        (ext.clone(), sock(NODE_V4, 8080)),
        (ext, sock(NODE_V6, 8080)),
        (host, sock(NODE_V4, 8080)),
    ]
}

/// Every path (also 127.0.0.1 on the node) is answered by the container `name`.
fn answered_by(node: &Node, name: &str, what: &str) {
    let mut paths = outside_and_node(node);
    paths.push((node.topo.node().to_string(), sock(LOCALHOST, 8080)));
    let want = (Some(format!("{name} tcp")), Some(format!("{name} udp")));
    for (ns, dst) in paths {
        assert_eq!(ask(&ns, dst), want, "{what}: {ns} -> {dst}");
    }
}

/// The `*-save` sections of a [`dump_all`] dump (everything before "## nftables").
fn iptables_sections(dump: &str) -> &str {
    dump.split("## nftables\n").next().unwrap_or("")
}

/// The nftables section of a [`dump_all`] dump without natledger's own tables: the native
/// tables of other owners, as nft prints them.
fn foreign_tables(dump: &str) -> String {
    let section = dump.split("## nftables\n").nth(1).unwrap_or("");
    let mut keep = true;
    let mut out = String::new();
    for line in section.lines() {
        if let Some(head) = line.strip_prefix("table ") {
            keep = head.split_whitespace().nth(1) != Some("natledger");
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The OCI state natledger's hooks read on stdin.
fn state(id: &str, stage: &str, bundle: &Path, pid: Option<u32>) -> String {
    let status = if stage == "create-runtime" {
        "creating"
    } else {
        "stopped"
    };
    let mut state = serde_json::json!({
        "ociVersion": "1.0.2", "id": id, "status": status, "bundle": bundle,
    });
    if let Some(pid) = pid {
        state["pid"] = pid.into();
    }
    state.to_string()
}

/// The machine's tool directories as a host without iptables has them, for processes run in
/// a private mount namespace: each directory natledger looks for tools in (resolved, so
/// `/sbin -> usr/sbin` counts once) is covered by a directory of symlinks to everything in it
/// except the `*tables*` tools (iptables, ip6tables, xtables-*, ebtables, arptables, ...).
/// The machine's own directories are not changed.
struct NoIptables {
    dir: tempfile::TempDir,
    script: String,
}

const TOOL_DIRS: [&str; 5] = ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"];

impl NoIptables {
    fn new() -> NoIptables {
        let dir = tempfile::tempdir_in("/run").expect("tempdir in /run");
        let mut real: Vec<PathBuf> = Vec::new();
        for d in TOOL_DIRS {
            if let Ok(p) = std::fs::canonicalize(d)
                && p.is_dir()
                && !real.contains(&p)
            {
                real.push(p);
            }
        }
        let (mut binds, mut covers) = (String::from("set -e\n"), String::new());
        for (i, real_dir) in real.iter().enumerate() {
            let orig = dir.path().join(format!("orig{i}"));
            let masked = dir.path().join(format!("masked{i}"));
            std::fs::create_dir(&orig).unwrap();
            std::fs::create_dir(&masked).unwrap();
            for entry in std::fs::read_dir(real_dir).unwrap() {
                let name = entry.unwrap().file_name();
                if name.to_string_lossy().contains("tables") {
                    continue;
                }
                std::os::unix::fs::symlink(orig.join(&name), masked.join(&name)).unwrap();
            }
            binds.push_str(&format!(
                "mount --bind {} {}\n",
                real_dir.display(),
                orig.display()
            ));
            covers.push_str(&format!(
                "mount --bind {} {}\n",
                masked.display(),
                real_dir.display()
            ));
        }
        let script = format!("{binds}{covers}exec \"$@\"\n");
        NoIptables { dir, script }
    }

    /// `argv` in `node`'s network namespace and a private mount namespace without iptables,
    /// with natledger's state directory and `NATLEDGER_BACKEND=auto`; under `strace -f -e
    /// trace=execve -o TRACE` when `trace` is given.
    fn run(&self, node: &Node, argv: &[&str], stdin: &str, trace: Option<&Path>) -> Output {
        let state_dir = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
        let trace = trace.map(|t| t.display().to_string());
        let mut full = vec![
            "env",
            &state_dir,
            "NATLEDGER_BACKEND=auto",
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &self.script,
            "sh",
        ];
        if let Some(t) = &trace {
            full.extend(["strace", "-f", "-qq", "-e", "trace=execve", "-o", t]);
        }
        full.extend_from_slice(argv);
        run_in(
            node.topo.node(),
            full[0],
            &full[1..],
            Some(stdin.as_bytes()),
        )
    }

    /// natledger `args` there, traced: its output, and the programs it executed (the first
    /// is natledger itself).
    fn natledger(&self, node: &Node, args: &[&str], stdin: &str) -> (Output, Vec<String>) {
        let trace = self.dir.path().join("trace");
        let _ = std::fs::remove_file(&trace);
        let mut argv = vec![BIN];
        argv.extend_from_slice(args);
        let out = self.run(node, &argv, stdin, Some(&trace));
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        let execs = text
            .lines()
            .filter(|l| l.contains("execve("))
            .map(str::to_string)
            .collect();
        (out, execs)
    }
}

/// Asserts that the traced run executed natledger and nothing else.
fn no_process(execs: &[String], what: &str) {
    assert_eq!(
        execs.len(),
        1,
        "{what}: natledger started a process:\n{}",
        execs.join("\n")
    );
    assert!(execs[0].contains(BIN), "{what}: {}", execs[0]);
}

#[test]
fn auto_without_any_iptables_tool_is_nftables_and_starts_no_process() {
    let mut node = Node::new(Backend::OwnNftables);
    let c = node.topo.add_container(2);
    let _servers = serve(&c, 80, "c2");
    let pid = node.topo.spawn_sleeper(&c.ns);
    let world = NoIptables::new();
    let pristine = node.dump();

    // The world natledger sees: no iptables tool anywhere, nft and ip still there.
    let probe = world.run(
        &node,
        &[
            "sh",
            "-c",
            "ls /usr/sbin /sbin /usr/local/sbin /usr/bin /bin | grep tables; \
             command -v iptables iptables-nft-restore iptables-legacy-restore; \
             command -v nft ip >/dev/null && echo tools-ok",
        ],
        "",
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout),
        "tools-ok\n",
        "the private mount namespace still shows iptables: {}",
        stderr(&probe)
    );

    let (listed, execs) = world.natledger(&node, &["list"], "");
    assert_ok(&listed, "list");
    no_process(&execs, "list");
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.contains("backend for new rules: nftables (no iptables tool is installed"),
        "list does not say nftables and why:\n{listed}"
    );

    let bundle = node.bundle("c2", &[PORTS]);
    let (created, execs) = world.natledger(
        &node,
        &["hook", "create-runtime"],
        &state("c2", "create-runtime", &bundle, Some(pid)),
    );
    assert_ok(&created, "create-runtime without iptables");
    no_process(&execs, "create-runtime");
    let manifest = node.manifest("c2");
    let rules = manifest["rules"].as_array().expect("rules");
    assert!(
        !rules.is_empty() && rules.iter().all(|r| r["backend"] == "nftables"),
        "{manifest:#}"
    );
    let dump = node.dump();
    assert_eq!(
        iptables_sections(&dump),
        iptables_sections(&pristine),
        "natledger wrote into iptables"
    );
    for family in Family::ALL {
        assert_eq!(
            nft_chain_rules(&dump, family, "NATLEDGER-HOSTPORTS").len(),
            2,
            "{family:?}:\n{dump}"
        );
    }
    answered_by(&node, "c2", "created without iptables");
    let client = UdpClient::start(node.topo.ext(), sock(EXT_V4, 40100), sock(NODE_V4, 8080));
    assert!(
        client.wait_for("c2 udp", Instant::now(), T).is_some(),
        "a UDP client that keeps sending gets no reply"
    );

    let (stopped, execs) = world.natledger(
        &node,
        &["hook", "poststop"],
        &state("c2", "poststop", &bundle, Some(pid)),
    );
    assert_ok(&stopped, "poststop without iptables");
    no_process(&execs, "poststop");
    assert!(!node.manifest_exists("c2"));
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        client.replies_since(t).is_empty(),
        "the UDP client still gets replies after poststop"
    );
    client.stop();
    for (ns, dst) in outside_and_node(&node) {
        assert_eq!(ask(&ns, dst), (None, None), "after poststop: {ns} -> {dst}");
    }
    let stopped_dump = node.dump();
    for family in Family::ALL {
        assert!(
            nft_chain_rules(&stopped_dump, family, "NATLEDGER-HOSTPORTS").is_empty(),
            "{stopped_dump}"
        );
    }

    let (swept, execs) = world.natledger(&node, &["sweep", "--all"], "");
    assert_ok(&swept, "sweep --all without iptables");
    no_process(&execs, "sweep --all");
    assert_eq!(node.dump(), pristine, "sweep --all leaves a trace");
}

/// natledger's create-runtime with a shifted port range on nftables: refused before anything
/// is written.
#[test]
fn a_shifted_port_range_is_refused_and_nothing_is_written() {
    let mut node = Node::new(Backend::OwnNftables);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    for (label, pristine) in [("empty host", true), ("natledger's tables there", false)] {
        if !pristine {
            node.warm_up();
        }
        let before = node.dump();
        let ports = ("io.natledger.ports", "8080:80,8000-8001:9000-9001/udp");
        let bundle = node.bundle("c2", &[ports]);
        let out = node.hook("create-runtime", "c2", Some(pid), &bundle);
        assert!(
            !out.status.success(),
            "{label}: a shifted range was accepted"
        );
        let err = stderr(&out);
        assert!(
            err.contains("8000-8001") && err.contains("9000-9001") && err.contains("nftables"),
            "{label}: the error does not name both ranges and the backend: {err}"
        );
        assert_eq!(node.dump(), before, "{label}: something was written");
        assert!(
            node.manifests().is_empty(),
            "{label}: {:?}",
            node.manifests()
        );
        assert_eq!(
            ask(node.topo.ext(), sock(NODE_V4, 8080)),
            (None, None),
            "{label}: 8080 answers"
        );
    }
    // The same ports unshifted are fine.
    let _servers = serve(&c, 80, "c2");
    node.create("c2", Some(pid), &[PORTS]);
    answered_by(&node, "c2", "unshifted");
    assert_ok(&node.poststop("c2"), "poststop");
    assert_ok(&node.sweep(&["--all"]), "sweep --all");
}

/// Stale DNATs for host port 8080 of three other owners, each to its own decoy port on c3
/// (answering "stale-<owner>"): kube-proxy's chains in iptables-nft, a chain in
/// iptables-legacy, and kube-proxy's native nftables table at priority dstnat.
fn load_stale_owners(node: &Node) {
    let host = node.topo.node();
    let kube = |to: &str| {
        format!(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SVC-STALE - [0:0]\n\
             :KUBE-SEP-STALE - [0:0]\n\
             -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" \
             -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
             -A KUBE-NODEPORTS -p tcp -m comment --comment \"default/stale:tcp\" -m tcp \
             --dport 8080 -j KUBE-SVC-STALE\n\
             -A KUBE-NODEPORTS -p udp -m comment --comment \"default/stale:udp\" -m udp \
             --dport 8080 -j KUBE-SVC-STALE\n\
             -A KUBE-SVC-STALE -j KUBE-SEP-STALE\n\
             -A KUBE-SEP-STALE -p tcp -m tcp -j DNAT --to-destination {to}\n\
             -A KUBE-SEP-STALE -p udp -m udp -j DNAT --to-destination {to}\nCOMMIT\n"
        )
    };
    let legacy = |to: &str| {
        format!(
            "*nat\n:STALE - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j STALE\n\
             -A OUTPUT -m addrtype --dst-type LOCAL -j STALE\n\
             -A STALE -p tcp -m tcp --dport 8080 -j DNAT --to-destination {to}\n\
             -A STALE -p udp -m udp --dport 8080 -j DNAT --to-destination {to}\nCOMMIT\n"
        )
    };
    load_rules(
        host,
        Backend::IptablesNft,
        Family::V4,
        &kube("10.77.0.3:81"),
    );
    load_rules(
        host,
        Backend::IptablesNft,
        Family::V6,
        &kube("[fd77::3]:81"),
    );
    load_rules(
        host,
        Backend::IptablesLegacy,
        Family::V4,
        &legacy("10.77.0.3:82"),
    );
    load_rules(
        host,
        Backend::IptablesLegacy,
        Family::V6,
        &legacy("[fd77::3]:82"),
    );
    let native = |family: &str, to: &str| {
        let rules = format!(
            "fib daddr type local tcp dport 8080 dnat to {to}\n\
             fib daddr type local udp dport 8080 dnat to {to}\n"
        );
        format!(
            "table {family} kube-proxy {{\n\
             chain nat-prerouting {{\ntype nat hook prerouting priority dstnat; policy accept;\n\
             {rules}}}\n\
             chain nat-output {{\ntype nat hook output priority -100; policy accept;\n\
             {rules}}}\n}}\n"
        )
    };
    let text = native("ip", "10.77.0.3:83") + &native("ip6", "[fd77::3]:83");
    let out = run_in(host, "nft", &["-f", "-"], Some(text.as_bytes()));
    assert_ok(&out, "nft -f (kube-proxy's native table)");
}

/// Every path of [`outside_and_node`] is answered by one of the stale owners' decoys.
fn answered_by_stale(node: &Node, what: &str) {
    for (ns, dst) in outside_and_node(node) {
        let (tcp, udp) = ask(&ns, dst);
        let stale = |r: &Option<String>| r.as_deref().is_some_and(|r| r.starts_with("stale-"));
        assert!(
            stale(&tcp) && stale(&udp),
            "{what}: {ns} -> {dst}: {tcp:?} {udp:?}"
        );
    }
}

#[test]
fn natledger_wins_over_stale_dnats_of_other_owners_and_leaves_them_alone() {
    let mut node = Node::new(Backend::OwnNftables);
    let c = node.topo.add_container(2);
    let decoy = node.topo.add_container(3);
    let _servers = serve(&c, 80, "c2");
    let _decoys = [
        serve(&decoy, 81, "stale-iptables-nft"),
        serve(&decoy, 82, "stale-legacy"),
        serve(&decoy, 83, "stale-nftables"),
    ];
    let pid = node.topo.spawn_sleeper(&c.ns);
    load_stale_owners(&node);
    let before = node.dump();
    assert!(
        foreign_tables(&before).contains("table ip6 kube-proxy {"),
        "{before}"
    );
    // The stale rules are live: without natledger they take the port.
    answered_by_stale(&node, "before natledger");
    let client = UdpClient::start(node.topo.ext(), sock(EXT_V4, 40200), sock(NODE_V4, 8080));
    let t0 = Instant::now();
    let first = client.replies();
    assert!(
        client
            .wait_for("c2 udp", t0, Duration::from_millis(300))
            .is_none(),
        "{first:?}"
    );

    node.create("c2", Some(pid), &[PORTS]);
    let created = node.dump();
    assert_eq!(
        iptables_sections(&created),
        iptables_sections(&before),
        "create touched iptables"
    );
    assert_eq!(
        foreign_tables(&created),
        foreign_tables(&before),
        "create touched kube-proxy's table"
    );
    answered_by(&node, "c2", "natledger's mapping over three stale ones");
    let t1 = Instant::now();
    assert!(
        client.wait_for("c2 udp", t1, T).is_some(),
        "the UDP client that kept sending (its flow DNATed by a stale rule) does not reach c2: \
         {:?}",
        client.replies_since(t0)
    );

    assert_ok(&node.poststop("c2"), "poststop");
    let stopped = node.dump();
    assert_eq!(iptables_sections(&stopped), iptables_sections(&before));
    assert_eq!(foreign_tables(&stopped), foreign_tables(&before));
    let t3 = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let late = client.replies_since(t3);
    assert!(
        !late.is_empty() && late.iter().all(|r| r.starts_with("stale-")),
        "after poststop the UDP client's flow should go back to the stale owner: {late:?}"
    );
    client.stop();
    answered_by_stale(&node, "after poststop");

    assert_ok(&node.sweep(&["--all"]), "sweep --all");
    assert_eq!(node.dump(), before, "sweep --all");
}
