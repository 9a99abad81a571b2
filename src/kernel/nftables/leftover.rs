//! The iptables-nft tables natledger's writes made iptables-nft create, and what `sweep --all`
//! may take back.
//!
//! iptables-nft-restore creates `ip filter` / `ip nat` (and `ip6`) with the built-in chains a
//! batch names (FORWARD and INPUT; PREROUTING, OUTPUT and POSTROUTING) the first time natledger
//! writes there, and removing natledger's chains and jumps leaves them, empty. An empty base
//! chain whose policy is accept decides nothing about any packet, so a table holding nothing
//! else can go, as if natledger had never written there. Nothing another owner may have is
//! touched: a table with any chain that is not one of iptables' built-in chains of that table,
//! any rule, a policy other than accept, a set, an object or a flowtable (`NFTA_TABLE_USE`
//! counts them all) stays. The deletion is one transaction valid only at the nf_tables
//! generation the table was read at: if anyone committed anything since, the kernel refuses it
//! whole and the table stays.

use std::io;

use super::wire::{NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFT_MSG_DELTABLE, NFT_MSG_GETTABLE};
use super::wire::{NFTA_TABLE_NAME, NFTA_TABLE_USE};
use super::{NftError, Session, batch_marker, genmsg, subsys};
use crate::kernel::netlink::{self, NLM_F_ACK, NLM_F_REQUEST};
use crate::model::family::Family;

/// iptables' built-in chains of the tables natledger writes.
pub fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        _ => &[],
    }
}

/// What became of one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftover {
    /// There is no such table.
    Absent,
    /// Nothing but empty accepting built-in chains: deleted.
    Deleted,
    /// Someone else's things are in it (or it changed meanwhile): kept.
    Kept,
}

/// Whether a table of `objects` objects (`NFTA_TABLE_USE`) whose chains are `chains` (name,
/// base chain, policy, rule count) holds nothing but iptables' empty, accepting built-in
/// chains of `table`.
pub fn only_empty_builtins(
    table: &str,
    objects: u32,
    chains: &[(&str, bool, Option<&str>, usize)],
) -> bool {
    objects as usize == chains.len()
        && chains.iter().all(|(name, base, policy, rules)| {
            builtin_chains(table).contains(name)
                && *base
                && *policy == Some("ACCEPT")
                && *rules == 0
        })
}

impl Session<'_> {
    /// Delete the iptables-nft `table` of `family` when it holds nothing but empty, accepting
    /// built-in chains (see the module comment); otherwise leave it.
    pub fn drop_if_leftover(&mut self, family: Family, table: &str) -> Result<Leftover, NftError> {
        let generation = self.generation()?;
        let Some(objects) = self.table_use(family, table)? else {
            return Ok(Leftover::Absent);
        };
        let chains = self.chains(family, table)?;
        let mut seen = Vec::with_capacity(chains.len());
        for chain in &chains {
            let rules = self.rules(family, table, &chain.name)?.len();
            seen.push((
                chain.name.as_str(),
                chain.hook.is_some(),
                chain.policy.as_deref(),
                rules,
            ));
        }
        if !only_empty_builtins(table, objects, &seen) {
            return Ok(Leftover::Kept);
        }
        match self.delete_table(family, table, generation) {
            Ok(()) => Ok(Leftover::Deleted),
            // Someone committed since the read: what they did is theirs to keep.
            Err(e) if e.raw_os_error() == Some(libc::ERESTART) => Ok(Leftover::Kept),
            Err(source) => Err(NftError::DropTable {
                family,
                table: table.to_string(),
                source,
            }),
        }
    }

    /// The table's object count (`NFTA_TABLE_USE`), or `None` when it does not exist.
    fn table_use(&mut self, family: Family, table: &str) -> Result<Option<u32>, NftError> {
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(40);
        let start = netlink::begin(&mut request, subsys(NFT_MSG_GETTABLE), NLM_F_REQUEST, seq);
        genmsg(&mut request, family.af(), 0);
        netlink::put_str(&mut request, NFTA_TABLE_NAME, table);
        netlink::finish(&mut request, start);
        let mut objects = None;
        let answer = self.sock.answer(seq, &request, |message| {
            let body = message.payload.get(4..).unwrap_or_default();
            objects = netlink::attr(body, NFTA_TABLE_USE)
                .and_then(|d| Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?)));
            Ok(())
        });
        match answer {
            Ok(()) => objects
                .map(Some)
                .ok_or_else(|| io::Error::other("no use count in the answer")),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
        .map_err(|source| NftError::Read {
            family,
            what: format!("the table {table}"),
            source,
        })
    }

    /// One transaction, valid only at `generation`: DELTABLE `table`.
    fn delete_table(&mut self, family: Family, table: &str, generation: u32) -> io::Result<()> {
        let first = self.sock.reserve(3);
        let mut m = Vec::with_capacity(128);
        let marker =
            |m: &mut Vec<u8>, kind: u16, seq: u32| batch_marker(m, kind, seq, Some(generation));
        marker(&mut m, NFNL_MSG_BATCH_BEGIN, first);
        let start = netlink::begin(
            &mut m,
            subsys(NFT_MSG_DELTABLE),
            NLM_F_REQUEST | NLM_F_ACK,
            first + 1,
        );
        genmsg(&mut m, family.af(), 0);
        netlink::put_str(&mut m, NFTA_TABLE_NAME, table);
        netlink::finish(&mut m, start);
        marker(&mut m, NFNL_MSG_BATCH_END, first + 2);
        self.sock.send(&m)?;
        self.sock.acks(first..=first + 2, 1, |_, code| match code {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_table_of_empty_accepting_builtin_chains_is_a_leftover() {
        let left = [
            ("FORWARD", true, Some("ACCEPT"), 0),
            ("INPUT", true, Some("ACCEPT"), 0),
        ];
        assert!(only_empty_builtins("filter", 2, &left));
        assert!(only_empty_builtins("nat", 0, &[]));
        // A set, an object or a flowtable (the use count says so).
        assert!(!only_empty_builtins("filter", 3, &left));
        // A rule, a drop policy, a chain of another owner, a built-in of another table, a
        // regular chain named like a built-in.
        for odd in [
            ("INPUT", true, Some("ACCEPT"), 1),
            ("INPUT", true, Some("DROP"), 0),
            ("DOCKER", false, None, 0),
            ("PREROUTING", true, Some("ACCEPT"), 0),
            ("OUTPUT", false, None, 0),
        ] {
            let chains = [left[0], odd];
            assert!(!only_empty_builtins("filter", 2, &chains), "{odd:?}");
        }
        assert!(!only_empty_builtins("mangle", 1, &[left[1]]));
    }
}
