//! Which ports of a joiner's mappings it shares with a holder of its network namespace
//! (`crate::state::sharing`), port by port: create merges consecutive mappings into ranges
//! (`portspec::bounds::coalesce`), and the holder may have recorded its own merged
//! otherwise (another set of ports, or singles recorded before ranges were), so a range is
//! cut where the holder's mappings begin and end, and each piece judged alone.

use crate::model::oci::ContainerId;
use crate::model::portspec::{PortMapping, PortRange};

use super::Error;

/// `mine` judged against a live holder's `held` mappings: each of mine cut at the bounds of
/// the held mappings it clashes with. A piece inside a held mapping of the same protocol and
/// host address that sends each host port to the same container port is shared (returned
/// second, as that piece); a piece no held mapping clashes with stays the joiner's own
/// (returned first, in order); any other clash is [`Error::MappingDiffers`].
pub(super) fn split_shared(
    mine: &[PortMapping],
    held: &[PortMapping],
    holder: &ContainerId,
) -> Result<(Vec<PortMapping>, Vec<PortMapping>), Error> {
    let mut own = Vec::new();
    let mut shared = Vec::new();
    for mapping in mine {
        let clashing: Vec<&PortMapping> =
            held.iter().filter(|h| mapping.conflicts_with(h)).collect();
        if clashing.is_empty() {
            own.push(mapping.clone());
            continue;
        }
        for piece in pieces(mapping, &clashing) {
            let hits: Vec<&&PortMapping> = clashing
                .iter()
                .filter(|h| piece.conflicts_with(h))
                .collect();
            match hits.as_slice() {
                [] => own.push(piece),
                [h] if aligned(h, &piece) => shared.push(piece),
                _ => {
                    let held = hits
                        .iter()
                        .find(|h| !aligned(h, &piece))
                        .unwrap_or(&hits[0]);
                    return Err(Error::MappingDiffers {
                        mapping: piece,
                        held: (**held).clone(),
                        holder: holder.clone(),
                    });
                }
            }
        }
    }
    Ok((own, shared))
}

/// `mapping` cut at every start and end of the `clashing` mappings' host ports that lies
/// inside it: each piece lies wholly inside or wholly outside each of them.
fn pieces(mapping: &PortMapping, clashing: &[&PortMapping]) -> Vec<PortMapping> {
    let (first, last) = (
        u32::from(mapping.host_ports.start),
        u32::from(mapping.host_ports.end),
    );
    let mut starts: Vec<u32> = clashing
        .iter()
        .flat_map(|h| {
            [
                u32::from(h.host_ports.start),
                u32::from(h.host_ports.end) + 1,
            ]
        })
        .filter(|p| first < *p && *p <= last)
        .collect();
    starts.push(first);
    starts.sort_unstable();
    starts.dedup();
    let ends = starts.iter().skip(1).map(|s| s - 1).chain([last]);
    starts
        .iter()
        .zip(ends)
        .map(|(&lo, hi)| {
            // Within the mapping's ports: the u16 conversions cannot fail.
            let port = |p: u32| u16::try_from(p).unwrap_or(u16::MAX);
            let shift = |p: u32| port(u32::from(mapping.container_ports.start) + p - first);
            PortMapping {
                host_ip: mapping.host_ip,
                host_ports: PortRange {
                    start: port(lo),
                    end: port(hi),
                },
                container_ports: PortRange {
                    start: shift(lo),
                    end: shift(hi),
                },
                protocol: mapping.protocol,
            }
        })
        .collect()
}

/// Whether `held`'s rules forward `piece` as it asks: the same protocol and host address,
/// its host ports inside `held`'s, each to the same container port.
fn aligned(held: &PortMapping, piece: &PortMapping) -> bool {
    let offset =
        |m: &PortMapping| i32::from(m.container_ports.start) - i32::from(m.host_ports.start);
    held.protocol == piece.protocol
        && held.host_ip == piece.host_ip
        && held.host_ports.start <= piece.host_ports.start
        && piece.host_ports.end <= held.host_ports.end
        && offset(held) == offset(piece)
}

/// Record the joiner `input` in the `shared_by` of each holder whose rules it shares.
pub(super) fn store_holders(
    locked: &crate::state::ledger::Locked,
    input: &super::Creating,
    holders: &[crate::state::ledger::Manifest],
) -> Result<(), Error> {
    for holder in holders {
        let mut holder = holder.clone();
        holder.shared_by.retain(|id| *id != input.id);
        holder.shared_by.push(input.id.clone());
        locked.store(&holder)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::portspec::parse_mappings;

    fn list(spec: &str) -> Vec<PortMapping> {
        parse_mappings(spec).unwrap()
    }

    fn split(mine: &str, held: &str) -> Result<(Vec<PortMapping>, Vec<PortMapping>), String> {
        split_shared(&list(mine), &list(held), &"holder".parse().unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_range_is_shared_where_it_lies_inside_the_held_one() {
        // One port of a held range, a held single inside a range, a range over held singles.
        assert_eq!(
            split("8081:8081", "8080-8081:8080-8081"),
            Ok((vec![], list("8081:8081")))
        );
        assert_eq!(
            split("8080-8082:8080-8082", "8081:8081"),
            Ok((list("8080:8080,8082:8082"), list("8081:8081")))
        );
        assert_eq!(
            split("8080-8081:8080-8081", "8080:8080,8081:8081"),
            Ok((vec![], list("8080:8080,8081:8081")))
        );
        // Shifted: the same container port for each host port.
        assert_eq!(
            split("8000-8003:80-83", "8001-8002:81-82,9000:90"),
            Ok((list("8000:80,8003:83"), list("8001-8002:81-82")))
        );
        // Untouched mappings stay whole, in order.
        assert_eq!(
            split("53:53/udp,7000-7001:7000-7001,8081:8081", "8081:8081"),
            Ok((list("53:53/udp,7000-7001:7000-7001"), list("8081:8081")))
        );
        assert_eq!(
            split("65534-65535:65534-65535", "65535:65535"),
            Ok((list("65534:65534"), list("65535:65535")))
        );
    }

    #[test]
    fn a_piece_forwarded_otherwise_differs() {
        for (mine, held, piece) in [
            ("8080-8081:8080-8081", "8081:81", "8081:8081/tcp"),
            (
                "8080-8082:80-82",
                "8080-8082:8080-8082",
                "8080-8082:80-82/tcp",
            ),
            ("8080:8080", "0.0.0.0:8080:8080", "8080:8080/tcp"),
            (
                "8080:8080",
                "0.0.0.0:8080:8080,[::]:8080:8080",
                "8080:8080/tcp",
            ),
        ] {
            let err = split(mine, held).unwrap_err();
            assert!(
                err.starts_with(&format!("host port {piece} differs")),
                "{err}"
            );
        }
    }
}
