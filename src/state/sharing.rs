//! Containers that share one network namespace and ask for the same ports.
//!
//! A Kubernetes pod (containerd and CRI-O copy the pod's annotations into the sandbox's spec
//! and every app container's), a podman pod, Docker's `--network container:X` and runc bundles
//! naming one netns path all put several containers in one network namespace. Where they ask
//! for the same ports forwarded the same way, the rules exist once (judged port by port: a
//! range is cut at the holder's mappings, `ops::create::share`): the first container to ask
//! installs them (the *holder*, whose tag they carry) and every later one in that namespace
//! *shares* them. The rules stay while any of them lives, and go when the last one is gone,
//! so an app container's stop or crash never cuts the pod's port.
//!
//! How sharing is recorded (see [`crate::state::ledger::Manifest`]):
//!
//! ```text
//! containers/<holder>.json   mappings + rules (tagged natledger:<holder>), netns, pod,
//!                            shared_by: [<sharer>, ...]   (a hint for the holder's poststop)
//! containers/<sharer>.json   shares: [{holder, mappings}], netns, pod; its own mappings and
//!                            rules only for ports no one in its namespace held before
//! ```
//!
//! `shares` in the sharer's manifest is the truth; the holder's `shared_by` only spares its
//! poststop a scan of every manifest (a name in it whose manifest is gone, dead or no longer
//! shares means nothing).
//!
//! Membership is decided only on positive evidence, at the sharer's create (a hook's
//! create-runtime or a CNI ADD): its network namespace (the device and inode of
//! `/proc/<pid>/ns/net`, or of a CNI attachment's `CNI_NETNS`, and the namespace cookie where
//! both sides recorded one: `NetnsId::same`) is the one a *live* member is in right now: its
//! process's, or for a CNI attachment (no process) the one its recorded path still names
//! (device, inode and cookie: a recorded inode alone could be a reused one), and the
//! pod ids the CRI annotations give (containerd's `io.kubernetes.cri.sandbox-id`, CRI-O's
//! `io.kubernetes.cri-o.SandboxID`) do not differ. A container in another namespace asking
//! for a held port is refused, as before.
//!
//! A CNI attachment is a member like a container (podman with CNI and the hook, a pod whose
//! sandbox attachment holds a hostPort a container's hook also asks for): its DEL goes the
//! way of a poststop (`ops::remove`), and once DEL ran it counts as stopped
//! (`CniAttachment::deleted`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use crate::kernel::machine::Host;
use crate::kernel::netns_id::{NetnsAtPath, NetnsId};
use crate::model::oci::{CRI_SANDBOX_ID, CRIO_SANDBOX_ID, ContainerId};
use crate::state::ledger::Manifest;
use crate::state::liveness;

/// The pod a container belongs to, as containerd's or CRI-O's annotations name it (the
/// sandbox's id; a sandbox names itself).
pub fn pod_of(annotations: &HashMap<String, String>) -> Option<String> {
    [CRI_SANDBOX_ID, CRIO_SANDBOX_ID]
        .into_iter()
        .find_map(|key| annotations.get(key))
        .filter(|id| !id.is_empty())
        .cloned()
}

/// Whose rules are still needed, judged over every readable manifest: a manifest's rules are
/// needed while its container lives or while any live container shares them. Liveness is
/// read from the host (its procfs) only when asked, once per container: create asks about
/// the few manifests that claim its ports, not about every container on the host.
pub struct Needs<'a> {
    host: &'a dyn Host,
    by_id: HashMap<&'a ContainerId, &'a Manifest>,
    /// Holder → the containers whose manifests say they share its rules (alive or not).
    sharing: HashMap<&'a ContainerId, Vec<&'a Manifest>>,
    alive: RefCell<HashMap<&'a ContainerId, bool>>,
}

