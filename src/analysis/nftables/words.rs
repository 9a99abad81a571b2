//! A place and its fix in nft's own words, through `model::ruleset::render` (`nft delete
//! rule FAMILY TABLE CHAIN handle N`, `nft delete element FAMILY TABLE SET { KEY }`).

use super::Place;
use crate::model::ruleset::render;

/// `element tcp . 30080 of map no-endpoint-nodeports of ip kube-proxy` or `rule handle 7
/// of chain X of inet netavark`.
pub(crate) fn place(p: &Place) -> String {
    let table = format!("{} {}", p.family.word(), p.table);
    match (&p.element, p.handle) {
        (Some(e), _) => format!(
            "element {{ {} }} of {table} map {}",
            render::element_key(&e.key),
            e.set
        ),
        (None, Some(h)) => format!("rule handle {h} in {table} chain {}", p.chain),
        (None, None) => format!("rule {} in {table} chain {}", p.position + 1, p.chain),
    }
}

/// The command that removes what is at `p`.
pub(crate) fn fix(p: &Place) -> String {
    let (family, table) = (p.family.word(), &p.table);
    match (&p.element, p.handle) {
        (Some(e), _) => render::delete_element(p.family, table, &e.set, &e.key),
        (None, Some(h)) => render::delete_rule(p.family, table, &p.chain, h),
        (None, None) => format!(
            "nft -a list chain {family} {table} {} (then: nft delete rule {family} {table} {} \
             handle N, N the handle of its rule {})",
            p.chain,
            p.chain,
            p.position + 1
        ),
    }
}
