//! Reading iptables-nft rules of any owner as the tokens `iptables-nft-save` prints after
//! `-A CHAIN`, one chain at a time, without a process.
//!
//! A table is read chain by chain: [`Session::chains`] (one small `NFT_MSG_GETCHAIN` dump:
//! names, and hook and policy of base chains) and [`Session::each_rule`] (an
//! `NFT_MSG_GETRULE` dump of one chain, each rule decoded and handed to the caller while the
//! dump streams, so a 10,000-rule chain is never held). A whole-table dump would cost far
//! more: the kernel restarts a dump for every 32 KiB it sends, and each restart walks the
//! table from its first rule.
//!
//! # The encodings decoded (those iptables-nft 1.8.9 writes)
//! - `meta l4proto` + `cmp` eq/neq: `-p` (`! -p`).
//! - `payload` network header saddr/daddr, `bitwise` mask or a shortened load for
//!   byte-aligned prefixes, `cmp` eq/neq: `-s`/`-d`; frag_off & 0x1fff: `-f`.
//! - `meta iifname/oifname` + `cmp`: `-i`/`-o`; a compare without the trailing NUL is the
//!   `+` wildcard (`INVAL/D` is iptables-nft's `! -i +`).
//! - transport header ports, native for `-m tcp`/`-m udp` without options: a 2-byte load
//!   with `cmp` eq/neq/lte/gt/gte or `range` eq/neq, or one 4-byte load of both ports;
//!   tcp flags as a 1-byte load, `bitwise`, `cmp`. They become the `tcp`/`udp` match
//!   iptables-nft-save prints.
//! - `meta mark` (+ `bitwise`) + `cmp`: `-m mark --mark`.
//! - compat `match` / `target` expressions: the xtables info structs, decoded by
//!   [`crate::kernel::xt`] exactly as for iptables-legacy.
//! - `immediate` verdicts: ACCEPT, DROP, RETURN, `-j CHAIN`, `-g CHAIN`; `counter` is skipped.
//! - the comment in the rule's user data: `-m comment --comment`, after the other matches
//!   (where iptables-nft-save puts it).
//!
//! Anything else is `-m nft:NAME --natledger-opaque` (NAME the expression), never a
//! narrower rule than the kernel's. One encoding iptables-nft 1.8.9 writes is read wider
//! than iptables-nft-save prints it, on purpose: `! --sport A ! --dport B` with single ports
//! is written as one 4-byte compare `!= (A, B)`, which the kernel matches when *either* port
//! differs; iptables-nft-save prints it as both differing (narrower), natledger as opaque.

mod expr;
pub mod skip;

use std::io;

use expr::Decoder;

use super::wire::{self, NFT_MSG_GETCHAIN, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, be32};
use super::wire::{NFTA_CHAIN_HOOK, NFTA_CHAIN_NAME, NFTA_CHAIN_POLICY, NFTA_CHAIN_TABLE};
use super::wire::{NFTA_HOOK_HOOKNUM, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_HANDLE};
use super::wire::{NFTA_RULE_TABLE, NFTA_RULE_USERDATA};
use super::{NftError, Session, comment_udata, dump_request, genmsg, subsys};
use crate::kernel::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST};
use crate::model::family::Family;

/// The built-in chains by hook number, the order iptables-nft-save lists base chains in.
const HOOKS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// One chain of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    pub name: String,
    /// The hook number of a base chain (`NF_INET_*`).
    pub hook: Option<u32>,
    /// A base chain's policy (`ACCEPT`, `DROP`).
    pub policy: Option<String>,
}

impl NftChain {
    /// `iptables-nft-save`'s policy column: the policy, or `-` for a user chain.
    pub fn policy_text(&self) -> &str {
        self.policy.as_deref().unwrap_or("-")
    }
}

