//! `natledger sweep` end to end: the real binary against real iptables-legacy, iptables-nft
//! and its own nftables tables in private network namespaces. Every case ends with a full
//! dump comparison (`*-save` and `nft list ruleset`): the rules of dead containers are gone, live containers' rules and traffic are
//! intact, and every foreign rule is unchanged.

use std::os::unix::process::ExitStatusExt;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use natledger::fault;

const T: Duration = Duration::from_secs(3);

/// Rules of other owners that resemble natledger's: the same port and DNAT target in a
/// foreign chain, natledger's tag in a foreign chain, natledger's chain name as a substring,
/// a similar comment, and a foreign jump carrying the shared comment to a foreign chain.
const LOOK_ALIKES: &str = "*nat\n:DOCKER - [0:0]\n:NATLEDGERISH - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
    -A DOCKER -p tcp -m tcp --dport 8080 -m comment --comment natledger:c2 -j DNAT --to-destination 10.77.0.2:80\n\
    -A NATLEDGERISH -p tcp -m tcp --dport 8080 -m comment --comment natledger:c3 -j DNAT --to-destination 10.77.0.3:80\n\
    -A OUTPUT -m comment --comment natledger-ish -j NATLEDGERISH\n\
    -A OUTPUT -m comment --comment natledger -j DOCKER\n\
    COMMIT\n";

/// Loads the look-alikes where `backend`'s rules live (for natledger's nftables tables: into
/// iptables-nft, whose tables are other owners' nf_tables tables), and the native nftables
/// look-alikes for every backend.
fn load_look_alikes(ns: &str, backend: Backend) {
    let iptables = if backend.is_iptables() {
        backend
    } else {
        Backend::IptablesNft
    };
    load_rules(ns, iptables, Family::V4, LOOK_ALIKES);
    load_nft(ns, NFT_LOOK_ALIKES);
}

/// The rules of one mapping forwarded to an IPv4 and an IPv6 address: per family a DNAT and
/// the hairpin masquerade, IPv4 also the 127.0.0.1 masquerade, and on iptables a forward
/// accept per family.
fn rules_per_mapping(backend: Backend) -> u64 {
    if backend.is_iptables() { 7 } else { 5 }
}

const PORTS: &str = "io.natledger.ports";
const IP: &str = "io.natledger.ip";

fn ports(spec: &str) -> (&'static str, &str) {
    (PORTS, spec)
}

/// A node with look-alikes loaded, natledger's shared chains in place, and a live container
/// `live` (10.77.0.2, a real namespace and servers) published on 8080.
struct World {
    node: Node,
    live_pid: u32,
    _servers: Vec<Server>,
}

impl World {
    fn new(backend: Backend) -> World {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let servers = vec![
            serve_tcp(&c.ns, c.sock_v4(80), "live tcp"),
            serve_udp(&c.ns, c.sock_v4(80), "live udp"),
        ];
        load_look_alikes(node.topo.node(), backend);
        node.warm_up();
        let live_pid = node.topo.spawn_sleeper(&c.ns);
        node.create("live", Some(live_pid), &[ports("8080:80,8080:80/udp")]);
        World {
            node,
            live_pid,
            _servers: servers,
        }
    }

    /// The live container answers on node-IP:8080 over TCP and UDP.
    fn assert_live_answers(&self) {
        let ext = self.node.topo.ext();
        let to = sock(NODE_V4, 8080);
        let dump = || self.node.dump();
        let tcp = tcp_request(ext, to, T);
        assert_eq!(tcp.as_deref().ok(), Some("live tcp"), "{tcp:?}\n{}", dump());
        let udp = udp_request(ext, to, T);
        assert_eq!(udp.as_deref().ok(), Some("live udp"), "{udp:?}\n{}", dump());
    }

