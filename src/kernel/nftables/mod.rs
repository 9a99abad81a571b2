//! nf_tables over netlink: deleting a container's rules from the iptables-nft tables without
//! a helper process, and without making the hook wait for the kernel's cleanup.
//!
//! # Why: the nft delete floor
//! An `iptables-nft-restore` that deletes one rule spends about 0.2 ms on the transaction and
//! 10-25 ms in `close()` of its netlink socket (strace -T, kernel 6.x, 2 cores). Releasing a
//! `NETLINK_NETFILTER` socket runs the nf_tables netlink notifier (`nft_rcv_nl_event`), which
//! takes the namespace's commit mutex and flushes the pending destroy work
//! (`nf_tables_trans_destroy_flush_work`). That work frees deleted objects only after
//! `synchronize_rcu()`, a full RCU grace period, so every process that deletes anything
//! (a rule, or `nft delete table` of an empty table) and then exits waits a grace period.
//!
//! The deletion is committed and in effect for every new packet once the kernel acknowledges
//! the batch; the grace period only protects memory that packets in flight may still read.
//! So natledger deletes over its own socket and hands the socket's last reference to a
//! detached grandchild ([`crate::kernel::netlink::Socket::close_detached`]), which pays the wait after the hook has
//! returned. Nothing is skipped: the kernel does the same work, off the container's stop path.
//!
//! # Scope
//! Deletion, of rules picked from a dump by chain, comment and handle; and reading rules of
//! any owner as iptables-nft-save tokens ([`read`]). Rules are still
//! written by `iptables-nft-restore`: its encoding of iptables matches into nf_tables
//! expressions is what `iptables-nft-save` and every other tool read back, and natledger never
//! has to produce or parse that encoding. Handles are unique and never reused within a table,
//! so a handle read from a dump names that rule or nothing; a batch naming a rule that has
//! gone meanwhile fails whole and changes nothing.
//!
//! # One wire vocabulary
//! `wire` defines every nf_tables message type and attribute number once, with the raw
//! decoding of expressions (name and data, registers, data values, verdicts) that the three
//! readers share: [`read`] (iptables-nft-save tokens), [`ruleset`] (`model::ruleset`) and
//! [`own`] (natledger's own tables, encoded and strictly decoded).

use std::io;

pub mod handles;
pub mod leftover;
pub mod monitor;
pub mod own;
pub mod read;
pub mod ruleset;
mod wire;

use crate::kernel::netlink::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, Socket};
use crate::model::family::Family;
use wire::{
    NFNL_BATCH_GENID, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES,
    NFT_MSG_DELRULE, NFT_MSG_GETGEN, NFT_MSG_GETRULE, NFT_MSG_NEWGEN, NFT_MSG_NEWRULE, NFTA_GEN_ID,
    NFTA_MATCH_INFO, NFTA_MATCH_NAME, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_HANDLE,
    NFTA_RULE_TABLE, NFTA_RULE_USERDATA,
};

/// The comment record in a rule's user data (libnftnl's `NFTNL_UDATA_RULE_COMMENT`).
const UDATA_COMMENT: u8 = 0;