impl Session<'_> {
    /// The chains of `table` as iptables-nft-save lists them: base chains by hook, then the
    /// others by name. Empty when the table does not exist.
    pub fn chains(&mut self, family: Family, table: &str) -> Result<Vec<NftChain>, NftError> {
        let err = |source| NftError::Read {
            family,
            what: format!("the chains of {table}"),
            source,
        };
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(48);
        let start = netlink::begin(
            &mut request,
            subsys(NFT_MSG_GETCHAIN),
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
        );
        genmsg(&mut request, family.af(), 0);
        netlink::put_str(&mut request, NFTA_CHAIN_TABLE, table);
        netlink::finish(&mut request, start);
        let mut chains = Vec::new();
        let answer = self.sock.dump(seq, &request, |message| {
            if message.kind != subsys(NFT_MSG_NEWCHAIN) {
                return Ok(());
            }
            let body = message.payload.get(4..).unwrap_or_default();
            let name_of = |kind| netlink::attr(body, kind).and_then(netlink::str_of);
            // Dumps of every table of the family: keep this table's.
            if name_of(NFTA_CHAIN_TABLE) != Some(table) {
                return Ok(());
            }
            let name =
                name_of(NFTA_CHAIN_NAME).ok_or_else(|| io::Error::other("chain without a name"))?;
            let hook = netlink::attr(body, NFTA_CHAIN_HOOK)
                .and_then(|h| netlink::attr(h, NFTA_HOOK_HOOKNUM))
                .and_then(be32);
            let policy = netlink::attr(body, NFTA_CHAIN_POLICY)
                .and_then(be32)
                .map(|p| match p {
                    0 => "DROP".to_string(),
                    1 => "ACCEPT".to_string(),
                    other => other.to_string(),
                });
            chains.push(NftChain {
                name: name.to_string(),
                hook,
                policy: policy.filter(|_| hook.is_some()),
            });
            Ok(())
        });
        match answer {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        }
        chains.sort_by(|a, b| {
            let key = |c: &NftChain| {
                let builtin = c.hook.map(|_| HOOKS.iter().position(|h| *h == c.name));
                (c.hook.is_none(), builtin, c.hook)
            };
            key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
        });
        Ok(chains)
    }

    /// Decode every rule of `chain` in `table`, in order, handing each to `each` with its
    /// 1-based position and handle while the dump streams; with `dsts`, a rule that no packet
    /// to one of them can match ([`skip::elsewhere`]) is counted but neither decoded nor
    /// handed on. Returns how many there were, or `None` when the table or chain does not
    /// exist.
    pub fn each_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        dsts: Option<&[crate::model::family::IpNet]>,
        mut each: impl FnMut(usize, u64, &[String]),
    ) -> Result<Option<usize>, NftError> {
        let err = |source| NftError::Read {
            family,
            what: format!("chain {chain} of {table}"),
            source,
        };
        let seq = self.sock.next_seq();
        let mut count = 0;
        let mut args = Vec::with_capacity(32);
        let answer = self
            .sock
            .dump(seq, &dump_request(seq, family, table, chain), |message| {
                if message.kind != subsys(NFT_MSG_NEWRULE) {
                    return Ok(());
                }
                let malformed = || io::Error::other("malformed rule message");
                let body = message.payload.get(4..).ok_or_else(malformed)?;
                let name = |kind| netlink::attr(body, kind).and_then(netlink::str_of);
                let (in_table, on) = (name(NFTA_RULE_TABLE), name(NFTA_RULE_CHAIN));
                if (in_table.ok_or_else(malformed)?, on.ok_or_else(malformed)?) != (table, chain) {
                    return Ok(());
                }
                count += 1;
                if dsts.is_some_and(|d| skip::elsewhere(family, message.payload, d)) {
                    return Ok(());
                }
                args.clear();
                let (_, _, handle) =
                    decode_rule(family, message.payload, &mut args).ok_or_else(malformed)?;
                each(count, handle, &args);
                Ok(())
            });
        match answer {
            Ok(()) => Ok(Some(count)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(err(e)),
        }
    }
}

/// A NEWRULE message (after `nlmsghdr`): appends its tokens to `out` and returns its table,
/// chain and handle.
pub fn decode_rule<'p>(
    family: Family,
    payload: &'p [u8],
    out: &mut Vec<String>,
) -> Option<(&'p str, &'p str, u64)> {
    let body = payload.get(4..)?;
    let table = netlink::attr(body, NFTA_RULE_TABLE).and_then(netlink::str_of)?;
    let chain = netlink::attr(body, NFTA_RULE_CHAIN).and_then(netlink::str_of)?;
    let handle = u64::from_be_bytes(netlink::attr(body, NFTA_RULE_HANDLE)?.try_into().ok()?);
    let mut d = Decoder::new(family);
    if let Some(exprs) = netlink::attr(body, NFTA_RULE_EXPRESSIONS) {
        for (name, data) in wire::expressions(exprs) {
            if d.expr(name, data).is_none() {
                d.opaque(name);
            }
        }
    }
    let comment = netlink::attr(body, NFTA_RULE_USERDATA).and_then(comment_udata);
    d.finish(comment, out);
    Some((table, chain, handle))
}

