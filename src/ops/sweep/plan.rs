//! One table's sweep, planned from one dump: which of natledger's rules, jumps and chains
//! go, and the single transaction that removes them. Pure: no process, no file.

use std::collections::HashSet;

use serde::Serialize;

use crate::backend::Backend;
use crate::model::family::Family;
use crate::model::layout::{
    Owner, comment_and_target, is_owned_chain, jump_op, owned_chains, owner,
};
use crate::model::save::{Batch, Op, SavedRule, Table};

/// Who keeps their rules.
#[derive(Debug, Default)]
pub struct Claims {
    /// Containers whose rules stay: alive, or with a manifest that cannot be read.
    pub kept: HashSet<String>,
    /// Dead containers with a manifest (their rules are reported as theirs, not as orphans).
    pub dead: HashSet<String>,
    /// Remove everything natledger owns, chains and jumps included (`sweep --all`).
    pub all: bool,
}

/// Why a rule is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Tagged for a container whose manifest says it is dead.
    DeadContainer,
    /// Tagged for a container no manifest knows (reboot with restored rules, lost state).
    Orphan,
    /// A second copy of a shared jump.
    DuplicateJump,
    /// In, or jumping to, a natledger chain this version no longer uses.
    StaleChain,
    /// `sweep --all`.
    Uninstall,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::DeadContainer,
        Reason::Orphan,
        Reason::DuplicateJump,
        Reason::StaleChain,
        Reason::Uninstall,
    ];
}

/// A rule the plan removes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub chain: String,
    pub rule: Vec<String>,
    pub reason: Reason,
    /// The container its tag names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

#[derive(Debug)]
pub struct TablePlan {
    pub batch: Batch,
    pub rules: Vec<Removed>,
    pub chains: Vec<String>,
    /// natledger chains that must stay because a rule natledger did not write is in them or
    /// jumps to them (never removed: not ours).
    pub blocked: Vec<String>,
    /// natledger's rules (containers', shared, jumps) left in the table once the batch is
    /// applied.
    pub owned_after: usize,
}

/// A chain with at least this many rules to delete, and no more to keep, is rewritten
/// (`-F` and the kept rules appended again) instead of deleted rule by rule: iptables-nft
/// spends ~80 µs on each `-D` but ~45 µs on each `-A`, and a flush is one operation.
pub const REWRITE_AT: usize = 64;

