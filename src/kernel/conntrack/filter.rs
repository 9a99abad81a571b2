//! The kernel's dump filter: which dumps [`super::forget`] sends (see "The kernel's dump
//! filter" and "Cost" in the module comment).

use std::io;
use std::net::IpAddr;

use super::{COUNT_FILE, Flows};
use crate::model::family::Family;

/// `CTA_FILTER_F_*`: the fields of a dump request's `CTA_TUPLE_ORIG` that an entry's original
/// tuple must have to be dumped. Kernel-internal (`net/netfilter/nf_internals.h`): the uapi
/// header names only the attributes.
pub(super) const FILTER_F_IP_DST: u32 = 1 << 1;
pub(super) const FILTER_F_PROTO_NUM: u32 = 1 << 3;
pub(super) const FILTER_F_PROTO_DST_PORT: u32 = 1 << 5;
/// A flag no kernel defines, which kernels with `CTA_FILTER` refuse (6.18: `EINVAL`; the
/// 5.9 code: `EOPNOTSUPP`): how [`DUMP_ENV`]`=refused` makes the fallback run.
pub(super) const FILTER_F_UNDEFINED: u32 = 1 << 31;

/// From this many entries in the namespace on, flows of both families are looked for with
/// two filtered dumps (two walks of the hash table, next to nothing serialized) rather than
/// one unfiltered dump (one walk, every entry serialized): where both cost the same, between
/// 4,300 (mostly TCP) and 5,500 (mostly UDP) entries measured. See "Cost" above.
pub const FILTER_BOTH_FAMILIES_FROM: u64 = 5_000;

/// For tests and measurements only: forces how [`forget`] dumps. `filtered`: one filtered
/// dump per family, whatever the entry count; `unfiltered`: one dump of everything;
/// `refused`: filtered requests every kernel refuses, so that the fallback to one dump of
/// everything runs. Unset (or anything else), [`forget`] chooses. Read once, at start
/// (`entry::settings`), and passed to [`forget`] as a [`Choice`].
#[doc(hidden)]
pub const DUMP_ENV: &str = "NATLEDGER_CONNTRACK_DUMP";

/// Whether a dump's error is the kernel refusing the request's filter, before any entry:
/// kernels from 5.9 (`CTA_FILTER`) answer `EOPNOTSUPP` or `EINVAL` to flags or a tuple they
/// do not take. Kernels before 5.9 ignore `CTA_FILTER` and its tuple: they dump the whole
/// family, which [`matches()`] judges as ever.
pub(super) fn refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL))
}

/// The calling thread's network namespace's number of conntrack entries (`None`: not a
/// number); `NotFound` where the namespace has no conntrack table.
pub(super) fn entry_count() -> io::Result<Option<u64>> {
    Ok(std::fs::read_to_string(COUNT_FILE)?.trim().parse().ok())
}

/// How [`forget`](super::forget) chooses its dumps: by `plan`'s rule, or as [`DUMP_ENV`] forces.
/// Resolved once from [`DUMP_ENV`] (`entry::settings`) and passed to each `forget`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Choice {
    #[default]
    Adaptive,
    Filtered,
    Unfiltered,
    /// Filtered, with a flag the kernel refuses: the fallback on demand.
    Refused,
}

/// One dump request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dump {
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
pub(super) struct Filter {
    pub(super) family: Family,
    pub(super) protocol: Option<u8>,
    /// Only with `protocol`: the kernel refuses port flags without the protocol's. It compares
    /// ports of TCP and UDP entries only (6.18): an SCTP entry passes whatever its port.
    pub(super) dst_port: Option<u16>,
    /// IPv4 only: the kernel's IPv6 address comparison is inverted (`!ipv6_addr_cmp`, from
    /// 5.9 to 6.18 at least: asked for fd78::1, 6.18 dumps every address but fd78::1).
    pub(super) dst: Option<IpAddr>,
}

impl Filter {
    /// The narrowest filter that every entry of `flows` of `family` passes: what all of them
    /// share.
    pub(super) fn of(family: Family, flows: &[Flows]) -> Filter {
        let mine = || flows.iter().filter(move |f| f.family == family);
        let protocol = shared(mine().map(|f| Some(f.protocol.number())));
        let port = |f: &Flows| (f.ports.start == f.ports.end).then_some(f.ports.start);
        Filter {
            family,
            protocol,
            dst_port: protocol.and(shared(mine().map(port))),
            dst: shared(mine().map(Flows::exact_host)).filter(IpAddr::is_ipv4),
        }
    }

    /// `CTA_FILTER_ORIG_FLAGS`: the fields given.
    pub(super) fn flags(&self) -> u32 {
        let flag = |given: bool, flag: u32| if given { flag } else { 0 };
        flag(self.protocol.is_some(), FILTER_F_PROTO_NUM)
            | flag(self.dst_port.is_some(), FILTER_F_PROTO_DST_PORT)
            | flag(self.dst.is_some(), FILTER_F_IP_DST)
    }
}

/// The value every item has, if they all have the same one (and there is one).
pub(super) fn shared<T: Copy + PartialEq>(
    mut values: impl Iterator<Item = Option<T>>,
) -> Option<T> {
    let first = values.next()??;
    values.all(|v| v == Some(first)).then_some(first)
}

/// The dumps one [`forget`] of `flows` sends. The kernel's filter needs a family, so
/// filtered means one dump, one walk of the whole hash table, per family of the flows.
/// Flows of one family: always filtered (the same one walk, less serialized). Of both
/// families: filtered only from [`FILTER_BOTH_FAMILIES_FROM`] entries in the namespace
/// (`entries`, read only then), where two walks cost less than serializing every entry;
/// below it, or when the count cannot be read, one unfiltered dump.
pub(super) fn plan(
    flows: &[Flows],
    choice: Choice,
    entries: impl FnOnce() -> Option<u64>,
) -> Vec<Dump> {
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