impl<'a> Needs<'a> {
    pub fn judge(
        host: &'a dyn Host,
        manifests: impl IntoIterator<Item = &'a Manifest>,
    ) -> Needs<'a> {
        let mut by_id = HashMap::new();
        let mut sharing: HashMap<&ContainerId, Vec<&Manifest>> = HashMap::new();
        for m in manifests {
            by_id.insert(&m.container_id, m);
            for shared in &m.shares {
                sharing.entry(&shared.holder).or_default().push(m);
            }
        }
        Needs {
            host,
            by_id,
            sharing,
            alive: RefCell::new(HashMap::new()),
        }
    }

    /// Whether container `id`'s own process lives (a container without a readable manifest
    /// counts as dead here; callers keep the rules of unreadable manifests themselves).
    pub fn alive(&self, id: &ContainerId) -> bool {
        let Some((key, manifest)) = self.by_id.get_key_value(id) else {
            return false;
        };
        *self
            .alive
            .borrow_mut()
            .entry(key)
            .or_insert_with(|| manifest.alive(self.host))
    }

    /// The live containers that share `id`'s rules.
    pub fn sharers(&self, id: &ContainerId) -> Vec<&'a Manifest> {
        self.sharing.get(id).map_or_else(Vec::new, |all| {
            all.iter()
                .copied()
                .filter(|m| self.alive(&m.container_id))
                .collect()
        })
    }

    /// Whether `id`'s rules must stay: it lives, or a live container shares them.
    pub fn needed(&self, id: &ContainerId) -> bool {
        self.alive(id) || !self.sharers(id).is_empty()
    }
}

/// Whether a container about to be created is a member of a holder's live group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// In the network namespace a live member is in now, with no pod id saying otherwise.
    Same,
    /// Its network namespace is another one than every live member's.
    OtherNamespace,
    /// Its pod id differs from the group's (two pods on the host's network, say).
    OtherPod,
    /// Nothing to compare: no pid of its own, or no live member's namespace readable.
    Unknown,
}

impl std::fmt::Display for Membership {
    /// As the end of a sentence about the holder: " in another network namespace".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Membership::Same | Membership::Unknown => "",
            Membership::OtherNamespace => " in another network namespace",
            Membership::OtherPod => " of another pod",
        })
    }
}

/// Whether the joiner (the manifest a create is about to write: its `netns` read now, its
/// `pod`) belongs to `holder`'s live group (`members`: the holder if it lives, and its live
/// sharers).
pub fn membership(
    host: &dyn Host,
    joiner: &Manifest,
    holder: &Manifest,
    members: &[&Manifest],
) -> Membership {
    let pods_differ = |m: &Manifest| matches!((joiner.pod.as_deref(), m.pod.as_deref()), (Some(a), Some(b)) if a != b);
    if pods_differ(holder) || members.iter().any(|m| pods_differ(m)) {
        return Membership::OtherPod;
    }
    let Some(netns) = joiner.netns else {
        return Membership::Unknown;
    };
    let theirs: Vec<NetnsId> = members
        .iter()
        .filter_map(|m| current_netns(host, m))
        .collect();
    if theirs.iter().any(|theirs| theirs.same(netns)) {
        Membership::Same
    } else if theirs.is_empty() {
        Membership::Unknown
    } else {
        Membership::OtherNamespace
    }
}

/// The network namespace a member is in now. A CNI attachment has no process: its
/// namespace is the one its recorded path (`CNI_NETNS`) names now, when that is still the one
/// ADD recorded ([`attachment_netns`]). A container: the namespace its process is in, only for
/// a pid recorded in this pid namespace (another one's pid numbers name other processes
/// here), and only if the process still has its recorded start time after the read (the pid
/// was not reused meanwhile).
fn current_netns(host: &dyn Host, member: &Manifest) -> Option<NetnsId> {
    if let Some(cni) = &member.cni {
        return attachment_netns(host, cni.netns_path.as_deref(), member.netns);
    }
    let pid = member.pid?;
    if member.pid_namespace != host.pid_namespace() {
        return None;
    }
    let netns = host.netns_of_pid(pid)?;
    let start = member.pid_start_time?;
    (host.process(pid).start_time() == Some(start)).then_some(netns)
}

