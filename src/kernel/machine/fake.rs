//! [`FakeHost`]: the host seam for unit tests, holding exactly the listeners, processes,
//! namespaces and addresses a test gives it. What it was not given is gone (a process,
//! a namespace path) or absent (addresses, listeners); it records the `route_localnet`
//! changes asked of it, and counts the namespace cookies read.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::{Host, Process};
use crate::kernel::host::Listener;
use crate::kernel::netns::NetnsError;
use crate::kernel::netns_id::{NetnsId, proc_netns};
use crate::model::family::IfAddr;

/// The boot id of a fresh [`FakeHost`].
pub(crate) const BOOT_ID: &str = "fake-boot";
/// The pid namespace of a fresh [`FakeHost`].
pub(crate) const PID_NAMESPACE: u64 = 4026531836;
/// The device of the fake nsfs.
pub(crate) const NSFS: u64 = 4;

/// A host made of the facts a test gives it. Interior mutability: a test changes it (a
/// process exits, a namespace goes) while a context borrows it.
#[derive(Debug)]
pub(crate) struct FakeHost {
    pub(crate) boot_id: RefCell<Option<String>>,
    pub(crate) pid_namespace: RefCell<Option<u64>>,
    pub(crate) processes: RefCell<HashMap<i32, Process>>,
    /// Namespace paths (`/proc/PID/ns/net` included) and what reading them gives: a `stat`
    /// (`netns_at`) gives the device and inode, a cookie read (`netns_with_cookie`) the cookie
    /// too.
    pub(crate) namespaces: RefCell<HashMap<PathBuf, Result<NetnsId, ErrorKind>>>,
    pub(crate) addresses: RefCell<HashMap<i32, Vec<IfAddr>>>,
    pub(crate) listeners: RefCell<Vec<Listener>>,
    pub(crate) procfs_readable: bool,
    /// The destinations `route_localnet` was asked for.
    pub(crate) route_localnet: RefCell<Vec<Ipv4Addr>>,
    /// How many times a namespace's cookie was read (`netns_with_cookie`).
    pub(crate) cookie_reads: Cell<usize>,
}

impl Default for FakeHost {
    fn default() -> Self {
        FakeHost {
            boot_id: RefCell::new(Some(BOOT_ID.into())),
            pid_namespace: RefCell::new(Some(PID_NAMESPACE)),
            processes: RefCell::default(),
            namespaces: RefCell::default(),
            addresses: RefCell::default(),
            listeners: RefCell::default(),
            procfs_readable: true,
            route_localnet: RefCell::default(),
            cookie_reads: Cell::new(0),
        }
    }
}

impl FakeHost {
    /// A running process `pid` started at `start_time`, in network namespace `netns`.
    pub(crate) fn with_process(self, pid: i32, start_time: u64, netns: NetnsId) -> Self {
        self.set_process(
            pid,
            Process::Seen {
                start_time,
                zombie: false,
            },
        );
        self.set_namespace(&proc_netns(pid), Ok(netns));
        self
    }

    /// A namespace path naming `netns`.
    pub(crate) fn with_namespace(self, path: &str, netns: NetnsId) -> Self {
        self.set_namespace(Path::new(path), Ok(netns));
        self
    }

    /// A listening socket.
    pub(crate) fn with_listener(self, listener: Listener) -> Self {
        self.listeners.borrow_mut().push(listener);
        self
    }

    /// What `/proc` shows of `pid` from now on.
    pub(crate) fn set_process(&self, pid: i32, process: Process) {
        self.processes.borrow_mut().insert(pid, process);
    }

    /// What reading `path` gives (device, inode and cookie).
    fn namespace(&self, path: &Path) -> std::io::Result<NetnsId> {
        match self.namespaces.borrow().get(path) {
            Some(Ok(id)) => Ok(*id),
            Some(Err(kind)) => Err((*kind).into()),
            None => Err(ErrorKind::NotFound.into()),
        }
    }

    /// What reading `path` gives from now on.
    pub(crate) fn set_namespace(&self, path: &Path, now: Result<NetnsId, ErrorKind>) {
        self.namespaces.borrow_mut().insert(path.into(), now);
    }
}

/// The fake nsfs's namespace number `ino` (no cookie).
pub(crate) fn netns(ino: u64) -> NetnsId {
    NetnsId {
        dev: NSFS,
        ino,
        cookie: None,
    }
}

/// The fake nsfs's namespace number `ino` with cookie `cookie`.
pub(crate) fn netns_cookie(ino: u64, cookie: u64) -> NetnsId {
    NetnsId {
        cookie: Some(crate::kernel::netns_id::NetnsCookie(cookie)),
        ..netns(ino)
    }
}

impl Host for FakeHost {
    fn boot_id(&self) -> Option<String> {
        self.boot_id.borrow().clone()
    }

    fn pid_namespace(&self) -> Option<u64> {
        *self.pid_namespace.borrow()
    }

    fn process(&self, pid: i32) -> Process {
        let known = self.processes.borrow().get(&pid).copied();
        known.filter(|_| pid > 0).unwrap_or(Process::Gone)
    }

    fn check_procfs(&self) -> std::io::Result<()> {
        match self.procfs_readable {
            true => Ok(()),
            false => Err(ErrorKind::PermissionDenied.into()),
        }
    }

    fn netns_at(&self, path: &Path) -> std::io::Result<NetnsId> {
        self.namespace(path)
            .map(|id| NetnsId { cookie: None, ..id })
    }

    fn netns_with_cookie(&self, path: &Path) -> std::io::Result<NetnsId> {
        self.cookie_reads.set(self.cookie_reads.get() + 1);
        self.namespace(path)
    }

    fn container_addresses(&self, pid: i32) -> Result<Vec<IfAddr>, NetnsError> {
        Ok(self
            .addresses
            .borrow()
            .get(&pid)
            .cloned()
            .unwrap_or_default())
    }

    fn listeners(&self, keep: &dyn Fn(&Listener) -> bool) -> Vec<Listener> {
        let mut found = self.listeners.borrow().clone();
        found.retain(|l| keep(l));
        found
    }

    fn enable_route_localnet(&self, dest: Ipv4Addr) -> Result<Option<String>, NetnsError> {
        self.route_localnet.borrow_mut().push(dest);
        Ok(None)
    }
}
