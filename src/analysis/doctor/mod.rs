//! `natledger doctor`: find the rules that make a port unreachable, whoever wrote them, in
//! both backends and both families, from the live host or from saved dumps.
//!
//! ```text
//!  rulesets (live, or --from FILE...)          ─┐
//!  host evidence (`evidence`, i.e.              ├─▶ checks/ ─▶ findings ─▶ report.rs
//!   kernel::host: listeners, CNI IPAM,          │    uses iptables::paths (evaluation
//!   runtime state, routes)                      │    order, shadows), iptables::matchset
//!  natledger's ledger (live only)              ─┘    (coverage); nftables.rs: other
//!                                                    owners' native tables (analysis::nftables)
//! ```
//!
//! Doctor only reads. Every finding carries the exact rule lines and a command that would
//! fix it, printed, never run.

mod checks;
/// Host facts live in [`crate::kernel::host`] (create-runtime uses them too).
pub use crate::kernel::host as evidence;
mod nftables;
mod report;

use std::path::PathBuf;

use serde::Serialize;

use crate::analysis::iptables::paths;
use crate::backend::{Backend, BackendError, Detected, Netfilter, legacy_table_exists};
use crate::kernel::machine::Machine;
use crate::model::family::Family;
use crate::model::save::{self, Dump};
use crate::state::ledger::Ledger;

pub use report::render;

/// Exit statuses, for monitoring.
pub(crate) const EXIT_CLEAN: u8 = 0;
pub(crate) const EXIT_WARNINGS: u8 = 1;
pub(crate) const EXIT_ERRORS: u8 = 2;
pub const EXIT_FAILED: u8 = 3;

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error(
        "--from {0:?}: expected BACKEND[/FAMILY]:FILE, BACKEND legacy or nft, FAMILY ipv4 or \
         ipv6, or nftables:FILE"
    )]
    BadFrom(String),
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", path.display())]
    Parse {
        path: PathBuf,
        source: save::ParseError,
    },
    #[error("{}", path.display())]
    ParseNft {
        path: PathBuf,
        source: crate::model::ruleset::DumpError,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// One backend and family's tables, and where they came from.
#[derive(Debug)]
pub struct Ruleset {
    pub backend: Backend,
    pub family: Family,
    pub source: String,
    pub tables: Vec<Dump>,
}

impl Ruleset {
    pub fn table(&self, name: &str) -> Option<&Dump> {
        self.tables.iter().find(|t| t.name == name)
    }

    fn rule_count(&self) -> usize {
        self.tables.iter().map(|t| t.rules.len()).sum()
    }
}

/// A saved dump to analyse: `legacy:FILE`, `nft/ipv6:FILE`. Without a family, the dump's
/// header (`ip6tables-save`) or its addresses decide. `nftables:FILE` is a whole native
/// ruleset, every family (`nft list ruleset` text or `nft -j list ruleset` JSON).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpFile {
    pub backend: Backend,
    pub family: Option<Family>,
    pub path: PathBuf,
}

impl std::str::FromStr for DumpFile {
    type Err = DoctorError;
    fn from_str(s: &str) -> Result<Self, DoctorError> {
        let bad = || DoctorError::BadFrom(s.to_string());
        let (label, path) = s.split_once(':').ok_or_else(bad)?;
        let (backend, family) = match label.split_once('/') {
            Some((b, f)) => (b, Some(f)),
            None => (label, None),
        };
        let backend = Backend::named(backend).ok_or_else(bad)?;
        let family = match family {
            // A native ruleset holds every family.
            Some(_) if !backend.is_iptables() => return Err(bad()),
            None => None,
            Some("ipv4") => Some(Family::Ipv4),
            Some("ipv6") => Some(Family::Ipv6),
            Some(_) => return Err(bad()),
        };
        if path.is_empty() {
            return Err(bad());
        }
        Ok(DumpFile {
            backend,
            family,
            path: path.into(),
        })
    }
}

