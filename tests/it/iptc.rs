//! The in-process iptables-legacy writer against the real kernel and the real tools, in
//! private network namespaces: its encoding is byte for byte what iptables-legacy writes,
//! its edits give the same `*-save -c` dump as iptables-legacy-restore (foreign chains,
//! jumps, gotos and counters included), it declines without writing when the table is not
//! as expected, and it never creates a table that does not exist.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    BIN, Backend as TestBackend, Family as TestFamily, Node, Topology, assert_ok, in_netns,
    load_rules, run_in,
};
use natledger::backend::{Backend, Direct, Driver, IptablesLegacy, Netfilter, Plan};
use natledger::kernel::exec::SystemRunner;
use natledger::kernel::iptc::entry::{Encoded, Layout, encode};
use natledger::kernel::iptc::{self, Outcome, Place};

/// The xtables lock iptables takes by default (`XTABLES_LOCKFILE` unset).
fn lock() -> &'static std::path::Path {
    std::path::Path::new(iptc::XTABLES_LOCK)
}
use natledger::model::family::{Family, IfAddr};
use natledger::model::layout::{
    DNAT_CHAIN, NAT, TABLES, mapping_rules, owned_chains, shared_rules,
};
use natledger::model::portspec::{parse_entry, parse_mappings};
use natledger::model::rule::Rule;
use natledger::model::save::{Batch, Op};

const SPECS: [&str; 4] = [
    "8080:80",
    "127.0.0.1:8081:81/udp",
    "10.78.0.1:9000-9009:9000-9009",
    "[::]:7000-7002:80-82/udp",
];

fn test_family(family: Family) -> TestFamily {
    match family {
        Family::Ipv4 => TestFamily::V4,
        Family::Ipv6 => TestFamily::V6,
    }
}

/// natledger's rules for container `id` in `family` and `table`, with their chains.
fn container_rules(id: &str, family: Family, table: &str) -> Vec<(&'static str, Rule)> {
    // A bare address, and one with its subnet (the hairpin masquerade's shape).
    let at = |addr: &str, prefix| IfAddr {
        addr: addr.parse().unwrap(),
        prefix,
    };
    let containers = match family {
        Family::Ipv4 => [at("10.77.0.2", None), at("10.77.1.3", Some(24))],
        Family::Ipv6 => [at("fd77::2", None), at("fd77:1::3", Some(64))],
    };
    let id = id.parse().unwrap();
    SPECS
        .iter()
        .map(|s| parse_entry(s).unwrap())
        .filter(|m| m.family().is_none_or(|f| f == family))
        .flat_map(|m| {
            containers
                .iter()
                .flat_map(|c| mapping_rules(Backend::IptablesLegacy, &id, &m, *c))
                .collect::<Vec<_>>()
        })
        .filter(|p| p.table == table)
        .map(|p| (p.chain, p.rule))
        .collect()
}

/// natledger's chains and jumps in `table`, through iptables-legacy-restore.
fn chains_and_jumps(ns: &str, family: Family, table: &'static str) {
    let mut batch = Batch::new(table);
    for chain in owned_chains(natledger::backend::Backend::IptablesLegacy, table, family) {
        batch.ops.push(Op::DeclareChain(chain.to_string()));
    }
    for (chain, jump) in shared_rules(natledger::backend::Backend::IptablesLegacy, table, family) {
        batch
            .ops
            .push(Op::Append(chain.to_string(), jump.to_args()));
    }
    let text = batch.render();
    load_rules(ns, TestBackend::IptablesLegacy, test_family(family), &text);
}

