//! Process liveness from procfs: a container is alive while its recorded pid exists with the
//! same start time (a pid number can be reused by an unrelated process).

/// Start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; starttime is field 22.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process recorded as (`pid`, `start`) still runs. Without a recorded pid
/// nothing can be known, and the container counts as alive so that nothing is torn down.
pub fn is_alive(pid: Option<i32>, start: Option<u64>) -> bool {
    match pid {
        None => true,
        Some(pid) => match (start_time(pid), start) {
            (None, _) => false,
            (Some(now), Some(then)) => now == then && !is_zombie(pid),
            (Some(_), None) => !is_zombie(pid),
        },
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|state| state == "Z")
        })
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_field_22_past_odd_command_names() {
        let stat = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(987654));
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_not() {
        let me = std::process::id() as i32;
        let start = start_time(me).unwrap();
        assert!(is_alive(Some(me), Some(start)));
        assert!(!is_alive(Some(me), Some(start + 1)));
        assert!(!is_alive(Some(i32::MAX), None));
        assert!(is_alive(None, None));
    }
}
