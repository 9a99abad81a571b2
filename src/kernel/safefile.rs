//! Opening files whose path natledger does not control, the one way it does it.
//!
//! natledger runs as root over paths others can plant things in: a bundle's `config.json`
//! (the container's owner writes the bundle), and its own state directory if someone got
//! there first. Every file is therefore opened through this module:
//!
//! - **reads** ([`read`]): `O_NONBLOCK` (a FIFO cannot hang the hook at `open`), the open
//!   file must be a regular file (`fstat` after `open`, so nothing is swapped in between), and
//!   at most [`Cap`] bytes are read (`/dev/zero` cannot exhaust memory). State files are also
//!   opened `O_NOFOLLOW`; a bundle's `config.json` may be a symlink (runc follows it too: what
//!   it reaches must still be a capped regular file).
//! - **new files** ([`create_new`]): `O_CREAT | O_EXCL | O_NOFOLLOW`, so a planted symlink or
//!   file is never written through. A file already there (a temp left by a crash, or planted)
//!   is unlinked (the link itself, never its target) and the create retried, a bounded number
//!   of times.
//! - **the lock** ([`open_lock`]): `O_NOFOLLOW | O_NONBLOCK`, must be a regular file (a FIFO
//!   there would block every hook forever).
//! - **directories** ([`check_dir`]): as sshd's `StrictModes`: owned by the user natledger
//!   runs as, writable by no one else.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The most natledger reads of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// A bundle's `config.json`: 16 MiB. runc's are a few KiB; the largest parts a real one
    /// has are the environment and arguments (execve takes at most a quarter of the stack
    /// limit, 2 MiB by default, for both), annotations (Kubernetes allows 256 KiB in all) and
    /// an inline seccomp profile (Docker's default: about 30 KiB). 16 MiB is far above any of
    /// them and still a bounded amount of memory for serde_json's tree.
    Config,
    /// natledger's own state files (manifests, the forwards cache): 64 MiB. A manifest of
    /// 4,000 mappings (12,000 rules) is about 8 MiB.
    State,
    /// A `*-save` dump given to doctor ([`read_dump`]): 512 MiB (kube-proxy at 100,000
    /// rules is about 20 MiB).
    Dump,
}

impl Cap {
    pub fn bytes(self) -> u64 {
        match self {
            Cap::Config => 16 << 20,
            Cap::State => 64 << 20,
            Cap::Dump => 512 << 20,
        }
    }
}

/// Whether the last component of a path may be a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// natledger's state: never.
    Refuse,
    /// A file from outside (a bundle's `config.json`, a dump): followed, as its writer meant.
    Follow,
}

/// Why a file or directory was refused. Carried inside the `io::Error` the functions here
/// return (`io::Error::get_ref` downcasts to it), so callers keep naming the path and step.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("not a regular file (a {0}); natledger reads and writes only regular files there")]
    NotRegular(&'static str),
    #[error("{size} bytes or more, over natledger's limit of {cap} bytes for this file")]
    TooLarge { size: u64, cap: u64 },
    #[error("not a directory (a {0})")]
    NotDirectory(&'static str),
    #[error("a symlink; natledger does not follow symlinks in its state directory")]
    Symlink,
    #[error("a symlink loop (or a chain of more than 40 symlinks): it leads to no file")]
    LinkLoop,
    #[error(
        "owned by uid {owner} with mode {mode:04o}: {reason}; natledger refuses it, as sshd's \
         StrictModes does (fix: chown {euid} and chmod go-w, or remove it and let natledger \
         create it)"
    )]
    Unsafe {
        owner: u32,
        mode: u32,
        euid: u32,
        reason: &'static str,
    },
    #[error(
        "under {dir}, which natledger refuses: {why} (whoever can write there can put \
         another directory in its place)"
    )]
    Above {
        dir: std::path::PathBuf,
        why: String,
    },
    #[error("kept reappearing while natledger replaced it ({0} tries)")]
    Contended(u32),
}

fn refused(kind: io::ErrorKind, why: Refused) -> io::Error {
    io::Error::new(kind, why)
}

/// What kind of file `mode` is, for messages.
fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFDIR => "directory",
        libc::S_IFSOCK => "socket",
        libc::S_IFLNK => "symlink",
        _ => "special file",
    }
}

fn nofollow(links: Links) -> i32 {
    match links {
        Links::Refuse => libc::O_NOFOLLOW,
        Links::Follow => 0,
    }
}

/// `ELOOP` from `O_NOFOLLOW` says the last component is a symlink: say so. Where links are
/// followed (a bundle's `config.json`), it says they loop.
fn named_symlink(links: Links) -> impl FnOnce(io::Error) -> io::Error {
    move |e| match (e.raw_os_error(), links) {
        (Some(libc::ELOOP), Links::Refuse) => {
            refused(io::ErrorKind::InvalidInput, Refused::Symlink)
        }
        (Some(libc::ELOOP), Links::Follow) => {
            refused(io::ErrorKind::InvalidInput, Refused::LinkLoop)
        }
        _ => e,
    }
}

