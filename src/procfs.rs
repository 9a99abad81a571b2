//! Process liveness from procfs: a container is alive while its recorded pid exists with the
//! same start time (a pid number can be reused by an unrelated process).

/// Start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// State letter (field 3) and start time (field 22) of `pid`, from one read.
fn stat(pid: i32) -> Option<(String, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(stat: &str) -> Option<(String, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.to_string();
    // `fields` now starts at field 4; starttime is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether the process recorded as (`pid`, `start`) still runs. Without a recorded pid
/// nothing can be known, and the container counts as alive so that nothing is torn down.
pub fn is_alive(pid: Option<i32>, start: Option<u64>) -> bool {
    let Some(pid) = pid else {
        return true;
    };
    match stat(pid) {
        None => false,
        Some((state, now)) => state != "Z" && start.is_none_or(|then| then == now),
    }
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
        assert!(is_alive(Some(me), Some(start)));
        assert!(!is_alive(Some(me), Some(start + 1)));
        assert!(!is_alive(Some(i32::MAX), None));
        assert!(is_alive(None, None));
    }
}
