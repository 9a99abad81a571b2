//! The walk on synthetic rulesets: ladders of chains branching to the next (polynomial work,
//! the shadow at the bottom still found), merged invocations and skipped repeats claiming
//! nothing they cannot prove, and every bound reported where it stopped (text a step holds
//! of its own paid for too).

use super::super::tests::{dnat, table};
use super::super::*;

/// How each of a chain's jumps to the next is conditioned.
#[derive(Clone, Copy, Debug)]
enum Ways {
    /// `-j NEXT` each time: one condition per chain.
    Plain,
    /// `-m mark --mark K/K`, K the same few on every chain.
    SameMarks,
    /// A mark of its own on every jump: every path a different condition.
    OwnMarks,
    /// As `OwnMarks`, after a RETURN of a mark of the chain's own.
    OwnMarksAfterReturn,
}

/// PREROUTING → L0, each of `chains` chains jumping `ways` ways to the next, and at the
/// bottom a stale DNAT of port 8080 above the live one (which never matches).
fn ladder(chains: usize, ways: usize, kind: Ways) -> Dump {
    let mut text = String::from(":PREROUTING ACCEPT [0:0]\n");
    for i in 0..chains {
        text += &format!(":L{i} - [0:0]\n");
    }
    text += "-A PREROUTING -j L0\n";
    for i in 0..chains - 1 {
        if let Ways::OwnMarksAfterReturn = kind {
            text += &format!(
                "-A L{i} -m mark --mark {:#x}/0xffff -j RETURN\n",
                0x8000 + i
            );
        }
        for k in 0..ways {
            let mark = match kind {
                Ways::Plain => String::new(),
                Ways::SameMarks => format!("-m mark --mark {:#x}/{:#x} ", k + 1, k + 1),
                Ways::OwnMarks | Ways::OwnMarksAfterReturn => {
                    let m = i * ways + k + 1;
                    format!("-m mark --mark {m:#x}/{m:#x} ")
                }
            };
            text += &format!("-A L{i} {mark}-j L{}\n", i + 1);
        }
    }
    let last = chains - 1;
    text += &format!(
        "-A L{last} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.9.0.2:8080\n\
         -A L{last} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.9.0.3:8080"
    );
    table(&text)
}

fn walk_within<'t>(t: &'t Dump, parsed: &[(Match, Target)], limits: Limits) -> Walk<'t> {
    Walk::within(t, parsed, "PREROUTING", dnat, &Budget::new(limits))
}

/// The rules (chain, position) a walk claims never match (every step of theirs shadowed, as
/// the shadowed check judges), each with the rules that take their packets.
fn claims(w: &Walk) -> Vec<((String, usize), (String, usize))> {
    let place = |s: &Step| (s.rule.chain.clone(), s.position);
    let mut out = std::collections::BTreeSet::new();
    let mut matches = std::collections::HashSet::new();
    for (step, by) in w.reached() {
        match by {
            Some(by) => {
                out.insert((place(step), place(by)));
            }
            None => {
                matches.insert(place(step));
            }
        }
    }
    out.into_iter()
        .filter(|(rule, _)| !matches.contains(rule))
        .collect()
}

