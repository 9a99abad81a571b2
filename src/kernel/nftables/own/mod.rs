//! natledger's own nf_tables tables: the `nftables` backend, written in-process over netlink.
//!
//! One table per family, `ip natledger` and `ip6 natledger` (not one `inet` table: natledger's
//! rules, manifests and operations are per family already, and `ip`/`ip6` nat works on every
//! kernel with nf_tables nat, where `inet` nat needs 5.2). Its chains carry the names of the
//! iptables layout (`crate::model::layout`), so the rule model, the shared rules, ownership and the
//! sweep plan are the same for every backend; the built-in chains of iptables are base
//! chains here:
//!
//! ```text
//! table ip natledger
//! ├── PREROUTING   type nat hook prerouting priority dstnat - 10 (-110)  ─ fib daddr type local ─▶ NATLEDGER-HOSTPORTS
//! ├── OUTPUT       type nat hook output priority dstnat - 10 (-110)      ─ fib daddr type local ─▶ NATLEDGER-HOSTPORTS
//! ├── POSTROUTING  type nat hook postrouting priority srcnat - 10 (90)   ─────────────────────▶ NATLEDGER-MASQ
//! ├── INPUT        type filter hook input priority filter - 10 (-10)     ─────────────────────▶ NATLEDGER-INPUT (IPv4: the localhost guard)
//! ├── NATLEDGER-HOSTPORTS   dnat per mapping, newest first, comment "natledger:<id>"
//! ├── NATLEDGER-MASQ        masquerade for the hairpin and 127.0.0.1 paths
//! └── NATLEDGER-INPUT       ip daddr 127.0.0.0/8 iifname != "lo" ct status ! dnat drop
//! ```
//!
//! # Priorities
//! The kernel runs every nat chain of a hook (iptables-legacy's and iptables-nft's nat tables
//! at -100, nftables tables at `dstnat` -100 or `srcnat` 100 as kube-proxy, netavark, Docker
//! and CNI portmap register them) in priority order, and the first one that binds a NAT
//! mapping for a new connection decides it: later nat chains are not consulted for that
//! connection. At -110 and 90, natledger's chains come first, so a stale DNAT of any other
//! owner, in any backend, cannot shadow a live natledger mapping. (A chain someone registers
//! below -110 would still come first; none of the owners above does.)
//!
//! # No forward accept
//! Each base chain of a hook is evaluated in turn, and an `accept` ends only its own chain: a
//! packet another table's forward chain drops stays dropped whatever natledger's table says.
//! So this backend writes no forward accept (the iptables backends' `NATLEDGER-FORWARD`): it
//! could not help, and an operator reading `nft list ruleset` would think it did. A host
//! whose firewall drops forwarded traffic must allow `ct status dnat` there. The localhost
//! guard is a drop, and a drop in any base chain is final: in this backend no other owner's
//! accept can bypass it.
//!
//! # Reading and writing
//! [`Session::own_table`] reads the table (one GETTABLE, a GETRULE dump the kernel narrows to
//! this table, and a GETCHAIN per chain name it knows of): what it costs does not grow with
//! other owners' tables. Rules are decoded by [`expr::decode`] into [`crate::model::rule::Rule`]s and
//! shown as the same arguments `Rule::to_args` renders for iptables, so the rest of natledger
//! reads this backend as a `save::Dump` per logical table (nat, filter). A rule natledger
//! would not write (another owner's, added to this table) is shown as opaque tokens, which
//! no natledger rule equals. [`batch`] turns the operations of a restore batch into one
//! nf_tables transaction: all or nothing, no process.

use std::io;

pub mod batch;
pub mod debug;
pub mod expr;
mod picture;

use super::wire::{NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETTABLE};
use super::wire::{NFT_MSG_NEWRULE, NFTA_CHAIN_HOOK, NFTA_CHAIN_NAME};
use super::wire::{NFTA_CHAIN_POLICY, NFTA_CHAIN_TABLE, NFTA_CHAIN_TYPE, NFTA_HOOK_HOOKNUM};
use super::wire::{NFTA_HOOK_PRIORITY, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_HANDLE};
use super::wire::{NFTA_RULE_TABLE, NFTA_RULE_USERDATA, NFTA_TABLE_NAME, NFTA_TABLE_USE};
use super::{NftError, Session, comment_udata, genmsg, subsys};
use crate::kernel::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST};
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{self, FILTER, NAT};
use crate::model::save::{Dump, SavedRule};

