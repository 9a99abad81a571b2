//! A packet's fields against a rule's values, three-valued ([`Tri`]): `Yes` and `No` only
//! when the packet's concrete fields decide it; a key or value not modelled is `Maybe`.

use std::net::IpAddr;

use crate::analysis::verdict::Tri;
use crate::model::ruleset::{Element, Hook, Key, Match, Op, Operand, Value};

/// What one key reads of a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Addr(IpAddr),
    Int(u64),
    /// A symbol and its number (`new` and ct state's bit 8, `local` and fib's 2); `bits`
    /// when the number is a flag of a mask.
    Sym {
        word: &'static str,
        number: u64,
        bits: bool,
    },
    Name(String),
    /// `ct status` of a connection's first packet: `dnat` known, `seen-reply`, `assured`,
    /// `confirmed` and `dying` certainly not, the rest unknown.
    CtStatus {
        dnat: bool,
    },
    /// `numgen ... mod N`: any of 0..N.
    Numgen(u32),
    /// The expression does not apply to this packet (`ip saddr` of an IPv6 packet, `tcp
    /// dport` of a UDP one): the rule does not match, whatever the op.
    Absent,
    Unknown,
}

/// An interface as a hook sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Iface {
    Absent,
    Unknown,
    Name(String),
}

/// The concrete facts of a packet at one hook.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Pkt {
    pub v4: bool,
    pub saddr: Option<IpAddr>,
    pub daddr: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub daddr_local: bool,
    pub dnatted: bool,
    pub iif: Iface,
    pub oif: Iface,
    pub hook: Hook,
}

impl Pkt {
    pub(crate) fn field(&self, key: &Key) -> Field {
        match key {
            Key::Saddr { v4 } if *v4 == self.v4 => self.saddr.map_or(Field::Unknown, Field::Addr),
            Key::Daddr { v4 } if *v4 == self.v4 => Field::Addr(self.daddr),
            Key::Saddr { .. } | Key::Daddr { .. } => Field::Absent,
            Key::L4Proto => Field::Int(self.proto.into()),
            Key::Dport(p) | Key::Sport(p) if p.is_some_and(|p| p != self.proto) => Field::Absent,
            Key::Dport(_) | Key::Sport(_) if ![6, 17, 132, 136, 33].contains(&self.proto) => {
                Field::Absent
            }
            Key::Dport(_) => Field::Int(self.dport.into()),
            Key::Sport(_) => Field::Int(self.sport.into()),
            Key::Iifname | Key::Iif => iface(&self.iif),
            Key::Oifname | Key::Oif => iface(&self.oif),
            Key::NfProto => Field::Sym {
                word: if self.v4 { "ipv4" } else { "ipv6" },
                number: if self.v4 { 2 } else { 10 },
                bits: false,
            },
            Key::FibDaddrType => {
                let (word, number) = if self.daddr_local {
                    ("local", 2)
                } else {
                    ("unicast", 1)
                };
                Field::Sym {
                    word,
                    number,
                    bits: false,
                }
            }
            Key::CtState => Field::Sym {
                word: "new",
                number: 8,
                bits: true,
            },
            Key::Numgen { modulus } => Field::Numgen(*modulus),
            Key::CtStatus => Field::CtStatus { dnat: self.dnatted },
            Key::Mark | Key::Other(_) => Field::Unknown,
        }
    }
}

fn iface(i: &Iface) -> Field {
    match i {
        // The kernel reads a hook's missing device as "" (index 0): `iifname != "eth0"`
        // in output matches, `iifname "eth0"` does not.
        Iface::Absent => Field::Name(String::new()),
        Iface::Unknown => Field::Unknown,
        Iface::Name(n) => Field::Name(n.clone()),
    }
}

/// An nft word's number, where the key's values are numbers (protocols).
fn word_number(w: &str) -> Option<u64> {
    Some(match w {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        "icmpv6" | "ipv6-icmp" => 58,
        "udplite" => 136,
        "dccp" => 33,
        _ => return w.parse().ok(),
    })
}

fn addr_le(a: IpAddr, b: IpAddr) -> Option<bool> {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => Some(a <= b),
        (IpAddr::V6(a), IpAddr::V6(b)) => Some(a <= b),
        _ => None,
    }
}

fn in_prefix(a: IpAddr, net: IpAddr, len: u8) -> Option<bool> {
    match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len.min(32))
            };
            Some(u32::from(a) & mask == u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len.min(128))
            };
            Some(u128::from(a) & mask == u128::from(n) & mask)
        }
        _ => None,
    }
}