    /// A container whose process runs in the node namespace (a sleeper), forwarding
    /// `spec` to a made-up address; returns its pid.
    fn doomed(&mut self, id: &str, spec: &str, env: &[(&str, &str)]) -> (u32, Output) {
        let node_ns = self.node.topo.node().to_string();
        let pid = self.node.topo.spawn_sleeper(&node_ns);
        let bundle = self
            .node
            .bundle(id, &[ports(spec), (IP, "10.77.0.9,fd77::9")]);
        let out = self
            .node
            .hook_env("create-runtime", id, Some(pid), &bundle, env);
        (pid, out)
    }

    fn sweep_ok(&self, args: &[&str]) -> serde_json::Value {
        let mut argv = vec!["--json"];
        argv.extend_from_slice(args);
        let out = self.node.sweep(&argv);
        assert_ok(&out, &format!("sweep {args:?}"));
        serde_json::from_slice(&out.stdout).expect("sweep --json prints JSON")
    }
}

fn killed(out: &Output) -> bool {
    out.status.signal() == Some(9)
}

/// The containers of a report, as (id, state, manifest fate, rules removed).
fn verdicts(report: &serde_json::Value) -> Vec<(String, String, String, u64)> {
    report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["state"].as_str().unwrap().to_string(),
                c["manifest"].as_str().unwrap().to_string(),
                c["rules_removed"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// poststop never ran (the container's process was killed, its manifest left): sweep removes
/// exactly its rules, in one pass; `--dry-run` only reports; the live container is untouched.
#[test]
fn sweep_removes_what_dead_containers_left_and_nothing_else() {
    both(|backend| {
        let mut w = World::new(backend);
        let with_live = w.node.dump();
        let (pid, out) = w.doomed("dead", "9090:90,9091:91/udp", &[]);
        assert_ok(&out, "create dead");
        kill_pid(pid);
        let with_dead = w.node.dump();
        assert_ne!(with_dead, with_live);

        let plan = w.sweep_ok(&["--dry-run"]);
        assert_eq!(
            w.node.dump(),
            with_dead,
            "{backend:?}: a dry run changes nothing"
        );
        assert!(w.node.manifest_exists("dead"));
        assert_eq!(plan["dry_run"], true);
        let removed = 2 * rules_per_mapping(backend);
        let dead = ("dead".into(), "dead".into(), "would-remove".into(), removed);
        assert!(verdicts(&plan).contains(&dead), "{plan:#}");

        let report = w.sweep_ok(&[]);
        assert_eq!(
            w.node.dump(),
            with_live,
            "{backend:?}: exactly the dead rules go"
        );
        assert!(!w.node.manifest_exists("dead") && w.node.manifest_exists("live"));
        let v = verdicts(&report);
        assert!(v.contains(&("dead".into(), "dead".into(), "removed".into(), removed)));
        assert!(v.contains(&("live".into(), "alive".into(), "kept".into(), 0)));
        assert_eq!(report["orphans"], 0);
        assert_eq!(report["errors"], serde_json::json!([]));
        let changed: Vec<_> = report["tables"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| !t["rules_removed"].as_array().unwrap().is_empty())
            .map(|t| {
                (
                    t["backend"].clone(),
                    t["family"].clone(),
                    t["table"].clone(),
                )
            })
            .collect();
        // nftables writes no forward accept: no filter rule of a container.
        let tables = if backend.is_iptables() { 4 } else { 2 };
        assert_eq!(
            changed.len(),
            tables,
            "IPv4 and IPv6, nat and (iptables) filter, of one backend: {report:#}"
        );
        assert!(
            changed.iter().all(|(b, _, _)| b == backend.name()),
            "{report:#}"
        );
        w.assert_live_answers();

        // Idempotent; then the live container dies too and only the shared chains remain.
        w.sweep_ok(&[]);
        assert_eq!(w.node.dump(), with_live);
        kill_pid(w.live_pid);
        w.sweep_ok(&[]);
        assert!(!w.node.dump().contains("natledger:live"));
        assert!(!w.node.manifest_exists("live"));
    });
}

/// Enough dead rules that sweep rewrites natledger's chains (flush, then the kept rules again,
/// in one transaction) instead of deleting rule by rule: the live rules come back in order.
#[test]
fn many_dead_containers_rewrite_the_chains_around_the_live_one() {
    both(|backend| {
        let mut w = World::new(backend);
        let with_live = w.node.dump();
        let mut pids = Vec::new();
        for i in 0..22 {
            let base = 11000 + 3 * i;
            // Not consecutive in container ports: three mappings, not one range.
            let spec = format!("{base}:80,{}:82,{}:84", base + 1, base + 2);
            let (pid, out) = w.doomed(&format!("d{i}"), &spec, &[]);
            assert_ok(&out, "create");
            pids.push(pid);
        }
        // Another live container, created after the dead ones: its rules sit above theirs.
        let (late, out) = w.doomed("late", "12000:80", &[]);
        assert_ok(&out, "create late");
        let with_late = w.node.dump();
        pids.iter().for_each(|p| kill_pid(*p));
        let report = w.sweep_ok(&[]);
        let removed: usize = report["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["rules_removed"].as_array().unwrap().len())
            .sum();
        assert_eq!(
            removed as u64,
            22 * 3 * rules_per_mapping(backend),
            "{backend:?}"
        );
        let expected: String = with_late
            .lines()
            .filter(|l| !l.contains("\"natledger:d"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            w.node.dump(),
            expected,
            "{backend:?}: live rules kept, in order"
        );
        w.assert_live_answers();
        kill_pid(late);
        w.sweep_ok(&[]);
        assert_eq!(w.node.dump(), with_live, "{backend:?}");
    });
}

/// SIGKILL at every step of create-runtime, poststop and sweep, then a sweep: no rule of the
/// dead container remains, the live container answers, every other rule is as it was.
#[test]
fn a_hook_killed_at_any_step_is_cleaned_up_by_sweep() {
    both(|backend| {
        let mut w = World::new(backend);
        let before = w.node.dump();
        for (i, point) in fault::POINTS.iter().enumerate() {
            let id = format!("k{i}");
            let fault = [(fault::ENV, *point)];
            let spec = "9100:100,9101:101/udp";
            if point.starts_with("create:") {
                let (pid, out) = w.doomed(&id, spec, &fault);
                assert!(killed(&out), "{backend:?} {point}: {}", stderr(&out));
                kill_pid(pid); // the runtime aborts the start
            } else {
                let (pid, out) = w.doomed(&id, spec, &[]);
                assert_ok(&out, "create");
                kill_pid(pid);
                let out = if point.starts_with("poststop:") {
                    let bundle = w.node.dir.path().join("bundles").join(&id);
                    w.node.hook_env("poststop", &id, None, &bundle, &fault)
                } else {
                    w.node.natledger(&["sweep"], "", &fault)
                };
                assert!(killed(&out), "{backend:?} {point}: {}", stderr(&out));
            }
            w.sweep_ok(&[]);
            assert_eq!(
                w.node.dump(),
                before,
                "{backend:?}: after a kill at {point}"
            );
            assert!(!w.node.manifest_exists(&id), "{backend:?} {point}");
            let leftovers: Vec<_> = std::fs::read_dir(w.node.state_dir().join("containers"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "live.json")
                .collect();
            assert!(leftovers.is_empty(), "{point}: {leftovers:?}");
        }
        w.assert_live_answers();
    });
}

/// Rules written with one backend while the host now defaults to the other: sweep finds them
/// where they are. Also a copy of them restored into the other backend.
#[test]
fn sweep_finds_rules_in_either_backend() {
    for (written, default) in [
        (Backend::IptablesLegacy, Backend::IptablesNft),
        (Backend::IptablesNft, Backend::IptablesLegacy),
    ] {
        let mut w = World::new(written);
        let before = w.node.dump();
        let (pid, out) = w.doomed("old", "9200:200", &[]);
        assert_ok(&out, "create");
        kill_pid(pid);
        // Someone migrated the IPv4 ruleset into the default backend, and kept the original.
        let ns = w.node.topo.node().to_string();
        let copy = save(&ns, written, Family::V4);
        load_rules(&ns, default, Family::V4, &copy);
        let migrated = w.node.dump();
        w.node.backend = default;
        w.sweep_ok(&[]);
        let after = w.node.dump();
        assert!(
            !after.contains("natledger:old"),
            "{written:?}→{default:?}:\n{after}"
        );
        // What remains differs from the migrated state by exactly old's rules.
        let without_old: String = migrated
            .lines()
            .filter(|l| !l.contains("natledger:old"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(after, without_old, "{written:?}→{default:?}");
        assert!(after.contains("natledger:live"), "the live copy stays");
        assert_ne!(after, before);
        w.assert_live_answers();
    }
}

/// Rules written by natledger's nftables tables while the host now defaults to an iptables
/// backend, and the other way round: sweep removes a dead container's rules and poststop a
/// stopped one's where they are, and nothing else.
#[test]
fn sweep_and_poststop_find_rules_between_nftables_and_iptables() {
    for (written, default) in [
        (Backend::OwnNftables, Backend::IptablesNft),
        (Backend::OwnNftables, Backend::IptablesLegacy),
        (Backend::IptablesNft, Backend::OwnNftables),
        (Backend::IptablesLegacy, Backend::OwnNftables),
    ] {
        let mut w = World::new(written);
        let with_live = w.node.dump();
        let (pid, out) = w.doomed("old", "9200:200", &[]);
        assert_ok(&out, "create old");
        kill_pid(pid);
        let (_, out) = w.doomed("stopped", "9201:201", &[]);
        assert_ok(&out, "create stopped");
        w.node.backend = default;
        assert_ok(&w.node.poststop("stopped"), "poststop");
        assert!(!w.node.manifest_exists("stopped"));
        let report = w.sweep_ok(&[]);
        let old = (
            "old".into(),
            "dead".into(),
            "removed".into(),
            rules_per_mapping(written),
        );
        assert!(verdicts(&report).contains(&old), "{report:#}");
        assert_eq!(
            w.node.dump(),
            with_live,
            "{written:?} rules, {default:?} default: exactly the rules of old and stopped go"
        );
        w.assert_live_answers();
    }
}

/// After a reboot the manifests are gone (tmpfs) but a saved ruleset brought natledger's
/// rules back: the boot's sweep (`--boot`) removes every tagged rule, whichever backend they
/// were restored into.
#[test]
fn rules_restored_after_a_reboot_are_orphans() {
    both(|backend| {
        let node = Node::new(backend);
        let ns = node.topo.node().to_string();
        load_look_alikes(&ns, backend);
        node.warm_up();
        let clean = node.dump();
        node.create("a", None, &[ports("8080:80"), (IP, "10.77.0.2,fd77::2")]);
        node.create("b", None, &[ports("8081:81/udp"), (IP, "10.77.0.3")]);
        let saved: Vec<(Family, String)> = Family::ALL
            .iter()
            .map(|f| {
                let text = if backend.is_iptables() {
                    save(&ns, backend, *f)
                } else {
                    nft_save_own(&ns, *f)
                };
                (*f, text)
            })
            .collect();
        // Reboot: the kernel forgets everything, /run is empty, the saved rules come back.
        std::fs::remove_dir_all(node.state_dir()).unwrap();
        for (family, text) in &saved {
            if !backend.is_iptables() {
                // `nft -f` of `nft list table`'s text, in place of the table as it was.
                let table = match family {
                    Family::V4 => "ip",
                    Family::V6 => "ip6",
                };
                load_nft(&ns, &format!("delete table {table} natledger\n{text}"));
                continue;
            }
            let prog = format!("{}-restore", iptables_tool(backend, *family));
            let out = run_in(&ns, &prog, &[], Some(text.as_bytes()));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(node.dump().contains("natledger:a"));
        // The boot sweep: without --boot a missing state directory takes nothing.
        let out = node.sweep(&["--boot", "--json"]);
        assert_ok(&out, "sweep");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // a: IPv4 and IPv6; b: IPv4 only, with the 127.0.0.1 masquerade.
        let orphans = if backend.is_iptables() {
            4 + 3 + 4
        } else {
            3 + 2 + 3
        };
        assert_eq!(report["orphans"], orphans, "{report:#}");
        assert_eq!(node.dump(), clean, "{backend:?}");
    });
}

/// Neither sweep nor `sweep --all` touches a rule natledger did not write; `--all` removes
/// everything natledger did write, live containers included, and its manifests.
#[test]
fn all_removes_everything_natledger_owns_and_nothing_else() {
    both(|backend| {
        let node = Node::new(backend);
        let ns = node.topo.node().to_string();
        load_look_alikes(&ns, backend);
        let pristine = node.dump();
        node.warm_up();
        node.create("c2", None, &[ports("8080:80"), (IP, "10.77.0.2,fd77::2")]);
        let running = node.dump();
        assert_ok(&node.sweep(&[]), "sweep");
        assert_eq!(node.dump(), running, "{backend:?}: nothing here is due");
        let out = node.sweep(&["--all"]);
        assert_ok(&out, "sweep --all");
        assert_eq!(
            node.dump(),
            pristine,
            "{backend:?}: only look-alikes remain"
        );
        assert!(!node.manifest_exists("c2"));
        assert_ok(&node.sweep(&["--all"]), "a second --all");
        assert_eq!(node.dump(), pristine);
    });
}

/// A manifest that cannot be read might belong to a live container: its rules stay and the
/// sweep says so (exit 1); `--all` removes both.
#[test]
fn an_unreadable_manifest_keeps_its_rules_until_all() {
    let node = Node::new(Backend::IptablesNft);
    node.create("c2", None, &[ports("8080:80"), (IP, "10.77.0.2")]);
    let path = node.state_dir().join("containers/c2.json");
    std::fs::write(&path, "{\"schema\": 1, \"trunc").unwrap();
    let dump = node.dump();
    let out = node.sweep(&[]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("the rules tagged natledger:c2 are kept"),
        "{text}"
    );
    assert_eq!(node.dump(), dump);
    assert_ok(&node.sweep(&["--all"]), "sweep --all");
    assert!(!node.dump().contains("natledger"));
    assert!(!path.exists());
}

/// A copy of a live container's manifest under another name (an operator's backup, say) is
/// not judged as that container: both files and the live rules stay, and the sweep says why.
#[test]
fn a_manifest_under_another_name_is_kept_and_reported() {
    let w = World::new(Backend::IptablesNft);
    let containers = w.node.state_dir().join("containers");
    let mut copy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(containers.join("live.json")).unwrap()).unwrap();
    copy["pid"] = i32::MAX.into(); // as if taken before a restart: a dead pid
    std::fs::write(containers.join("live-old.json"), copy.to_string()).unwrap();
    let before = w.node.dump();
    let out = w.node.sweep(&[]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("names container live, not the one its file name says"),
        "{text}"
    );
    assert_eq!(w.node.dump(), before);
    assert!(containers.join("live.json").exists() && containers.join("live-old.json").exists());
    w.assert_live_answers();
}

/// A shared jump that appears twice, once below someone else's rule, ends up once, at the top.
#[test]
fn a_duplicated_jump_ends_up_once_at_the_top() {
    // Someone else's rule in the shared iptables PREROUTING chain: nftables' PREROUTING is
    // natledger's own base chain.
    iptables_both(|backend| {
        let node = Node::new(backend);
        node.warm_up();
        let ns = node.topo.node().to_string();
        let jump = "-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS";
        load_rules(
            &ns,
            backend,
            Family::V4,
            &format!("*nat\n:DOCKER - [0:0]\n-A PREROUTING -j DOCKER\n{jump}\nCOMMIT\n"),
        );
        let report = node.sweep(&["--json"]);
        assert_ok(&report, "sweep");
        let pre: Vec<String> = save(&ns, backend, Family::V4)
            .lines()
            .filter(|l| l.starts_with("-A PREROUTING"))
            .map(String::from)
            .collect();
        assert_eq!(pre, [jump, "-A PREROUTING -j DOCKER"], "{backend:?}");
    });
}

/// `--wait` gives an exiting container time to die and ends soon after the last exit, while
/// a container that keeps running keeps its rules.
#[test]
fn wait_gives_exiting_containers_time_and_keeps_the_survivors() {
    let mut w = World::new(Backend::IptablesNft);
    let with_live = w.node.dump();
    let (pid, out) = w.doomed("exiting", "9300:300", &[]);
    assert_ok(&out, "create");
    let start = Instant::now();
    let sweep = std::thread::scope(|s| {
        let sweeper = s.spawn(|| w.node.sweep(&["--wait", "20"]));
        std::thread::sleep(Duration::from_secs(1));
        kill_pid(pid);
        sweeper.join().unwrap()
    });
    let took = start.elapsed();
    assert_ok(&sweep, "sweep --wait");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(w.node.dump(), with_live);
    w.assert_live_answers();
}

/// Sweeps running while 32 containers start and stop in parallel (some by poststop, some by
/// dying) lose no live rule and leave no dead one.
#[test]
fn sweeps_during_parallel_starts_and_stops() {
    both(|backend| {
        let mut w = World::new(backend);
        let node_ns = w.node.topo.node().to_string();
        let pids: Vec<u32> = (0..32)
            .map(|_| w.node.topo.spawn_sleeper(&node_ns))
            .collect();
        let done = AtomicBool::new(false);
        let w = &w;
        let sweeps = std::thread::scope(|s| {
            let sweeper = s.spawn(|| {
                let mut n = 0;
                while !done.load(Ordering::Relaxed) {
                    assert_ok(&w.node.sweep(&[]), "concurrent sweep");
                    n += 1;
                }
                n
            });
            let workers: Vec<_> = pids
                .iter()
                .enumerate()
                .map(|(i, pid)| {
                    s.spawn(move || {
                        let id = format!("p{i}");
                        let ip = format!("10.77.1.{}", i + 10);
                        let spec = format!("{}:80", 10000 + i);
                        w.node.create(&id, Some(*pid), &[ports(&spec), (IP, &ip)]);
                        match i % 3 {
                            0 => {}              // stays alive
                            1 => kill_pid(*pid), // dies; no poststop
                            _ => {
                                assert_ok(&w.node.poststop(&id), "poststop");
                                kill_pid(*pid);
                            }
                        }
                    })
                })
                .collect();
            for worker in workers {
                worker.join().unwrap();
            }
            done.store(true, Ordering::Relaxed);
            sweeper.join().unwrap()
        });
        assert!(sweeps > 0);
        assert_ok(&w.node.sweep(&[]), "final sweep");
        let dump = w.node.dump();
        for i in 0..32 {
            let tag = format!("\"natledger:p{i}\"");
            let count = dump.matches(&tag).count();
            // DNAT, two masquerades and, on iptables, the forward accept.
            let alive = if backend.is_iptables() { 4 } else { 3 };
            let expected = if i % 3 == 0 { alive } else { 0 };
            assert_eq!(
                count, expected,
                "{backend:?} p{i} after {sweeps} sweeps:\n{dump}"
            );
            assert_eq!(w.node.manifest_exists(&format!("p{i}")), i % 3 == 0);
        }
        w.assert_live_answers();
        for (i, pid) in pids.iter().enumerate() {
            if i % 3 == 0 {
                kill_pid(*pid);
            }
        }
    });
}
