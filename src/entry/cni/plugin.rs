//! The plugin the binary is: each command on natledger's ledger and backends, through the
//! same operations as the OCI hooks (`ops::create`, `ops::detach`). Without a manifest (the
//! state directory lost), DEL acts on the rules tagged with the attachment's ledger id and
//! CHECK on the rules ADD would write (`ops::planned`); nothing is written back. GC acts on
//! manifests only. DEL and GC act on a manifest only when it records a CNI attachment.

use crate::model::family::IfAddr;

use super::{Attachment, CniError, Code, Plugin, Request};
use crate::backend::{Backend, Netfilter, tool};
use crate::entry::cli::PortConflict;
use crate::entry::settings::{self, Settings};
use crate::kernel::exec::SystemRunner;
use crate::kernel::machine::Machine;
use crate::kernel::netns_id::NetnsId;
use crate::model::family::Family;
use crate::model::oci::ContainerId;
use crate::model::portspec::bounds::canonical;
use crate::model::save::rule_line;
use crate::ops::{self, Context, Creating, Held};
use crate::state::ledger::{CniAttachment, Ledger, LedgerError, Phase, RuleRecord};
use crate::state::liveness;

/// natledger's commands, with the settings of its environment (`NATLEDGER_STATE_DIR`,
/// `NATLEDGER_BACKEND`, ...: [`Settings::from_env`]) or why they could not be read.
pub struct Natledger {
    settings: Result<Settings, String>,
    /// The settings with each refused variable at its default, and the refusals: what DEL,
    /// GC and STATUS use, so that a bad setting never stops a conflist's DEL.
    lenient: Option<(Settings, Vec<(String, clap::Error)>)>,
}

/// Whether a command refuses a bad variable (ADD, CHECK: what writes or judges rules) or
/// goes on without it (DEL, GC, STATUS), saying so on stderr.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bad {
    Refused,
    Ignored,
}

impl Natledger {
    /// `settings`: from the environment, a bad variable refused in clap's words; `lenient`:
    /// [`Settings::lenient`] of the same environment, when `settings` is refused.
    pub fn new(
        settings: Result<Settings, clap::Error>,
        lenient: Option<(Settings, Vec<(String, clap::Error)>)>,
    ) -> Self {
        Natledger {
            settings: settings.map_err(|e| settings::one_line(&e)),
            lenient,
        }
    }

    /// Where and how: the config's keys first, then the environment the hooks read, then the
    /// defaults.
    fn settings(&self, request: &Request, bad: Bad) -> Result<Settings, CniError> {
        let mut settings = match (&self.settings, bad, &self.lenient) {
            (Ok(settings), _, _) => settings.clone(),
            (Err(_), Bad::Ignored, Some((lenient, refused))) => {
                for (name, e) in refused {
                    log::warn!("{name} ignored: {}", settings::one_line(e));
                }
                lenient.clone()
            }
            (Err(details), _, _) => {
                return Err(CniError::new(
                    Code::InvalidEnv,
                    "invalid natledger setting",
                    details.clone(),
                ));
            }
        };
        if let Some(dir) = &request.conf.state_dir {
            settings.state_dir.clone_from(dir);
        }
        if let Some(backend) = request.conf.backend {
            settings.backend = backend;
        }
        if let Some(refuse) = request.conf.refuse_conflicts {
            settings.port_conflict = if refuse {
                PortConflict::Refuse
            } else {
                PortConflict::Warn
            };
        }
        Ok(settings)
    }

    /// The context of the hooks' operations, for `settings`.
    fn context<'r>(
        settings: &Settings,
        runner: &'r SystemRunner,
        machine: &'r Machine,
    ) -> Context<'r> {
        let ledger = Ledger::new(settings.state_dir.clone());
        let nf = settings.netfilter(runner);
        let backend = settings.backend.resolve(settings.host());
        let mut ctx = Context::new(ledger, backend, nf, machine);
        ctx.refuse_conflicts = settings.refuse_conflicts();
        ctx
    }
}

fn failed(what: &'static str, e: ops::Error) -> CniError {
    CniError::new(Code::Failed, what, crate::causes::text(&e))
}

fn failed_ledger(what: &'static str, e: LedgerError) -> CniError {
    CniError::new(Code::Failed, what, crate::causes::text(&e))
}

/// A create's error as ADD and CHECK answer it: a refusal before anything was written (the
/// configuration asks too much) is the configuration's error.
fn too_large_or(e: ops::Error, what: &'static str) -> CniError {
    match e {
        ops::Error::TooLarge { bound, .. } => CniError::new(
            Code::InvalidConfig,
            "too many port mappings",
            bound.to_string(),
        ),
        e => failed(what, e),
    }
}

