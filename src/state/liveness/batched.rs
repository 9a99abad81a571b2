//! [`Batched`]: the host seam with the namespace cookies of many recorded attachments read in
//! one hand-over to the cookie reader (`kernel::netns_cookie::read_all`), for the judgements
//! of every manifest at once (sweep, `list`, doctor).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::Recorded;
use crate::kernel::host::Listener;
use crate::kernel::machine::{Host, Process};
use crate::kernel::netns::NetnsError;
use crate::kernel::netns_id::NetnsId;

/// A host whose answers to `netns_with_cookie` for the paths of the given records were read
/// at once, when it was made; everything else is asked of the host it decorates. Read are
/// only the paths [`super::netns_at_path`] will ask the cookie of: a record with a cookie
/// whose path names its device and inode now.
pub struct Batched<'a> {
    host: &'a dyn Host,
    read: RefCell<HashMap<PathBuf, Result<NetnsId, ErrorKind>>>,
}

impl<'a> Batched<'a> {
    pub fn new<'r>(host: &'a dyn Host, records: impl IntoIterator<Item = Recorded<'r>>) -> Self {
        let mut paths: Vec<&Path> = Vec::new();
        let mut seen = HashSet::new();
        for (path, then) in records.into_iter().filter_map(|r| r.netns) {
            let same_file = || host.netns_at(path).is_ok_and(|now| now.same_file(then));
            if then.cookie.is_some() && !seen.contains(path) && same_file() {
                seen.insert(path);
                paths.push(path);
            }
        }
        let answers = host.netns_with_cookies(&paths);
        let read = paths
            .into_iter()
            .map(PathBuf::from)
            .zip(answers.into_iter().map(|a| a.map_err(|e| e.kind())))
            .collect();
        Batched {
            host,
            read: RefCell::new(read),
        }
    }
}

impl Host for Batched<'_> {
    fn boot_id(&self) -> Option<String> {
        self.host.boot_id()
    }

    fn pid_namespace(&self) -> Option<u64> {
        self.host.pid_namespace()
    }

    fn process(&self, pid: i32) -> Process {
        self.host.process(pid)
    }

    fn check_procfs(&self) -> std::io::Result<()> {
        self.host.check_procfs()
    }

    fn netns_at(&self, path: &Path) -> std::io::Result<NetnsId> {
        self.host.netns_at(path)
    }

    fn netns_with_cookie(&self, path: &Path) -> std::io::Result<NetnsId> {
        match self.read.borrow().get(path) {
            Some(read) => read.map_err(Into::into),
            None => self.host.netns_with_cookie(path),
        }
    }

    fn netns_with_cookies(&self, paths: &[&Path]) -> Vec<std::io::Result<NetnsId>> {
        paths.iter().map(|p| self.netns_with_cookie(p)).collect()
    }

    fn container_addresses(
        &self,
        pid: i32,
    ) -> Result<Vec<crate::model::family::IfAddr>, NetnsError> {
        self.host.container_addresses(pid)
    }

    fn listeners(&self, keep: &dyn Fn(&Listener) -> bool) -> Vec<Listener> {
        self.host.listeners(keep)
    }

    fn enable_route_localnet(&self, dest: Ipv4Addr) -> Result<Option<String>, NetnsError> {
        self.host.enable_route_localnet(dest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::machine::fake::{FakeHost, netns, netns_cookie};
    use crate::state::liveness::netns_alive;

    fn attachment(path: &Path, netns: NetnsId) -> Recorded<'_> {
        Recorded {
            pid: None,
            start_time: None,
            boot_id: None,
            pid_namespace: None,
            netns: Some((path, netns)),
        }
    }

    /// The cookies are read when the batch is made, only where the judgement will need
    /// them, each path once; the judgements then read none, and give what they give
    /// without the batch.
    #[test]
    fn cookies_are_read_once_where_device_and_inode_match() {
        let (a, b, c) = (
            Path::new("/run/netns/a"),
            Path::new("/run/netns/b"),
            Path::new("/run/netns/c"),
        );
        let host = FakeHost::default()
            .with_namespace("/run/netns/a", netns_cookie(1, 10))
            .with_namespace("/run/netns/b", netns_cookie(2, 21))
            .with_namespace("/run/netns/c", netns_cookie(3, 30));
        let records = [
            (a, netns_cookie(1, 10)),
            (a, netns_cookie(1, 10)),
            (b, netns_cookie(2, 20)),
            (c, netns(3)),
            (Path::new("/run/netns/gone"), netns_cookie(4, 40)),
            (c, netns_cookie(9, 30)),
        ];
        let expected: Vec<bool> = records
            .iter()
            .map(|(p, n)| netns_alive(&host, p, *n))
            .collect();
        assert_eq!(expected, [true, true, false, true, false, false]);
        host.cookie_reads.set(0);
        let batched = Batched::new(&host, records.iter().map(|(p, n)| attachment(p, *n)));
        assert_eq!(host.cookie_reads.replace(0), 2, "a and b, once each");
        let judged: Vec<bool> = records
            .iter()
            .map(|(p, n)| netns_alive(&batched, p, *n))
            .collect();
        assert_eq!(judged, expected);
        assert_eq!(host.cookie_reads.get(), 0, "nothing read again");
    }
}
