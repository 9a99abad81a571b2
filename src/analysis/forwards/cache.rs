//! The iptables-nft candidates kept between hook runs, valid for one nf_tables generation
//! (see the module comment of `forwards`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::analysis::iptables::nat_walk::Candidate;
use crate::backend::Netfilter;
use crate::model::family::Family;
use crate::model::rule::IpNet;

/// The iptables-nft candidates of one family, kept between hook runs in the state
/// directory (see the module comment).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    pub schema: u32,
    pub entries: Vec<CacheEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheEntry {
    pub family: Family,
    /// The nf_tables generation the candidates were read at.
    pub generation: u32,
    pub scope: Scope,
    /// `None`: more than [`MAX_CACHED`](super::MAX_CACHED); each create walks once per
    /// mapping instead.
    pub candidates: Option<Vec<Candidate>>,
}

/// What the cache holds for a family, generation and scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached<'c> {
    Candidates(&'c [Candidate]),
    /// More than [`MAX_CACHED`](super::MAX_CACHED) candidates: walk per mapping.
    TooMany,
}

/// Where and when candidates were read, besides the generation: the generation starts again
/// at every boot and in every network namespace, and the walk judged destinations by the
/// host's addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    pub boot_id: Option<String>,
    /// The inode of the calling thread's network namespace.
    pub netns: Option<u64>,
    pub locals: Vec<IpNet>,
}

impl Scope {
    /// This boot, the calling thread's network namespace, and `locals`.
    pub fn here(locals: &[IpNet]) -> Scope {
        use std::os::unix::fs::MetadataExt;
        Scope {
            boot_id: crate::kernel::procfs::boot_id(),
            netns: std::fs::metadata("/proc/thread-self/ns/net")
                .ok()
                .map(|m| m.ino()),
            locals: locals.to_vec(),
        }
    }
}

const CACHE_SCHEMA: u32 = 2;
/// The cache's file in the state directory.
pub(crate) const CACHE_FILE: &str = "forwards.json";

impl Cache {
    /// The cache, or an empty one when there is none or it cannot be read (it is only ever
    /// a cache: reading the tables again is always right).
    pub fn load(path: &Path) -> Cache {
        crate::kernel::safefile::read(
            path,
            crate::kernel::safefile::Links::Refuse,
            crate::kernel::safefile::Cap::State,
        )
        .ok()
        .and_then(|b| serde_json::from_slice::<Cache>(&b).ok())
        .filter(|c| c.schema == CACHE_SCHEMA)
        .unwrap_or_default()
    }

    /// Write it (temp file and rename; not synced: after a crash a lost or old cache is only
    /// re-read). Failures are ignored for the same reason.
    pub fn store(&self, path: &Path) {
        let mut out = self.clone();
        out.schema = CACHE_SCHEMA;
        let Ok(json) = serde_json::to_vec(&out) else {
            return;
        };
        let tmp = path.with_extension("json.tmp");
        // Created exclusively, never through a planted link (`crate::kernel::safefile`).
        let written = crate::kernel::safefile::create_new(&tmp, 0o600)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &json));
        if written.is_err() || std::fs::rename(&tmp, path).is_err() {
            // Out of room: what the temp file took goes back to the ledger's own files.
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// The candidates of `family` if they were read at `generation` in this `scope`.
    pub fn valid(&self, family: Family, generation: u32, scope: &Scope) -> Option<Cached<'_>> {
        self.entries
            .iter()
            .find(|e| e.family == family && e.generation == generation && e.scope == *scope)
            .map(|e| match &e.candidates {
                Some(c) => Cached::Candidates(c),
                None => Cached::TooMany,
            })
    }

    pub fn put(&mut self, entry: CacheEntry) {
        self.entries.retain(|e| e.family != entry.family);
        self.entries.push(entry);
    }

    /// After natledger's own transactions moved the generation from `before` to `after`:
    /// entries read at `before` stay valid at `after` when `after - before` is exactly the
    /// number of transactions natledger committed (so nobody else committed meanwhile; its
    /// own rules are never candidates). Others are dropped.
    pub fn carry(&mut self, before: u32, after: u32, own: u32) {
        let exact = after.wrapping_sub(before) == own;
        self.entries.retain_mut(|e| {
            if exact && e.generation == before {
                e.generation = after;
                true
            } else {
                e.generation == after
            }
        });
    }
}

/// The iptables-nft generation before natledger's own writes, to carry the candidates over
/// them ([`carry`]); `None` when nothing is cached or the native paths are off.
pub struct Before {
    generation: u32,
    commits: u32,
}

/// Note the generation before natledger writes (only worth it when a cache exists).
pub(crate) fn before_writes(nf: &Netfilter, cache: &Path) -> Option<Before> {
    if !nf.direct() || !cache.exists() {
        return None;
    }
    let generation = nf.with_nft(|s| s.generation()).ok()?;
    Some(Before {
        generation,
        commits: nf.nft_commits(),
    })
}

/// After natledger's writes: keep the cached candidates valid if the generation moved by
/// exactly natledger's own transactions since [`before_writes`] (its rules are never
/// candidates), else drop them.
pub fn carry(nf: &Netfilter, cache: &Path, before: Option<Before>) {
    let Some(before) = before else {
        return;
    };
    let Ok(after) = nf.with_nft(|s| s.generation()) else {
        return;
    };
    if after == before.generation {
        return;
    }
    let mut kept = Cache::load(cache);
    kept.carry(before.generation, after, nf.nft_commits() - before.commits);
    kept.store(cache);
}
