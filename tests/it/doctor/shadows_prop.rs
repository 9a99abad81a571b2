//! A property test of doctor's shadow check over generated rulesets: doctor never panics, and
//! every shadow it claims is confirmed packet by packet.
//!
//! Each case is a seeded random nat and filter table (a xorshift PRNG, so a failing seed is
//! reproduced exactly): chains jumped to from both PREROUTING and OUTPUT (and INPUT and
//! OUTPUT), mixed protocols, ports, port ranges, multiport, addresses, interfaces, address
//! types and negations, with DNAT/ACCEPT/RETURN/DROP/REJECT targets and jumps. For every rule
//! a finding says never matches, on every hook it names, each path from that hook to the rule
//! is found again here (independently of `iptables::paths`), a concrete packet matching the
//! whole path is built from its conditions, and the hook is evaluated for that packet, rule by
//! rule through the jumps, with `packet::Packet::test`: the shadowed rule must never take it,
//! and the earlier rule must take it (or the packet must be taken before reaching it).
//!
//! `NATLEDGER_PROP_CASES` (default 2,000) sets the number of cases, `NATLEDGER_PROP_SEED` the
//! first seed; `NATLEDGER_PROP_DUMPS=DIR` also writes each case as `DIR/SEED.BACKEND.txt` (to
//! run a natledger binary over them with `doctor --from`). No root, no namespaces.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use natledger::analysis::doctor::{
    Finding, Kind, RuleRef, Ruleset, check_rulesets, check_rulesets_within,
};
use natledger::analysis::iptables::packet::{Addresses, Packet};
use natledger::analysis::iptables::paths::{LIMITS, Limits};
use natledger::analysis::verdict::Tri;
use natledger::backend::Backend;
use natledger::model::anyrule::{Cond, Match, Target, parse_rule};
use natledger::model::family::Family;
use natledger::model::portspec::PortRange;
use natledger::model::save::{Dump, parse_dump};

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const PORTS: [&str; 6] = ["80", "443", "8080", "30080", "80:90", "8000:8063"];
const NETS: [&str; 7] = [
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.0/24",
    "10.1.2.3/32",
    "192.168.0.0/16",
    "192.168.1.5/32",
    "127.0.0.0/8",
];
const IFACES: [&str; 3] = ["eth0", "docker0", "cni+"];

/// The conditions of one rule, in `*-save` order.
fn conditions(rng: &mut Rng, out: &mut String) {
    let neg = |rng: &mut Rng| if rng.chance(20) { "! " } else { "" };
    if rng.chance(30) {
        let _ = write!(out, " {}-s {}", neg(rng), rng.pick(&NETS));
    }
    if rng.chance(35) {
        let _ = write!(out, " {}-d {}", neg(rng), rng.pick(&NETS));
    }
    if rng.chance(15) {
        let _ = write!(out, " {}-i {}", neg(rng), rng.pick(&IFACES));
    }
    let proto = rng.chance(75).then(|| *rng.pick(&["tcp", "udp"]));
    if let Some(p) = proto {
        let _ = write!(out, " -p {p}");
    }
    if rng.chance(25) {
        let _ = write!(out, " -m addrtype {}--dst-type LOCAL", neg(rng));
    }
    if let Some(p) = proto {
        match rng.below(10) {
            0..=4 => {
                let _ = write!(out, " -m {p} {}--dport {}", neg(rng), rng.pick(&PORTS));
            }
            5 | 6 => {
                let a = rng.pick(&PORTS[..4]);
                let b = rng.pick(&PORTS);
                let _ = write!(out, " -m multiport {}--dports {a},{b}", neg(rng));
            }
            _ => {}
        }
    }
}