fn must_be_regular(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(refused(
            io::ErrorKind::InvalidInput,
            Refused::NotRegular(file_kind(meta.mode())),
        ));
    }
    Ok(meta.len())
}

/// Read a whole regular file of at most `cap` bytes (see the module comment).
pub fn read(path: &Path, links: Links, cap: Cap) -> io::Result<Vec<u8>> {
    let (file, len) = open_regular(path, links)?;
    read_capped(file, len, cap)
}

/// Open a regular file as [`read`] does, and its size, for a caller that reads it as a
/// stream (`ledger::summarize`: a manifest past its cap).
pub fn open_regular(path: &Path, links: Links) -> io::Result<(File, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | nofollow(links))
        .open(path)
        .map_err(named_symlink(links))?;
    let len = must_be_regular(&file)?;
    Ok((file, len))
}

/// Read a dump an operator names: a regular file or a pipe (`doctor --from <(iptables-save)`,
/// waited on as the operator asked), at most `Cap::Dump` bytes; never a device.
pub fn read_dump(path: &Path) -> io::Result<Vec<u8>> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    let kind = meta.mode() & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFIFO {
        return Err(refused(
            io::ErrorKind::InvalidInput,
            Refused::NotRegular(file_kind(meta.mode())),
        ));
    }
    read_capped(file, meta.len(), Cap::Dump)
}

fn read_capped(file: File, len: u64, cap: Cap) -> io::Result<Vec<u8>> {
    let cap = cap.bytes();
    let too_large = |size| refused(io::ErrorKind::InvalidData, Refused::TooLarge { size, cap });
    if len > cap {
        return Err(too_large(len));
    }
    // The size may change while reading: read at most one byte past the cap to tell.
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// How often [`create_new`] unlinks what is in its way before giving up.
const CREATE_TRIES: u32 = 3;

/// Create `path` as a new regular file with `mode`, never through a symlink or into an
/// existing file; something already there (a crash's temp file, a planted link) is unlinked
/// and the create retried. For temp files that are renamed over their target.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    for _ in 0..CREATE_TRIES {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // unlink(2) removes a symlink itself, never its target; a directory fails.
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(refused(
        io::ErrorKind::AlreadyExists,
        Refused::Contended(CREATE_TRIES),
    ))
}

/// Open (creating if needed, 0600) the lock file: never through a symlink, never blocking at
/// `open`, and only a regular file.
pub fn open_lock(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(named_symlink(Links::Refuse))?;
    must_be_regular(&file)?;
    Ok(file)
}

/// The directory check of sshd's `StrictModes`: `dir` must be a directory (not a symlink)
/// owned by the effective user, writable by neither group nor others. `parent` relaxes it
/// for a directory natledger creates its own in: owned by root or the effective user, and
/// writable by others only when sticky (`/tmp`: nobody else can rename what natledger made).
pub fn check_dir(dir: &Path, parent: bool) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    check_meta(&meta, parent)
}

fn check_meta(meta: &std::fs::Metadata, parent: bool) -> io::Result<()> {
    let owner = meta.uid();
    let mode = meta.permissions().mode();
    let euid = nix::unistd::geteuid().as_raw();
    let unsafe_dir = |reason| {
        refused(
            io::ErrorKind::PermissionDenied,
            Refused::Unsafe {
                owner,
                mode: mode & 0o7777,
                euid,
                reason,
            },
        )
    };
    if !meta.file_type().is_dir() {
        return Err(refused(
            io::ErrorKind::InvalidInput,
            Refused::NotDirectory(file_kind(mode)),
        ));
    }
    let sticky = mode & libc::S_ISVTX != 0;
    if parent {
        if owner != euid && owner != 0 {
            return Err(unsafe_dir("owned by another user"));
        }
        if mode & 0o022 != 0 && !sticky {
            return Err(unsafe_dir("writable by group or others, and not sticky"));
        }
        return Ok(());
    }
    if owner != euid {
        return Err(unsafe_dir("owned by another user"));
    }
    if mode & 0o022 != 0 {
        return Err(unsafe_dir("writable by group or others"));
    }
    Ok(())
}

/// Every directory above `dir`, as sshd's `StrictModes` checks the path to a file: each
/// directory the path goes through, and each of its canonical form (a symlink's target),
/// must pass [`check_dir`] as a parent (owned by root or the effective user, writable by
/// others only when sticky). Whoever can write one of them can rename the state directory
/// away and put their own in its place between a check and a use, whatever the state
/// directory's own owner and mode.
pub fn check_ancestors(dir: &Path) -> io::Result<()> {
    let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    // Through the path as given (each prefix resolved: a symlink is only as safe as the
    // directory holding it, which is the prefix before), then its canonical form.
    let canonical = std::fs::canonicalize(parent)?;
    let given = parent.ancestors().filter(|a| !a.as_os_str().is_empty());
    for ancestor in given.chain(canonical.ancestors()) {
        let meta = std::fs::metadata(ancestor)?;
        check_meta(&meta, true).map_err(|e| {
            refused(
                e.kind(),
                Refused::Above {
                    dir: ancestor.to_path_buf(),
                    why: e.to_string(),
                },
            )
        })?;
    }
    Ok(())
}

