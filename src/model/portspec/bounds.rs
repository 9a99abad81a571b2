//! How much one container may ask for, and how its mappings are kept compact.
//!
//! A runtime expands a port range into one mapping per port (podman with CNI sends
//! `-p 8000-9000:8000-9000` as 1,001 `portMappings`): [`coalesce`] merges such runs back into
//! one range mapping, whose rules are a few instead of thousands. What is left is bounded by
//! [`MAX_MAPPINGS`] and the rules written for it by [`MAX_RULES`], so that every manifest
//! natledger writes is far under what it reads back (`safefile::Cap::State`, 64 MiB) and
//! is created in about a second and removed in under half a second on every backend
//! (`benches/bounds`, `tests/timed/bounds.rs`: 4,096 rules, a manifest of about 2 MB, debug build).

use std::cmp::Ordering;

use super::PortMapping;

/// The most mappings (after [`coalesce`]) one container or CNI attachment may record.
pub(crate) const MAX_MAPPINGS: usize = 1024;

/// The most rules natledger writes for one container or CNI attachment (a mapping is 2 to 4
/// rules per family: `layout::mapping_rules`).
pub(crate) const MAX_RULES: usize = 4096;

/// What a container asked for beyond the bounds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Bound {
    #[error(
        "{given} port mappings are {merged} once consecutive ports are merged into ranges, \
         more than the {MAX_MAPPINGS} natledger records per container (publish port ranges: \
         consecutive host and container ports)"
    )]
    Mappings { given: usize, merged: usize },
    #[error(
        "{mappings} port mapping(s) need {rules} rules, more than the {MAX_RULES} natledger \
         writes per container"
    )]
    Rules { mappings: usize, rules: usize },
}

/// `mappings` with every run of consecutive ones merged into one range mapping: same
/// protocol and host address, host ports and container ports each continuing the previous
/// mapping's. Order is kept (a merged mapping stands where its run began), so the rules are
/// the same packets' rules in the same order. Without `shifted`, only runs whose host and
/// container ports are equal merge (natledger's nftables backend cannot write a range to
/// other ports: nft_nat has no port offset); equal ranges every backend writes.
pub fn coalesce(mappings: &[PortMapping], shifted: bool) -> Vec<PortMapping> {
    let mut out: Vec<PortMapping> = Vec::new();
    for mapping in mappings {
        if let Some(last) = out.last_mut()
            && continues(last, mapping, shifted)
        {
            last.host_ports.end = mapping.host_ports.end;
            last.container_ports.end = mapping.container_ports.end;
            continue;
        }
        out.push(mapping.clone());
    }
    out
}

fn continues(last: &PortMapping, next: &PortMapping, shifted: bool) -> bool {
    let after = |end: u16, start: u16| u32::from(end) + 1 == u32::from(start);
    let equal = |m: &PortMapping| m.host_ports == m.container_ports;
    last.protocol == next.protocol
        && last.host_ip == next.host_ip
        && after(last.host_ports.end, next.host_ports.start)
        && after(last.container_ports.end, next.container_ports.start)
        && (shifted || (equal(last) && equal(next)))
}

/// The fewest mappings any backend can record these as: a container over
/// [`MAX_MAPPINGS`] by this count is over it everywhere.
pub(crate) fn check_count(mappings: &[PortMapping]) -> Result<(), Bound> {
    let merged = coalesce(mappings, true).len();
    if merged > MAX_MAPPINGS {
        return Err(Bound::Mappings {
            given: mappings.len(),
            merged,
        });
    }
    Ok(())
}

/// The one form of a set of mappings, whatever their order and however they were split
/// (recorded as a container's own and shared ones, or merged by another backend's rule):
/// sorted, then merged. A CNI CHECK compares what it is asked with what was recorded so.
pub(crate) fn canonical<'a>(
    mappings: impl IntoIterator<Item = &'a PortMapping>,
) -> Vec<PortMapping> {
    let mut all: Vec<PortMapping> = mappings.into_iter().cloned().collect();
    all.sort_by(order);
    coalesce(&all, true)
}

