//! The tables whose changes no one tells (iptables-legacy's), compared every
//! [`super::LEGACY_EVERY`]: each registered driver's ([`DRIVERS`])
//! [`crate::backend::Driver::stamp`] of its nat and filter tables, per family (`None` for a
//! backend whose changes are told, or an absent table). A table over
//! [`super::SMALL`] has its content read at every [`super::DEEP_EVERY`]th check only, its size
//! and entry count in between ([`trusted`], pure).

use crate::backend::{DRIVERS, Netfilter};
use crate::kernel::exec::SystemRunner;
use crate::kernel::iptc::Stamp;
use crate::model::family::Family;
use crate::model::table::Table;

use super::{DEEP_EVERY, SMALL};

/// Every registered driver's stamps of its nat and filter tables of both families, in a
/// fixed order ([`DRIVERS`]'s).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamps(Vec<Option<Stamp>>);

impl Stamps {
    /// Nothing to compare with: the next check differs from it wherever a table has a stamp
    /// (after a reconcile that wrote: what it read is gone).
    pub fn none() -> Stamps {
        Stamps::default()
    }

    /// The tables as they are now, each read whole (absent ones, or unreadable, as `None`:
    /// never created by asking); `known[i]`, when there, stands for table `i` if its size and
    /// count are still its own.
    pub fn read(known: &[Option<Stamp>]) -> Stamps {
        let runner = SystemRunner::default();
        let nf = Netfilter::new(&runner);
        let mut out = Vec::with_capacity(12);
        for driver in DRIVERS {
            for family in Family::ALL {
                for table in [Table::Nat, Table::Filter] {
                    let trusted = known.get(out.len()).copied().flatten();
                    out.push(driver.stamp(&nf, family, table, trusted));
                }
            }
        }
        Stamps(out)
    }
}

/// The checks since watch started, and what the next is compared with.
#[derive(Debug)]
pub struct Legacy {
    checks: u32,
    /// The tables as the last reconcile read them (or as they were at the start).
    pub baseline: Stamps,
}

impl Legacy {
    pub fn new() -> Legacy {
        Legacy {
            checks: 0,
            baseline: Stamps::read(&[]),
        }
    }

    /// One check: whether a table changed since [`Legacy::baseline`].
    pub fn changed(&mut self) -> bool {
        self.checks = self.checks.wrapping_add(1);
        Stamps::read(&trusted(self.checks, &self.baseline)) != self.baseline
    }
}

/// The stamps check number `checks` may take as read when a table's size and count are
/// unchanged: a large table's between deep checks, none at a deep check.
pub fn trusted(checks: u32, baseline: &Stamps) -> Vec<Option<Stamp>> {
    if checks.is_multiple_of(DEEP_EVERY) {
        Vec::new()
    } else {
        baseline
            .0
            .iter()
            .map(|s| s.filter(|s| s.size > SMALL))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_tables_stamp_is_trusted_between_deep_checks_only() {
        let stamp = |size| Stamp {
            size,
            entries: 3,
            content: 7,
        };
        let baseline = Stamps(vec![Some(stamp(SMALL + 1)), Some(stamp(SMALL)), None]);
        let between = trusted(1, &baseline);
        assert_eq!(between, vec![Some(stamp(SMALL + 1)), None, None]);
        assert!(trusted(DEEP_EVERY, &baseline).is_empty());
        assert!(trusted(0, &Stamps::none()).is_empty());
    }
}