#[cfg(test)]
pub(super) mod tests {
    pub(super) use super::super::wire::{
        EQ, GT, LTE, META_IIFNAME, META_L4PROTO, META_MARK, META_OIFNAME, NEQ, NETWORK,
        NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM,
        NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, TRANSPORT,
    };
    use super::*;

    pub(super) fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        netlink::put_attr(&mut b, kind, inner);
        b
    }

    pub(super) fn u32s(pairs: &[(u16, u32)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (k, v) in pairs {
            netlink::put_attr(&mut b, *k, &v.to_be_bytes());
        }
        b
    }

    pub(super) fn value(kind: u16, bytes: &[u8]) -> Vec<u8> {
        nested(kind, &nested(NFTA_DATA_VALUE, bytes))
    }

    pub(super) fn expr(name: &str, data: Vec<u8>) -> Vec<u8> {
        let mut e = Vec::new();
        netlink::put_str(&mut e, NFTA_EXPR_NAME, name);
        netlink::put_attr(&mut e, NFTA_EXPR_DATA, &data);
        e
    }

    pub(super) fn meta(key: u32) -> Vec<u8> {
        expr("meta", u32s(&[(1, 1), (2, key)]))
    }

    pub(super) fn payload(base: u32, offset: u32, len: u32) -> Vec<u8> {
        expr("payload", u32s(&[(1, 1), (2, base), (3, offset), (4, len)]))
    }

    pub(super) fn cmp(op: u32, bytes: &[u8]) -> Vec<u8> {
        let mut d = u32s(&[(1, 1), (2, op)]);
        d.extend(value(3, bytes));
        expr("cmp", d)
    }

    pub(super) fn bitwise(mask: &[u8]) -> Vec<u8> {
        let mut d = u32s(&[(1, 1), (2, 1), (3, mask.len() as u32)]);
        d.extend(value(4, mask));
        d.extend(value(5, &vec![0; mask.len()]));
        expr("bitwise", d)
    }

    pub(super) fn range(op: u32, from: u16, to: u16) -> Vec<u8> {
        let mut d = u32s(&[(1, 1), (2, op)]);
        d.extend(value(3, &from.to_be_bytes()));
        d.extend(value(4, &to.to_be_bytes()));
        expr("range", d)
    }

    pub(super) fn verdict(code: i32, chain: Option<&str>) -> Vec<u8> {
        let mut v = Vec::new();
        netlink::put_attr(&mut v, NFTA_VERDICT_CODE, &code.to_be_bytes());
        if let Some(c) = chain {
            netlink::put_str(&mut v, NFTA_VERDICT_CHAIN, c);
        }
        let mut d = u32s(&[(1, 0)]);
        d.extend(nested(2, &nested(NFTA_DATA_VERDICT, &v)));
        expr("immediate", d)
    }

    /// A NEWRULE message (after `nlmsghdr`) of rule 7 in nat chain C.
    pub(super) fn message(exprs: &[Vec<u8>], comment: Option<&str>) -> Vec<u8> {
        let mut p = Vec::new();
        genmsg(&mut p, libc::AF_INET as u8, 0);
        netlink::put_str(&mut p, NFTA_RULE_TABLE, "nat");
        netlink::put_str(&mut p, NFTA_RULE_CHAIN, "C");
        netlink::put_attr(&mut p, NFTA_RULE_HANDLE, &7u64.to_be_bytes());
        let mut list = Vec::new();
        for e in exprs {
            netlink::put_attr(&mut list, NFTA_LIST_ELEM, e);
        }
        netlink::put_attr(&mut p, NFTA_RULE_EXPRESSIONS, &list);
        if let Some(c) = comment {
            let mut u = vec![0u8, c.len() as u8 + 1];
            u.extend(c.as_bytes());
            u.push(0);
            netlink::put_attr(&mut p, NFTA_RULE_USERDATA, &u);
        }
        p
    }

    pub(super) fn decode(exprs: &[Vec<u8>], comment: Option<&str>) -> String {
        let p = message(exprs, comment);
        let mut out = Vec::new();
        let (table, chain, handle) = decode_rule(Family::Ipv4, &p, &mut out).unwrap();
        assert_eq!((table, chain, handle), ("nat", "C", 7));
        out.join(" ")
    }

    const TCP: u32 = 6;

    #[test]
    fn header_fields_ports_comment_and_goto() {
        let rule = [
            meta(META_IIFNAME),
            cmp(EQ, b"eth"),
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(NETWORK, 12, 4),
            bitwise(&[255, 240, 0, 0]),
            cmp(EQ, &[10, 16, 0, 0]),
            payload(NETWORK, 16, 1),
            cmp(NEQ, &[127]),
            payload(TRANSPORT, 0, 4),
            cmp(EQ, &[0, 1, 0, 2]),
            expr("counter", Vec::new()),
            verdict(-4, Some("X")),
        ];
        assert_eq!(
            decode(&rule, Some("say hi")),
            "-s 10.16.0.0/12 ! -d 127.0.0.0/8 -i eth+ -p tcp -m tcp --sport 1 --dport 2 \
             -m comment --comment say hi -g X"
        );
    }

    #[test]
    fn port_compares_add_up_to_one_match() {
        let rule = [
            meta(META_OIFNAME),
            cmp(NEQ, b"docker0\0"),
            meta(META_L4PROTO),
            cmp(EQ, &[17]),
            payload(TRANSPORT, 0, 2),
            range(NEQ, 1000, 2000),
            payload(TRANSPORT, 2, 2),
            cmp(GT, &1000u16.to_be_bytes()),
            verdict(1, None),
        ];
        assert_eq!(
            decode(&rule, None),
            "! -o docker0 -p udp -m udp ! --sport 1000:2000 --dport 1001:65535 -j ACCEPT"
        );
        let flags = [
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(TRANSPORT, 13, 1),
            bitwise(&[0x17]),
            cmp(EQ, &[0x02]),
            payload(TRANSPORT, 2, 2),
            cmp(LTE, &1023u16.to_be_bytes()),
        ];
        assert_eq!(
            decode(&flags, None),
            "-p tcp -m tcp --dport 0:1023 --tcp-flags FIN,SYN,RST,ACK SYN"
        );
    }

    #[test]
    fn what_is_not_understood_is_opaque_never_narrower() {
        // `! --sport 1 ! --dport 2` as iptables-nft writes it: either port may differ.
        let both = [
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(TRANSPORT, 0, 4),
            cmp(NEQ, &[0, 1, 0, 2]),
            verdict(-5, None),
        ];
        assert_eq!(
            decode(&both, None),
            "-p tcp -m nft:cmp --natledger-opaque -j RETURN"
        );
        // Ports without `-p tcp|udp`, an inverted protocol, an unknown expression.
        let loose = [
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
            expr("lookup", u32s(&[(1, 1)])),
            meta(META_L4PROTO),
            cmp(NEQ, &[TCP as u8]),
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
        ];
        assert_eq!(
            decode(&loose, None),
            "! -p tcp -m nft:cmp --natledger-opaque -m nft:lookup --natledger-opaque \
             -m nft:cmp --natledger-opaque"
        );
        // A mark with a mask goes through the xt_mark decoder.
        let mark = [
            meta(META_MARK),
            bitwise(&0x4000u32.to_ne_bytes()),
            cmp(NEQ, &0x4000u32.to_ne_bytes()),
        ];
        assert_eq!(decode(&mark, None), "-m mark ! --mark 0x4000/0x4000");
    }

    #[test]
    fn tcp_flags_iptables_cannot_name_are_opaque() {
        let tcp = [meta(META_L4PROTO), cmp(EQ, &[TCP as u8])];
        // nft's `tcp flags == syn`: the whole byte, ECE and CWR included (no mask).
        let mut whole = tcp.to_vec();
        whole.extend([payload(TRANSPORT, 13, 1), cmp(EQ, &[0x02])]);
        assert_eq!(decode(&whole, None), "-p tcp -m nft:cmp --natledger-opaque");
        // A mask naming ECE.
        let mut ece = tcp.to_vec();
        ece.extend([
            payload(TRANSPORT, 13, 1),
            bitwise(&[0x42]),
            cmp(EQ, &[0x02]),
        ]);
        assert_eq!(decode(&ece, None), "-p tcp -m nft:cmp --natledger-opaque");
    }

    #[test]
    fn a_second_protocol_compare_is_opaque() {
        // `meta l4proto != udp; meta l4proto == tcp` matches TCP: never `! -p tcp`.
        let two = [
            meta(META_L4PROTO),
            cmp(NEQ, &[17]),
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
        ];
        assert_eq!(decode(&two, None), "! -p udp -m nft:cmp --natledger-opaque");
    }

    /// natledger's hairpin masquerade of a subnet as iptables-nft 1.8.9 writes it (`nft
    /// --debug=netlink list ruleset`): native header and port compares, then compat
    /// `conntrack` and `comment` matches and the `MASQUERADE` target, whose info is the
    /// legacy entry's (taken from natledger's own encoder). Read back, it parses to the rule.
    #[test]
    fn the_hairpin_masquerade_reads_back_as_written() {
        use crate::kernel::iptc::entry::{Encoded, Layout, encode, xt_at};
        use crate::model::rule::Rule;
        let args = "-s 10.77.0.0/24 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m conntrack \
                    --ctstate DNAT --ctproto 6 --ctorigdst 10.78.0.1 --ctreplsrc 10.77.0.2 \
                    --ctorigdstport 8080 --ctreplsrcport 80 -m comment --comment natledger:x \
                    -j MASQUERADE";
        let tokens: Vec<&str> = args.split_whitespace().collect();
        let rule = Rule::parse_args(&tokens).unwrap();
        let Some(Encoded::Entry(entry)) = encode(&rule, Family::Ipv4) else {
            panic!("not encoded");
        };
        let layout = Layout::of(Family::Ipv4);
        let compat = |kind: &str, at: usize| {
            let (xt, size) = xt_at(&entry, at).unwrap();
            let mut d = Vec::new();
            netlink::put_str(&mut d, 1, xt.name);
            d.extend(u32s(&[(2, u32::from(xt.revision))]));
            netlink::put_attr(&mut d, 3, xt.data);
            (expr(kind, d), at + size)
        };
        // The entry's matches after tcp: conntrack, comment; then the target.
        let (_, at) = xt_at(&entry, layout.entry_size).unwrap();
        let (conntrack, at) = compat("match", layout.entry_size + at);
        let (comment, _) = compat("match", at);
        let (masquerade, _) = compat("target", layout.target_offset(&entry));
        let written = [
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(NETWORK, 12, 3),
            cmp(EQ, &[10, 77, 0]),
            payload(NETWORK, 16, 4),
            cmp(EQ, &[10, 77, 0, 2]),
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
            conntrack,
            comment,
            expr("counter", Vec::new()),
            masquerade,
        ];
        let read = decode(&written, None);
        let tokens: Vec<&str> = read.split_whitespace().collect();
        assert_eq!(Rule::parse_args(&tokens).unwrap(), rule, "{read}");
    }

    #[test]
    fn an_unknown_expression_forgets_what_the_registers_held() {
        // The destination address loaded, then overwritten by an expression not understood
        // (a `fib` into the same register): the compare is not `-d 10.0.0.1`.
        let clobbered = [
            payload(NETWORK, 16, 4),
            expr("fib", u32s(&[(1, 1), (2, 2), (3, 1)])),
            cmp(EQ, &[10, 0, 0, 1]),
        ];
        assert_eq!(
            decode(&clobbered, None),
            "-m nft:fib --natledger-opaque -m nft:cmp --natledger-opaque"
        );
        // Without it, the same compare is the destination match.
        let plain = [payload(NETWORK, 16, 4), cmp(EQ, &[10, 0, 0, 1])];
        assert_eq!(decode(&plain, None), "-d 10.0.0.1/32");
    }
}