/// `*-save -c` of `table`, without comments: what `restore_exactly` takes back.
fn save_raw(ns: &str, family: Family, table: &str) -> String {
    let tool = format!("{}-legacy-save", family.tool_stem());
    let out = run_in(ns, &tool, &["-c", "-t", table], None);
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// [`save_raw`] without the policy counters of INPUT and OUTPUT, for comparing: the
/// namespace's own packets (IPv6 neighbour discovery) count there at any time.
fn save_c(ns: &str, family: Family, table: &str) -> String {
    save_raw(ns, family, table)
        .lines()
        .map(|l| match l.split_once(" [") {
            Some((policy, _)) if l.starts_with(":INPUT ") || l.starts_with(":OUTPUT ") => {
                format!("{policy} [-]\n")
            }
            _ => format!("{l}\n"),
        })
        .collect()
}

/// An entry without what the kernel fills in (comefrom, counters).
fn comparable(layout: Layout, entry: &[u8]) -> Vec<u8> {
    let mut e = entry.to_vec();
    let comefrom = layout.target_offset_at + 4;
    e[comefrom..comefrom + 4].fill(0);
    e[layout.counters_at..layout.counters_at + 16].fill(0);
    e
}

/// natledger's entries are byte for byte what iptables-legacy writes, nat and filter, IPv4 and
/// IPv6.
#[test]
fn the_encoding_is_what_iptables_legacy_writes() {
    let topo = Topology::new();
    let ns = topo.node().to_string();
    for (family, table) in Family::ALL.into_iter().flat_map(|f| TABLES.map(|t| (f, t))) {
        chains_and_jumps(&ns, family, table);
        let ours = container_rules("c1", family, table);
        let mut batch = Batch::new(table);
        for (chain, rule) in &ours {
            batch
                .ops
                .push(Op::Append(chain.to_string(), rule.to_args()));
        }
        load_rules(
            &ns,
            TestBackend::IptablesLegacy,
            test_family(family),
            &batch.render(),
        );
        let mut written: Vec<(&str, Rule)> =
            shared_rules(natledger::backend::Backend::IptablesLegacy, table, family);
        written.extend(ours);
        let mut chains: Vec<&str> =
            shared_rules(natledger::backend::Backend::IptablesLegacy, table, family)
                .into_iter()
                .map(|(c, _)| c)
                .chain(owned_chains(
                    natledger::backend::Backend::IptablesLegacy,
                    table,
                    family,
                ))
                .collect();
        chains.sort();
        chains.dedup();

        in_netns(&ns, || {
            let blob = iptc::read(family, table).unwrap();
            let layout = blob.layout;
            for chain in chains {
                let expected: Vec<&Rule> = written
                    .iter()
                    .filter(|(c, _)| *c == chain)
                    .map(|(_, r)| r)
                    .collect();
                let entries: Vec<&[u8]> = blob
                    .rules(blob.chain(chain).unwrap())
                    .map(|(_, e)| e)
                    .collect();
                assert!(!expected.is_empty(), "{family} {table} {chain}");
                assert_eq!(entries.len(), expected.len(), "{family} {chain}");
                for (entry, rule) in entries.iter().zip(&expected) {
                    assert_eq!(
                        iptc::decoded(&blob, entry).as_ref(),
                        Some(*rule),
                        "{family} {chain}: decoding"
                    );
                    let mine = match encode(rule, family).unwrap() {
                        Encoded::Entry(e) => e,
                        Encoded::Jump { mut entry, to } => {
                            let first = blob.chain(&to).unwrap().first as i32;
                            let at = entry.len() - 8;
                            entry[at..at + 4].copy_from_slice(&first.to_ne_bytes());
                            entry
                        }
                    };
                    assert_eq!(
                        comparable(layout, &mine),
                        comparable(layout, entry),
                        "{family} {chain}: bytes of {}",
                        rule.to_args().join(" ")
                    );
                }
            }
        });
    }
}

/// The filter table's FORWARD policy with its counters, as [`foreign`] sets it.
const POLICY: &str = ":FORWARD DROP [3:180]";

/// A foreign ruleset with user chains, a jump, a goto, a RETURN and counters, plus
/// natledger's chains (one rule of another container already in each). The filter table
/// has Docker's FORWARD policy and chains.
fn foreign(family: Family, table: &'static str) -> String {
    let other = container_rules("other", family, table);
    let mut text = match table {
        NAT => String::from(
            "*nat\n:FOO - [0:0]\n:BAR - [0:0]\n\
             [5:300] -A PREROUTING -p tcp -m tcp --dport 1 -j FOO\n\
             [6:400] -A FOO -p tcp -m tcp --dport 2 -g BAR\n\
             [7:500] -A FOO -j RETURN\n\
             [8:600] -A BAR -p udp -j ACCEPT\n\
             [9:700] -A OUTPUT -j FOO\n\
             [10:800] -A POSTROUTING -j BAR\n",
        ),
        _ => format!(
            "*filter\n{POLICY}\n:DOCKER-USER - [0:0]\n:DOCKER - [0:0]\n\
             [5:300] -A FORWARD -j DOCKER-USER\n\
             [6:400] -A DOCKER-USER -p tcp -m tcp --dport 2 -g DOCKER\n\
             [7:500] -A DOCKER-USER -j RETURN\n\
             [8:600] -A DOCKER -p udp -j ACCEPT\n\
             [9:700] -A FORWARD -o docker0 -j DOCKER\n",
        ),
    };
    for chain in owned_chains(natledger::backend::Backend::IptablesLegacy, table, family) {
        text += &format!(":{chain} - [0:0]\n");
    }
    for (chain, jump) in shared_rules(natledger::backend::Backend::IptablesLegacy, table, family) {
        text += &format!("[1:60] -A {chain} {}\n", quoted(&jump));
    }
    for (chain, rule) in other.iter().take(2) {
        text += &format!("[2:120] -A {chain} {}\n", quoted(rule));
    }
    text + "COMMIT\n"
}

fn quoted(rule: &Rule) -> String {
    let mut batch = Batch::nat();
    batch.ops.push(Op::Append("X".into(), rule.to_args()));
    let text = batch.render();
    let line = text.lines().find(|l| l.starts_with("-A X ")).unwrap();
    line["-A X ".len()..].to_string()
}

fn restore_exactly(ns: &str, family: Family, text: &str) {
    let tool = format!("{}-legacy-restore", family.tool_stem());
    let out = run_in(ns, &tool, &["-c"], Some(text.as_bytes()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Its in-place edits give the same `-save -c` dump as a restore, counters kept.
#[test]
fn edits_equal_iptables_legacy_restore_and_keep_counters() {
    let topo = Topology::new();
    let ns = topo.node().to_string();
    let runner = SystemRunner::default();
    for (family, table) in Family::ALL.into_iter().flat_map(|f| TABLES.map(|t| (f, t))) {
        restore_exactly(&ns, family, &foreign(family, table));
        let raw_base = save_raw(&ns, family, table);
        let base = save_c(&ns, family, table);
        let ours = container_rules("c1", family, table);
        // DNAT rules go first (given in reverse, as create does), the rest last.
        let mut placed: Vec<(&str, Rule, Place)> = ours
            .iter()
            .rev()
            .filter(|(c, _)| *c == DNAT_CHAIN)
            .map(|(c, r)| (*c, r.clone(), Place::First))
            .collect();
        placed.extend(
            ours.iter()
                .filter(|(c, _)| *c != DNAT_CHAIN)
                .map(|(c, r)| (*c, r.clone(), Place::Last)),
        );

        // The same insertions by iptables-legacy-restore.
        let mut batch = Batch::new(table);
        for (chain, rule, place) in &placed {
            let (chain, args) = (chain.to_string(), rule.to_args());
            batch.ops.push(match place {
                Place::First => Op::InsertFirst(chain, args),
                Place::Last => Op::Append(chain, args),
            });
        }
        in_netns(&ns, || {
            IptablesLegacy
                .apply_plan(&Netfilter::new(&runner), family, &Plan::batch(&batch))
                .unwrap()
        });
        // iptables-legacy-restore resets the built-in chains' policy counters on every change
        // (REFERENCE.md); the in-place edit keeps them, so they are compared apart.
        let by_restore = save_c(&ns, family, table).replace(":FORWARD DROP [0:0]", POLICY);
        restore_exactly(&ns, family, &raw_base);
        assert_eq!(save_c(&ns, family, table), base);

        let required = shared_rules(natledger::backend::Backend::IptablesLegacy, table, family);
        let inserted = in_netns(&ns, || {
            iptc::insert(lock(), family, table, &placed, &required).unwrap()
        });
        assert_eq!(inserted, Outcome::Done(ours.len()));
        assert_eq!(
            save_c(&ns, family, table),
            by_restore,
            "{family} {table}: insert"
        );

        // Deleting exactly those rules gives the base back, counters included.
        let victims: Vec<(&str, &Rule)> = ours.iter().map(|(c, r)| (*c, r)).collect();
        let deleted = in_netns(&ns, || {
            iptc::delete(lock(), family, table, &victims).unwrap()
        });
        assert_eq!(deleted, Outcome::Done(ours.len()));
        assert_eq!(save_c(&ns, family, table), base, "{family} {table}: delete");

        // Declined, writing nothing: a rule that is not there, a jump that is not there.
        let gone = in_netns(&ns, || {
            iptc::delete(lock(), family, table, &victims).unwrap()
        });
        assert_eq!(gone, Outcome::Declined);
        let input_jump = [("INPUT", required[0].1.clone())];
        let missing = in_netns(&ns, || {
            iptc::insert(lock(), family, table, &placed, &input_jump).unwrap()
        });
        assert_eq!(missing, Outcome::Declined);
        assert_eq!(
            save_c(&ns, family, table),
            base,
            "{family} {table}: declined"
        );
    }
}

/// A table that is not there is declined, never created.
#[test]
fn an_absent_table_is_never_created() {
    let topo = Topology::new();
    let ns = topo.node().to_string();
    let runner = SystemRunner::default();
    let rule = &container_rules("c1", Family::Ipv4, NAT)[0];
    let native = in_netns(&ns, || {
        let nf = Netfilter::on_kernel(&runner, true);
        let outcome = IptablesLegacy
            .delete_in_process(&nf, Family::Ipv4, "nat", &[(rule.0, &rule.1)])
            .unwrap();
        let names = std::fs::read_to_string(Family::Ipv4.legacy_tables_file()).unwrap_or_default();
        (outcome, names)
    });
    assert_eq!(native.0, Direct::Off);
    assert!(!native.1.lines().any(|l| l == "nat"), "{}", native.1);
}

/// Mappings of the large removal: iptables-legacy-restore takes seconds to delete them, the
/// in-process writer, linear in the table, milliseconds.
const LARGE: usize = 3000;
/// A removal of [`LARGE`] mappings' rules must take less than this: the superlinear writer
/// took 5 s at this size, 40 s at 12,000 rules (quadratic decoding per rule, per-entry
/// searches of the removal list).
const LARGE_BOUND: Duration = Duration::from_secs(2);

/// [`foreign`] plus a chain sorting after natledger's, reached from a built-in chain and by a
/// goto from a chain before natledger's, jumping back to one before them (so jumps cross the
/// removed range both ways), and [`LARGE`] mappings of container `big` with, between them,
/// every seventh mapping of container `keep`, all with counters. Returns the restore text and
/// `big`'s rules.
fn large(family: Family, table: &'static str) -> (String, Vec<(&'static str, Rule)>) {
    let base = foreign(family, table);
    let mut text = base.trim_end_matches("COMMIT\n").to_string();
    let (from, before) = match table {
        NAT => ("PREROUTING", "FOO"),
        _ => ("FORWARD", "DOCKER-USER"),
    };
    let back = if table == NAT { "BAR" } else { "DOCKER" };
    text += &format!(
        ":ZZ-AFTER - [0:0]\n\
         [11:900] -A {from} -p tcp -m tcp --dport 3 -j ZZ-AFTER\n\
         [12:1000] -A {before} -p udp -m udp --dport 4 -g ZZ-AFTER\n\
         [13:1100] -A ZZ-AFTER -p tcp -m tcp --dport 5 -j {back}\n\
         [14:1200] -A ZZ-AFTER -j RETURN\n"
    );
    let (big, keep) = ("big".parse().unwrap(), "keep".parse().unwrap());
    let mut victims = Vec::new();
    for i in 0..LARGE {
        let proto = if i % 3 == 0 { "/udp" } else { "" };
        let m = parse_entry(&format!("{}:80{proto}", 20000 + i)).unwrap();
        let mut placed: Vec<(bool, natledger::model::layout::Placed)> = mapping_rules(
            natledger::backend::Backend::IptablesLegacy,
            &big,
            &m,
            "10.77.0.2".parse::<std::net::IpAddr>().unwrap(),
        )
        .into_iter()
        .map(|p| (true, p))
        .collect();
        if i % 7 == 0 {
            let m = parse_entry(&format!("{}:81{proto}", 40000 + i)).unwrap();
            let kept = mapping_rules(
                natledger::backend::Backend::IptablesLegacy,
                &keep,
                &m,
                "10.77.0.3".parse::<std::net::IpAddr>().unwrap(),
            );
            placed.extend(kept.into_iter().map(|p| (false, p)));
        }
        for (gone, p) in placed.into_iter().filter(|(_, p)| p.table == table) {
            text += &format!("[{i}:{}] -A {} {}\n", i * 60, p.chain, quoted(&p.rule));
            if gone {
                victims.push((p.chain, p.rule));
            }
        }
    }
    (text + "COMMIT\n", victims)
}

/// Deleting thousands of rules, others' kept between them and foreign jumps crossing them,
/// gives the same `-save -c` dump as iptables-legacy-restore deleting them, and takes time
/// linear in the table (the guard against a superlinear writer).
#[test]
fn a_large_removal_equals_iptables_legacy_restore() {
    let topo = Topology::new();
    let ns = topo.node().to_string();
    let runner = SystemRunner::default();
    let family = Family::Ipv4;
    for table in TABLES {
        let (text, victims) = large(family, table);
        restore_exactly(&ns, family, &text);
        let raw_base = save_raw(&ns, family, table);

        let mut batch = Batch::new(table);
        for (chain, rule) in &victims {
            batch
                .ops
                .push(Op::Delete(chain.to_string(), rule.to_args()));
        }
        in_netns(&ns, || {
            IptablesLegacy
                .apply_plan(&Netfilter::new(&runner), family, &Plan::batch(&batch))
                .unwrap()
        });
        let by_restore = save_c(&ns, family, table).replace(":FORWARD DROP [0:0]", POLICY);
        assert!(by_restore.contains("natledger:keep"), "{table}: kept rules");
        assert!(!by_restore.contains("natledger:big"), "{table}: removed");

        restore_exactly(&ns, family, &raw_base);
        let refs: Vec<(&str, &Rule)> = victims.iter().map(|(c, r)| (*c, r)).collect();
        let start = Instant::now();
        let deleted = in_netns(&ns, || iptc::delete(lock(), family, table, &refs).unwrap());
        let took = start.elapsed();
        assert_eq!(deleted, Outcome::Done(victims.len()));
        assert_eq!(
            save_c(&ns, family, table),
            by_restore,
            "{family} {table}: large delete"
        );
        eprintln!("{table}: deleted {} rules in {took:?}", victims.len());
        assert!(
            took < LARGE_BOUND,
            "{table}: deleting {} rules took {took:?}",
            victims.len()
        );
    }
}

/// Mappings of the container whose poststop runs beside other iptables users.
const CONCURRENT: usize = 1000;

/// An unrelated `iptables-legacy -w 5` runs beside a 1,000-mapping poststop (3,000 nat and
/// 1,000 filter rules removed in-process: near the limit of 4,096 rules per container) and
/// succeeds: natledger holds the xtables lock only from its read of a table to its replace,
/// milliseconds. (The superlinear writer held it for
/// the whole removal, tens of seconds, and such a command failed after its 5 s.) The lock is
/// a file of the test's own (`XTABLES_LOCKFILE`, honoured by natledger and iptables alike), so
/// nothing on the host waits for it.
#[test]
fn iptables_wait_succeeds_beside_a_large_poststop() {
    let node = Node::new(TestBackend::IptablesLegacy);
    let lockfile = node.dir.path().join("xtables.lock");
    let lock_env = format!("XTABLES_LOCKFILE={}", lockfile.display());
    let env = [("XTABLES_LOCKFILE", lockfile.to_str().unwrap())];
    let ip = ("io.natledger.ip", "10.77.0.2");
    let warm = node.bundle("warm", &[("io.natledger.ports", "1:1"), ip]);
    assert_ok(
        &node.hook_env("create-runtime", "warm", None, &warm, &env),
        "warm",
    );
    assert_ok(
        &node.hook_env("poststop", "warm", None, &warm, &env),
        "warm",
    );
    let ports: Vec<String> = (0..CONCURRENT)
        .map(|i| format!("{}:80", 20000 + i))
        .collect();
    let ports = ports.join(",");
    assert_eq!(parse_mappings(&ports).unwrap().len(), CONCURRENT);
    let bundle = node.bundle("big", &[("io.natledger.ports", &ports), ip]);
    let created = node.hook_env("create-runtime", "big", None, &bundle, &env);
    assert_ok(&created, "create-runtime of 1,000 mappings");
    let before = run_in(
        node.topo.node(),
        "iptables-legacy-save",
        &["-t", "nat"],
        None,
    );
    let rules = String::from_utf8_lossy(&before.stdout)
        .matches("natledger:big")
        .count();
    assert_eq!(rules, 3 * CONCURRENT, "natledger's nat rules of big");

    // Naming the process big was created with (its stand-in, still running).
    let state = serde_json::json!({
        "ociVersion": "1.0.2", "id": "big", "status": "stopped", "bundle": bundle,
        "pid": node.stand_in("big"),
    });
    let state_dir = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
    let mut poststop = Command::new("ip")
        .args(["netns", "exec", node.topo.node(), "env", &state_dir])
        .args([
            "NATLEDGER_BACKEND=legacy",
            &lock_env,
            BIN,
            "hook",
            "poststop",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    poststop
        .stdin
        .take()
        .unwrap()
        .write_all(state.to_string().as_bytes())
        .unwrap();
    // Someone else's iptables-legacy, back to back for as long as the poststop runs (and at
    // least twice): each must get the lock within its 5 s.
    let mut runs = 0;
    let mut longest = Duration::ZERO;
    let mut failures = Vec::new();
    while failures.is_empty() && (runs < 2 || poststop.try_wait().unwrap().is_none()) {
        let verb = if runs % 2 == 0 { "-A" } else { "-D" };
        let args = [
            "-w",
            "5",
            "-t",
            "filter",
            verb,
            "INPUT",
            "-s",
            "192.0.2.1",
            "-j",
            "ACCEPT",
        ];
        let start = Instant::now();
        let out = Command::new("ip")
            .args(["netns", "exec", node.topo.node(), "env", &lock_env])
            .arg("iptables-legacy")
            .args(args)
            .output()
            .unwrap();
        longest = longest.max(start.elapsed());
        if !out.status.success() {
            failures.push(format!(
                "iptables-legacy {} after {:?}: {}",
                args.join(" "),
                start.elapsed(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        runs += 1;
    }
    if !failures.is_empty() {
        // The poststop this test started, by its pid (ip execs env, which execs natledger).
        let _ = poststop.kill();
        let _ = poststop.wait();
        panic!(
            "beside a poststop running for {:?}: {failures:#?}",
            started.elapsed()
        );
    }
    let out = poststop.wait_with_output().unwrap();
    let took = started.elapsed();
    assert_ok(&out, "poststop of 1,000 mappings");
    eprintln!("poststop {took:?}; {runs} iptables-legacy -w 5 beside it, longest {longest:?}");
    let after = run_in(node.topo.node(), "iptables-legacy-save", &[], None);
    assert!(!String::from_utf8_lossy(&after.stdout).contains("natledger:big"));
}
