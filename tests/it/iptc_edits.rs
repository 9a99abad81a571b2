//! Adversarial edits of the in-process iptables-legacy writer ([`iptc`]), each compared with
//! what iptables-legacy-restore gives for the same edit (`*-save -c`, counters included), in
//! a private namespace, IPv4 and IPv6: jumps and gotos crossing the edited ranges both ways,
//! the first, last and only rule of a chain removed (an empty user chain keeps its head and
//! RETURN, an empty built-in chain its policy), several chains at once, duplicate rules of
//! which only some are deleted, inserts into empty chains that are jumped to.

use crate::common::{Topology, in_netns, run_in};
use natledger::kernel::iptc::{self, Outcome, Place};

/// The xtables lock iptables takes by default (`XTABLES_LOCKFILE` unset).
fn lock() -> &'static std::path::Path {
    std::path::Path::new(iptc::XTABLES_LOCK)
}
use natledger::model::family::Family;
use natledger::model::rule::Rule;

fn rule(args: &str) -> Rule {
    Rule::parse_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap()
}

fn tool(family: Family, what: &str) -> String {
    format!("{}-legacy-{what}", family.tool_stem())
}

/// `*-save -c` of filter without comments and without the policy counters of INPUT and
/// OUTPUT (the namespace's own packets count there).
fn save_c(ns: &str, family: Family) -> String {
    let out = run_in(ns, &tool(family, "save"), &["-c", "-t", "filter"], None);
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.split_once(" [") {
            Some((policy, _)) if l.starts_with(":INPUT ") || l.starts_with(":OUTPUT ") => {
                format!("{policy} [-]\n")
            }
            _ => format!("{l}\n"),
        })
        .collect()
}

