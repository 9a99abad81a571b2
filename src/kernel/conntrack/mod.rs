//! Forgetting the conntrack entries that keep a UDP or SCTP flow on an old NAT path, over
//! ctnetlink, in-process.
//!
//! # Why
//! NAT is decided once per conntrack entry, on the flow's first packet; every later packet
//! of the flow follows the entry, not the rules. UDP has no end, so an entry lives as long as
//! the client keeps sending (30 s after its last packet, 120 s once replied to): a client
//! sending every 100 ms stays pinned to a dead container's address forever after natledger
//! moved the host port to a new container. So after natledger's rules are in place (or after
//! it removed them), it deletes exactly the entries whose ORIGINAL tuple (the addresses as
//! the client sent them, before DNAT) has the mapping's protocol, a destination port in its
//! host-port range, and as destination the mapping's host address, or, without one, an
//! address local to the network namespace (for a removed DNAT, only those whose reply
//! comes from its target, [`Flows::to`]): the DNAT rules match `--dst-type LOCAL` only, so
//! a flow forwarded through the node (to 8.8.8.8:53, say) was never natledger's and is never
//! touched. Nothing else is deleted: no other port, host address, protocol (TCP only when a
//! [`Flows`] asks for TCP), and no other network namespace (the netlink socket sees only
//! its own).
//!
//! # Messages
//! ctnetlink is nfnetlink subsystem 1 (`NFNL_SUBSYS_CTNETLINK`); message type
//! `(1 << 8) | cmd`, after the `nlmsghdr` a 4-byte `nfgenmsg` (family, version 0, resource
//! id 0), then attributes (`include/uapi/linux/netfilter/nfnetlink_conntrack.h`):
//!
//! ```text
//! IPCTNL_MSG_CT_GET, NLM_F_DUMP, family AF_UNSPEC        one dump: every entry of both families
//! IPCTNL_MSG_CT_GET, NLM_F_DUMP, family AF_INET or AF_INET6   or one dump per family, filtered:
//!     CTA_TUPLE_ORIG (nested)    the values entries must have
//!       CTA_TUPLE_IP (nested)    CTA_IP_V4_DST (IPv4 only: see below)
//!       CTA_TUPLE_PROTO (nested) CTA_PROTO_NUM, CTA_PROTO_DST_PORT
//!     CTA_FILTER (nested)
//!       CTA_FILTER_ORIG_FLAGS (u32, host order)  which of them: CTA_FILTER_F_CTA_IP_DST 1 << 1,
//!                                _PROTO_NUM 1 << 3, _PROTO_DST_PORT 1 << 5
//!   answers: IPCTNL_MSG_CT_NEW, family of the entry
//!     CTA_TUPLE_ORIG (nested)
//!       CTA_TUPLE_IP (nested)    CTA_IP_V4_SRC/DST (4 bytes) or CTA_IP_V6_SRC/DST (16)
//!       CTA_TUPLE_PROTO (nested) CTA_PROTO_NUM (u8), CTA_PROTO_SRC_PORT/DST_PORT (be16)
//!       CTA_TUPLE_ZONE (be16)    only for a zone of the original direction alone
//!     CTA_TUPLE_REPLY (nested)  CTA_TUPLE_IP's source only: a DNATed flow's target
//!     CTA_STATUS, CTA_TIMEOUT, ...                       (not read)
//!     CTA_ZONE (be16)            only for a non-default zone of both directions
//!     CTA_ID (be32)              the entry's id
//! IPCTNL_MSG_CT_DELETE, NLM_F_ACK, family of the entry    one per entry to forget
//!     CTA_TUPLE_ORIG as dumped (IP, proto, tuple zone), CTA_ZONE as dumped, CTA_ID
//! ```
//!
//! Numbers are network byte order inside attributes; nested attributes carry
//! `NLA_F_NESTED`. The kernel finds the entry to delete by the tuple in the zone, then
//! refuses it with `ENOENT` unless its id is the dumped one: a new flow that reused the
//! tuple after the dumped entry expired is not the entry that was judged, and is left alone.
//! A delete request WITHOUT a tuple flushes the whole table of the namespace, so
//! `delete_message` always writes one, and a unit test pins that. A filter only ever goes on
//! a dump request.
//!
//! # The kernel's dump filter
//! `CTA_FILTER` (kernel 5.9 on; `nf_conntrack_netlink.c`: `ctnetlink_alloc_filter`,
//! `ctnetlink_parse_tuple_filter`, `ctnetlink_filter_match`) makes the kernel skip, inside
//! its walk, the entries whose original tuple lacks one of the flagged values, so they are
//! never serialized or copied. Its rules, pinned against the kernel by
//! `the_kernels_dump_filter_rules` in `tests/it/conntrack_kernel.rs`: it needs a family (`AF_UNSPEC`
//! with a filter: `EOPNOTSUPP`), so the flows of both families take one dump (one walk) each;
//! a port flag needs the protocol flag (`EINVAL`); ports are compared for TCP and UDP entries
//! only (an SCTP entry passes whatever its port); no zone is named, so entries of every zone
//! pass; and the IPv6 address comparison is inverted (`!ipv6_addr_cmp`, since 5.9: asked for
//! one address, it dumps every other), so only an IPv4 destination is ever filtered on. The
//! filter only narrows: every entry dumped is still judged by [`matches()`]. A kernel that
//! refuses a filter (`EOPNOTSUPP`, `EINVAL`: flags or tuple it does not take) answers
//! before any entry, and [`forget`] then sends the one unfiltered dump; kernels before 5.9
//! ignore the attribute and dump the whole family.
//!
//! # Cost
//! One unfiltered dump per [`forget`], or one filtered dump per family of its flows
//! (`plan`), and one `getifaddrs` only when some flow has no host address. A dump walks
//! every bucket of the kernel's conntrack hash table, which is one table for all network
//! namespaces (262,144 buckets here, sized by memory), about 10 ms whatever it holds, and
//! serializes every entry of the namespace it does not filter out, about 2.5 us per TCP
//! entry and 2 us per UDP entry, parsed and judged here included. Measured in a test
//! namespace (2 cores, kernel 6.18, release build), the paths taking turns run by run, in
//! ms per `forget` of UDP flows that find nothing, of one family or of both
//! (`cost_of_forget` in `tests/it/conntrack_kernel.rs` prints the same, one path after the other):
//!
//! ```text
//! entries present            0     1,000   10,000   50,000
//! mostly TCP  unfiltered    10.6   13.6     39.4    188
//!             filtered, 1   10.6   11.0     13.2     30
//!             filtered, 2   21.0   22.0     25.8     60   (one walk per family)
//! mostly UDP  unfiltered    13.5   13.4     32.9    126
//!             filtered, 1   13.6   11.2     12.7     22
//!             filtered, 2   27.0   22.5     24.4     39
//! ```
//!
//! So flows of one family always take the filtered dump, and flows of both take the two
//! filtered dumps from [`FILTER_BOTH_FAMILIES_FROM`] (5,000) entries on: below it one
//! unfiltered walk costs less than two (two filtered walks cost as much as an unfiltered
//! one at about 4,300 entries, mostly TCP, and 5,500, mostly UDP; at 5,000 neither choice
//! loses more than a millisecond). The count is the namespace's `nf_conntrack_count`, read
//! only for flows of both families. [`table_is_empty`] (the same count, 40 us) lets a
//! caller skip everything, the socket included, when nothing can need forgetting. Deleting
//! costs 3-7 us per entry: many deletions per datagram, [`DELETE_CHUNK`] at a time, each
//! chunk's acknowledgements read before the next is sent so that they never overflow the
//! socket's receive buffer.

