//! What already holds a host port, asked before anything is written: other owners' forwards
//! and local listeners; a warning each, or a refusal.

use std::net::SocketAddr;

use crate::analysis::forwards;
use crate::causes::Causes;
use crate::kernel::host::{self, Listener};
use crate::model::family::Family;
use crate::model::oci::{HookInput, PORT_CONFLICT_ANNOTATION};
use crate::model::portspec::PortMapping;

use super::{Context, Creating, Error};

/// Whether the container asked to refuse a start over a conflict
/// (`io.natledger.port-conflict=refuse`), or, without its annotation, the host
/// (`--port-conflict refuse`, [`Context::refuse_conflicts`]); else a warning.
pub(super) fn refuse_conflicts(ctx: &Context, input: &HookInput) -> bool {
    match input.annotations.get(PORT_CONFLICT_ANNOTATION) {
        Some(setting) => setting == "refuse",
        None => ctx.refuse_conflicts,
    }
}

/// Another owner's DNAT or REDIRECT for a mapped host port, in either backend
/// ([`forwards::find`]): natledger's jump comes first in its own backend, so the port's
/// traffic would be split between that owner's destination and this container. Warn naming
/// each rule, or refuse (see [`refuse_conflicts`]) before anything is written. A port keeper
/// listening on a mapped port (`keepers`, from [`check_listeners`]) holds it for such a
/// forward: the same conflict, said with the rule when one is found, else on its own.
pub(super) fn check_forwards(
    ctx: &Context,
    input: &Creating,
    mappings: &[PortMapping],
    families: &[Family],
    keepers: &[(Listener, PortMapping)],
) -> Result<(), Error> {
    let refuse = input.refuse_conflicts;
    let found = iptables_forwards(ctx, refuse, mappings, families)?;
    let native = nft_forwards(ctx, refuse, mappings, families)?;
    for (keeper, mapping) in keepers {
        if found.iter().any(|f| f.mapping == *mapping) || native.iter().any(|(m, _)| *m == mapping)
        {
            continue;
        }
        keeper_alone(refuse, keeper, mapping)?;
    }
    for f in found {
        iptables_forward(refuse, f, keepers)?;
    }
    for (mapping, f) in native {
        native_forward(refuse, mapping, f)?;
    }
    Ok(())
}

/// Other owners' forwards of the mapped host ports in the iptables backends
/// ([`forwards::find`]); a table that cannot be read is warned about, or refused.
fn iptables_forwards(
    ctx: &Context,
    refuse: bool,
    mappings: &[PortMapping],
    families: &[Family],
) -> Result<Vec<forwards::Forward>, Error> {
    let (found, unread) = if ctx.netfilter.forwards() {
        let cache = ctx.ledger.file(forwards::CACHE_FILE);
        forwards::find(&ctx.netfilter, &cache, mappings, families)
    } else {
        (Vec::new(), Vec::new())
    };
    if let (true, Some(e)) = (refuse, unread.first()) {
        // Refusing over conflicts means not starting on a guess.
        return Err(Error::ForwardsUnchecked(e.to_string()));
    }
    for e in unread {
        log::warn!(
            "{}; other owners' forwards there were not checked",
            Causes(&e)
        );
    }
    Ok(found)
}

/// A port keeper holding `mapping`'s port with no forward of it found: the conflict on its
/// own, warned about or refused.
fn keeper_alone(refuse: bool, keeper: &Listener, mapping: &PortMapping) -> Result<(), Error> {
    let who = listener_text(keeper);
    if refuse {
        return Err(Error::PortInUse {
            mapping: mapping.clone(),
            who,
            addr: keeper.addr,
        });
    }
    log::warn!(
        "{who} holds {} port {}/{} for another owner's forward of it, \
         which {mapping} would take over for this container",
        keeper.addr,
        keeper.port,
        keeper.protocol
    );
    Ok(())
}

/// Another owner's iptables forward `f`, with the keeper holding its port if there is one:
/// warned about, or refused.
fn iptables_forward(
    refuse: bool,
    f: forwards::Forward,
    keepers: &[(Listener, PortMapping)],
) -> Result<(), Error> {
    let rule = f.candidate.rule();
    let line = crate::kernel::xt::save_line(&rule.chain, &rule.args);
    let via: Vec<&str> = f.candidate.path.iter().map(|s| s.chain.as_str()).collect();
    let place = format!(
        "{} {} nat chain {} (rule {}, reached through {})",
        f.backend,
        f.family,
        rule.chain,
        rule.position,
        via.join(" -> ")
    );
    let held = keepers
        .iter()
        .find(|(_, m)| *m == f.mapping)
        .map(|(k, _)| format!(" ({} holds the port for it)", listener_text(k)))
        .unwrap_or_default();
    let place = format!("{place}{held}");
    if refuse {
        return Err(Error::PortForwarded {
            mapping: f.mapping,
            place,
            line,
        });
    }
    log::warn!(
        "host port {} is already forwarded by another owner's rule in \
         {place}: {line}; its traffic would be split between that destination and this \
         container",
        f.mapping
    );
    Ok(())
}

