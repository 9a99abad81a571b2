//! Tests of the match-subset logic: parsing (`parse.rs`), coverage and emptiness
//! (`covers.rs`), table driven, and randomised soundness checks (`soundness.rs`).

mod covers;
mod parse;
mod soundness;

use super::*;
use crate::model::anyrule::{Cond, Match, PortSet, Target, parse_rule};
use crate::model::rule::IpNet;

/// A rule as printed (with or without `-A CHAIN`).
fn rule(line: &str) -> (Match, Target) {
    let mut tokens = crate::model::save::tokenize(line).expect("test line tokenizes");
    if tokens.first().map(String::as_str) == Some("-A") {
        tokens.drain(..2.min(tokens.len()));
    }
    parse_rule(&tokens)
}

fn m(line: &str) -> Match {
    rule(line).0
}

/// Conditions in short: `!in docker0 | proto tcp | dports 80,90:99 | other[-f]`.
fn show(mat: &Match) -> String {
    let one = |c: &Cond| {
        let ports = |p: &PortSet| {
            let r: Vec<String> =
                p.0.iter()
                    .map(|(a, b)| {
                        if a == b {
                            format!("{a}")
                        } else {
                            format!("{a}:{b}")
                        }
                    })
                    .collect();
            r.join(",")
        };
        let (negated, text) = match c {
            Cond::Protocol { negated, proto } => (*negated, format!("proto {proto}")),
            Cond::Src { negated, net } => (*negated, format!("src {net}")),
            Cond::Dst { negated, net } => (*negated, format!("dst {net}")),
            Cond::InIface { negated, name } => (*negated, format!("in {name}")),
            Cond::OutIface { negated, name } => (*negated, format!("out {name}")),
            Cond::DPorts { negated, ports: p } => (*negated, format!("dports {}", ports(p))),
            Cond::SPorts { negated, ports: p } => (*negated, format!("sports {}", ports(p))),
            Cond::DstType { negated, types } => (*negated, format!("dst-type {}", types.join(","))),
            Cond::SrcType { negated, types } => (*negated, format!("src-type {}", types.join(","))),
            Cond::Other(x) => (false, format!("other[{x}]")),
        };
        format!("{}{text}", if negated { "!" } else { "" })
    };
    mat.conds.iter().map(one).collect::<Vec<_>>().join(" | ")
}

/// A xorshift generator: `next(n)` is in `0..n`, the same sequence for the same seed.
fn xorshift(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}