/// An attachment's namespace, judged from what ADD recorded (its path and the namespace that
/// path named then) by [`liveness::netns_at_path`]: the recorded namespace while its path still
/// names it, else none (the path is gone, unreadable, or names another namespace now: the
/// attachment's is gone, and its identity may since name another one; or nothing recorded).
pub fn attachment_netns(
    host: &dyn Host,
    path: Option<&Path>,
    recorded: Option<NetnsId>,
) -> Option<NetnsId> {
    let (path, recorded) = path.zip(recorded)?;
    (liveness::netns_at_path(host, path, recorded) == NetnsAtPath::Same).then_some(recorded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::machine::fake::{FakeHost, PID_NAMESPACE, netns};

    /// A host container's process and the namespace paths of these tests.
    const PID: i32 = 4242;
    const START: u64 = 1000;
    const NET: &str = "/run/netns/cni-1";

    fn host() -> FakeHost {
        FakeHost::default()
            .with_process(PID, START, netns(1))
            .with_namespace(NET, netns(1))
    }

    #[test]
    fn pods_come_from_either_runtime() {
        let map = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(pod_of(&map(CRI_SANDBOX_ID, "s1")).as_deref(), Some("s1"));
        assert_eq!(pod_of(&map(CRIO_SANDBOX_ID, "s2")).as_deref(), Some("s2"));
        assert_eq!(pod_of(&map(CRI_SANDBOX_ID, "")), None);
        assert_eq!(pod_of(&HashMap::new()), None);
    }

    fn attachment(netns_path: &str, netns: Option<NetnsId>) -> Manifest {
        Manifest {
            schema: crate::state::ledger::SCHEMA,
            container_id: "cid+eth0".parse().unwrap(),
            bundle: None,
            pid: None,
            pid_start_time: None,
            boot_id: None,
            pid_namespace: None,
            phase: crate::state::ledger::Phase::Installed,
            mappings: crate::model::portspec::parse_mappings("8080:80").unwrap(),
            addresses: vec!["10.77.0.2".parse().unwrap()],
            rules: Vec::new(),
            netns,
            pod: None,
            shares: Vec::new(),
            shared_by: Vec::new(),
            stacked_on: Vec::new(),
            cni: Some(crate::state::ledger::CniAttachment {
                container_id: "cid".into(),
                ifname: "eth0".into(),
                network: "net".into(),
                netns_path: Some(netns_path.into()),
                deleted: false,
            }),
        }
    }

    /// A hook container whose process is [`PID`], in namespace `netns(1)`.
    fn container() -> Manifest {
        let mut m = attachment("/unused", Some(netns(1)));
        m.cni = None;
        m.container_id = "app".parse().unwrap();
        m.pid = Some(PID);
        m.pid_start_time = Some(START);
        m.pid_namespace = Some(PID_NAMESPACE);
        m
    }

    #[test]
    fn an_attachment_is_in_the_namespace_its_path_still_names() {
        let host = host();
        let net = Some(Path::new(NET));
        let (a, b) = (netns(1), netns(2));
        assert_eq!(attachment_netns(&host, net, Some(a)), Some(a));
        // The path names another namespace now, or none: no evidence of where it is.
        assert_eq!(attachment_netns(&host, net, Some(b)), None);
        let gone = Some(Path::new("/run/netns/natledger-no-such-namespace"));
        assert_eq!(attachment_netns(&host, gone, Some(a)), None);
        // ADD could not read the namespace, or had no path: nothing to compare with.
        assert_eq!(attachment_netns(&host, net, None), None);
        assert_eq!(attachment_netns(&host, None, Some(a)), None);
    }

    /// A container's namespace is its process's, only while that process is the recorded
    /// one (same start time) in this pid namespace.
    #[test]
    fn a_containers_namespace_is_its_recorded_process_s() {
        let host = host();
        let m = container();
        assert_eq!(current_netns(&host, &m), Some(netns(1)));
        let reused = Manifest {
            pid_start_time: Some(START + 1),
            ..m.clone()
        };
        assert_eq!(current_netns(&host, &reused), None, "another process");
        let elsewhere = Manifest {
            pid_namespace: Some(1),
            ..m.clone()
        };
        assert_eq!(
            current_netns(&host, &elsewhere),
            None,
            "another pid namespace"
        );
        let gone = Manifest {
            pid: Some(PID + 1),
            ..m
        };
        assert_eq!(current_netns(&host, &gone), None);
    }

    /// A container joining the namespace a CNI attachment's path names is a member of its
    /// group; an attachment whose path is gone or names another namespace than ADD recorded
    /// gives no evidence.
    #[test]
    fn membership_of_an_attachment_comes_from_its_recorded_path() {
        let host = host();
        let mine = netns(1);
        let joiner = container();
        let holder = attachment(NET, Some(mine));
        assert_eq!(current_netns(&host, &holder), Some(mine));
        let member = |j: &Manifest, h: &Manifest| membership(&host, j, h, &[h]);
        assert_eq!(member(&joiner, &holder), Membership::Same);
        // A joiner in another namespace.
        let mut elsewhere = joiner.clone();
        elsewhere.netns = Some(netns(2));
        assert_eq!(member(&elsewhere, &holder), Membership::OtherNamespace);
        let gone = attachment("/run/netns/natledger-no-such-namespace", Some(mine));
        assert_eq!(member(&joiner, &gone), Membership::Unknown);
        let moved = attachment(NET, Some(netns(2)));
        assert_eq!(member(&joiner, &moved), Membership::Unknown);
        // A pod id that differs says no, whatever the namespaces.
        let mut other_pod = joiner.clone();
        other_pod.pod = Some("p2".into());
        let mut in_pod = holder.clone();
        in_pod.pod = Some("p1".into());
        assert_eq!(member(&other_pod, &in_pod), Membership::OtherPod);
    }

    /// With cookies on both sides, membership needs the same cookie: an attachment whose
    /// path names a namespace reusing its inode is no evidence, and a joiner recorded with
    /// another cookie than a member's is in another namespace.
    #[test]
    fn membership_compares_cookies_where_both_have_one() {
        use crate::kernel::machine::fake::netns_cookie;
        let (a, reused) = (netns_cookie(1, 10), netns_cookie(1, 11));
        let host = FakeHost::default().with_namespace(NET, a);
        let mut joiner = container();
        joiner.netns = Some(a);
        let holder = attachment(NET, Some(a));
        let member = |j: &Manifest, h: &Manifest| membership(&host, j, h, &[h]);
        assert_eq!(member(&joiner, &holder), Membership::Same);
        let old = attachment(NET, Some(netns(1)));
        assert_eq!(member(&joiner, &old), Membership::Same, "older manifest");
        joiner.netns = Some(reused);
        assert_eq!(member(&joiner, &holder), Membership::OtherNamespace);
        host.set_namespace(Path::new(NET), Ok(reused));
        assert_eq!(attachment_netns(&host, Some(Path::new(NET)), Some(a)), None);
        assert_eq!(member(&joiner, &holder), Membership::Unknown);
    }

    /// An attachment has no process: it lives until its DEL is recorded.
    #[test]
    fn an_attachment_is_alive_until_its_del() {
        let host = host();
        let mut m = attachment(NET, None);
        assert!(m.alive(&host));
        m.cni.as_mut().unwrap().deleted = true;
        assert!(!m.alive(&host));
    }

    /// A holder's rules are needed while it lives or a live container shares them.
    #[test]
    fn needs_follow_the_live_sharers() {
        let host = host();
        let mut holder = container();
        holder.container_id = "sandbox".parse().unwrap();
        holder.pid = Some(PID + 1);
        let mut sharer = container();
        sharer.shares = vec![crate::state::ledger::Shared {
            holder: holder.container_id.clone(),
            mappings: holder.mappings.clone(),
        }];
        let all = [holder.clone(), sharer.clone()];
        let needs = Needs::judge(&host, &all);
        assert!(!needs.alive(&holder.container_id));
        assert!(needs.needed(&holder.container_id));
        assert_eq!(needs.sharers(&holder.container_id).len(), 1);
        host.set_process(PID, crate::kernel::machine::Process::Gone);
        let needs = Needs::judge(&host, &all);
        assert!(!needs.needed(&holder.container_id));
    }
}
