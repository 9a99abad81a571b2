use super::*;

fn m(family: Family, name: &str, revision: u8, data: &[u8]) -> String {
    let mut out = Vec::new();
    push_match(&mut out, family, name, revision, data);
    out.join(" ")
}

fn t(family: Family, name: &str, revision: u8, data: &[u8]) -> String {
    let mut out = Vec::new();
    push_target(&mut out, family, name, revision, data);
    out.join(" ")
}

fn ne16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

const V4: Family = Family::Ipv4;
const V6: Family = Family::Ipv6;

#[test]
fn tcp_and_udp_ports_ranges_inversions_and_flags() {
    let mut tcp = ne16(&[0, 65535, 8080, 8080]);
    tcp.extend([0, 0, 0, 0]);
    assert_eq!(m(V4, "tcp", 0, &tcp), "-m tcp --dport 8080");
    let mut tcp = ne16(&[1, 9, 1000, 2000]);
    tcp.extend([0, 0x17, 0x02, 0x03]);
    assert_eq!(
        m(V4, "tcp", 0, &tcp),
        "-m tcp ! --sport 1:9 ! --dport 1000:2000 --tcp-flags FIN,SYN,RST,ACK SYN"
    );
    let mut tcp = ne16(&[0, 65535, 0, 65535]);
    tcp.extend([0, 0x3f, 0, 0x04]);
    // print_tcpf names bits one by one: ALL is never printed.
    assert_eq!(
        m(V4, "tcp", 0, &tcp),
        "-m tcp ! --tcp-flags FIN,SYN,RST,PSH,ACK,URG NONE"
    );
    let mut udp = ne16(&[53, 53, 0, 65535]);
    udp.push(0x01);
    assert_eq!(m(V6, "udp", 0, &udp), "-m udp ! --sport 53");
    // ECE/CWR, unknown inversion bits, another revision, a short struct: opaque.
    let mut tcp = ne16(&[0, 65535, 0, 65535]);
    tcp.extend([0, 0x40, 0x40, 0]);
    assert_eq!(m(V4, "tcp", 0, &tcp), "-m tcp --natledger-opaque");
    udp[8] = 0x10;
    assert_eq!(m(V4, "udp", 0, &udp), "-m udp --natledger-opaque");
    assert_eq!(m(V4, "udp", 1, &udp[..9]), "-m udp --natledger-opaque");
    assert_eq!(m(V4, "tcp", 0, &tcp[..6]), "-m tcp --natledger-opaque");
}

#[test]
fn multiport_addrtype_mark_statistic_comment() {
    // multiport v1: flags, count, ports[15], pflags[15], invert.
    let mut mp = vec![1u8, 4];
    let mut ports = [0u16; 15];
    ports[..4].copy_from_slice(&[1, 100, 200, 300]);
    mp.extend(ne16(&ports));
    let mut pflags = [0u8; 15];
    pflags[0] = 1;
    mp.extend(pflags);
    mp.push(1);
    assert_eq!(
        m(V4, "multiport", 1, &mp),
        "-m multiport ! --dports 1:100,200,300"
    );
    mp[0] = 3;
    assert_eq!(
        m(V4, "multiport", 1, &mp),
        "-m multiport --natledger-opaque"
    );
    // addrtype v1: source, dest, flags.
    let mut at = ne16(&[0x0024, 0x0002]);
    at.extend(0x5u32.to_ne_bytes());
    assert_eq!(
        m(V4, "addrtype", 1, &at),
        "-m addrtype ! --src-type LOCAL,MULTICAST --dst-type UNICAST --limit-iface-in"
    );
    // mark: mark, mask, invert.
    let mut mark = 0x4000u32.to_ne_bytes().to_vec();
    mark.extend(0x4000u32.to_ne_bytes());
    mark.extend([1, 0, 0, 0]);
    assert_eq!(m(V4, "mark", 1, &mark), "-m mark ! --mark 0x4000/0x4000");
    // statistic: kube-proxy's 1/2 and 1/3.
    let mut st = ne16(&[0, 0]);
    st.extend(0x4000_0000u32.to_ne_bytes());
    st.resize(24, 0);
    assert_eq!(
        m(V4, "statistic", 0, &st),
        "-m statistic --mode random --probability 0.50000000000"
    );
    st[4..8].copy_from_slice(&0x2aaa_aaabu32.to_ne_bytes());
    assert_eq!(
        m(V4, "statistic", 0, &st),
        "-m statistic --mode random --probability 0.33333333349"
    );
    let mut c = b"default/web:http".to_vec();
    c.resize(256, 0);
    assert_eq!(
        m(V4, "comment", 0, &c),
        "-m comment --comment default/web:http"
    );
    c.fill(b'x');
    assert_eq!(m(V4, "comment", 0, &c), "-m comment --natledger-opaque");
}

