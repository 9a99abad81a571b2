//! Sharing's side of a stop (`crate::state::sharing`): a holder's rules stay while a container
//! sharing them lives, and the last one to stop releases the holders kept only for it.

use std::collections::HashSet;

use crate::causes::Causes;
use crate::kernel::conntrack::Flows;
use crate::model::oci::ContainerId;
use crate::state::ledger::{Locked, Manifest};

use super::super::Context;
use super::{remove_container, settle};

/// The rules this stopped container shared: each holder that is dead and has no other live
/// sharer was kept for it, and goes now; so, in turn, do the holders such a holder shared.
pub(super) fn release_holders(
    ctx: &Context,
    locked: &Locked,
    stopped: &ContainerId,
    mut queue: Vec<ContainerId>,
    stale_flows: &mut Vec<Flows>,
) {
    let mut seen = HashSet::new();
    while let Some(holder_id) = queue.pop() {
        if !seen.insert(holder_id.clone()) {
            continue;
        }
        let holder = match ctx.ledger.load(&holder_id) {
            Ok(Some(holder)) => holder,
            Ok(None) => continue,
            Err(e) => {
                log::warn!("{}; sweep will judge it", Causes(&e));
                continue;
            }
        };
        if holder.alive(ctx.host) || !live_sharers(ctx, &holder, stopped).is_empty() {
            continue;
        }
        let removal = remove_container(ctx, locked, &holder_id, Some(&holder));
        stale_flows.extend(removal.flows.iter().copied());
        if removal.removed > 0 {
            log::info!(
                "removed {} rule(s) of container {holder_id} (kept for {stopped}, \
                 its last live sharer)",
                removal.removed
            );
        }
        queue.extend(holder.shares.iter().map(|s| s.holder.clone()));
        if let Err(e) = settle(locked, &holder_id, Some(holder), removal) {
            log::warn!("{}", Causes(&e));
        }
    }
}

/// The containers other than `except` that may share `holder`'s rules and live: those its
/// `shared_by` names whose manifest still says so and whose process lives, and, since
/// nothing can be judged of them, those whose manifest cannot be read.
pub(super) fn live_sharers(
    ctx: &Context,
    holder: &Manifest,
    except: &ContainerId,
) -> Vec<ContainerId> {
    holder
        .shared_by
        .iter()
        .filter(|id| *id != except)
        .filter(|id| match ctx.ledger.load(id) {
            Ok(Some(m)) => shares_alive(ctx, &m, &holder.container_id),
            Ok(None) => false,
            Err(_) => true,
        })
        .cloned()
        .collect()
}

/// The live containers sharing the rules of `holder`, which has no manifest (natledger's
/// state lost, a manifest removed by hand), so no `shared_by` hint: every readable manifest
/// is asked whether its `shares` names `holder`, judged as [`live_sharers`] judges one. A
/// manifest that cannot be read says nothing of whom it shares: it is not counted.
pub(super) fn live_sharers_without_manifest(
    ctx: &Context,
    holder: &ContainerId,
) -> Vec<ContainerId> {
    let listed = match ctx.ledger.list() {
        Ok(listed) => listed,
        Err(e) => {
            log::warn!(
                "{}; no container is known to share {holder}'s rules",
                Causes(&e)
            );
            return Vec::new();
        }
    };
    listed
        .into_iter()
        .flatten()
        .filter(|m| m.container_id != *holder && shares_alive(ctx, m, holder))
        .map(|m| m.container_id)
        .collect()
}

/// Whether `sharer`'s manifest says it shares `holder`'s rules and its container lives: the
/// one judgement of a live sharer.
fn shares_alive(ctx: &Context, sharer: &Manifest, holder: &ContainerId) -> bool {
    sharer.shares.iter().any(|s| s.holder == *holder) && sharer.alive(ctx.host)
}