/// One rule of a chain as a dump shows it: enough to pick it and to delete it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub handle: u64,
    /// `-m comment --comment` as iptables-nft stores it (an xtables `comment` match, or the
    /// rule's user data).
    pub comment: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot open a netfilter netlink socket")]
    Open(#[source] io::Error),
    #[error("listing the {family} {table} chain {chain} over netlink")]
    List {
        family: Family,
        table: String,
        chain: String,
        source: io::Error,
    },
    #[error("reading {what} ({family}) over netlink")]
    Read {
        family: Family,
        what: String,
        source: io::Error,
    },
    #[error("deleting {count} {family} rule(s) over netlink")]
    Delete {
        family: Family,
        count: usize,
        source: io::Error,
    },
    #[error("the nf_tables transaction of {count} message(s) on {family} table natledger failed")]
    Write {
        family: Family,
        count: usize,
        source: io::Error,
    },
    #[error(
        "deleting the {family} table {table} over netlink (left with only empty accepting \
         built-in chains)"
    )]
    DropTable {
        family: Family,
        table: String,
        #[source]
        source: io::Error,
    },
    #[error("{family} table natledger, chain {chain}: {reason}; nothing was changed")]
    Refused {
        family: Family,
        chain: String,
        reason: String,
    },
    #[error("reading {what} of the nf_tables ruleset over netlink")]
    Ruleset { what: String, source: io::Error },
    #[error("the nf_tables ruleset changed during each of {tries} reads in a row")]
    Unsettled { tries: usize },
    #[error("the tables asked for hold {sets} sets and maps, more than the {limit} read at once")]
    TooManySets { sets: usize, limit: usize },
    #[error("{family} table natledger, chain {chain}: cannot encode {rule}")]
    Encode {
        family: Family,
        chain: String,
        rule: String,
        source: own::expr::EncodeError,
    },
}

/// nf_tables requests over a netfilter netlink socket of the calling thread's network
/// namespace (shared with [`crate::kernel::conntrack`], so that one socket is released per run).
pub struct Session<'s> {
    sock: &'s mut Socket,
}

impl<'s> Session<'s> {
    pub fn new(sock: &'s mut Socket) -> Self {
        Session { sock }
    }

    /// The nf_tables generation of the network namespace: every committed transaction, of
    /// any table and family, by anyone, moves it on by one.
    pub fn generation(&mut self) -> Result<u32, NftError> {
        let err = |source| NftError::Read {
            family: Family::Ipv4,
            what: "the nf_tables generation".into(),
            source,
        };
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(20);
        let start = netlink::begin(&mut request, subsys(NFT_MSG_GETGEN), NLM_F_REQUEST, seq);
        genmsg(&mut request, libc::AF_UNSPEC as u8, 0);
        netlink::finish(&mut request, start);
        let mut generation = None;
        self.sock
            .answer(seq, &request, |message| {
                if message.kind == subsys(NFT_MSG_NEWGEN) {
                    generation = message
                        .payload
                        .get(4..)
                        .and_then(|body| netlink::attr(body, NFTA_GEN_ID))
                        .and_then(|id| Some(u32::from_be_bytes(id.get(..4)?.try_into().ok()?)));
                }
                Ok(())
            })
            .map_err(err)?;
        generation.ok_or_else(|| err(io::Error::other("no generation in the answer")))
    }

    /// Every rule of `chain` in `table` (an empty list when either does not exist).
    pub fn rules(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
    ) -> Result<Vec<NftRule>, NftError> {
        let err = |source| NftError::List {
            family,
            table: table.to_string(),
            chain: chain.to_string(),
            source,
        };
        let seq = self.sock.next_seq();
        let mut rules = Vec::new();
        let answer = self
            .sock
            .dump(seq, &dump_request(seq, family, table, chain), |message| {
                if message.kind == subsys(NFT_MSG_NEWRULE) {
                    let (in_table, on, rule) = parse_rule(message.payload)
                        .ok_or_else(|| io::Error::other("malformed rule message"))?;
                    if in_table == table && on == chain {
                        rules.push(rule);
                    }
                }
                Ok(())
            });
        match answer {
            Ok(()) => Ok(rules),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(err(e)),
        }
    }

