//! Any owner's nf_tables ruleset over netlink, every family, decoded into the analysis model
//! ([`crate::model::ruleset`]): tables, chains (hook, priority, type, policy), rules (handle,
//! comment, statements), named sets and maps with their elements. iptables-nft's tables are
//! nf_tables tables too and are read with the rest (their xtables matches and targets are
//! `Stmt::Other`; an xtables `comment` match is the rule's comment).
//!
//! # One generation
//! The ruleset is read with one dump of every family per kind, in the order each needs the one
//! before (tables; sets, then one element dump per set, anonymous ones included; chains;
//! rules), between two `NFT_MSG_GETGEN`s: when the generation moved meanwhile (anyone
//! committed a transaction), the whole read is done again, at most [`TRIES`] times. What is
//! returned is the ruleset of exactly the returned generation. Most of a big read's time is
//! the kernel's (each 32 KiB of a set's dump walks its hash from the start; each element dump
//! finds its set by name), not the decoding.
//!
//! # Decoding
//! `dump.rs` decodes each message; `expr.rs` follows the registers of a rule's expressions
//! (loads of payload, meta, ct, fib, numgen, immediate data; concatenations over consecutive
//! 32-bit registers; bitwise masks, `expr/compare.rs`) into the statements they add up to
//! (`cmp`, `range`, `lookup`, verdicts, `nat`, `masq`, `redir`, `reject`, effects);
//! `types.rs` decodes values (set elements, compared data) by the set's declared key types or
//! the loaded field. What is not modelled becomes
//! [`Stmt::Other`](crate::model::ruleset::Stmt::Other) or
//! [`Key::Other`](crate::model::ruleset::Key::Other): never narrower than the kernel.
//! Anonymous sets (`__set0`, `__map1`) are folded into the rules that use them, as `nft`
//! prints them; named sets are the table's [`Set`]s. Not named
//! as nft names them: `iif`/`oif` (an interface index, `Value::Int`), host-order integers in
//! interval sets (a mark range).

mod dump;
mod expr;
#[cfg(test)]
mod tests;
mod types;

use std::collections::HashMap;
use std::io;

use dump::RawElement;

use super::wire::NFT_MSG_GETTABLE;
use super::wire::{NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM};
use super::{NftError, Session};
use crate::kernel::netlink;
use crate::model::ruleset::{NftTable, Ruleset, Set, TableFamily};

/// How many reads in a row may find the generation moved before the read gives up.
pub const TRIES: usize = 5;

/// The whole nf_tables ruleset of the session's network namespace and the generation it is
/// the ruleset of.
pub fn read(session: &mut Session<'_>) -> Result<(Ruleset, u32), NftError> {
    read_tables(session, &|_, _| true, usize::MAX)
}

/// The tables `keep` (given each table's family and name) chooses, whole, and the
/// generation they are of. The rules of the others are not read at all (one dump per kept
/// table): create's check of other owners' native forwards leaves out iptables-nft's tables
/// (read chain by chain by the iptables walk: kube-proxy's 10,000 rules there cost 55-85 ms
/// a read) and natledger's own.
///
/// Each set's elements are one dump, and the kernel finds the set by a walk of its table's
/// sets: kube-proxy's nftables mode has an anonymous verdict map per Service, and 5,000 of
/// them cost 740 ms a read. More than `max_sets` sets in the kept tables is
/// [`NftError::TooManySets`], found by one dump of the sets, before any element is read.
pub fn read_tables(
    session: &mut Session<'_>,
    keep: &dyn Fn(TableFamily, &str) -> bool,
    max_sets: usize,
) -> Result<(Ruleset, u32), NftError> {
    let mut generation = session.generation()?;
    for _ in 0..TRIES {
        let ruleset = read_once(session, keep, max_sets)?;
        let after = session.generation()?;
        if after == generation {
            return Ok((ruleset, generation));
        }
        log::debug!("nf_tables generation {generation} became {after} during a read: again");
        generation = after;
    }
    Err(NftError::Unsettled { tries: TRIES })
}

/// A set as read, with what decoding its elements and the lookups into it needs.
pub(super) struct SetInfo {
    set: Set,
    /// `__set0`, `__map1`: a rule's inline set, folded into the rule.
    anonymous: bool,
    /// Its key's field lengths are unknown: elements are one opaque value each, and a
    /// lookup's key is `Key::Other`.
    opaque: bool,
    key_types: Vec<u32>,
    /// The key's field lengths (each padded to 4 bytes in a register and an element).
    key_lens: Vec<usize>,
    data_types: Vec<u32>,
    data_lens: Vec<usize>,
}

fn failed(what: &str) -> impl Fn(io::Error) -> NftError + '_ {
    move |source| NftError::Ruleset {
        what: what.to_string(),
        source,
    }
}

/// One read of every kind, in an order that lets each decode with what came before: tables,
/// sets (and their elements), chains, rules.
fn read_once(
    session: &mut Session<'_>,
    keep: &dyn Fn(TableFamily, &str) -> bool,
    max_sets: usize,
) -> Result<Ruleset, NftError> {
    let mut b = Builder::default();
    session
        .dump_each(
            NFT_MSG_GETTABLE,
            0,
            |_| {},
            |af, body| b.table(af, body, keep),
        )
        .map_err(failed("the tables"))?;
    read_sets(session, &mut b, max_sets)?;
    session
        .dump_each(NFT_MSG_GETCHAIN, 0, |_| {}, |af, body| b.chain(af, body))
        .map_err(failed("the chains"))?;
    read_rules(session, &mut b)?;
    Ok(b.ruleset)
}