/// What to examine.
pub struct DoctorOptions<'r> {
    /// Saved dumps; empty means the live host (both backends, both families, plus host
    /// evidence and natledger's ledger).
    pub from: Vec<DumpFile>,
    /// Only findings about this host port.
    pub port: Option<u16>,
    pub ledger: Ledger,
    pub netfilter: Netfilter<'r>,
    /// The backend the host's `iptables` command uses, and how that was decided
    /// ([`crate::backend::detect_explained`]); live only (dumps decide from what they hold).
    pub host_backend: Detected,
    pub roots: evidence::Roots,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    pub const ALL: [Severity; 3] = [Severity::Info, Severity::Warning, Severity::Error];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A rule that can never match: an earlier one takes all its packets.
    Shadowed,
    /// A DNAT whose destination nothing holds.
    DeadTarget,
    /// A local listener whose traffic a rule redirects or rejects.
    HijackedListener,
    /// Rules in both iptables-legacy and iptables-nft (the kernel runs both).
    SplitBackends,
    /// natledger's own state: dead manifests, orphaned rules, missing rules.
    NatledgerState,
    /// A DNAT whose forwarded packets filter FORWARD drops (a DROP policy, as Docker sets).
    ForwardDropped,
    /// A process that may write iptables-legacy tables without the xtables lock.
    UnlockedLegacyWriter,
    /// An interface with route_localnet on whose packets to 127.0.0.1 filter INPUT lets in:
    /// neighbours reach this host's localhost services (CVE-2020-8558).
    LocalhostExposed,
}

impl Kind {
    /// Every kind, for the metrics series that report each one: a new kind goes here too.
    pub const ALL: [Kind; 8] = [
        Kind::Shadowed,
        Kind::DeadTarget,
        Kind::HijackedListener,
        Kind::SplitBackends,
        Kind::NatledgerState,
        Kind::ForwardDropped,
        Kind::UnlockedLegacyWriter,
        Kind::LocalhostExposed,
    ];
}

/// A rule as found: where it is and its line.
#[derive(Clone, Debug, Serialize)]
pub struct RuleRef {
    /// `nftables` for a rule of any owner's native nf_tables table.
    pub backend: Backend,
    /// The family of the packets judged (an `inet` table's rule is judged for each).
    pub family: Family,
    pub table: String,
    pub chain: String,
    /// 1-based position in its chain.
    pub position: usize,
    /// `-A CHAIN args`, as `*-save` prints it; a native rule's statements as `nft` prints
    /// them (an element: `KEY : DATA`).
    pub line: String,
    /// For a rule a shadow finding says never matches: the built-in chains (hooks) on whose
    /// walk it never matches. Empty (and absent from JSON) otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<&'static str>,
    /// Where in a native nf_tables ruleset (absent from JSON for iptables' rules).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub nft: Option<NftPlace>,
}

/// A native rule's or map element's place: `table_family`, `handle`, `element`, `owner` in
/// the JSON rule object, each absent when not known.
#[derive(Clone, Debug, Serialize)]
pub struct NftPlace {
    /// `ip`, `ip6`, `inet`...
    pub table_family: &'static str,
    /// The rule's handle (a dump without handles has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<u64>,
    /// The element of a named set or map that decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub element: Option<ElementRef>,
    /// Who wrote the table: `kube-proxy`, `netavark`, `firewalld`, `docker`, `portmap`,
    /// `natledger`; absent when not told by its name or comment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<&'static str>,
}

/// An element of a named set or map: its name and key as `nft` prints it (`tcp . 30080`).
#[derive(Clone, Debug, Serialize)]
pub struct ElementRef {
    pub set: String,
    pub key: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub kind: Kind,
    /// The host port concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// One plain sentence.
    pub summary: String,
    pub rules: Vec<RuleRef>,
    /// What the judgement rests on (dead targets, listeners).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// The commands that would fix it, one per line (printed, never run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// A rule past which doctor did not follow a hook's walk (a bound of [`paths::Limits`], or
/// chains nested deeper than [`paths::MAX_DEPTH`]): no rule of a chain it leads to is
/// claimed never to match.
#[derive(Clone, Debug, Serialize)]
pub struct NotFollowed {
    /// The built-in chain walked.
    pub hook: &'static str,
    /// The jump not followed, or the rule where the walk stopped.
    pub rule: RuleRef,
    pub reason: paths::CutReason,
}

/// Everything doctor found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// What was read: `legacy/ipv4 (live)`, `nft/ipv4 (dump.txt)`, …
    pub sources: Vec<String>,
    pub rules_read: usize,
    /// False when a walk was cut short ([`Report::not_followed`] says where).
    pub complete: bool,
    pub findings: Vec<Finding>,
    /// Where walks were cut short; absent from JSON when none was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_followed: Vec<NotFollowed>,
    /// How long doctor took.
    pub duration_seconds: f64,
}

