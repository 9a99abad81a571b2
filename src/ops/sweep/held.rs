//! Orphans go only from a ledger that records something, or at boot. A state directory that
//! does not exist, or holds no manifest, may be a mistyped `--state-dir` (or an emptied one)
//! while containers live and are recorded elsewhere: every rule tagged for them would look
//! like an orphan. So sweep never creates the directory ([`Ledger::lock_existing`]), and
//! without `--boot` (or `--all`) it leaves the rules of containers no manifest knows when
//! nothing is recorded.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use super::{SweepOptions, TableReport};
use crate::state::ledger::{Ledger, LedgerError, Locked};

/// Why sweep left rules tagged for containers no manifest knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "ledger", rename_all = "kebab-case")]
pub enum HeldBack {
    /// The state directory does not exist: nothing was read, locked or changed.
    Missing { dir: PathBuf },
    /// The state directory holds no manifest; `rules` rules tagged for containers stay.
    Empty { dir: PathBuf, rules: usize },
}

impl fmt::Display for HeldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (dir, what) = match self {
            HeldBack::Missing { dir } => (
                dir,
                "does not exist: no manifest to judge rules by; rules tagged for containers \
                 are left"
                    .to_string(),
            ),
            HeldBack::Empty { dir, rules } => (
                dir,
                format!(
                    "holds no manifest: {rules} rule(s) tagged for containers no manifest knows \
                     are left"
                ),
            ),
        };
        write!(
            f,
            "state directory {} {what} (a mistyped --state-dir would take every live \
             container's forwards); at boot use `sweep --boot`",
            dir.display()
        )
    }
}

/// How sweep holds the ledger.
pub(super) enum Hold<'a> {
    Locked(Locked<'a>),
    /// No state directory, at the boot or with `--all`: nothing is recorded, nothing is
    /// created; the tables are swept without the lock.
    Absent,
    /// No state directory otherwise: sweep reads and changes nothing.
    Refused(HeldBack),
    /// Another process holds the lock, and the caller will not wait (`try_lock`: watch).
    Busy,
}

pub(super) fn lock<'a>(ledger: &'a Ledger, opts: &SweepOptions) -> Result<Hold<'a>, LedgerError> {
    let locked = match opts.try_lock {
        true => ledger
            .try_lock()
            .map(|l| l.map_or(Hold::Busy, Hold::Locked)),
        false => ledger.lock_existing().map(Hold::Locked),
    };
    match locked {
        Ok(hold) => Ok(hold),
        Err(LedgerError::Missing { dir }) if opts.boot || opts.all => {
            log::info!(
                "state directory {} does not exist: nothing is recorded; sweeping every tagged \
                 rule (--{})",
                dir.display(),
                if opts.all { "all" } else { "boot" }
            );
            Ok(Hold::Absent)
        }
        Err(LedgerError::Missing { dir }) => Ok(Hold::Refused(HeldBack::Missing { dir })),
        Err(e) => Err(e),
    }
}

/// Whether the rules of containers no manifest knows stay: nothing is recorded, and this is
/// neither the boot nor `--all`.
pub(super) fn keep_unrecorded(opts: &SweepOptions, manifests: usize) -> bool {
    manifests == 0 && !opts.boot && !opts.all
}

/// What an empty ledger left, if anything.
pub(super) fn empty(ledger: &Ledger, tables: &[TableReport]) -> Option<HeldBack> {
    let rules = tables.iter().map(|t| t.unrecorded_kept).sum();
    (rules > 0).then(|| HeldBack::Empty {
        dir: ledger.dir().to_path_buf(),
        rules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::model::family::Family;

    #[test]
    fn only_a_ledger_that_records_nothing_outside_the_boot_keeps_unrecorded_rules() {
        let plain = SweepOptions::default();
        let boot = SweepOptions {
            boot: true,
            ..SweepOptions::default()
        };
        let all = SweepOptions {
            all: true,
            ..SweepOptions::default()
        };
        assert!(keep_unrecorded(&plain, 0));
        assert!(!keep_unrecorded(&plain, 1));
        assert!(!keep_unrecorded(&boot, 0));
        assert!(!keep_unrecorded(&all, 0));
    }

    #[test]
    fn a_missing_state_directory_is_not_created_and_held_back_without_boot() {
        let base = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(base.path().join("typo"));
        let plain = SweepOptions::default();
        match lock(&ledger, &plain).unwrap() {
            Hold::Refused(held) => {
                let text = held.to_string();
                assert!(text.contains("typo does not exist"), "{text}");
                assert!(text.contains("sweep --boot"), "{text}");
            }
            _ => panic!("a missing directory must be refused without --boot"),
        }
        let boot = SweepOptions {
            boot: true,
            ..SweepOptions::default()
        };
        assert!(matches!(lock(&ledger, &boot).unwrap(), Hold::Absent));
        assert!(!ledger.dir().exists(), "sweep created the state directory");
        // What records creates it; then sweep locks it.
        drop(ledger.lock().unwrap());
        assert!(matches!(lock(&ledger, &plain).unwrap(), Hold::Locked(_)));
    }

    #[test]
    fn an_empty_ledger_names_what_it_kept_only_when_something_was() {
        let ledger = Ledger::new("/run/natledger-typo");
        let mut t = TableReport::new(Backend::IptablesNft, Family::Ipv4, "nat");
        assert_eq!(empty(&ledger, std::slice::from_ref(&t)), None);
        t.unrecorded_kept = 7;
        let held = empty(&ledger, &[t]).unwrap();
        assert!(
            held.to_string().contains("holds no manifest: 7 rule(s)"),
            "{held}"
        );
    }
}
