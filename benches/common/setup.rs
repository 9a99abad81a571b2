//! Where a bench case runs: natledger's backend, the iptables backend the peers (CNI portmap,
//! netavark) use through `PATH`, and where the foreign rules go. Its label is the `backend`
//! column of the tables and of `results.csv`.

use super::{load_foreign, nat_dump, nft};

pub struct Setup {
    /// The name in tables and in the CSV's `backend` column.
    pub label: &'static str,
    /// natledger's `--backend`.
    pub backend: &'static str,
    /// The iptables backend of the peers (an nftables host's `iptables` is iptables-nft:
    /// portmap 1.1 and netavark 1.4 have no nftables driver), and of iptables foreign rules.
    pub iptables: &'static str,
    /// The foreign rules go to a native nftables table of another owner (`table ip foreign`,
    /// see [`nft::foreign_table`]) rather than to `iptables`' nat table.
    pub native_foreign: bool,
    /// The foreign-rule counts at which the peers are measured too.
    pub loads: &'static [usize],
}

/// Every setup the benches know, in the order they print.
pub const SETUPS: [Setup; 4] = [
    Setup {
        label: "legacy",
        backend: "legacy",
        iptables: "legacy",
        native_foreign: false,
        loads: &[0, 10_000],
    },
    Setup {
        label: "nft",
        backend: "nft",
        iptables: "nft",
        native_foreign: false,
        loads: &[0, 10_000],
    },
    // natledger's own nf_tables tables; other owners' rules in a native nftables table.
    Setup {
        label: "nftables",
        backend: "nftables",
        iptables: "nft",
        native_foreign: true,
        loads: &[0, 50_000],
    },
    // natledger's own tables, other owners' rules in iptables-nft's `ip nat` (kube-proxy in
    // iptables mode): natledger's create still reads other owners' iptables forwards.
    Setup {
        label: "nftables-iptnft",
        backend: "nftables",
        iptables: "nft",
        native_foreign: false,
        loads: &[10_000],
    },
];

/// The setups to run: those named in BENCH_SETUPS (comma-separated labels), else all.
pub fn selected() -> Vec<&'static Setup> {
    match std::env::var("BENCH_SETUPS") {
        Ok(list) => list.split(',').map(|l| Setup::named(l.trim())).collect(),
        Err(_) => SETUPS.iter().collect(),
    }
}

impl Setup {
    pub fn named(label: &str) -> &'static Setup {
        SETUPS
            .iter()
            .find(|s| s.label == label)
            .unwrap_or_else(|| panic!("no bench setup {label}"))
    }

    /// Load `n` foreign rules where this setup keeps them (none for 0).
    pub fn load_foreign(&self, n: usize) {
        if self.native_foreign {
            nft::load_foreign_table(n);
        } else {
            load_foreign(self.iptables, n);
        }
    }

    /// The nat rules of natledger and of the peers: `iptables-<iptables>-save -t nat`, and on
    /// the nftables backend natledger's own tables as `nft list` prints them.
    pub fn nat_dump(&self) -> String {
        let mut dump = nat_dump(self.iptables);
        if self.backend == "nftables" {
            dump += &nft::own_tables();
        }
        dump
    }

    /// Whether foreign rules make each operation slow enough to use fewer runs at 50,000.
    pub fn costly_foreign(&self) -> bool {
        !self.native_foreign
    }
}