#[test]
fn branching_ladders_are_walked_in_polynomial_steps_and_their_bottom_shadow_found() {
    // Followed path by path these are 4^29 to 16^29 paths to the bottom chain.
    for (chains, ways, kind, at_most) in [
        // Steps at most: ten times what this walk takes (119, 235, 1,647, 6,641, 3,239,
        // 9,503, 14,027, 23,926), the rules once per chain and condition, or per merge.
        (30, 4, Ways::Plain, 1_200),
        (30, 8, Ways::Plain, 2_400),
        (30, 4, Ways::SameMarks, 16_000),
        (30, 8, Ways::SameMarks, 66_000),
        (30, 4, Ways::OwnMarks, 32_000),
        (30, 8, Ways::OwnMarks, 95_000),
        (31, 16, Ways::OwnMarks, 140_000),
        (30, 4, Ways::OwnMarksAfterReturn, 240_000),
    ] {
        let t = ladder(chains, ways, kind);
        let parsed = parse_table(&t);
        let w = walk_within(&t, &parsed, LIMITS);
        let case = format!("{chains} chains x {ways} ways, {kind:?}");
        assert!(w.complete(), "{case}: {:?}", w.cuts());
        assert!(
            w.steps().len() <= at_most,
            "{case}: {} steps",
            w.steps().len()
        );
        let bottom = format!("L{}", chains - 1);
        assert_eq!(
            claims(&w),
            [((bottom.clone(), 2), (bottom, 1))],
            "{case}: the stale DNAT takes the live one's packets"
        );
    }
}

#[test]
fn a_rule_of_a_merged_invocation_takes_packets_only_within_it() {
    // K is entered with a mark, then from 10.1.0.0/16: past one exact condition, the second
    // entry is merged to what both have in common (nothing), so K's DNAT of all tcp reads as
    // taking every tcp packet. It does not take PREROUTING's port 80 DNAT's packets (those
    // from elsewhere without the mark never enter K), but it does take those of K's own
    // port 80 DNAT below it, on both walks of K.
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:K - [0:0]\n\
         -A PREROUTING -m mark --mark 0x1/0x1 -j K\n\
         -A PREROUTING -s 10.1.0.0/16 -j K\n\
         -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.9:80\n\
         -A K -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
         -A K -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80",
    );
    let parsed = parse_table(&t);
    let limits = Limits {
        exact_entries: 1,
        ..LIMITS
    };
    let w = walk_within(&t, &parsed, limits);
    assert!(w.complete());
    let merged: Vec<_> = w.steps().iter().filter(|s| s.region.is_some()).collect();
    assert_eq!(merged.len(), 2, "{:?}", w.steps());
    assert_eq!(claims(&w), [(("K".into(), 2), ("K".into(), 1))]);
    // The whole table's shadowed rules: K's second DNAT only.
    let never: std::collections::HashSet<_> = w
        .reached()
        .filter(|(_, by)| by.is_some())
        .map(|(s, _)| (s.rule.chain.as_str(), s.position))
        .collect();
    assert_eq!(never, [("K", 2)].into_iter().collect());
}

#[test]
fn a_chain_entered_again_after_a_return_out_of_the_first_jump_is_walked_again() {
    // The first jump into K is inside A, after a RETURN of marked packets: those packets
    // meet only the second jump, so K's DNAT must be walked again there, where A's earlier
    // DNAT does not take them first.
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:K - [0:0]\n\
         -A PREROUTING -j A\n-A PREROUTING -j K\n\
         -A A -m mark --mark 0x1/0x1 -j RETURN\n\
         -A A -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
         -A A -j K\n\
         -A K -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80",
    );
    let parsed = parse_table(&t);
    let w = walk_within(&t, &parsed, LIMITS);
    let k: Vec<_> = w
        .reached()
        .filter(|(s, _)| s.rule.chain == "K")
        .map(|(_, by)| by.map(|b| b.rule.chain.clone()))
        .collect();
    assert_eq!(k, [Some("A".to_string()), None]);
    // Without the RETURN, the second jump adds nothing and is not walked.
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:K - [0:0]\n\
         -A PREROUTING -j A\n-A PREROUTING -j K\n\
         -A A -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
         -A A -j K\n\
         -A K -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80",
    );
    let parsed = parse_table(&t);
    let w = walk_within(&t, &parsed, LIMITS);
    assert_eq!(w.steps().iter().filter(|s| s.rule.chain == "K").count(), 1);
    assert_eq!(claims(&w), [(("K".into(), 1), ("A".into(), 1))]);
}

