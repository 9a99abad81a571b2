//! Deleting picked rules by handle in one transaction valid at one nf_tables generation.
//!
//! # Why linear
//! The kernel finds the rule a DELRULE names by walking its chain from the top
//! (`__nft_rule_lookup`), deleted rules of the same transaction included, so N deletions
//! by handle in a chain of N rules cost N²/2 steps (20,000 mappings: 13.7 s). A chain all
//! of whose rules go is therefore flushed instead (one DELRULE naming only the chain:
//! one walk); a chain keeping some rules still loses its victims by handle.
//!
//! # Why exact
//! Every batch carries the generation its read began at (`NFNL_BATCH_GENID`): when anyone
//! committed anything since (a rule added to a chain about to be flushed, a victim gone),
//! the kernel refuses the whole batch with ERESTART before looking at it, so a flush or a
//! handle never acts on a chain that changed after the read. The caller reads again.

use std::io;

use super::wire::{NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFT_MSG_DELRULE, NFTA_RULE_HANDLE};
use super::{NftError, NftRule, Session, batch_marker, rule_message};
use crate::kernel::netlink::{self, NLM_F_ACK, NLM_F_REQUEST};
use crate::model::family::Family;

/// The rules to delete from one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victims<'a> {
    pub table: &'a str,
    pub chain: &'a str,
    /// Their handles, as the read gave them.
    pub handles: Vec<u64>,
    /// The read showed no other rule in the chain: flush it (one message) instead.
    pub whole: bool,
}

impl<'a> Victims<'a> {
    /// The rules of `read` (one chain's dump) that `pick` selects; `whole` when that is every
    /// one of them.
    pub fn pick(
        table: &'a str,
        chain: &'a str,
        read: &[NftRule],
        mut pick: impl FnMut(&NftRule) -> bool,
    ) -> Victims<'a> {
        let handles: Vec<u64> = read.iter().filter(|r| pick(r)).map(|r| r.handle).collect();
        Victims {
            table,
            chain,
            whole: !handles.is_empty() && handles.len() == read.len(),
            handles,
        }
    }
}

/// Whether a failed [`Session::delete_at`] was refused only because the generation moved on
/// (read again and retry).
pub fn is_stale(error: &NftError) -> bool {
    matches!(error, NftError::Delete { source, .. } if source.raw_os_error() == Some(libc::ERESTART))
}

impl Session<'_> {
    /// Delete `victims` in one transaction, valid only at `generation` (read before the rules
    /// were): all or none. `Ok(n)`: n rules deleted. ERESTART ([`is_stale`]): someone
    /// committed since the read; nothing changed.
    pub fn delete_at(
        &mut self,
        family: Family,
        generation: u32,
        victims: &[Victims],
    ) -> Result<usize, NftError> {
        let count: usize = victims.iter().map(|v| v.handles.len()).sum();
        let messages: usize = victims
            .iter()
            .map(|v| if v.whole { 1 } else { v.handles.len() })
            .sum();
        if messages == 0 {
            return Ok(0);
        }
        let err = |source| NftError::Delete {
            family,
            count,
            source,
        };
        let first = self.sock.reserve(messages as u32 + 2);
        let batch = batch(first, family, generation, victims, messages);
        self.sock.make_room_to_send(batch.len()).map_err(err)?;
        self.sock.send(&batch).map_err(err)?;
        // One acknowledgement, for the last message (see `Session::delete`).
        let ours = first..=(first + messages as u32 + 1);
        self.sock
            .acks(ours, 1, |_, code| match code {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            })
            .map_err(err)?;
        Ok(count)
    }
}

/// BATCH_BEGIN (with the generation), a DELRULE per victim or one per whole chain
/// (sequence numbers `first + 1 ..`, only the last asking for an acknowledgement),
/// BATCH_END.
fn batch(
    first: u32,
    family: Family,
    generation: u32,
    victims: &[Victims],
    messages: usize,
) -> Vec<u8> {
    let mut m = Vec::with_capacity(64 * (messages + 2));
    let marker =
        |m: &mut Vec<u8>, kind: u16, seq: u32| batch_marker(m, kind, seq, Some(generation));
    marker(&mut m, NFNL_MSG_BATCH_BEGIN, first);
    let mut seq = first;
    let each = victims.iter().flat_map(|v| {
        let handles: Box<dyn Iterator<Item = Option<u64>>> = if v.whole {
            Box::new(std::iter::once(None))
        } else {
            Box::new(v.handles.iter().map(|h| Some(*h)))
        };
        handles.map(move |h| (v.table, v.chain, h))
    });
    for (table, chain, handle) in each {
        seq += 1;
        let ack = if (seq - first) as usize == messages {
            NLM_F_ACK
        } else {
            0
        };
        let header = (NFT_MSG_DELRULE, NLM_F_REQUEST | ack, seq);
        let start = rule_message(&mut m, header, family, table, chain);
        if let Some(handle) = handle {
            netlink::put_attr(&mut m, NFTA_RULE_HANDLE, &handle.to_be_bytes());
        }
        netlink::finish(&mut m, start);
    }
    marker(&mut m, NFNL_MSG_BATCH_END, seq + 1);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(handle: u64, comment: &str) -> NftRule {
        NftRule {
            handle,
            comment: Some(comment.to_string()),
        }
    }

    #[test]
    fn a_chain_whose_every_rule_goes_is_flushed_else_deleted_by_handle() {
        let read = [rule(4, "natledger:a"), rule(5, "natledger:b")];
        let all = Victims::pick("nat", "C", &read, |r| r.comment.is_some());
        assert_eq!((all.handles.clone(), all.whole), (vec![4, 5], true));
        let some = Victims::pick("nat", "C", &read, |r| r.handle == 5);
        assert_eq!((some.handles.clone(), some.whole), (vec![5], false));
        let none = Victims::pick("nat", "C", &[], |_| true);
        assert!(!none.whole);

        let m = batch(10, Family::Ipv4, 77, &[all, some], 2);
        let messages: Vec<_> = netlink::messages(&m).map(Result::unwrap).collect();
        let kinds: Vec<u16> = messages.iter().map(|m| m.kind).collect();
        let del = super::super::subsys(NFT_MSG_DELRULE);
        assert_eq!(kinds, [NFNL_MSG_BATCH_BEGIN, del, del, NFNL_MSG_BATCH_END]);
        assert_eq!(
            messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
            [10, 11, 12, 13]
        );
        // The generation rides on BATCH_BEGIN.
        let genid = netlink::attr(
            &messages[0].payload[4..],
            crate::kernel::nftables::wire::NFNL_BATCH_GENID,
        )
        .unwrap();
        assert_eq!(genid, 77u32.to_be_bytes());
        // The flush names no handle; the other deletion names handle 5.
        let body = |i: usize| &messages[i].payload[4..];
        assert!(netlink::attr(body(1), NFTA_RULE_HANDLE).is_none());
        assert_eq!(
            netlink::attr(body(2), NFTA_RULE_HANDLE).unwrap(),
            5u64.to_be_bytes()
        );
    }
}
