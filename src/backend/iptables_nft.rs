//! iptables-nft (the `ip nat`/`ip filter` nf_tables tables iptables-nft writes): read with
//! `*-nft-save`, written with `*-nft-restore`; a container's tagged rules deleted over
//! netlink without a process where the chains hold exactly what is expected
//! ([`crate::kernel::nftables`]).

use crate::causes::Causes;
use crate::kernel::nftables::NftError;
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{owned_chains, tag};
use crate::model::oci::ContainerId;
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::driver::Primitives;
use super::iptables::Tools;
use super::nft_direct::{delete_all_tagged_nft, delete_tagged_nft};
use super::{Backend, Direct, DirectError, Driver, Netfilter, Tagged};

/// `ip[6]tables-nft-save` and `-restore`.
static TOOLS: Tools = Tools {
    word: "nft",
    restore_args: &[],
    tables_in_procfs: false,
    nf_tables: true,
};

/// The iptables-nft driver.
pub struct IptablesNft;

impl Driver for IptablesNft {
    fn backend(&self) -> Backend {
        Backend::IptablesNft
    }

    fn capabilities(&self) -> Capabilities {
        TOOLS.capabilities()
    }
}

impl Primitives for IptablesNft {
    fn tools(&self) -> Option<&'static Tools> {
        Some(&TOOLS)
    }

    /// Every rule of the recorded chains tagged for `id`, when they are as many as recorded,
    /// in one transaction across tables.
    fn delete_recorded(
        &self,
        nf: &Netfilter,
        family: Family,
        id: &ContainerId,
        recorded: &[&RuleRecord],
    ) -> Result<Direct, DirectError> {
        let mut expected: Vec<(&str, &str, usize)> = Vec::new();
        for r in recorded {
            match expected
                .iter_mut()
                .find(|(t, c, _)| *t == r.table_name() && *c == r.chain)
            {
                Some((_, _, n)) => *n += 1,
                None => expected.push((r.table_name(), r.chain.as_str(), 1)),
            }
        }
        Ok(delete_tagged_nft(nf, family, &tag(id), &expected)?)
    }

    /// Over netlink: the rules of natledger's chains of this version (`layout::owned_chains`),
    /// each chain dumped alone (the kernel filters; an absent table or chain is empty).
    fn holds_tagged(
        &self,
        nf: &Netfilter,
        family: Family,
        table: Table,
        tag: &str,
    ) -> Option<bool> {
        if !nf.direct() {
            return None;
        }
        let chains = owned_chains(self.capabilities(), table.as_str(), family);
        let found = nf.with_nft(|session| {
            for chain in chains {
                let rules = session.rules(family, table.as_str(), chain)?;
                if rules.iter().any(|r| r.comment.as_deref() == Some(tag)) {
                    return Ok(true);
                }
            }
            Ok(false)
        });
        found
            .map_err(|e| log::debug!("{}; reading the table instead", Causes(&e)))
            .ok()
    }

    /// A sweep's plan of containers' rules only goes over netlink when the chains hold
    /// exactly the tagged rules it read (linear in the table, where `iptables-nft-restore`'s
    /// `-D` compares each rule with the chain's rules: 5,000 manifests, a third dead, a
    /// minute); anything else through the restore.
    fn delete_tagged(&self, nf: &Netfilter, family: Family, expected: &[Tagged]) -> bool {
        match delete_all_tagged_nft(nf, family, expected) {
            Ok(Direct::Done(_)) => true,
            Ok(Direct::Off | Direct::Declined) => false,
            // Nothing was changed; the restore says what is really wrong.
            Err(e) => {
                log::info!("{}; using {}-nft-restore", Causes(&e), family.tool_stem());
                false
            }
        }
    }

    fn drop_emptied_table(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
    ) -> Result<(), NftError> {
        nf.with_nft(|s| s.drop_if_leftover(family, table)).map(drop)
    }
}
