//! Restore batches as one nf_tables transaction on natledger's table.
//!
//! natledger's operations speak in restore batches (`crate::model::save::Batch`: declare a
//! chain, check, insert, append, delete a rule by its arguments, flush, delete a chain). For
//! the `nftables` backend, [`Session::apply_own`](crate::kernel::nftables::Session::apply_own)
//! reads the table once, plays the operations against that picture in the order `iptables-restore` would (declarations first, then the rest), and
//! sends the messages they come to in one batch: a rule is deleted by the handle the read
//! gave it, a check that fails or a rule to delete that is not there fails the whole batch
//! before anything is sent, and the kernel commits everything or nothing. The table and its
//! base chains are created by the first batch that writes into them; a batch that leaves
//! the table with no rule, no chain of natledger's and nobody else's object in it deletes
//! the table too (`sweep --all` leaves `nft list ruleset` as it was before natledger).

use std::io;

use super::super::wire::{NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFT_MSG_DELCHAIN};
use super::super::wire::{NFT_MSG_DELRULE, NFT_MSG_DELTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE};
use super::super::wire::{NFT_MSG_NEWTABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_HANDLE};
use super::super::wire::{NFTA_RULE_POSITION, NFTA_RULE_USERDATA, NFTA_TABLE_NAME};
use super::super::{NftError, Session, batch_marker, genmsg, rule_message, subsys};
use super::picture::{Message, Place, plan};
use super::{OwnRead, TABLE, expr, put_base_chain};
use crate::kernel::netlink::{self, NLM_F_ACK, NLM_F_REQUEST};
use crate::model::family::Family;
use crate::model::rule::Rule;
use crate::model::save::Batch;

const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
/// How many times a batch is planned again after someone else committed in between.
const ATTEMPTS: usize = 5;

/// The plan of `batches` against `read`, valid at its generation.
fn plan_read(family: Family, read: OwnRead, batches: &[Batch]) -> Result<Planned, NftError> {
    Ok(Planned {
        family,
        generation: read.generation,
        messages: plan(family, read.table, batches)?,
    })
}

/// Encode the messages between BATCH_BEGIN (`first`) and BATCH_END; only the last asks for
/// an acknowledgement (see `Session::delete`).
///
/// BATCH_BEGIN carries the generation the plan was read at (`NFNL_BATCH_GENID`): the kernel
/// refuses the whole batch with ERESTART when anyone committed anything since, so handles,
/// chain deletions and the table deletion never act on a table that changed after the read.
fn encode(
    family: Family,
    first: u32,
    generation: u32,
    messages: &[Message],
) -> Result<Vec<u8>, NftError> {
    let mut m = Vec::with_capacity(256 * (messages.len() + 2));
    let marker =
        |m: &mut Vec<u8>, kind: u16, seq: u32| batch_marker(m, kind, seq, Some(generation));
    marker(&mut m, NFNL_MSG_BATCH_BEGIN, first);
    let mut seq = first;
    for (i, message) in messages.iter().enumerate() {
        seq += 1;
        let ack = if i + 1 == messages.len() {
            NLM_F_ACK
        } else {
            0
        };
        let start = put_message(&mut m, family, (seq, NLM_F_REQUEST | ack), message)?;
        netlink::finish(&mut m, start);
    }
    marker(&mut m, NFNL_MSG_BATCH_END, seq + 1);
    Ok(m)
}

/// One message of the batch (sequence number `seq`, netlink `flags`), unfinished: returns
/// where it starts, for `netlink::finish`.
fn put_message(
    m: &mut Vec<u8>,
    family: Family,
    (seq, flags): (u32, u16),
    message: &Message,
) -> Result<usize, NftError> {
    let header = |m: &mut Vec<u8>, kind: u16, flags: u16| {
        let start = netlink::begin(m, subsys(kind), flags, seq);
        genmsg(m, family.af(), 0);
        start
    };
    Ok(match message {
        Message::NewTable => {
            let start = header(m, NFT_MSG_NEWTABLE, flags | NLM_F_CREATE);
            netlink::put_str(m, NFTA_TABLE_NAME, TABLE);
            start
        }
        Message::DelTable => {
            let start = header(m, NFT_MSG_DELTABLE, flags);
            netlink::put_str(m, NFTA_TABLE_NAME, TABLE);
            start
        }
        Message::NewChain { name, base, policy } => {
            let start = header(m, NFT_MSG_NEWCHAIN, flags | NLM_F_CREATE);
            netlink::put_str(m, NFTA_CHAIN_TABLE, TABLE);
            netlink::put_str(m, NFTA_CHAIN_NAME, name);
            if let Some(base) = base {
                put_base_chain(m, base, *policy);
            }
            start
        }
        Message::DelChain { name } => {
            let start = header(m, NFT_MSG_DELCHAIN, flags);
            netlink::put_str(m, NFTA_CHAIN_TABLE, TABLE);
            netlink::put_str(m, NFTA_CHAIN_NAME, name);
            start
        }
        Message::NewRule { chain, rule, place } => {
            put_new_rule(m, family, (seq, flags), chain, rule, place)?
        }
        Message::DelRule { chain, handle } => {
            let start = rule_message(m, (NFT_MSG_DELRULE, flags, seq), family, TABLE, chain);
            netlink::put_attr(m, NFTA_RULE_HANDLE, &handle.to_be_bytes());
            start
        }
        Message::Flush { chain } => {
            rule_message(m, (NFT_MSG_DELRULE, flags, seq), family, TABLE, chain)
        }
    })
}

