//! The one seam around process execution. Everything natledger runs (iptables-save and
//! iptables-restore) goes through a [`Runner`], so operation logic can be tested with a
//! scripted runner and the real backends are exercised by the integration tests.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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
}

/// Runs real processes. Logs each command line, and how long it took, at debug level.
#[derive(Debug, Default)]
pub struct SystemRunner {
    _private: (),
}

impl Runner for SystemRunner {
    fn run(&self, inv: &Invocation) -> std::io::Result<Outcome> {
        let trace = log::log_enabled!(log::Level::Debug);
        if trace {
            log::debug!("exec {inv}");
        }
        let start = std::time::Instant::now();
        let mut child = Command::new(&inv.program)
            .args(&inv.args)
            .stdin(if inv.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
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
