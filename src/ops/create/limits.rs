//! create's bounds (`portspec::bounds`), judged before the lock and before anything is
//! written: the mappings merged as this backend writes ranges, then counted, and the rules
//! they need counted.

use crate::backend::Backend;
use crate::model::capabilities::Capabilities;
use crate::model::family::{Family, IfAddr};
use crate::model::layout::mapping_rules;
use crate::model::oci::ContainerId;
use crate::model::portspec::PortMapping;
use crate::model::portspec::bounds::{Bound, MAX_MAPPINGS, MAX_RULES, coalesce};

use super::Error;

/// Whether a backend of `caps` writes a range of host ports to other container ports
/// (iptables' DNAT has a base port; nft_nat has no port offset,
/// `nftables::own::expr::EncodeError`).
pub(super) fn writes_shifted_ranges(caps: Capabilities) -> bool {
    caps.shifted_ranges
}

/// `mappings` as a backend of `caps` records them, merged (`coalesce`), refused past
/// [`MAX_MAPPINGS`].
pub(super) fn merged(
    caps: Capabilities,
    id: &ContainerId,
    mappings: &[PortMapping],
) -> Result<Vec<PortMapping>, Error> {
    let merged = coalesce(mappings, writes_shifted_ranges(caps));
    if merged.len() > MAX_MAPPINGS {
        return Err(too_large(
            id,
            Bound::Mappings {
                given: mappings.len(),
                merged: merged.len(),
            },
        ));
    }
    Ok(merged)
}

/// Refuse more than [`MAX_RULES`] rules for `mappings` towards `addresses` (each mapping in
/// every family it asks for that has an address; one without an address in its family is
/// refused later, as before).
pub(super) fn check_rules(
    backend: Backend,
    id: &ContainerId,
    mappings: &[PortMapping],
    addresses: &[IfAddr],
) -> Result<(), Error> {
    let address_of = |family: Family| addresses.iter().copied().find(|a| a.family() == family);
    let rules: usize = mappings
        .iter()
        .map(|m| {
            Family::ALL
                .into_iter()
                .filter(|f| m.family().is_none_or(|own| own == *f))
                .filter_map(address_of)
                .map(|addr| mapping_rules(backend, id, m, addr).len())
                .sum::<usize>()
        })
        .sum();
    if rules > MAX_RULES {
        return Err(too_large(
            id,
            Bound::Rules {
                mappings: mappings.len(),
                rules,
            },
        ));
    }
    Ok(())
}

pub(super) fn too_large(id: &ContainerId, bound: Bound) -> Error {
    Error::TooLarge {
        id: id.clone(),
        bound,
    }
}
