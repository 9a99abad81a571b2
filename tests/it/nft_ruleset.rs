//! The nf_tables ruleset reader (`kernel::nftables::ruleset::read`) against the real kernel.

use natledger::kernel::named_netns::NamedNetns;
use natledger::kernel::netlink::Socket;
use natledger::kernel::nftables::{Session, ruleset};

use crate::common::{in_netns, load_nft};

#[test]
fn scratch() {
    let ns = NamedNetns::create(format!("nlt-{}-rs", std::process::id())).unwrap();
    load_nft(ns.name(), &std::fs::read_to_string("/tmp/kp.nft").unwrap());
    let (rs, generation) = in_netns(ns.name(), || {
        let mut sock = Socket::netfilter().unwrap();
        ruleset::read(&mut Session::new(&mut sock)).unwrap()
    });
    println!("{generation} {rs:#?}");
}
