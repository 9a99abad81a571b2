//! Check 7 (live only): processes that may write iptables-legacy tables without
//! `/run/xtables.lock`, whose changes natledger's table replacement (or theirs, natledger's)
//! would undo: `crate::kernel::host::xtables`.

use super::Checks;
use crate::analysis::doctor::evidence;
use crate::analysis::doctor::{Finding, Kind, Severity};

impl Checks<'_> {
    /// Check 7: a holder of an `IPPROTO_RAW` socket (libiptc's handle on the legacy tables) of
    /// this network namespace that does not hold the xtables lock.
    pub(crate) fn xtables_lock(&mut self) {
        let Some(host) = self.host else { return };
        let lock = &host.roots.xtables_lock;
        for holder in evidence::unlocked(&host.roots) {
            let who = match &holder.comm {
                Some(comm) => format!("Process {} ({comm})", holder.pid),
                None => format!("Process {}", holder.pid),
            };
            self.findings.push(Finding {
                severity: Severity::Warning,
                kind: Kind::UnlockedLegacyWriter,
                port: None,
                protocol: None,
                summary: format!(
                    "{who} holds a raw IPPROTO_RAW socket, as an iptables-legacy writer does, \
                     without holding {}: if it replaces a legacy table while natledger (or any \
                     iptables that takes the lock) does, one of the two changes is lost. \
                     iptables-legacy-save reads this way too, harmlessly.",
                    lock.display()
                ),
                rules: Vec::new(),
                evidence: vec![format!(
                    "{}/{} lists the socket; {}/locks shows no lock of its holders",
                    host.roots.net.display(),
                    holder.socket,
                    host.roots.proc.display()
                )],
                fix: Some(format!(
                    "make it take {} (iptables -w, or flock on that file) or stop it",
                    lock.display()
                )),
            });
        }
    }
}
