//! Any owner's nf_tables ruleset over netlink, every family, decoded into the analysis model
//! ([`crate::model::ruleset`]): tables, chains (hook, priority, type, policy), rules (handle,
//! comment, statements), named sets and maps with their elements.
//!
//! # One generation
//! The ruleset is read with one dump per kind (tables, chains, sets, then one element dump per
//! set, rules), between two `NFT_MSG_GETGEN`s: when the generation moved meanwhile (anyone
//! committed a transaction), the whole read is done again, at most [`TRIES`] times. What is
//! returned is the ruleset of exactly the returned generation.
//!
//! # Decoding
//! `expr.rs` follows the registers of a rule's expressions (loads of payload, meta, ct, fib,
//! numgen, immediate data; concatenations over consecutive 32-bit registers; bitwise masks)
//! into the statements they add up to (`cmp`, `range`, `lookup`, verdicts, `nat`, `masq`,
//! `redir`, `reject`, effects); `types.rs` decodes values (set elements, compared data) by the
//! set's declared key types or the loaded field. What is not modelled becomes
//! [`Stmt::Other`](crate::model::ruleset::Stmt::Other) or
//! [`Key::Other`](crate::model::ruleset::Key::Other): never narrower than the kernel.
//! Anonymous sets (`__set0`, `__map1`) are folded into the rules that use them, as `nft`
//! prints them; named sets are the table's [`Set`](crate::model::ruleset::Set)s.

mod dump;
mod expr;
#[cfg(test)]
mod tests;
mod types;

use std::collections::HashMap;
use std::io;

use super::{NftError, Session};
use crate::model::ruleset::{Ruleset, Set, Table, TableFamily};

/// How many reads in a row may find the generation moved before the read gives up.
pub const TRIES: usize = 5;

/// The whole nf_tables ruleset of the session's network namespace and the generation it is
/// the ruleset of.
pub fn read(session: &mut Session<'_>) -> Result<(Ruleset, u32), NftError> {
    let mut generation = session.generation()?;
    for _ in 0..TRIES {
        let ruleset = read_once(session)?;
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
    key_types: Vec<u32>,
    /// The key's field lengths (each padded to 4 bytes in a register and an element).
    key_lens: Vec<usize>,
    data_types: Vec<u32>,
    data_lens: Vec<usize>,
}

/// Where each table is among the ruleset's, and its sets by name.
struct Index {
    tables: HashMap<(TableFamily, String), usize>,
    sets: Vec<HashMap<String, SetInfo>>,
}

fn failed(what: &str) -> impl Fn(io::Error) -> NftError + '_ {
    move |source| NftError::Ruleset {
        what: what.to_string(),
        source,
    }
}

/// One read of every kind, in an order that lets each decode with what came before: tables,
/// sets (and their elements), chains, rules.
fn read_once(session: &mut Session<'_>) -> Result<Ruleset, NftError> {
    let mut ruleset = Ruleset::default();
    let mut index = Index {
        tables: HashMap::new(),
        sets: Vec::new(),
    };
    session
        .dump_each(
            dump::GETTABLE,
            0,
            |_| {},
            |af, body| {
                let Some(family) = dump::family_of(af) else {
                    return Ok(());
                };
                let (name, handle, comment) = dump::table(body)?;
                index
                    .tables
                    .insert((family, name.clone()), ruleset.tables.len());
                index.sets.push(HashMap::new());
                ruleset.tables.push(Table {
                    family,
                    name,
                    handle,
                    comment,
                    chains: Vec::new(),
                    sets: Vec::new(),
                });
                Ok(())
            },
        )
        .map_err(failed("the tables"))?;
    let mut sets = Vec::new();
    session
        .dump_each(
            dump::GETSET,
            0,
            |_| {},
            |af, body| {
                if let Some(family) = dump::family_of(af) {
                    let (table, info) = dump::set(body)?;
                    sets.push((family, table, info));
                }
                Ok(())
            },
        )
        .map_err(failed("the sets"))?;
    for (family, table, mut info) in sets {
        let Some(&at) = index.tables.get(&(family, table.clone())) else {
            continue;
        };
        let what = format!(
            "the elements of set {} of {} {table}",
            info.set.name,
            family.word()
        );
        let mut raw = Vec::new();
        let answer = session.dump_each(
            dump::GETSETELEM,
            dump::af(family),
            |m| {
                crate::kernel::netlink::put_str(m, 1, &table);
                crate::kernel::netlink::put_str(m, 2, &info.set.name);
            },
            |_, body| dump::elements(&info, body, &mut raw),
        );
        match answer {
            Ok(()) => {}
            // Gone since the set dump: the generation check reads again.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(failed(&what)(e)),
        }
        info.set.elements = dump::assemble(&info, raw);
        if !info.anonymous {
            ruleset.tables[at].sets.push(info.set.clone());
        }
        index.sets[at].insert(info.set.name.clone(), info);
    }
    let mut chains: Vec<HashMap<String, usize>> = vec![HashMap::new(); ruleset.tables.len()];
    session
        .dump_each(
            dump::GETCHAIN,
            0,
            |_| {},
            |af, body| {
                let Some(family) = dump::family_of(af) else {
                    return Ok(());
                };
                let (table, chain) = dump::chain(family, body)?;
                if let Some(&at) = index.tables.get(&(family, table)) {
                    let table = &mut ruleset.tables[at];
                    chains[at].insert(chain.name.clone(), table.chains.len());
                    table.chains.push(chain);
                }
                Ok(())
            },
        )
        .map_err(failed("the chains"))?;
    session
        .dump_each(
            dump::GETRULE,
            0,
            |_| {},
            |af, body| {
                let Some(family) = dump::family_of(af) else {
                    return Ok(());
                };
                let table = netlink_table(body);
                let Some(&at) = table.and_then(|t| index.tables.get(&(family, t))) else {
                    return Ok(());
                };
                let (_, chain, rule) = dump::rule(family, &index.sets[at], body)?;
                if let Some(&c) = chains[at].get(&chain) {
                    ruleset.tables[at].chains[c].rules.push(rule);
                }
                Ok(())
            },
        )
        .map_err(failed("the rules"))?;
    Ok(ruleset)
}

/// A rule message's table name, before the rule is decoded.
fn netlink_table(body: &[u8]) -> Option<String> {
    crate::kernel::netlink::attr(body, 1)
        .and_then(crate::kernel::netlink::str_of)
        .map(str::to_string)
}
