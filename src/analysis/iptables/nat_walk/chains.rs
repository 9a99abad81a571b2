//! Where a walk reads a table's chains from: the [`Chains`] trait, a parsed dump
//! ([`Saved`]), and any source read once for several packets ([`Memo`]).

use std::collections::HashMap;

use super::may_take;
use crate::analysis::iptables::packet::Packet;
use crate::model::save::{ChainIndex, Dump};

/// The rules of a chain a walk kept, with their 1-based positions.
pub type Kept = Vec<(usize, Vec<String>)>;

/// The rules of one table, chain by chain, as the walk asks for them.
pub trait Chains {
    type Error;
    /// The rules of `chain` that `keep` keeps, in order, with their positions; `None` when
    /// there is no such chain.
    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error>;
}

/// A parsed dump as a walk reads it, its chains indexed once.
pub struct Saved<'t> {
    table: &'t Dump,
    index: ChainIndex<'t>,
}

impl<'t> Saved<'t> {
    pub fn new(table: &'t Dump) -> Saved<'t> {
        Saved {
            table,
            index: table.index(),
        }
    }
}

impl Chains for Saved<'_> {
    type Error = std::convert::Infallible;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        let Some(indices) = self.index.rules(chain) else {
            return Ok(None);
        };
        Ok(Some(
            indices
                .iter()
                .map(|&i| &self.table.rules[i])
                .enumerate()
                .filter(|(_, r)| keep(&r.args))
                .map(|(i, r)| (i + 1, r.args.clone()))
                .collect(),
        ))
    }
}

/// Another source's chains, each read once for the walks of several packets (one per
/// mapping): it keeps the rules any of `packets` may match, and each walk's own `keep`
/// narrows them. Reading a chain is the cost (over netlink, quadratic in its length), so a
/// container with five mappings does not read kube-proxy's KUBE-SERVICES five times.
pub struct Memo<'c, 'p, C> {
    inner: &'c mut C,
    packets: &'p [Packet],
    read: HashMap<String, Option<Kept>>,
}

impl<'c, 'p, C> Memo<'c, 'p, C> {
    pub fn new(inner: &'c mut C, packets: &'p [Packet]) -> Self {
        Memo {
            inner,
            packets,
            read: HashMap::new(),
        }
    }
}

impl<C: Chains> Chains for Memo<'_, '_, C> {
    type Error = C::Error;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        if !self.read.contains_key(chain) {
            let packets = self.packets;
            let mut any = |args: &[String]| packets.iter().any(|p| may_take(args, p));
            let rules = self.inner.rules(chain, &mut any)?;
            self.read.insert(chain.to_string(), rules);
        }
        Ok(self.read[chain].as_ref().map(|kept| {
            kept.iter()
                .filter(|(_, args)| keep(args))
                .cloned()
                .collect()
        }))
    }
}
