//! The iptables-legacy kernel interface, for the hooks' steady state: read a table (nat,
//! filter)
//! (`IPT_SO_GET_INFO`, `IPT_SO_GET_ENTRIES`), edit the blob, swap it in atomically
//! (`IPT_SO_SET_REPLACE`) and carry every surviving rule's counters over
//! (`IPT_SO_SET_ADD_COUNTERS`), all under the xtables lock as iptables-legacy does (the
//! caller's: `/run/xtables.lock` unless `XTABLES_LOCKFILE` or a host root moves it). This
//! is what iptables-legacy-restore does through libiptc; doing it in the hook saves a
//! process per operation (1.5 ms of 3 on an empty table).
//!
//! Scope, deliberately narrow: insert natledger's own rules at the top of (or append them to)
//! its chains when the chains and the shared rules (jumps, localhost guard) already exist,
//! and delete exactly recorded rules. Every other entry is copied byte for byte, with only jump offsets moved
//! ([`blob`]). Whenever the table is not as expected (a chain or jump missing, a recorded rule
//! not found, a rule shape not encodable, the table changed meanwhile) nothing is written and
//! the caller uses iptables-legacy-restore, which reads and writes rules whole.

pub mod blob;
pub mod entry;
pub mod render;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use blob::{Blob, Edited, Info, Span};
use entry::{Decoded, Encoded, Layout};

use crate::model::family::Family;
use crate::model::rule::{Rule, Target};

const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
const SO_SET_REPLACE: libc::c_int = 64;
const SO_SET_ADD_COUNTERS: libc::c_int = 65;
/// `sizeof(struct ipt_replace)`: name, valid_hooks, num_entries, size, hook_entry[5],
/// underflow[5], num_counters, counters pointer; the entries follow.
const REPLACE_HEADER: usize = 96;
/// `sizeof(struct ipt_get_entries)`: name, size, padding; the entries follow.
const GET_ENTRIES_HEADER: usize = 40;
/// iptables-legacy's lock (iptables' `XT_LOCK_NAME`) when `XTABLES_LOCKFILE` names none,
/// and how long natledger waits for it (as `--wait 5` did). Each writer below is given the
/// lock to take: resolved once at start (`entry::settings`), carried by the caller.
pub const XTABLES_LOCK: &str = "/run/xtables.lock";
const LOCK_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum IptcError {
    #[error("{family} iptables-legacy {table} table: {op}")]
    Kernel {
        family: Family,
        table: &'static str,
        op: &'static str,
        source: io::Error,
    },
    #[error("cannot take {path} within 5 s")]
    Lock { path: String, source: io::Error },
}

/// What a native edit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The table is not as the fast path expects: nothing was written.
    Declined,
    /// Done, with this many rules inserted or deleted.
    Done(usize),
}

/// Where an inserted rule goes in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    First,
    Last,
}

/// Insert `rules` (in order: `First` ones each above the previous, so give them in reverse)
/// provided every chain exists and every `(chain, jump)` in `required` is present.
///
/// Every rule is encoded before the xtables lock at `lock` is taken; under it, each chain named is
/// looked up once and `Blob::edit` places everything in one pass.
pub fn insert(
    lock: &Path,
    family: Family,
    table: &'static str,
    rules: &[(&str, Rule, Place)],
    required: &[(&str, Rule)],
) -> Result<Outcome, IptcError> {
    insert_keeping(lock, family, table, rules, required).map(|(outcome, _)| outcome)
}

/// [`insert`], and when done the table as it was swapped in (the edited blob, parsed again
/// once the lock is released): what a reader in the same process would otherwise read back
/// from the kernel (create's check of other owners' forwards, see `analysis::forwards`).
pub fn insert_keeping(
    lock: &Path,
    family: Family,
    table: &'static str,
    rules: &[(&str, Rule, Place)],
    required: &[(&str, Rule)],
) -> Result<(Outcome, Option<Blob>), IptcError> {
    let mut encoded = Vec::with_capacity(rules.len());
    for (chain, rule, place) in rules {
        let Some(Encoded::Entry(e)) = entry::encode(rule, family) else {
            // Not encodable, or a jump: never inserted here.
            return Ok((Outcome::Declined, None));
        };
        encoded.push((*chain, e, *place));
    }
    edit(lock, family, table, true, |t| {
        for (chain, jump) in required {
            let span = t.chain(chain)?;
            let found = t
                .rules(span)
                .any(|(_, e)| decoded(t, e).as_ref() == Some(jump));
            if !found {
                return None;
            }
        }
        let mut spans: HashMap<&str, Span> = HashMap::new();
        let mut firsts = Vec::new();
        let mut lasts = Vec::new();
        for (chain, e, place) in encoded {
            let span = match spans.get(chain) {
                Some(span) => *span,
                None => *spans.entry(chain).or_insert(t.chain(chain)?),
            };
            match place {
                Place::First => firsts.push((span.first, e)),
                Place::Last => lasts.push((span.tail, e)),
            }
        }
        // Each First goes above those given before it at the same place, and above any Last
        // there (an empty chain's first rule and its tail are one place): `edit` keeps the
        // order given at each place.
        firsts.reverse();
        firsts.extend(lasts);
        Some((firsts, Vec::new()))
    })
}

