//! The plugin the binary is: each command on natledger's ledger and backends.

use super::{CniError, Code, Plugin, Request};

/// natledger's commands. Those not built yet answer a plugin-specific error, so a runtime
/// never takes silence for success.
pub struct Natledger;

fn not_yet(command: &str) -> CniError {
    CniError::new(
        Code::Failed,
        "not implemented",
        format!("natledger does not implement CNI {command} yet"),
    )
}

impl Plugin for Natledger {
    fn add(&self, _request: &Request) -> Result<(), CniError> {
        Err(not_yet("ADD"))
    }
    fn del(&self, _request: &Request) -> Result<(), CniError> {
        Err(not_yet("DEL"))
    }
    fn check(&self, _request: &Request) -> Result<(), CniError> {
        Err(not_yet("CHECK"))
    }
    fn gc(&self, _request: &Request) -> Result<(), CniError> {
        Err(not_yet("GC"))
    }
    fn status(&self, _request: &Request) -> Result<(), CniError> {
        Err(not_yet("STATUS"))
    }
}
