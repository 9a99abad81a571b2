//! Conntrack fixtures: the flows of a UDP mapping, and entries loaded into a namespace's
//! table with `conntrack -R` (tests/it/conntrack.rs, tests/it/conntrack_kernel.rs).

use std::net::IpAddr;
use std::ops::Range;

use natledger::kernel::conntrack::Flows;
use natledger::model::family::Family;
use natledger::model::portspec::{PortRange, Protocol};

use super::{assert_ok, run_in};

/// The UDP flows of `ports` in `family`, to `host` or (`None`) any local address.
pub fn udp_flows(ports: (u16, u16), family: Family, host: Option<IpAddr>) -> Flows {
    Flows {
        family,
        protocol: Protocol::Udp,
        ports: PortRange {
            start: ports.0,
            end: ports.1,
        },
        host,
        to: None,
    }
}

/// Insert conntrack entries into `ns`'s table in one `conntrack -R` (one `-I` command per
/// line, without the program name): thousands in a fraction of a second.
pub fn load_entries(ns: &str, lines: &str) {
    let out = run_in(
        ns,
        "conntrack",
        &["-R", "/dev/stdin"],
        Some(lines.as_bytes()),
    );
    assert_ok(&out, &format!("conntrack -R in {ns}"));
}

/// `-I` lines of the entries numbered `numbers` of `proto` to `dst`:`dport`, 600 s to live:
/// entry n from 10.78.0.2 (then .3, ...) port 1024 + n % 60,000.
pub fn entry_lines(numbers: Range<u32>, proto: &str, dst: &str, dport: u16) -> String {
    let state = if proto == "tcp" {
        "--state ESTABLISHED "
    } else {
        ""
    };
    numbers
        .map(|n| {
            let (host, sport) = (2 + n / 60_000, 1024 + n % 60_000);
            format!(
                "-I -t 600 -p {proto} {state}-s 10.78.0.{host} -d {dst} --sport {sport} \
                 --dport {dport}\n"
            )
        })
        .collect()
}