/// Delete one entry equal to each of `rules` from its chain; declined unless all are found.
///
/// The rules are counted by chain before the xtables lock at `lock` is taken; under it, each chain
/// named is read once, each entry decoded once, and the first entries equal to a wanted
/// rule (as many as are wanted) go.
pub fn delete(
    lock: &Path,
    family: Family,
    table: &'static str,
    rules: &[(&str, &Rule)],
) -> Result<Outcome, IptcError> {
    let mut wanted: Vec<(&str, HashMap<&Rule, usize>)> = Vec::new();
    for (chain, rule) in rules {
        let k = match wanted.iter().position(|(c, _)| c == chain) {
            Some(k) => k,
            None => {
                wanted.push((chain, HashMap::new()));
                wanted.len() - 1
            }
        };
        *wanted[k].1.entry(*rule).or_default() += 1;
    }
    let edited = edit(lock, family, table, false, |t| {
        let mut removes: Vec<usize> = Vec::with_capacity(rules.len());
        for (chain, mut left) in wanted {
            let span = t.chain(chain)?;
            for (at, e) in t.rules(span) {
                if left.is_empty() {
                    break;
                }
                let Some(rule) = decoded(t, e) else {
                    continue;
                };
                if let Some(n) = left.get_mut(&rule) {
                    *n -= 1;
                    if *n == 0 {
                        left.remove(&rule);
                    }
                    removes.push(at);
                }
            }
            if !left.is_empty() {
                return None;
            }
        }
        Some((Vec::new(), removes))
    });
    edited.map(|(outcome, _)| outcome)
}

/// The current `table` of `family`, read without the xtables lock. Asking about an absent
/// table creates it (the kernel loads the module), so callers check for it first.
pub fn read(family: Family, table: &'static str) -> Result<Blob, IptcError> {
    Socket::open(family, table)?.read()
}

/// What a legacy table holds, in brief: its size in bytes and entry count (any rule added or
/// removed changes them), and a digest of natledger's chains and the jumps into them
/// ([`Blob::digest`]: a restore that swaps same-shaped rules changes only that). `natledger
/// watch` compares it every 500 ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub size: u32,
    pub entries: u32,
    pub content: u64,
}

/// The [`Stamp`] of `table` of `family`. Its content is read (the whole table) unless
/// `known`'s size and entry count are still the table's: then `known` is returned, after one
/// `IPT_SO_GET_INFO` only. As [`read`], asking about an absent table creates it: callers
/// check for it first.
pub fn stamp(
    family: Family,
    table: &'static str,
    known: Option<Stamp>,
) -> Result<Stamp, IptcError> {
    let sock = Socket::open(family, table)?;
    let info = sock.info()?;
    if let Some(known) = known.filter(|k| (k.size, k.entries) == (info.size, info.num_entries)) {
        return Ok(known);
    }
    let blob = sock.read()?;
    Ok(Stamp {
        size: blob.info.size,
        entries: blob.info.num_entries,
        content: blob.digest(crate::model::layout::CHAIN_PREFIX),
    })
}

/// A table entry as a natledger-shaped rule, jumps resolved to chain names.
pub fn decoded(t: &Blob, e: &[u8]) -> Option<Rule> {
    match entry::decode(e, t.layout.family)? {
        Decoded::Rule(rule) => Some(rule),
        Decoded::Jump { mut rule, offset } => {
            rule.target = Target::Jump(t.chain_starting_at(offset as usize)?.to_string());
            Some(rule)
        }
    }
}

type Plan = (Vec<(usize, Vec<u8>)>, Vec<usize>);