/// `xt_conntrack_mtinfo3` with the given flags, inversions, state and orig dst.
fn ct3(flags: u16, inv: u16, state: u16) -> Vec<u8> {
    let mut d = vec![0u8; 164];
    d[32..36].copy_from_slice(&[10, 0, 0, 0]); // origdst
    d[48..52].copy_from_slice(&[255, 0, 0, 0]);
    d[140..142].copy_from_slice(&80u16.to_ne_bytes()); // origdst port, host order
    d[146..148].copy_from_slice(&flags.to_ne_bytes());
    d[148..150].copy_from_slice(&inv.to_ne_bytes());
    d[150..152].copy_from_slice(&state.to_ne_bytes());
    d[156..158].copy_from_slice(&90u16.to_ne_bytes()); // origdst port high
    d
}

#[test]
fn conntrack_states_addresses_ports_and_the_state_alias() {
    assert_eq!(
        m(V4, "conntrack", 3, &ct3(1, 0, 0b110)),
        "-m conntrack --ctstate RELATED,ESTABLISHED"
    );
    assert_eq!(
        m(
            V4,
            "conntrack",
            3,
            &ct3(1 | 8 | 0x200 | 0x1000, 1 | 0x200 | 0x1000, 8)
        ),
        "-m conntrack ! --ctstate NEW --ctorigdst 10.0.0.0/8 ! --ctorigdstport 80:90 \
         --ctdir REPLY"
    );
    assert_eq!(
        m(V4, "conntrack", 3, &ct3(1 | 0x2000, 0, 1 | 0x100)),
        "-m state --state INVALID,UNTRACKED"
    );
    // The old state match.
    assert_eq!(
        m(V4, "state", 0, &0b110u32.to_ne_bytes()),
        "-m state --state RELATED,ESTABLISHED"
    );
    // Revision 2 ports are one big-endian port.
    let mut r2 = ct3(0x200, 0, 0);
    r2[140..142].copy_from_slice(&443u16.to_be_bytes());
    assert_eq!(
        m(V4, "conntrack", 2, &r2[..156]),
        "-m conntrack --ctorigdstport 443"
    );
    // An empty state mask prints no value: opaque; so does an unknown flag.
    assert_eq!(
        m(V4, "conntrack", 3, &ct3(1, 0, 0)),
        "-m conntrack --natledger-opaque"
    );
    assert_eq!(
        m(V4, "conntrack", 3, &ct3(0x4000, 0, 0)),
        "-m conntrack --natledger-opaque"
    );
}

fn range(flags: u32, min: &[u8], max: &[u8], ports: [u16; 3]) -> Vec<u8> {
    let mut d = flags.to_ne_bytes().to_vec();
    for a in [min, max] {
        let mut b = [0u8; 16];
        b[..a.len()].copy_from_slice(a);
        d.extend(b);
    }
    for p in ports {
        d.extend(p.to_be_bytes());
    }
    d.extend([0, 0]);
    d
}

#[test]
fn nat_ranges_of_every_revision() {
    // DNAT revision 0 (IPv4 multi-range compat): rangesize, flags, min, max, ports.
    let mut compat = 1u32.to_ne_bytes().to_vec();
    compat.extend(3u32.to_ne_bytes());
    compat.extend([172, 17, 0, 2, 172, 17, 0, 2]);
    compat.extend(80u16.to_be_bytes());
    compat.extend(80u16.to_be_bytes());
    assert_eq!(
        t(V4, "DNAT", 0, &compat),
        "-j DNAT --to-destination 172.17.0.2:80"
    );
    compat[..4].copy_from_slice(&2u32.to_ne_bytes());
    assert_eq!(t(V4, "DNAT", 0, &compat), "-j DNAT", "two ranges: opaque");
    // Revision 2 with a base port, an address range, random and persistent.
    let d = range(
        1 | 2 | 4 | 8 | 32,
        &[10, 0, 0, 1],
        &[10, 0, 0, 9],
        [80, 82, 9000],
    );
    assert_eq!(
        t(V4, "DNAT", 2, &d),
        "-j DNAT --to-destination 10.0.0.1-10.0.0.9:80-82/9000 --random --persistent"
    );
    // IPv6: brackets only with ports.
    let a: [u8; 16] = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets();
    assert_eq!(
        t(V6, "DNAT", 1, &range(3, &a, &a, [80, 80, 0])[..40]),
        "-j DNAT --to-destination [2001:db8::1]:80"
    );
    assert_eq!(
        t(V6, "SNAT", 1, &range(1 | 16, &a, &a, [0, 0, 0])[..40]),
        "-j SNAT --to-source 2001:db8::1 --random-fully"
    );
    // MASQUERADE and REDIRECT: ports without the colon.
    let mut masq = 1u32.to_ne_bytes().to_vec();
    masq.extend(2u32.to_ne_bytes());
    masq.extend([0; 8]);
    masq.extend(1024u16.to_be_bytes());
    masq.extend(2048u16.to_be_bytes());
    assert_eq!(
        t(V4, "MASQUERADE", 0, &masq),
        "-j MASQUERADE --to-ports 1024-2048"
    );
    assert_eq!(
        t(
            V6,
            "REDIRECT",
            0,
            &range(2, &[], &[], [3128, 3128, 0])[..40]
        ),
        "-j REDIRECT --to-ports 3128"
    );
    // An unknown flag, an unknown revision: the name only.
    assert_eq!(t(V4, "DNAT", 2, &range(0x40, &[], &[], [0; 3])), "-j DNAT");
    assert_eq!(t(V4, "DNAT", 3, &d), "-j DNAT");
}

