//! The tables natledger writes its rules into: typed, with their names only at the edges
//! (`-t nat`, the manifest's `"table"`, a dump's `*nat`).

use std::fmt;
use std::str::FromStr;

/// One of the tables natledger writes (in every backend: an iptables table, or the logical
/// table of natledger's own nf_tables table, `kernel::nftables::own`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// The DNAT and masquerade rules.
    Nat,
    /// The forward accept and the localhost guard.
    Filter,
}

impl Table {
    /// The tables in the order create-runtime writes them: the filter accept goes in first,
    /// so a DNAT is never in force while its forwarded packets are dropped. Removal goes in
    /// the reverse order.
    pub const ALL: [Table; 2] = [Table::Filter, Table::Nat];

    /// The name in `-t NAME`, in dumps and in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Filter => "filter",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A table name natledger does not write.
#[derive(Debug, thiserror::Error)]
#[error("natledger writes no table {0:?}")]
pub struct UnknownTable(pub String);

impl FromStr for Table {
    type Err = UnknownTable;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Table::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| UnknownTable(name.to_string()))
    }
}

impl PartialEq<str> for Table {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Table {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Table {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for table in Table::ALL {
            assert_eq!(table.as_str().parse::<Table>().unwrap(), table);
        }
        assert!("mangle".parse::<Table>().is_err());
    }
}
