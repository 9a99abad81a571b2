//! The rule model: pure values, no I/O. Address families, port mappings, the typed [`rule`]s
//! natledger writes and recognises, the chains they go to ([`layout`]), the iptables-save text
//! form ([`save`]) and any saved rule's conditions and target ([`anyrule`]), any owner's native
//! nf_tables ruleset ([`ruleset`]), the OCI hook input ([`oci`]), a listening socket
//! ([`listener`]) and how untrusted values are shown ([`echo`]).

pub mod anyrule;
pub mod backend_name;
pub mod capabilities;
pub mod echo;
pub mod family;
pub mod layout;
pub mod listener;
pub mod oci;
pub mod portspec;
pub mod rule;
pub mod ruleset;
pub mod save;
pub mod table;
