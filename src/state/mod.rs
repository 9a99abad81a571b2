//! What natledger keeps on disk: the [`ledger`] of manifests under its lock, shared host
//! ports ([`sharing`]), and the file primitives it is written with ([`safefile`],
//! [`durable`]).

pub mod durable;
pub mod ledger;
pub mod safefile;
pub mod sharing;
