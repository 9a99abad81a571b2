//! The iptables-nft driver's process-less deletion ([`super::IptablesNft`]): natledger's
//! tagged rules deleted over netlink, by handle, in one transaction, on the [`Netfilter`]'s
//! socket: poststop's and sweep's direct path ([`crate::kernel::nftables::handles`] says why it
//! is linear and why a stale read deletes nothing).

use std::collections::HashMap;
use std::time::Instant;

use super::{Direct, Netfilter};
use crate::kernel::nftables::NftError;
use crate::kernel::nftables::handles::{Victims, is_stale};
use crate::model::family::Family;

/// How many times the chains are read again after someone else committed between the read
/// and the deletion.
const ATTEMPTS: usize = 5;

/// How many rules of each tag a chain is expected to hold.
type TagCounts<'a> = HashMap<&'a str, usize>;

/// Rules to delete: every rule of `chain` in `table` whose comment is `tag`, expected to be
/// exactly `count` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tagged<'a> {
    pub table: &'a str,
    pub chain: &'a str,
    pub tag: &'a str,
    pub count: usize,
}

/// Delete, over netlink, every rule tagged `tag` in the iptables-nft chains named in
/// `expected` as (table, chain, count), provided each chain holds exactly the expected
/// number of them; all in one transaction, whatever the tables. Otherwise nothing is
/// changed, and the caller uses iptables-nft-restore, which reads and compares rules
/// whole.
pub(super) fn delete_tagged_nft(
    nf: &Netfilter,
    family: Family,
    tag: &str,
    expected: &[(&str, &str, usize)],
) -> Result<Direct, NftError> {
    let tagged: Vec<Tagged> = expected
        .iter()
        .map(|&(table, chain, count)| Tagged {
            table,
            chain,
            tag,
            count,
        })
        .collect();
    delete_all_tagged_nft(nf, family, &tagged)
}

/// Delete, over netlink and in one transaction, every rule of the named iptables-nft
/// chains whose comment is one of the tags of `expected`, provided each chain holds
/// exactly the expected number of rules of each tag (else [`Direct::Declined`], nothing
/// changed). The chains are read once at one nf_tables generation, and the batch is
/// valid only at it: when someone committed in between, they are read again (up to
/// [`ATTEMPTS`] times, then declined).
pub(super) fn delete_all_tagged_nft(
    nf: &Netfilter,
    family: Family,
    expected: &[Tagged],
) -> Result<Direct, NftError> {
    if !nf.direct() {
        return Ok(Direct::Off);
    }
    let start = Instant::now();
    // Per chain, the count expected of each tag.
    let mut chains: Vec<((&str, &str), TagCounts)> = Vec::new();
    let mut at: HashMap<(&str, &str), usize> = HashMap::new();
    for t in expected {
        let i = *at.entry((t.table, t.chain)).or_insert_with(|| {
            chains.push(((t.table, t.chain), HashMap::new()));
            chains.len() - 1
        });
        *chains[i].1.entry(t.tag).or_default() += t.count;
    }
    let outcome = nf.with_nft(|session| {
        for _ in 0..ATTEMPTS {
            let generation = session.generation()?;
            let mut victims = Vec::with_capacity(chains.len());
            for ((table, chain), tags) in &chains {
                let read = session.rules(family, table, chain)?;
                let mut found: HashMap<&str, usize> = HashMap::new();
                let picked = Victims::pick(table, chain, &read, |r| {
                    let Some((tag, _)) = r.comment.as_deref().and_then(|c| tags.get_key_value(c))
                    else {
                        return false;
                    };
                    *found.entry(tag).or_default() += 1;
                    true
                });
                if let Some((tag, want)) = tags
                    .iter()
                    .find(|(tag, want)| found.get(*tag).copied().unwrap_or(0) != **want)
                {
                    log::debug!(
                        "netlink: {family} {table} {chain} holds {} rule(s) tagged {tag}, \
                             the manifest {want}; using iptables-nft-restore",
                        found.get(tag).copied().unwrap_or(0)
                    );
                    return Ok(None);
                }
                victims.push(picked);
            }
            nf.nft_deleted.set(true);
            match session.delete_at(family, generation, &victims) {
                Err(e) if is_stale(&e) => continue,
                result => return result.map(|n| Some((n, victims.iter().any(|v| v.whole)))),
            }
        }
        Ok(None)
    })?;
    let Some((deleted, flushed)) = outcome else {
        return Ok(Direct::Declined);
    };
    nf.nft_commits.set(nf.nft_commits.get() + 1);
    if log::log_enabled!(log::Level::Debug) {
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let how = if flushed {
            " (whole chains flushed)"
        } else {
            ""
        };
        let mut tags: Vec<&str> = expected.iter().map(|t| t.tag).collect();
        tags.sort_unstable();
        tags.dedup();
        let whose = match tags.as_slice() {
            [tag] => tag.to_string(),
            _ => format!("for {} containers", tags.len()),
        };
        log::debug!(
            "netlink: deleted {deleted} {family} rule(s) tagged {whose}{how} in {ms:.1} ms"
        );
    }
    Ok(Direct::Done(deleted))
}