/// The container's addresses in `prevResult`, at least one.
fn container_addresses(
    request: &Request,
    attachment: &Attachment,
) -> Result<Vec<IfAddr>, CniError> {
    let addresses = request.container_addresses()?;
    if addresses.is_empty() {
        return Err(CniError::new(
            Code::InvalidConfig,
            "no container address",
            format!(
                "prevResult has no address of interface {} in the container",
                crate::model::echo::Echo::from(attachment.ifname.as_str())
            ),
        ));
    }
    Ok(addresses)
}

/// What ADD creates for `request` (and CHECK plans without a manifest): the attachment `id`
/// with the request's mappings towards `addresses`.
fn creating<'a>(
    request: &Request,
    attachment: &Attachment,
    id: ContainerId,
    addresses: &'a dyn Fn() -> Result<Vec<IfAddr>, ops::Error>,
    settings: &Settings,
    netns: Option<NetnsId>,
) -> Creating<'a> {
    let netns_path = request.env.netns.clone();
    Creating {
        id,
        pid: None,
        bundle: None,
        mappings: request.conf.mappings.clone(),
        addresses,
        refuse_conflicts: settings.refuse_conflicts(),
        // portmap's way (the newest serves, the older waits behind), unless
        // `portConflict: "refuse"`.
        held: if settings.refuse_conflicts() {
            Held::Refuse
        } else {
            Held::Stack
        },
        pod: None,
        netns,
        cni: Some(CniAttachment {
            container_id: attachment.container_id.clone(),
            ifname: attachment.ifname.clone(),
            network: request.conf.name.clone(),
            netns_path,
            deleted: false,
        }),
    }
}

/// CHECK's error when `missing` of the `total` rules of attachment `id` are not in place
/// (`note` says why these were the rules looked for); `None` when all are.
fn missing_error(
    id: &ContainerId,
    missing: &[RuleRecord],
    total: usize,
    note: &str,
) -> Option<CniError> {
    let first = missing.first()?;
    Some(CniError::new(
        Code::Failed,
        "port mapping rules missing",
        format!(
            "{note}{} of {total} rule(s) of attachment {id} missing, first in {} {} {}: {}",
            missing.len(),
            first.backend,
            first.family,
            first.table_name(),
            rule_line(&first.chain, &first.args())
        ),
    ))
}

/// CHECK of an attachment natledger has no manifest of (its state lost): the rules ADD
/// would write for this request ([`ops::planned`]) looked for where they would be, in the
/// configured backend, then (some missing there) in each other backend, as ADD would have
/// written them there: an earlier ADD may have had another backend. Success when one backend
/// holds them all (a warning names it and says the state is lost: a later DEL removes by
/// tag); otherwise the first rule missing in the configured backend is named.
fn check_unrecorded(
    ctx: &mut Context,
    request: &Request,
    attachment: &Attachment,
    id: ContainerId,
    settings: &Settings,
) -> Result<(), CniError> {
    let addresses = container_addresses(request, attachment)?;
    let lookup = || Ok(addresses.clone());
    let input = creating(request, attachment, id, &lookup, settings, None);
    let planned = ops::planned(ctx, &input)
        .map_err(|e| too_large_or(e, "could not plan the port mappings"))?;
    let missing =
        ops::missing_rules(ctx, &planned).map_err(|e| failed("could not read the rules", e))?;
    let note = format!(
        "natledger has no manifest of attachment {} (its state lost): ",
        input.id
    );
    let found = match missing_error(&input.id, &missing, planned.len(), &note) {
        None => (ctx.backend(), planned.len()),
        Some(e) => held_elsewhere(ctx, &input).ok_or(e)?,
    };
    log::warn!(
        "{note}its {} rule(s) are in place in {}; a DEL removes the rules tagged {}",
        found.1,
        found.0,
        crate::model::layout::tag(&input.id)
    );
    Ok(())
}

/// The first backend other than the configured one holding every rule `input` would have
/// there, and how many; a backend that cannot be planned for or read holds none.
fn held_elsewhere(ctx: &mut Context, input: &ops::Creating) -> Option<(Backend, usize)> {
    let configured = ctx.driver;
    let found = ctx
        .drivers
        .iter()
        .filter(|d| d.backend() != configured.backend())
        .find_map(|driver| {
            let backend = driver.backend();
            ctx.driver = *driver;
            let planned = ops::planned(ctx, input).ok().filter(|p| !p.is_empty())?;
            let missing = ops::missing_rules(ctx, &planned).ok()?;
            missing.is_empty().then_some((backend, planned.len()))
        });
    ctx.driver = configured;
    found
}

