//! Check 1: rules that never match because an earlier rule takes their packets.
//!
//! Shadows are found per walk (one hook of one table of one ruleset) and stay tied to it: a
//! chain reached from PREROUTING and OUTPUT (kube-proxy's KUBE-SERVICES) may shadow rules on
//! both, each named with the hook it never matches on. A rule is claimed on a hook only when
//! no path of that hook reaches it unshadowed.
//!
//! natledger's own DNATs of a container in force (alive, or its rules kept for live sharers:
//! `sharing::Needs`, judged through the host seam as doctor gathers its inputs) in front of
//! those of the holders it stacked on (`ops::Held::Stack`, its manifest's `stacked_on`) are
//! the stack working as meant: one informational finding saying who serves and who waits,
//! never a shadow error. A dead container's rule in front that no live one shares, or a
//! foreign one, is a shadow as before.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::words::{packets, target_text};
use super::{Checks, Walked, delete_fix, fix_for, port_of, rule_ref};
use crate::analysis::doctor::{Finding, Kind, RuleRef, Severity};
use crate::analysis::iptables::paths::Shadow;
use crate::analysis::iptables::paths::Step;
use crate::model::anyrule::{Cond, Target};
use crate::model::layout::{Owner, owner};

/// A rule of one table of one ruleset: (ruleset index, table, chain, position).
type RuleKey<'k> = (usize, &'k str, &'k str, usize);

/// One earlier rule and the rules it shadows.
struct Group<'w, 'a> {
    w: &'w Walked<'a>,
    by: &'w Step<'a>,
    /// Each shadowed rule once, with the hooks it never matches on.
    shadowed: Vec<(&'w Step<'a>, Vec<&'static str>)>,
}

impl Checks<'_> {
    /// Check 1: Rules that never match because an earlier one takes their packets: one finding
    /// per earlier rule, naming every rule it shadows and, when a rule is reached from other
    /// hooks where it does match, the packets it never matches (a duplicate is a note, anything
    /// else an error).
    pub(crate) fn shadowed(&mut self) {
        let set_of = |w: &Walked| {
            self.rulesets
                .iter()
                .position(|s| std::ptr::eq(s, w.set))
                .expect("a walk of one of the rulesets")
        };
        let key = |w: &Walked, s: &Step| -> (usize, &'static str, String, usize) {
            (set_of(w), w.table, s.rule.chain.clone(), s.position)
        };
        // Where each rule is reached at all, and where it may match (some path reaching it is
        // not shadowed), per hook.
        let mut reached: HashMap<RuleKey, Vec<&'static str>> = HashMap::new();
        let mut matches: HashSet<(RuleKey, &'static str)> = HashSet::new();
        for w in &self.walks {
            let set = set_of(w);
            for (step, by) in w.walk.reached() {
                let k = (set, w.table, step.rule.chain.as_str(), step.position);
                let hooks = reached.entry(k).or_default();
                if !hooks.contains(&w.hook) {
                    hooks.push(w.hook);
                }
                if by.is_none() {
                    matches.insert((k, w.hook));
                }
            }
        }
        type GroupKey = (usize, &'static str, String, usize, bool);
        let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
        for w in &self.walks {
            let set = set_of(w);
            for Shadow {
                shadowed: sb,
                by: sa,
            } in w.walk.shadows()
            {
                let k = (set, w.table, sb.rule.chain.as_str(), sb.position);
                if matches.contains(&(k, w.hook)) {
                    continue;
                }
                let duplicate = sa.target == sb.target;
                let (s, t, c, p) = key(w, sa);
                let group = groups.entry((s, t, c, p, duplicate)).or_insert(Group {
                    w,
                    by: sa,
                    shadowed: Vec::new(),
                });
                let same = |(b, _): &&mut (&Step, Vec<&'static str>)| {
                    b.rule.chain == sb.rule.chain && b.position == sb.position
                };
                match group.shadowed.iter_mut().find(same) {
                    Some((_, hooks)) if !hooks.contains(&w.hook) => hooks.push(w.hook),
                    Some(_) => {}
                    None => group.shadowed.push((sb, vec![w.hook])),
                }
            }
        }
        for ((.., duplicate), group) in groups {
            if let Some(stacked) = self.stacked(&group) {
                self.findings.push(stacked);
                continue;
            }
            let all_hooks = |sb: &Step| -> Vec<&'static str> {
                let k = (
                    set_of(group.w),
                    group.w.table,
                    sb.rule.chain.as_str(),
                    sb.position,
                );
                reached.get(&k).cloned().unwrap_or_default()
            };
            self.findings.push(finding(&group, duplicate, all_hooks));
        }
    }
}

impl Checks<'_> {
    /// A group that is a natledger stack: the earlier rule a container's in force, every rule it
    /// shadows a container's whose manifest that one's `stacked_on` names. Needs the host's
    /// manifests (not with `--from` dumps alone).
    fn stacked(&self, g: &Group) -> Option<Finding> {
        let host = self.host?;
        let manifest = |id: &str| {
            host.manifests
                .iter()
                .find(|m| m.container_id.as_str() == id)
        };
        let Owner::Container(newer) = owner(&g.by.rule.chain, &g.by.rule.args) else {
            return None;
        };
        let front = manifest(newer)?;
        let mut waiting: Vec<&str> = Vec::new();
        for (sb, _) in &g.shadowed {
            let Owner::Container(older) = owner(&sb.rule.chain, &sb.rule.args) else {
                return None;
            };
            manifest(older)?;
            if !front.stacked_on.iter().any(|id| id.as_str() == older) {
                return None;
            }
            if !waiting.contains(&older) {
                waiting.push(older);
            }
        }
        if !host.liveness.needed(&front.container_id) {
            return None;
        }
        let (port, protocol) = port_of(&g.shadowed[0].0.cond);
        let what = match (port, &protocol) {
            (Some(port), Some(proto)) => format!("{port}/{proto}"),
            (Some(port), None) => port.to_string(),
            _ => "the port".to_string(),
        };
        let mut rules = vec![rule_ref(g.w, g.by)];
        rules.extend(g.shadowed.iter().map(|(sb, hooks)| RuleRef {
            hooks: hooks.clone(),
            ..rule_ref(g.w, sb)
        }));
        Some(Finding {
            severity: Severity::Info,
            kind: Kind::Shadowed,
            port,
            protocol,
            summary: stacked_summary(newer, &what, &waiting),
            rules,
            evidence: vec![format!("natledger manifest: {newer} is stacked on them")],
            fix: None,
        })
    }
}

