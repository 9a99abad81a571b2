//! Other owners' native nftables forwards of a host port, read live: `analysis::forwards::
//! find_nft` over `LiveNft` (nft-netlink's reader of the whole ruleset), in a network
//! namespace the test creates and deletes, with netavark's and kube-proxy's rulesets loaded
//! by `nft -f` (tests/fixtures/nftables-dumps). Found: netavark's stale DNAT of 8080 (first,
//! it takes every connection: the live one behind it is not met) and kube-proxy's NodePort
//! 30081's two endpoints, each with its table, chain and handle; a port nobody forwards is
//! clean; an iptables-nft nat
//! table's DNAT is left to the iptables walk; and a second look at the same ports and
//! generation reads nothing, while one after another commit reads again.

use natledger::analysis::forwards::{LiveNft, NftFound, find_nft};
use natledger::analysis::nftables::NftSource;
use natledger::kernel::named_netns::NamedNetns;
use natledger::kernel::netlink::Socket;
use natledger::kernel::nftables::{NftError, Session};
use natledger::model::family::Family;
use natledger::model::portspec::parse_entry;
use natledger::model::rule::IpNet;
use natledger::model::ruleset::Ruleset;

use crate::common::{in_netns, load_nft};

const NETAVARK: &str = include_str!("../fixtures/nftables-dumps/netavark.nft");
const KUBE_PROXY: &str = include_str!("../fixtures/nftables-dumps/kube-proxy.nft");

/// The live source, counting its whole reads.
struct Counted<'s, 'k> {
    live: LiveNft<'s, 'k>,
    reads: u32,
}

impl NftSource for Counted<'_, '_> {
    type Error = NftError;
    fn generation(&mut self) -> Result<u32, NftError> {
        self.live.generation()
    }
    fn read(&mut self) -> Result<(Ruleset, u32), NftError> {
        self.reads += 1;
        self.live.read()
    }
}

/// Forwards of `ports` (`8080:80` style) and how many whole reads it took.
fn look(ns: &str, cache: &std::path::Path, ports: &str) -> (Vec<NftFound>, u32) {
    let mappings: Vec<_> = ports.split(',').map(|p| parse_entry(p).unwrap()).collect();
    let locals: Vec<IpNet> = vec!["192.168.0.2/32".parse().unwrap()];
    in_netns(ns, || {
        let mut sock = Socket::netfilter().unwrap();
        let mut session = Session::new(&mut sock);
        let mut source = Counted {
            live: LiveNft {
                session: &mut session,
            },
            reads: 0,
        };
        let found = find_nft(&mut source, cache, &mappings, &[Family::Ipv4], &locals).unwrap();
        (found, source.reads)
    })
}

#[test]
fn other_owners_native_forwards_are_found_live_and_kept_per_generation() {
    let ns = NamedNetns::create(format!("nft-fate-{}", std::process::id())).unwrap();
    load_nft(ns.name(), NETAVARK);
    load_nft(ns.name(), KUBE_PROXY);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("native-forwards.json");

    let (mut found, reads) = look(ns.name(), &cache, "8080:80,30081:80,9999:80");
    found.sort_by_key(|f| (f.port, f.to));
    assert_eq!(reads, 1);
    let places: Vec<(&str, u16, String)> = found
        .iter()
        .map(|f| (f.owner.as_str(), f.port, f.to.to_string()))
        .collect();
    assert_eq!(
        places,
        [
            ("netavark", 8080, "10.88.0.92".to_string()),
            ("kube-proxy", 30081, "10.180.0.4".to_string()),
            ("kube-proxy", 30081, "10.180.0.5".to_string()),
        ],
        "{found:#?}"
    );
    assert!(
        found[0].place.starts_with("rule handle "),
        "{}",
        found[0].place
    );
    assert!(
        found[0]
            .place
            .contains("inet netavark chain nv_2f259bab_10_88_0_0_nm16_dnat")
    );
    // Every connection to 8080 meets the stale DNAT; kube-proxy's NodePort picks one of two
    // endpoints by numgen, neither certain.
    assert!(found[0].certain, "{found:#?}");
    assert!(found[1..].iter().all(|f| !f.certain), "{found:#?}");

    // The same ports at the same generation: nothing read.
    let (again, reads) = look(ns.name(), &cache, "8080:80");
    assert_eq!((again.len(), reads), (1, 0));
    // iptables-nft's nat table (a commit: a new generation) is the iptables walk's.
    load_nft(
        ns.name(),
        "table ip nat {\n chain PREROUTING {\n type nat hook prerouting priority dstnat; \
         policy accept;\n tcp dport 9999 dnat to 10.1.2.3:80\n }\n}\n",
    );
    let (after, reads) = look(ns.name(), &cache, "8080:80,9999:80");
    assert_eq!(reads, 1);
    assert!(after.iter().all(|f| f.port == 8080), "{after:#?}");
}