fn restore(ns: &str, family: Family, args: &[&str], text: &str) {
    let out = run_in(ns, &tool(family, "restore"), args, Some(text.as_bytes()));
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// User chains A, B, C (in table order) with jumps and gotos from before to after the
/// edited entries and back, into chains that the edits empty, and duplicates.
const BASE: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
:A - [0:0]\n:B - [0:0]\n:C - [0:0]\n:D - [0:0]\n\
[1:10] -A INPUT -p tcp -m tcp --dport 1 -j C\n\
[2:20] -A FORWARD -p tcp -m tcp --dport 1 -j ACCEPT\n\
[3:30] -A FORWARD -p tcp -m tcp --dport 2 -j B\n\
[4:40] -A FORWARD -p tcp -m tcp --dport 3 -j ACCEPT\n\
[5:50] -A OUTPUT -p tcp -m tcp --dport 4 -j ACCEPT\n\
[6:60] -A A -p tcp -m tcp --dport 5 -j C\n\
[7:70] -A A -p tcp -m tcp --dport 6 -j ACCEPT\n\
[8:80] -A A -p tcp -m tcp --dport 6 -j ACCEPT\n\
[9:90] -A A -p tcp -m tcp --dport 6 -j ACCEPT\n\
[10:100] -A A -p udp -g B\n\
[11:110] -A B -p udp -m udp --dport 7 -j DROP\n\
[12:120] -A B -p udp -m udp --dport 8 -j DROP\n\
[13:130] -A C -p tcp -m tcp --dport 9 -j B\n\
[14:140] -A C -p udp -g B\n\
[15:150] -A C -p tcp -m tcp --dport 10 -j ACCEPT\n\
[16:160] -A D -j C\n\
[17:170] -A D -j B\n\
COMMIT\n";

/// `(chain, rule)` edits checked against iptables-legacy-restore, from [`BASE`].
fn check(ns: &str, family: Family, what: &str, edits: &[(&str, &str, Option<Place>)]) {
    check_from(ns, family, BASE, what, edits)
}

/// Empty chains jumped to from before and after them (an empty chain's jumps name its
/// RETURN), an empty built-in chain, fallthrough rules (no target: libiptc writes a jump to
/// the next entry) and RETURNs beside the edited places.
const EMPTY: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
:A - [0:0]\n:E - [0:0]\n:F - [0:0]\n:G - [0:0]\n\
[1:10] -A INPUT -p tcp -m tcp --dport 1 -j E\n\
[2:20] -A INPUT -p tcp -m tcp --dport 2\n\
[3:30] -A A -j E\n\
[4:40] -A A -p tcp -m tcp --dport 3\n\
[5:50] -A A -j RETURN\n\
[6:60] -A F -p tcp -m tcp --dport 4 -j DROP\n\
[7:70] -A F -p tcp -m tcp --dport 5\n\
[8:80] -A G -g E\n\
[9:90] -A G -j F\n\
[10:100] -A G -j A\n\
COMMIT\n";

fn check_from(
    ns: &str,
    family: Family,
    base: &str,
    what: &str,
    edits: &[(&str, &str, Option<Place>)],
) {
    restore(ns, family, &["-c"], base);
    let mut text = String::from("*filter\n");
    for (chain, args, place) in edits {
        text += &match place {
            None => format!("-D {chain} {args}\n"),
            Some(Place::First) => format!("-I {chain} 1 {args}\n"),
            Some(Place::Last) => format!("-A {chain} {args}\n"),
        };
    }
    text += "COMMIT\n";
    restore(ns, family, &["--noflush"], &text);
    let expected = save_c(ns, family);
    restore(ns, family, &["-c"], base);
    let rules: Vec<(&str, Rule, Option<Place>)> =
        edits.iter().map(|(c, a, p)| (*c, rule(a), *p)).collect();
    let outcome = in_netns(ns, || {
        if rules[0].2.is_none() {
            let victims: Vec<(&str, &Rule)> = rules.iter().map(|(c, r, _)| (*c, r)).collect();
            iptc::delete(lock(), family, "filter", &victims).unwrap()
        } else {
            let placed: Vec<(&str, Rule, Place)> = rules
                .iter()
                .map(|(c, r, p)| (*c, r.clone(), p.unwrap()))
                .collect();
            iptc::insert(lock(), family, "filter", &placed, &[]).unwrap()
        }
    });
    assert_eq!(outcome, Outcome::Done(edits.len()), "{family} {what}");
    assert_eq!(save_c(ns, family), expected, "{family} {what}");
    // The kernel took it and iptables reads it back the same way it wrote it.
    restore(ns, family, &["-c"], &expected_restorable(&expected));
}

/// A save text as restore input (policies' masked counters back to zero).
fn expected_restorable(save: &str) -> String {
    save.replace(" [-]", " [0:0]")
}

#[test]
fn removals_and_inserts_across_jumps_equal_iptables_legacy_restore() {
    let topo = Topology::new();
    let ns = topo.node().to_string();
    for family in Family::ALL {
        check(
            &ns,
            family,
            "first, last and only rules, a whole chain, duplicates, a jump",
            &[
                ("FORWARD", "-p tcp --dport 1 -j ACCEPT", None),
                ("FORWARD", "-p tcp --dport 3 -j ACCEPT", None),
                ("OUTPUT", "-p tcp --dport 4 -j ACCEPT", None),
                ("A", "-p tcp --dport 6 -j ACCEPT", None),
                ("A", "-p tcp --dport 6 -j ACCEPT", None),
                ("A", "-p tcp --dport 5 -j C", None),
                ("B", "-p udp --dport 8 -j DROP", None),
                ("B", "-p udp --dport 7 -j DROP", None),
                ("C", "-p tcp --dport 10 -j ACCEPT", None),
            ],
        );
        check(
            &ns,
            family,
            "the only rules of built-in and user chains jumped to",
            &[
                ("D", "-j C", None),
                ("D", "-j B", None),
                ("INPUT", "-p tcp --dport 1 -j C", None),
                ("C", "-p tcp --dport 9 -j B", None),
            ],
        );
        check(
            &ns,
            family,
            "inserts at the top and bottom of several chains",
            &[
                ("B", "-p tcp --dport 20 -j ACCEPT", Some(Place::Last)),
                ("B", "-p tcp --dport 21 -j ACCEPT", Some(Place::First)),
                ("FORWARD", "-p tcp --dport 22 -j DROP", Some(Place::Last)),
                ("FORWARD", "-p tcp --dport 23 -j DROP", Some(Place::First)),
                ("OUTPUT", "-p tcp --dport 24 -j DROP", Some(Place::Last)),
                ("C", "-p tcp --dport 25 -j DROP", Some(Place::First)),
                ("A", "-p tcp --dport 26 -j DROP", Some(Place::Last)),
                ("INPUT", "-p tcp --dport 27 -j DROP", Some(Place::First)),
                ("D", "-p tcp --dport 28 -j DROP", Some(Place::Last)),
                ("C", "-p tcp --dport 29 -j DROP", Some(Place::First)),
            ],
        );
        check_from(
            &ns,
            family,
            EMPTY,
            "inserts into empty chains jumped to, beside fallthroughs",
            &[
                ("E", "-p tcp --dport 30 -j ACCEPT", Some(Place::Last)),
                ("E", "-p tcp --dport 31 -j ACCEPT", Some(Place::First)),
                ("E", "-p tcp --dport 32 -j ACCEPT", Some(Place::Last)),
                ("OUTPUT", "-p tcp --dport 33 -j DROP", Some(Place::First)),
                ("OUTPUT", "-p tcp --dport 34 -j DROP", Some(Place::Last)),
                ("F", "-p tcp --dport 35 -j DROP", Some(Place::Last)),
                ("A", "-p tcp --dport 36 -j DROP", Some(Place::Last)),
                ("INPUT", "-p tcp --dport 37 -j DROP", Some(Place::Last)),
            ],
        );
        check_from(
            &ns,
            family,
            EMPTY,
            "removals before fallthroughs, jumps to empty chains",
            &[
                ("INPUT", "-p tcp --dport 1 -j E", None),
                ("A", "-j E", None),
                ("F", "-p tcp --dport 4 -j DROP", None),
                ("G", "-j F", None),
                ("G", "-j A", None),
            ],
        );
    }
}

/// A foreign iptables-legacy writer that does not take natledger's lock (another lock file)
/// changes the table while natledger edits it: every edit is done or declined (the kernel
/// refuses a replace whose entry count no longer matches: EAGAIN), never an error, and the
/// table ends holding natledger's rule exactly when its last successful edit says so.
#[test]
fn a_foreign_unlocked_writer_meanwhile_declines_never_fails() {
    use std::process::{Command, Stdio};
    let topo = Topology::new();
    let ns = topo.node().to_string();
    let family = Family::Ipv4;
    restore(
        &ns,
        family,
        &["-c"],
        "*filter\n:X - [0:0]\n:Y - [0:0]\nCOMMIT\n",
    );
    let other = tempfile::NamedTempFile::new().unwrap();
    let script = "for i in $(seq 1 400); do iptables-legacy -A Y -p tcp --dport 9 -j DROP; \
                  iptables-legacy -D Y -p tcp --dport 9 -j DROP; done 2>/dev/null; true";
    let mut foreign = Command::new("ip")
        .args(["netns", "exec", &ns, "sh", "-c", script])
        .env("XTABLES_LOCKFILE", other.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ours = rule("-p tcp --dport 8 -j ACCEPT");
    let (mut done, mut declined, mut present) = (0, 0, false);
    for _ in 0..300 {
        let outcome = in_netns(&ns, || {
            if present {
                iptc::delete(lock(), family, "filter", &[("X", &ours)])
            } else {
                iptc::insert(
                    lock(),
                    family,
                    "filter",
                    &[("X", ours.clone(), Place::Last)],
                    &[],
                )
            }
        });
        match outcome.expect("an edit beside a foreign writer is done or declined") {
            Outcome::Done(1) => {
                done += 1;
                present = !present;
            }
            Outcome::Declined => declined += 1,
            other => panic!("{other:?}"),
        }
    }
    foreign.wait().unwrap();
    let save = save_c(&ns, family);
    let n = save.lines().filter(|l| l.contains("-A X ")).count();
    eprintln!("done {done}, declined {declined}");
    assert_eq!(n, usize::from(present), "{save}");
}