/// Plan the removals in `name` (nat or filter) of one family, as `table` shows it.
pub fn plan(
    backend: Backend,
    name: crate::model::table::Table,
    table: &Table,
    family: Family,
    claims: &Claims,
) -> TablePlan {
    let mut out = TablePlan {
        batch: Batch::new(name.as_str()),
        rules: Vec::new(),
        chains: Vec::new(),
        blocked: Vec::new(),
        owned_after: 0,
    };

    // Container and shared rules in natledger chains, and what holds each chain in place.
    let owned: Vec<&str> = table
        .chains
        .iter()
        .map(|(c, _)| c.as_str())
        .filter(|c| is_owned_chain(c))
        .collect();
    // Per rule in a natledger chain: whether it goes, and whether natledger wrote it.
    let mut verdicts: Vec<(&SavedRule, Option<Removed>, bool)> = Vec::new();
    let mut held: HashSet<&str> = HashSet::new();
    let mut blockers: Vec<(&str, &SavedRule)> = Vec::new();
    for rule in &table.rules {
        let target = comment_and_target(&rule.args).1;
        if is_owned_chain(&rule.chain) {
            // A rule in a natledger chain that may stay holds the chain it jumps to.
            let certainly_gone = matches!(owner(&rule.chain, &rule.args),
                Owner::Container(id) if claims.all || !claims.kept.contains(id));
            if let (false, Some(to)) = (certainly_gone, target.filter(|t| is_owned_chain(t))) {
                held.insert(to);
            }
        }
        match owner(&rule.chain, &rule.args) {
            Owner::Container(id) => {
                let gone = claims.all || !claims.kept.contains(id);
                let reason = if claims.all {
                    Reason::Uninstall
                } else if claims.dead.contains(id) {
                    Reason::DeadContainer
                } else {
                    Reason::Orphan
                };
                if !gone {
                    held.insert(&rule.chain);
                }
                let removed = gone.then(|| removed(rule, reason, Some(id)));
                verdicts.push((rule, removed, true));
            }
            Owner::Shared => verdicts.push((rule, None, true)),
            Owner::Foreign if is_owned_chain(&rule.chain) => {
                blockers.push((&rule.chain, rule));
                verdicts.push((rule, None, false));
            }
            Owner::Foreign => {
                if let Some(to) = target.filter(|t| is_owned_chain(t)) {
                    blockers.push((to, rule));
                }
            }
            Owner::Jump { .. } => {}
        }
    }

    // Chains that go: all of them with --all, else those of other versions; only when
    // nothing kept is in them and no one else's rule is in or jumps to them.
    // (A chain of this version in the other family, an IPv6 `NATLEDGER-INPUT`, is stale too.)
    let current = owned_chains(backend, name.as_str(), family);
    let wanted_gone = |chain: &str| claims.all || !current.contains(&chain);
    let mut removable: HashSet<&str> = HashSet::new();
    for chain in owned.iter().copied().filter(|c| wanted_gone(c)) {
        let in_the_way: Vec<&SavedRule> = blockers
            .iter()
            .filter(|(c, _)| *c == chain)
            .map(|(_, r)| *r)
            .collect();
        if !in_the_way.is_empty() {
            for rule in in_the_way {
                out.blocked.push(format!(
                    "chain {chain} stays: a rule natledger did not write is in it or jumps to \
                     it: -A {} {}",
                    rule.chain,
                    rule.args.join(" ")
                ));
            }
        } else if !held.contains(chain) {
            removable.insert(chain);
        }
    }
    let shared_reason = if claims.all {
        Reason::Uninstall
    } else {
        Reason::StaleChain
    };
    for (rule, verdict, _) in &mut verdicts {
        if verdict.is_none() && removable.contains(rule.chain.as_str()) {
            *verdict = Some(removed(rule, shared_reason, None));
        }
    }

    // Per natledger chain: flush when it goes or when most of it goes, else exact deletes.
    // A chain is rewritten only when every rule kept is natledger's own: `*-save` can print
    // another owner's rule in a form that does not restore to the same rule.
    for chain in &owned {
        let (gone, kept): (Vec<_>, Vec<_>) = verdicts
            .iter()
            .filter(|(r, _, _)| r.chain == *chain)
            .partition(|(_, v, _)| v.is_some());
        if gone.is_empty() {
            continue;
        }
        let only_ours = kept.iter().all(|(_, _, ours)| *ours);
        let rewrite = removable.contains(chain)
            || (only_ours && gone.len() >= REWRITE_AT && gone.len() >= kept.len());
        if rewrite {
            out.batch.ops.push(Op::Flush(chain.to_string()));
            for (rule, _, _) in &kept {
                out.batch
                    .ops
                    .push(Op::Append(rule.chain.clone(), rule.args.clone()));
            }
        } else {
            for (rule, _, _) in &gone {
                out.batch
                    .ops
                    .push(Op::Delete(rule.chain.clone(), rule.args.clone()));
            }
        }
        out.rules
            .extend(gone.into_iter().filter_map(|(_, v, _)| v.clone()));
    }

    // Shared jumps: all with --all, and those into chains that go. A jump present more than
    // once loses every copy and is put back where it belongs (`layout::jump_op`: `-D`
    // removes the first match, which may be the copy in the wrong place).
    let mut copies: Vec<(&SavedRule, usize)> = Vec::new();
    for rule in &table.rules {
        let Owner::Jump { to } = owner(&rule.chain, &rule.args) else {
            continue;
        };
        let reason = if claims.all {
            Reason::Uninstall
        } else if removable.contains(to) {
            Reason::StaleChain
        } else {
            match copies.iter_mut().find(|(r, _)| *r == rule) {
                Some((_, n)) => *n += 1,
                None => copies.push((rule, 1)),
            }
            continue;
        };
        out.batch
            .ops
            .push(Op::Delete(rule.chain.clone(), rule.args.clone()));
        out.rules.push(removed(rule, reason, None));
    }
    for (rule, n) in copies.into_iter().filter(|(_, n)| *n > 1) {
        for _ in 0..n {
            out.batch
                .ops
                .push(Op::Delete(rule.chain.clone(), rule.args.clone()));
        }
        // Counted without this jump's copies, which are deleted first.
        let mut without = table.clone();
        without
            .rules
            .retain(|r| !(r.chain == rule.chain && r.args == rule.args));
        out.batch
            .ops
            .push(jump_op(&without, &rule.chain, rule.args.clone()));
        for _ in 1..n {
            out.rules.push(removed(rule, Reason::DuplicateJump, None));
        }
    }

    for chain in owned.iter().filter(|c| removable.contains(*c)) {
        out.batch.ops.push(Op::DeleteChain(chain.to_string()));
        out.chains.push(chain.to_string());
    }
    // Every rule removed is natledger's; a duplicated jump put back counts once.
    let owned_before = table
        .rules
        .iter()
        .filter(|r| !matches!(owner(&r.chain, &r.args), Owner::Foreign))
        .count();
    out.owned_after = owned_before.saturating_sub(out.rules.len());
    out
}

