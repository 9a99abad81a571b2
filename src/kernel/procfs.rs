//! Process liveness from procfs: a container is alive while its recorded pid exists with the
//! same start time (a pid number can be reused by an unrelated process), in the same boot
//! (a state directory that survives a reboot must not match a new process by chance), as seen
//! from the same pid namespace (a pid recorded in another one says nothing here).
//!
//! A CNI attachment has no process: it is alive while the network namespace its runtime
//! named (`CNI_NETNS`, a bind mount such as `/run/netns/NAME`) is still the one ADD saw at
//! that path ([`netns_alive`]).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use crate::sharing::{NetnsAtPath, NetnsId};

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id (random per boot).
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string(BOOT_ID)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The pid namespace this process sees pids in (the inode of `/proc/self/ns/pid`).
pub fn pid_namespace() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

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

/// Start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// State letter (field 3) and start time (field 22) of `pid`, from one read.
fn stat(pid: i32) -> Option<(String, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// State letter (field 3) and start time (field 22) of a `/proc/PID/stat` line.
pub(crate) fn parse_stat(stat: &str) -> Option<(String, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.to_string();
    // `fields` now starts at field 4; starttime is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Fails unless this process can read what judging liveness needs (its own stat, the boot id,
/// its pid namespace): without /proc every container would look dead.
pub fn check_readable() -> std::io::Result<()> {
    std::fs::read_to_string("/proc/self/stat")?;
    std::fs::read_to_string(BOOT_ID)?;
    std::fs::metadata("/proc/self/ns/pid")?;
    Ok(())
}

/// Whether the recorded process still runs: same boot, pid present and not a zombie, same
/// start time; for a record without a pid but with a network namespace path (a CNI
/// attachment), same boot and [`netns_alive`]. Only positive evidence makes a container dead
/// (another boot; `kill(pid, 0)` says no such process; its stat shows a zombie or another
/// start time; its namespace path gone or naming another namespace). Where nothing can be
/// known it counts as alive, so that nothing is torn down: neither a pid nor a namespace path
/// recorded, a pid recorded in another pid namespace, or a process whose stat this process may
/// not read (`hidepid`).
pub fn is_alive(recorded: Recorded) -> bool {
    let pid = recorded.pid.filter(|p| *p > 0);
    if pid.is_none() && recorded.netns.is_none() {
        return true;
    }
    if let Some(then) = recorded.boot_id
        && boot_id().is_some_and(|now| now != then)
    {
        return false;
    }
    let Some(pid) = pid else {
        return recorded
            .netns
            .is_none_or(|(path, then)| netns_alive(path, then));
    };
    if let Some(then) = recorded.pid_namespace
        && pid_namespace().is_some_and(|now| now != then)
    {
        return true;
    }
    if kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH) {
        return false;
    }
    match stat(pid) {
        None => true,
        Some((state, now)) => state != "Z" && recorded.start_time.is_none_or(|then| then == now),
    }
}

/// Whether the recorded process provably still runs: its pid, recorded with a start time in
/// this pid namespace (and this boot, when recorded), is present, not a zombie, with that
/// start time. Unlike [`is_alive`], whatever cannot be judged (no pid or start time, another
/// or unrecorded pid namespace, a stat this process may not read) does not run here: a
/// poststop keeps a container's rules only on proof that it still runs.
pub fn runs(recorded: Recorded) -> bool {
    let (Some(pid), Some(then)) = (recorded.pid.filter(|p| *p > 0), recorded.start_time) else {
        return false;
    };
    if recorded
        .boot_id
        .is_some_and(|b| boot_id().as_deref() != Some(b))
    {
        return false;
    }
    if recorded.pid_namespace.is_none() || recorded.pid_namespace != pid_namespace() {
        return false;
    }
    matches!(stat(pid), Some((state, now)) if state != "Z" && now == then)
}

/// Whether `path` still names the network namespace `then`, as [`NetnsId::still_at`] judges
/// it. Dead only on positive evidence ([`NetnsAtPath::Gone`]: the path is gone, or is a
/// namespace file of another namespace); what cannot be judged counts as alive.
pub fn netns_alive(path: &Path, then: NetnsId) -> bool {
    then.still_at(path) != NetnsAtPath::Gone
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_field_22_past_odd_command_names() {
        let stat = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(parse_stat(stat), Some(("S".to_string(), 987654)));
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_not() {
        let me = std::process::id() as i32;
        let start = start_time(me).unwrap();
        let boot = boot_id().unwrap();
        let rec = |pid, start_time, boot_id| Recorded {
            pid,
            start_time,
            boot_id,
            pid_namespace: pid_namespace(),
            netns: None,
        };
        assert!(is_alive(rec(Some(me), Some(start), Some(&boot))));
        assert!(is_alive(rec(Some(me), Some(start), None)));
        assert!(!is_alive(rec(Some(me), Some(start + 1), None)));
        assert!(!is_alive(rec(Some(me), Some(start), Some("another-boot"))));
        assert!(!is_alive(rec(Some(i32::MAX), None, None)));
        assert!(is_alive(rec(None, None, None)));
        let elsewhere = Recorded {
            pid_namespace: Some(1),
            ..rec(Some(i32::MAX), None, None)
        };
        assert!(is_alive(elsewhere), "another pid namespace: cannot judge");
        let other_boot = Recorded {
            pid_namespace: Some(1),
            ..rec(Some(me), Some(start), Some("another-boot"))
        };
        assert!(
            !is_alive(other_boot),
            "another boot is dead, whatever the namespace"
        );
        assert!(check_readable().is_ok());
    }

    #[test]
    fn runs_only_on_proof() {
        let me = std::process::id() as i32;
        let start = start_time(me).unwrap();
        let boot = boot_id().unwrap();
        let rec = |pid, start_time, boot_id, pid_namespace| Recorded {
            pid,
            start_time,
            boot_id,
            pid_namespace,
            netns: None,
        };
        let here = pid_namespace();
        assert!(runs(rec(Some(me), Some(start), Some(&boot), here)));
        assert!(runs(rec(Some(me), Some(start), None, here)));
        assert!(
            !runs(rec(Some(me), Some(start + 1), None, here)),
            "reused pid"
        );
        assert!(!runs(rec(
            Some(me),
            Some(start),
            Some("another-boot"),
            here
        )));
        assert!(!runs(rec(Some(i32::MAX), Some(start), None, here)), "gone");
        assert!(!runs(rec(Some(me), None, None, here)), "no start time");
        assert!(!runs(rec(None, None, None, here)), "no pid");
        assert!(!runs(rec(Some(0), Some(start), None, here)));
        assert!(
            !runs(rec(Some(me), Some(start), None, None)),
            "pid namespace unknown"
        );
        assert!(
            !runs(rec(Some(me), Some(start), None, Some(1))),
            "another pid namespace"
        );
    }

    #[test]
    fn a_netns_path_is_dead_only_when_gone_or_naming_another_namespace() {
        let net = Path::new("/proc/self/ns/net");
        let mine = NetnsId::of_path(net).unwrap();
        // Another namespace file of the same nsfs: what a reused name looks like.
        let uts = NetnsId::of_path(Path::new("/proc/self/ns/uts")).unwrap();
        assert_eq!(uts.dev, mine.dev, "namespace files share nsfs's device");
        assert!(netns_alive(net, mine));
        assert!(!netns_alive(net, uts), "the path names another namespace");
        let dir = std::env::temp_dir().join(format!("natledger-netns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!netns_alive(&dir.join("gone"), mine), "ENOENT");
        let file = dir.join("file");
        std::fs::write(&file, "").unwrap();
        assert!(!netns_alive(&file.join("below"), mine), "ENOTDIR");
        // No namespace file from here (an unmounted or unseen bind mount): cannot judge.
        assert!(netns_alive(&file, mine));
        // Unreadable for another reason (here ELOOP): cannot judge.
        let looped = dir.join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        assert!(netns_alive(&looped, mine));
        std::fs::remove_dir_all(&dir).unwrap();

        let boot = boot_id().unwrap();
        let rec = |netns, boot_id| Recorded {
            pid: None,
            start_time: None,
            boot_id,
            pid_namespace: None,
            netns,
        };
        assert!(is_alive(rec(Some((net, mine)), Some(&boot))));
        assert!(is_alive(rec(Some((net, mine)), None)));
        assert!(!is_alive(rec(Some((net, uts)), Some(&boot))));
        assert!(!is_alive(rec(
            Some((Path::new("/nonexistent/ns"), mine)),
            None
        )));
        assert!(
            !is_alive(rec(Some((net, mine)), Some("another-boot"))),
            "a namespace seen in another boot says nothing now"
        );
        assert!(
            is_alive(rec(None, Some("another-boot"))),
            "nothing to judge"
        );
    }
}