/// The `Refused` reason inside an error from this module, if that is what it is.
pub fn reason(e: &io::Error) -> Option<&Refused> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Refused>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn reads_refuse_what_is_not_a_capped_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Without O_NONBLOCK this open would wait for a writer forever.
        let e = read(&fifo, Links::Follow, Cap::Config).unwrap_err();
        assert!(
            matches!(reason(&e), Some(Refused::NotRegular("FIFO"))),
            "{e}"
        );
        let e = read(Path::new("/dev/zero"), Links::Follow, Cap::Config).unwrap_err();
        assert!(
            matches!(reason(&e), Some(Refused::NotRegular("character device"))),
            "{e}"
        );
        let big = dir.path().join("big");
        File::create(&big)
            .unwrap()
            .set_len(Cap::Config.bytes() + 1)
            .unwrap();
        let e = read(&big, Links::Follow, Cap::Config).unwrap_err();
        assert!(matches!(reason(&e), Some(Refused::TooLarge { .. })), "{e}");
        let small = dir.path().join("small");
        std::fs::write(&small, "{}").unwrap();
        let link = dir.path().join("link");
        symlink(&small, &link).unwrap();
        assert_eq!(read(&link, Links::Follow, Cap::State).unwrap(), b"{}");
        let e = read(&link, Links::Refuse, Cap::State).unwrap_err();
        assert!(matches!(reason(&e), Some(Refused::Symlink)), "{e}");
        // A loop where links are followed (a bundle's config.json) is a loop, not a symlink
        // in natledger's state directory.
        let looped = dir.path().join("config.json");
        symlink(&looped, &looped).unwrap();
        let e = read(&looped, Links::Follow, Cap::Config).unwrap_err();
        assert!(matches!(reason(&e), Some(Refused::LinkLoop)), "{e}");
        assert!(!e.to_string().contains("state directory"), "{e}");
        let e = read(&looped, Links::Refuse, Cap::State).unwrap_err();
        assert!(matches!(reason(&e), Some(Refused::Symlink)), "{e}");
        // A dump may come through a pipe, never from a device.
        let e = read_dump(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(reason(&e), Some(Refused::NotRegular(_))), "{e}");
        assert_eq!(read_dump(&link).unwrap(), b"{}");
    }

    #[test]
    fn create_new_never_writes_through_a_planted_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let tmp = dir.path().join(".x.tmp");
        symlink(&target, &tmp).unwrap();
        let mut file = create_new(&tmp, 0o600).unwrap();
        std::io::Write::write_all(&mut file, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert!(
            !std::fs::symlink_metadata(&tmp)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&tmp).unwrap(), "new");
        // A stale temp (a crash's) is replaced, not appended to.
        let file = create_new(&tmp, 0o600).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0);
    }

    #[test]
    fn the_lock_is_a_regular_file_reached_without_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let lock = dir.path().join("lock");
        symlink(&fifo, &lock).unwrap();
        let e = open_lock(&lock).unwrap_err();
        assert!(matches!(reason(&e), Some(Refused::Symlink)), "{e}");
        // Without a reader a non-blocking open for writing fails (ENXIO) instead of waiting;
        // with one it opens, and the fstat refuses it.
        assert!(open_lock(&fifo).is_err());
        let _reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let e = open_lock(&fifo).unwrap_err();
        assert!(
            matches!(reason(&e), Some(Refused::NotRegular("FIFO"))),
            "{e}"
        );
        std::fs::remove_file(&lock).unwrap();
        open_lock(&lock).unwrap();
    }

    #[test]
    fn directories_as_strict_modes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("state");
        std::fs::create_dir(&d).unwrap();
        let chmod = |m| std::fs::set_permissions(&d, std::fs::Permissions::from_mode(m)).unwrap();
        chmod(0o700);
        check_dir(&d, false).unwrap();
        chmod(0o755);
        check_dir(&d, false).unwrap();
        chmod(0o775);
        let e = check_dir(&d, false).unwrap_err();
        assert!(e.to_string().contains("mode 0775"), "{e}");
        chmod(0o1777);
        assert!(check_dir(&d, false).is_err());
        check_dir(&d, true).unwrap();
        chmod(0o700);
        std::os::unix::fs::chown(&d, Some(65534), None).unwrap();
        let e = check_dir(&d, false).unwrap_err();
        assert!(e.to_string().contains("uid 65534"), "{e}");
        let link = dir.path().join("link");
        symlink(&d, &link).unwrap();
        let e = check_dir(&link, false).unwrap_err();
        assert!(
            matches!(reason(&e), Some(Refused::NotDirectory("symlink"))),
            "{e}"
        );
    }
}
