//! The nftables side of the benches: a native table of another owner holding foreign rules,
//! natledger's own tables as `nft` prints them, and the floor on the nftables backend (the
//! same rules added by one bare `nft -f`, deleted by handle by another).

use std::process::Command;
use std::time::Duration;

use super::{foreign_service, run, run_cmd};

const NFT: &str = "/usr/sbin/nft";

/// `n` DNAT rules of another owner in a native nftables table, as kube-proxy's nftables mode
/// or netavark's nftables driver keep theirs: `table ip foreign`, a regular chain `services`
/// reached from a nat prerouting base chain at priority dstnat.
pub fn foreign_table(n: usize) -> String {
    let mut s = String::from(
        "table ip foreign {\n\
         \tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n\
         \tchain services {\n",
    );
    for i in 0..n {
        let (addr, port) = foreign_service(i);
        s += &format!(
            "\t\tip daddr {addr} tcp dport {port} dnat to 10.200.0.1:80 comment \"svc{i}\"\n"
        );
    }
    s + "\t}\n}\n"
}

/// Load [`foreign_table`] with `nft -f` (nothing for 0).
pub fn load_foreign_table(n: usize) {
    if n > 0 {
        run(NFT, &["-f", "-"], Some(foreign_table(n).as_bytes()));
    }
}

/// natledger's tables (`ip natledger`, `ip6 natledger`) as `nft list` prints them; empty where
/// there are none.
pub fn own_tables() -> String {
    let mut dump = String::new();
    for family in ["ip", "ip6"] {
        let out = Command::new(NFT)
            .args(["list", "table", family, "natledger"])
            .output()
            .unwrap();
        dump += &String::from_utf8_lossy(&out.stdout);
    }
    dump
}

/// One counted rule of natledger's table: its family, chain, text (as `nft list` prints it,
/// without the handle) and handle.
struct Listed {
    family: &'static str,
    chain: String,
    text: String,
    handle: String,
}

/// The rules of natledger's tables whose comment is exactly `comment`.
fn tagged(comment: &str) -> Vec<Listed> {
    let needle = format!("comment \"{comment}\"");
    let mut rules = Vec::new();
    for family in ["ip", "ip6"] {
        let out = Command::new(NFT)
            .args(["-a", "list", "table", family, "natledger"])
            .output()
            .unwrap();
        let mut chain = String::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix("chain ") {
                chain = name.split_whitespace().next().unwrap().to_string();
            } else if let Some((text, handle)) = line.split_once(" # handle ")
                && text.ends_with(&needle)
            {
                rules.push(Listed {
                    family,
                    chain: chain.clone(),
                    text: text.to_string(),
                    handle: handle.to_string(),
                });
            }
        }
    }
    rules
}

/// The floor on the nftables backend: natledger's rules for container `id` (as it wrote
/// them: read from its table once) added by one `nft -f` (`insert` in NATLEDGER-HOSTPORTS,
/// newest first, `add` elsewhere), and deleted by handle by one more.
pub struct NftFloor {
    add: String,
    comment: String,
}

impl NftFloor {
    /// Call while natledger's rules for `id` are in place.
    pub fn new(id: &str) -> NftFloor {
        let comment = format!("natledger:{id}");
        let mut add = String::new();
        for r in tagged(&comment) {
            let verb = if r.chain == "NATLEDGER-HOSTPORTS" {
                "insert"
            } else {
                "add"
            };
            add += &format!(
                "{verb} rule {} natledger {} {}\n",
                r.family, r.chain, r.text
            );
        }
        assert!(!add.is_empty(), "no rules tagged {comment} to copy");
        NftFloor { add, comment }
    }

    pub fn add(&self) -> Duration {
        timed_nft(&self.add)
    }

    /// Deletes what [`NftFloor::add`] added; the handles are looked up first, untimed.
    pub fn remove(&self) -> Duration {
        let mut del = String::new();
        for r in tagged(&self.comment) {
            del += &format!(
                "delete rule {} natledger {} handle {}\n",
                r.family, r.chain, r.handle
            );
        }
        timed_nft(&del)
    }
}

fn timed_nft(batch: &str) -> Duration {
    let mut cmd = Command::new(NFT);
    cmd.args(["-f", "-"]);
    let start = std::time::Instant::now();
    run_cmd(cmd, batch.as_bytes());
    start.elapsed()
}

/// Two transactions of someone else that change nothing in the end (a table made, a table
/// deleted), with `nft`.
pub fn someone_else_writes() {
    for batch in [
        "add table ip bench-other\n",
        "delete table ip bench-other\n",
    ] {
        run(NFT, &["-f", "-"], Some(batch.as_bytes()));
    }
}
