//! The way out of every operation that may have changed rules, written once
//! ([`after_writes`]): the flows that would stay on an old path forgotten
//! ([`flows::forget`]), the forwards cache carried over natledger's own transactions
//! ([`forwards::carry`]) when the operation noted the generation before them, and the netlink
//! socket released ([`crate::backend::Netfilter::release_socket`]). Create (`create::after`),
//! a stop (`remove`: poststop, a CNI DEL or GC) and sweep end with it.

use std::path::Path;

use crate::analysis::forwards;
use crate::kernel::conntrack::Flows;

use super::{Context, flows};

/// The forwards cache to carry over natledger's own writes: where it is, and the generation
/// noted before them (`None`: nothing was cached, or the direct paths are off).
pub(super) struct Carry<'a> {
    pub cache: &'a Path,
    pub before: Option<forwards::Before>,
}

/// Forget `stale_flows`, carry the forwards cache (when `carry` says where, else leave it to
/// be read again), release the netlink socket; in this order, on every way out.
pub(super) fn after_writes(ctx: &Context, stale_flows: &[Flows], carry: Option<Carry>) {
    flows::forget(ctx, stale_flows);
    if let Some(Carry { cache, before }) = carry {
        forwards::carry(&ctx.netfilter, cache, before);
    }
    ctx.netfilter.release_socket();
}