#[cfg(test)]
mod tests {
    use crate::backend::{Backend, Driver};
    use crate::model::portspec::parse_mappings;
    use crate::ops::testing::*;
    use crate::ops::{Context, Created, Creating, Removed, create, create_runtime};
    use crate::ops::{detach, poststop, remove_recorded};
    use crate::state::ledger::{CniAttachment, Ledger};

    use super::*;

    fn id(s: &str) -> ContainerId {
        s.parse().unwrap()
    }

    /// A CNI attachment of this process's network namespace holding 8080:80, as ADD makes it.
    fn add_attachment(ctx: &Context) -> Created {
        let addresses = || {
            Ok(vec![
                "10.77.0.2".parse::<std::net::IpAddr>().unwrap().into(),
            ])
        };
        let path = std::path::PathBuf::from(NETNS_PATH);
        create(
            ctx,
            &Creating {
                id: id("cid+eth0"),
                pid: None,
                bundle: None,
                mappings: parse_mappings("8080:80").unwrap(),
                addresses: &addresses,
                refuse_conflicts: false,
                held: crate::ops::Held::Stack,
                pod: None,
                netns: ctx.host.netns_at(&path).ok(),
                cni: Some(CniAttachment {
                    container_id: "cid".into(),
                    ifname: "eth0".into(),
                    network: "net".into(),
                    netns_path: Some(path),
                    deleted: false,
                }),
            },
        )
        .unwrap()
    }

    /// A hook container in the same namespace (this process) asking for the same mapping.
    fn hook_container(dir: &std::path::Path) -> crate::model::oci::HookInput {
        let mut input = input(dir);
        input.id = id("app");
        input.pid = Some(PID);
        input
    }

    fn stopped(dir: &std::path::Path, id: &str) -> crate::model::oci::State {
        crate::model::oci::State {
            id: id.into(),
            status: "stopped".into(),
            // As a runtime that names the stopped process (this test's own).
            pid: Some(PID),
            bundle: Some(dir.into()),
            annotations: None,
        }
    }

