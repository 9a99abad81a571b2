//! A rule no packet to this host can match, seen in its raw expressions before anything is
//! decoded: iptables-nft's `-d NET` (a network-header destination load, perhaps a `bitwise`
//! mask, a `cmp eq`) naming no address of the host. The chains a packet to a host port
//! passes are mostly kube-proxy's service rules, one per cluster address; decoding each to
//! tokens only to find its `-d` elsewhere was most of a reader's own cost
//! (`analysis::forwards`, iptables-legacy's [`crate::kernel::iptc::render::may_be_for`]).
//!
//! Sound, not complete: expressions run in order and a failed `cmp` ends the rule, so one
//! compare that cannot hold rules it out. It counts only when the register it reads was
//! loaded with the destination by the expression before it (or masked by a plain `bitwise`
//! in between) and nothing else wrote any register meanwhile; any other expression forgets
//! what was loaded. Every other rule is decoded.

use super::*;
use crate::model::family::IpNet;

/// `NFTA_PAYLOAD_*`, `NFTA_BITWISE_*`, `NFTA_CMP_*`.
const PAYLOAD_DREG: u16 = 1;
const PAYLOAD_BASE: u16 = 2;
const PAYLOAD_OFFSET: u16 = 3;
const PAYLOAD_LEN: u16 = 4;
const PAYLOAD_SREG: u16 = 5;
const BITWISE_SREG: u16 = 1;
const BITWISE_DREG: u16 = 2;
const BITWISE_MASK: u16 = 4;
const BITWISE_XOR: u16 = 5;
const BITWISE_OP: u16 = 6;
const CMP_SREG: u16 = 1;
const CMP_OP: u16 = 2;
const CMP_DATA: u16 = 3;

/// The destination bytes a register holds: `len` of them, under `mask` when a `bitwise`
/// applied one.
struct Loaded {
    reg: u32,
    len: usize,
    mask: Option<Vec<u8>>,
}

/// The value of an `NFTA_DATA_VALUE` nested in attribute `kind`.
fn data_value(data: &[u8], kind: u16) -> Option<&[u8]> {
    netlink::attr(netlink::attr(data, kind)?, NFTA_DATA_VALUE)
}