use std::io;
use std::net::IpAddr;

use crate::kernel::netlink::Socket;
use crate::model::family::Family;
use crate::model::portspec::{PortRange, Protocol};

mod filter;
mod message;
#[cfg(test)]
mod tests;

use filter::*;
pub use filter::{Choice as DumpChoice, DUMP_ENV, FILTER_BOTH_FAMILIES_FROM};
pub use message::parse_entry;
use message::*;

/// Deletions sent per datagram. The kernel handles every message of a datagram and queues
/// an acknowledgement for each before `send` returns, dropping them (the socket then reads
/// `ENOBUFS`) once they overflow the receive buffer, 212,992 bytes by default. Measured on
/// 6.18: an `ENOENT` answer to an IPv6 delete (it echoes the request) takes 832 bytes of
/// that buffer, so 256 fill it exactly and 260 overflow; 128 use half.
pub const DELETE_CHUNK: usize = 128;

/// The calling thread's network namespace's number of conntrack entries.
const COUNT_FILE: &str = "/proc/sys/net/netfilter/nf_conntrack_count";

/// The flows of one mapping and family: conntrack entries whose original tuple has this
/// protocol and family, a destination port in `ports`, and as destination `host`, or, when
/// `host` is `None` (or an unspecified address), any address local to the network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flows {
    pub family: Family,
    pub protocol: Protocol,
    pub ports: PortRange,
    pub host: Option<IpAddr>,
    /// Only the entries whose replies come from this address (a DNAT's target): the flows a
    /// removed DNAT took, while another DNAT of the port (a stacked holder's) keeps its own.
    /// `None`: every flow to the host port (a DNAT added takes them all).
    pub to: Option<IpAddr>,
}

