//! GC's choice among attachments natledger has rules of but no manifest (its state directory
//! lost, a manifest removed by hand): which of them GC of a network removes by tag.
//!
//! A rule's tag is the attachment's ledger id, `<containerID>+<ifname>`: it names the
//! attachment, not its network. GC of network N is told N's valid attachments (V) and
//! nothing of any other network's, so an unrecorded id goes only when natledger can tell it
//! cannot be a valid attachment of another network it serves:
//!
//! 1. the id is an attachment's, in the form natledger writes (`Attachment::from_ledger_id`,
//!    and back to the same id);
//! 2. it is not in V;
//! 3. its container is not in V at all: a container valid on N may be on other networks
//!    through other interfaces (Multus, a podman container on two networks), and the id may
//!    be one of those attachments;
//! 4. natledger's ledger records no attachment of another network: where natledger serves
//!    only N, an attachment it wrote rules for is N's; where it serves another network too,
//!    the id may be that network's, which V says nothing of. Those stay for their DEL (which
//!    names the attachment, and removes by tag) or a sweep.
//!
//! libcni's GC first sends a DEL for each attachment of N in its cache that V does not
//! name; that DEL removes by tag, with libcni's word for the network. This is for what
//! libcni's cache lost too.

use super::Attachment;
use super::netconf::ValidAttachment;
use crate::model::oci::ContainerId;
use crate::state::ledger::Manifest;

/// The ids among `unrecorded` (tagged in natledger's chains, no manifest) whose rules GC of
/// `network` with valid list `valid` removes, by the rules of this file's comment;
/// `manifests` are the ledger's readable ones.
pub fn stale(
    network: &str,
    valid: &[ValidAttachment],
    unrecorded: &[ContainerId],
    manifests: &[Manifest],
) -> Vec<ContainerId> {
    let other_network = manifests
        .iter()
        .filter_map(|m| m.cni.as_ref())
        .find(|cni| cni.network != network);
    if let Some(other) = other_network {
        if !unrecorded.is_empty() {
            log::info!(
                "rules of {} attachment(s) without a manifest stay: natledger also serves \
                 network {}, whose they may be (a DEL or a sweep removes them)",
                unrecorded.len(),
                crate::model::echo::Echo::from(other.network.as_str())
            );
        }
        return Vec::new();
    }
    unrecorded
        .iter()
        .filter(|id| {
            let Some(attachment) = Attachment::from_ledger_id(id) else {
                return false;
            };
            if attachment.ledger_id().ok().as_ref() != Some(*id) {
                return false;
            }
            !valid
                .iter()
                .any(|v| v.container_id == attachment.container_id)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::tests::{cni_sample, sample};

    fn ids(list: &[&str]) -> Vec<ContainerId> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn valid(list: &[(&str, &str)]) -> Vec<ValidAttachment> {
        list.iter()
            .map(|(c, i)| ValidAttachment {
                container_id: (*c).into(),
                ifname: (*i).into(),
            })
            .collect()
    }

    /// An attachment of `network` (container `cid`, eth0).
    fn on(network: &str, cid: &str) -> Manifest {
        let mut m = cni_sample(cid, std::path::Path::new("/run/netns/x"), None);
        m.cni.as_mut().unwrap().network = network.into();
        m
    }

    /// Not in the valid list, its container not either, natledger serving only this network
    /// (or nothing recorded at all): removed. A valid one, one whose container is valid
    /// through another interface, a hook container's id and one natledger would not have
    /// formed: kept.
    #[test]
    fn gone_only_what_cannot_be_another_networks_valid_attachment() {
        let unrecorded = ids(&[
            "dead1+eth0",
            "live1+eth0",
            "live1+net1",
            "hookc",
            "odd+zz+",
            "esc+eth+2E0",
        ]);
        let v = valid(&[("live1", "eth0")]);
        for manifests in [vec![], vec![on("net", "other"), sample()]] {
            assert_eq!(
                stale("net", &v, &unrecorded, &manifests),
                ids(&["dead1+eth0"]),
                "{manifests:?}"
            );
        }
        // An escaped interface name (`eth.0` is written as is; a space as `+20`) decodes.
        let spaced = ids(&["dead2+e+20x"]);
        assert_eq!(stale("net", &v, &spaced, &[]), spaced);
    }

    /// Where natledger also serves another network, no unrecorded id goes: it may be that
    /// network's valid attachment.
    #[test]
    fn another_network_known_keeps_every_unrecorded_id() {
        let unrecorded = ids(&["dead1+eth0"]);
        let manifests = [on("net", "a"), on("othernet", "b")];
        assert!(stale("net", &[], &unrecorded, &manifests).is_empty());
    }
}
