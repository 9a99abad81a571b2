//! The network namespace cookie (`SO_NETNS_COOKIE`, Linux 5.14+): a number the kernel gives
//! each network namespace when it is made and never gives another within a boot, unlike the
//! nsfs inode of [`NetnsId`], which `ip netns del X; ip netns add X` often reuses.
//!
//! Reading it needs a socket made inside the namespace, so a thread must `setns` into it. One
//! thread per process does that for every namespace asked about, in turn: started on first
//! use, it opens the path, takes the file's device and inode, enters the namespace through
//! that same open file (so the cookie is the namespace's whose inode it gives), reads the
//! cookie and goes back to the namespace it started in before answering (so it keeps no
//! namespace alive). A namespace costs two `setns` (about 10 µs here), not a thread (about
//! 45 µs); many paths are handed over at once ([`read_all`]), so that judging thousands of
//! attachments on a busy host does not wait for the scheduler twice per namespace.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, PoisonError};

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

use crate::kernel::netns_id::{NetnsCookie, NetnsId};

/// The namespace the reader thread starts in and returns to.
const HOME: &str = "/proc/thread-self/ns/net";

/// The process's one reader thread: where paths are sent and answers come back, in order.
struct Reader {
    ask: Sender<Vec<PathBuf>>,
    answer: Receiver<Vec<io::Result<NetnsId>>>,
}

static READER: Mutex<Option<Reader>> = Mutex::new(None);

/// The network namespace `path` names, with its cookie (`None` on a kernel without
/// `SO_NETNS_COOKIE`), read on the process's reader thread. Fails as opening `path` fails
/// (`ENOENT`: gone), or when it is no network namespace file (`EINVAL` from `setns`).
pub fn read(path: &Path) -> io::Result<NetnsId> {
    read_all(&[path]).pop().expect("one answer per path")
}

/// [`read`] of each path, in one hand-over to the reader thread; an answer per path, in
/// order.
pub fn read_all(paths: &[&Path]) -> Vec<io::Result<NetnsId>> {
    if paths.is_empty() {
        return Vec::new();
    }
    let mut reader = READER.lock().unwrap_or_else(PoisonError::into_inner);
    let live = match reader.take() {
        Some(live) => Ok(live),
        None => spawn(),
    };
    let answers = live.and_then(|live| {
        let asked = paths.iter().map(|p| p.to_path_buf()).collect();
        let answers = live
            .ask
            .send(asked)
            .ok()
            .and_then(|()| live.answer.recv().ok());
        // Without answers the thread ended (it could not go back to its namespace): the
        // next read starts another.
        let answers =
            answers.ok_or_else(|| io::Error::other("the namespace cookie reader ended"))?;
        *reader = Some(live);
        Ok(answers)
    });
    match answers {
        Ok(answers) if answers.len() == paths.len() => answers,
        Ok(_) => unreachable!("the reader answers every path"),
        Err(e) => paths
            .iter()
            .map(|_| Err(io::Error::new(e.kind(), e.to_string())))
            .collect(),
    }
}

fn spawn() -> io::Result<Reader> {
    let (ask, asked) = mpsc::channel::<Vec<PathBuf>>();
    let (answered, answer) = mpsc::channel();
    std::thread::Builder::new()
        .name("netns-cookie".into())
        .spawn(move || serve(asked, answered))?;
    Ok(Reader { ask, answer })
}

/// Answer each batch of paths, each path in turn; end when the namespace the thread started
/// in cannot be entered again (a thread left in another namespace would keep it alive).
fn serve(asked: Receiver<Vec<PathBuf>>, answered: Sender<Vec<io::Result<NetnsId>>>) {
    let home = File::open(HOME);
    for paths in asked {
        let mut answers = Vec::with_capacity(paths.len());
        let mut at_home = true;
        for path in &paths {
            let answer = match (&home, at_home) {
                (Ok(home), true) => {
                    let (answer, back) = read_at(path, home);
                    at_home = back;
                    answer
                }
                (Ok(_), false) => Err(io::Error::other("the namespace cookie reader ended")),
                (Err(e), _) => Err(io::Error::new(e.kind(), format!("cannot open {HOME}"))),
            };
            answers.push(answer);
        }
        if answered.send(answers).is_err() || !at_home {
            return;
        }
    }
}

/// The namespace at `path` with its cookie, read from one open of it; and whether the thread
/// is back in `home`.
fn read_at(path: &Path, home: &File) -> (io::Result<NetnsId>, bool) {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) => return (Err(e), true),
    };
    let id = match file.metadata() {
        Ok(meta) => NetnsId::of_file(&meta),
        Err(e) => return (Err(e), true),
    };
    if let Err(e) = setns(&file, CloneFlags::CLONE_NEWNET) {
        return (Err(e.into()), true);
    }
    let cookie = cookie_here();
    let at_home = match setns(home, CloneFlags::CLONE_NEWNET) {
        Ok(()) => true,
        Err(e) => {
            log::warn!(
                "the namespace cookie reader cannot go back to its network namespace ({e}); \
                 it ends"
            );
            false
        }
    };
    (cookie.map(|cookie| NetnsId { cookie, ..id }), at_home)
}

/// The cookie of the calling thread's network namespace: `SO_NETNS_COOKIE` of a socket made
/// in it; `None` on a kernel without it (`ENOPROTOOPT`, before 5.14). `libc` gives the
/// option's number per architecture (71 on most, 80 on sparc).
pub fn cookie_here() -> io::Result<Option<NetnsCookie>> {
    let sock = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let mut value: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` is a u64 the kernel writes at most `len` (its size) bytes of; `sock` is
    // an open socket for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        return Ok(Some(NetnsCookie(value)));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(None),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one namespace a unit test may read: its own process's, through its own /proc
    /// entry (no namespace is made or entered but this one).
    #[test]
    fn the_reader_gives_this_namespace_s_file_and_cookie() {
        let path = Path::new("/proc/self/ns/net");
        let stat = NetnsId::at(path).unwrap();
        let read = read(path).unwrap();
        assert!(read.same_file(stat));
        assert_eq!(read.cookie, cookie_here().unwrap(), "the same namespace");
        assert_eq!(read, super::read(path).unwrap(), "the thread serves again");
        let gone = read_missing();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);
        let not_a_namespace = super::read(Path::new("/proc/self/stat")).unwrap_err();
        assert_eq!(not_a_namespace.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(read, super::read(path).unwrap(), "still serving");
        let all = read_all(&[path, Path::new("/nonexistent/x"), path]);
        let kinds: Vec<_> = all
            .iter()
            .map(|a| a.as_ref().map_err(|e| e.kind()))
            .collect();
        assert_eq!(kinds, [Ok(&read), Err(io::ErrorKind::NotFound), Ok(&read)]);
    }

    fn read_missing() -> io::Error {
        read(Path::new("/nonexistent/natledger-no-such-namespace")).unwrap_err()
    }
}