/// A NEWRULE: appended, first, or before a handle; its expressions and comment.
fn put_new_rule(
    m: &mut Vec<u8>,
    family: Family,
    (seq, flags): (u32, u16),
    chain: &str,
    rule: &Rule,
    place: &Place,
) -> Result<usize, NftError> {
    let flags = match place {
        Place::Bottom => flags | NLM_F_CREATE | NLM_F_APPEND,
        Place::Top | Place::Before(_) => flags | NLM_F_CREATE,
    };
    let start = rule_message(m, (NFT_MSG_NEWRULE, flags, seq), family, TABLE, chain);
    if let Place::Before(handle) = place {
        netlink::put_attr(m, NFTA_RULE_POSITION, &handle.to_be_bytes());
    }
    expr::encode(m, family, rule).map_err(|source| NftError::Encode {
        family,
        chain: chain.to_string(),
        rule: rule.to_args().join(" "),
        source,
    })?;
    if let Some(comment) = &rule.comment {
        netlink::put_attr(m, NFTA_RULE_USERDATA, &expr::comment_udata(comment));
    }
    Ok(start)
}

/// What one [`Session::apply_own`](crate::kernel::nftables::Session::apply_own) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Messages committed (0: nothing to do, nothing sent).
    pub messages: usize,
    /// Whether anything was deleted (rules, chains, the table): closing the socket then
    /// waits a grace period (`crate::kernel::nftables`).
    pub deleted: bool,
}

/// The messages of one transaction on natledger's table, planned from a read at one
/// nf_tables generation; [`Session::commit_own`] sends them.
#[derive(Debug)]
pub struct Planned {
    family: Family,
    generation: u32,
    messages: Vec<Message>,
}

impl Session<'_> {
    /// Apply `batches` to natledger's table of `family` in one nf_tables transaction, read
    /// and planned again when someone else committed between the read and the commit.
    pub fn apply_own(&mut self, family: Family, batches: &[Batch]) -> Result<Applied, NftError> {
        let mut attempt = 1;
        loop {
            let planned = self.plan_own(family, batches)?;
            match self.commit_own(&planned) {
                Err(NftError::Write { source, .. })
                    if source.raw_os_error() == Some(libc::ERESTART) && attempt < ATTEMPTS =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// Read natledger's table of `family` and plan `batches` against it; nothing is sent.
    pub fn plan_own(&mut self, family: Family, batches: &[Batch]) -> Result<Planned, NftError> {
        let read = self.own_read(family)?;
        plan_read(family, read, batches)
    }

    /// [`Session::apply_own`] planned first against `read`, the caller's own read (under the
    /// ledger lock it still holds): one read of the table per operation. When someone else
    /// committed since, it is read and planned again as `apply_own` does.
    pub fn apply_own_to(
        &mut self,
        family: Family,
        read: OwnRead,
        batches: &[Batch],
    ) -> Result<Applied, NftError> {
        let planned = plan_read(family, read, batches)?;
        match self.commit_own(&planned) {
            Err(NftError::Write { source, .. })
                if source.raw_os_error() == Some(libc::ERESTART) =>
            {
                self.apply_own(family, batches)
            }
            result => result,
        }
    }

    /// Send a plan as one transaction; the kernel refuses it whole (ERESTART) when the
    /// nf_tables generation moved on since the plan's read.
    pub fn commit_own(&mut self, planned: &Planned) -> Result<Applied, NftError> {
        let (family, messages) = (planned.family, &planned.messages);
        if messages.is_empty() {
            return Ok(Applied::default());
        }
        let deleted = messages.iter().any(|m| {
            matches!(
                m,
                Message::DelRule { .. }
                    | Message::Flush { .. }
                    | Message::DelChain { .. }
                    | Message::DelTable
            )
        });
        let err = |source: io::Error| NftError::Write {
            family,
            count: messages.len(),
            source,
        };
        let first = self.sock.reserve(messages.len() as u32 + 2);
        let bytes = encode(family, first, planned.generation, messages)?;
        self.sock.make_room_to_send(bytes.len()).map_err(err)?;
        self.sock.send(&bytes).map_err(err)?;
        let ours = first..=(first + messages.len() as u32 + 1);
        self.sock
            .acks(ours, 1, |_, code| match code {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            })
            .map_err(err)?;
        Ok(Applied {
            messages: messages.len(),
            deleted,
        })
    }
}

#[cfg(test)]
mod tests;
