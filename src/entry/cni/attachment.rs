//! A CNI attachment and its ledger id.
//!
//! An attachment is `(CNI_CONTAINERID, CNI_IFNAME)` (SPEC.md §3): one container may be on
//! several networks, one per interface, each with its own mappings, so the ledger keys its
//! manifest (and the `natledger:<id>` tag of its rules) by both:
//!
//! ```text
//!   <CNI_CONTAINERID> "+" <CNI_IFNAME, escaped>
//!   e.g. 3f1c…9a+eth0      (podman, containerd: a 64-hex id and eth0)
//! ```
//!
//! `+` cannot occur in a CNI container id (`[a-zA-Z0-9][a-zA-Z0-9_.\-]*`), so the first `+`
//! separates the two and the id is injective. The interface name keeps `[A-Za-z0-9_.-]`; any
//! other byte (Linux allows nearly any) is written `+XX` (hex), so the id stays within
//! `oci::ContainerId`'s characters: safe as a file name and inside an iptables comment. Ids
//! longer than `ContainerId`'s 128 characters are refused (real runtimes send 64).

use std::fmt::Write as _;

use super::spec::{CniError, Code};
use crate::model::oci::ContainerId;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

impl Attachment {
    /// The id its manifest and rules carry.
    pub fn ledger_id(&self) -> Result<ContainerId, CniError> {
        let mut id = String::with_capacity(self.container_id.len() + 1 + self.ifname.len());
        id.push_str(&self.container_id);
        id.push('+');
        for b in self.ifname.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
                id.push(char::from(b));
            } else {
                let _ = write!(id, "+{b:02X}");
            }
        }
        id.parse().map_err(|_| {
            CniError::new(
                Code::InvalidEnv,
                "CNI_CONTAINERID and CNI_IFNAME too long",
                format!(
                    "natledger's id for this attachment, {id}, would be {} characters; at most \
                     128 fit a manifest name and a rule comment",
                    id.len()
                ),
            )
        })
    }

    /// The attachment a ledger id names, if it is one ([`Attachment::ledger_id`]'s inverse).
    /// An OCI hook container's id may contain `+` too: what a manifest is, is recorded in it;
    /// this only decodes.
    pub fn from_ledger_id(id: &ContainerId) -> Option<Attachment> {
        let (container_id, escaped) = id.as_str().split_once('+')?;
        let mut ifname = Vec::new();
        let mut bytes = escaped.bytes();
        while let Some(b) = bytes.next() {
            if b == b'+' {
                let hex = [bytes.next()?, bytes.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                ifname.push(u8::from_str_radix(hex, 16).ok()?);
            } else {
                ifname.push(b);
            }
        }
        Some(Attachment {
            container_id: container_id.to_string(),
            ifname: String::from_utf8(ifname).ok()?,
        })
    }
}
