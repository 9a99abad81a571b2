//! The expressions natledger's shapes are made of, as nft serialises them (attribute order
//! included, from `nft --debug=mnl`) and as they are read back, from natledger's own
//! messages or the kernel's dumps (attributes in any order, each expression's set checked:
//! an attribute natledger never writes makes the expression `Other`). The attribute numbers
//! and the strict reading of an attribute list (`Exact`) are the shared
//! `crate::kernel::nftables::wire`'s.

use crate::kernel::netlink;
use crate::kernel::nftables::wire::{Exact, NFTA_DATA_VALUE, NFTA_DATA_VERDICT, exact_attrs};
use crate::kernel::nftables::wire::{NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM};
use crate::kernel::nftables::wire::{NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE};

/// One expression, as far as natledger's shapes and the debug text need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::kernel::nftables) enum Expr {
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    /// `dreg = (sreg & mask) ^ xor`; `op` as sent (nft sends 0 for a written `&`, nothing
    /// for a prefix).
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
        op: Option<u32>,
    },
    Meta {
        key: u32,
        dreg: u32,
    },
    /// `dir`: the tuple (0 original, 1 reply) of a key that has one, as nft writes
    /// `ct original …`/`ct reply …`.
    Ct {
        key: u32,
        dreg: u32,
        dir: Option<u8>,
    },
    Fib {
        flags: u32,
        result: u32,
        dreg: u32,
    },
    Immediate {
        dreg: u32,
        data: Data,
    },
    Nat {
        kind: u32,
        family: u32,
        addr_min: Option<u32>,
        addr_max: Option<u32>,
        proto_min: Option<u32>,
        proto_max: Option<u32>,
        flags: Option<u32>,
    },
    Masq,
    Counter {
        packets: u64,
        bytes: u64,
    },
    /// Anything else (another expression, or attributes natledger never writes): its name.
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::kernel::nftables) enum Data {
    Value(Vec<u8>),
    Verdict { code: i32, chain: Option<String> },
}

impl Expr {
    /// The expression's name (`NFTA_EXPR_NAME`).
    fn name(&self) -> &str {
        match self {
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Meta { .. } => "meta",
            Expr::Ct { .. } => "ct",
            Expr::Fib { .. } => "fib",
            Expr::Immediate { .. } => "immediate",
            Expr::Nat { .. } => "nat",
            Expr::Masq => "masq",
            Expr::Counter { .. } => "counter",
            Expr::Other(name) => name,
        }
    }
}

/// Serialise one expression as nft does (attribute order included).
pub(super) fn put(buf: &mut Vec<u8>, expr: &Expr) {
    let elem = netlink::begin_nest(buf, NFTA_LIST_ELEM);
    netlink::put_str(buf, NFTA_EXPR_NAME, expr.name());
    let data = netlink::begin_nest(buf, NFTA_EXPR_DATA);
    put_data(buf, expr);
    netlink::end_nest(buf, data);
    netlink::end_nest(buf, elem);
}

fn u32s(buf: &mut Vec<u8>, attrs: &[(u16, u32)]) {
    for (kind, v) in attrs {
        netlink::put_attr(buf, *kind, &v.to_be_bytes());
    }
}

/// Attribute `kind` holding one `NFTA_DATA_VALUE`.
fn value(buf: &mut Vec<u8>, kind: u16, v: &[u8]) {
    let nest = netlink::begin_nest(buf, kind);
    netlink::put_attr(buf, NFTA_DATA_VALUE, v);
    netlink::end_nest(buf, nest);
}

/// The attributes of an expression's `NFTA_EXPR_DATA`, in nft's order.
fn put_data(buf: &mut Vec<u8>, expr: &Expr) {
    match expr {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => u32s(buf, &[(1, *dreg), (2, *base), (3, *offset), (4, *len)]),
        Expr::Cmp { sreg, op, data } => {
            u32s(buf, &[(1, *sreg), (2, *op)]);
            value(buf, 3, data);
        }
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            op,
        } => {
            u32s(buf, &[(1, *sreg), (2, *dreg)]);
            if let Some(op) = op {
                u32s(buf, &[(6, *op)]);
            }
            u32s(buf, &[(3, mask.len() as u32)]);
            value(buf, 4, mask);
            value(buf, 5, xor);
        }
        Expr::Meta { key, dreg } => u32s(buf, &[(2, *key), (1, *dreg)]),
        Expr::Ct { key, dreg, dir } => {
            u32s(buf, &[(2, *key), (1, *dreg)]);
            if let Some(dir) = dir {
                netlink::put_attr(buf, 3, &[*dir]);
            }
        }
        Expr::Fib {
            flags,
            result,
            dreg,
        } => u32s(buf, &[(3, *flags), (2, *result), (1, *dreg)]),
        Expr::Immediate { dreg, data } => {
            u32s(buf, &[(1, *dreg)]);
            put_immediate(buf, data);
        }
        Expr::Nat { .. } => put_nat(buf, expr),
        Expr::Counter { packets, bytes } => {
            netlink::put_attr(buf, 1, &bytes.to_be_bytes());
            netlink::put_attr(buf, 2, &packets.to_be_bytes());
        }
        Expr::Masq | Expr::Other(_) => {}
    }
}

/// An immediate's data: a value, or a verdict (code, and the chain of a jump or goto).
fn put_immediate(buf: &mut Vec<u8>, data: &Data) {
    match data {
        Data::Value(v) => value(buf, 2, v),
        Data::Verdict { code, chain } => {
            let outer = netlink::begin_nest(buf, 2);
            let inner = netlink::begin_nest(buf, NFTA_DATA_VERDICT);
            netlink::put_attr(buf, NFTA_VERDICT_CODE, &code.to_be_bytes());
            if let Some(chain) = chain {
                netlink::put_str(buf, NFTA_VERDICT_CHAIN, chain);
            }
            netlink::end_nest(buf, inner);
            netlink::end_nest(buf, outer);
        }
    }
}

