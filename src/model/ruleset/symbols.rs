//! What both dump readers (and the renderer) agree on: nft's symbols (protocol names, chain
//! priority words, hook and type words), how a literal becomes a [`Value`] given the type of
//! the key it is compared with, the canonical words of a field the model does not name
//! ([`Key::Other`]), and the fix-ups over a whole table both readers run (a NAT map's port).

use std::net::IpAddr;

use super::{
    ChainKind, ElementData, Hook, Key, Nat, NatAddr, NatPort, NftTable, Policy, SetData, SetRef,
    Stmt, TableFamily, Value,
};

/// IP protocol names nft prints, and their numbers.
const PROTOCOLS: &[(&str, u8)] = &[
    ("icmp", 1),
    ("igmp", 2),
    ("ipip", 4),
    ("tcp", 6),
    ("egp", 8),
    ("udp", 17),
    ("ipv6", 41),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("icmpv6", 58),
    ("ipv6-icmp", 58),
    ("dccp", 33),
    ("ospf", 89),
    ("pim", 103),
    ("comp", 108),
    ("vrrp", 112),
    ("l2tp", 115),
    ("sctp", 132),
    ("udplite", 136),
];

pub(super) fn proto_number(name: &str) -> Option<u8> {
    PROTOCOLS.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

pub(super) fn proto_name(number: u8) -> Option<&'static str> {
    PROTOCOLS
        .iter()
        .find(|(_, p)| *p == number)
        .map(|(n, _)| *n)
}

/// The transport headers whose `dport`/`sport` imply their protocol (`tcp dport`).
pub(super) fn transport(name: &str) -> Option<u8> {
    match name {
        "tcp" | "udp" | "sctp" | "dccp" | "udplite" => proto_number(name),
        _ => None,
    }
}

/// A chain priority as nft writes it: a number, a standard word (`dstnat`), or a word plus or
/// minus a number (`filter - 10`), for a table family and hook.
pub(super) fn priority(family: TableFamily, word: &str, delta: i64) -> Option<i32> {
    let base: i64 = if let Ok(n) = word.parse::<i64>() {
        n
    } else if family == TableFamily::Bridge {
        match word {
            "dstnat" => -300,
            "filter" => -200,
            "out" => 100,
            "srcnat" => 300,
            _ => return None,
        }
    } else {
        match word {
            "raw" => -300,
            "mangle" => -150,
            "dstnat" => -100,
            "filter" => 0,
            "security" => 50,
            "srcnat" => 100,
            _ => return None,
        }
    };
    i32::try_from(base.checked_add(delta)?).ok()
}

pub(super) fn hook(word: &str) -> Option<Hook> {
    Some(match word {
        "ingress" => Hook::Ingress,
        "prerouting" => Hook::Prerouting,
        "input" => Hook::Input,
        "forward" => Hook::Forward,
        "output" => Hook::Output,
        "postrouting" => Hook::Postrouting,
        "egress" => Hook::Egress,
        _ => return None,
    })
}

pub(super) fn chain_kind(word: &str) -> Option<ChainKind> {
    Some(match word {
        "filter" => ChainKind::Filter,
        "nat" => ChainKind::Nat,
        "route" => ChainKind::Route,
        _ => return None,
    })
}

pub(super) fn policy(word: &str) -> Option<Policy> {
    Some(match word {
        "accept" => Policy::Accept,
        "drop" => Policy::Drop,
        _ => return None,
    })
}

/// How a literal compared with a field reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ty {
    Addr,
    Proto,
    Int,
    /// A symbol kept as a word (a ct state, an interface name, a fib type).
    Word,
    /// Unknown: a number, an address, else a word.
    Any,
}

/// The type of an nft datatype word (a set's `type`).
pub(super) fn datatype(word: &str) -> Ty {
    match word {
        "ipv4_addr" | "ipv6_addr" => Ty::Addr,
        "inet_proto" => Ty::Proto,
        "inet_service" | "mark" | "integer" | "ifindex" | "uid" | "gid" | "ct_label" => Ty::Int,
        "ifname" | "ct_state" | "ct_status" | "fib_addrtype" | "nf_proto" | "verdict" => Ty::Word,
        _ => Ty::Any,
    }
}

