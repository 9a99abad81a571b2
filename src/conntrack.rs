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
//! address local to the network namespace: the DNAT rules match `--dst-type LOCAL` only, so
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
//!     CTA_TUPLE_REPLY, CTA_STATUS, CTA_TIMEOUT, ...      (not read)
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
//! `the_kernels_dump_filter_rules` in `tests/conntrack.rs`: it needs a family (`AF_UNSPEC`
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
//! (`cost_of_forget` in `tests/conntrack.rs` prints the same, one path after the other):
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
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use crate::family::Family;
use crate::netlink::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, Socket};
use crate::portspec::{PortRange, Protocol};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_TUPLE_ZONE: u16 = 3;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// `CTA_FILTER_F_*`: the fields of a dump request's `CTA_TUPLE_ORIG` that an entry's original
/// tuple must have to be dumped. Kernel-internal (`net/netfilter/nf_internals.h`): the uapi
/// header names only the attributes.
const FILTER_F_IP_DST: u32 = 1 << 1;
const FILTER_F_PROTO_NUM: u32 = 1 << 3;
const FILTER_F_PROTO_DST_PORT: u32 = 1 << 5;
/// A flag no kernel defines, which kernels with `CTA_FILTER` refuse (6.18: `EINVAL`; the
/// 5.9 code: `EOPNOTSUPP`): how [`DUMP_ENV`]`=refused` makes the fallback run.
const FILTER_F_UNDEFINED: u32 = 1 << 31;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;

/// Deletions sent per datagram. The kernel handles every message of a datagram and queues
/// an acknowledgement for each before `send` returns, dropping them (the socket then reads
/// `ENOBUFS`) once they overflow the receive buffer, 212,992 bytes by default. Measured on
/// 6.18: an `ENOENT` answer to an IPv6 delete (it echoes the request) takes 832 bytes of
/// that buffer, so 256 fill it exactly and 260 overflow; 128 use half.
pub const DELETE_CHUNK: usize = 128;

/// The calling thread's network namespace's number of conntrack entries.
const COUNT_FILE: &str = "/proc/sys/net/netfilter/nf_conntrack_count";

/// From this many entries in the namespace on, flows of both families are looked for with
/// two filtered dumps (two walks of the hash table, next to nothing serialized) rather than
/// one unfiltered dump (one walk, every entry serialized): where both cost the same, between
/// 4,300 (mostly TCP) and 5,500 (mostly UDP) entries measured. See "Cost" above.
pub const FILTER_BOTH_FAMILIES_FROM: u64 = 5_000;

/// For tests and measurements only: forces how [`forget`] dumps. `filtered`: one filtered
/// dump per family, whatever the entry count; `unfiltered`: one dump of everything;
/// `refused`: filtered requests every kernel refuses, so that the fallback to one dump of
/// everything runs. Unset (or anything else), [`forget`] chooses. Read once per process.
#[doc(hidden)]
pub const DUMP_ENV: &str = "NATLEDGER_CONNTRACK_DUMP";

/// The flows of one mapping and family: conntrack entries whose original tuple has this
/// protocol and family, a destination port in `ports`, and as destination `host`, or, when
/// `host` is `None` (or an unspecified address), any address local to the network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flows {
    pub family: Family,
    pub protocol: Protocol,
    pub ports: PortRange,
    pub host: Option<IpAddr>,
}

impl Flows {
    /// The host address the flows must be sent to, if it is one address.
    fn exact_host(&self) -> Option<IpAddr> {
        self.host.filter(|h| !h.is_unspecified())
    }