/// What natledger's own tables hold beyond the mapping rules: no forward accept (an accept
/// ends only natledger's own base chain, another table's forward drop still drops), the
/// guard's second rule (nf_tables' `ct status` has no value for an untracked packet), no
/// shifted port ranges (nft_nat has no port offset, [`expr::EncodeError`]), no tools, and
/// every create in one nf_tables transaction.
pub const CAPABILITIES: Capabilities = Capabilities {
    forward_accept: false,
    untracked_guard: true,
    shifted_ranges: false,
    tools: false,
    tables_seen_without_tools: false,
    one_transaction: true,
};

/// The name of natledger's table in each family.
pub const TABLE: &str = "natledger";

/// A base chain of natledger's table: the iptables built-in chain it stands for.
#[derive(Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub name: &'static str,
    /// The logical (iptables) table it belongs to.
    pub table: &'static str,
    /// The nf_tables chain type.
    pub kind: &'static str,
    /// `NF_INET_*`.
    pub hook: u32,
    pub priority: i32,
}

/// The base chains, created when first written to. The priorities: the module comment.
pub const BASE_CHAINS: [BaseChain; 5] = [
    BaseChain {
        name: "PREROUTING",
        table: NAT,
        kind: "nat",
        hook: 0,
        priority: -110,
    },
    BaseChain {
        name: "INPUT",
        table: FILTER,
        kind: "filter",
        hook: 1,
        priority: -10,
    },
    BaseChain {
        name: "FORWARD",
        table: FILTER,
        kind: "filter",
        hook: 2,
        priority: -10,
    },
    BaseChain {
        name: "OUTPUT",
        table: NAT,
        kind: "nat",
        hook: 3,
        priority: -110,
    },
    BaseChain {
        name: "POSTROUTING",
        table: NAT,
        kind: "nat",
        hook: 4,
        priority: 90,
    },
];

/// The base chain called `name`, if it is one.
pub fn base_chain(name: &str) -> Option<&'static BaseChain> {
    BASE_CHAINS.iter().find(|b| b.name == name)
}

/// The tokens shown for a rule of natledger's table that natledger would not write: no
/// natledger rule equals them, and `layout::owner` still reads its comment.
pub const OPAQUE: &str = "--natledger-opaque";

/// One chain of natledger's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnChain {
    pub name: String,
    /// Its hook, when it is a base chain.
    pub hook: Option<u32>,
    /// A base chain's policy (`NF_ACCEPT` 1, `NF_DROP` 0).
    pub policy: Option<u32>,
}

/// One rule of natledger's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnRule {
    pub chain: String,
    pub handle: u64,
    /// `Rule::to_args` of the decoded rule, or opaque tokens.
    pub args: Vec<String>,
}

/// natledger's table of one family, as the kernel holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnTable {
    pub family: Family,
    pub chains: Vec<OwnChain>,
    /// In chain order, each chain's rules in order.
    pub rules: Vec<OwnRule>,
    /// How many objects (chains, sets, ...) the table holds, as the kernel counts them: more
    /// than `chains` means someone else's object is in it.
    pub objects: u32,
}

impl OwnTable {
    /// The logical table (nat, filter) a chain of natledger's table belongs to: a base chain
    /// by its type, natledger's chains by name, another chain by the first base chain that
    /// jumps to it, else nat.
    pub fn logical_table(&self, chain: &str) -> &'static str {
        if let Some(base) = base_chain(chain) {
            return base.table;
        }
        if layout::owned_chains(Capabilities::ALL, FILTER, Family::Ipv4).contains(&chain) {
            return FILTER;
        }
        let jumper = self.rules.iter().find(|r| {
            r.args
                .windows(2)
                .any(|w| w[0] == "-j" && w[1] == chain && base_chain(&r.chain).is_some())
        });
        jumper
            .and_then(|r| base_chain(&r.chain))
            .map_or(NAT, |b| b.table)
    }

    /// The logical `table` as `*-save -t table` would show it: its base chains first (each
    /// present one, with its policy), then its other chains, and their rules.
    pub fn logical(&self, table: &str) -> Dump {
        let mut chains: Vec<(String, String)> = Vec::new();
        for chain in &self.chains {
            if self.logical_table(&chain.name) != table {
                continue;
            }
            let policy = match (chain.hook, chain.policy) {
                (Some(_), Some(0)) => "DROP",
                (Some(_), _) => "ACCEPT",
                (None, _) => "-",
            };
            chains.push((chain.name.clone(), policy.to_string()));
        }
        chains.sort_by_key(|(name, policy)| (policy == "-", base_chain(name).map(|b| b.hook)));
        let rules = self
            .rules
            .iter()
            .filter(|r| chains.iter().any(|(c, _)| *c == r.chain))
            .map(|r| SavedRule {
                chain: r.chain.clone(),
                args: r.args.clone(),
                counters: None,
            })
            .collect();
        Dump {
            name: table.to_string(),
            chains,
            rules,
        }
    }
}

