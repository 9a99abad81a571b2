//! The CNI wire format as natledger speaks it: versions, the VERSION answer and the error
//! object, and stdin read as a JSON object (SPEC.md §1, §5; `docs/cni-notes.md`). The
//! network configuration in it is decoded in `netconf.rs`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::echo::{Echo, MESSAGE, limit};

/// The spec versions natledger implements, oldest first (the VERSION answer). 0.3.x is
/// there because many conflists still say it (flannel's, older Kubernetes ones) and portmap
/// accepts it: its `prevResult` is the same `ips`/`interfaces` shape (each `ips` entry also
/// carries `version`), it has no CHECK (refused below 0.4.0) and DEL gets no `prevResult`
/// (natledger's DEL never needs one).
pub const SUPPORTED: [Version; 5] = [
    Version::V0_3_0,
    Version::V0_3_1,
    Version::V0_4_0,
    Version::V1_0_0,
    Version::V1_1_0,
];

/// A CNI spec version natledger implements (ordered: older is less).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl Version {
    /// The newest, used in errors before the input's version is known.
    pub const LATEST: Version = Version::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_3_0 => "0.3.0",
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// A `cniVersion` value: not `MAJOR.MINOR.PATCH` is a decoding failure (6), a version
    /// natledger does not implement is incompatible (1).
    pub fn parse(text: &str) -> Result<Version, CniError> {
        let numeric = text.split('.').count() == 3
            && text
                .split('.')
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !numeric {
            return Err(CniError::new(
                Code::Decode,
                "invalid cniVersion",
                format!("{} is not a MAJOR.MINOR.PATCH version", Echo::from(text)),
            ));
        }
        SUPPORTED
            .into_iter()
            .find(|v| v.as_str() == text)
            .ok_or_else(|| {
                CniError::new(
                    Code::IncompatibleVersion,
                    "incompatible CNI versions",
                    format!(
                        "config is {}, natledger supports {}",
                        Echo::from(text),
                        supported_list()
                    ),
                )
            })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn supported_list() -> String {
    SUPPORTED.map(Version::as_str).join(", ")
}

/// The well-known error codes (SPEC.md §5 "Error"), and natledger's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion,
    UnsupportedField,
    UnknownContainer,
    InvalidEnv,
    Io,
    Decode,
    InvalidConfig,
    TryAgainLater,
    Unavailable,
    UnavailableLimited,
    /// natledger could not do what was asked (a backend, the ledger): plugin specific.
    Failed,
}

impl Code {
    pub fn number(self) -> u32 {
        match self {
            Code::IncompatibleVersion => 1,
            Code::UnsupportedField => 2,
            Code::UnknownContainer => 3,
            Code::InvalidEnv => 4,
            Code::Io => 5,
            Code::Decode => 6,
            Code::InvalidConfig => 7,
            Code::TryAgainLater => 11,
            Code::Unavailable => 50,
            Code::UnavailableLimited => 51,
            Code::Failed => 100,
        }
    }
}

/// A CNI error: what goes on stdout, as the error object, when natledger fails.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    pub code: Code,
    /// Short and fixed for a kind of error (the spec's "short message").
    pub msg: &'static str,
    /// What exactly, quoting input only through `Echo` or `limit`.
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: &'static str, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg,
            details: limit(&details.into(), MESSAGE),
        }
    }

    /// The error object of SPEC.md §5, for the version in use.
    pub fn to_wire(&self, version: &str) -> ErrorResult {
        ErrorResult {
            cni_version: version.to_string(),
            code: self.code.number(),
            msg: self.msg.to_string(),
            details: self.details.clone(),
        }
    }
}

/// The error object on stdout.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ErrorResult {
    pub cni_version: String,
    pub code: u32,
    pub msg: String,
    pub details: String,
}

/// The VERSION answer (SPEC.md §5 "VERSION Success").
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VersionResult {
    pub cni_version: String,
    pub supported_versions: Vec<String>,
}

impl VersionResult {
    /// `cniVersion` is the input's when it sent one (whatever it is: VERSION is how a runtime
    /// learns what to send), else the newest.
    pub fn answer(stdin: &[u8]) -> VersionResult {
        let asked = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
            .filter(|v| !v.is_empty());
        VersionResult {
            cni_version: asked.unwrap_or_else(|| Version::LATEST.as_str().to_string()),
            supported_versions: SUPPORTED.map(|v| v.as_str().to_string()).to_vec(),
        }
    }
}

/// The `cniVersion` of a configuration: a missing one is `0.1.0` (libcni's rule), so it is
/// refused as incompatible.
pub fn version_of(config: &Value) -> Result<Version, CniError> {
    match config.get("cniVersion") {
        None | Some(Value::Null) => Version::parse("0.1.0"),
        Some(Value::String(s)) if s.is_empty() => Version::parse("0.1.0"),
        Some(Value::String(s)) => Version::parse(s),
        Some(other) => Err(CniError::new(
            Code::Decode,
            "invalid cniVersion",
            format!("cniVersion must be a string, not {}", kind(other)),
        )),
    }
}

/// stdin as a JSON object (6 when it is not one).
pub fn decode_object(stdin: &[u8]) -> Result<Value, CniError> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            Code::Decode,
            "error decoding network config",
            format!("stdin is not JSON: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(CniError::new(
            Code::Decode,
            "error decoding network config",
            format!("stdin is a JSON {}, not an object", kind(&value)),
        ));
    }
    Ok(value)
}

/// SPEC.md §1 `name`, and `CNI_CONTAINERID` (§2): `[a-zA-Z0-9][a-zA-Z0-9_.\-]*`.
pub fn valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

pub(super) fn invalid(msg: &'static str) -> CniError {
    CniError::new(Code::InvalidConfig, msg, "")
}

pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