impl Flows {
    /// The host address the flows must be sent to, if it is one address.
    fn exact_host(&self) -> Option<IpAddr> {
        self.host.filter(|h| !h.is_unspecified())
    }

    /// Whether `entry`'s original tuple is one of these flows.
    fn covers(&self, entry: &Entry, locals: &LocalAddrs) -> bool {
        entry.protocol == self.protocol.number()
            && Family::of(entry.dst) == self.family
            && (self.ports.start..=self.ports.end).contains(&entry.dst_port)
            && match self.exact_host() {
                Some(host) => entry.dst == host,
                None => locals.contains(entry.dst),
            }
            // An entry whose reply source was not read is judged by its original tuple alone.
            && self
                .to
                .is_none_or(|to| entry.reply_src.is_none_or(|from| from == to))
    }
}

/// One conntrack entry as a dump shows it: its original tuple, and what deleting exactly
/// this entry needs (zone, id). Only entries of protocols with ports are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// IP protocol number (`CTA_PROTO_NUM`).
    pub protocol: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    /// The source of the reply tuple (`CTA_TUPLE_REPLY`): a DNATed flow's target.
    pub reply_src: Option<IpAddr>,
    /// `CTA_ZONE`: a non-default zone of both directions.
    pub zone: Option<u16>,
    /// `CTA_TUPLE_ZONE` of the original tuple: a zone of the original direction alone.
    pub tuple_zone: Option<u16>,
    /// `CTA_ID`: the kernel refuses a delete naming another id.
    pub id: Option<u32>,
}

/// The addresses `--dst-type LOCAL` matches in a network namespace, as far as natledger
/// needs them: the interface addresses, and the whole loopback nets 127.0.0.0/8 and ::1.
/// (A `local` route of a whole prefix, "AnyIP", is not an interface address: flows to such
/// a prefix are forgotten only through a [`Flows`] naming the host address.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalAddrs {
    addrs: Vec<IpAddr>,
}

impl LocalAddrs {
    pub fn new(addrs: Vec<IpAddr>) -> Self {
        LocalAddrs { addrs }
    }

    /// The addresses of the calling thread's network namespace (`getifaddrs` asks over a
    /// route netlink socket, which is in the thread's namespace).
    pub fn of_this_netns() -> io::Result<Self> {
        let addrs = crate::kernel::netns::interface_addresses().map_err(io::Error::from)?;
        Ok(LocalAddrs { addrs })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.addrs.contains(&ip)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("reading the network namespace's local addresses")]
    LocalAddrs(#[source] io::Error),
    #[error("listing the conntrack table over netlink")]
    Dump(#[source] io::Error),
    #[error(
        "deleting {count} conntrack entries over netlink ({deleted} deleted, {refused} refused)"
    )]
    Delete {
        count: usize,
        deleted: usize,
        refused: usize,
        source: io::Error,
    },
}

