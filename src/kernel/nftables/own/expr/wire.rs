//! The expressions natledger's shapes are made of, as nft serialises them (attribute order
//! included, from `nft --debug=mnl`) and as they are read back, from natledger's own
//! messages or the kernel's dumps (attributes in any order, each expression's set checked:
//! an attribute natledger never writes makes the expression `Other`).

use crate::kernel::netlink;
use crate::kernel::nftables::wire::{NFTA_DATA_VALUE, NFTA_DATA_VERDICT, exact_attrs};
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

/// Serialise one expression as nft does (attribute order included).
pub(super) fn put(buf: &mut Vec<u8>, expr: &Expr) {
    let elem = netlink::begin_nest(buf, NFTA_LIST_ELEM);
    let name = match expr {
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
    };
    netlink::put_str(buf, NFTA_EXPR_NAME, name);
    let data = netlink::begin_nest(buf, NFTA_EXPR_DATA);
    let u32s = |buf: &mut Vec<u8>, attrs: &[(u16, u32)]| {
        for (kind, v) in attrs {
            netlink::put_attr(buf, *kind, &v.to_be_bytes());
        }
    };
    let value = |buf: &mut Vec<u8>, kind: u16, v: &[u8]| {
        let nest = netlink::begin_nest(buf, kind);
        netlink::put_attr(buf, NFTA_DATA_VALUE, v);
        netlink::end_nest(buf, nest);
    };
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
        Expr::Nat {
            kind,
            family,
            addr_min,
            addr_max,
            proto_min,
            proto_max,
            flags,
        } => {
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
        Expr::Counter { packets, bytes } => {
            netlink::put_attr(buf, 1, &bytes.to_be_bytes());
            netlink::put_attr(buf, 2, &packets.to_be_bytes());
        }
        Expr::Masq | Expr::Other(_) => {}
    }
    netlink::end_nest(buf, data);
    netlink::end_nest(buf, elem);
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
    let attrs = exact_attrs(data)?;
    let known = |allowed: &[u16]| attrs.iter().all(|(k, _)| allowed.contains(k));
    let get = |kind: u16| attrs.iter().find(|(k, _)| *k == kind).map(|(_, d)| *d);
    let u32_of = |kind: u16| Some(u32::from_be_bytes(get(kind)?.try_into().ok()?));
    // Absent: `Some(None)`; present but not a u32: `None`.
    let optional = |kind: u16| match get(kind) {
        None => Some(None),
        Some(_) => u32_of(kind).map(Some),
    };
    let value = |kind: u16| -> Option<Vec<u8>> {
        let nest = exact_attrs(get(kind)?)?;
        match nest.as_slice() {
            [(NFTA_DATA_VALUE, v)] => Some(v.to_vec()),
            _ => None,
        }
    };
    Some(match name {
        "payload" if known(&[1, 2, 3, 4]) => Expr::Payload {
            dreg: u32_of(1)?,
            base: u32_of(2)?,
            offset: u32_of(3)?,
            len: u32_of(4)?,
        },
        "cmp" if known(&[1, 2, 3]) => Expr::Cmp {
            sreg: u32_of(1)?,
            op: u32_of(2)?,
            data: value(3)?,
        },
        "bitwise" if known(&[1, 2, 3, 4, 5, 6]) => {
            let (mask, xor) = (value(4)?, value(5)?);
            let len = u32_of(3)? as usize;
            if mask.len() != len || xor.len() != len {
                return None;
            }
            let (sreg, dreg, op) = (u32_of(1)?, u32_of(2)?, optional(6)?);
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                op,
            }
        }
        "meta" if known(&[1, 2]) => Expr::Meta {
            key: u32_of(2)?,
            dreg: u32_of(1)?,
        },
        "ct" if known(&[1, 2, 3]) => Expr::Ct {
            key: u32_of(2)?,
            dreg: u32_of(1)?,
            dir: match get(3) {
                None => None,
                Some(&[dir]) => Some(dir),
                Some(_) => return None,
            },
        },
        "fib" if known(&[1, 2, 3]) => Expr::Fib {
            flags: u32_of(3)?,
            result: u32_of(2)?,
            dreg: u32_of(1)?,
        },
        "immediate" if known(&[1, 2]) => {
            let nest = exact_attrs(get(2)?)?;
            let data = match nest.as_slice() {
                [(NFTA_DATA_VALUE, v)] => Data::Value(v.to_vec()),
                [(NFTA_DATA_VERDICT, v)] => {
                    let verdict = exact_attrs(v)?;
                    if !verdict
                        .iter()
                        .all(|(k, _)| [NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN].contains(k))
                    {
                        return None;
                    }
                    let code = netlink::attr(v, NFTA_VERDICT_CODE)?;
                    let code = i32::from_be_bytes(code.try_into().ok()?);
                    let chain = match netlink::attr(v, NFTA_VERDICT_CHAIN) {
                        Some(c) => Some(netlink::str_of(c)?.to_string()),
                        None => None,
                    };
                    Data::Verdict { code, chain }
                }
                _ => return None,
            };
            Expr::Immediate {
                dreg: u32_of(1)?,
                data,
            }
        }
        "nat" if known(&[1, 2, 3, 4, 5, 6, 7]) => Expr::Nat {
            kind: u32_of(1)?,
            family: u32_of(2)?,
            addr_min: optional(3)?,
            addr_max: optional(4)?,
            proto_min: optional(5)?,
            proto_max: optional(6)?,
            flags: optional(7)?,
        },
        "masq" if attrs.is_empty() => Expr::Masq,
        "counter" if known(&[1, 2]) => {
            let u64_of = |kind| Some(u64::from_be_bytes(get(kind)?.try_into().ok()?));
            Expr::Counter {
                bytes: u64_of(1)?,
                packets: u64_of(2)?,
            }
        }
        _ => return None,
    })
}
