//! The nf_tables wire vocabulary every codec of natledger shares: the message types and
//! attribute numbers of `linux/netfilter/nf_tables.h` and `nfnetlink.h` (each defined here
//! once), the register, `meta`, `payload` and `cmp` values the readers name, and the raw
//! decoding of a rule's expressions (name and attribute list, nested data values and
//! verdicts, big-endian numbers and registers).
//!
//! What an expression *means* is each reader's own business: [`super::read`] turns it into
//! iptables-nft-save tokens, [`super::ruleset`] into `model::ruleset` statements, and
//! [`super::own`] decodes natledger's own shapes strictly (every attribute of an expression
//! checked, [`exact_attrs`]) and encodes them with the same numbers.

use crate::kernel::netlink;

// nfnetlink.
pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(super) const NFNL_MSG_BATCH_END: u16 = 0x11;
/// `NFNL_BATCH_GENID`: a batch valid only at this nf_tables generation.
pub(crate) const NFNL_BATCH_GENID: u16 = 1;
/// The nf_tables multicast group (`NFNLGRP_NFTABLES`).
pub(super) const NFNLGRP_NFTABLES: libc::c_int = 7;

// Message types (`enum nf_tables_msg_types`).
pub(super) const NFT_MSG_NEWTABLE: u16 = 0;
pub(super) const NFT_MSG_GETTABLE: u16 = 1;
pub(super) const NFT_MSG_DELTABLE: u16 = 2;
pub(super) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(super) const NFT_MSG_GETCHAIN: u16 = 4;
pub(super) const NFT_MSG_DELCHAIN: u16 = 5;
pub(super) const NFT_MSG_NEWRULE: u16 = 6;
pub(super) const NFT_MSG_GETRULE: u16 = 7;
pub(super) const NFT_MSG_DELRULE: u16 = 8;
pub(super) const NFT_MSG_GETSET: u16 = 10;
pub(super) const NFT_MSG_GETSETELEM: u16 = 13;
pub(super) const NFT_MSG_NEWGEN: u16 = 15;
pub(super) const NFT_MSG_GETGEN: u16 = 16;
pub(super) const NFT_MSG_DESTROYTABLE: u16 = 26;
pub(super) const NFT_MSG_DESTROYCHAIN: u16 = 27;
pub(super) const NFT_MSG_DESTROYRULE: u16 = 28;

// Attributes of the messages.
pub(super) const NFTA_GEN_ID: u16 = 1;
pub(super) const NFTA_TABLE_NAME: u16 = 1;
pub(super) const NFTA_TABLE_USE: u16 = 3;
pub(super) const NFTA_CHAIN_TABLE: u16 = 1;
pub(super) const NFTA_CHAIN_NAME: u16 = 3;
pub(super) const NFTA_CHAIN_HOOK: u16 = 4;
pub(super) const NFTA_CHAIN_POLICY: u16 = 5;
pub(super) const NFTA_CHAIN_TYPE: u16 = 7;
pub(super) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(super) const NFTA_HOOK_PRIORITY: u16 = 2;
pub(super) const NFTA_RULE_TABLE: u16 = 1;
pub(super) const NFTA_RULE_CHAIN: u16 = 2;
pub(super) const NFTA_RULE_HANDLE: u16 = 3;
pub(super) const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub(super) const NFTA_RULE_POSITION: u16 = 6;
pub(super) const NFTA_RULE_USERDATA: u16 = 7;

// Attributes of expressions and their data.
pub(super) const NFTA_LIST_ELEM: u16 = 1;
pub(super) const NFTA_EXPR_NAME: u16 = 1;
pub(super) const NFTA_EXPR_DATA: u16 = 2;
pub(super) const NFTA_MATCH_NAME: u16 = 1;
pub(super) const NFTA_MATCH_INFO: u16 = 3;
pub(super) const NFTA_PAYLOAD_DREG: u16 = 1;
pub(super) const NFTA_PAYLOAD_BASE: u16 = 2;
pub(super) const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub(super) const NFTA_PAYLOAD_LEN: u16 = 4;
pub(super) const NFTA_PAYLOAD_SREG: u16 = 5;
pub(super) const NFTA_BITWISE_SREG: u16 = 1;
pub(super) const NFTA_BITWISE_DREG: u16 = 2;
pub(super) const NFTA_BITWISE_MASK: u16 = 4;
pub(super) const NFTA_BITWISE_XOR: u16 = 5;
pub(super) const NFTA_BITWISE_OP: u16 = 6;
pub(super) const NFTA_CMP_SREG: u16 = 1;
pub(super) const NFTA_CMP_OP: u16 = 2;
pub(super) const NFTA_CMP_DATA: u16 = 3;
pub(super) const NFTA_DATA_VALUE: u16 = 1;
pub(super) const NFTA_DATA_VERDICT: u16 = 2;
pub(super) const NFTA_VERDICT_CODE: u16 = 1;
pub(super) const NFTA_VERDICT_CHAIN: u16 = 2;

