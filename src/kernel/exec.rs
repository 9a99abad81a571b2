//! The one seam around process execution. Everything natledger runs (iptables-save and
//! iptables-restore) goes through a [`Runner`], so operation logic can be tested with a
//! scripted runner and the real backends are exercised by the integration tests. With a host
//! root ([`super::host_root`]), given by the caller, [`SystemRunner`] runs each tool chrooted
//! into it and finds them under it ([`Runner::lookup`]).

use std::io::Write;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::host_root::{HostRoot, Lookup};

/// A command to run: program (absolute path), arguments and optional standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
}

impl std::fmt::Display for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.program.display())?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}

/// What a command did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// One line of stderr for one-line error messages: the one naming an input line
    /// (`line N …`, where iptables-nft puts the cause after a bare version header), else
    /// the first.
    pub fn stderr_line(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("# Warning"))
            .collect();
        lines
            .iter()
            .find(|l| l.contains("line "))
            .or(lines.first())
            .copied()
            .unwrap_or("")
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_line_is_the_one_naming_the_input_line() {
        let out = Outcome {
            code: Some(4),
            stdout: Vec::new(),
            stderr: b"iptables-nft-restore v1.8.9 (nf_tables): \nline 2: CHAIN_DEL failed (Device or resource busy): chain B\n".to_vec(),
        };
        assert_eq!(
            out.stderr_line(),
            "line 2: CHAIN_DEL failed (Device or resource busy): chain B"
        );
        let out = Outcome {
            stderr: b"# Warning: legacy tables present\nsomething broke\n".to_vec(),
            ..out
        };
        assert_eq!(out.stderr_line(), "something broke");
    }
}

pub trait Runner {
    /// Run to completion. An `Err` means the process could not be started at all.
    fn run(&self, invocation: &Invocation) -> std::io::Result<Outcome>;

    /// Where the tools this runner runs are found: under the host root it runs them in, or
    /// (the default) in this process's own root.
    fn lookup(&self) -> Lookup<'_> {
        Lookup(None)
    }
}

/// Runs real processes, chrooted into its host root when it has one. Logs each command line,
/// and how long it took, at debug level.
#[derive(Debug)]
pub struct SystemRunner {
    root: Option<HostRoot>,
}

/// In this process's own root (no host root): natledger's own runs take theirs from the
/// settings (`entry::settings::Settings::runner`).
impl Default for SystemRunner {
    fn default() -> Self {
        SystemRunner::in_root(None)
    }
}

/// Starting a tool in the host root failed, naming the root; the cause is the `chroot(2)`'s,
/// `chdir(2)`'s or `execve(2)`'s.
#[derive(Debug, thiserror::Error)]
#[error("in host root {root}")]
pub struct InRoot {
    root: HostRoot,
    source: std::io::Error,
}

impl SystemRunner {
    /// One that runs each tool chrooted into `root` (`None`: in this process's root).
    pub fn in_root(root: Option<HostRoot>) -> Self {
        SystemRunner { root }
    }

    fn command(&self, inv: &Invocation) -> std::io::Result<Command> {
        let mut command = Command::new(&inv.program);
        command.args(&inv.args);
        if let Some(root) = &self.root {
            use std::os::unix::ffi::OsStrExt as _;
            let dir = std::ffi::CString::new(root.dir().as_os_str().as_bytes())?;
            // SAFETY: the closure runs in the child between fork and exec, where only
            // async-signal-safe calls are allowed: it calls chroot(2) and chdir(2) on a string
            // made before the fork and builds an `io::Error` from errno (no allocation, no
            // lock).
            unsafe {
                command.pre_exec(move || {
                    if libc::chroot(dir.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Ok(command)
    }
}

impl Runner for SystemRunner {
    fn lookup(&self) -> Lookup<'_> {
        Lookup(self.root.as_ref())
    }

    fn run(&self, inv: &Invocation) -> std::io::Result<Outcome> {
        let trace = log::log_enabled!(log::Level::Debug);
        if trace {
            match &self.root {
                Some(root) => log::debug!("exec {inv} (in {root})"),
                None => log::debug!("exec {inv}"),
            }
        }
        let start = std::time::Instant::now();
        let in_root = |source: std::io::Error| match &self.root {
            Some(root) => std::io::Error::new(
                source.kind(),
                InRoot {
                    root: root.clone(),
                    source,
                },
            ),
            None => source,
        };
        let mut child = self
            .command(inv)?
            .stdin(if inv.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(in_root)?;
        let out = match (&inv.stdin, child.stdin.take()) {
            // Write from another thread while collecting output, so a child that fills its
            // stdout or stderr pipe before reading all input cannot deadlock us. A write
            // error means the child died early, which its exit status reports.
            (Some(input), Some(mut pipe)) => std::thread::scope(|s| {
                s.spawn(move || {
                    let _ = pipe.write_all(input);
                });
                child.wait_with_output()
            })?,
            _ => child.wait_with_output()?,
        };
        if trace {
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            log::debug!("  {ms:.1} ms, {}", out.status);
        }
        Ok(Outcome {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}