/// A nat and a filter table, as `iptables-save` prints them.
fn ruleset(rng: &mut Rng) -> String {
    let mut out = String::new();
    for (table, hooks, shared, targets) in [
        (
            "nat",
            &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"][..],
            ["PREROUTING", "OUTPUT"],
            &["DNAT", "DNAT", "DNAT", "ACCEPT", "RETURN", "DROP"][..],
        ),
        (
            "filter",
            &["INPUT", "FORWARD", "OUTPUT"][..],
            ["INPUT", "OUTPUT"],
            &["ACCEPT", "ACCEPT", "DROP", "REJECT", "RETURN"][..],
        ),
    ] {
        let users = ["SHARED", "SUB1", "SUB2"];
        let _ = writeln!(out, "*{table}");
        for h in hooks {
            let _ = writeln!(out, ":{h} ACCEPT [0:0]");
        }
        for u in users {
            let _ = writeln!(out, ":{u} - [0:0]");
        }
        // Built-in chains that jump into SHARED (both of `shared`), users into later users.
        let chains: Vec<&str> = shared.iter().copied().chain(users).collect();
        for chain in chains {
            let n = 1 + rng.below(6);
            let jump_at = shared.contains(&chain).then(|| rng.below(n));
            for i in 0..n {
                let _ = write!(out, "-A {chain}");
                conditions(rng, &mut out);
                let later: Vec<&str> = match chain {
                    c if shared.contains(&c) => users.to_vec(),
                    "SHARED" => vec!["SUB1", "SUB2"],
                    "SUB1" => vec!["SUB2"],
                    _ => vec![],
                };
                if jump_at == Some(i) {
                    let _ = writeln!(out, " -j SHARED");
                    continue;
                }
                if !later.is_empty() && rng.chance(20) {
                    let _ = writeln!(out, " -j {}", rng.pick(&later));
                    continue;
                }
                match *rng.pick(targets) {
                    "DNAT" => {
                        let _ = writeln!(
                            out,
                            " -j DNAT --to-destination 10.9.{}.{}:{}",
                            rng.below(3),
                            2 + rng.below(3),
                            rng.pick(&["80", "8080"])
                        );
                    }
                    "RETURN" if shared.contains(&chain) => {
                        let _ = writeln!(out, " -j ACCEPT");
                    }
                    t => {
                        let _ = writeln!(out, " -j {t}");
                    }
                }
            }
        }
        let _ = writeln!(out, "COMMIT");
    }
    out
}

/// One chain's rules of a table, parsed.
struct Chains<'t> {
    rules: HashMap<&'t str, Vec<(Match, Target)>>,
}

impl<'t> Chains<'t> {
    fn of(table: &'t Dump) -> Chains<'t> {
        let mut rules: HashMap<&str, Vec<(Match, Target)>> = HashMap::new();
        for (c, _) in &table.chains {
            rules.entry(c).or_default();
        }
        for r in &table.rules {
            rules.entry(&r.chain).or_default().push(parse_rule(&r.args));
        }
        Chains { rules }
    }

    fn jumps_to<'a>(&self, target: &'a Target) -> Option<&'a str> {
        match target {
            Target::Jump(c) | Target::Goto(c) if self.rules.contains_key(c.as_str()) => Some(c),
            _ => None,
        }
    }

    /// The path conditions of every way from `chain` to rule `at` (chain, 1-based position).
    fn paths_to(
        &self,
        chain: &str,
        at: (&str, usize),
        cond: &Match,
        stack: &mut Vec<String>,
    ) -> Vec<Match> {
        if stack.len() > 16 || stack.iter().any(|c| c == chain) {
            return vec![];
        }
        stack.push(chain.to_string());
        let mut out = vec![];
        for (i, (own, target)) in self.rules[chain].iter().enumerate() {
            let here = cond.and(own);
            if (chain, i + 1) == at {
                out.push(here.clone());
            }
            if let Some(to) = self.jumps_to(target) {
                out.extend(self.paths_to(to, at, &here, stack));
            }
        }
        stack.pop();
        out
    }

    /// Evaluate `chain` for `p` as the kernel does: every rule visited, whether it matched,
    /// and the rule that took the packet (a verdict), if any. `None` when some condition is
    /// undecided for the packet.
    fn eval(
        &self,
        chain: &str,
        p: &Packet,
        trace: &mut Vec<(String, usize, bool)>,
        depth: usize,
    ) -> Option<Flow> {
        if depth > 16 {
            return None;
        }
        for (i, (own, target)) in self.rules[chain].iter().enumerate() {
            let hit = match p.test(own) {
                Tri::Yes => true,
                Tri::No => false,
                Tri::Maybe => return None,
            };
            trace.push((chain.to_string(), i + 1, hit));
            if !hit {
                continue;
            }
            if let Some(to) = self.jumps_to(target) {
                match self.eval(to, p, trace, depth + 1)? {
                    Flow::Back if matches!(target, Target::Goto(_)) => return Some(Flow::Back),
                    Flow::Back => continue,
                    taken => return Some(taken),
                }
            }
            match target {
                Target::Return => return Some(Flow::Back),
                t if t.is_terminal() => return Some(Flow::Taken(chain.to_string(), i + 1)),
                _ => {}
            }
        }
        Some(Flow::Back)
    }
}

