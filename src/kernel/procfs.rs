//! Process facts from procfs: this boot's id, this process's pid namespace, a process's
//! state and start time. Read through the host seam (`kernel::machine`); liveness is
//! judged from them in `state::liveness`.

use std::os::unix::fs::MetadataExt;

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

/// Start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// State letter (field 3) and start time (field 22) of `pid`, from one read.
pub(crate) fn stat(pid: i32) -> Option<(String, u64)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_field_22_past_odd_command_names() {
        let stat = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(parse_stat(stat), Some(("S".to_string(), 987654)));
    }
}