#[test]
fn a_goto_before_an_earlier_dnat_lets_packets_around_it() {
    // Marked packets go to G and, when G ends, back to PREROUTING past A's DNAT: that DNAT
    // does not take every packet of PREROUTING's own.
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:G - [0:0]\n\
         -A PREROUTING -j A\n\
         -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80\n\
         -A A -m mark --mark 0x1/0x1 -g G\n\
         -A A -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
         -A G -j MARK --set-xmark 0x2/0x2",
    );
    let parsed = parse_table(&t);
    let w = walk_within(&t, &parsed, LIMITS);
    assert!(claims(&w).is_empty(), "{:?}", claims(&w));
}

#[test]
fn chains_nested_too_deep_are_reported_and_nothing_below_is_claimed() {
    let t = ladder(MAX_DEPTH + 8, 2, Ways::Plain);
    let parsed = parse_table(&t);
    let w = walk_within(&t, &parsed, LIMITS);
    let cuts: Vec<_> = w
        .cuts()
        .iter()
        .map(|c| (c.rule.chain.as_str(), c.position, c.reason))
        .collect();
    let last = format!("L{}", MAX_DEPTH - 2);
    assert_eq!(
        cuts,
        [
            (last.as_str(), 1, CutReason::TooDeep),
            (last.as_str(), 2, CutReason::TooDeep)
        ]
    );
    assert!(!w.complete());
    assert!(claims(&w).is_empty());
}

#[test]
fn a_spent_budget_stops_the_walk_where_it_is_and_claims_nothing_after() {
    let t = ladder(30, 8, Ways::OwnMarks);
    let parsed = parse_table(&t);
    let limits = Limits {
        cells: 5_000,
        ..LIMITS
    };
    let w = walk_within(&t, &parsed, limits);
    assert_eq!(w.cuts().len(), 1, "{:?}", w.cuts());
    assert_eq!(w.cuts()[0].reason, CutReason::TooManySteps);
    assert!(claims(&w).is_empty());
    let cells: usize = w.steps().iter().map(|s| 1 + s.cond.conds.len()).sum();
    assert!(cells <= 5_000, "{cells}");

    // Few walks per chain: the jumps past them are not followed.
    let limits = Limits {
        walks_per_chain: 4,
        ..LIMITS
    };
    let w = walk_within(&t, &parsed, limits);
    assert!(!w.complete());
    assert!(
        w.cuts().iter().all(|c| c.reason == CutReason::TooManyPaths),
        "{:?}",
        w.cuts()
    );
    assert!(claims(&w).is_empty());

    // Few comparisons: the search for shadows stops, and says where.
    let t = ladder(3, 2, Ways::Plain);
    let parsed = parse_table(&t);
    let limits = Limits {
        comparisons: 0,
        ..LIMITS
    };
    let w = walk_within(&t, &parsed, limits);
    let cuts: Vec<_> = w
        .cuts()
        .iter()
        .map(|c| (c.rule.chain.as_str(), c.position, c.reason))
        .collect();
    assert_eq!(cuts, [("L2", 2, CutReason::TooManyComparisons)]);
    assert!(claims(&w).is_empty());
}

#[test]
fn text_a_step_holds_of_its_own_is_paid_for() {
    // Each step holds a 1,000-byte target text: 1 + 2 conditions + 10 cells of text.
    let to = "1".repeat(1000);
    let rule = format!("-A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination {to}\n");
    let t = table(&format!(":PREROUTING ACCEPT [0:0]\n{}", rule.repeat(3)));
    let parsed = parse_table(&t);
    let limits = Limits {
        cells: 30,
        ..LIMITS
    };
    let w = walk_within(&t, &parsed, limits);
    let cuts: Vec<_> = w.cuts().iter().map(|c| (c.position, c.reason)).collect();
    assert_eq!(cuts, [(3, CutReason::TooManySteps)]);
    assert_eq!(w.steps().len(), 2);
}
