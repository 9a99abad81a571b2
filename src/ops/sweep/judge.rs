//! Step 1 of a sweep: the verdict on every manifest. Each is read (one too large to read whole
//! from its liveness fields, `ledger::summarize`), then judged alive, dead, or unreadable
//! (kept: its container might be alive); a dead one's rules stay while a live container of its
//! network namespace shares them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::SystemTime;

use crate::model::oci::ContainerId;
use crate::state::ledger::{FileId, Manifest, Phase, Scan, Scanned, Summary, summarize};
use crate::state::liveness::Batched;
use crate::state::sharing::Needs;

use super::report::{ContainerReport, SweepReport};
use super::{Claims, Context, Error, SweepOptions, held};

/// The verdict on every manifest.
pub(super) struct Judged {
    pub claims: Claims,
    /// Manifests whose rules go (dead containers; every container with `--all`).
    pub doomed: Vec<Doomed>,
    /// Manifests that cannot be read or do not match their file name: removed only by
    /// `--all`.
    pub unreadable: Vec<PathBuf>,
    /// Temp files a crash left (always removed).
    pub temps: Vec<PathBuf>,
    /// With `--repair`: the kept manifests whose create completed, whose rules must be in
    /// force, each with its file's modification time (ranked by [`super::order::rank`]).
    pub live: Vec<(SystemTime, Manifest)>,
    /// Every readable manifest's `stacked_on`, dead ones' included (a stack's order runs
    /// through them).
    pub stacks: HashMap<ContainerId, Vec<ContainerId>>,
}

pub(super) struct Doomed {
    pub path: PathBuf,
    /// Without its records when `summary` is set.
    pub manifest: Manifest,
    /// A manifest too large to read whole: where its rules are, not which.
    pub summary: Option<Summary>,
}

/// Per readable manifest: whether its container lives, and who shares its rules alive.
type Verdicts = (Vec<bool>, Vec<Vec<String>>);

/// The manifests read ([`read_all`]): those readable with their paths, the ids of those that
/// are not, and the summaries of those too large to read whole.
#[derive(Default)]
struct Read {
    readable: Vec<(PathBuf, Manifest)>,
    unreadable_ids: HashSet<String>,
    summaries: HashMap<PathBuf, Summary>,
}

/// Judge every manifest of the ledger (none when `ledgered` is false), reporting each.
pub(super) fn judge(
    ctx: &Context,
    opts: &SweepOptions,
    early: Vec<(PathBuf, Summary)>,
    ledgered: bool,
    report: &mut SweepReport,
) -> Result<Judged, Error> {
    // Without /proc every container would look dead.
    ctx.host.check_procfs().map_err(Error::Procfs)?;
    // Without a state directory (`--boot`, `--all`) nothing is read: one made meanwhile is
    // not locked.
    let scan = match ledgered {
        true => ctx.ledger.scan()?,
        false => Scan::default(),
    };
    let mut judged = Judged {
        claims: Claims {
            all: opts.all,
            keep_unrecorded: held::keep_unrecorded(opts, scan.manifests.len()),
            ..Claims::default()
        },
        doomed: Vec::new(),
        unreadable: Vec::new(),
        temps: scan.temps,
        live: Vec::new(),
        stacks: HashMap::new(),
    };
    let read = read_all(opts, scan.manifests, early, &mut judged, report);
    judged.stacks = read
        .readable
        .iter()
        .map(|(_, m)| (m.container_id.clone(), m.stacked_on.clone()))
        .collect();
    let ((keep, sharers), shared_unrecorded) = verdicts(ctx, &read);
    if !opts.all {
        for id in shared_unrecorded {
            log::info!(
                "kept the rules tagged natledger:{id} (no manifest): a live container's \
                 manifest says it shares them"
            );
            judged.claims.kept.insert(id);
        }
    }
    let Read {
        readable,
        mut summaries,
        ..
    } = read;
    for ((readable, alive), kept_for) in readable.into_iter().zip(keep).zip(sharers) {
        let summary = summaries.remove(&readable.0);
        sort(
            opts,
            readable,
            alive,
            kept_for,
            summary,
            &mut judged,
            report,
        );
    }
    Ok(judged)
}