/// What a stack's finding says: who serves `what`, who waits behind it (in the chain's order)
/// and who serves when it goes.
fn stacked_summary(newer: &str, what: &str, waiting: &[&str]) -> String {
    match waiting {
        [one] => format!(
            "Stacked: {newer} serves {what}, {one} waits behind it and serves again when \
             {newer} goes."
        ),
        [next, .., last] => format!(
            "Stacked: {newer} serves {what}, {} and {last} wait behind it in that order; \
             {next} serves again when {newer} goes.",
            waiting[..waiting.len() - 1].join(", ")
        ),
        [] => format!("Stacked: {newer} serves {what}."),
    }
}

/// The finding of one group; `all_hooks` gives the hooks a rule is reached from.
fn finding(g: &Group, duplicate: bool, all_hooks: impl Fn(&Step) -> Vec<&'static str>) -> Finding {
    let (w, sa) = (g.w, g.by);
    let first = g.shadowed[0].0;
    let (port, protocol) = port_of(&first.cond);
    let n = g.shadowed.len();
    let later = never_matches(g, &all_hooks);
    let summary = if duplicate {
        format!(
            "{later}: {} {} rule {} of {} ({}).",
            if n == 1 {
                "it duplicates"
            } else {
                "they duplicate"
            },
            w.table,
            sa.position,
            sa.rule.chain,
            target_text(&sa.target)
        )
    } else {
        format!(
            "For {}, {} rule {} of {} ({}) takes every packet first, so {later}.",
            packets(&first.cond),
            w.table,
            sa.position,
            sa.rule.chain,
            target_text(&sa.target)
        )
    };
    let mut rules = vec![rule_ref(w, sa)];
    rules.extend(g.shadowed.iter().map(|(sb, hooks)| RuleRef {
        hooks: hooks.clone(),
        ..rule_ref(w, sb)
    }));
    Finding {
        evidence: counters_agree(w.table, sa, &g.shadowed),
        severity: if duplicate {
            Severity::Info
        } else {
            Severity::Error
        },
        kind: Kind::Shadowed,
        port,
        protocol,
        summary,
        rules,
        fix: Some(if duplicate {
            delete_fix(w, first)
        } else {
            fix_for(w, sa)
        }),
    }
}

