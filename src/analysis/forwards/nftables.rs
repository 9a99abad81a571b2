//! Other owners' native nftables forwards of the host ports a create maps (kube-proxy's
//! NodePorts, netavark's, firewalld's forward ports, Docker 29's, portmap's nftables
//! backend): [`find_nft`], through a [`NftSource`] (the live reader implements it),
//! with what each port's forwards were kept in the state directory for one nf_tables
//! generation, as the iptables-nft candidates are ([`super::cache`]): a create at an
//! unchanged generation whose ports were all examined before reads nothing.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Scope;
use crate::analysis::nftables::{NftSource, Owner, forwards_of, is_xtables};
use crate::model::family::Family;
use crate::model::portspec::{PortMapping, Protocol};
use crate::model::rule::IpNet;
use crate::model::ruleset::NftTable;

/// The most sets and maps of other owners' tables a create reads (each costs a dump the
/// kernel answers after a walk of the table's sets: kube-proxy's nftables mode with 5,000
/// Services, an anonymous verdict map each, made a release create 740 ms instead of 26; 500
/// Services add 45-70 ms to a debug build's); more, and create's check of native forwards
/// is skipped, said at info level (doctor reads them whole).
pub const MAX_SETS: usize = 512;

/// The cache's file in the state directory.
pub const NFT_CACHE_FILE: &str = "native-forwards.json";
const SCHEMA: u32 = 1;
/// The most host ports of one mapping examined one by one (a wider range is examined at
/// its ends and the rest said unchecked).
const MAX_PORTS: u16 = 1_024;

/// Another owner's native forward of a mapping's host port, in words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NftFound {
    pub protocol: Protocol,
    pub port: u16,
    /// `kube-proxy`, `netavark`...
    pub owner: String,
    /// The rule or element (`element { tcp . 30081 } of ip kube-proxy map service-nodeports`).
    pub place: String,
    pub to: IpAddr,
    pub to_port: u16,
    /// Whether every new connection to the port meets it.
    pub certain: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NftCache {
    schema: u32,
    generation: u32,
    scope: Option<Scope>,
    /// Per `tcp/8080`: the forwards found.
    ports: BTreeMap<String, Vec<NftFound>>,
}

fn key(protocol: Protocol, port: u16) -> String {
    format!("{}/{port}", protocol.as_str())
}

/// The host ports of `mappings` to examine.
fn wanted(mappings: &[PortMapping]) -> Vec<(Protocol, u16)> {
    let mut out: Vec<(Protocol, u16)> = Vec::new();
    for m in mappings {
        let (a, b) = (m.host_ports.start, m.host_ports.end);
        let ports: Vec<u16> = if b - a < MAX_PORTS {
            (a..=b).collect()
        } else {
            vec![a, b]
        };
        out.extend(ports.into_iter().map(|p| (m.protocol, p)));
    }
    out.sort_by_key(|(pr, p)| (pr.as_str(), *p));
    out.dedup();
    out
}

/// Every other owner's native forward of a host port of `mappings`, for new connections
/// to `locals` (this host's addresses, as the iptables walk has them) of `families`; read
/// through `source` unless `cache` holds every port at the current generation.
pub fn find_nft<S: NftSource>(
    source: &mut S,
    cache: &Path,
    mappings: &[PortMapping],
    families: &[Family],
    locals: &[IpNet],
) -> Result<Vec<NftFound>, S::Error> {
    let wanted = wanted(mappings);
    let scope = Scope::here(locals);
    let generation = source.generation()?;
    let mut kept = load(cache);
    if kept.generation != generation || kept.scope.as_ref() != Some(&scope) {
        kept = NftCache {
            schema: SCHEMA,
            generation,
            scope: Some(scope),
            ports: BTreeMap::new(),
        };
    }
    let missing: Vec<(Protocol, u16)> = wanted
        .iter()
        .copied()
        .filter(|(pr, p)| !kept.ports.contains_key(&key(*pr, *p)))
        .collect();
    if !missing.is_empty() {
        let (rs, read_at) = source.read()?;
        let addrs: Vec<IpAddr> = locals
            .iter()
            .map(|n| n.addr)
            .filter(|a| families.contains(&Family::of(*a)))
            .collect();
        if read_at != kept.generation {
            kept.ports.clear();
            kept.generation = read_at;
        }
        for (protocol, port) in missing {
            let found = forwards_of(&rs, protocol, port, &addrs)
                .into_iter()
                .filter(|f| families.contains(&Family::of(f.to)) || f.to.is_loopback())
                .map(|f| NftFound {
                    protocol,
                    port,
                    owner: f.owner.name().to_string(),
                    place: crate::analysis::nftables::place_text(&f.place),
                    to: f.to,
                    to_port: f.to_port,
                    certain: f.certain,
                })
                .collect();
            kept.ports.insert(key(protocol, port), found);
        }
        store(cache, &kept);
    }
    Ok(wanted
        .iter()
        .flat_map(|(pr, p)| kept.ports.get(&key(*pr, *p)).cloned().unwrap_or_default())
        .filter(|f| {
            mappings.iter().any(|m| {
                m.protocol == f.protocol
                    && (m.host_ports.start..=m.host_ports.end).contains(&f.port)
                    && m.family().is_none_or(|fam| families.contains(&fam))
            })
        })
        .collect())
}

fn load(path: &Path) -> NftCache {
    crate::kernel::safefile::read(
        path,
        crate::kernel::safefile::Links::Refuse,
        crate::kernel::safefile::Cap::State,
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<NftCache>(&b).ok())
    .filter(|c| c.schema == SCHEMA)
    .unwrap_or_default()
}

