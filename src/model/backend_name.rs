//! The backends by name: what a manifest records and the command line takes. What each one
//! does is its driver's, registered with its name in the backend module.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A backend's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Backend {
    /// iptables-legacy (`ip_tables`, written with `iptables-legacy-restore` or in-process).
    #[serde(rename = "legacy")]
    IptablesLegacy,
    /// iptables-nft (the `ip nat`/`ip filter` nf_tables tables iptables-nft writes).
    #[serde(rename = "nft")]
    IptablesNft,
    /// natledger's own nf_tables tables, written in-process (kernel::nftables::own).
    #[serde(rename = "nftables")]
    OwnNftables,
}

impl Backend {
    /// Every backend a container's rules may be in: sweep and poststop look in each.
    pub const ALL: [Backend; 3] = [
        Backend::IptablesLegacy,
        Backend::IptablesNft,
        Backend::OwnNftables,
    ];

    /// The name in tool names (`iptables-legacy`, `iptables-nft`) and on the command line.
    pub fn suffix(self) -> &'static str {
        match self {
            Backend::IptablesLegacy => "legacy",
            Backend::IptablesNft => "nft",
            Backend::OwnNftables => "nftables",
        }
    }

    /// The backend whose word ([`Backend::suffix`]) is `word`.
    pub fn named(word: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.suffix() == word)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_is_its_word_on_disk_and_on_the_command_line() {
        for backend in Backend::ALL {
            let json = serde_json::to_string(&backend).unwrap();
            assert_eq!(json, format!("\"{}\"", backend.suffix()));
            assert_eq!(Backend::named(&backend.to_string()), Some(backend));
        }
        assert_eq!(Backend::named("iptables"), None);
    }
}