/// The group's shadowed rules in words (`rule 3 of DOCKER (DNAT to …) never matches`, up to
/// five named), each narrowed to the packets of its hooks when it is reached from others too.
fn never_matches(g: &Group, all_hooks: &impl Fn(&Step) -> Vec<&'static str>) -> String {
    let w = g.w;
    let first = g.shadowed[0].0;
    // A rule that matches on another hook never matches only the packets of these hooks.
    let only = |sb: &Step, hooks: &[&'static str]| -> Option<String> {
        let everywhere = all_hooks(sb).iter().all(|h| hooks.contains(h));
        (!everywhere).then(|| {
            let words: Vec<&str> = hooks.iter().map(|h| hook_packets(w.table, h)).collect();
            words.join(" or ")
        })
    };
    let named: Vec<String> = g
        .shadowed
        .iter()
        .take(5)
        .map(|(sb, hooks)| {
            let rule = format!(
                "rule {} of {} ({})",
                sb.position,
                sb.rule.chain,
                target_text(&sb.target)
            );
            match only(sb, hooks) {
                Some(packets) if g.shadowed.len() > 1 => format!("{rule} for {packets}"),
                _ => rule,
            }
        })
        .collect();
    let n = g.shadowed.len();
    let more = match n {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    if n == 1 {
        match only(first, &g.shadowed[0].1) {
            Some(packets) => format!("{} never matches {packets}", named[0]),
            None => format!("{} never matches", named[0]),
        }
    } else {
        format!("{n} later rules never match: {}{more}", named.join(", "))
    }
}

/// What a `*-save -c` dump's counters add: the earlier rule has counted packets while the
/// rules it shadows have counted none (they were not reset in between, or the counts would
/// not be evidence either way).
fn counters_agree(table: &str, sa: &Step, shadowed: &[(&Step, Vec<&'static str>)]) -> Vec<String> {
    let taken = sa.rule.counters.map_or(0, |c| c.packets);
    let none = shadowed
        .iter()
        .all(|(sb, _)| sb.rule.counters.is_some_and(|c| c.packets == 0));
    if taken == 0 || !none {
        return Vec::new();
    }
    let plural = |n: u64, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let others = if shadowed.len() == 1 {
        format!(
            "rule {} of {} has matched none",
            shadowed[0].0.position, shadowed[0].0.rule.chain
        )
    } else {
        format!(
            "none of the {} rules it shadows has matched any",
            shadowed.len()
        )
    };
    vec![format!(
        "counters: {table} rule {} of {} has matched {} while {others}",
        sa.position,
        sa.rule.chain,
        plural(taken, "packet", "packets")
    )]
}

/// The packets a hook of a table sees, in words.
fn hook_packets(table: &str, hook: &str) -> &'static str {
    match (table, hook) {
        ("nat", "PREROUTING") => "packets coming in",
        (_, "OUTPUT") => "packets sent from this host",
        ("filter", "INPUT") => "packets to this host",
        ("filter", "FORWARD") => "forwarded packets",
        _ => "some packets",
    }
}

/// Rules whose being shadowed matters: port forwards in nat, port-specific verdicts in filter.
pub(super) fn interesting(table: &str, step: &Step) -> bool {
    match table {
        "nat" => matches!(step.target, Target::Dnat { .. } | Target::Redirect { .. }),
        _ => {
            matches!(step.target, Target::Accept | Target::Drop | Target::Reject)
                && step
                    .cond
                    .conds
                    .iter()
                    .any(|c| matches!(c, Cond::DPorts { negated: false, .. }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stacked_summary;
    use crate::analysis::doctor::checks::{Checks, Host};
    use crate::analysis::doctor::{Finding, Kind, Ruleset, Severity, paths};
    use crate::backend::{Backend, Detected};
    use crate::kernel::machine::fake::{BOOT_ID, FakeHost, netns};
    use crate::model::family::Family;
    use crate::model::save::parse_dump;
    use crate::state::ledger::tests::{cni_sample, sample};
    use crate::state::ledger::{Manifest, Shared};
    use std::path::Path;

    /// b+eth0 (namespace 2) stacked on a+eth0 (namespace 1) for 8080, its DNAT first.
    const STACK: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :NATLEDGER-HOSTPORTS - [0:0]\n\
        -A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger \
        -j NATLEDGER-HOSTPORTS\n\
        -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment \
        natledger:b+eth0 -j DNAT --to-destination 10.77.0.3:80\n\
        -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment \
        natledger:a+eth0 -j DNAT --to-destination 10.77.0.2:80\nCOMMIT\n";

    /// The older, the newer stacked on it, and a hook container of the newer's namespace
    /// sharing its rules (process 4242).
    fn manifests() -> Vec<Manifest> {
        let older = cni_sample("a", Path::new("/run/netns/cni-1"), Some(netns(1)));
        let mut newer = cni_sample("b", Path::new("/run/netns/cni-2"), Some(netns(2)));
        newer.stacked_on = vec![older.container_id.clone()];
        let mut sharer = sample();
        sharer.container_id = "app".parse().unwrap();
        sharer.boot_id = Some(BOOT_ID.into());
        sharer.rules = Vec::new();
        sharer.shares = vec![Shared {
            holder: newer.container_id.clone(),
            mappings: newer.mappings.clone(),
        }];
        newer.shared_by = vec![sharer.container_id.clone()];
        vec![older, newer, sharer]
    }

    /// The shadow check's findings on [`STACK`] with the host `fake`.
    fn shadowed(fake: &FakeHost) -> Vec<Finding> {
        let sets = [Ruleset {
            backend: Backend::IptablesNft,
            family: Family::Ipv4,
            source: "test".into(),
            tables: parse_dump(STACK).unwrap(),
        }];
        let host = Host::of_manifests(manifests(), fake);
        let detected = Detected {
            backend: Backend::IptablesNft,
            how: "test".into(),
        };
        let mut checks = Checks::new(&sets, Some(&host), detected, paths::LIMITS);
        checks.shadowed();
        checks.finish().0
    }

    /// The one finding's severity and summary.
    fn one(found: Vec<Finding>) -> (Severity, String) {
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].kind, Kind::Shadowed);
        (found[0].severity, found[0].summary.clone())
    }

    /// Judged through the host doctor gathered, never the machine: the newer in front is the
    /// stack working (information) while its rules are needed, alive or dead with a live
    /// container of its namespace sharing them; dead with no live sharer, a shadow error.
    #[test]
    fn a_stack_is_information_while_the_newer_s_rules_are_needed() {
        let both = FakeHost::default()
            .with_namespace("/run/netns/cni-1", netns(1))
            .with_namespace("/run/netns/cni-2", netns(2));
        let stacked = "Stacked: b+eth0 serves 8080/tcp, a+eth0 waits behind it";
        let (severity, summary) = one(shadowed(&both));
        assert_eq!(severity, Severity::Info);
        assert!(summary.starts_with(stacked), "{summary}");

        // The newer's namespace gone, its sharer alive: its rules are kept, the stack holds.
        let kept = FakeHost::default()
            .with_namespace("/run/netns/cni-1", netns(1))
            .with_process(4242, 123456, netns(2));
        let (severity, summary) = one(shadowed(&kept));
        assert_eq!(severity, Severity::Info);
        assert!(summary.starts_with(stacked), "{summary}");

        // Nobody keeps the newer's rules: its DNAT shadows the older's.
        let dead = FakeHost::default().with_namespace("/run/netns/cni-1", netns(1));
        let (severity, summary) = one(shadowed(&dead));
        assert_eq!(severity, Severity::Error);
        assert!(!summary.starts_with("Stacked"), "{summary}");
    }

    #[test]
    fn a_stack_says_who_waits_in_agreement() {
        assert_eq!(
            stacked_summary("b+eth0", "8080/tcp", &["a+eth0"]),
            "Stacked: b+eth0 serves 8080/tcp, a+eth0 waits behind it and serves again when \
             b+eth0 goes."
        );
        assert_eq!(
            stacked_summary("c+eth0", "8080/tcp", &["b+eth0", "a+eth0"]),
            "Stacked: c+eth0 serves 8080/tcp, b+eth0 and a+eth0 wait behind it in that order; \
             b+eth0 serves again when c+eth0 goes."
        );
        assert_eq!(
            stacked_summary("d", "the port", &["c", "b", "a"]),
            "Stacked: d serves the port, c, b and a wait behind it in that order; c serves \
             again when d goes."
        );
    }
}