/// natledger's table as read at one nf_tables generation: a transaction planned from it is
/// committed only if nobody committed since (`batch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnRead {
    pub generation: u32,
    pub table: Option<OwnTable>,
}

/// Everything a read gets wrong, as an `NftError` naming the table.
fn read_error(family: Family, what: &str) -> impl Fn(io::Error) -> NftError + '_ {
    move |source| NftError::Read {
        family,
        what: format!("{what} of table {TABLE}"),
        source,
    }
}

fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
}

impl Session<'_> {
    /// The nf_tables generation, then natledger's table of `family`.
    pub fn own_read(&mut self, family: Family) -> Result<OwnRead, NftError> {
        let generation = self.generation()?;
        let table = self.own_table(family)?;
        Ok(OwnRead { generation, table })
    }

    /// natledger's table of `family`, or `None` when it does not exist.
    pub fn own_table(&mut self, family: Family) -> Result<Option<OwnTable>, NftError> {
        let Some(objects) = self.own_table_use(family)? else {
            return Ok(None);
        };
        let rules = self.own_rules(family)?;
        // Every chain name natledger could have made or a rule names, in a stable order.
        let mut names: Vec<String> = BASE_CHAINS.iter().map(|b| b.name.to_string()).collect();
        for table in layout::TABLES {
            let owned = layout::owned_chains(CAPABILITIES, table, Family::Ipv4);
            names.extend(owned.iter().map(|c| c.to_string()));
        }
        for rule in &rules {
            names.push(rule.chain.clone());
            if let Some(to) = jump_target(&rule.args) {
                names.push(to.to_string());
            }
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        let mut chains = Vec::new();
        for name in names {
            if let Some(chain) = self.own_chain(family, &name)? {
                chains.push(chain);
            }
        }
        Ok(Some(OwnTable {
            family,
            chains,
            rules,
            objects,
        }))
    }

    /// The table's object count (`NFTA_TABLE_USE`), or `None` when it does not exist.
    fn own_table_use(&mut self, family: Family) -> Result<Option<u32>, NftError> {
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(40);
        let start = netlink::begin(&mut request, subsys(NFT_MSG_GETTABLE), NLM_F_REQUEST, seq);
        genmsg(&mut request, family.af(), 0);
        netlink::put_str(&mut request, NFTA_TABLE_NAME, TABLE);
        netlink::finish(&mut request, start);
        let mut objects = 0;
        let answer = self.sock.answer(seq, &request, |message| {
            let body = message.payload.get(4..).unwrap_or_default();
            objects = netlink::attr(body, NFTA_TABLE_USE)
                .and_then(be32)
                .unwrap_or(0);
            Ok(())
        });
        match answer {
            Ok(()) => Ok(Some(objects)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(read_error(family, "the table")(e)),
        }
    }

    /// Every rule of the table, decoded, in order (a dump the kernel narrows to the table).
    fn own_rules(&mut self, family: Family) -> Result<Vec<OwnRule>, NftError> {
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(40);
        let start = netlink::begin(
            &mut request,
            subsys(NFT_MSG_GETRULE),
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
        );
        genmsg(&mut request, family.af(), 0);
        netlink::put_str(&mut request, NFTA_RULE_TABLE, TABLE);
        netlink::finish(&mut request, start);
        let mut rules = Vec::new();
        let answer = self.sock.dump(seq, &request, |message| {
            if message.kind != subsys(NFT_MSG_NEWRULE) {
                return Ok(());
            }
            let body = message.payload.get(4..).unwrap_or_default();
            let text = |kind| netlink::attr(body, kind).and_then(netlink::str_of);
            if text(NFTA_RULE_TABLE) != Some(TABLE) {
                return Ok(());
            }
            let malformed = || io::Error::other("malformed rule message");
            let chain = text(NFTA_RULE_CHAIN).ok_or_else(malformed)?;
            let handle = netlink::attr(body, NFTA_RULE_HANDLE)
                .and_then(|h| Some(u64::from_be_bytes(h.try_into().ok()?)))
                .ok_or_else(malformed)?;
            let comment = netlink::attr(body, NFTA_RULE_USERDATA).and_then(comment_udata);
            let exprs = netlink::attr(body, NFTA_RULE_EXPRESSIONS);
            let decoded = exprs.and_then(|e| expr::decode(family, e));
            let target = match decoded {
                Some(_) => None,
                None => exprs.and_then(expr::chain_verdict),
            };
            rules.push(OwnRule {
                chain: chain.to_string(),
                handle,
                args: shown(decoded, comment, target),
            });
            Ok(())
        });
        match answer {
            Ok(()) => Ok(rules),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(rules),
            Err(e) => Err(read_error(family, "the rules")(e)),
        }
    }

    /// One chain of the table, or `None` when there is no such chain.
    fn own_chain(&mut self, family: Family, name: &str) -> Result<Option<OwnChain>, NftError> {
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(64);
        let start = netlink::begin(&mut request, subsys(NFT_MSG_GETCHAIN), NLM_F_REQUEST, seq);
        genmsg(&mut request, family.af(), 0);
        netlink::put_str(&mut request, NFTA_CHAIN_TABLE, TABLE);
        netlink::put_str(&mut request, NFTA_CHAIN_NAME, name);
        netlink::finish(&mut request, start);
        let mut chain = None;
        let answer = self.sock.answer(seq, &request, |message| {
            let body = message.payload.get(4..).unwrap_or_default();
            let hook = netlink::attr(body, NFTA_CHAIN_HOOK)
                .and_then(|h| netlink::attr(h, NFTA_HOOK_HOOKNUM))
                .and_then(be32);
            chain = Some(OwnChain {
                name: name.to_string(),
                hook,
                policy: netlink::attr(body, NFTA_CHAIN_POLICY).and_then(be32),
            });
            Ok(())
        });
        match answer {
            Ok(()) => Ok(chain),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(read_error(family, &format!("chain {name}"))(e)),
        }
    }
}

/// The arguments shown for a rule: the decoded rule's, with its comment, or opaque tokens
/// that keep the comment and the chain the rule jumps or goes to (`-j`/`-g`), so that a
/// rule natledger does not decode still holds the chain it references in place: sweep
/// blocks that chain instead of planning a deletion the kernel refuses (EBUSY) every time.
fn shown(
    decoded: Option<crate::model::rule::Rule>,
    comment: Option<String>,
    target: Option<(bool, String)>,
) -> Vec<String> {
    match decoded {
        Some(mut rule) => {
            rule.comment = comment;
            rule.to_args()
        }
        None => {
            let mut args = vec!["-m".to_string(), "nft".to_string(), OPAQUE.to_string()];
            if let Some(comment) = comment {
                args.extend(["-m".into(), "comment".into(), "--comment".into(), comment]);
            }
            if let Some((goto, chain)) = target {
                args.extend([if goto { "-g" } else { "-j" }.to_string(), chain]);
            }
            args
        }
    }
}

/// The chain a rule's arguments jump to.
fn jump_target(args: &[String]) -> Option<&str> {
    args.windows(2)
        .find(|w| w[0] == "-j")
        .map(|w| w[1].as_str())
        .filter(|t| crate::model::rule::is_user_chain_name(t))
}

/// The chain attributes of a base chain (`NFTA_CHAIN_HOOK`, `NFTA_CHAIN_TYPE`, policy
/// accept) appended to a NEWCHAIN message.
pub(super) fn put_base_chain(m: &mut Vec<u8>, base: &BaseChain, policy: u32) {
    let hook = netlink::begin_nest(m, NFTA_CHAIN_HOOK);
    netlink::put_attr(m, NFTA_HOOK_HOOKNUM, &base.hook.to_be_bytes());
    netlink::put_attr(m, NFTA_HOOK_PRIORITY, &base.priority.to_be_bytes());
    netlink::end_nest(m, hook);
    netlink::put_attr(m, NFTA_CHAIN_POLICY, &policy.to_be_bytes());
    netlink::put_str(m, NFTA_CHAIN_TYPE, base.kind);
}

#[cfg(test)]
mod tests;