/// A `nat`: type and family, then the registers and flags it has.
fn put_nat(buf: &mut Vec<u8>, expr: &Expr) {
    let Expr::Nat {
        kind,
        family,
        addr_min,
        addr_max,
        proto_min,
        proto_max,
        flags,
    } = expr
    else {
        return;
    };
    u32s(buf, &[(1, *kind), (2, *family)]);
    let optional = [(3, addr_min), (4, addr_max), (5, proto_min), (6, proto_max)];
    for (kind, reg) in optional {
        if let Some(reg) = reg {
            u32s(buf, &[(kind, *reg)]);
        }
    }
    if let Some(flags) = flags {
        u32s(buf, &[(7, *flags)]);
    }
}

/// The contents of NFTA_RULE_EXPRESSIONS as expressions; `None` when malformed.
pub(in crate::kernel::nftables) fn parse_list(expressions: &[u8]) -> Option<Vec<Expr>> {
    exact_attrs(expressions)?
        .into_iter()
        .map(|(kind, elem)| match kind {
            NFTA_LIST_ELEM => parse(elem),
            _ => None,
        })
        .collect()
}

/// One NFTA_LIST_ELEM; `None` when malformed, `Other` when not a shape natledger writes.
fn parse(elem: &[u8]) -> Option<Expr> {
    let attrs = exact_attrs(elem)?;
    let name = attrs
        .iter()
        .find(|(k, _)| *k == NFTA_EXPR_NAME)
        .map(|(_, d)| *d);
    let name = netlink::str_of(name?)?;
    let data = attrs
        .iter()
        .find(|(k, _)| *k == NFTA_EXPR_DATA)
        .map_or(&[][..], |(_, d)| d);
    if attrs
        .iter()
        .any(|(k, _)| *k != NFTA_EXPR_NAME && *k != NFTA_EXPR_DATA)
    {
        return Some(Expr::Other(name.to_string()));
    }
    Some(parse_data(name, data).unwrap_or_else(|| Expr::Other(name.to_string())))
}

fn parse_data(name: &str, data: &[u8]) -> Option<Expr> {
    let a = Exact::new(data)?;
    Some(match name {
        "payload" if a.known(&[1, 2, 3, 4]) => Expr::Payload {
            dreg: a.u32(1)?,
            base: a.u32(2)?,
            offset: a.u32(3)?,
            len: a.u32(4)?,
        },
        "cmp" if a.known(&[1, 2, 3]) => Expr::Cmp {
            sreg: a.u32(1)?,
            op: a.u32(2)?,
            data: a.value(3)?.to_vec(),
        },
        "bitwise" if a.known(&[1, 2, 3, 4, 5, 6]) => parse_bitwise(&a)?,
        "meta" if a.known(&[1, 2]) => Expr::Meta {
            key: a.u32(2)?,
            dreg: a.u32(1)?,
        },
        "ct" if a.known(&[1, 2, 3]) => Expr::Ct {
            key: a.u32(2)?,
            dreg: a.u32(1)?,
            dir: match a.get(3) {
                None => None,
                Some(&[dir]) => Some(dir),
                Some(_) => return None,
            },
        },
        "fib" if a.known(&[1, 2, 3]) => Expr::Fib {
            flags: a.u32(3)?,
            result: a.u32(2)?,
            dreg: a.u32(1)?,
        },
        "immediate" if a.known(&[1, 2]) => Expr::Immediate {
            data: parse_immediate(a.get(2)?)?,
            dreg: a.u32(1)?,
        },
        "nat" if a.known(&[1, 2, 3, 4, 5, 6, 7]) => Expr::Nat {
            kind: a.u32(1)?,
            family: a.u32(2)?,
            addr_min: a.optional(3)?,
            addr_max: a.optional(4)?,
            proto_min: a.optional(5)?,
            proto_max: a.optional(6)?,
            flags: a.optional(7)?,
        },
        "masq" if a.is_empty() => Expr::Masq,
        "counter" if a.known(&[1, 2]) => Expr::Counter {
            bytes: a.u64(1)?,
            packets: a.u64(2)?,
        },
        _ => return None,
    })
}

/// A `bitwise` whose mask and xor are as long as it says.
fn parse_bitwise(a: &Exact) -> Option<Expr> {
    let (mask, xor) = (a.value(4)?, a.value(5)?);
    let len = a.u32(3)? as usize;
    if mask.len() != len || xor.len() != len {
        return None;
    }
    Some(Expr::Bitwise {
        sreg: a.u32(1)?,
        dreg: a.u32(2)?,
        mask: mask.to_vec(),
        xor: xor.to_vec(),
        op: a.optional(6)?,
    })
}

/// An immediate's `NFTA_IMMEDIATE_DATA`: one value, or one verdict.
fn parse_immediate(nest: &[u8]) -> Option<Data> {
    let nest = exact_attrs(nest)?;
    Some(match nest.as_slice() {
        [(NFTA_DATA_VALUE, v)] => Data::Value(v.to_vec()),
        [(NFTA_DATA_VERDICT, v)] => {
            let verdict = Exact::new(v)?;
            if !verdict.known(&[NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN]) {
                return None;
            }
            let code = i32::from_be_bytes(verdict.get(NFTA_VERDICT_CODE)?.try_into().ok()?);
            let chain = match verdict.get(NFTA_VERDICT_CHAIN) {
                Some(c) => Some(netlink::str_of(c)?.to_string()),
                None => None,
            };
            Data::Verdict { code, chain }
        }
        _ => return None,
    })
}
