//! nf_tables expressions in the text `nft --debug=netlink` prints (libnftnl's), one line per
//! expression, so tests compare natledger's encoding with what nft sends or the kernel dumps
//! in a form a reader can check:
//!
//! ```text
//! [ payload load 4b @ network header + 16 => reg 1 ]
//! [ cmp eq reg 1 0x0100000a ]
//! [ nat dnat ip addr_min reg 1 proto_min reg 2 flags 0x2 ]
//! ```
//! Values print as libnftnl prints them: 32-bit words in host byte order, the last one padded
//! with zeros. Expressions natledger never writes print as `[ NAME ? ]`.

use super::expr::{Data, Expr, parse_list};
use crate::model::family::Family;

/// The expressions (the *contents* of NFTA_RULE_EXPRESSIONS), one line each, without
/// indentation, each line ending in a newline. A malformed list is one line saying so.
/// `family` is that of the table (libnftnl's text does not depend on it).
pub fn debug_text(family: Family, expressions: &[u8]) -> String {
    let _ = family;
    let Some(exprs) = parse_list(expressions) else {
        return "[ malformed expression list ]\n".to_string();
    };
    exprs.iter().map(|e| format!("[ {} ]\n", line(e))).collect()
}

/// `meta` keys by number, as libnftnl names them.
const META_KEYS: [&str; 17] = [
    "len",
    "protocol",
    "priority",
    "mark",
    "iif",
    "oif",
    "iifname",
    "oifname",
    "iiftype",
    "oiftype",
    "skuid",
    "skgid",
    "nftrace",
    "rtclassid",
    "secmark",
    "nfproto",
    "l4proto",
];

/// `ct` keys by number, as libnftnl names them.
const CT_KEYS: [&str; 23] = [
    "state",
    "direction",
    "status",
    "mark",
    "secmark",
    "expiration",
    "helper",
    "l3protocol",
    "src",
    "dst",
    "protocol",
    "proto_src",
    "proto_dst",
    "label",
    "packets",
    "bytes",
    "avgpkt",
    "zone",
    "event",
    "src_ip",
    "dst_ip",
    "src_ip6",
    "dst_ip6",
];

fn line(expr: &Expr) -> String {
    match expr {
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => {
            let base = match base {
                0 => "link",
                1 => "network",
                2 => "transport",
                3 => "inner",
                _ => "unknown",
            };
            format!("payload load {len}b @ {base} header + {offset} => reg {dreg}")
        }
        Expr::Cmp { sreg, op, data } => {
            let op = ["eq", "neq", "lt", "lte", "gt", "gte"]
                .get(*op as usize)
                .unwrap_or(&"?");
            format!("cmp {op} reg {sreg} {}", words(data))
        }
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            op: None | Some(0),
        } => {
            format!(
                "bitwise reg {dreg} = ( reg {sreg} & {} ) ^ {}",
                words(mask),
                words(xor)
            )
        }
        Expr::Bitwise { .. } => "bitwise ?".to_string(),
        Expr::Meta { key, dreg } => {
            format!("meta load {} => reg {dreg}", name(&META_KEYS, *key))
        }
        Expr::Ct { key, dreg, dir } => {
            let dir = match dir {
                None => "",
                Some(0) => " , dir original",
                Some(_) => " , dir reply",
            };
            format!("ct load {} => reg {dreg}{dir}", name(&CT_KEYS, *key))
        }
        Expr::Fib {
            flags,
            result,
            dreg,
        } => fib_line(*flags, *result, *dreg),
        Expr::Immediate {
            dreg,
            data: Data::Value(v),
        } => {
            format!("immediate reg {dreg} {}", words(v))
        }
        Expr::Immediate {
            dreg,
            data: Data::Verdict { code, chain },
        } => {
            format!("immediate reg {dreg} {}", verdict(*code, chain.as_deref()))
        }
        Expr::Nat { .. } => nat_line(expr),
        Expr::Masq => "masq".to_string(),
        Expr::Counter { packets, bytes } => format!("counter pkts {packets} bytes {bytes}"),
        Expr::Other(name) => format!("{name} ?"),
    }
}

fn fib_line(flags: u32, result: u32, dreg: u32) -> String {
    let names = ["saddr", "daddr", "mark", "iif", "oif", "present"];
    let flags: Vec<&str> = (0..names.len())
        .filter(|bit| flags & (1 << bit) != 0)
        .map(|bit| names[bit])
        .collect();
    let result = name(&["unspec", "oif", "oifname", "type"], result);
    format!("fib {} {result} => reg {dreg}", flags.join(" . "))
}

fn verdict(code: i32, chain: Option<&str>) -> String {
    match (code, chain) {
        (0, _) => "drop".to_string(),
        (1, _) => "accept".to_string(),
        (-1, _) => "continue".to_string(),
        (-2, _) => "break".to_string(),
        (-3, Some(c)) => format!("jump -> {c}"),
        (-4, Some(c)) => format!("goto -> {c}"),
        (-5, _) => "return".to_string(),
        (code, _) => format!("verdict {code}"),
    }
}

fn nat_line(expr: &Expr) -> String {
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
        return String::new();
    };
    let kind = name(&["snat", "dnat"], *kind);
    let family = match family {
        1 => "inet",
        2 => "ip",
        10 => "ip6",
        _ => "unknown",
    };
    let mut text = format!("nat {kind} {family}");
    let regs = [
        ("addr_min", addr_min),
        ("addr_max", addr_max),
        ("proto_min", proto_min),
        ("proto_max", proto_max),
    ];
    for (label, reg) in regs {
        if let Some(reg) = reg {
            text.push_str(&format!(" {label} reg {reg}"));
        }
    }
    if let Some(flags) = flags {
        text.push_str(&format!(" flags 0x{flags:x}"));
    }
    text
}

fn name(names: &[&'static str], n: u32) -> String {
    names
        .get(n as usize)
        .map_or_else(|| n.to_string(), |s| s.to_string())
}

/// libnftnl's value text: `0x%08x` per 32-bit word in host order, space-separated.
fn words(data: &[u8]) -> String {
    data.chunks(4)
        .map(|chunk| {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            format!("0x{:08x}", u32::from_ne_bytes(word))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