/// The type of the values a key is compared with.
pub(super) fn key_type(key: &Key) -> Ty {
    match key {
        Key::Saddr { .. } | Key::Daddr { .. } => Ty::Addr,
        Key::L4Proto => Ty::Proto,
        Key::Dport(_) | Key::Sport(_) | Key::Mark | Key::Numgen { .. } => Ty::Int,
        Key::Iifname
        | Key::Oifname
        | Key::Iif
        | Key::Oif
        | Key::NfProto
        | Key::FibDaddrType
        | Key::CtState
        | Key::CtStatus => Ty::Word,
        Key::Other(_) => Ty::Any,
    }
}

/// The datatype word of a `typeof` expression's key, as `nft -j` prints it for that set.
pub(super) fn typeof_datatype(key: &Key) -> String {
    match key {
        Key::Saddr { v4: true } | Key::Daddr { v4: true } => "ipv4_addr",
        Key::Saddr { v4: false } | Key::Daddr { v4: false } => "ipv6_addr",
        Key::L4Proto => "inet_proto",
        Key::Dport(_) | Key::Sport(_) => "inet_service",
        Key::Iifname | Key::Oifname => "ifname",
        Key::Iif | Key::Oif => "iface_index",
        Key::NfProto => "nf_proto",
        Key::FibDaddrType => "fib_addrtype",
        Key::CtState => "ct_state",
        Key::CtStatus => "ct_status",
        Key::Mark => "mark",
        Key::Numgen { .. } => "integer",
        Key::Other(words) => return words.clone(),
    }
    .to_string()
}

/// A number as nft prints it: decimal or `0x` hex.
pub(super) fn number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None if text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
        None => None,
    }
}

/// One literal (no range, no prefix) of type `ty`.
pub(super) fn atom(text: &str, ty: Ty) -> Value {
    let word = || Value::Word(text.to_string());
    match ty {
        Ty::Word => word(),
        Ty::Proto => match number(text).and_then(|n| u8::try_from(n).ok()) {
            Some(n) => Value::Proto(n),
            None => proto_number(text).map_or_else(word, Value::Proto),
        },
        Ty::Int => number(text).map_or_else(word, Value::Int),
        Ty::Addr => text.parse::<IpAddr>().map_or_else(|_| word(), Value::Addr),
        Ty::Any => match number(text) {
            Some(n) => Value::Int(n),
            None => text.parse::<IpAddr>().map_or_else(|_| word(), Value::Addr),
        },
    }
}

/// A literal that may be a prefix (`10.0.0.0/8`) or a range (`1-5`, `10.0.0.1-10.0.0.9`).
pub(super) fn literal(text: &str, ty: Ty) -> Value {
    if ty != Ty::Word {
        if let Some((addr, len)) = text.split_once('/')
            && let (Ok(addr), Ok(len)) = (addr.parse::<IpAddr>(), len.parse::<u8>())
        {
            return Value::Prefix(addr, len);
        }
        // `ipv6-icmp` is a name, not a range.
        let whole = atom(text, ty);
        if !matches!(whole, Value::Word(_)) {
            return whole;
        }
        if let Some((lo, hi)) = text.split_once('-') {
            match (atom(lo, ty), atom(hi, ty)) {
                (Value::Int(lo), Value::Int(hi)) => return Value::IntRange(lo, hi),
                (Value::Addr(lo), Value::Addr(hi)) => return Value::AddrRange(lo, hi),
                (Value::Proto(lo), Value::Proto(hi)) => {
                    return Value::IntRange(lo.into(), hi.into());
                }
                _ => {}
            }
        }
    }
    atom(text, ty)
}

/// A prefix or range from its two halves (JSON's `prefix`/`range` objects).
pub(super) fn range(lo: Value, hi: Value) -> Option<Value> {
    Some(match (lo, hi) {
        (Value::Int(lo), Value::Int(hi)) => Value::IntRange(lo, hi),
        (Value::Proto(lo), Value::Proto(hi)) => Value::IntRange(lo.into(), hi.into()),
        (Value::Addr(lo), Value::Addr(hi)) => Value::AddrRange(lo, hi),
        _ => return None,
    })
}

/// `numgen ... offset N`: the generated number less the offset, so the key is `0..modulus`; a
/// value below the offset is never generated (None).
pub(super) fn fold_offset(value: Value, offset: u64) -> Option<Value> {
    match value {
        Value::Int(n) => n.checked_sub(offset).map(Value::Int),
        Value::IntRange(lo, hi) => {
            let hi = hi.checked_sub(offset)?;
            Some(Value::IntRange(lo.saturating_sub(offset), hi))
        }
        other => Some(other),
    }
}

