//! Owners that write their rules again: deleting one of their rules lasts only until they
//! do. kube-proxy rewrites every `KUBE-*` chain at each sync (30 s by default, and at once when
//! it notices a change); dockerd rewrites its `DOCKER` chains from the containers it runs
//! when it starts. Per-container chains of CNI portmap and netavark are never written again
//! once their container is gone, so deleting them lasts.
//!
//! For a rule of such an owner, the fix keeps the immediate command and adds, as a shell
//! comment line, what the owner will do and the lasting fix in its terms: the Service that
//! claims the port, or the container that publishes it.

use super::{comment, owner_of, port_of};
use crate::model::anyrule::Match;

/// An owner that puts its rules back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regenerator {
    KubeProxy,
    Docker,
}

impl Regenerator {
    /// The owner of a rule, when it is one that writes its rules again. `DOCKER-USER` is the
    /// operator's chain (dockerd creates it but never writes into it).
    fn of(chain: &str, args: &[String]) -> Option<Regenerator> {
        if chain == "DOCKER-USER" {
            return None;
        }
        match owner_of(chain, args) {
            "KUBE" => Some(Regenerator::KubeProxy),
            "DOCKER" => Some(Regenerator::Docker),
            _ => None,
        }
    }
}

/// `command`, and for a rule of an owner that writes its rules again, a line saying so with
/// the lasting fix. `cond` is the rule's path condition (the port the packets arrive for).
pub(super) fn lasting(chain: &str, args: &[String], cond: &Match, command: String) -> String {
    let Some(owner) = Regenerator::of(chain, args) else {
        return command;
    };
    let (port, protocol) = port_of(cond);
    format!(
        "{command}\n# {}",
        note(owner, comment(args), port, protocol.as_deref())
    )
}

/// The note for a rule of `owner`: why the deletion does not last, and what does.
fn note(
    owner: Regenerator,
    comment: Option<&str>,
    port: Option<u16>,
    proto: Option<&str>,
) -> String {
    match owner {
        Regenerator::KubeProxy => {
            let lasting = match (service(comment), port) {
                (Some((ns, name)), _) => format!(
                    "change or delete Service {ns}/{name}: kubectl -n {ns} get service {name} -o wide"
                ),
                (None, Some(port)) => format!(
                    "change or delete the Service that claims port {port}: kubectl get services -A | grep -w {port}"
                ),
                (None, None) => {
                    "change or delete the Service it belongs to: kubectl get services -A".into()
                }
            };
            format!(
                "kube-proxy writes this rule again at its next sync, so deleting it does not last; to fix it for good, {lasting}"
            )
        }
        Regenerator::Docker => {
            let publish = match (port, proto) {
                (Some(port), Some(proto)) => format!("{port}/{proto}"),
                (Some(port), None) => port.to_string(),
                (None, _) => String::new(),
            };
            let find = if publish.is_empty() {
                "docker ps".to_string()
            } else {
                format!("docker ps --filter publish={publish}")
            };
            format!(
                "dockerd writes its chains again when it starts, from the containers it runs: while a running container publishes this port, the rule comes back; to fix it for good, stop or change that container: {find}"
            )
        }
    }
}

/// The Service a kube-proxy comment names: `NAMESPACE/NAME`, optionally `:PORT` and more
/// words after it (`ns2/svc2:p80 cluster IP`, `default/web -> 10.0.0.2:80`).
fn service(comment: Option<&str>) -> Option<(&str, &str)> {
    let first = comment?.split_whitespace().next()?;
    let (ns, rest) = first.split_once('/')?;
    let name = rest.split(':').next()?;
    let dns = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    (dns(ns) && dns(name)).then_some((ns, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        crate::model::save::tokenize(s).unwrap()
    }

    #[test]
    fn owners_that_write_again() {
        let r = |chain: &str, a: &str| Regenerator::of(chain, &args(a));
        assert_eq!(
            r("KUBE-SEP-X", "-j DNAT --to-destination 10.0.0.2:80"),
            Some(Regenerator::KubeProxy)
        );
        assert_eq!(
            r("DOCKER", "-j DNAT --to-destination 172.17.0.2:80"),
            Some(Regenerator::Docker)
        );
        assert_eq!(r("DOCKER-USER", "-j DROP"), None);
        assert_eq!(
            r("CNI-DN-abc", "-j DNAT --to-destination 10.88.0.2:80"),
            None
        );
        assert_eq!(
            r("NETAVARK-DN-abc", "-j DNAT --to-destination 10.88.0.2:80"),
            None
        );
        assert_eq!(
            r("PREROUTING", "-p tcp -j DNAT --to-destination 10.0.0.2:80"),
            None
        );
    }

    #[test]
    fn services_named_by_kube_proxy_comments() {
        for (c, want) in [
            (
                "default/azure-vote-front",
                Some(("default", "azure-vote-front")),
            ),
            ("ns2/svc2:p80 cluster IP", Some(("ns2", "svc2"))),
            ("ns4/svc4:p80 -> 10.180.0.4:80", Some(("ns4", "svc4"))),
            ("kubernetes service portals", None),
            (
                "masquerade traffic for ns3/svc3:p80 external destinations",
                None,
            ),
        ] {
            assert_eq!(service(Some(c)), want, "{c}");
        }
    }

    #[test]
    fn notes_name_the_lasting_fix() {
        let k = note(
            Regenerator::KubeProxy,
            Some("default/web"),
            Some(30080),
            Some("tcp"),
        );
        assert!(k.contains("kubectl -n default get service web"), "{k}");
        let k = note(Regenerator::KubeProxy, None, Some(30080), Some("tcp"));
        assert!(k.contains("grep -w 30080"), "{k}");
        let d = note(Regenerator::Docker, None, Some(8080), Some("tcp"));
        assert!(d.contains("docker ps --filter publish=8080/tcp"), "{d}");
    }
}
