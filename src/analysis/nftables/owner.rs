//! Whose a native table is, by its family, name and comment, and how an owner that writes
//! its rules back is fixed for good.

use crate::model::ruleset::{NftTable, TableFamily};

/// The writer of a native table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// `ip kube-proxy` / `ip6 kube-proxy` (comment "rules for kube-proxy").
    KubeProxy,
    /// `inet netavark` (podman's nftables driver).
    Netavark,
    /// `inet firewalld`.
    Firewalld,
    /// Docker 29's nftables firewall: `ip docker-bridges` / `ip6 docker-bridges`.
    Docker,
    /// CNI portmap's nftables backend: `ip cni_hostport` / `ip6 cni_hostport`.
    Portmap,
    /// natledger's own `ip natledger` / `ip6 natledger`.
    Natledger,
    Unknown,
}

/// Whether `table` is iptables-nft's (`ip`/`ip6` `filter`, `nat`, `mangle`, `raw`,
/// `security`): walked for a packet's fate like any other, but its rules are the iptables
/// side's to report (doctor's iptables checks, create's iptables walk).
pub fn is_xtables(table: &NftTable) -> bool {
    matches!(table.family, TableFamily::Ip | TableFamily::Ip6)
        && matches!(
            table.name.as_str(),
            "filter" | "nat" | "mangle" | "raw" | "security"
        )
}

impl Owner {
    /// The owner of `table`, by its name (and comment, for a renamed kube-proxy table).
    pub fn of(table: &NftTable) -> Owner {
        let v = matches!(table.family, TableFamily::Ip | TableFamily::Ip6);
        let inet = table.family == TableFamily::Inet;
        match table.name.as_str() {
            "kube-proxy" if v => Owner::KubeProxy,
            "netavark" if inet => Owner::Netavark,
            "firewalld" if inet => Owner::Firewalld,
            "docker-bridges" if v => Owner::Docker,
            "cni_hostport" if v => Owner::Portmap,
            "natledger" if v => Owner::Natledger,
            _ if table
                .comment
                .as_deref()
                .is_some_and(|c| c.contains("kube-proxy")) =>
            {
                Owner::KubeProxy
            }
            _ => Owner::Unknown,
        }
    }

    /// The owner in words.
    pub fn name(self) -> &'static str {
        match self {
            Owner::KubeProxy => "kube-proxy",
            Owner::Netavark => "netavark",
            Owner::Firewalld => "firewalld",
            Owner::Docker => "Docker",
            Owner::Portmap => "CNI portmap",
            Owner::Natledger => "natledger",
            Owner::Unknown => "unknown",
        }
    }

    /// What to change so the fix stays: an owner that writes its rules back undoes an nft
    /// delete at its next sync. `port`/`proto` name the host port concerned.
    pub fn lasting_fix(self, proto: &str, port: u16) -> Option<String> {
        Some(match self {
            Owner::KubeProxy => format!(
                "kube-proxy writes its tables back: change the Service of NodePort {port}/{proto} \
                 (give it ready endpoints, or delete it) instead"
            ),
            Owner::Netavark => format!(
                "netavark writes its rules back: stop or re-create the podman container \
                 publishing {port}/{proto} (`podman ps -a`), and `podman network reload --all`"
            ),
            Owner::Firewalld => format!(
                "firewalld writes its tables back at every reload: `firewall-cmd --permanent \
                 --remove-forward-port=port={port}:proto={proto}:toport=...:toaddr=...` (as \
                 `firewall-cmd --list-forward-ports` shows it) then `firewall-cmd --reload`"
            ),
            Owner::Docker => format!(
                "Docker writes its rules back when it restarts: remove the container publishing \
                 {port}/{proto} (`docker ps -a`)"
            ),
            Owner::Natledger => "run `natledger sweep --repair`".to_string(),
            Owner::Portmap | Owner::Unknown => return None,
        })
    }
}