    /// Delete the rules `(table, chain, handle)` in one transaction: all or none.
    pub fn delete(
        &mut self,
        family: Family,
        victims: &[(&str, &str, u64)],
    ) -> Result<(), NftError> {
        if victims.is_empty() {
            return Ok(());
        }
        let err = |source| NftError::Delete {
            family,
            count: victims.len(),
            source,
        };
        let first = self.sock.reserve(victims.len() as u32 + 2);
        let batch = delete_batch(first, family, victims);
        self.sock.make_room_to_send(batch.len()).map_err(err)?;
        self.sock.send(&batch).map_err(err)?;
        // Only the last deletion asks for an acknowledgement: nfnetlink answers a message
        // that failed whether it asked or not, and sends every answer after the commit (or
        // the abort), in message order, a failed commit's error first. One acknowledgement
        // per deletion would be one datagram each, and a few hundred of them overflow the
        // socket's receive buffer (ENOBUFS) before they are read. So the first answer decides:
        // 0 for the last deletion is the whole batch committed, an errno anywhere is the
        // batch aborted.
        let ours = first..=(first + victims.len() as u32 + 1);
        self.sock
            .acks(ours, 1, |_, code| match code {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            })
            .map_err(err)
    }
}

fn subsys(message: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | message
}

/// `struct nfgenmsg`: family, version 0, resource id (big-endian).
fn genmsg(buf: &mut Vec<u8>, family: u8, res_id: u16) {
    buf.push(family);
    buf.push(0);
    buf.extend(res_id.to_be_bytes());
}

/// Start a rule message (`nlmsghdr`, `nfgenmsg`, table, chain); the caller adds the rest
/// and calls `netlink::finish` with the returned start.
fn rule_message(
    m: &mut Vec<u8>,
    (kind, flags, seq): (u16, u16, u32),
    family: Family,
    table: &str,
    chain: &str,
) -> usize {
    let start = netlink::begin(m, subsys(kind), flags, seq);
    genmsg(m, family.af(), 0);
    netlink::put_str(m, NFTA_RULE_TABLE, table);
    netlink::put_str(m, NFTA_RULE_CHAIN, chain);
    start
}

/// GETRULE dump of one chain.
fn dump_request(seq: u32, family: Family, table: &str, chain: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    let header = (NFT_MSG_GETRULE, NLM_F_REQUEST | NLM_F_DUMP, seq);
    let start = rule_message(&mut m, header, family, table, chain);
    netlink::finish(&mut m, start);
    m
}

/// A batch's BATCH_BEGIN or BATCH_END (`kind`). A BEGIN given a generation is valid only at
/// it (`NFNL_BATCH_GENID`): the kernel refuses the whole batch when anyone committed since.
pub(crate) fn batch_marker(m: &mut Vec<u8>, kind: u16, seq: u32, generation: Option<u32>) {
    let start = netlink::begin(m, kind, NLM_F_REQUEST, seq);
    genmsg(m, libc::AF_UNSPEC as u8, NFNL_SUBSYS_NFTABLES);
    if let (NFNL_MSG_BATCH_BEGIN, Some(generation)) = (kind, generation) {
        netlink::put_attr(m, NFNL_BATCH_GENID, &generation.to_be_bytes());
    }
    netlink::finish(m, start);
}

/// BATCH_BEGIN, one DELRULE per victim (sequence numbers `first + 1 ..`), BATCH_END.
fn delete_batch(first: u32, family: Family, victims: &[(&str, &str, u64)]) -> Vec<u8> {
    let mut m = Vec::with_capacity(64 * (victims.len() + 2));
    let marker = |m: &mut Vec<u8>, kind: u16, seq: u32| batch_marker(m, kind, seq, None);
    marker(&mut m, NFNL_MSG_BATCH_BEGIN, first);
    let mut seq = first;
    for (i, (table, chain, handle)) in victims.iter().enumerate() {
        seq += 1;
        // Only the last asks for an acknowledgement (see `Session::delete`).
        let ack = if i + 1 == victims.len() { NLM_F_ACK } else { 0 };
        let header = (NFT_MSG_DELRULE, NLM_F_REQUEST | ack, seq);
        let start = rule_message(&mut m, header, family, table, chain);
        netlink::put_attr(&mut m, NFTA_RULE_HANDLE, &handle.to_be_bytes());
        netlink::finish(&mut m, start);
    }
    marker(&mut m, NFNL_MSG_BATCH_END, seq + 1);
    m
}