fn order(a: &PortMapping, b: &PortMapping) -> Ordering {
    let key = |m: &PortMapping| {
        (
            m.protocol,
            m.host_ip,
            m.host_ports.start,
            m.host_ports.end,
            m.container_ports.start,
            m.container_ports.end,
        )
    };
    key(a).cmp(&key(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::portspec::{Protocol, parse_entry, parse_mappings};

    fn list(spec: &str) -> Vec<PortMapping> {
        parse_mappings(spec).unwrap()
    }

    fn singles(ports: impl Iterator<Item = (u16, u16)>) -> Vec<PortMapping> {
        ports
            .map(|(h, c)| parse_entry(&format!("{h}:{c}")).unwrap())
            .collect()
    }

    #[test]
    fn consecutive_ports_merge_into_one_range_in_place() {
        let all = singles((1..=65535).map(|p| (p, p)));
        assert_eq!(coalesce(&all, false), list("1-65535:1-65535"));
        assert_eq!(coalesce(&all, true), list("1-65535:1-65535"));
        // A run in the middle of others stays where it began.
        let mixed = list("80:80,8000:8000,8001:8001,8002:8002,53:53/udp,443:443");
        assert_eq!(
            coalesce(&mixed, false),
            list("80:80,8000-8002:8000-8002,53:53/udp,443:443")
        );
        // Ranges given as ranges continue too.
        assert_eq!(
            coalesce(&list("10-19:10-19,20:20,21-30:21-30"), false),
            list("10-30:10-30")
        );
    }

    #[test]
    fn only_the_same_protocol_and_address_in_order_merge() {
        for spec in [
            "8000:8000,8001:8001/udp",
            "127.0.0.1:8000:8000,8001:8001",
            "127.0.0.1:8000:8000,127.0.0.2:8001:8001",
            "8001:8001,8000:8000",
            "8000:8000,8002:8002",
            "8000:8000,8001:8002",
            "65535:65535,1:1",
        ] {
            let mappings = list(spec);
            assert_eq!(coalesce(&mappings, true), mappings, "{spec}");
        }
        assert_eq!(
            coalesce(&list("[fd00::1]:80:80,[fd00::1]:81:81/tcp"), false),
            list("[fd00::1]:80-81:80-81")
        );
        assert_eq!(coalesce(&[], true), []);
    }

    #[test]
    fn shifted_runs_merge_only_where_the_backend_writes_them() {
        // podman: -p 8000-8002:80-82 arrives as three mappings.
        let shifted = list("8000:80,8001:81,8002:82");
        assert_eq!(coalesce(&shifted, true), list("8000-8002:80-82"));
        assert_eq!(coalesce(&shifted, false), shifted);
        // An equal run next to a shifted mapping: the equal part merges alone.
        let mixed = list("80:80,81:81,82:90");
        assert_eq!(coalesce(&mixed, false), list("80-81:80-81,82:90"));
        assert_eq!(coalesce(&mixed, true), list("80-81:80-81,82:90"));
    }

    #[test]
    fn the_count_is_judged_on_the_fewest_mappings_any_backend_records() {
        let reversed = singles((1..=65535).map(|p| (p, 65535 - p + 1)));
        let err = check_count(&reversed).unwrap_err();
        assert_eq!(
            err,
            Bound::Mappings {
                given: 65535,
                merged: 65535
            }
        );
        assert!(err.to_string().contains("1024"), "{err}");
        check_count(&singles((1..=65535).map(|p| (p, p)))).unwrap();
        let at_limit = singles((1..=MAX_MAPPINGS as u16).map(|p| (p * 2, p * 2)));
        check_count(&at_limit).unwrap();
        let over = singles((1..=MAX_MAPPINGS as u16 + 1).map(|p| (p * 2, p * 2)));
        assert!(check_count(&over).is_err());
    }

    #[test]
    fn the_canonical_form_ignores_order_and_splits() {
        let asked = list("8000:8000,8001:8001,8002:8002,53:53/udp");
        let recorded = list("53:53/udp,8002:8002,8000-8001:8000-8001");
        assert_eq!(canonical(&asked), canonical(&recorded));
        assert_eq!(canonical(&asked)[0].protocol, Protocol::Tcp);
        assert_ne!(canonical(&asked), canonical(&list("8000-8002:8000-8002")));
    }
}