    /// Whether `entry`'s original tuple is one of these flows.
    fn covers(&self, entry: &Entry, locals: &LocalAddrs) -> bool {
        entry.protocol == protocol_number(self.protocol)
            && Family::of(entry.dst) == self.family
            && (self.ports.start..=self.ports.end).contains(&entry.dst_port)
            && match self.exact_host() {
                Some(host) => entry.dst == host,
                None => locals.contains(entry.dst),
            }
    }
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
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
        let all = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
        let mut addrs = Vec::new();
        for ifa in all {
            let ip = ifa.address.as_ref().and_then(|a| {
                a.as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
            });
            if let Some(ip) = ip.filter(|ip| !addrs.contains(ip)) {
                addrs.push(ip);
            }
        }
        Ok(LocalAddrs { addrs })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.addrs.contains(&ip)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("reading the network namespace's local addresses: {0}")]
    LocalAddrs(#[source] io::Error),
    #[error("listing the conntrack table over netlink: {0}")]
    Dump(#[source] io::Error),
    #[error(
        "deleting {count} conntrack entries over netlink ({deleted} deleted, {refused} refused): {source}"
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
    match std::fs::read_to_string(COUNT_FILE) {
        Ok(count) => count.trim() == "0",
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Delete the conntrack entries of `flows` in the network namespace of `sock`, a
/// [`Socket::netfilter`] that the caller may share with nf_tables requests and releases
/// itself (nothing here opens or closes one). The calling thread must be in that same
/// namespace: local addresses and the entry count are read there. The dumps `plan`
/// chooses (one unfiltered, or one filtered per family), then the deletions; returns how
/// many entries were deleted. An entry that expired in between, or whose tuple a new flow
/// took meanwhile (another id), is neither counted nor an error. A refused deletion does
/// not stop the others: the error names how many went.
pub fn forget(sock: &mut Socket, flows: &[Flows]) -> Result<usize, ConntrackError> {
    if flows.is_empty() {
        return Ok(0);
    }
    let locals = if flows.iter().any(|f| f.exact_host().is_none()) {
        LocalAddrs::of_this_netns().map_err(ConntrackError::LocalAddrs)?
    } else {
        LocalAddrs::default()
    };
    let victims = matching(sock, flows, &locals).map_err(ConntrackError::Dump)?;
    delete(sock, &victims)
}

/// The entries [`matches()`] keeps among those of the dumps `plan` chooses. When the kernel
/// refuses a filter (no dump began), every entry is looked at instead, in one unfiltered
/// dump: the filter only ever narrows what `matches` judges.
fn matching(sock: &mut Socket, flows: &[Flows], locals: &LocalAddrs) -> io::Result<Vec<Entry>> {
    let choice = Choice::from_env();
    let refusable = choice == Choice::Refused;
    let mut found = Vec::new();
    for dump in plan(flows, choice, entry_count) {
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

/// Whether a dump's error is the kernel refusing the request's filter, before any entry:
/// kernels from 5.9 (`CTA_FILTER`) answer `EOPNOTSUPP` or `EINVAL` to flags or a tuple they
/// do not take. Kernels before 5.9 ignore `CTA_FILTER` and its tuple: they dump the whole
/// family, which [`matches()`] judges as ever.
fn refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL))
}

/// The namespace's number of conntrack entries, if it can be read.
fn entry_count() -> Option<u64> {
    std::fs::read_to_string(COUNT_FILE)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How [`forget`] chooses its dumps: by `plan`'s rule, or as [`DUMP_ENV`] forces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Adaptive,
    Filtered,
    Unfiltered,
    /// Filtered, with a flag the kernel refuses: the fallback on demand.
    Refused,
}

impl Choice {
    fn from_env() -> Choice {
        static CHOICE: OnceLock<Choice> = OnceLock::new();
        *CHOICE.get_or_init(|| match std::env::var(DUMP_ENV).as_deref() {
            Ok("filtered") => Choice::Filtered,
            Ok("unfiltered") => Choice::Unfiltered,
            Ok("refused") => Choice::Refused,
            _ => Choice::Adaptive,
        })
    }
}

/// One dump request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dump {
    /// Every entry of both families (`AF_UNSPEC`, no filter): what every kernel answers.
    All,
    /// The entries the kernel lets through `Filter`.
    Only(Filter),
}

/// A filtered dump: the entries of `family` whose original tuple has protocol `protocol`
/// (and then destination port `dst_port`) and destination `dst`, each where given. Every
/// entry of flows of that family passes it; the kernel drops the rest without serializing
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Filter {
    family: Family,
    protocol: Option<u8>,
    /// Only with `protocol`: the kernel refuses port flags without the protocol's. It compares
    /// ports of TCP and UDP entries only (6.18): an SCTP entry passes whatever its port.
    dst_port: Option<u16>,
    /// IPv4 only: the kernel's IPv6 address comparison is inverted (`!ipv6_addr_cmp`, from
    /// 5.9 to 6.18 at least: asked for fd78::1, 6.18 dumps every address but fd78::1).
    dst: Option<IpAddr>,
}

impl Filter {
    /// The narrowest filter that every entry of `flows` of `family` passes: what all of them
    /// share.
    fn of(family: Family, flows: &[Flows]) -> Filter {
        let mine = || flows.iter().filter(move |f| f.family == family);
        let protocol = shared(mine().map(|f| Some(protocol_number(f.protocol))));
        let port = |f: &Flows| (f.ports.start == f.ports.end).then_some(f.ports.start);
        Filter {
            family,
            protocol,
            dst_port: protocol.and(shared(mine().map(port))),
            dst: shared(mine().map(Flows::exact_host)).filter(IpAddr::is_ipv4),
        }
    }

    /// `CTA_FILTER_ORIG_FLAGS`: the fields given.
    fn flags(&self) -> u32 {
        let flag = |given: bool, flag: u32| if given { flag } else { 0 };
        flag(self.protocol.is_some(), FILTER_F_PROTO_NUM)
            | flag(self.dst_port.is_some(), FILTER_F_PROTO_DST_PORT)
            | flag(self.dst.is_some(), FILTER_F_IP_DST)
    }
}

/// The value every item has, if they all have the same one (and there is one).
fn shared<T: Copy + PartialEq>(mut values: impl Iterator<Item = Option<T>>) -> Option<T> {
    let first = values.next()??;
    values.all(|v| v == Some(first)).then_some(first)
}

/// The dumps one [`forget`] of `flows` sends. The kernel's filter needs a family, so
/// filtered means one dump, one walk of the whole hash table, per family of the flows.
/// Flows of one family: always filtered (the same one walk, less serialized). Of both
/// families: filtered only from [`FILTER_BOTH_FAMILIES_FROM`] entries in the namespace
/// (`entries`, read only then), where two walks cost less than serializing every entry;
/// below it, or when the count cannot be read, one unfiltered dump.
fn plan(flows: &[Flows], choice: Choice, entries: impl FnOnce() -> Option<u64>) -> Vec<Dump> {
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|family| flows.iter().any(|f| f.family == *family))
        .collect();
    let filtered = match choice {
        Choice::Filtered | Choice::Refused => true,
        Choice::Unfiltered => false,
        Choice::Adaptive => {
            families.len() < 2 || entries().is_some_and(|n| n >= FILTER_BOTH_FAMILIES_FROM)
        }
    };
    if !filtered {
        return vec![Dump::All];
    }
    families
        .into_iter()
        .map(|family| Dump::Only(Filter::of(family, flows)))
        .collect()
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

fn subsys(message: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | message
}

/// `struct nfgenmsg`: family, version 0 (`NFNETLINK_V0`), resource id 0.
fn genmsg(buf: &mut Vec<u8>, family: u8) {
    buf.extend([family, 0, 0, 0]);
}

fn af(family: Family) -> u8 {
    match family {
        Family::Ipv4 => libc::AF_INET as u8,
        Family::Ipv6 => libc::AF_INET6 as u8,
    }
}

/// GET dump: of every entry of both families, or of one family as `filter` narrows it
/// (a `CTA_FILTER` nest naming the fields of a `CTA_TUPLE_ORIG` that entries must have;
/// none when only the family is). `refusable` adds a flag the kernel refuses.
fn dump_request(seq: u32, dump: Dump, refusable: bool) -> Vec<u8> {
    let mut m = Vec::with_capacity(netlink::HEADER + 64);
    let start = netlink::begin(
        &mut m,
        subsys(IPCTNL_MSG_CT_GET),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    let Dump::Only(filter) = dump else {
        genmsg(&mut m, libc::AF_UNSPEC as u8);
        netlink::finish(&mut m, start);
        return m;
    };
    genmsg(&mut m, af(filter.family));
    let flags = filter.flags() | if refusable { FILTER_F_UNDEFINED } else { 0 };
    if flags != 0 {
        let tuple = netlink::begin_nest(&mut m, CTA_TUPLE_ORIG);
        if let Some(dst) = filter.dst {
            let ip = netlink::begin_nest(&mut m, CTA_TUPLE_IP);
            put_ip(&mut m, End::Dst, dst);
            netlink::end_nest(&mut m, ip);
        }
        if let Some(protocol) = filter.protocol {
            let proto = netlink::begin_nest(&mut m, CTA_TUPLE_PROTO);
            netlink::put_attr(&mut m, CTA_PROTO_NUM, &[protocol]);
            if let Some(port) = filter.dst_port {
                netlink::put_attr(&mut m, CTA_PROTO_DST_PORT, &port.to_be_bytes());
            }
            netlink::end_nest(&mut m, proto);
        }
        netlink::end_nest(&mut m, tuple);
        let nest = netlink::begin_nest(&mut m, CTA_FILTER);
        netlink::put_attr(&mut m, CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
        netlink::end_nest(&mut m, nest);
    }
    netlink::finish(&mut m, start);
    m
}

/// Which address of a tuple.
#[derive(Clone, Copy)]
enum End {
    Src,
    Dst,
}

/// Append `ip` as the `CTA_IP_*` attribute of its family for `end`.
fn put_ip(m: &mut Vec<u8>, end: End, ip: IpAddr) {
    let (v4, v6) = match end {
        End::Src => (CTA_IP_V4_SRC, CTA_IP_V6_SRC),
        End::Dst => (CTA_IP_V4_DST, CTA_IP_V6_DST),
    };
    match ip {
        IpAddr::V4(a) => netlink::put_attr(m, v4, &a.octets()),
        IpAddr::V6(a) => netlink::put_attr(m, v6, &a.octets()),
    }
}

/// Append a DELETE of exactly `entry`: its original tuple (never absent: a delete without a
/// tuple flushes the table), zone and id as dumped, acknowledged.
fn delete_message(m: &mut Vec<u8>, seq: u32, entry: &Entry) {
    let start = netlink::begin(
        m,
        subsys(IPCTNL_MSG_CT_DELETE),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
    );
    genmsg(m, af(Family::of(entry.dst)));
    let tuple = netlink::begin_nest(m, CTA_TUPLE_ORIG);
    let ip = netlink::begin_nest(m, CTA_TUPLE_IP);
    // Both of one family: a parsed entry's are.
    put_ip(m, End::Src, entry.src);
    put_ip(m, End::Dst, entry.dst);
    netlink::end_nest(m, ip);
    let proto = netlink::begin_nest(m, CTA_TUPLE_PROTO);
    netlink::put_attr(m, CTA_PROTO_NUM, &[entry.protocol]);
    netlink::put_attr(m, CTA_PROTO_SRC_PORT, &entry.src_port.to_be_bytes());
    netlink::put_attr(m, CTA_PROTO_DST_PORT, &entry.dst_port.to_be_bytes());
    netlink::end_nest(m, proto);
    if let Some(zone) = entry.tuple_zone {
        netlink::put_attr(m, CTA_TUPLE_ZONE, &zone.to_be_bytes());
    }
    netlink::end_nest(m, tuple);
    if let Some(zone) = entry.zone {
        netlink::put_attr(m, CTA_ZONE, &zone.to_be_bytes());
    }
    if let Some(id) = entry.id {
        netlink::put_attr(m, CTA_ID, &id.to_be_bytes());
    }
    netlink::finish(m, start);
}

/// A dumped entry (the payload after `nlmsghdr`): `None` unless it is IPv4 or IPv6 with
/// both addresses and both ports in its original tuple (ICMP, GRE and the like have none,
/// and natledger never forgets them).
pub fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let family = *payload.first()?;
    let body = payload.get(4..)?;
    let tuple = netlink::attr(body, CTA_TUPLE_ORIG)?;
    let ip = netlink::attr(tuple, CTA_TUPLE_IP)?;
    let (src, dst) = if family == libc::AF_INET as u8 {
        let addr = |kind| -> Option<IpAddr> {
            let octets: [u8; 4] = netlink::attr(ip, kind)?.try_into().ok()?;
            Some(Ipv4Addr::from(octets).into())
        };
        (addr(CTA_IP_V4_SRC)?, addr(CTA_IP_V4_DST)?)
    } else if family == libc::AF_INET6 as u8 {
        let addr = |kind| -> Option<IpAddr> {
            let octets: [u8; 16] = netlink::attr(ip, kind)?.try_into().ok()?;
            Some(Ipv6Addr::from(octets).into())
        };
        (addr(CTA_IP_V6_SRC)?, addr(CTA_IP_V6_DST)?)
    } else {
        return None;
    };
    let proto = netlink::attr(tuple, CTA_TUPLE_PROTO)?;
    let be16 = |data: &[u8]| Some(u16::from_be_bytes(data.try_into().ok()?));
    let protocol = *netlink::attr(proto, CTA_PROTO_NUM)?.first()?;
    let src_port = netlink::attr(proto, CTA_PROTO_SRC_PORT).and_then(be16)?;
    let dst_port = netlink::attr(proto, CTA_PROTO_DST_PORT).and_then(be16)?;
    Some(Entry {
        protocol,
        src,
        dst,
        src_port,
        dst_port,
        zone: netlink::attr(body, CTA_ZONE).and_then(be16),
        tuple_zone: netlink::attr(tuple, CTA_TUPLE_ZONE).and_then(be16),
        id: netlink::attr(body, CTA_ID).and_then(|d| Some(u32::from_be_bytes(d.try_into().ok()?))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entry(protocol: u8, src: &str, dst: &str, dst_port: u16) -> Entry {
        Entry {
            protocol,
            src: ip(src),
            dst: ip(dst),
            src_port: 40000,
            dst_port,
            zone: None,
            tuple_zone: None,
            id: Some(7),
        }
    }

    fn flows(family: Family, protocol: Protocol, ports: (u16, u16), host: Option<&str>) -> Flows {
        Flows {
            family,
            protocol,
            ports: PortRange {
                start: ports.0,
                end: ports.1,
            },
            host: host.map(ip),
        }
    }

    /// A dump answer as the kernel writes it: nested flags set, the reply tuple and other
    /// attributes around the ones read, counters and status in network byte order.
    fn kernel_entry(e: &Entry, icmp: bool) -> Vec<u8> {
        let mut p = Vec::new();
        genmsg(&mut p, af(Family::of(e.dst)));
        for (kind, (src, dst, sport, dport)) in [
            (CTA_TUPLE_ORIG, (e.src, e.dst, e.src_port, e.dst_port)),
            (2, (e.dst, e.src, e.dst_port, e.src_port)), // CTA_TUPLE_REPLY
        ] {
            let tuple = netlink::begin_nest(&mut p, kind);
            let nest = netlink::begin_nest(&mut p, CTA_TUPLE_IP);
            put_ip(&mut p, End::Src, src);
            put_ip(&mut p, End::Dst, dst);
            netlink::end_nest(&mut p, nest);
            let nest = netlink::begin_nest(&mut p, CTA_TUPLE_PROTO);
            netlink::put_attr(&mut p, CTA_PROTO_NUM, &[e.protocol]);
            if icmp {
                netlink::put_attr(&mut p, 4, &1u16.to_be_bytes()); // CTA_PROTO_ICMP_ID
                netlink::put_attr(&mut p, 5, &[8]); // CTA_PROTO_ICMP_TYPE
            } else {
                netlink::put_attr(&mut p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
                netlink::put_attr(&mut p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
            }
            netlink::end_nest(&mut p, nest);
            if kind == CTA_TUPLE_ORIG
                && let Some(zone) = e.tuple_zone
            {
                netlink::put_attr(&mut p, CTA_TUPLE_ZONE, &zone.to_be_bytes());
            }
            netlink::end_nest(&mut p, tuple);
        }
        if let Some(zone) = e.zone {
            netlink::put_attr(&mut p, CTA_ZONE, &zone.to_be_bytes());
        }
        netlink::put_attr(&mut p, 3, &0x18eu32.to_be_bytes()); // CTA_STATUS
        netlink::put_attr(&mut p, 7, &117u32.to_be_bytes()); // CTA_TIMEOUT
        if let Some(id) = e.id {
            netlink::put_attr(&mut p, CTA_ID, &id.to_be_bytes());
        }
        netlink::put_attr(&mut p, 11, &1u32.to_be_bytes()); // CTA_USE
        p
    }

    #[test]
    fn parses_the_original_tuple_zone_and_id_of_either_family() {
        let mut v4 = entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353);
        v4.src_port = 0xa1b2;
        v4.id = Some(0xdead_beef);
        assert_eq!(parse_entry(&kernel_entry(&v4, false)), Some(v4));

        let mut v6 = entry(IPPROTO_SCTP, "fd78::2", "fd78::1", 0x1234);
        v6.zone = Some(0x0102);
        assert_eq!(parse_entry(&kernel_entry(&v6, false)), Some(v6));

        let mut directional = entry(IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 80);
        directional.tuple_zone = Some(9);
        directional.id = None;
        assert_eq!(
            parse_entry(&kernel_entry(&directional, false)),
            Some(directional)
        );
    }

    #[test]
    fn entries_without_ports_or_of_other_families_are_not_read() {
        let icmp = entry(1, "10.0.0.1", "10.0.0.2", 0);
        assert_eq!(parse_entry(&kernel_entry(&icmp, true)), None);
        let mut other = kernel_entry(&entry(IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 53), false);
        other[0] = libc::AF_BRIDGE as u8;
        assert_eq!(parse_entry(&other), None);
        // IPv4 addresses in a message that claims IPv6.
        let mut mixed = kernel_entry(&entry(IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 53), false);
        mixed[0] = libc::AF_INET6 as u8;
        assert_eq!(parse_entry(&mixed), None);
        assert_eq!(parse_entry(&[]), None);
        assert_eq!(parse_entry(&[2, 0, 0, 0]), None);
    }

    #[test]
    fn a_dump_asks_for_every_entry_of_both_families() {
        let m = dump_request(5, Dump::All, false);
        let message = netlink::messages(&m).next().unwrap().unwrap();
        assert_eq!(message.kind, 0x0101);
        assert_eq!(message.seq, 5);
        assert_eq!(message.payload, [libc::AF_UNSPEC as u8, 0, 0, 0]);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_DUMP);
    }

    /// A delete names exactly the dumped entry: what the kernel would parse back out of it
    /// is the entry itself. And it always carries a tuple (without one it is a flush).
    #[test]
    fn a_delete_names_the_dumped_tuple_zone_and_id() {
        let mut zoned = entry(IPPROTO_UDP, "fd78::2", "fd78::1", 5353);
        zoned.zone = Some(3);
        let mut directional = entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353);
        directional.tuple_zone = Some(4);
        directional.id = None;
        let plain = entry(IPPROTO_SCTP, "10.78.0.2", "127.0.0.1", 7000);
        let mut m = Vec::new();
        for (seq, e) in (20..).zip([&zoned, &directional, &plain]) {
            delete_message(&mut m, seq, e);
        }
        let messages: Vec<_> = netlink::messages(&m).map(Result::unwrap).collect();
        assert_eq!(messages.len(), 3);
        for (message, (seq, e)) in messages.iter().zip((20..).zip([zoned, directional, plain])) {
            assert_eq!(message.kind, 0x0102);
            assert_eq!(message.seq, seq);
            assert!(netlink::attr(&message.payload[4..], CTA_TUPLE_ORIG).is_some());
            assert_eq!(parse_entry(message.payload), Some(e), "{e:?}");
        }
        let flags = u16::from_ne_bytes([m[6], m[7]]);
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(messages[0].payload[0], libc::AF_INET6 as u8);
        assert_eq!(messages[1].payload[0], libc::AF_INET as u8);
        // Nested attributes are marked so (the tuple's type field on the wire).
        let tuple_type = u16::from_ne_bytes([messages[2].payload[6], messages[2].payload[7]]);
        assert_eq!(tuple_type, CTA_TUPLE_ORIG | netlink::NLA_F_NESTED);
        // The zone goes beside the tuple only when it was dumped there.
        assert!(netlink::attr(&messages[0].payload[4..], CTA_ZONE).is_some());
        assert!(netlink::attr(&messages[1].payload[4..], CTA_ZONE).is_none());
    }

    #[test]
    fn a_flow_matches_its_protocol_family_ports_and_address() {
        let locals = LocalAddrs::new(vec![ip("10.78.0.1"), ip("10.77.0.1"), ip("fd78::1")]);
        let udp53 = [flows(Family::Ipv4, Protocol::Udp, (5353, 5353), None)];
        let m = |e: Entry, f: &[Flows]| matches(&e, f, &locals);
        // Any local destination, loopback net included.
        for dst in ["10.78.0.1", "10.77.0.1", "127.0.0.1", "127.3.2.1"] {
            assert!(
                m(entry(IPPROTO_UDP, "10.78.0.2", dst, 5353), &udp53),
                "{dst}"
            );
        }
        // Forwarded through the node: not local, never natledger's.
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "8.8.8.8", 5353), &udp53));
        assert!(!m(
            entry(IPPROTO_UDP, "10.78.0.2", "10.77.0.2", 5353),
            &udp53
        ));
        // Other port, protocol, family.
        assert!(!m(
            entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5354),
            &udp53
        ));
        assert!(!m(
            entry(IPPROTO_TCP, "10.78.0.2", "10.78.0.1", 5353),
            &udp53
        ));
        assert!(!m(
            entry(IPPROTO_SCTP, "10.78.0.2", "10.78.0.1", 5353),
            &udp53
        ));
        assert!(!m(entry(IPPROTO_UDP, "fd78::2", "fd78::1", 5353), &udp53));
        assert!(!m(entry(IPPROTO_UDP, "fd78::2", "::1", 5353), &udp53));

        // A range, bounds included, IPv6.
        let range = [flows(Family::Ipv6, Protocol::Sctp, (7000, 7002), None)];
        for (port, hit) in [(6999, false), (7000, true), (7002, true), (7003, false)] {
            let e = entry(IPPROTO_SCTP, "fd78::2", "fd78::1", port);
            assert_eq!(m(e, &range), hit, "{port}");
        }
        assert!(m(entry(IPPROTO_SCTP, "fd78::2", "::1", 7001), &range));
        assert!(!m(entry(IPPROTO_SCTP, "fd78::2", "fd78::9", 7001), &range));

        // An explicit host address: only it, local or not.
        let bound = [flows(
            Family::Ipv4,
            Protocol::Udp,
            (53, 53),
            Some("10.77.0.1"),
        )];
        assert!(m(entry(IPPROTO_UDP, "10.78.0.2", "10.77.0.1", 53), &bound));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 53), &bound));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "127.0.0.1", 53), &bound));
        // An unspecified host address means every local address of its family.
        let any = [flows(
            Family::Ipv4,
            Protocol::Udp,
            (53, 53),
            Some("0.0.0.0"),
        )];
        assert!(m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 53), &any));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "0.0.0.0", 53), &any));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "8.8.8.8", 53), &any));

        // TCP only when a flow asks for TCP; several flows: any one.
        let both = [udp53[0], flows(Family::Ipv4, Protocol::Tcp, (80, 80), None)];
        assert!(m(entry(IPPROTO_TCP, "10.78.0.2", "10.78.0.1", 80), &both));
        assert!(m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353), &both));
        assert!(!m(
            entry(IPPROTO_TCP, "10.78.0.2", "10.78.0.1", 5353),
            &both
        ));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 80), &both));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353), &[]));
    }

    /// What the kernel would parse out of a dump request.
    #[derive(Debug, PartialEq, Eq)]
    struct Asked {
        family: u8,
        /// `CTA_FILTER_ORIG_FLAGS`, if there is a `CTA_FILTER`.
        flags: Option<u32>,
        /// The original tuple's destination address, protocol and destination port.
        dst: Option<Vec<u8>>,
        protocol: Option<u8>,
        port: Option<u16>,
    }

    fn asked(request: &[u8]) -> Asked {
        let message = netlink::messages(request).next().unwrap().unwrap();
        assert_eq!(message.kind, 0x0101);
        let body = &message.payload[4..];
        let tuple = netlink::attr(body, CTA_TUPLE_ORIG);
        let ip = tuple.and_then(|t| netlink::attr(t, CTA_TUPLE_IP));
        let proto = tuple.and_then(|t| netlink::attr(t, CTA_TUPLE_PROTO));
        Asked {
            family: message.payload[0],
            flags: netlink::attr(body, CTA_FILTER)
                .and_then(|f| netlink::attr(f, CTA_FILTER_ORIG_FLAGS))
                .map(|d| u32::from_ne_bytes(d.try_into().unwrap())),
            dst: ip
                .and_then(|ip| {
                    netlink::attr(ip, CTA_IP_V4_DST).or_else(|| netlink::attr(ip, CTA_IP_V6_DST))
                })
                .map(<[u8]>::to_vec),
            protocol: proto
                .and_then(|p| netlink::attr(p, CTA_PROTO_NUM))
                .map(|d| d[0]),
            port: proto
                .and_then(|p| netlink::attr(p, CTA_PROTO_DST_PORT))
                .map(|d| u16::from_be_bytes(d.try_into().unwrap())),
        }
    }

    fn only(dump: &Dump) -> Filter {
        match dump {
            Dump::Only(filter) => *filter,
            Dump::All => panic!("an unfiltered dump"),
        }
    }

    /// The narrowest filter every flow of a family passes: a protocol they all share, a port
    /// they all are (then only), an IPv4 host address they all name; never an IPv6 address.
    #[test]
    fn a_filter_names_what_all_flows_of_its_family_share() {
        let v4 = Family::Ipv4;
        let udp53 = flows(v4, Protocol::Udp, (53, 53), None);
        let filter = |f: &[Flows], family| Filter::of(family, f);
        assert_eq!(
            filter(&[udp53], v4),
            Filter {
                family: v4,
                protocol: Some(IPPROTO_UDP),
                dst_port: Some(53),
                dst: None,
            }
        );
        // A range, or two ports: the protocol alone.
        let range = flows(v4, Protocol::Udp, (53, 54), None);
        assert_eq!(filter(&[range], v4).dst_port, None);
        let udp80 = flows(v4, Protocol::Udp, (80, 80), None);
        assert_eq!(filter(&[udp53, udp80], v4).dst_port, None);
        assert_eq!(filter(&[udp53, udp80], v4).protocol, Some(IPPROTO_UDP));
        // Two protocols: the family alone, so no port either, even one they share.
        let sctp53 = flows(v4, Protocol::Sctp, (53, 53), None);
        let family_only = filter(&[udp53, sctp53], v4);
        assert_eq!((family_only.protocol, family_only.dst_port), (None, None));
        assert_eq!(family_only.flags(), 0);
        // One IPv4 host address for all: it; two, or one flow without: none.
        let bound = flows(v4, Protocol::Udp, (53, 53), Some("10.77.0.1"));
        let other = flows(v4, Protocol::Udp, (80, 80), Some("10.77.0.2"));
        let any = flows(v4, Protocol::Udp, (80, 80), Some("0.0.0.0"));
        assert_eq!(filter(&[bound], v4).dst, Some(ip("10.77.0.1")));
        assert_eq!(filter(&[bound, other], v4).dst, None);
        assert_eq!(filter(&[bound, udp53], v4).dst, None);
        assert_eq!(filter(&[bound, any], v4).dst, None);
        assert_eq!(
            filter(&[bound], v4).flags(),
            FILTER_F_PROTO_NUM | FILTER_F_PROTO_DST_PORT | FILTER_F_IP_DST
        );
        // IPv6: never an address (the kernel's comparison is inverted).
        let v6 = flows(Family::Ipv6, Protocol::Udp, (53, 53), Some("fd78::1"));
        let f6 = filter(&[v6], Family::Ipv6);
        assert_eq!(
            (f6.protocol, f6.dst_port, f6.dst),
            (Some(IPPROTO_UDP), Some(53), None)
        );
        // Only the family's own flows count.
        assert_eq!(filter(&[v6, udp53], v4), filter(&[udp53], v4));
    }

    /// The choice: one family, always filtered (the count is not even read); both, filtered
    /// from the threshold on, else (and when the count is unknown) one dump of everything.
    /// Forced choices override it.
    #[test]
    fn the_dumps_are_chosen_by_families_and_entry_count() {
        let udp4 = flows(Family::Ipv4, Protocol::Udp, (53, 53), None);
        let sctp4 = flows(Family::Ipv4, Protocol::Sctp, (9000, 9002), None);
        let udp6 = flows(Family::Ipv6, Protocol::Udp, (53, 53), None);
        let unread = || -> Option<u64> { panic!("the count is read only for both families") };
        let one = plan(&[udp4, sctp4], Choice::Adaptive, unread);
        assert_eq!(one, [Dump::Only(Filter::of(Family::Ipv4, &[udp4, sctp4]))]);
        assert_eq!(
            plan(&[udp6], Choice::Adaptive, unread),
            [Dump::Only(Filter::of(Family::Ipv6, &[udp6]))]
        );

        let both = [udp6, udp4];
        let at = |n: Option<u64>| plan(&both, Choice::Adaptive, || n);
        assert_eq!(at(Some(0)), [Dump::All]);
        assert_eq!(at(Some(FILTER_BOTH_FAMILIES_FROM - 1)), [Dump::All]);
        assert_eq!(at(None), [Dump::All]);
        let filtered = at(Some(FILTER_BOTH_FAMILIES_FROM));
        assert_eq!(filtered.len(), 2);
        assert_eq!(only(&filtered[0]).family, Family::Ipv4);
        assert_eq!(only(&filtered[1]).family, Family::Ipv6);
        assert_eq!(only(&filtered[1]).dst_port, Some(53));
        assert_eq!(at(Some(1_000_000)), filtered);

        assert_eq!(plan(&both, Choice::Filtered, unread), filtered);
        assert_eq!(plan(&both, Choice::Refused, unread), filtered);
        assert_eq!(plan(&[udp4], Choice::Unfiltered, unread), [Dump::All]);
        assert!(plan(&[], Choice::Adaptive, unread).is_empty());
    }

    /// A filtered dump carries its family and, when it narrows more, the tuple fields and
    /// their flags; a family alone needs no `CTA_FILTER`. The refusable request adds the
    /// undefined flag, even to a family alone.
    #[test]
    fn a_filtered_dump_request_names_family_tuple_and_flags() {
        let bound = Filter::of(
            Family::Ipv4,
            &[flows(
                Family::Ipv4,
                Protocol::Udp,
                (5353, 5353),
                Some("10.77.0.1"),
            )],
        );
        assert_eq!(
            asked(&dump_request(3, Dump::Only(bound), false)),
            Asked {
                family: libc::AF_INET as u8,
                flags: Some(0b10_1010),
                dst: Some(vec![10, 77, 0, 1]),
                protocol: Some(IPPROTO_UDP),
                port: Some(5353),
            }
        );

        let sctp6 = Filter::of(
            Family::Ipv6,
            &[flows(
                Family::Ipv6,
                Protocol::Sctp,
                (7000, 7002),
                Some("fd78::1"),
            )],
        );
        assert_eq!(
            asked(&dump_request(3, Dump::Only(sctp6), false)),
            Asked {
                family: libc::AF_INET6 as u8,
                flags: Some(FILTER_F_PROTO_NUM),
                dst: None,
                protocol: Some(IPPROTO_SCTP),
                port: None,
            }
        );

        let family_only = Filter {
            family: Family::Ipv4,
            protocol: None,
            dst_port: None,
            dst: None,
        };
        let m = dump_request(3, Dump::Only(family_only), false);
        assert_eq!(m.len(), netlink::HEADER + 4);
        assert_eq!(asked(&m).family, libc::AF_INET as u8);
        let refusable = |filter| asked(&dump_request(3, Dump::Only(filter), true)).flags;
        assert_eq!(refusable(family_only), Some(FILTER_F_UNDEFINED));
        assert_eq!(refusable(bound), Some(0b10_1010 | FILTER_F_UNDEFINED));
        // The unfiltered dump stays as it was, refusable or not.
        assert_eq!(
            dump_request(3, Dump::All, true),
            dump_request(3, Dump::All, false)
        );
    }

    #[test]
    fn only_a_refused_filter_falls_back() {
        let refusal = |errno| refused(&io::Error::from_raw_os_error(errno));
        assert!(refusal(libc::EOPNOTSUPP));
        assert!(refusal(libc::EINVAL));
        for errno in [libc::ENOBUFS, libc::EPERM, libc::ENOENT, libc::EBUSY] {
            assert!(!refusal(errno), "{errno}");
        }
        assert!(!refused(&io::Error::other("truncated netlink message")));
    }

    #[test]
    fn no_flows_need_no_socket_work() {
        // forget with nothing to forget returns before touching the socket: a socket of
        // any protocol will do, and nothing is sent on it.
        let mut sock = Socket::open(nix::sys::socket::SockProtocol::NetlinkRoute).unwrap();
        assert_eq!(forget(&mut sock, &[]).unwrap(), 0);
        assert_eq!(sock.next_seq(), 1);
    }
}