#[test]
fn other_targets() {
    let mut mark = 0x2000u32.to_ne_bytes().to_vec();
    mark.extend(0x2000u32.to_ne_bytes());
    assert_eq!(t(V4, "MARK", 2, &mark), "-j MARK --set-xmark 0x2000/0x2000");
    assert_eq!(t(V4, "MARK", 1, &mark), "-j MARK");
    assert_eq!(
        t(V4, "REJECT", 0, &7u32.to_ne_bytes()),
        "-j REJECT --reject-with tcp-reset"
    );
    assert_eq!(
        t(V6, "REJECT", 0, &1u32.to_ne_bytes()),
        "-j REJECT --reject-with icmp6-adm-prohibited"
    );
    assert_eq!(t(V4, "REJECT", 0, &4u32.to_ne_bytes()), "-j REJECT");
    let mut log = vec![6u8, 8];
    log.extend(b"nat: ");
    log.resize(32, 0);
    assert_eq!(
        t(V4, "LOG", 0, &log),
        "-j LOG --log-prefix nat:  --log-level 6 --log-uid"
    );
    assert_eq!(t(V4, "CT", 0, &[0; 16]), "-j CT");
}

#[test]
fn headers_as_iptables_save_prints_them() {
    let iface = |name: &str, mask_len: usize| {
        let (mut n, mut m) = ([0u8; IFNAMSIZ], [0u8; IFNAMSIZ]);
        n[..name.len()].copy_from_slice(name.as_bytes());
        m[..mask_len].fill(0xff);
        Some((n, m))
    };
    let h = Header {
        src: Some((vec![192, 168, 0, 0], vec![255, 255, 0, 255])),
        dst: Some((vec![10, 0, 0, 0], vec![255, 0, 0, 0])),
        iniface: iface("eth", 3),
        outiface: iface("docker0", 8),
        proto: 47,
        frag: true,
        invflags: INV_DSTIP | INV_VIA_OUT | INV_FRAG,
    };
    let mut out = Vec::new();
    h.push(V4, &mut out);
    assert_eq!(
        out.join(" "),
        "-s 192.168.0.0/255.255.0.255 ! -d 10.0.0.0/8 -i eth+ ! -o docker0 -p gre ! -f"
    );
    let h = Header {
        dst: Some((
            "::a00:1".parse::<Ipv6Addr>().unwrap().octets().to_vec(),
            vec![0xff; 16],
        )),
        proto: 58,
        invflags: INV_PROTO | INV_SRCIP,
        ..Header::default()
    };
    let mut out = Vec::new();
    h.push(V6, &mut out);
    assert_eq!(out.join(" "), "! -s ::/0 -d ::10.0.0.1/128 ! -p ipv6-icmp");
    assert_eq!(proto_name(6).as_deref(), Some("tcp"));
    assert_eq!(proto_name(255), None);
}

#[test]
fn lines_quote_free_text_as_iptables_save_does() {
    let args: Vec<String> = ["-m", "comment", "--comment", "say \"hi\" it's", "-j", "X"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        save_line("C", &args),
        r#"-A C -m comment --comment "say \"hi\" it\'s" -j X"#
    );
    assert_eq!(
        crate::model::save::save_quoted("default/web:http"),
        "\"default/web:http\""
    );
    assert_eq!(
        crate::model::save::save_quoted("natledger-c1_x"),
        "natledger-c1_x"
    );
}
