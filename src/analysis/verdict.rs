//! The words both halves of the analysis answer in: [`Tri`], whether a packet (or every way
//! it may go) meets something, given only what is known of it. `Yes` and `No` are claims,
//! made only when the known facts decide; `Maybe` is "may match", what neither half models
//! (a mark, an unknown interface, `Cond::Other`, `Stmt::Other`), followed both ways.
//!
//! Each half keeps its own fates: [`crate::analysis::iptables::packet::Fate`] names the
//! `iptables-save` rule that decided a built-in chain, [`crate::analysis::nftables::End`] how
//! one way through every hook of a native ruleset ends; they share this answer, not a shape.

use std::ops::Not;

/// A three-valued answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tri {
    Yes,
    No,
    Maybe,
}

impl Tri {
    /// A decided answer.
    pub fn from_bool(b: bool) -> Tri {
        if b { Tri::Yes } else { Tri::No }
    }

    /// Both must hold.
    pub fn and(self, other: Tri) -> Tri {
        match (self, other) {
            (Tri::No, _) | (_, Tri::No) => Tri::No,
            (Tri::Yes, Tri::Yes) => Tri::Yes,
            _ => Tri::Maybe,
        }
    }

    /// Either holds.
    pub fn or(self, other: Tri) -> Tri {
        match (self, other) {
            (Tri::Yes, _) | (_, Tri::Yes) => Tri::Yes,
            (Tri::No, Tri::No) => Tri::No,
            _ => Tri::Maybe,
        }
    }

    /// The answer, turned over when `negated` (a `!` before a condition).
    pub fn negate(self, negated: bool) -> Tri {
        if negated { !self } else { self }
    }

    /// Of `total` ways, `holding` hold: `Yes` when all do, `No` when none does.
    pub fn of_ways(holding: usize, total: usize) -> Tri {
        if holding == total {
            Tri::Yes
        } else if holding == 0 {
            Tri::No
        } else {
            Tri::Maybe
        }
    }
}

impl Not for Tri {
    type Output = Tri;

    fn not(self) -> Tri {
        match self {
            Tri::Yes => Tri::No,
            Tri::No => Tri::Yes,
            Tri::Maybe => Tri::Maybe,
        }
    }
}
