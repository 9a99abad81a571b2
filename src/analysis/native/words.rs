//! A place, a value and a fix in nft's own words. The fix commands' syntax is nft's
//! (`nft delete rule FAMILY TABLE CHAIN handle N`, `nft delete element FAMILY TABLE SET {
//! KEY }`); `model::ruleset::render` is to say the same once it exists.

use super::Place;
use crate::model::ruleset::Value;

/// A value as nft prints it in a set element.
pub(crate) fn value(v: &Value) -> String {
    match v {
        Value::Int(n) => n.to_string(),
        Value::IntRange(a, b) => format!("{a}-{b}"),
        Value::Addr(a) => a.to_string(),
        Value::Prefix(a, l) => format!("{a}/{l}"),
        Value::AddrRange(a, b) => format!("{a}-{b}"),
        Value::Proto(6) => "tcp".into(),
        Value::Proto(17) => "udp".into(),
        Value::Proto(132) => "sctp".into(),
        Value::Proto(p) => p.to_string(),
        Value::Word(w) => w.clone(),
        Value::Concat(parts) => parts.iter().map(value).collect::<Vec<_>>().join(" . "),
    }
}

/// `element tcp . 30080 of map no-endpoint-nodeports of ip kube-proxy` or `rule handle 7
/// of chain X of inet netavark`.
pub(crate) fn place(p: &Place) -> String {
    let table = format!("{} {}", p.family.word(), p.table);
    match (&p.element, p.handle) {
        (Some(e), _) => format!("element {{ {} }} of {table} map {}", value(&e.key), e.set),
        (None, Some(h)) => format!("rule handle {h} in {table} chain {}", p.chain),
        (None, None) => format!("rule {} in {table} chain {}", p.position + 1, p.chain),
    }
}

/// The command that removes what is at `p`.
pub(crate) fn fix(p: &Place) -> String {
    let (family, table) = (p.family.word(), &p.table);
    match (&p.element, p.handle) {
        (Some(e), _) => format!(
            "nft delete element {family} {table} {} {{ {} }}",
            e.set,
            value(&e.key)
        ),
        (None, Some(h)) => format!("nft delete rule {family} {table} {} handle {h}", p.chain),
        (None, None) => format!(
            "nft -a list chain {family} {table} {} (then: nft delete rule {family} {table} {} \
             handle N, N the handle of its rule {})",
            p.chain,
            p.chain,
            p.position + 1
        ),
    }
}