/// A NEWRULE message (after `nfgenmsg`): its table, chain, handle and comment.
fn parse_rule(payload: &[u8]) -> Option<(String, String, NftRule)> {
    let body = payload.get(4..)?;
    let table = netlink::attr(body, NFTA_RULE_TABLE).and_then(netlink::str_of)?;
    let chain = netlink::attr(body, NFTA_RULE_CHAIN).and_then(netlink::str_of)?;
    let handle = u64::from_be_bytes(netlink::attr(body, NFTA_RULE_HANDLE)?.try_into().ok()?);
    let comment = netlink::attr(body, NFTA_RULE_EXPRESSIONS)
        .and_then(comment_match)
        .or_else(|| netlink::attr(body, NFTA_RULE_USERDATA).and_then(comment_udata));
    Some((
        table.to_string(),
        chain.to_string(),
        NftRule { handle, comment },
    ))
}

/// The text of an xtables `comment` match among the expressions.
fn comment_match(expressions: &[u8]) -> Option<String> {
    wire::expressions(expressions).find_map(|(name, data)| {
        let matched = netlink::attr(data, NFTA_MATCH_NAME).and_then(netlink::str_of)?;
        if name != "match" || matched != "comment" {
            return None;
        }
        netlink::attr(data, NFTA_MATCH_INFO)
            .and_then(netlink::str_of)
            .map(str::to_string)
    })
}

