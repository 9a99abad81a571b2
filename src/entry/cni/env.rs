//! The `CNI_*` environment: which command, and the attachment parameters each command
//! requires (SPEC.md §2 "Parameters" and each operation's "Input"). Every failure is code 4 and
//! names the variables.

use std::ffi::OsString;
use std::path::PathBuf;

use super::attachment::Attachment;
use super::spec::{CniError, Code, valid_name};
use crate::model::echo::Echo;

/// `CNI_COMMAND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    fn parse(text: &str) -> Option<Command> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    /// The variables the spec requires for this command, besides `CNI_COMMAND`.
    fn required(self) -> &'static [&'static str] {
        match self {
            // CNI_PATH as libcni's skel requires it (the spec: for GC; runtimes always set it).
            Command::Add | Command::Check => &[CONTAINERID, NETNS, IFNAME, PATH],
            Command::Del => &[CONTAINERID, IFNAME, PATH],
            Command::Gc => &[PATH],
            Command::Status | Command::Version => &[],
        }
    }
}

pub const COMMAND: &str = "CNI_COMMAND";
pub const CONTAINERID: &str = "CNI_CONTAINERID";
pub const NETNS: &str = "CNI_NETNS";
pub const IFNAME: &str = "CNI_IFNAME";
pub const ARGS: &str = "CNI_ARGS";
pub const PATH: &str = "CNI_PATH";

/// Whether this process was started as a CNI plugin: `CNI_COMMAND` is set and not empty, or
/// set but empty and the binary was given no argument (as runtimes run plugins: libcni's skel
/// then answers code 4, naming `CNI_COMMAND`; natledger's own commands always have one).
pub fn requested(lookup: &dyn Fn(&str) -> Option<OsString>, no_arguments: bool) -> bool {
    match lookup(COMMAND) {
        Some(v) if v.is_empty() => no_arguments,
        Some(_) => true,
        None => false,
    }
}

/// The environment of one invocation, validated for its command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    /// Present (and valid) for ADD, DEL and CHECK.
    pub attachment: Option<Attachment>,
    /// `CNI_NETNS`; optional for DEL (the namespace may be gone).
    pub netns: Option<PathBuf>,
    /// `CNI_ARGS`, as sent (natledger reads no argument from it).
    pub args: Option<String>,
    pub path: Option<String>,
}

impl Env {
    /// Read the variables through `lookup` (the process environment, or a test's map).
    pub fn read(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Env, CniError> {
        let get = |name: &'static str| -> Result<Option<String>, CniError> {
            match lookup(name) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v.into_string().map(Some).map_err(|v| {
                    CniError::new(
                        Code::InvalidEnv,
                        "invalid environment variable",
                        format!(
                            "{name} is not UTF-8: {}",
                            Echo::from(v.to_string_lossy().into_owned())
                        ),
                    )
                }),
            }
        };
        let Some(command_text) = get(COMMAND)? else {
            return Err(missing(&[COMMAND]));
        };
        let command = Command::parse(&command_text).ok_or_else(|| {
            CniError::new(
                Code::InvalidEnv,
                "unknown CNI_COMMAND",
                format!(
                    "CNI_COMMAND {} is not ADD, DEL, CHECK, GC, STATUS or VERSION",
                    Echo::from(command_text.as_str())
                ),
            )
        })?;
        let absent: Vec<&str> = command
            .required()
            .iter()
            .copied()
            .filter(|name| lookup(name).is_none_or(|v| v.is_empty()))
            .collect();
        if !absent.is_empty() {
            return Err(missing(&absent));
        }
        let attachment = match command {
            Command::Add | Command::Del | Command::Check => {
                let container_id = get(CONTAINERID)?.unwrap_or_default();
                let ifname = get(IFNAME)?.unwrap_or_default();
                Some(attachment(container_id, ifname)?)
            }
            _ => None,
        };
        Ok(Env {
            command,
            attachment,
            netns: get(NETNS)?.map(PathBuf::from),
            args: get(ARGS)?,
            path: get(PATH)?,
        })
    }
}

fn missing(names: &[&str]) -> CniError {
    CniError::new(
        Code::InvalidEnv,
        "required environment variables missing",
        names.join(","),
    )
}

/// The attachment `(CNI_CONTAINERID, CNI_IFNAME)`, each checked as libcni checks them.
fn attachment(container_id: String, ifname: String) -> Result<Attachment, CniError> {
    if !valid_name(&container_id) {
        return Err(CniError::new(
            Code::InvalidEnv,
            "invalid characters in CNI_CONTAINERID",
            Echo::from(container_id).to_string(),
        ));
    }
    if let Some(why) = ifname_problem(&ifname) {
        return Err(CniError::new(
            Code::InvalidEnv,
            "invalid CNI_IFNAME",
            format!("{}: {why}", Echo::from(ifname)),
        ));
    }
    Ok(Attachment {
        container_id,
        ifname,
    })
}

/// Linux's interface name rules, as libcni's `ValidateInterfaceName` checks them.
pub fn ifname_problem(ifname: &str) -> Option<&'static str> {
    if ifname.is_empty() {
        Some("empty")
    } else if ifname.len() > 15 {
        Some("longer than 15 bytes")
    } else if ifname == "." || ifname == ".." {
        Some("is . or ..")
    } else if ifname
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains /, : or whitespace")
    } else {
        None
    }
}