/// Read, plan, replace, restore counters: one atomic replace, under the xtables lock.
///
/// The lock is held from the read of the table to the counters' restore, no longer: the
/// socket is opened before it, and whatever does not depend on the table (encoding, grouping
/// the wanted rules) is done by the callers before it. Under it, the work is linear in the
/// table's entries: one read, `plan` (the callers' look each chain up once and decode each
/// of its entries at most once), one `Blob::edit` pass, one replace, one counters write. Its
/// cost at scale is in README.md's Speed section (`benches/scale.rs`). With `keep`, a done
/// edit also returns the table as swapped in, parsed after the lock is released.
fn edit(
    lock: &Path,
    family: Family,
    table: &'static str,
    keep: bool,
    plan: impl FnOnce(&Blob) -> Option<Plan>,
) -> Result<(Outcome, Option<Blob>), IptcError> {
    const DECLINED: (Outcome, Option<Blob>) = (Outcome::Declined, None);
    // The table structures carry a user pointer: laid out here for 64-bit processes only.
    if cfg!(not(target_pointer_width = "64")) {
        return Ok(DECLINED);
    }
    let sock = Socket::open(family, table)?;
    let lock = xtables_lock(lock)?;
    let blob = match sock.read() {
        Ok(blob) => blob,
        // Changed between GET_INFO and GET_ENTRIES by a writer without the lock.
        Err(IptcError::Kernel { source, .. }) if source.raw_os_error() == Some(libc::EAGAIN) => {
            return Ok(DECLINED);
        }
        Err(e) => return Err(e),
    };
    let Some((inserts, removes)) = plan(&blob) else {
        return Ok(DECLINED);
    };
    let count = inserts.len() + removes.len();
    let old_entries = blob.info.num_entries;
    let Some(mut edited) = blob.edit(&inserts, &removes) else {
        return Ok(DECLINED);
    };
    let old_counters = match sock.replace(&mut edited, old_entries) {
        Ok(counters) => counters,
        // The table changed between the read and the replace (another writer without the
        // lock): the kernel refused it whole.
        Err(IptcError::Kernel { source, .. }) if source.raw_os_error() == Some(libc::EAGAIN) => {
            return Ok(DECLINED);
        }
        Err(e) => return Err(e),
    };
    // The new table is in force from here on: a failure below costs counters, not rules, and
    // must not send the caller to write the rules again.
    let Edited {
        info,
        buf,
        start,
        from_old,
    } = edited;
    let buf = keep.then_some(buf);
    let counters: Vec<[u64; 2]> = from_old
        .iter()
        .map(|old| old.map_or([0, 0], |i| old_counters[i as usize]))
        .collect();
    let added = sock.add_counters(&counters);
    // Another writer may change the table from here on: the counters are in.
    drop(lock);
    if let Err(e) = added {
        log::warn!("rule counters of the {table} table were reset: {e}");
    }
    let written = buf.and_then(|buf| Blob::parse(Layout::of(family), info, buf, start));
    Ok((Outcome::Done(count), written))
}

