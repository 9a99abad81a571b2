//! natledger as a chained CNI plugin (a drop-in for CNI portmap): the binary, run with
//! `CNI_COMMAND` set, reads the network configuration on stdin and the `CNI_*` environment,
//! and answers on stdout with the result or an error object and the exit status (SPEC.md §2,
//! §5; the facts relied on are in `docs/cni-notes.md`).
//!
//! `spec.rs` is the wire format, `env.rs` the environment, `attachment.rs` an attachment's
//! ledger id, `result.rs` the container addresses read from `prevResult`. [`run`] validates in
//! libcni's order (environment, JSON, version, configuration) and dispatches to a [`Plugin`].

pub mod attachment;
pub mod env;
pub mod netconf;
pub mod plugin;
pub mod result;
pub mod spec;
#[cfg(test)]
mod tests;
pub mod validate;

use crate::model::family::IfAddr;
use std::ffi::OsString;
use std::io::Read;

use serde_json::Value;

pub use attachment::Attachment;
pub use env::{Command, Env};
pub use netconf::NetConf;
pub use spec::{CniError, Code, Version};

/// The largest configuration read from stdin (a runtime sends a few kilobytes; a
/// `prevResult` of many interfaces, tens).
const MAX_STDIN: u64 = 16 << 20;

/// What the process prints on stdout and exits with.
#[derive(Debug, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub code: u8,
}

/// One validated invocation.
#[derive(Debug)]
pub struct Request {
    pub env: Env,
    pub conf: NetConf,
}

impl Request {
    /// The attachment of ADD, DEL and CHECK (`Env::read` requires it for them).
    pub fn attachment(&self) -> Option<&Attachment> {
        self.env.attachment.as_ref()
    }

    /// The container's addresses, one per family, with their prefixes, from `prevResult`;
    /// none without one.
    pub fn container_addresses(&self) -> Result<Vec<IfAddr>, CniError> {
        match (&self.conf.prev_result, self.attachment()) {
            (Some(prev), Some(att)) => result::container_addresses(prev, &att.ifname),
            _ => Ok(Vec::new()),
        }
    }
}

/// What each command does once its request is valid. ADD's output (the `prevResult`, passed
/// through) and every error object are written by [`run`]; a plugin only acts.
pub trait Plugin {
    fn add(&self, request: &Request) -> Result<(), CniError>;
    fn del(&self, request: &Request) -> Result<(), CniError>;
    fn check(&self, request: &Request) -> Result<(), CniError>;
    fn gc(&self, request: &Request) -> Result<(), CniError>;
    fn status(&self, request: &Request) -> Result<(), CniError>;
}

/// Whether the process environment (`lookup`) asks for a CNI plugin (an empty
/// `CNI_COMMAND` too, when no argument was given: runtimes give none, and it is answered
/// with an error object).
pub fn requested(lookup: &dyn Fn(&str) -> Option<OsString>, no_arguments: bool) -> bool {
    env::requested(lookup, no_arguments)
}

/// The process as a CNI plugin: stdin and the environment (`lookup`) in, [`Output`] out.
pub fn run_process(lookup: &dyn Fn(&str) -> Option<OsString>, plugin: &dyn Plugin) -> Output {
    let mut stdin = Vec::new();
    match std::io::stdin()
        .lock()
        .take(MAX_STDIN + 1)
        .read_to_end(&mut stdin)
    {
        Ok(_) if stdin.len() as u64 > MAX_STDIN => {
            let e = CniError::new(
                Code::Io,
                "error reading from stdin",
                format!("the configuration is over {MAX_STDIN} bytes"),
            );
            return failure(&e, &stdin[..0]);
        }
        Ok(_) => {}
        Err(e) => {
            let e = CniError::new(Code::Io, "error reading from stdin", e.to_string());
            return failure(&e, &[]);
        }
    }
    run(&stdin, lookup, plugin)
}

/// One invocation: the environment (code 4), stdin as JSON (6), its version (1), the
/// configuration (7, 2), the command's minimum version, then the plugin. VERSION needs only
/// `CNI_COMMAND` and never fails.
pub fn run(stdin: &[u8], lookup: &dyn Fn(&str) -> Option<OsString>, plugin: &dyn Plugin) -> Output {
    let env = match Env::read(lookup) {
        Ok(env) => env,
        Err(e) => return failure(&e, stdin),
    };
    if env.command == Command::Version {
        return success(json(&spec::VersionResult::answer(stdin)));
    }
    let conf = match env.command {
        Command::Del => NetConf::for_del,
        _ => NetConf::from_value,
    };
    let request = match spec::decode_object(stdin).and_then(conf) {
        Ok(conf) => Request { env, conf },
        Err(e) => return failure(&e, stdin),
    };
    let done = at_least(&request).and_then(|()| match request.env.command {
        Command::Add => add(plugin, &request),
        Command::Del => plugin.del(&request).map(|()| String::new()),
        Command::Check => plugin.check(&request).map(|()| String::new()),
        Command::Gc => plugin.gc(&request).map(|()| String::new()),
        Command::Status => plugin.status(&request).map(|()| String::new()),
        Command::Version => unreachable!("answered above"),
    });
    match done {
        Ok(stdout) => success(stdout),
        Err(e) => failure(&e, stdin),
    }
}

/// ADD of a chained plugin: there must be a `prevResult` (natledger reads the container's
/// addresses there, and has nothing else to answer), which is the output, unchanged.
fn add(plugin: &dyn Plugin, request: &Request) -> Result<String, CniError> {
    let Some(prev) = &request.conf.prev_result else {
        return Err(CniError::new(
            Code::InvalidConfig,
            "must be called as chained plugin",
            "ADD without prevResult: natledger goes after the plugin that creates the \
             interface (bridge, ptp, …) in the conflist's plugins",
        ));
    };
    plugin.add(request)?;
    Ok(json(prev))
}

/// CHECK exists from 0.4.0, GC and STATUS from 1.1.0 (libcni's skel refuses older with 1).
fn at_least(request: &Request) -> Result<(), CniError> {
    let (needed, what) = match request.env.command {
        Command::Check => (Version::V0_4_0, "CHECK"),
        Command::Gc => (Version::V1_1_0, "GC"),
        Command::Status => (Version::V1_1_0, "STATUS"),
        _ => return Ok(()),
    };
    if request.conf.version >= needed {
        Ok(())
    } else {
        Err(CniError::new(
            Code::IncompatibleVersion,
            "config version does not allow this command",
            format!(
                "{what} needs cniVersion {needed} or later; the config is {}",
                request.conf.version
            ),
        ))
    }
}

fn success(stdout: String) -> Output {
    Output { stdout, code: 0 }
}

/// The error object, in the input's `cniVersion` when it sent a string one (even one natledger
/// does not speak: the runtime reads the error in its own terms), else the newest.
fn failure(error: &CniError, stdin: &[u8]) -> Output {
    let version = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| !v.is_empty() && v.len() <= 32)
        .unwrap_or_else(|| Version::LATEST.as_str().to_string());
    Output {
        stdout: json(&error.to_wire(&version)),
        code: 1,
    }
}

fn json(value: &impl serde::Serialize) -> String {
    // Serialising a `Value` or a plain struct cannot fail.
    let mut text = serde_json::to_string(value).unwrap_or_default();
    text.push('\n');
    text
}