/// The comment record of a rule's user data: type, length, NUL-terminated text.
fn comment_udata(udata: &[u8]) -> Option<String> {
    let mut at = 0;
    while let [kind, len, ..] = *udata.get(at..)? {
        let value = udata.get(at + 2..at + 2 + len as usize)?;
        if kind == UDATA_COMMENT {
            return netlink::str_of(value).map(str::to_string);
        }
        at += 2 + len as usize;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::wire::{NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM};
    use super::*;

    /// A NEWRULE payload as the kernel sends it for an iptables-nft rule with a comment.
    fn rule_payload(chain: &str, handle: u64, comment: &[u8], as_udata: bool) -> Vec<u8> {
        let mut p = Vec::new();
        genmsg(&mut p, libc::AF_INET as u8, 3);
        netlink::put_str(&mut p, NFTA_RULE_TABLE, "nat");
        netlink::put_str(&mut p, NFTA_RULE_CHAIN, chain);
        netlink::put_attr(&mut p, NFTA_RULE_HANDLE, &handle.to_be_bytes());
        let mut exprs = Vec::new();
        let mut counter = Vec::new();
        netlink::put_str(&mut counter, NFTA_EXPR_NAME, "counter");
        netlink::put_attr(&mut exprs, NFTA_LIST_ELEM, &counter);
        if !as_udata {
            let mut info = comment.to_vec();
            info.resize(256, 0);
            let mut data = Vec::new();
            netlink::put_str(&mut data, NFTA_MATCH_NAME, "comment");
            netlink::put_attr(&mut data, 2, &0u32.to_be_bytes());
            netlink::put_attr(&mut data, NFTA_MATCH_INFO, &info);
            let mut elem = Vec::new();
            netlink::put_str(&mut elem, NFTA_EXPR_NAME, "match");
            netlink::put_attr(&mut elem, NFTA_EXPR_DATA, &data);
            netlink::put_attr(&mut exprs, NFTA_LIST_ELEM, &elem);
        }
        netlink::put_attr(&mut p, NFTA_RULE_EXPRESSIONS, &exprs);
        if as_udata {
            let mut udata = vec![9, 1, 0]; // another record first
            udata.push(UDATA_COMMENT);
            udata.push(comment.len() as u8 + 1);
            udata.extend(comment);
            udata.push(0);
            netlink::put_attr(&mut p, NFTA_RULE_USERDATA, &udata);
        }
        p
    }

    #[test]
    fn reads_chain_handle_and_comment_in_either_encoding() {
        for as_udata in [false, true] {
            let p = rule_payload(
                "NATLEDGER-HOSTPORTS",
                0x1_0000_0007,
                b"natledger:c1",
                as_udata,
            );
            let (table, chain, rule) = parse_rule(&p).unwrap();
            assert_eq!(table, "nat");
            assert_eq!(chain, "NATLEDGER-HOSTPORTS");
            assert_eq!(rule.handle, 0x1_0000_0007);
            assert_eq!(rule.comment.as_deref(), Some("natledger:c1"));
        }
        let mut bare = Vec::new();
        genmsg(&mut bare, libc::AF_INET as u8, 3);
        netlink::put_str(&mut bare, NFTA_RULE_TABLE, "nat");
        netlink::put_str(&mut bare, NFTA_RULE_CHAIN, "X");
        netlink::put_attr(&mut bare, NFTA_RULE_HANDLE, &5u64.to_be_bytes());
        assert_eq!(parse_rule(&bare).unwrap().2.comment, None);
        // No handle: not a rule natledger can delete.
        assert!(parse_rule(&bare[..bare.len() - 12]).is_none());
    }

    #[test]
    fn a_delete_batch_is_framed_for_one_transaction() {
        let m = delete_batch(10, Family::Ipv6, &[("nat", "A", 3), ("filter", "B", 4)]);
        let messages: Vec<_> = netlink::messages(&m).map(Result::unwrap).collect();
        let kinds: Vec<u16> = messages.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [
                NFNL_MSG_BATCH_BEGIN,
                subsys(NFT_MSG_DELRULE),
                subsys(NFT_MSG_DELRULE),
                NFNL_MSG_BATCH_END
            ]
        );
        let seqs: Vec<u32> = messages.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [10, 11, 12, 13]);
        // Only the last deletion asks for an acknowledgement (one datagram per rule would
        // overflow the receive buffer of a large batch); `nlmsg_flags` of each message.
        let mut flags = Vec::new();
        let mut at = 0;
        while at < m.len() {
            let len = u32::from_ne_bytes(m[at..at + 4].try_into().unwrap()) as usize;
            flags.push(u16::from_ne_bytes(m[at + 6..at + 8].try_into().unwrap()));
            at += len.next_multiple_of(4);
        }
        let ack = NLM_F_REQUEST | NLM_F_ACK;
        assert_eq!(flags, [NLM_F_REQUEST, NLM_F_REQUEST, ack, NLM_F_REQUEST]);
        // The batch addresses nf_tables; each deletion names family, table, chain, handle.
        assert_eq!(
            &messages[0].payload[2..4],
            &NFNL_SUBSYS_NFTABLES.to_be_bytes()
        );
        let del = messages[2].payload;
        assert_eq!(del[0], libc::AF_INET6 as u8);
        let body = &del[4..];
        assert_eq!(
            netlink::attr(body, NFTA_RULE_TABLE).and_then(netlink::str_of),
            Some("filter")
        );
        assert_eq!(
            netlink::attr(body, NFTA_RULE_CHAIN).and_then(netlink::str_of),
            Some("B")
        );
        assert_eq!(
            netlink::attr(body, NFTA_RULE_HANDLE),
            Some(&4u64.to_be_bytes()[..])
        );
    }

    #[test]
    fn a_dump_request_names_table_and_chain() {
        let m = dump_request(3, Family::Ipv4, "nat", "NATLEDGER-MASQ");
        let message = netlink::messages(&m).next().unwrap().unwrap();
        assert_eq!(message.kind, subsys(NFT_MSG_GETRULE));
        let body = &message.payload[4..];
        assert_eq!(
            netlink::attr(body, NFTA_RULE_CHAIN).and_then(netlink::str_of),
            Some("NATLEDGER-MASQ")
        );
    }
}