impl Plugin for Natledger {
    /// The attachment's mappings installed and recorded as a hook container's are, under the
    /// attachment's ledger id; no mapping: nothing is run, nothing recorded.
    fn add(&self, request: &Request) -> Result<(), CniError> {
        if let Some(netns) = &request.env.netns {
            super::validate::netns(netns)?;
        }
        if request.conf.mappings.is_empty() {
            return Ok(());
        }
        let attachment = request.attachment().expect("ADD has an attachment");
        let id = attachment.ledger_id()?;
        let addresses = container_addresses(request, attachment)?;
        let settings = self.settings(request, Bad::Refused)?;
        let (runner, machine) = (settings.runner(), settings.machine());
        let ctx = Self::context(&settings, &runner, &machine);
        let lookup = || Ok(addresses.clone());
        let netns = request
            .env
            .netns
            .as_deref()
            .and_then(|path| liveness::netns_to_record(ctx.host, path));
        let creating = creating(request, attachment, id, &lookup, &settings, netns);
        ops::create(&ctx, &creating)
            .map(|_| ())
            .map_err(|e| too_large_or(e, "could not install the port mappings"))
    }

    /// Whatever the ledger recorded for the attachment goes; `runtimeConfig` and
    /// `prevResult` are not needed. Without a manifest (natledger's state lost), every rule
    /// tagged with the attachment's ledger id in natledger's chains goes, in every backend and
    /// family (`ops::detach`), unless a live container's manifest says it shares them. A
    /// manifest recording no CNI attachment is a hook container's: it stays, with a warning.
    /// Nothing found (no ADD, a second DEL) is success.
    fn del(&self, request: &Request) -> Result<(), CniError> {
        let attachment = request.attachment().expect("DEL has an attachment");
        // An id that cannot be formed was never recorded nor tagged.
        let Ok(id) = attachment.ledger_id() else {
            return Ok(());
        };
        let settings = self.settings(request, Bad::Ignored)?;
        let ledger = Ledger::new(settings.state_dir.clone());
        // natledger never writes in a directory it refuses, so nothing of the attachment is
        // recorded there: DEL succeeds (libcni would otherwise stop the conflist's DEL here,
        // and the interface's and the address's DEL would never run), saying why on stderr.
        if let Err(e @ LedgerError::NotOurs { .. }) = ledger.readable() {
            log::info!("{e}; nothing can be recorded there, DEL has nothing to do");
            return Ok(());
        }
        let recorded = ledger.has_manifest(&id);
        let (runner, machine) = (settings.runner(), settings.machine());
        let ctx = Self::context(&settings, &runner, &machine);
        match ops::detach(&ctx, &id) {
            Ok(ops::Removed::Done { rules }) if !recorded && rules > 0 => {
                log::warn!(
                    "natledger had no manifest of attachment {id} (its state lost); removed \
                     the {rules} rule(s) tagged {}",
                    crate::model::layout::tag(&id)
                );
                Ok(())
            }
            Ok(_) => Ok(()),
            // No manifest, and the ledger cannot even be locked (its directory cannot be
            // made): the conflist's DEL goes on; a sweep removes what may be tagged.
            Err(ops::Error::Ledger(e)) if !recorded => {
                log::warn!(
                    "{}; the rules tagged {} are not looked for",
                    crate::causes::Causes(&e),
                    crate::model::layout::tag(&id)
                );
                Ok(())
            }
            Err(e) => Err(failed("could not remove the port mappings", e)),
        }
    }