fn removed(rule: &SavedRule, reason: Reason, container: Option<&str>) -> Removed {
    Removed {
        chain: rule.chain.clone(),
        rule: rule.args.clone(),
        reason,
        container: container.map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::save::parse_dump;

    /// [`super::plan`] of the table the dump names.
    fn plan(backend: Backend, table: &Table, family: Family, claims: &Claims) -> TablePlan {
        let name = table.name.parse().expect("a table natledger writes");
        super::plan(backend, name, table, family, claims)
    }

    const JUMP_PRE: &str = "-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS";
    const JUMP_POST: &str = "-A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ";

    fn dnat(id: &str, port: u16) -> String {
        format!(
            "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport {port} -m comment --comment natledger:{id} \
             -j DNAT --to-destination 10.77.0.2:80"
        )
    }

    fn table(lines: &[String]) -> Table {
        let text = format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n\
             :NATLEDGER-HOSTPORTS - [0:0]\n:NATLEDGER-MASQ - [0:0]\n:NATLEDGERISH - [0:0]\n{}\nCOMMIT\n",
            lines.join("\n")
        );
        parse_dump(&text).unwrap().remove(0)
    }

    fn claims(kept: &[&str], dead: &[&str], all: bool) -> Claims {
        Claims {
            kept: kept.iter().map(|s| s.to_string()).collect(),
            dead: dead.iter().map(|s| s.to_string()).collect(),
            all,
        }
    }

    fn rendered(plan: &TablePlan) -> Vec<String> {
        plan.batch.render().lines().map(String::from).collect()
    }

    /// Foreign rules that look like natledger's: same port and target in another chain, our
    /// tag in another chain, our chain name as a substring, a similar comment in our chain.
    fn look_alikes() -> Vec<String> {
        vec![
            "-A DOCKER -p tcp -m tcp --dport 8080 -m comment --comment natledger:dead -j DNAT --to-destination 10.77.0.2:80".into(),
            "-A NATLEDGERISH -p tcp -m tcp --dport 8080 -m comment --comment natledger:dead -j DNAT --to-destination 10.77.0.2:80".into(),
            "-A PREROUTING -m comment --comment natledger-ish -j NATLEDGERISH".into(),
        ]
    }

    #[test]
    fn dead_and_orphan_rules_go_live_and_foreign_ones_stay() {
        let mut lines = vec![JUMP_PRE.to_string(), JUMP_POST.to_string()];
        lines.extend([dnat("live", 8081), dnat("dead", 8080), dnat("lost", 8082)]);
        lines.extend(look_alikes());
        let plan = plan(
            Backend::Nft,
            &table(&lines),
            Family::Ipv4,
            &claims(&["live"], &["dead"], false),
        );
        assert_eq!(
            rendered(&plan),
            [
                "*nat".to_string(),
                format!("-D{}", &dnat("dead", 8080)[2..]),
                format!("-D{}", &dnat("lost", 8082)[2..]),
                "COMMIT".into()
            ]
        );
        let reasons: Vec<_> = plan
            .rules
            .iter()
            .map(|r| (r.reason, r.container.as_deref()))
            .collect();
        assert_eq!(
            reasons,
            [
                (Reason::DeadContainer, Some("dead")),
                (Reason::Orphan, Some("lost"))
            ]
        );
        assert!(plan.chains.is_empty() && plan.blocked.is_empty());
        // The two jumps and the live DNAT stay; the look-alikes are not natledger's.
        assert_eq!(plan.owned_after, 3);
    }

    #[test]
    fn nothing_to_do_is_an_empty_batch() {
        let lines = vec![JUMP_PRE.to_string(), JUMP_POST.to_string(), dnat("live", 1)];
        let plan = plan(
            Backend::Nft,
            &table(&lines),
            Family::Ipv4,
            &claims(&["live"], &[], false),
        );
        assert!(plan.batch.is_empty());
    }

    #[test]
    fn all_removes_rules_jumps_and_chains_but_no_look_alike() {
        let mut lines = vec![JUMP_PRE.to_string(), JUMP_POST.to_string(), dnat("live", 1)];
        lines.extend(look_alikes());
        let plan = plan(
            Backend::Nft,
            &table(&lines),
            Family::Ipv4,
            &claims(&["live"], &[], true),
        );
        assert_eq!(
            rendered(&plan),
            [
                "*nat".to_string(),
                "-F NATLEDGER-HOSTPORTS".into(),
                format!("-D{}", &JUMP_PRE[2..]),
                format!("-D{}", &JUMP_POST[2..]),
                "-X NATLEDGER-HOSTPORTS".into(),
                "-X NATLEDGER-MASQ".into(),
                "COMMIT".into()
            ]
        );
        assert!(plan.rules.iter().all(|r| r.reason == Reason::Uninstall));
        assert_eq!(plan.chains, ["NATLEDGER-HOSTPORTS", "NATLEDGER-MASQ"]);
    }

    /// The guard's chain is an IPv4 chain: one in an IPv6 filter table (not natledger's
    /// writing; a hand-made or foreign tool's copy) is another version's, stale, and goes
    /// with its jump, while the IPv4 one stays.
    #[test]
    fn an_ipv6_guard_chain_is_stale() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:NATLEDGER-INPUT - [0:0]\n\
                    -A INPUT -m comment --comment natledger -j NATLEDGER-INPUT\n\
                    -A NATLEDGER-INPUT -d ::1/128 ! -i lo -m conntrack ! --ctstate DNAT -m \
                    comment --comment natledger -j DROP\nCOMMIT\n";
        let t = parse_dump(text).unwrap().remove(0);
        let v6 = plan(Backend::Nft, &t, Family::Ipv6, &claims(&[], &[], false));
        assert_eq!(v6.chains, ["NATLEDGER-INPUT"]);
        let text = rendered(&v6).join("\n");
        assert!(text.contains("-D INPUT -m comment --comment natledger -j NATLEDGER-INPUT"));
        assert!(text.contains("-X NATLEDGER-INPUT"), "{text}");
        let v4 = plan(Backend::Nft, &t, Family::Ipv4, &claims(&[], &[], false));
        assert!(v4.batch.is_empty() && v4.chains.is_empty());
    }

    #[test]
    fn the_localhost_guard_stays_until_all() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
                    :NATLEDGER-FORWARD - [0:0]\n:NATLEDGER-INPUT - [0:0]\n\
                    -A INPUT -m comment --comment natledger -j NATLEDGER-INPUT\n\
                    -A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD\n\
                    -A NATLEDGER-INPUT -d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate \
                    DNAT -m comment --comment natledger -j DROP\n\
                    -A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc \
                    10.77.0.2 --ctorigdstport 80 --ctreplsrcport 80 -m comment --comment \
                    natledger:dead -j ACCEPT\nCOMMIT\n";
        let t = parse_dump(text).unwrap().remove(0);
        let kept = plan(
            Backend::Nft,
            &t,
            Family::Ipv4,
            &claims(&[], &["dead"], false),
        );
        assert_eq!(
            rendered(&kept)[1..rendered(&kept).len() - 1],
            [
                "-D NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc 10.77.0.2 \
              --ctorigdstport 80 --ctreplsrcport 80 -m comment --comment natledger:dead -j ACCEPT"
            ]
        );
        assert!(kept.chains.is_empty() && kept.blocked.is_empty());
        let all = plan(Backend::Nft, &t, Family::Ipv4, &claims(&[], &[], true));
        let text = rendered(&all).join("\n");
        assert!(text.contains("-D INPUT -m comment --comment natledger -j NATLEDGER-INPUT"));
        assert!(text.contains("-F NATLEDGER-INPUT") && text.contains("-X NATLEDGER-INPUT"));
        assert_eq!(all.chains, ["NATLEDGER-FORWARD", "NATLEDGER-INPUT"]);
    }

    #[test]
    fn a_foreign_rule_in_or_into_a_chain_keeps_it() {
        let lines = vec![
            JUMP_PRE.to_string(),
            JUMP_POST.to_string(),
            "-A NATLEDGER-MASQ -s 10.0.0.0/8 -j MASQUERADE".into(),
            "-A DOCKER -j NATLEDGER-HOSTPORTS".into(),
        ];
        let plan = plan(
            Backend::Nft,
            &table(&lines),
            Family::Ipv4,
            &claims(&[], &[], true),
        );
        assert!(plan.chains.is_empty(), "{:?}", plan.chains);
        assert_eq!(plan.blocked.len(), 2, "{:?}", plan.blocked);
        assert!(plan.blocked[0].contains("-A DOCKER -j NATLEDGER-HOSTPORTS"));
        assert!(plan.blocked[1].contains("-A NATLEDGER-MASQ -s 10.0.0.0/8"));
        let text = rendered(&plan).join("\n");
        assert!(!text.contains("-X ") && !text.contains("-F "), "{text}");
        assert!(
            !text.contains("MASQUERADE") && !text.contains("DOCKER"),
            "{text}"
        );
        assert_eq!(plan.rules.len(), 2, "our two jumps still go");
    }

    #[test]
    fn stale_chains_of_another_version_and_duplicate_jumps_go() {
        let mut t = table(&[
            JUMP_PRE.to_string(),
            JUMP_PRE.to_string(),
            JUMP_POST.to_string(),
            "-A OUTPUT -m comment --comment natledger -j NATLEDGER-OLD".into(),
            "-A NATLEDGER-OLD -p udp -m comment --comment natledger:gone -j DNAT --to-destination 10.1.1.1".into(),
        ]);
        t.chains.push(("NATLEDGER-OLD".into(), "-".into()));
        let plan = plan(Backend::Nft, &t, Family::Ipv4, &claims(&[], &[], false));
        let reasons: Vec<Reason> = plan.rules.iter().map(|r| r.reason).collect();
        assert_eq!(
            reasons,
            [Reason::Orphan, Reason::StaleChain, Reason::DuplicateJump]
        );
        assert_eq!(plan.chains, ["NATLEDGER-OLD"]);
        // One PREROUTING jump (put back) and the POSTROUTING jump.
        assert_eq!(plan.owned_after, 2);
        let text = rendered(&plan);
        assert_eq!(text[1], "-F NATLEDGER-OLD");
        // Both copies go and one comes back at the top.
        let pre: Vec<&String> = text.iter().filter(|l| l.contains(" PREROUTING ")).collect();
        assert_eq!(pre.len(), 3, "{text:?}");
        assert!(pre[0].starts_with("-D") && pre[1].starts_with("-D"));
        assert!(pre[2].starts_with("-I PREROUTING 1 "));
        assert_eq!(text[text.len() - 2], "-X NATLEDGER-OLD");
    }

    #[test]
    fn a_chain_another_kept_rule_jumps_to_stays() {
        let mut t = table(&[
            "-A NATLEDGER-HOSTPORTS -m comment --comment natledger -j NATLEDGER-OLD".into(),
            dnat("gone", 1),
        ]);
        t.chains.push(("NATLEDGER-OLD".into(), "-".into()));
        let plan = plan(Backend::Nft, &t, Family::Ipv4, &claims(&[], &[], false));
        assert!(plan.chains.is_empty(), "{:?}", plan.chains);
        assert_eq!(
            rendered(&plan),
            [
                "*nat".to_string(),
                format!("-D{}", &dnat("gone", 1)[2..]),
                "COMMIT".into()
            ]
        );
    }

    #[test]
    fn a_chain_holding_a_foreign_rule_is_never_rewritten() {
        let mut lines: Vec<String> = (0..REWRITE_AT as u16)
            .map(|p| dnat("dead", 1000 + p))
            .collect();
        lines.push("-A NATLEDGER-HOSTPORTS -d 10.0.0.0/8 -p tcp -j RETURN".into());
        let plan = plan(
            Backend::Nft,
            &table(&lines),
            Family::Ipv4,
            &claims(&[], &["dead"], false),
        );
        let text = rendered(&plan);
        assert!(!text.iter().any(|l| l.starts_with("-F")), "{text:?}");
        assert_eq!(text.len(), REWRITE_AT + 2);
    }

    #[test]
    fn a_live_container_keeps_a_stale_chain() {
        let mut t = table(&[
            "-A OUTPUT -m comment --comment natledger -j NATLEDGER-OLD".into(),
            "-A NATLEDGER-OLD -p udp -m comment --comment natledger:old -j DNAT --to-destination 10.1.1.1".into(),
        ]);
        t.chains.push(("NATLEDGER-OLD".into(), "-".into()));
        let plan = plan(
            Backend::Nft,
            &t,
            Family::Ipv4,
            &claims(&["old"], &[], false),
        );
        assert!(plan.batch.is_empty());
    }

    #[test]
    fn a_mostly_dead_chain_is_rewritten_in_order() {
        let mut lines: Vec<String> = (0..REWRITE_AT as u16)
            .map(|p| dnat("dead", 1000 + p))
            .collect();
        lines.insert(10, dnat("live", 1));
        lines.push(dnat("live", 2));
        let plan = plan(
            Backend::Nft,
            &table(&lines),
            Family::Ipv4,
            &claims(&["live"], &["dead"], false),
        );
        let text = rendered(&plan);
        assert_eq!(
            text,
            [
                "*nat".to_string(),
                "-F NATLEDGER-HOSTPORTS".into(),
                dnat("live", 1),
                dnat("live", 2),
                "COMMIT".into()
            ]
        );
        assert_eq!(plan.rules.len(), REWRITE_AT);
    }
}
