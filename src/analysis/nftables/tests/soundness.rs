//! Randomised: native rulesets of several tables and priorities (ties included), with user
//! chains, jumps, gotos, returns, verdict maps over `l4proto . dport`, DNAT maps, named sets,
//! marks (not modelled) and `numgen`; every shadow [`check`] claims is confirmed by concrete
//! packets through [`fate`]: for every packet of the enumerated universe the shadowed DNAT
//! is never met, and some packet is taken, on every way, by the shadow it names. Every other
//! round as from a dump (no host addresses: the checks probe the compared addresses grouped,
//! one standing for its group at the ports not paired with it).

use super::*;

fn xorshift(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}

const PORTS: [u64; 3] = [80, 81, 8080];
const LOCALS: [&str; 2] = ["10.0.0.1", "10.0.0.2"];
const SOURCES: [&str; 3] = ["192.0.2.1", "10.88.0.9", "203.0.113.5"];
const TARGETS: [&str; 3] = ["10.88.0.2", "10.88.0.3", "10.88.0.4"];
const IFACES: [&str; 2] = ["eth0", "eth1"];

struct Gen<F> {
    next: F,
}

impl<F: FnMut(usize) -> usize> Gen<F> {
    fn pick<'a, T>(&mut self, of: &'a [T]) -> &'a T {
        &of[(self.next)(of.len())]
    }

    fn word(&mut self, of: &[&'static str]) -> &'static str {
        of[(self.next)(of.len())]
    }

    fn chance(&mut self, percent: usize) -> bool {
        (self.next)(100) < percent
    }

    fn port_value(&mut self) -> Value {
        if self.chance(20) {
            Value::IntRange(80, 81)
        } else {
            Value::Int(*self.pick(&PORTS))
        }
    }

    fn condition(&mut self) -> Stmt {
        match (self.next)(8) {
            0 | 1 => eq(
                vec![Key::Dport(Some(*self.pick(&[6u8, 17])))],
                vec![self.port_value()],
            ),
            2 => eq(vec![Key::Dport(None)], vec![self.port_value()]),
            3 => eq(
                vec![Key::Saddr { v4: true }],
                vec![Value::Prefix(
                    ip(self.word(&SOURCES)),
                    *self.pick(&[16u8, 24, 32]),
                )],
            ),
            4 => eq(
                vec![Key::Iifname],
                vec![Value::Word((*self.pick(&IFACES)).to_string())],
            ),
            5 if self.chance(50) => eq(
                vec![Key::Daddr { v4: true }],
                vec![Value::Addr(ip(self.word(&LOCALS)))],
            ),
            // An address paired with a port, or with a protocol and a port (kube-proxy's
            // `service-ips`).
            5 if self.chance(50) => eq(
                vec![Key::Daddr { v4: true }, Key::Dport(None)],
                vec![Value::Concat(vec![
                    Value::Addr(ip(self.word(&LOCALS))),
                    Value::Int(*self.pick(&PORTS)),
                ])],
            ),
            5 => eq(
                vec![Key::Daddr { v4: true }, Key::L4Proto, Key::Dport(None)],
                vec![Value::Concat(vec![
                    Value::Addr(ip(self.word(&LOCALS))),
                    Value::Proto(*self.pick(&[6u8, 17])),
                    Value::Int(*self.pick(&PORTS)),
                ])],
            ),
            6 => eq(vec![Key::FibDaddrType], vec![Value::Word("local".into())]),
            _ => eq(vec![Key::Mark], vec![Value::Int(1)]),
        }
    }

    fn dnat(&mut self) -> Stmt {
        dnat(self.word(&TARGETS), *self.pick(&[80u16, 81]))
    }

    /// A rule of chain `me` of `n` user chains (`u0`..): jumps go only to later ones.
    fn rule(&mut self, me: Option<usize>, n: usize, nat: bool) -> Rule {
        let mut stmts: Vec<Stmt> = (0..(self.next)(3)).map(|_| self.condition()).collect();
        let later = me.map_or(0, |m| m + 1);
        let action = (self.next)(10);
        stmts.push(match action {
            0..=2 if nat => self.dnat(),
            3 if later < n => jump(&format!("u{}", later + (self.next)(n - later))),
            4 if later < n => goto(&format!("u{}", later + (self.next)(n - later))),
            5 if later < n => Stmt::Vmap {
                key: vec![Key::L4Proto, Key::Dport(None)],
                map: SetRef::Named("vm".into()),
            },
            6 => Stmt::Verdict(Verdict::Return),
            7 if nat => Stmt::Nat(Nat {
                kind: NatKind::Dnat,
                v4: Some(true),
                addr: Some(NatAddr::Map {
                    key: vec![Key::Dport(None)],
                    map: SetRef::Named("dm".into()),
                }),
                port: Some(NatPort::FromMap),
            }),
            8 if nat => Stmt::Vmap {
                key: vec![Key::Numgen { modulus: 2 }],
                map: SetRef::Inline(
                    (0..2)
                        .map(|k| Element {
                            key: Value::Int(k),
                            data: Some(ElementData::Verdict(Verdict::Accept)),
                            comment: None,
                        })
                        .collect(),
                ),
            },
            8 => Stmt::Verdict(Verdict::Drop),
            _ => Stmt::Verdict(Verdict::Accept),
        });
        rule(stmts)
    }

    fn table(&mut self, k: usize) -> NftTable {
        let n = (self.next)(4);
        let nat = true;
        let mut chains = Vec::new();
        for (hook, kind) in [
            (Hook::Prerouting, ChainKind::Nat),
            (Hook::Output, ChainKind::Nat),
            (Hook::Forward, ChainKind::Filter),
        ] {
            if !self.chance(70) {
                continue;
            }
            let is_nat = kind == ChainKind::Nat;
            let rules = (0..1 + (self.next)(4))
                .map(|_| self.rule(None, n, is_nat && nat))
                .collect();
            let priority = *self.pick(&[-150, -100, -100, 0]);
            let policy = if !is_nat && self.chance(30) {
                Policy::Drop
            } else {
                Policy::Accept
            };
            chains.push(base(
                &format!("b{hook:?}"),
                kind,
                hook,
                priority,
                policy,
                rules,
            ));
        }
        for i in 0..n {
            let rules = (0..1 + (self.next)(3))
                .map(|_| self.rule(Some(i), n, nat))
                .collect();
            chains.push(chain(&format!("u{i}"), rules));
        }
        let mut vm = Vec::new();
        for p in PORTS {
            if n > 0 && self.chance(50) {
                let to = format!("u{}", (self.next)(n));
                let v = match (self.next)(3) {
                    0 => Verdict::Jump(to),
                    1 => Verdict::Goto(to),
                    _ => Verdict::Drop,
                };
                vm.push((proto_port(*self.pick(&[6u8, 17]), p), v));
            }
        }
        let mut dm = vmap_set("dm", &["inet_service"], Vec::new());
        dm.data = Some(SetData::Typed(vec![
            "ipv4_addr".into(),
            "inet_service".into(),
        ]));
        for p in PORTS {
            if self.chance(50) {
                dm.elements.push(Element {
                    key: Value::Int(p),
                    data: Some(ElementData::Value(Value::Concat(vec![
                        Value::Addr(ip(self.word(&TARGETS))),
                        Value::Int(80),
                    ]))),
                    comment: None,
                });
            }
        }
        let family = if self.chance(50) {
            TableFamily::Ip
        } else {
            TableFamily::Inet
        };
        table(
            family,
            &format!("t{k}"),
            chains,
            vec![vmap_set("vm", &["inet_proto", "inet_service"], vm), dm],
        )
    }
}

/// Every concrete packet of the universe.
fn universe() -> Vec<Probe> {
    let mut out = Vec::new();
    let locals: std::sync::Arc<[IpAddr]> = LOCALS.iter().map(|a| ip(a)).collect();
    for port in PORTS.iter().map(|p| *p as u16).chain([9999]) {
        for proto in [6u8, 17] {
            for daddr in LOCALS.iter().chain(&["127.0.0.1", "::1"]) {
                for path in [Path::Outside, Path::Local] {
                    let (sources, ifaces): (Vec<Option<IpAddr>>, &[&str]) = match path {
                        Path::Outside if ip(daddr).is_loopback() => continue,
                        Path::Outside => (SOURCES.iter().map(|s| Some(ip(s))).collect(), &IFACES),
                        Path::Local => (vec![Some(ip(daddr))], &["lo"]),
                    };
                    for saddr in sources {
                        for iif in ifaces {
                            out.push(Probe {
                                v4: ip(daddr).is_ipv4(),
                                saddr,
                                daddr: ip(daddr),
                                proto,
                                sport: 40000,
                                dport: port,
                                iif: Some(iif.to_string()),
                                oif: Some("br0".into()),
                                path,
                                locals: locals.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_claimed_shadow_is_confirmed_by_concrete_packets() {
    let mut g = Gen {
        next: xorshift(0x2545_f491_4f6c_dd1d),
    };
    let packets = universe();
    let host = HostFacts {
        locals: LOCALS.iter().map(|a| ip(a)).collect(),
        ..HostFacts::default()
    };
    // From a dump: no host addresses, so the checks probe the addresses rules compare,
    // grouped (`checks/dests.rs`); a rule comparing both makes them the universe's.
    let dump = HostFacts::default();
    let both = table(
        TableFamily::Ip,
        "both",
        vec![base(
            "b",
            ChainKind::Filter,
            Hook::Prerouting,
            1000,
            Policy::Accept,
            vec![rule(vec![eq(
                vec![Key::Daddr { v4: true }],
                LOCALS.iter().map(|a| Value::Addr(ip(a))).collect(),
            )])],
        )],
        Vec::new(),
    );
    let (mut claims, mut dump_claims) = (0, 0);
    for round in 0..240 {
        let mut rs = Ruleset {
            tables: (0..1 + (g.next)(3)).map(|k| g.table(k)).collect(),
        };
        let host = if round % 2 == 1 {
            rs.tables.push(both.clone());
            &dump
        } else {
            &host
        };
        let fates: Vec<Fate> = packets.iter().map(|p| fate(&rs, p)).collect();
        for f in check(&rs, host) {
            if f.kind != NftKind::Shadowed {
                continue;
            }
            claims += 1;
            dump_claims += round % 2;
            let t = f.other.as_ref().expect("a shadow names its shadow");
            for (p, fate) in packets.iter().zip(&fates) {
                assert!(
                    !fate.may_dnat_at(&f.place),
                    "round {round}: {:?} claimed shadowed, but {p:?} meets it\n{rs:#?}",
                    f.place
                );
            }
            let taken = fates.iter().any(|fate| {
                fate.all(|o| {
                    o.dnat.as_ref().is_some_and(|d| d.place == *t)
                        || o.via.contains(t)
                        || matches!(&o.end, End::Dropped { place, .. } if place == t)
                }) == Tri::Yes
            });
            assert!(taken, "round {round}: no packet is taken by {t:?}\n{rs:#?}");
        }
    }
    // Not vacuous: the generator makes shadows.
    assert!(
        claims >= 40 && dump_claims >= 20,
        "{claims} claims, {dump_claims} from dumps"
    );
}
