use super::*;

fn rule(args: &str) -> Rule {
    Rule::parse_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap()
}

#[test]
fn every_rule_shape_round_trips() {
    for (family, args) in [
        (
            Family::Ipv4,
            "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT \
             --to-destination 10.77.0.2:80",
        ),
        (
            Family::Ipv4,
            "-d 10.78.0.1/32 -p udp -m udp --dport 9000:9002 -m comment --comment \
             natledger:c1 -j DNAT --to-destination 10.77.0.2:80-82/9000",
        ),
        (
            Family::Ipv4,
            "-s 127.0.0.0/8 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m comment \
             --comment natledger:c1 -j MASQUERADE",
        ),
        (
            Family::Ipv6,
            "-s fd77::2/128 -d fd77::2/128 -p udp -m udp --dport 81 -m comment --comment \
             natledger:c1 -j MASQUERADE",
        ),
        (
            Family::Ipv6,
            "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT \
             --to-destination [fd77::2]:80",
        ),
        (
            Family::Ipv4,
            "-m conntrack --ctstate DNAT --ctproto 17 --ctorigdst 10.78.0.1 --ctreplsrc \
             10.77.0.2 --ctorigdstport 9000:9002 --ctreplsrcport 80:82 -m comment --comment \
             natledger:c1 -j ACCEPT",
        ),
        (
            Family::Ipv4,
            "-d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate DNAT -m comment \
             --comment natledger -j DROP",
        ),
        (
            Family::Ipv6,
            "-d ::1/128 ! -i br-0123456789ab -m conntrack ! --ctstate DNAT \
             -j DROP",
        ),
        (
            Family::Ipv6,
            "-m conntrack --ctstate DNAT --ctproto 132 --ctreplsrc fd77::2 --ctorigdstport 8080 \
             --ctreplsrcport 80 -m comment --comment natledger:c1 -j ACCEPT",
        ),
        // The hairpin masquerade of a known subnet: a network source, the protocol and port
        // matches and the conntrack match in one entry.
        (
            Family::Ipv4,
            "-s 10.77.0.0/24 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m conntrack --ctstate \
             DNAT --ctproto 6 --ctorigdst 10.78.0.1 --ctreplsrc 10.77.0.2 --ctorigdstport 8080 \
             --ctreplsrcport 80 -m comment --comment natledger:c1 -j MASQUERADE",
        ),
        (
            Family::Ipv6,
            "-s fd77::/64 -d fd77::2/128 -p udp -m udp --dport 80:82 -m conntrack --ctstate \
             DNAT --ctproto 17 --ctreplsrc fd77::2 --ctorigdstport 9000:9002 \
             --ctreplsrcport 80:82 -m comment --comment natledger:c1 -j MASQUERADE",
        ),
    ] {
        let r = rule(args);
        let Some(Encoded::Entry(e)) = encode(&r, family) else {
            panic!("not encoded: {args}");
        };
        assert_eq!(e.len() % 8, 0);
        assert_eq!(decode(&e, family), Some(Decoded::Rule(r)), "{args}");
    }
}

#[test]
fn a_jump_leaves_its_offset_to_the_table() {
    let r = rule("-m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-X");
    let Some(Encoded::Jump { mut entry, to }) = encode(&r, Family::Ipv4) else {
        panic!("not a jump");
    };
    assert_eq!(to, "NATLEDGER-X");
    let at = entry.len() - 8;
    entry[at..at + 4].copy_from_slice(&1234i32.to_ne_bytes());
    let Some(Decoded::Jump { rule: got, offset }) = decode(&entry, Family::Ipv4) else {
        panic!("not decoded as a jump");
    };
    assert_eq!(offset, 1234);
    assert_eq!(got.comment.as_deref(), Some("natledger"));
    assert!(got.dst_local);
}

#[test]
fn what_natledger_does_not_write_is_not_decoded_or_encoded() {
    let r = rule("-p tcp -m tcp --dport 80 -j MASQUERADE");
    let Some(Encoded::Entry(mut e)) = encode(&r, Family::Ipv4) else {
        panic!()
    };
    let layout = Layout::of(Family::Ipv4);
    e[layout.invflags_at] = 0x10; // "! -d"
    assert_eq!(decode(&e, Family::Ipv4), None);
    e[layout.invflags_at] = 0;
    e[layout.flags_at] = 0x02; // "-g" instead of "-j"
    assert_eq!(decode(&e, Family::Ipv4), None);
    e[layout.flags_at] = 0;
    e[16] = b'e'; // "-i e..."
    assert_eq!(decode(&e, Family::Ipv4), None);
    assert!(
        encode(
            &rule("-p sctp -m sctp --dport 80 -j MASQUERADE"),
            Family::Ipv4
        )
        .is_none()
    );
    assert!(encode(&rule("-d fd77::2/128 -j MASQUERADE"), Family::Ipv4).is_none());
}

#[test]
fn only_natledgers_interface_match_is_decoded() {
    let r = rule("-d 127.0.0.0/8 ! -i lo -j DROP");
    let Some(Encoded::Entry(e)) = encode(&r, Family::Ipv4) else {
        panic!()
    };
    let layout = Layout::of(Family::Ipv4);
    let (at, mask_at) = layout.iniface();
    for (what, change) in [
        ("-i lo, not negated", (layout.invflags_at, 0u8)),
        ("! -o as well", (layout.invflags_at, 0x03)),
        ("a wildcard mask (lo+)", (mask_at + 2, 0)),
        ("a longer name in the mask only", (mask_at + 3, 0xff)),
        ("-o set", (at + 16, b'x')),
    ] {
        let mut bad = e.clone();
        bad[change.0] = change.1;
        assert_eq!(decode(&bad, Family::Ipv4), None, "{what}");
    }
    assert_eq!(decode(&e, Family::Ipv4), Some(Decoded::Rule(r)));
}