// Values: `meta` keys, `payload` bases, `cmp` operators, verdict codes.
pub(super) const META_MARK: u32 = 3;
pub(super) const META_IIF: u32 = 4;
pub(super) const META_OIF: u32 = 5;
pub(super) const META_IIFNAME: u32 = 6;
pub(super) const META_OIFNAME: u32 = 7;
pub(super) const META_NFPROTO: u32 = 15;
pub(super) const META_L4PROTO: u32 = 16;
pub(super) const NETWORK: u32 = 1;
pub(super) const TRANSPORT: u32 = 2;
pub(super) const EQ: u32 = 0;
pub(super) const NEQ: u32 = 1;
pub(super) const LT: u32 = 2;
pub(super) const LTE: u32 = 3;
pub(super) const GT: u32 = 4;
pub(super) const GTE: u32 = 5;
pub(super) const NFT_JUMP: i32 = -3;
pub(super) const NFT_GOTO: i32 = -4;

/// The first four bytes of `d` as a big-endian u32 (longer attributes are read from their
/// start, as the kernel's own `nla_get_be32` would not mind).
pub(super) fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
}

/// The first eight bytes of `d` as a big-endian u64.
pub(super) fn be64(d: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(d.get(..8)?.try_into().ok()?))
}

/// The first attribute of `kind` as a big-endian u32 (a register, a key, an operator).
pub(super) fn u32_attr(data: &[u8], kind: u16) -> Option<u32> {
    netlink::attr(data, kind).and_then(be32)
}

/// The value of an `NFTA_DATA_VALUE` nested in attribute `kind`.
pub(super) fn value_attr(data: &[u8], kind: u16) -> Option<&[u8]> {
    netlink::attr(netlink::attr(data, kind)?, NFTA_DATA_VALUE)
}

/// The expressions of an `NFTA_RULE_EXPRESSIONS` (its contents), each as its name and its
/// `NFTA_EXPR_DATA`: a nameless expression is `?`, one without data has empty data, and
/// attributes other than `NFTA_LIST_ELEM` are passed over.
pub(super) fn expressions(list: &[u8]) -> impl Iterator<Item = (&str, &[u8])> {
    netlink::attrs(list)
        .filter(|(kind, _)| *kind == NFTA_LIST_ELEM)
        .map(|(_, expr)| {
            let name = netlink::attr(expr, NFTA_EXPR_NAME)
                .and_then(netlink::str_of)
                .unwrap_or("?");
            let data = netlink::attr(expr, NFTA_EXPR_DATA).unwrap_or_default();
            (name, data)
        })
}

/// The content of an `NFTA_DATA_VERDICT`: its code and the chain of a jump or goto.
pub(super) fn verdict(data: &[u8]) -> Option<(i32, Option<&str>)> {
    let code = be32(netlink::attr(data, NFTA_VERDICT_CODE)?)? as i32;
    let chain = netlink::attr(data, NFTA_VERDICT_CHAIN).and_then(netlink::str_of);
    Some((code, chain))
}

/// The attributes of `buf`, or `None` unless they fill it exactly (the strict readers').
pub(super) fn exact_attrs(buf: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let attrs: Vec<_> = netlink::attrs(buf).collect();
    let used: usize = attrs
        .iter()
        .map(|(_, d)| (d.len() + 4).next_multiple_of(4))
        .sum();
    (used.next_multiple_of(4) == buf.len().next_multiple_of(4)).then_some(attrs)
}

/// An attribute list read strictly: the attributes fill it exactly, and each is read at its
/// exact size (natledger's own decoder, which must see every byte it would write).
pub(super) struct Exact<'a> {
    attrs: Vec<(u16, &'a [u8])>,
}

impl<'a> Exact<'a> {
    /// `None` unless the attributes fill `buf` exactly.
    pub(super) fn new(buf: &'a [u8]) -> Option<Exact<'a>> {
        Some(Exact {
            attrs: exact_attrs(buf)?,
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.attrs.is_empty()
    }

    /// Whether every attribute is one of `allowed`.
    pub(super) fn known(&self, allowed: &[u16]) -> bool {
        self.attrs.iter().all(|(k, _)| allowed.contains(k))
    }

    /// The first attribute of `kind`.
    pub(super) fn get(&self, kind: u16) -> Option<&'a [u8]> {
        self.attrs.iter().find(|(k, _)| *k == kind).map(|(_, d)| *d)
    }

    /// Attribute `kind`, exactly four bytes, big-endian.
    pub(super) fn u32(&self, kind: u16) -> Option<u32> {
        Some(u32::from_be_bytes(self.get(kind)?.try_into().ok()?))
    }

    /// Attribute `kind`, exactly eight bytes, big-endian.
    pub(super) fn u64(&self, kind: u16) -> Option<u64> {
        Some(u64::from_be_bytes(self.get(kind)?.try_into().ok()?))
    }

    /// Absent: `Some(None)`; present but not a u32: `None`.
    pub(super) fn optional(&self, kind: u16) -> Option<Option<u32>> {
        match self.get(kind) {
            None => Some(None),
            Some(_) => self.u32(kind).map(Some),
        }
    }

    /// Attribute `kind` holding exactly one `NFTA_DATA_VALUE`: that value.
    pub(super) fn value(&self, kind: u16) -> Option<&'a [u8]> {
        match exact_attrs(self.get(kind)?)?.as_slice() {
            [(NFTA_DATA_VALUE, v)] => Some(v),
            _ => None,
        }
    }
}
