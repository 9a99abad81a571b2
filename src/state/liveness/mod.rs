//! Whether a recorded container still lives, judged from what the host seam
//! ([`crate::kernel::machine::Host`]) shows: a container is alive while its recorded pid
//! exists with the same start time (a pid number can be reused by an unrelated process), in
//! the same boot (a state directory that survives a reboot must not match a new process by
//! chance), as seen from the same pid namespace (a pid recorded in another one says nothing
//! here).
//!
//! A CNI attachment has no process: it is alive while the network namespace its runtime
//! named (`CNI_NETNS`, a bind mount such as `/run/netns/NAME`) is still the one ADD saw at
//! that path ([`netns_alive`]): the same nsfs device and inode, and the same namespace cookie
//! where ADD recorded one (an inode is reused, a cookie is not).

use std::path::Path;

use crate::kernel::machine::{Host, Process};
use crate::kernel::netns_id::{NetnsAtPath, NetnsId};

mod batched;
pub use batched::Batched;

/// The process a manifest records for its container.
#[derive(Clone, Copy, Debug)]
pub struct Recorded<'a> {
    pub pid: Option<i32>,
    pub start_time: Option<u64>,
    pub boot_id: Option<&'a str>,
    /// The pid namespace `pid` was seen in.
    pub pid_namespace: Option<u64>,
    /// For a container without a pid (a CNI attachment): the network namespace path it was
    /// given and the namespace that path named then.
    pub netns: Option<(&'a Path, NetnsId)>,
}

/// Whether the recorded process still runs: same boot, pid present and not a zombie, same
/// start time; for a record without a pid but with a network namespace path (a CNI
/// attachment), same boot and [`netns_alive`]. Only positive evidence makes a container dead
/// (another boot; no such process; its stat shows a zombie or another start time; its
/// namespace path gone or naming another namespace). Where nothing can be known it counts as
/// alive, so that nothing is torn down: neither a pid nor a namespace path recorded, a pid
/// recorded in another pid namespace, or a process whose stat this process may not read
/// (`hidepid`).
pub fn is_alive(host: &dyn Host, recorded: Recorded) -> bool {
    let pid = recorded.pid.filter(|p| *p > 0);
    if pid.is_none() && recorded.netns.is_none() {
        return true;
    }
    if let Some(then) = recorded.boot_id
        && host.boot_id().is_some_and(|now| now != then)
    {
        return false;
    }
    let Some(pid) = pid else {
        return recorded
            .netns
            .is_none_or(|(path, then)| netns_alive(host, path, then));
    };
    if let Some(then) = recorded.pid_namespace
        && host.pid_namespace().is_some_and(|now| now != then)
    {
        return true;
    }
    match host.process(pid) {
        Process::Gone => false,
        Process::Hidden => true,
        Process::Seen { start_time, zombie } => {
            !zombie && recorded.start_time.is_none_or(|then| then == start_time)
        }
    }
}

/// Whether the recorded process provably still runs: its pid, recorded with a start time in
/// this pid namespace (and this boot, when recorded), is present, not a zombie, with that
/// start time. Unlike [`is_alive`], whatever cannot be judged (no pid or start time, another
/// or unrecorded pid namespace, a stat this process may not read) does not run here: a
/// poststop keeps a container's rules only on proof that it still runs.
pub fn runs(host: &dyn Host, recorded: Recorded) -> bool {
    let (Some(pid), Some(then)) = (recorded.pid.filter(|p| *p > 0), recorded.start_time) else {
        return false;
    };
    if recorded
        .boot_id
        .is_some_and(|b| host.boot_id().as_deref() != Some(b))
    {
        return false;
    }
    if recorded.pid_namespace.is_none() || recorded.pid_namespace != host.pid_namespace() {
        return false;
    }
    matches!(host.process(pid), Process::Seen { start_time, zombie: false } if start_time == then)
}

/// What `path` names now, judged against the namespace `then` it named when recorded
/// ([`NetnsId::still_at`]). A `stat` first; the cookie is read (entering the namespace) only
/// when `then` has one and the device and inode match: another file is not the recorded
/// namespace whatever its cookie.
pub fn netns_at_path(host: &dyn Host, path: &Path, then: NetnsId) -> NetnsAtPath {
    let now = match host.netns_at(path) {
        Ok(now) if then.cookie.is_some() && now.same_file(then) => host.netns_with_cookie(path),
        now => now,
    };
    then.still_at(now)
}