/// The sets of the tables kept, each with its elements; more than `max_sets` of them is
/// refused before any element is read.
fn read_sets(session: &mut Session<'_>, b: &mut Builder, max_sets: usize) -> Result<(), NftError> {
    let mut sets = Vec::new();
    session
        .dump_each(
            NFT_MSG_GETSET,
            0,
            |_| {},
            |af, body| {
                sets.extend(dump::family_of(af).map(|f| (f, dump::set(body))));
                Ok(())
            },
        )
        .map_err(failed("the sets"))?;
    let kept = sets
        .iter()
        .filter(|(family, set)| {
            set.as_ref()
                .is_ok_and(|(table, _)| b.at(*family, table).is_some())
        })
        .count();
    if kept > max_sets {
        return Err(NftError::TooManySets {
            sets: kept,
            limit: max_sets,
        });
    }
    for (family, set) in sets {
        let (table, info) = set.map_err(failed("the sets"))?;
        if b.at(family, &table).is_some() {
            let raw = read_elements(session, family, &table, &info)?;
            b.set(family, &table, info, raw);
        }
    }
    Ok(())
}

/// The elements of one set, as the dump sends them (none when the set is gone since the
/// set dump: the generation check reads again).
fn read_elements(
    session: &mut Session<'_>,
    family: TableFamily,
    table: &str,
    info: &SetInfo,
) -> Result<Vec<RawElement>, NftError> {
    let mut raw = Vec::new();
    let answer = session.dump_each(
        NFT_MSG_GETSETELEM,
        dump::af(family),
        |m| {
            netlink::put_str(m, 1, table);
            netlink::put_str(m, 2, &info.set.name);
        },
        |_, body| dump::elements(info, body, &mut raw),
    );
    match answer {
        Ok(()) => Ok(raw),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(raw),
        Err(e) => {
            let what = format!(
                "the elements of set {} of {} {table}",
                info.set.name,
                family.word()
            );
            Err(failed(&what)(e))
        }
    }
}

/// Rules table by table (the dump's NFTA_RULE_TABLE filter), so a table left out costs
/// nothing; a kernel that ignored the filter would only send rules the builder drops.
fn read_rules(session: &mut Session<'_>, b: &mut Builder) -> Result<(), NftError> {
    let kept: Vec<(TableFamily, String)> = b
        .ruleset
        .tables
        .iter()
        .map(|t| (t.family, t.name.clone()))
        .collect();
    for (family, table) in kept {
        let answer = session.dump_each(
            NFT_MSG_GETRULE,
            dump::af(family),
            |m| netlink::put_str(m, 1, &table),
            |af, body| b.rule(af, body),
        );
        match answer {
            Ok(()) => {}
            // Gone since the table dump: the generation check reads again.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(failed("the rules")(e)),
        }
    }
    Ok(())
}

/// The ruleset put together from the dumps' messages, in the order `read_once` asks.
#[derive(Default)]
struct Builder {
    ruleset: Ruleset,
    /// Where each table is among the ruleset's.
    tables: HashMap<(TableFamily, String), usize>,
    /// Each table's sets (anonymous ones included) and chains by name.
    sets: Vec<HashMap<String, SetInfo>>,
    chains: Vec<HashMap<String, usize>>,
}

impl Builder {
    fn at(&self, family: TableFamily, table: &str) -> Option<usize> {
        self.tables.get(&(family, table.to_string())).copied()
    }

    fn table(
        &mut self,
        af: u8,
        body: &[u8],
        keep: &dyn Fn(TableFamily, &str) -> bool,
    ) -> io::Result<()> {
        let Some(family) = dump::family_of(af) else {
            return Ok(());
        };
        let (name, handle, comment) = dump::table(body)?;
        if !keep(family, &name) {
            return Ok(());
        }
        let tables = &mut self.ruleset.tables;
        self.tables.insert((family, name.clone()), tables.len());
        self.sets.push(HashMap::new());
        self.chains.push(HashMap::new());
        tables.push(NftTable {
            family,
            name,
            handle,
            comment,
            chains: Vec::new(),
            sets: Vec::new(),
        });
        Ok(())
    }

    fn set(&mut self, family: TableFamily, table: &str, mut info: SetInfo, raw: Vec<RawElement>) {
        let Some(at) = self.at(family, table) else {
            return;
        };
        info.set.elements = dump::assemble(&info, raw);
        if !info.anonymous {
            self.ruleset.tables[at].sets.push(info.set.clone());
        }
        self.sets[at].insert(info.set.name.clone(), info);
    }

    fn chain(&mut self, af: u8, body: &[u8]) -> io::Result<()> {
        let Some(family) = dump::family_of(af) else {
            return Ok(());
        };
        let (table, chain) = dump::chain(family, body)?;
        if let Some(at) = self.at(family, &table) {
            let chains = &mut self.ruleset.tables[at].chains;
            self.chains[at].insert(chain.name.clone(), chains.len());
            chains.push(chain);
        }
        Ok(())
    }

    fn rule(&mut self, af: u8, body: &[u8]) -> io::Result<()> {
        let Some(family) = dump::family_of(af) else {
            return Ok(());
        };
        let table = netlink::attr(body, 1).and_then(netlink::str_of);
        let Some(at) = table.and_then(|t| self.at(family, t)) else {
            return Ok(());
        };
        let (_, chain, rule) = dump::rule(family, &self.sets[at], body)?;
        if let Some(&c) = self.chains[at].get(&chain) {
            self.ruleset.tables[at].chains[c].rules.push(rule);
        }
        Ok(())
    }
}
