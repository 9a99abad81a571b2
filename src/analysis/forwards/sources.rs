//! Where a walk reads rules from, besides a `save::Dump`: the iptables-legacy blob and
//! iptables-nft over netlink.

use std::collections::HashMap;

use crate::analysis::iptables::nat_walk::{Chains, HOOKS, Kept};
use crate::kernel::iptc;
use crate::kernel::nftables::{self, NftError};
use crate::model::family::Family;
use crate::model::layout::NAT;
use crate::model::rule::IpNet;

/// An iptables-legacy table blob, decoded chain by chain ([`iptc::render`]); entries whose
/// header names a destination none of `dsts` is in are skipped undecoded.
pub(super) struct Legacy<'b> {
    blob: &'b iptc::blob::Blob,
    dsts: &'b [IpNet],
    /// The user chains, found in one pass when the walk first asks for one.
    spans: Option<HashMap<&'b str, iptc::blob::Span>>,
}

impl<'b> Legacy<'b> {
    pub(super) fn new(blob: &'b iptc::blob::Blob, dsts: &'b [IpNet]) -> Legacy<'b> {
        Legacy {
            blob,
            dsts,
            spans: None,
        }
    }

    fn span(&mut self, chain: &str) -> Option<iptc::blob::Span> {
        if HOOKS.contains(&chain) {
            return self.blob.chain(chain);
        }
        let blob = self.blob;
        let spans = self.spans.get_or_insert_with(|| blob.user_chain_spans());
        spans.get(chain).copied()
    }
}

impl Chains for Legacy<'_> {
    type Error = std::convert::Infallible;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        let Some(span) = self.span(chain) else {
            return Ok(None);
        };
        let mut kept = Vec::new();
        let mut args = Vec::with_capacity(16);
        for (i, (at, e)) in self.blob.rules(span).enumerate() {
            if !iptc::render::may_be_for(self.blob, e, self.dsts) {
                continue;
            }
            args.clear();
            iptc::render::rule_args(self.blob, at, e, &mut args);
            if keep(&args) {
                kept.push((i + 1, args.clone()));
            }
        }
        Ok(Some(kept))
    }
}

/// An iptables-nft table, read over netlink one chain at a time ([`crate::kernel::nftables`]);
/// rules whose destination compare names none of `dsts` are skipped undecoded.
pub(super) struct Nft<'s, 'k, 'd> {
    pub(super) session: &'s mut nftables::Session<'k>,
    pub(super) family: Family,
    pub(super) dsts: &'d [IpNet],
}

impl Chains for Nft<'_, '_, '_> {
    type Error = NftError;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        let mut kept = Vec::new();
        let dsts = Some(self.dsts);
        let read = self
            .session
            .each_rule(self.family, NAT, chain, dsts, |position, _, args| {
                if keep(args) {
                    kept.push((position, args.to_vec()));
                }
            })?;
        Ok(read.map(|_| kept))
    }
}