/// Whether the rule in `payload` (a NEWRULE message after `nlmsghdr`) provably matches no
/// packet to an address in `dsts`: one of its destination compares names none of them.
pub fn elsewhere(family: Family, payload: &[u8], dsts: &[IpNet]) -> bool {
    let (daddr_at, addr_len) = match family {
        Family::Ipv4 => (16, 4),
        Family::Ipv6 => (24, 16),
    };
    let Some(exprs) = payload
        .get(4..)
        .and_then(|body| netlink::attr(body, NFTA_RULE_EXPRESSIONS))
    else {
        return false;
    };
    let u32_of = |data: &[u8], kind| netlink::attr(data, kind).and_then(be32);
    let mut loaded: Option<Loaded> = None;
    for (kind, expr) in netlink::attrs(exprs) {
        if kind != NFTA_LIST_ELEM {
            continue;
        }
        let name = netlink::attr(expr, NFTA_EXPR_NAME).and_then(netlink::str_of);
        let data = netlink::attr(expr, NFTA_EXPR_DATA).unwrap_or_default();
        let before = loaded.take();
        match name {
            Some("payload") if netlink::attr(data, PAYLOAD_SREG).is_none() => {
                let dst = u32_of(data, PAYLOAD_BASE) == Some(NETWORK)
                    && u32_of(data, PAYLOAD_OFFSET) == Some(daddr_at);
                let len = u32_of(data, PAYLOAD_LEN).map_or(0, |l| l as usize);
                if let (true, Some(reg)) = (
                    dst && (1..=addr_len).contains(&len),
                    u32_of(data, PAYLOAD_DREG),
                ) {
                    loaded = Some(Loaded {
                        reg,
                        len,
                        mask: None,
                    });
                }
            }
            Some("bitwise") => {
                let (Some(b), Some(mask), Some(xor)) = (
                    before,
                    data_value(data, BITWISE_MASK),
                    data_value(data, BITWISE_XOR),
                ) else {
                    continue;
                };
                let plain = u32_of(data, BITWISE_OP).unwrap_or(0) == 0
                    && b.mask.is_none()
                    && u32_of(data, BITWISE_SREG) == Some(b.reg)
                    && mask.len() == b.len
                    && xor.iter().all(|x| *x == 0);
                if let (true, Some(reg)) = (plain, u32_of(data, BITWISE_DREG)) {
                    loaded = Some(Loaded {
                        reg,
                        len: b.len,
                        mask: Some(mask.to_vec()),
                    });
                }
            }
            Some("cmp") => {
                let Some(b) = before else { continue };
                let (Some(sreg), Some(op), Some(v)) = (
                    u32_of(data, CMP_SREG),
                    u32_of(data, CMP_OP),
                    data_value(data, CMP_DATA),
                ) else {
                    continue;
                };
                if sreg == b.reg && op == EQ && v.len() == b.len {
                    let mask = b.mask.clone().unwrap_or_else(|| vec![0xff; b.len]);
                    if !crate::kernel::xt::may_hold_any(v, &mask, dsts) {
                        return true;
                    }
                }
                // A compare writes no register: what was loaded is still there.
                loaded = Some(b);
            }
            // Writes no register.
            Some("counter") => loaded = before,
            // Anything else may have written any register.
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    /// This host: loopback's network and the node's address.
    fn host() -> Vec<IpNet> {
        nets(&["127.0.0.0/8", "10.77.0.1/32"])
    }

    /// Whether the rule is skipped for a packet to `dsts`; a skipped IPv4 rule must also
    /// decode to a `-d` that holds none of them (the tokens the walk would have judged).
    fn skipped(exprs: &[Vec<u8>], dsts: &[IpNet]) -> bool {
        let skip = elsewhere(Family::Ipv4, &message(exprs, None), dsts);
        if skip {
            let text = decode(exprs, None);
            let d = text.split(' ').skip_while(|t| *t != "-d").nth(1);
            let net: IpNet = d.unwrap_or_else(|| panic!("{text}")).parse().unwrap();
            assert!(
                !dsts.iter().any(|h| overlap(&net, h)),
                "{text} skipped for {dsts:?}"
            );
        }
        skip
    }

    /// Whether two IPv4 networks share an address: equal in the bits both fix.
    fn overlap(a: &IpNet, b: &IpNet) -> bool {
        let bits = |n: &IpNet| match n.addr {
            std::net::IpAddr::V4(a) => u32::from(a),
            std::net::IpAddr::V6(_) => panic!("IPv4 only"),
        };
        let fixed = u32::MAX
            .checked_shl(32 - u32::from(a.prefix.min(b.prefix)))
            .unwrap_or(0);
        bits(a) & fixed == bits(b) & fixed
    }

    /// kube-proxy's service rule, as iptables-nft writes `-d ADDR/32 -p tcp --dport 80`.
    fn service(addr: [u8; 4]) -> Vec<Vec<u8>> {
        vec![
            payload(NETWORK, 16, 4),
            cmp(EQ, &addr),
            meta(META_L4PROTO),
            cmp(EQ, &[6]),
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
            expr("counter", Vec::new()),
            verdict(-3, Some("KUBE-SVC-X")),
        ]
    }

    #[test]
    fn a_rule_for_another_address_is_skipped_undecoded() {
        assert!(skipped(&service([10, 96, 0, 10]), &host()));
        // Its own address, or one of the node's networks holding it: decoded.
        assert!(!skipped(&service([10, 77, 0, 1]), &host()));
        assert!(!skipped(&service([127, 0, 0, 53]), &host()));
        assert!(!skipped(
            &service([10, 96, 0, 10]),
            &nets(&["10.96.0.0/12"])
        ));
    }

    #[test]
    fn prefixes_masked_or_shortened_are_compared_on_their_bits() {
        // `-d 10.77.0.0/16` as a mask, `-d 10.77.0.0/24` as a shortened load.
        let masked = [
            payload(NETWORK, 16, 4),
            bitwise(&[255, 255, 0, 0]),
            cmp(EQ, &[10, 77, 0, 0]),
        ];
        assert!(!skipped(&masked, &host()));
        assert!(skipped(&masked, &nets(&["10.78.0.1/32"])));
        let short = [payload(NETWORK, 16, 3), cmp(EQ, &[10, 77, 0])];
        assert!(!skipped(&short, &host()));
        assert!(skipped(&short, &nets(&["10.77.1.1/32", "127.0.0.0/8"])));
    }

    #[test]
    fn what_may_match_is_never_skipped() {
        let h = host();
        // `! -d`, `-s`, no address at all, ports and protocols only.
        let negated = [payload(NETWORK, 16, 4), cmp(NEQ, &[10, 96, 0, 10])];
        let source = [payload(NETWORK, 12, 4), cmp(EQ, &[10, 96, 0, 10])];
        let ports = [
            meta(META_L4PROTO),
            cmp(EQ, &[17]),
            payload(TRANSPORT, 2, 2),
            range(EQ, 30000, 32767),
        ];
        let other_protocol = [meta(META_L4PROTO), cmp(EQ, &[132])];
        let no_match = [verdict(-3, Some("KUBE-NODEPORTS"))];
        for rule in [&negated[..], &source, &ports, &other_protocol, &no_match] {
            assert!(!skipped(rule, &h), "{}", decode(rule, None));
        }
        // The destination loaded, then any register rewritten before the compare (an
        // expression not understood, a meta load, a mask with an xor): not a `-d`.
        let fib = expr("fib", u32s(&[(1, 1), (2, 2), (3, 1)]));
        for between in [fib, meta(META_MARK)] {
            let clobbered = [payload(NETWORK, 16, 4), between, cmp(EQ, &[10, 96, 0, 10])];
            assert!(!skipped(&clobbered, &h));
        }
        let mut xor = u32s(&[(1, 1), (2, 1), (3, 4)]);
        xor.extend(value(4, &[255; 4]));
        xor.extend(value(5, &[0, 0, 0, 1]));
        let flipped = [
            payload(NETWORK, 16, 4),
            expr("bitwise", xor),
            cmp(EQ, &[10, 96, 0, 10]),
        ];
        assert!(!skipped(&flipped, &h));
        // Compared from another register than the one loaded.
        let mut other = u32s(&[(1, 2), (2, EQ)]);
        other.extend(value(3, &[10, 96, 0, 10]));
        let elsewhere_reg = [payload(NETWORK, 16, 4), expr("cmp", other)];
        assert!(!skipped(&elsewhere_reg, &h));
    }

    #[test]
    fn ipv6_destinations_too() {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        addr[15] = 1;
        let rule = message(&[payload(NETWORK, 24, 16), cmp(EQ, &addr)], None);
        assert!(elsewhere(Family::Ipv6, &rule, &nets(&["::1/128"])));
        assert!(!elsewhere(Family::Ipv6, &rule, &nets(&["2001:db8::/32"])));
        // At the IPv4 destination's offset, an IPv6 rule compares something else.
        let v4 = message(&[payload(NETWORK, 16, 4), cmp(EQ, &[10, 96, 0, 10])], None);
        assert!(!elsewhere(Family::Ipv6, &v4, &nets(&["::1/128"])));
    }
}