/// Another owner's native nftables forward `f` of `mapping`: warned about, or refused.
fn native_forward(refuse: bool, mapping: &PortMapping, f: forwards::NftFound) -> Result<(), Error> {
    let place = format!("{} (owner {})", f.place, f.owner);
    let line = format!("dnat to {}", SocketAddr::new(f.to, f.to_port));
    if refuse {
        return Err(Error::PortForwarded {
            mapping: mapping.clone(),
            place,
            line,
        });
    }
    log::warn!(
        "host port {}/{} is {} forwarded by another owner's native nftables rule, {place}: \
         {line}; its traffic would be split between that destination and this container \
         (natledger doctor names the fix)",
        f.port,
        f.protocol.as_str(),
        if f.certain { "already" } else { "perhaps" },
    );
    Ok(())
}

/// Other owners' native nftables forwards of the mapped host ports (kube-proxy's nftables
/// mode, netavark, firewalld, Docker 29, portmap's nftables backend:
/// [`forwards::find_nft_live`], kept per nf_tables generation in the state directory),
/// each with its mapping. A ruleset that cannot be read is warned about, or refused as an
/// unread table is.
fn nft_forwards<'m>(
    ctx: &Context,
    refuse: bool,
    mappings: &'m [PortMapping],
    families: &[Family],
) -> Result<Vec<(&'m PortMapping, forwards::NftFound)>, Error> {
    if !ctx.netfilter.direct() {
        return Ok(Vec::new());
    }
    let cache = ctx.ledger.file(forwards::NFT_CACHE_FILE);
    match forwards::find_nft_live(&ctx.netfilter, &cache, mappings, families) {
        Ok(found) => Ok(found
            .into_iter()
            .filter_map(|f| {
                mappings
                    .iter()
                    .find(|m| {
                        m.protocol == f.protocol
                            && (m.host_ports.start..=m.host_ports.end).contains(&f.port)
                    })
                    .map(|m| (m, f))
            })
            .collect()),
        Err(e @ crate::kernel::nftables::NftError::TooManySets { .. }) => {
            // Too costly for every start (kube-proxy's nftables mode with thousands of
            // Services): not checked, as before natledger read native tables; doctor does.
            log::info!(
                "other owners' native nftables forwards not checked: {}; natledger doctor \
                 examines them",
                Causes(&e)
            );
            Ok(Vec::new())
        }
        Err(e) => {
            let e = format!("native nftables tables: {}", Causes(&e));
            if refuse {
                return Err(Error::ForwardsUnchecked(e));
            }
            log::warn!("{e}; other owners' forwards there were not checked");
            Ok(Vec::new())
        }
    }
}

/// A local process already listening on a mapped host port loses that traffic to the
/// container (the DNAT comes first): warn, or refuse (see [`refuse_conflicts`]). A port
/// keeper (docker-proxy, kube-proxy, …) listens for another owner's forward of the port:
/// returned, with its mapping, for [`check_forwards`] to judge with that forward.
pub(super) fn check_listeners(
    ctx: &Context,
    input: &Creating,
    mappings: &[PortMapping],
) -> Result<Vec<(Listener, PortMapping)>, Error> {
    let clash = |l: &Listener, m: &PortMapping| {
        m.protocol == l.protocol
            && (m.host_ports.start..=m.host_ports.end).contains(&l.port)
            && match m.host_destination() {
                Some(ip) => l.addr.is_unspecified() || l.addr == ip || ip.is_unspecified(),
                None => true,
            }
    };
    let listeners = ctx
        .host
        .listeners(&|l| mappings.iter().any(|m| clash(l, m)));
    let refuse = input.refuse_conflicts;
    let mut keepers = Vec::new();
    for l in listeners {
        let mapping = mappings
            .iter()
            .find(|m| clash(&l, m))
            .expect("selected above");
        let keeper = l
            .command
            .as_deref()
            .is_some_and(|c| host::PORT_KEEPERS.contains(&c));
        if keeper {
            keepers.push((l, mapping.clone()));
            continue;
        }
        let who = listener_text(&l);
        if refuse {
            return Err(Error::PortInUse {
                mapping: mapping.clone(),
                who,
                addr: l.addr,
            });
        }
        log::warn!(
            "{who} listens on {} port {}/{}, which {mapping} forwards to \
             the container; that process no longer gets those connections",
            l.addr,
            l.port,
            l.protocol
        );
    }
    Ok(keepers)
}

/// `COMMAND (pid N)`, or the socket when its owner is unknown.
pub(super) fn listener_text(l: &Listener) -> String {
    match (&l.command, l.pid) {
        (Some(c), Some(p)) => format!("{c} (pid {p})"),
        _ => format!("a process (socket inode {})", l.inode),
    }
}