/// Written as the iptables-nft cache is (temp file and rename, failures ignored: it is only
/// ever a cache).
fn store(path: &Path, cache: &NftCache) {
    let Ok(json) = serde_json::to_vec(cache) else {
        return;
    };
    let tmp = path.with_extension("json.tmp");
    let written = crate::kernel::safefile::create_new(&tmp, 0o600)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &json));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The live native ruleset of the calling thread's network namespace, over one nf_tables
/// session (`kernel::nftables::ruleset::read`).
pub struct LiveNft<'s, 'k> {
    pub session: &'s mut crate::kernel::nftables::Session<'k>,
}

impl NftSource for LiveNft<'_, '_> {
    type Error = crate::kernel::nftables::NftError;

    fn generation(&mut self) -> Result<u32, Self::Error> {
        self.session.generation()
    }

    fn read(&mut self) -> Result<(crate::model::ruleset::Ruleset, u32), Self::Error> {
        // Other owners' tables only: iptables-nft's are walked by the iptables check,
        // natledger's own are not another owner's.
        crate::kernel::nftables::ruleset::read_tables(
            self.session,
            &|family, name| {
                let probe = NftTable {
                    family,
                    name: name.to_string(),
                    handle: None,
                    comment: None,
                    chains: Vec::new(),
                    sets: Vec::new(),
                };
                !is_xtables(&probe) && Owner::of(&probe) != Owner::Natledger
            },
            MAX_SETS,
        )
    }
}

/// [`find_nft`] on this host: the calling thread's network namespace over `nf`'s
/// nf_tables session, to this host's addresses and the mappings' own host addresses.
pub fn find_nft_live(
    nf: &crate::backend::Netfilter,
    cache: &Path,
    mappings: &[PortMapping],
    families: &[Family],
) -> Result<Vec<NftFound>, crate::kernel::nftables::NftError> {
    let mut locals: Vec<IpNet> = Vec::new();
    for family in families.iter().copied() {
        let wanted: Vec<&PortMapping> = mappings
            .iter()
            .filter(|m| m.family().is_none_or(|f| f == family))
            .collect();
        if !wanted.is_empty() {
            locals.extend(super::destinations(family, &wanted));
        }
    }
    nf.with_nft(|session| find_nft(&mut LiveNft { session }, cache, mappings, families, &locals))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ruleset::*;

    /// A source that counts its reads and moves its generation when told.
    struct Counting {
        rs: Ruleset,
        generation: u32,
        reads: u32,
    }

    impl NftSource for Counting {
        type Error = std::convert::Infallible;
        fn generation(&mut self) -> Result<u32, Self::Error> {
            Ok(self.generation)
        }
        fn read(&mut self) -> Result<(Ruleset, u32), Self::Error> {
            self.reads += 1;
            Ok((self.rs.clone(), self.generation))
        }
    }

    fn netavark_8080() -> Ruleset {
        let m = |key, v| {
            Stmt::Match(Match {
                key: vec![key],
                op: Op::Eq,
                right: Operand::Values(vec![v]),
            })
        };
        Ruleset {
            tables: vec![NftTable {
                family: TableFamily::Inet,
                name: "netavark".into(),
                handle: None,
                comment: None,
                sets: Vec::new(),
                chains: vec![Chain {
                    name: "PREROUTING".into(),
                    handle: None,
                    base: Some(Base {
                        kind: ChainKind::Nat,
                        hook: Hook::Prerouting,
                        priority: -100,
                        policy: Policy::Accept,
                    }),
                    rules: vec![Rule {
                        handle: Some(4),
                        comment: None,
                        stmts: vec![
                            m(Key::FibDaddrType, Value::Word("local".into())),
                            m(Key::Dport(Some(6)), Value::Int(8080)),
                            Stmt::Nat(Nat {
                                kind: NatKind::Dnat,
                                v4: Some(true),
                                addr: Some(NatAddr::Fixed(Value::Addr(
                                    "10.88.0.2".parse().unwrap(),
                                ))),
                                port: Some(NatPort::Fixed(80)),
                            }),
                        ],
                    }],
                }],
            }],
        }
    }

    #[test]
    fn forwards_are_read_once_per_generation_and_port() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join(NFT_CACHE_FILE);
        let mut source = Counting {
            rs: netavark_8080(),
            generation: 7,
            reads: 0,
        };
        let locals: Vec<IpNet> = vec!["192.168.0.2/32".parse().unwrap()];
        let mapping =
            |port: &str| crate::model::portspec::parse_entry(&format!("{port}:80")).unwrap();
        let v4 = [Family::Ipv4];
        let found = find_nft(&mut source, &cache, &[mapping("8080")], &v4, &locals).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].owner, "netavark");
        assert_eq!(
            found[0].place,
            "rule handle 4 in inet netavark chain PREROUTING"
        );
        assert!(found[0].certain);
        assert_eq!(source.reads, 1);
        // Same generation, same port: from the cache.
        find_nft(&mut source, &cache, &[mapping("8080")], &v4, &locals).unwrap();
        assert_eq!(source.reads, 1);
        // A port not examined yet: read again; another generation: read again.
        assert!(
            find_nft(&mut source, &cache, &[mapping("8081")], &v4, &locals)
                .unwrap()
                .is_empty()
        );
        assert_eq!(source.reads, 2);
        source.generation = 8;
        find_nft(&mut source, &cache, &[mapping("8080")], &v4, &locals).unwrap();
        assert_eq!(source.reads, 3);
    }
}