#[derive(Debug, PartialEq)]
enum Flow {
    Taken(String, usize),
    Back,
}

/// Sets one fact of a packet.
type Setter = Box<dyn Fn(&mut Packet)>;

/// A concrete packet matching every condition of `m`, chosen dimension by dimension from the
/// values the conditions name (and their neighbours); `None` if none fits or a condition is
/// not one the generator writes.
fn witness(m: &Match) -> Option<Packet> {
    let mut ports: Vec<u16> = vec![1, 5000, 65535];
    let mut addrs: Vec<Ipv4Addr> = vec![Ipv4Addr::new(172, 16, 0, 1)];
    for c in &m.conds {
        match c {
            Cond::DPorts { ports: set, .. } => {
                for &(lo, hi) in &set.0 {
                    ports.extend([lo, hi, lo.saturating_sub(1), hi.saturating_add(1)]);
                }
            }
            Cond::Src { net, .. } | Cond::Dst { net, .. } => {
                let IpAddr::V4(a) = net.addr else { return None };
                let base = u32::from(a);
                let size = 1u64 << (32 - u32::from(net.prefix));
                let last = (u64::from(base) + size - 1) as u32;
                addrs.extend(
                    [base, base.wrapping_add(1), last, last.wrapping_add(1)].map(Ipv4Addr::from),
                );
            }
            Cond::Protocol { .. } | Cond::DstType { .. } | Cond::InIface { .. } => {}
            _ => return None,
        }
    }
    let base = Packet {
        protocol: Some(6),
        src: Addresses::Exactly(IpAddr::V4(addrs[0])),
        dst: Addresses::Exactly(IpAddr::V4(addrs[0])),
        dports: Some(PortRange::single(ports[0])),
        dst_local: Some(false),
        in_iface: Some("eth0".into()),
        ..Packet::unknown(Family::Ipv4)
    };
    // Conditions of one dimension only decide it: choose each in turn.
    let only = |keep: fn(&Cond) -> bool| Match {
        conds: m.conds.iter().filter(|c| keep(c)).cloned().collect(),
    };
    let choose = |p: &mut Packet, conds: &Match, options: Vec<Setter>| -> bool {
        options.into_iter().any(|set| {
            set(p);
            p.test(conds) == Tri::Yes
        })
    };
    let mut p = base;
    let ok = choose(
        &mut p,
        &only(|c| matches!(c, Cond::Protocol { .. })),
        [6u8, 17, 1]
            .into_iter()
            .map(|n| Box::new(move |p: &mut Packet| p.protocol = Some(n)) as _)
            .collect(),
    ) && choose(
        &mut p,
        &only(|c| matches!(c, Cond::DPorts { .. })),
        ports
            .iter()
            .map(|&n| Box::new(move |p: &mut Packet| p.dports = Some(PortRange::single(n))) as _)
            .collect(),
    ) && choose(
        &mut p,
        &only(|c| matches!(c, Cond::Src { .. })),
        addrs
            .iter()
            .map(|&a| {
                Box::new(move |p: &mut Packet| p.src = Addresses::Exactly(IpAddr::V4(a))) as _
            })
            .collect(),
    ) && choose(
        &mut p,
        &only(|c| matches!(c, Cond::Dst { .. })),
        addrs
            .iter()
            .map(|&a| {
                Box::new(move |p: &mut Packet| p.dst = Addresses::Exactly(IpAddr::V4(a))) as _
            })
            .collect(),
    ) && choose(
        &mut p,
        &only(|c| matches!(c, Cond::DstType { .. })),
        [true, false]
            .into_iter()
            .map(|b| Box::new(move |p: &mut Packet| p.dst_local = Some(b)) as _)
            .collect(),
    ) && choose(
        &mut p,
        &only(|c| matches!(c, Cond::InIface { .. })),
        ["eth0", "docker0", "cni0", "lo"]
            .into_iter()
            .map(|i| Box::new(move |p: &mut Packet| p.in_iface = Some(i.into())) as _)
            .collect(),
    );
    (ok && p.test(m) == Tri::Yes).then_some(p)
}