impl Report {
    /// 0 no problem (info only), 1 warnings only, 2 errors.
    pub fn exit_code(&self) -> u8 {
        match self.findings.iter().map(|f| f.severity).max() {
            Some(Severity::Error) => EXIT_ERRORS,
            Some(Severity::Warning) => EXIT_WARNINGS,
            _ => EXIT_CLEAN,
        }
    }
}

/// Run every check.
pub fn doctor(opts: &DoctorOptions) -> Result<Report, DoctorError> {
    let started = std::time::Instant::now();
    let live = opts.from.is_empty();
    let (rulesets, native) = if live {
        (
            read_live(opts)?,
            nftables::read_live(opts).into_iter().collect(),
        )
    } else {
        read_files(&opts.from)?
    };
    // This machine under the host root the tools are run in.
    let machine = || Machine::in_root(opts.netfilter.tool_lookup().0.cloned());
    let host = live.then(|| checks::Host::gather(opts, &machine()));
    let (mut findings, not_followed) = run_checks(
        &rulesets,
        host.as_ref(),
        opts.host_backend.clone(),
        paths::LIMITS,
    );
    let native: Vec<nftables::NftRuleset> = native
        .into_iter()
        .map(|n| n.without_iptables_tables(&rulesets))
        .collect();
    findings.extend(nftables::findings(&native, host.as_ref(), &rulesets));
    if let Some(port) = opts.port {
        findings.retain(|f| f.port == Some(port));
    }
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.port.cmp(&b.port))
            .then(a.summary.cmp(&b.summary))
    });
    Ok(Report {
        sources: rulesets
            .iter()
            .map(|r| format!("{}/{} ({})", r.backend, r.family, r.source))
            .chain(native.iter().map(|n| format!("nftables ({})", n.source)))
            .collect(),
        rules_read: rulesets.iter().map(Ruleset::rule_count).sum::<usize>()
            + native
                .iter()
                .map(nftables::NftRuleset::rule_count)
                .sum::<usize>(),
        complete: not_followed.is_empty(),
        findings,
        not_followed,
        duration_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Every check over rulesets already read, without host evidence (as for `--from` dumps):
/// the findings, and false when a walk was cut short. For tests and tools that build
/// rulesets themselves.
pub fn check_rulesets(rulesets: &[Ruleset], host_backend: Backend) -> (Vec<Finding>, bool) {
    check_rulesets_within(rulesets, host_backend, paths::LIMITS)
}

/// [`check_rulesets`] within other limits than doctor's ([`paths::LIMITS`]), for tests of
/// what the bounds may claim.
pub fn check_rulesets_within(
    rulesets: &[Ruleset],
    host_backend: Backend,
    limits: paths::Limits,
) -> (Vec<Finding>, bool) {
    let host_backend = Detected {
        backend: host_backend,
        how: format!("the caller named {host_backend}"),
    };
    let (findings, not_followed) = run_checks(rulesets, None, host_backend, limits);
    (findings, not_followed.is_empty())
}

fn run_checks(
    rulesets: &[Ruleset],
    host: Option<&checks::Host>,
    host_backend: Detected,
    limits: paths::Limits,
) -> (Vec<Finding>, Vec<NotFollowed>) {
    let mut out = checks::Checks::new(rulesets, host, host_backend, limits);
    out.shadowed();
    out.dead_targets();
    out.hijacked_listeners();
    out.split_backends();
    out.natledger_state();
    out.forward_drops();
    out.xtables_lock();
    out.localhost_exposed();
    out.finish()
}

fn read_live(opts: &DoctorOptions) -> Result<Vec<Ruleset>, DoctorError> {
    let mut out = Vec::new();
    for backend in Backend::iptables() {
        // Legacy's tables are seen in procfs: a missing tool is an error only where one is.
        let in_procfs = backend.driver().capabilities().tables_seen_without_tools;
        for family in Family::ALL {
            if in_procfs && !any_legacy_table(family)? {
                continue;
            }
            let tables = match backend.driver().read_all(&opts.netfilter, family) {
                Ok(tables) => tables,
                Err(BackendError::ToolNotFound { .. }) if !in_procfs => continue,
                Err(e) => return Err(e.into()),
            };
            out.push(Ruleset {
                backend,
                family,
                source: "live".into(),
                tables,
            });
        }
    }
    Ok(out)
}

/// Whether any iptables-legacy table exists (procfs; no process).
fn any_legacy_table(family: Family) -> Result<bool, BackendError> {
    for table in ["nat", "filter", "mangle", "raw", "security"] {
        if legacy_table_exists(family, table)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A dump file: a regular file or a pipe of at most `safefile::Cap::Dump` bytes.
fn read_dump(path: &std::path::Path) -> std::io::Result<String> {
    let bytes = crate::kernel::safefile::read_dump(path)?;
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The iptables dumps and the native rulesets among `files`.
fn read_files(
    files: &[DumpFile],
) -> Result<(Vec<Ruleset>, Vec<nftables::NftRuleset>), DoctorError> {
    let (mut iptables, mut nftables) = (Vec::new(), Vec::new());
    for f in files {
        let text = read_dump(&f.path).map_err(|source| DoctorError::Read {
            path: f.path.clone(),
            source,
        })?;
        if !f.backend.is_iptables() {
            nftables.push(nftables::NftRuleset::parse(&f.path, &text)?);
            continue;
        }
        let tables = save::parse_dump(&text).map_err(|source| DoctorError::Parse {
            path: f.path.clone(),
            source,
        })?;
        iptables.push(Ruleset {
            backend: f.backend,
            family: f.family.unwrap_or_else(|| guess_family(&text)),
            source: f.path.display().to_string(),
            tables,
        });
    }
    Ok((iptables, nftables))
}

/// A dump's family from its header, or from an IPv6 address in it.
fn guess_family(text: &str) -> Family {
    let v6_header = text
        .lines()
        .take(3)
        .any(|l| l.starts_with('#') && l.contains("ip6tables"));
    let v6_address = text.lines().take(2000).any(|l| {
        l.split_whitespace()
            .any(|t| t.contains("::") || (t.matches(':').count() >= 2 && t.contains('/')))
    });
    if v6_header || v6_address {
        Family::Ipv6
    } else {
        Family::Ipv4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_labels() {
        let f: DumpFile = "legacy:/tmp/a".parse().unwrap();
        assert_eq!((f.backend, f.family), (Backend::IptablesLegacy, None));
        let f: DumpFile = "nft/ipv6:b.txt".parse().unwrap();
        assert_eq!(
            (f.backend, f.family),
            (Backend::IptablesNft, Some(Family::Ipv6))
        );
        let f: DumpFile = "nftables:r.json".parse().unwrap();
        assert_eq!((f.backend, f.family), (Backend::OwnNftables, None));
        for bad in ["a.txt", "iptables:a", "nft/v7:a", "nft:", "nftables/ipv4:a"] {
            assert!(bad.parse::<DumpFile>().is_err(), "{bad}");
        }
    }

    #[test]
    fn family_from_the_dump() {
        assert_eq!(
            guess_family("# Generated by ip6tables-save v1.8.9\n*nat\n"),
            Family::Ipv6
        );
        assert_eq!(
            guess_family("*nat\n-A X -d fd00::1/128 -j ACCEPT\n"),
            Family::Ipv6
        );
        assert_eq!(
            guess_family("*nat\n-A X -d 10.0.0.1/32 -j DNAT --to-destination 10.0.0.2:80\n"),
            Family::Ipv4
        );
    }
}
