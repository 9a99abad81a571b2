//! Named network namespaces (`/run/netns/NAME`) made and wired with `ip`, deleted on drop:
//! the one harness `natledger selftest`, the integration tests' `Topology` and the benches
//! build the namespaces they work in with. A [`NamedNetns`] is made bare ([`NamedNetns::add`])
//! or with its loopback up ([`NamedNetns::create`]), takes sysctls, veth pairs to another
//! one ([`NamedNetns::veth_to`]), addresses on a link it sets up ([`NamedNetns::link_up`]) and
//! default routes ([`NamedNetns::default_routes`]); a thread (or a single-threaded process)
//! enters it with [`enter`]. `ip netns add/del` run under one lock per process (the first
//! `add` also makes the `/run/netns` mount, which is racy).

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use nix::sched::{CloneFlags, setns};

use super::netns::{NetnsError, in_namespace};

/// Where `ip netns` keeps the namespaces it names.
pub const NETNS_DIR: &str = "/run/netns";

/// Serialises `ip netns add/del` within this process.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

#[derive(Debug, thiserror::Error)]
pub enum NamedNetnsError {
    #[error("cannot run ip (iproute2)")]
    Spawn(#[source] std::io::Error),
    /// The words `ip` printed; the message is `ip ARGS: STDERR`.
    #[error("ip {args}: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("cannot open {ns}")]
    Open {
        ns: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot move this thread into {ns}")]
    SetNs {
        ns: String,
        #[source]
        source: nix::Error,
    },
    #[error("cannot enter {ns}")]
    Enter {
        ns: String,
        #[source]
        source: NetnsError,
    },
    #[error("cannot set {path} in {ns}")]
    Sysctl {
        ns: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `ip ARGS`; its stdout, or its stderr's words in the error.
pub fn ip(args: &[&str]) -> Result<String, NamedNetnsError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(NamedNetnsError::Spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NamedNetnsError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// `ip netns add NAME`, under the process's lock.
pub fn add(name: &str) -> Result<(), NamedNetnsError> {
    let _guard = NETNS_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    ip(&["netns", "add", name]).map(drop)
}

/// `ip netns del NAME`, under the process's lock.
pub fn delete(name: &str) -> Result<(), NamedNetnsError> {
    let _guard = NETNS_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    ip(&["netns", "del", name]).map(drop)
}

/// `/run/netns/NAME`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Writes sysctls (paths relative to /proc/sys, e.g. `net/ipv4/ip_forward`) inside the
/// namespace `name`, from a thread of its own.
pub fn set_sysctls(name: &str, settings: &[(&str, &str)]) -> Result<(), NamedNetnsError> {
    in_namespace(&path(name), || {
        settings.iter().try_for_each(|(key, value)| {
            let path = format!("/proc/sys/{key}");
            std::fs::write(&path, value).map_err(|source| NamedNetnsError::Sysctl {
                ns: name.to_string(),
                path,
                source,
            })
        })
    })
    .map_err(|source| NamedNetnsError::Enter {
        ns: name.to_string(),
        source,
    })?
}

/// Moves the *calling thread* into the namespace `name` for good: only from a thread
/// dedicated to it, or from a process that has one thread (its children then start there).
pub fn enter(name: &str) -> Result<(), NamedNetnsError> {
    let file = File::open(path(name)).map_err(|source| NamedNetnsError::Open {
        ns: name.to_string(),
        source,
    })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NamedNetnsError::SetNs {
        ns: name.to_string(),
        source,
    })
}

/// A namespace this process named and made (or took charge of); deleted when dropped.
#[derive(Debug)]
pub struct NamedNetns {
    name: String,
}

impl NamedNetns {
    /// `ip netns add NAME`: a bare namespace, its loopback down.
    pub fn add(name: impl Into<String>) -> Result<NamedNetns, NamedNetnsError> {
        let name = name.into();
        add(&name)?;
        Ok(NamedNetns { name })
    }

    /// `ip netns add NAME`, then `lo` up (deleted again if that fails).
    pub fn create(name: impl Into<String>) -> Result<NamedNetns, NamedNetnsError> {
        let ns = NamedNetns::add(name)?;
        ns.link_up("lo", &[])?;
        Ok(ns)
    }

    /// Takes charge of a name something else put at `/run/netns/NAME` (a bind mount): deleted
    /// (unmounted and removed) on drop like one this process made.
    pub fn adopt(name: impl Into<String>) -> NamedNetns {
        NamedNetns { name: name.into() }
    }

    /// `ip netns del NAME` now, its error returned rather than logged as on drop.
    pub fn delete(self) -> Result<(), NamedNetnsError> {
        let name = std::mem::take(&mut std::mem::ManuallyDrop::new(self).name);
        delete(&name)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        path(&self.name)
    }

    /// `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<String, NamedNetnsError> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Writes sysctls inside this namespace ([`set_sysctls`]).
    pub fn set_sysctls(&self, settings: &[(&str, &str)]) -> Result<(), NamedNetnsError> {
        set_sysctls(&self.name, settings)
    }

    /// A veth pair: `dev` here, `peer_dev` in `peer`; both down, no address.
    pub fn veth_to(
        &self,
        dev: &str,
        peer: &NamedNetns,
        peer_dev: &str,
    ) -> Result<(), NamedNetnsError> {
        self.ip(&[
            "link", "add", dev, "type", "veth", "peer", "name", peer_dev, "netns", &peer.name,
        ])
        .map(drop)
    }

    /// Adds `cidrs` to `dev` (an IPv6 one without duplicate address detection, `nodad`, so
    /// it is usable at once), then sets `dev` up.
    pub fn link_up(&self, dev: &str, cidrs: &[&str]) -> Result<(), NamedNetnsError> {
        for cidr in cidrs {
            let mut args = vec!["addr", "add", cidr, "dev", dev];
            if cidr.contains(':') {
                args.push("nodad");
            }
            self.ip(&args)?;
        }
        self.ip(&["link", "set", dev, "up"]).map(drop)
    }

    /// A default route via each of `gateways` (IPv4 or IPv6 addresses).
    pub fn default_routes(&self, gateways: &[&str]) -> Result<(), NamedNetnsError> {
        for gateway in gateways {
            let family = if gateway.contains(':') { "-6" } else { "-4" };
            self.ip(&[family, "route", "add", "default", "via", gateway])?;
        }
        Ok(())
    }

    /// Moves the calling thread into this namespace ([`enter`]).
    pub fn enter(&self) -> Result<(), NamedNetnsError> {
        enter(&self.name)
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        if let Err(e) = delete(&self.name) {
            log::debug!("cannot delete the network namespace {}: {e}", self.name);
        }
    }
}
