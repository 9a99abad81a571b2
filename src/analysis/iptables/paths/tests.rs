//! `Walk`'s unit tests (shadows, returns, gotos); `table` and `dnat` are shared with the
//! bounded walk's (`walker/tests.rs`).

use super::*;
use crate::model::save::parse_dump;

pub(super) fn table(lines: &str) -> Dump {
    parse_dump(&format!("*nat\n{lines}\nCOMMIT\n"))
        .unwrap()
        .remove(0)
}

pub(super) fn dnat(step: &Step) -> bool {
    matches!(step.target, Target::Dnat { .. })
}

/// The steps of `hook`, and whether the walk was complete.
fn walk<'t>(t: &'t Dump, parsed: &[(Match, Target)], hook: &str) -> (Vec<Step<'t>>, bool) {
    let w = walker::walk(t, parsed, hook, &Budget::new(LIMITS));
    (w.steps, w.cuts.is_empty())
}

fn shadows(steps: &[Step], interesting: impl Fn(&Step) -> bool) -> Vec<Found> {
    super::shadows(steps, interesting, &Budget::new(LIMITS)).0
}

#[test]
fn walks_jumps_depth_first_with_path_conditions() {
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n\
         -A PREROUTING -m addrtype --dst-type LOCAL -j SVC\n\
         -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.9:80\n\
         -A SVC -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80",
    );
    let parsed = parse_table(&t);
    let (steps, complete) = walk(&t, &parsed, "PREROUTING");
    assert!(complete);
    let order: Vec<(&str, usize)> = steps
        .iter()
        .map(|s| (s.rule.chain.as_str(), s.position))
        .collect();
    assert_eq!(order, [("PREROUTING", 1), ("SVC", 1), ("PREROUTING", 2)]);
    // The DNAT in SVC carries the jump's LOCAL condition, so it does not cover the later
    // DNAT for every destination: no shadow.
    assert!(shadows(&steps, dnat).is_empty());
}

#[test]
fn an_earlier_covering_dnat_shadows_and_a_narrower_one_does_not() {
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n\
         -A PREROUTING -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.0.0.5:6667\n\
         -A PREROUTING -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.0.0.6:6667\n\
         -A PREROUTING -s 10.1.0.0/16 -p tcp -m tcp --dport 7000 -j DNAT --to-destination 10.0.0.7:7000\n\
         -A PREROUTING -p tcp -m tcp --dport 7000 -j DNAT --to-destination 10.0.0.8:7000",
    );
    let parsed = parse_table(&t);
    let (steps, _) = walk(&t, &parsed, "PREROUTING");
    let found = shadows(&steps, dnat);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].by, found[0].shadowed), (0, 1));
}

#[test]
fn a_covering_return_shadows_the_rest_of_its_chain_only() {
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n\
         -A PREROUTING -j A\n\
         -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80\n\
         -A A -p tcp -j RETURN\n\
         -A A -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80",
    );
    let parsed = parse_table(&t);
    let (steps, _) = walk(&t, &parsed, "PREROUTING");
    let found = shadows(&steps, dnat);
    assert_eq!(found.len(), 1);
    assert_eq!(steps[found[0].shadowed].rule.chain, "A");
    assert_eq!(steps[found[0].by].target, Target::Return);
}

#[test]
fn a_return_that_lets_packets_around_the_earlier_rule_prevents_the_claim() {
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n\
         -A PREROUTING -j DOCKER\n\
         -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 172.17.0.7:80\n\
         -A DOCKER -i docker0 -j RETURN\n\
         -A DOCKER -p tcp -m tcp --dport 80 -j DNAT --to-destination 172.17.0.2:80",
    );
    let parsed = parse_table(&t);
    let (steps, _) = walk(&t, &parsed, "PREROUTING");
    assert!(shadows(&steps, dnat).is_empty());
}

#[test]
fn a_multiport_jump_files_under_the_ports_it_leaves() {
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:PM - [0:0]\n\
         -A PREROUTING -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.0.0.1:443\n\
         -A PREROUTING -p tcp -m multiport --dports 80,443 -j PM\n\
         -A PM -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.0.0.2:443",
    );
    let parsed = parse_table(&t);
    let (steps, _) = walk(&t, &parsed, "PREROUTING");
    let found = shadows(&steps, dnat);
    assert_eq!(found.len(), 1);
    assert_eq!(steps[found[0].shadowed].rule.chain, "PM");
}

#[test]
fn loops_and_missing_chains_end_the_walk() {
    let t = table(
        ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n\
         -A PREROUTING -j A\n-A A -j B\n-A B -j A\n-A B -j NOWHERE",
    );
    let parsed = parse_table(&t);
    let (steps, complete) = walk(&t, &parsed, "PREROUTING");
    assert!(complete);
    assert_eq!(steps.len(), 4);
}