    /// Every rule recorded for the attachment is where it was written (backend, family,
    /// table, chain, arguments); an error names the first missing ones. A manifest not fully
    /// installed is an error too. Without a manifest (natledger's state lost), the rules ADD
    /// would write for this request are looked for instead, and the answer says so.
    fn check(&self, request: &Request) -> Result<(), CniError> {
        // The spec requires it; portmap refuses without it too.
        if request.conf.prev_result.is_none() {
            return Err(CniError::new(
                Code::InvalidConfig,
                "required prevResult missing",
                "CHECK needs the result of the attachment's ADD",
            ));
        }
        let attachment = request.attachment().expect("CHECK has an attachment");
        let id = attachment.ledger_id()?;
        let settings = self.settings(request, Bad::Refused)?;
        let (runner, machine) = (settings.runner(), settings.machine());
        let ledger = Ledger::new(settings.state_dir.clone());
        let backend = settings.backend.resolve(settings.host());
        let mut ctx = Context::new(ledger, backend, Netfilter::new(&runner), &machine);
        let manifest = ctx
            .ledger
            .load(&id)
            .map_err(|e| failed_ledger("could not read the attachment's manifest", e))?;
        let Some(manifest) = manifest else {
            if request.conf.mappings.is_empty() {
                return Ok(());
            }
            return check_unrecorded(&mut ctx, request, attachment, id, &settings);
        };
        if manifest.phase != Phase::Installed {
            return Err(CniError::new(
                Code::Failed,
                "port mappings not installed",
                format!("attachment {id} is {:?}, not installed", manifest.phase),
            ));
        }
        // The mappings asked for now are those recorded (merged into ranges, split between
        // the attachment's own and those it shares), whatever the form.
        let recorded = manifest
            .mappings
            .iter()
            .chain(manifest.shares.iter().flat_map(|s| s.mappings.iter()));
        let (asked, recorded) = (canonical(&request.conf.mappings), canonical(recorded));
        if asked != recorded {
            let words = |m: &[crate::model::portspec::PortMapping]| {
                m.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Err(CniError::new(
                Code::Failed,
                "port mappings differ",
                format!(
                    "attachment {id} has {} installed, CHECK asks for {}",
                    words(&recorded),
                    words(&asked)
                ),
            ));
        }
        let missing = ops::missing_rules(&ctx, &manifest.rules)
            .map_err(|e| failed("could not read the rules", e))?;
        missing_error(&id, &missing, manifest.rules.len(), "").map_or(Ok(()), Err)
    }

    /// Every attachment of this network (by its manifest's `cni.network`) whose
    /// `(containerID, ifname)` is not in `cni.dev/valid-attachments` is removed as by DEL;
    /// other networks' and OCI hook containers' manifests (no `cni`) are never touched.
    /// Keeps going past a failure and reports them all (SPEC.md §2 GC). Rules without a
    /// manifest (natledger's state lost) stay: their tag names an attachment, not its
    /// network, so nothing proves them this network's; its DEL (by tag) or a sweep removes
    /// them.
    fn gc(&self, request: &Request) -> Result<(), CniError> {
        // Without the list, every attachment of the network would look stale: refuse.
        let Some(valid) = &request.conf.valid_attachments else {
            return Err(CniError::new(
                Code::InvalidConfig,
                "missing cni.dev/valid-attachments",
                "GC needs the list of still valid attachments",
            ));
        };
        let settings = self.settings(request, Bad::Ignored)?;
        let (runner, machine) = (settings.runner(), settings.machine());
        let ctx = Self::context(&settings, &runner, &machine);
        let listed = ctx
            .ledger
            .list()
            .map_err(|e| failed_ledger("could not read the ledger", e))?;
        let mut errors = Vec::new();
        for manifest in listed.into_iter().flatten() {
            let Some(cni) = &manifest.cni else { continue };
            let stale = cni.network == request.conf.name
                && !valid
                    .iter()
                    .any(|v| v.container_id == cni.container_id && v.ifname == cni.ifname);
            if stale && let Err(e) = ops::remove_recorded(&ctx, &manifest.container_id) {
                errors.push(crate::causes::text(&e));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                Code::Failed,
                "could not remove every stale attachment",
                errors.join("; "),
            ))
        }
    }

    /// Ready when the ledger can be locked (its directory made and checked) and the
    /// backend's restore tools exist for both families (nftables: a netfilter netlink socket
    /// opens); otherwise 50 with the reason.
    fn status(&self, request: &Request) -> Result<(), CniError> {
        let settings = self.settings(request, Bad::Ignored)?;
        let ledger = Ledger::new(settings.state_dir.clone());
        let unavailable = |details: String| {
            CniError::new(
                Code::Unavailable,
                "natledger cannot write rules here",
                details,
            )
        };
        ledger
            .lock()
            .map_err(|e| unavailable(crate::causes::text(&e)))?;
        let backend = settings.backend.resolve(settings.host());
        if !backend.is_iptables() {
            return crate::kernel::netlink::Socket::netfilter()
                .map(drop)
                .map_err(|e| unavailable(format!("cannot open a netfilter netlink socket: {e}")));
        }
        for family in Family::ALL {
            tool(settings.host(), backend, family, "restore")
                .map_err(|e| unavailable(crate::causes::text(&e)))?;
        }
        Ok(())
    }
}