    /// A hook container in an attachment's namespace shares its port; the attachment's DEL
    /// keeps the rules while it lives (and records the DEL); its poststop then removes them.
    #[test]
    fn an_attachments_del_keeps_its_rules_for_a_hook_container_of_its_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let nft = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&nft];
        let ctx = fake_context(Ledger::new(dir.path()), &nft, &drivers, &host);
        assert_eq!(add_attachment(&ctx), Created::Installed { rules: 4 });

        nft.take_calls();
        let shared = create_runtime(&ctx, &hook_container(dir.path())).unwrap();
        assert_eq!(shared, Created::Installed { rules: 0 });
        let app = ctx.ledger.load(&id("app")).unwrap().unwrap();
        assert_eq!(app.shares[0].holder, id("cid+eth0"));

        let kept = remove_recorded(&ctx, &id("cid+eth0")).unwrap();
        assert_eq!(
            kept,
            Removed::Kept {
                rules: 4,
                sharers: vec![id("app")]
            }
        );
        assert!(nft.take_calls().is_empty(), "nothing deleted");
        let attachment = ctx.ledger.load(&id("cid+eth0")).unwrap().unwrap();
        assert!(attachment.cni.as_ref().unwrap().deleted && !attachment.alive(ctx.host));
        // A second DEL keeps them too.
        assert!(matches!(
            remove_recorded(&ctx, &id("cid+eth0")).unwrap(),
            Removed::Kept { .. }
        ));
        // ADD again (the runtime retries the attachment): in the namespace whose live member
        // shares the rules, it takes them over where they are, and lives again.
        assert_eq!(add_attachment(&ctx), Created::Installed { rules: 4 });
        assert!(nft.take_calls().is_empty(), "nothing deleted or written");
        let again = ctx.ledger.load(&id("cid+eth0")).unwrap().unwrap();
        assert!(!again.cni.as_ref().unwrap().deleted && again.alive(ctx.host));
        assert_eq!(again.rules, attachment.rules);
        assert!(matches!(
            remove_recorded(&ctx, &id("cid+eth0")).unwrap(),
            Removed::Kept { .. }
        ));

        nft.take_calls();
        assert_eq!(nft.holding("natledger:cid+eth0"), 4);
        poststop(&ctx, &stopped(dir.path(), "app")).unwrap();
        assert_eq!(
            nft.holding("natledger:cid+eth0"),
            0,
            "the attachment's rules went"
        );
        let removes = nft.take_calls().into_iter();
        assert_eq!(removes.filter(|c| matches!(c, Call::Remove(..))).count(), 1);
        assert!(ctx.ledger.list().unwrap().is_empty(), "no manifest left");
    }

    /// The other order: the hook container stops first, while the attachment lives (no DEL
    /// yet): the rules stay; the attachment's DEL removes them.
    #[test]
    fn a_hook_containers_stop_keeps_a_live_attachments_rules() {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let nft = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&nft];
        let ctx = fake_context(Ledger::new(dir.path()), &nft, &drivers, &host);
        add_attachment(&ctx);
        create_runtime(&ctx, &hook_container(dir.path())).unwrap();

        nft.take_calls();
        assert_eq!(
            poststop(&ctx, &stopped(dir.path(), "app")).unwrap(),
            Removed::Done { rules: 0 }
        );
        assert!(nft.take_calls().is_empty(), "nothing deleted");

        nft.take_calls();
        assert!(matches!(
            remove_recorded(&ctx, &id("cid+eth0")).unwrap(),
            Removed::Done { .. }
        ));
        assert_eq!(
            nft.holding("natledger:cid+eth0"),
            0,
            "the attachment's rules went"
        );
        assert!(ctx.ledger.list().unwrap().is_empty(), "no manifest left");
    }

    /// natledger's state of the attachment lost (its manifest removed) while a live hook
    /// container's manifest says it shares the attachment's rules: the DEL keeps them, as with
    /// the manifest, reading and deleting nothing.
    #[test]
    fn a_del_without_the_attachments_manifest_keeps_the_rules_a_live_container_shares() {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let nft = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&nft];
        let ctx = fake_context(Ledger::new(dir.path()), &nft, &drivers, &host);
        add_attachment(&ctx);
        create_runtime(&ctx, &hook_container(dir.path())).unwrap();
        std::fs::remove_file(ctx.ledger.manifest_path(&id("cid+eth0"))).unwrap();

        nft.take_calls();
        assert_eq!(
            detach(&ctx, &id("cid+eth0")).unwrap(),
            Removed::Kept {
                rules: 0,
                sharers: vec![id("app")]
            }
        );
        assert!(nft.take_calls().is_empty(), "nothing read or deleted");
        assert!(!ctx.ledger.has_manifest(&id("cid+eth0")), "none written");
        assert!(ctx.ledger.has_manifest(&id("app")));
    }

    /// A hook container whose id has the form of an attachment's (`w+eth0`): a CNI DEL or
    /// GC naming it (CNI_CONTAINERID=w, CNI_IFNAME=eth0) leaves its manifest and rules.
    #[test]
    fn a_del_naming_a_hook_containers_manifest_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let nft = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&nft];
        let ctx = fake_context(Ledger::new(dir.path()), &nft, &drivers, &host);
        let mut hook = hook_container(dir.path());
        hook.id = id("w+eth0");
        assert_eq!(
            create_runtime(&ctx, &hook).unwrap(),
            Created::Installed { rules: 4 }
        );
        let before = ctx.ledger.load(&id("w+eth0")).unwrap().unwrap();

        nft.take_calls();
        for removed in [
            detach(&ctx, &id("w+eth0")),
            remove_recorded(&ctx, &id("w+eth0")),
        ] {
            assert_eq!(removed.unwrap(), Removed::NotAnAttachment);
        }
        assert!(nft.take_calls().is_empty(), "nothing read or deleted");
        assert_eq!(ctx.ledger.load(&id("w+eth0")).unwrap().unwrap(), before);
    }
}