/// What checking one case found.
#[derive(Default)]
struct Tally {
    claims: usize,
    witnesses: usize,
    /// Witnesses taken (or returned) by one of the earlier rules the findings name.
    by_named: usize,
    unconfirmable: usize,
    /// Of those, claims about a rule no packet can reach (every path's conditions contradict
    /// each other: it never matches, whatever takes what).
    unreachable: usize,
}

/// Check every shadow claim of `findings` against the tables by packets; `Err` names the
/// first claim a packet refutes. A rule reached by several paths of one hook may be shadowed
/// by a different earlier rule on each (and named in each one's finding): a packet of any
/// path must never reach the shadowed rule and match it (the packet is taken or returned by
/// one of the earlier rules named, or by a rule before them).
fn confirm(sets: &[Ruleset], findings: &[Finding], tally: &mut Tally) -> Result<(), String> {
    type Claim<'f> = (&'f RuleRef, &'f str);
    let mut claims: Vec<(Claim, Vec<&RuleRef>, &str)> = Vec::new();
    for f in findings.iter().filter(|f| f.kind == Kind::Shadowed) {
        let by = &f.rules[0];
        for b in &f.rules[1..] {
            if b.hooks.is_empty() {
                return Err(format!("no hooks on a shadowed rule: {}", b.line));
            }
            for hook in &b.hooks {
                let same = |r: &RuleRef| {
                    (r.backend, r.family, &r.table, &r.chain, r.position)
                        == (b.backend, b.family, &b.table, &b.chain, b.position)
                };
                match claims.iter_mut().find(|((r, h), ..)| same(r) && h == hook) {
                    Some((_, bys, _)) => bys.push(by),
                    None => claims.push(((b, hook), vec![by], &f.summary)),
                }
            }
        }
    }
    let mut parsed: HashMap<(Backend, String), Chains> = HashMap::new();
    for ((b, hook), bys, summary) in claims {
        tally.claims += 1;
        let set = sets
            .iter()
            .find(|s| s.backend == b.backend && s.family == b.family)
            .ok_or("no such ruleset")?;
        let table = set.table(&b.table).ok_or("no such table")?;
        let key = (b.backend, b.table.clone());
        if !parsed.contains_key(&key) {
            parsed.insert(key.clone(), Chains::of(table));
        }
        let chains = &parsed[&key];
        let paths = chains.paths_to(hook, (&b.chain, b.position), &Match::default(), &mut vec![]);
        let mut confirmed = 0;
        for path in paths.iter().filter(|m| !m.is_empty()) {
            let Some(p) = witness(path) else { continue };
            let mut trace = vec![];
            let Some(flow) = chains.eval(hook, &p, &mut trace, 0) else {
                continue;
            };
            tally.witnesses += 1;
            confirmed += 1;
            let shown = || {
                let names: Vec<&str> = bys.iter().map(|r| r.line.as_str()).collect();
                format!(
                    "{hook}: {p:?}\n  rule {}\n  claimed shadowed by {names:?}\n  ends {flow:?}\n  summary: {summary}",
                    b.line
                )
            };
            if flow == Flow::Taken(b.chain.clone(), b.position) {
                return Err(format!(
                    "taken by the rule claimed never to match: {}",
                    shown()
                ));
            }
            if trace
                .iter()
                .any(|(c, n, hit)| *hit && *c == b.chain && *n == b.position)
            {
                return Err(format!(
                    "the rule claimed never to match matches: {}",
                    shown()
                ));
            }
            // How often one of the earlier rules named takes (or returns) it itself; otherwise a
            // rule before them took it, or a RETURN before them took it out of their chain.
            let is_a = |(c, n, hit): &(String, usize, bool)| {
                *hit && bys.iter().any(|a| *c == a.chain && *n == a.position)
            };
            if trace.iter().any(is_a) {
                tally.by_named += 1;
            }
        }
        if confirmed == 0 {
            tally.unconfirmable += 1;
            if paths.iter().all(Match::is_empty) {
                tally.unreachable += 1;
            }
        }
    }
    Ok(())
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Generate `cases` cases from seed `first`, run `check` on each and confirm its claims by
/// packets (panicking on the first refuted one); the tally.
fn run_cases(
    cases: u64,
    first: u64,
    check: impl Fn(&[Ruleset]) -> Vec<Finding> + std::panic::RefUnwindSafe,
) -> Tally {
    let mut tally = Tally::default();
    let started = std::time::Instant::now();
    let mut doctor_time = std::time::Duration::ZERO;
    for seed in first..first + cases {
        let mut rng = Rng::new(seed);
        // Sometimes the same host's two backends (the walks of both are keyed apart).
        let texts: Vec<String> = (0..if rng.chance(20) { 2 } else { 1 })
            .map(|_| ruleset(&mut rng))
            .collect();
        let sets: Vec<Ruleset> = texts
            .iter()
            .zip(Backend::ALL)
            .map(|(text, backend)| Ruleset {
                backend,
                family: Family::Ipv4,
                source: format!("seed {seed}"),
                tables: parse_dump(text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}")),
            })
            .collect();
        let dump = || texts.join("\n");
        if let Ok(dir) = std::env::var("NATLEDGER_PROP_DUMPS") {
            // The cases as files, to run a natledger binary over them (`doctor --from`).
            for (text, set) in texts.iter().zip(&sets) {
                let file = format!("{dir}/{seed}.{}.txt", set.backend);
                std::fs::write(file, text).unwrap();
            }
        }
        let t0 = std::time::Instant::now();
        let findings = std::panic::catch_unwind(|| check(&sets))
            .unwrap_or_else(|_| panic!("seed {seed}: doctor panicked on\n{}", dump()));
        doctor_time += t0.elapsed();
        if let Err(e) = confirm(&sets, &findings, &mut tally) {
            panic!("seed {seed}: {e}\n{}", dump());
        }
    }
    eprintln!("doctor: {doctor_time:?}");
    eprintln!(
        "{cases} cases in {:?}: {} shadow claims, {} packets confirming them ({} taken by the earlier rule named), {} claims without a decidable packet ({} of rules no packet reaches)",
        started.elapsed(),
        tally.claims,
        tally.witnesses,
        tally.by_named,
        tally.unconfirmable,
        tally.unreachable
    );
    tally
}

#[test]
fn every_claimed_shadow_is_confirmed_by_packets() {
    let cases = env_number("NATLEDGER_PROP_CASES", 2_000);
    let first = env_number("NATLEDGER_PROP_SEED", 1);
    let tally = run_cases(cases, first, |sets| {
        check_rulesets(sets, Backend::IptablesNft).0
    });
    // The generator must exercise the check: shadows are common in random tables.
    assert!(
        tally.claims >= cases as usize / 4,
        "too few claims: {}",
        tally.claims
    );
    // Every claim has some path a concrete packet decides.
    assert_eq!(tally.unconfirmable, 0);
}

/// The same cases with every chain merged past its first path condition, and walked at most
/// twice: the claims of merged invocations, of chains entered again and not walked, and of
/// walks cut short, confirmed by packets as well.
#[test]
fn claims_are_confirmed_by_packets_when_chains_are_merged_and_walks_cut() {
    let cases = env_number("NATLEDGER_PROP_CASES", 2_000);
    let first = env_number("NATLEDGER_PROP_SEED", 1);
    let limits = Limits {
        exact_entries: 1,
        walks_per_chain: 2,
        ..LIMITS
    };
    let tally = run_cases(cases, first, |sets| {
        check_rulesets_within(sets, Backend::IptablesNft, limits).0
    });
    assert!(
        tally.claims >= cases as usize / 8,
        "too few claims: {}",
        tally.claims
    );
    // A merged invocation's conditions overstate its packets, so a rule no packet reaches
    // may be walked there (and claimed never to match, which holds); any other claim has a
    // path a concrete packet decides.
    assert_eq!(tally.unconfirmable, tally.unreachable);
}