/// Whether field `f` equals (is in) value `v`.
pub(crate) fn equals(f: &Field, v: &Value) -> Tri {
    match (f, v) {
        (Field::Absent, _) => Tri::No,
        (Field::Unknown, _) | (_, Value::Concat(_)) => Tri::Maybe,
        (Field::Addr(a), Value::Addr(b)) => Tri::from_bool(a == b),
        (Field::Addr(a), Value::Prefix(n, l)) => {
            in_prefix(*a, *n, *l).map_or(Tri::No, Tri::from_bool)
        }
        (Field::Addr(a), Value::AddrRange(lo, hi)) => match (addr_le(*lo, *a), addr_le(*a, *hi)) {
            (Some(x), Some(y)) => Tri::from_bool(x && y),
            _ => Tri::No,
        },
        (Field::Int(n), Value::Int(m)) => Tri::from_bool(n == m),
        (Field::Int(n), Value::IntRange(lo, hi)) => Tri::from_bool(lo <= n && n <= hi),
        (Field::Int(n), Value::Proto(p)) => Tri::from_bool(*n == u64::from(*p)),
        (Field::Int(n), Value::Word(w)) => {
            word_number(w).map_or(Tri::Maybe, |m| Tri::from_bool(*n == m))
        }
        (Field::Numgen(m), Value::Int(v)) => {
            if *v < u64::from(*m) {
                Tri::Maybe
            } else {
                Tri::No
            }
        }
        (Field::Numgen(m), Value::IntRange(lo, hi)) => {
            if *lo == 0 && *hi + 1 >= u64::from(*m) {
                Tri::Yes
            } else if *lo < u64::from(*m) {
                Tri::Maybe
            } else {
                Tri::No
            }
        }
        (Field::Sym { word, .. }, Value::Word(w)) => Tri::from_bool(w.eq_ignore_ascii_case(word)),
        (Field::Sym { number, bits, .. }, Value::Int(m)) => {
            Tri::from_bool(if *bits { number & m != 0 } else { number == m })
        }
        (Field::CtStatus { dnat }, Value::Word(w)) => match w.as_str() {
            "dnat" => Tri::from_bool(*dnat),
            "seen-reply" | "assured" | "confirmed" | "dying" => Tri::No,
            _ => Tri::Maybe,
        },
        (Field::CtStatus { dnat }, Value::Int(0x20)) => Tri::from_bool(*dnat),
        (Field::Name(n), Value::Word(w)) => Tri::from_bool(match w.strip_suffix('*') {
            Some(prefix) => n.starts_with(prefix),
            None => n == w,
        }),
        _ => Tri::Maybe,
    }
}

/// Whether the packet's fields for `keys` equal `v` (a concatenation field by field).
pub(crate) fn key_equals(fields: &[Field], v: &Value) -> Tri {
    match (fields, v) {
        ([f], v) => equals(f, v),
        (fs, Value::Concat(parts)) if parts.len() == fs.len() => fs
            .iter()
            .zip(parts)
            .fold(Tri::Yes, |acc, (f, p)| acc.and(equals(f, p))),
        _ => Tri::Maybe,
    }
}

/// What a lookup of a packet's key in a set's elements may find.
pub(crate) struct Lookup<'e> {
    /// Elements the key may (`Maybe`) or certainly (`Yes`, at most one, last) be.
    pub hits: Vec<(&'e Element, Tri)>,
    /// Whether the key may be in none.
    pub none: bool,
}

pub(crate) fn lookup<'e>(
    fields: &[Field],
    elements: impl IntoIterator<Item = &'e Element>,
) -> Lookup<'e> {
    if fields.contains(&Field::Absent) {
        return Lookup {
            hits: Vec::new(),
            none: true,
        };
    }
    let mut hits = Vec::new();
    for e in elements {
        match key_equals(fields, &e.key) {
            Tri::No => {}
            Tri::Yes => {
                hits.push((e, Tri::Yes));
                return Lookup { hits, none: false };
            }
            Tri::Maybe => hits.push((e, Tri::Maybe)),
        }
    }
    // `numgen mod N` with an element for each of 0..N: always one of them.
    let none = match fields {
        [Field::Numgen(m)] => !(0..u64::from(*m)).all(|k| {
            hits.iter()
                .any(|(e, _)| equals(&Field::Int(k), &e.key) == Tri::Yes)
        }),
        _ => true,
    };
    Lookup { hits, none }
}

/// Whether a packet meets `m`; `find` looks its key up in a named set of the rule's table.
pub(crate) fn test<'t>(
    pkt: &Pkt,
    m: &Match,
    find: &dyn Fn(&str, &[Field]) -> Option<Lookup<'t>>,
) -> Tri {
    let fields: Vec<Field> = m.key.iter().map(|k| pkt.field(k)).collect();
    if fields.contains(&Field::Absent) {
        return Tri::No;
    }
    let eq = || match &m.right {
        Operand::Values(vs) => vs
            .iter()
            .fold(Tri::No, |acc, v| acc.or(key_equals(&fields, v))),
        Operand::Set(name) => match find(name, &fields) {
            None => Tri::Maybe,
            Some(l) => {
                if l.hits.iter().any(|(_, t)| *t == Tri::Yes) {
                    Tri::Yes
                } else if l.hits.is_empty() {
                    Tri::No
                } else {
                    Tri::Maybe
                }
            }
        },
    };
    match m.op {
        Op::Eq => eq(),
        Op::Ne => !eq(),
        op => match (fields.as_slice(), &m.right) {
            ([Field::Int(n)], Operand::Values(vs)) if vs.len() == 1 => match &vs[0] {
                Value::Int(v) => Tri::from_bool(match op {
                    Op::Lt => n < v,
                    Op::Gt => n > v,
                    Op::Le => n <= v,
                    _ => n >= v,
                }),
                _ => Tri::Maybe,
            },
            _ => Tri::Maybe,
        },
    }
}