/// Read every scanned manifest. Manifests too large to read whole are read for their liveness
/// fields (`ledger::summarize`): judged as any other; a dead one's rules go by their tag. One
/// that cannot be read, or names another container than its file name, is reported
/// ([`unreadable`]).
fn read_all(
    opts: &SweepOptions,
    scanned: Vec<Scanned>,
    early: Vec<(PathBuf, Summary)>,
    judged: &mut Judged,
    report: &mut SweepReport,
) -> Read {
    let mut early: HashMap<PathBuf, Summary> = early.into_iter().collect();
    let mut read = Read::default();
    for scanned in scanned {
        let manifest = match scanned.manifest {
            Err(e) if e.is_too_large() => match early.remove(&scanned.path) {
                Some(s) if Some(s.file) == FileId::at(&scanned.path) => Ok(s),
                _ => summarize(&scanned.path),
            }
            .map(|s| {
                let manifest = s.manifest.clone();
                read.summaries.insert(scanned.path.clone(), s);
                manifest
            }),
            other => other,
        };
        match manifest {
            Ok(m) if scanned.id.as_ref() == Some(&m.container_id) => {
                read.readable.push((scanned.path, m));
            }
            other => {
                let problem = other.map_err(|e| crate::causes::text(&e));
                let ids = unreadable(opts, scanned.id, &scanned.path, problem, judged, report);
                read.unreadable_ids.extend(ids);
                judged.unreadable.push(scanned.path);
            }
        }
    }
    read
}

/// A manifest that cannot be read (`problem`), or names another container than its file
/// name's `id`: whose rules it names is unknown, so those of both ids are kept (unless
/// `--all`), and it is reported. Returns those ids.
fn unreadable(
    opts: &SweepOptions,
    id: Option<ContainerId>,
    path: &std::path::Path,
    problem: Result<Manifest, String>,
    judged: &mut Judged,
    report: &mut SweepReport,
) -> Vec<String> {
    let mut ids: Vec<String> = id.iter().map(ToString::to_string).collect();
    let problem = match problem {
        Ok(m) => {
            ids.push(m.container_id.to_string());
            format!(
                "manifest {} names container {}, not the one its file name says",
                path.display(),
                m.container_id
            )
        }
        Err(text) => text,
    };
    if !opts.all {
        judged.claims.kept.extend(ids.iter().cloned());
        let tags: Vec<String> = ids.iter().map(crate::model::layout::tag).collect();
        report.errors.push(format!(
            "{problem}; the rules tagged {} are kept; repair or delete the file, \
             or run sweep --all",
            if tags.is_empty() {
                "with it".to_string()
            } else {
                tags.join(", ")
            }
        ));
    }
    report
        .containers
        .push(ContainerReport::unreadable(ids.first().cloned(), path));
    ids
}

/// Whether each readable manifest's container lives, and who shares its rules alive. A dead
/// container's rules stay while a live container in its network namespace shares them (a
/// pod's sandbox gone before its app containers), or one whose manifest cannot be read may
/// (named in `shared_by`: what it shares is unknown). Also the holders without a manifest
/// (natledger's state lost) whose rules a live container's manifest says it shares: their
/// tagged rules stay for that container.
fn verdicts(ctx: &Context, read: &Read) -> (Verdicts, HashSet<String>) {
    let readable = &read.readable;
    // The namespace cookies of every attachment read in one hand-over.
    let host = Batched::new(ctx.host, readable.iter().map(|(_, m)| m.recorded()));
    let needs = Needs::judge(&host, readable.iter().map(|(_, m)| m));
    let recorded: HashSet<&ContainerId> = readable.iter().map(|(_, m)| &m.container_id).collect();
    let shared_unrecorded = readable
        .iter()
        .flat_map(|(_, m)| m.shares.iter().map(|s| &s.holder))
        .filter(|holder| !recorded.contains(holder) && !needs.sharers(holder).is_empty())
        .map(ToString::to_string)
        .collect();
    let each = readable
        .iter()
        .map(|(_, m)| {
            let id = &m.container_id;
            let sharers = needs.sharers(id).into_iter();
            let maybe = m.shared_by.iter().map(ToString::to_string);
            (
                needs.alive(id),
                sharers
                    .map(|s| s.container_id.to_string())
                    .chain(maybe.filter(|s| read.unreadable_ids.contains(s)))
                    .collect(),
            )
        })
        .unzip();
    (each, shared_unrecorded)
}

/// One readable manifest judged: kept (its container alive, or its rules shared by a live
/// one; with `--repair` and complete, one whose rules must be in force), else doomed.
fn sort(
    opts: &SweepOptions,
    (path, manifest): (PathBuf, Manifest),
    alive: bool,
    kept_for: Vec<String>,
    summary: Option<Summary>,
    judged: &mut Judged,
    report: &mut SweepReport,
) {
    let id = manifest.container_id.to_string();
    let needed = alive || !kept_for.is_empty();
    report.containers.push(
        ContainerReport::judged(&manifest, alive, kept_for, &path)
            .too_large(summary.as_ref().map(|s| s.bytes)),
    );
    if needed && !opts.all {
        judged.claims.kept.insert(id);
        if opts.repair && summary.is_none() && manifest.phase == Phase::Installed {
            let written = std::fs::metadata(&path).and_then(|m| m.modified());
            let written = written.unwrap_or(SystemTime::UNIX_EPOCH);
            judged.live.push((written, manifest));
        }
    } else {
        judged.claims.dead.insert(id);
        judged.doomed.push(Doomed {
            path,
            manifest,
            summary,
        });
    }
}
