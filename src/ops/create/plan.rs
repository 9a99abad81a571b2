//! The records of a create's rules: every mapping placed by `layout::mapping_rules` towards the
//! container's address of its family, in the backend new rules go to. Pure.

use crate::model::family::{Family, IfAddr};
use crate::model::layout::mapping_rules;
use crate::model::portspec::PortMapping;
use crate::state::ledger::RuleRecord;

use super::{Context, Creating, Error};

/// The records of every rule to write, for every mapping, each towards the container's first
/// address of the family (its subnet's hairpin with it), in the backend new rules go to.
pub(super) fn plan(
    ctx: &Context,
    input: &Creating,
    mappings: &[PortMapping],
    addresses: &[IfAddr],
) -> Result<Vec<RuleRecord>, Error> {
    let address_of = |family: Family| addresses.iter().copied().find(|a| a.family() == family);
    let mut placed = Vec::new();
    for mapping in mappings {
        let families: Vec<Family> = match mapping.family() {
            Some(family) => {
                if address_of(family).is_none() {
                    return Err(Error::FamilyMismatch {
                        mapping: mapping.clone(),
                        family,
                        have: addresses.iter().map(|a| a.addr).collect(),
                    });
                }
                vec![family]
            }
            None => Family::ALL
                .into_iter()
                .filter(|f| address_of(*f).is_some())
                .collect(),
        };
        for family in families {
            let container = address_of(family).expect("filtered above");
            placed.extend(
                mapping_rules(ctx.driver.capabilities(), &input.id, mapping, container)
                    .into_iter()
                    .map(|p| RuleRecord::new(ctx.backend(), family, p.table, p.chain, p.rule)),
            );
        }
    }
    Ok(placed)
}