/// Whether the calling thread's network namespace has no conntrack entry at all (its
/// `nf_conntrack_count` is 0, or conntrack is not there): then nothing can need forgetting
/// and a caller skips [`forget`] and the socket. `/proc/sys/net` is that of the network
/// namespace of the thread that opens the file. A count that cannot be read otherwise counts
/// as entries.
pub fn table_is_empty() -> bool {
    match entry_count() {
        Ok(count) => count == Some(0),
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Delete the conntrack entries of `flows` in the network namespace of `sock`, a
/// [`Socket::netfilter`] that the caller may share with nf_tables requests and releases
/// itself (nothing here opens or closes one). The calling thread must be in that same
/// namespace: local addresses and the entry count are read there. The dumps `plan`
/// chooses by `choice` (one unfiltered, or one filtered per family), then the deletions; returns how
/// many entries were deleted. An entry that expired in between, or whose tuple a new flow
/// took meanwhile (another id), is neither counted nor an error. A refused deletion does
/// not stop the others: the error names how many went.
pub fn forget(sock: &mut Socket, flows: &[Flows], choice: Choice) -> Result<usize, ConntrackError> {
    if flows.is_empty() {
        return Ok(0);
    }
    let locals = if flows.iter().any(|f| f.exact_host().is_none()) {
        LocalAddrs::of_this_netns().map_err(ConntrackError::LocalAddrs)?
    } else {
        LocalAddrs::default()
    };
    let victims = matching(sock, flows, &locals, choice).map_err(ConntrackError::Dump)?;
    delete(sock, &victims)
}

/// The entries [`matches()`] keeps among those of the dumps `plan` chooses. When the kernel
/// refuses a filter (no dump began), every entry is looked at instead, in one unfiltered
/// dump: the filter only ever narrows what `matches` judges.
fn matching(
    sock: &mut Socket,
    flows: &[Flows],
    locals: &LocalAddrs,
    choice: Choice,
) -> io::Result<Vec<Entry>> {
    let refusable = choice == Choice::Refused;
    let mut found = Vec::new();
    for dump in plan(flows, choice, || entry_count().ok().flatten()) {
        match dump_matching(sock, dump, refusable, flows, locals, &mut found) {
            Err(e) if dump != Dump::All && refused(&e) => {
                found.clear();
                dump_matching(sock, Dump::All, false, flows, locals, &mut found)?;
                return Ok(found);
            }
            answered => answered?,
        }
    }
    Ok(found)
}

/// Send `dump` and add the entries [`matches()`] keeps to `found`.
fn dump_matching(
    sock: &mut Socket,
    dump: Dump,
    refusable: bool,
    flows: &[Flows],
    locals: &LocalAddrs,
    found: &mut Vec<Entry>,
) -> io::Result<()> {
    let seq = sock.next_seq();
    sock.dump(seq, &dump_request(seq, dump, refusable), |message| {
        if message.kind == subsys(IPCTNL_MSG_CT_NEW)
            && let Some(entry) = parse_entry(message.payload)
            && matches(&entry, flows, locals)
        {
            found.push(entry);
        }
        Ok(())
    })
}

/// Whether `entry`'s original tuple belongs to any of `flows`.
pub fn matches(entry: &Entry, flows: &[Flows], locals: &LocalAddrs) -> bool {
    flows.iter().any(|f| f.covers(entry, locals))
}

/// Delete `victims`, [`DELETE_CHUNK`] per datagram.
fn delete(sock: &mut Socket, victims: &[Entry]) -> Result<usize, ConntrackError> {
    let (mut deleted, mut refused) = (0, 0);
    let mut first_refusal = None;
    for chunk in victims.chunks(DELETE_CHUNK) {
        let first = sock.reserve(chunk.len() as u32);
        let mut m = Vec::with_capacity(112 * chunk.len());
        for (seq, entry) in (first..).zip(chunk) {
            delete_message(&mut m, seq, entry);
        }
        let answers = sock.send(&m).and_then(|()| {
            let ours = first..=first + chunk.len() as u32 - 1;
            sock.acks(ours, chunk.len(), |_, code| {
                match code {
                    0 => deleted += 1,
                    libc::ENOENT => {}
                    errno => {
                        refused += 1;
                        first_refusal.get_or_insert(errno);
                    }
                }
                Ok(())
            })
        });
        if let Err(source) = answers {
            return Err(ConntrackError::Delete {
                count: victims.len(),
                deleted,
                refused,
                source,
            });
        }
    }
    match first_refusal {
        None => Ok(deleted),
        Some(errno) => Err(ConntrackError::Delete {
            count: victims.len(),
            deleted,
            refused,
            source: io::Error::from_raw_os_error(errno),
        }),
    }
}