/// The xtables lock at `path`, held exclusively as iptables-legacy does.
fn xtables_lock(path: &Path) -> Result<File, IptcError> {
    let path = path.display().to_string();
    let err = |source| IptcError::Lock {
        path: path.clone(),
        source,
    };
    // Mode 0600 as iptables creates it: a lock others can read is a lock others can hold.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path);
    // A lock on a read-only mount (a host root mounted so) is taken as iptables takes it: an
    // flock needs no write access.
    let file = match file {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => std::fs::File::open(&path),
        other => other,
    }
    .map_err(err)?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let e = match fs2::FileExt::try_lock_exclusive(&file) {
            Ok(()) => return Ok(file),
            Err(e) => e,
        };
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || Instant::now() >= deadline {
            return Err(err(e));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A raw socket of the family, the handle for the table's socket options.
struct Socket {
    fd: OwnedFd,
    family: Family,
    level: libc::c_int,
    /// The table's name, NUL-padded as the socket options' `name[32]`.
    table: &'static str,
    name: [u8; 32],
}

impl Socket {
    fn open(family: Family, table: &'static str) -> Result<Socket, IptcError> {
        let mut name = [0u8; 32];
        // Table names are at most 31 bytes (XT_TABLE_MAXNAMELEN); natledger's are constants.
        name[..table.len()].copy_from_slice(table.as_bytes());
        use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
        let (af, level) = match family {
            Family::Ipv4 => (AddressFamily::Inet, libc::IPPROTO_IP),
            Family::Ipv6 => (AddressFamily::Inet6, libc::IPPROTO_IPV6),
        };
        let fd =
            socket(af, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Raw).map_err(|e| {
                IptcError::Kernel {
                    family,
                    table,
                    op: "socket",
                    source: e.into(),
                }
            })?;
        Ok(Socket {
            fd,
            family,
            level,
            table,
            name,
        })
    }

    fn fail(&self, op: &'static str, source: io::Error) -> IptcError {
        IptcError::Kernel {
            family: self.family,
            table: self.table,
            op,
            source,
        }
    }

    fn get(&self, op: &'static str, name: libc::c_int, buf: &mut [u8]) -> Result<(), IptcError> {
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: buf is valid for writes of `len` bytes and `len` for reads and writes;
        // the kernel writes no more than `len` bytes, and only into buf.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                self.level,
                name,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(self.fail(op, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// `setsockopt(2)` at the table's level: option `name` with `buf` as its value.
    ///
    /// # Safety
    /// Every pointer inside `buf` must be valid for what the kernel does through it for
    /// option `name` during the call: `IPT_SO_SET_REPLACE`'s `counters` must point at
    /// `num_counters` writable `xt_counters` (16 bytes each) that live until this returns.
    /// (`IPT_SO_SET_ADD_COUNTERS`' value carries no pointer.)
    unsafe fn set(&self, op: &'static str, name: libc::c_int, buf: &[u8]) -> Result<(), IptcError> {
        // SAFETY: buf is valid for reads of its length; the pointers inside it are valid as
        // this fn's contract requires.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                self.level,
                name,
                buf.as_ptr().cast(),
                buf.len() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(self.fail(op, io::Error::last_os_error()));
        }
        Ok(())
    }

    fn info(&self) -> Result<Info, IptcError> {
        // ipt_getinfo: name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size.
        let mut info_buf = [0u8; 84];
        info_buf[..32].copy_from_slice(&self.name);
        self.get("IPT_SO_GET_INFO", SO_GET_INFO, &mut info_buf)?;
        let word =
            |i: usize| u32::from_ne_bytes(info_buf[32 + 4 * i..36 + 4 * i].try_into().unwrap());
        Ok(Info {
            valid_hooks: word(0),
            hook_entry: [word(1), word(2), word(3), word(4), word(5)],
            underflow: [word(6), word(7), word(8), word(9), word(10)],
            num_entries: word(11),
            size: word(12),
        })
    }

    fn read(&self) -> Result<Blob, IptcError> {
        let info = self.info()?;
        // ipt_get_entries: name[32], size, padding to 8, entries. Placed so that the entries
        // start where `ipt_replace`'s will: the table is read, edited and written back in one
        // buffer, never copied.
        let mut buf = vec![0u8; REPLACE_HEADER + info.size as usize];
        let get = &mut buf[REPLACE_HEADER - GET_ENTRIES_HEADER..];
        get[..32].copy_from_slice(&self.name);
        get[32..36].copy_from_slice(&info.size.to_ne_bytes());
        self.get("IPT_SO_GET_ENTRIES", SO_GET_ENTRIES, get)?;
        let layout = Layout::of(self.family);
        Blob::parse(layout, info, buf, REPLACE_HEADER).ok_or_else(|| {
            self.fail(
                "parsing the table",
                io::Error::other("entries do not tile the table"),
            )
        })
    }

    /// Swap the table in; returns the old table's counters, per old entry. The header is
    /// written into the room `edit` left before the entries.
    fn replace(&self, edited: &mut Edited, old_entries: u32) -> Result<Vec<[u64; 2]>, IptcError> {
        let mut counters = vec![[0u64; 2]; old_entries as usize];
        let mut buf = Vec::with_capacity(REPLACE_HEADER);
        buf.extend(self.name);
        let info = &edited.info;
        for w in [info.valid_hooks, info.num_entries, info.size]
            .into_iter()
            .chain(info.hook_entry)
            .chain(info.underflow)
            .chain([old_entries])
        {
            buf.extend(w.to_ne_bytes());
        }
        buf.extend((counters.as_mut_ptr() as u64).to_ne_bytes());
        let at = edited.start - REPLACE_HEADER;
        edited.buf[at..edited.start].copy_from_slice(&buf);
        // SAFETY: the header's `counters` is `counters`' buffer, of `old_entries` (the
        // header's `num_counters`) entries, alive and not otherwise used until after the call.
        unsafe { self.set("IPT_SO_SET_REPLACE", SO_SET_REPLACE, &edited.buf[at..]) }?;
        Ok(counters)
    }

    fn add_counters(&self, counters: &[[u64; 2]]) -> Result<(), IptcError> {
        // xt_counters_info: name[32], num_counters, padding to 8, counters.
        let mut buf = Vec::with_capacity(40 + 16 * counters.len());
        buf.extend(self.name);
        buf.extend((counters.len() as u32).to_ne_bytes());
        buf.extend([0u8; 4]);
        for [packets, bytes] in counters {
            buf.extend(packets.to_ne_bytes());
            buf.extend(bytes.to_ne_bytes());
        }
        // SAFETY: `xt_counters_info` carries no pointer: the counters are in the buffer.
        unsafe { self.set("IPT_SO_SET_ADD_COUNTERS", SO_SET_ADD_COUNTERS, &buf) }
    }
}