/// The identity to record of the namespace at `path` (a CNI ADD's `CNI_NETNS`, a hook
/// container's `/proc/PID/ns/net`): with its cookie where it can be read, else its device and
/// inode only (a kernel before 5.14 gives none; an attachment recorded so is judged by device
/// and inode); `None` when the path cannot be read at all.
pub fn netns_to_record(host: &dyn Host, path: &Path) -> Option<NetnsId> {
    match host.netns_with_cookie(path) {
        Ok(id) => Some(id),
        Err(e) => {
            log::debug!(
                "no namespace cookie of {} ({e}); recording its device and inode",
                path.display()
            );
            host.netns_at(path).ok()
        }
    }
}

/// Whether `path` still names the network namespace `then`. Dead only on positive evidence
/// ([`NetnsAtPath::Gone`]: the path is gone, or is a namespace file of another namespace);
/// what cannot be judged counts as alive.
pub fn netns_alive(host: &dyn Host, path: &Path, then: NetnsId) -> bool {
    netns_at_path(host, path, then) != NetnsAtPath::Gone
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;
    use crate::kernel::machine::fake::{BOOT_ID, FakeHost, PID_NAMESPACE, netns, netns_cookie};

    const ME: i32 = 4242;
    const START: u64 = 1000;

    fn host() -> FakeHost {
        FakeHost::default().with_process(ME, START, netns(1))
    }

    fn rec<'a>(
        pid: Option<i32>,
        start_time: Option<u64>,
        boot_id: Option<&'a str>,
        pid_namespace: Option<u64>,
    ) -> Recorded<'a> {
        Recorded {
            pid,
            start_time,
            boot_id,
            pid_namespace,
            netns: None,
        }
    }

    #[test]
    fn a_running_process_is_alive_and_a_changed_start_time_is_not() {
        let host = host();
        let here = Some(PID_NAMESPACE);
        let alive = |r| is_alive(&host, r);
        assert!(alive(rec(Some(ME), Some(START), Some(BOOT_ID), here)));
        assert!(alive(rec(Some(ME), Some(START), None, here)));
        assert!(!alive(rec(Some(ME), Some(START + 1), None, here)));
        assert!(!alive(rec(
            Some(ME),
            Some(START),
            Some("another-boot"),
            here
        )));
        assert!(!alive(rec(Some(ME + 1), None, None, here)), "gone");
        assert!(alive(rec(None, None, None, here)), "nothing to judge");
        assert!(
            alive(rec(Some(ME + 1), None, None, Some(1))),
            "another pid namespace: cannot judge"
        );
        assert!(
            !alive(rec(Some(ME), Some(START), Some("another-boot"), Some(1))),
            "another boot is dead, whatever the namespace"
        );
        host.set_process(ME, Process::Hidden);
        assert!(alive(rec(Some(ME), Some(START + 1), None, here)), "hidepid");
        host.set_process(
            ME,
            Process::Seen {
                start_time: START,
                zombie: true,
            },
        );
        assert!(!alive(rec(Some(ME), Some(START), None, here)), "zombie");
    }

    #[test]
    fn runs_only_on_proof() {
        let host = host();
        let here = Some(PID_NAMESPACE);
        let runs = |r| runs(&host, r);
        assert!(runs(rec(Some(ME), Some(START), Some(BOOT_ID), here)));
        assert!(runs(rec(Some(ME), Some(START), None, here)));
        assert!(
            !runs(rec(Some(ME), Some(START + 1), None, here)),
            "reused pid"
        );
        assert!(!runs(rec(
            Some(ME),
            Some(START),
            Some("another-boot"),
            here
        )));
        assert!(!runs(rec(Some(ME + 1), Some(START), None, here)), "gone");
        assert!(!runs(rec(Some(ME), None, None, here)), "no start time");
        assert!(!runs(rec(None, None, None, here)), "no pid");
        assert!(!runs(rec(Some(0), Some(START), None, here)));
        assert!(
            !runs(rec(Some(ME), Some(START), None, None)),
            "pid namespace unknown"
        );
        assert!(
            !runs(rec(Some(ME), Some(START), None, Some(1))),
            "another pid namespace"
        );
        host.set_process(ME, Process::Hidden);
        assert!(!runs(rec(Some(ME), Some(START), None, here)), "hidepid");
    }

    #[test]
    fn a_netns_path_is_dead_only_when_gone_or_naming_another_namespace() {
        let net = Path::new("/run/netns/cni-1");
        let mine = netns(7);
        let host = FakeHost::default().with_namespace("/run/netns/cni-1", mine);
        // Another namespace file of the same nsfs: what a reused name looks like.
        let other = netns(8);
        assert!(netns_alive(&host, net, mine));
        assert!(
            !netns_alive(&host, net, other),
            "the path names another namespace"
        );
        assert!(
            !netns_alive(&host, Path::new("/run/netns/gone"), mine),
            "ENOENT"
        );
        let below = Path::new("/run/netns/file/below");
        host.set_namespace(below, Err(ErrorKind::NotADirectory));
        assert!(!netns_alive(&host, below, mine), "ENOTDIR");
        // No namespace file from here (an unmounted or unseen bind mount): cannot judge.
        let plain = Path::new("/run/netns/plain");
        host.set_namespace(plain, Ok(NetnsId { dev: 9, ..mine }));
        assert!(netns_alive(&host, plain, mine));
        // Unreadable for another reason (EACCES): cannot judge.
        let looped = Path::new("/run/netns/loop");
        host.set_namespace(looped, Err(ErrorKind::PermissionDenied));
        assert!(netns_alive(&host, looped, mine));

        let rec = |netns, boot_id| Recorded {
            pid: None,
            start_time: None,
            boot_id,
            pid_namespace: None,
            netns,
        };
        let alive = |r| is_alive(&host, r);
        assert!(alive(rec(Some((net, mine)), Some(BOOT_ID))));
        assert!(alive(rec(Some((net, mine)), None)));
        assert!(!alive(rec(Some((net, other)), Some(BOOT_ID))));
        assert!(!alive(rec(
            Some((Path::new("/nonexistent/ns"), mine)),
            None
        )));
        assert!(
            !alive(rec(Some((net, mine)), Some("another-boot"))),
            "a namespace seen in another boot says nothing now"
        );
        assert!(alive(rec(None, Some("another-boot"))), "nothing to judge");
    }

    /// A recorded cookie decides between namespaces of one inode: `ip netns del X; ip netns
    /// add X` reusing the inode reads as dead. The cookie is read only where device and inode
    /// match; a manifest without one is judged by device and inode, as before.
    #[test]
    fn a_recorded_cookie_tells_a_reused_inode_from_the_namespace() {
        let net = Path::new("/run/netns/cni-1");
        let mine = netns_cookie(7, 70);
        let host = FakeHost::default().with_namespace("/run/netns/cni-1", mine);
        let reads = || host.cookie_reads.replace(0);
        assert!(netns_alive(&host, net, mine));
        assert_eq!(reads(), 1, "device and inode match: the cookie is read");
        assert!(
            netns_alive(&host, net, netns(7)),
            "recorded without a cookie"
        );
        assert_eq!(reads(), 0, "nothing to compare it with");
        assert!(!netns_alive(&host, net, netns_cookie(8, 70)));
        assert_eq!(reads(), 0, "another inode is dead without its cookie");
        assert!(!netns_alive(&host, Path::new("/run/netns/gone"), mine));
        assert_eq!(reads(), 0);

        // X deleted and made again with the same inode: a new cookie.
        host.set_namespace(net, Ok(netns_cookie(7, 71)));
        assert!(!netns_alive(&host, net, mine), "the inode was reused");
        assert_eq!(reads(), 1);
        assert!(
            netns_alive(&host, net, netns(7)),
            "an older manifest: alive, as before"
        );

        assert_eq!(netns_to_record(&host, net), Some(netns_cookie(7, 71)));
        assert_eq!(netns_to_record(&host, Path::new("/run/netns/gone")), None);
    }
}