/// The words of a known key, as nft writes it (`ip daddr`, `meta l4proto`, `th dport`).
pub(super) fn key_words(key: &Key) -> String {
    let port = |dir: &str, p: &Option<u8>| match p {
        Some(p) => format!("{} {dir}", proto_name(*p).unwrap_or("th")),
        None => format!("th {dir}"),
    };
    match key {
        Key::Saddr { v4 } => format!("{} saddr", if *v4 { "ip" } else { "ip6" }),
        Key::Daddr { v4 } => format!("{} daddr", if *v4 { "ip" } else { "ip6" }),
        Key::L4Proto => "meta l4proto".into(),
        Key::Dport(p) => port("dport", p),
        Key::Sport(p) => port("sport", p),
        Key::Iifname => "iifname".into(),
        Key::Oifname => "oifname".into(),
        Key::Iif => "iif".into(),
        Key::Oif => "oif".into(),
        Key::NfProto => "meta nfproto".into(),
        Key::FibDaddrType => "fib daddr type".into(),
        Key::CtState => "ct state".into(),
        Key::CtStatus => "ct status".into(),
        Key::Mark => "meta mark".into(),
        Key::Numgen { modulus } => format!("numgen random mod {modulus}"),
        Key::Other(words) => words.clone(),
    }
}

/// A payload field `PROTO FIELD` as the model names it, else `Key::Other("PROTO FIELD")`.
pub(super) fn payload_key(proto: &str, field: &str) -> Key {
    match (proto, field) {
        ("ip", "saddr") => Key::Saddr { v4: true },
        ("ip", "daddr") => Key::Daddr { v4: true },
        ("ip6", "saddr") => Key::Saddr { v4: false },
        ("ip6", "daddr") => Key::Daddr { v4: false },
        ("ip", "protocol") | ("ip6", "nexthdr") => Key::L4Proto,
        ("th", "dport") => Key::Dport(None),
        ("th", "sport") => Key::Sport(None),
        (p, "dport") if transport(p).is_some() => Key::Dport(transport(p)),
        (p, "sport") if transport(p).is_some() => Key::Sport(transport(p)),
        _ => Key::Other(format!("{proto} {field}")),
    }
}

/// A `meta KEY` (or unqualified `iifname`...) as the model names it.
pub(super) fn meta_key(key: &str) -> Key {
    match key {
        "l4proto" => Key::L4Proto,
        "iifname" => Key::Iifname,
        "oifname" => Key::Oifname,
        "iif" => Key::Iif,
        "oif" => Key::Oif,
        "nfproto" => Key::NfProto,
        "mark" => Key::Mark,
        other => Key::Other(format!("meta {other}")),
    }
}

/// A `ct KEY` as the model names it.
pub(super) fn ct_key(key: &str) -> Key {
    match key {
        "state" => Key::CtState,
        "status" => Key::CtStatus,
        other => Key::Other(format!("ct {other}")),
    }
}

/// Fix-ups both readers run over a finished table: a NAT statement whose address comes from a
/// map with concatenated data (`ipv4_addr . inet_service`) takes its port from the map too.
pub(super) fn finish_table(table: &mut NftTable) {
    let concat_data: Vec<String> = table
        .sets
        .iter()
        .filter(|s| matches!(&s.data, Some(SetData::Typed(t)) if t.len() > 1))
        .map(|s| s.name.clone())
        .collect();
    for chain in &mut table.chains {
        for rule in &mut chain.rules {
            for stmt in &mut rule.stmts {
                if let Stmt::Nat(nat) = stmt {
                    nat_port_from_map(nat, &concat_data);
                }
            }
        }
    }
}

fn nat_port_from_map(nat: &mut Nat, concat_data: &[String]) {
    let Some(NatAddr::Map { map, .. }) = &nat.addr else {
        return;
    };
    let from_map = match map {
        SetRef::Named(name) => concat_data.contains(name),
        SetRef::Inline(elements) => elements
            .iter()
            .any(|e| matches!(e.data, Some(ElementData::Value(Value::Concat(_))))),
    };
    if from_map && nat.port.is_none() {
        nat.port = Some(NatPort::FromMap);
    }
}
