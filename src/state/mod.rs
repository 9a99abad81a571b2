//! What natledger keeps on disk: the [`ledger`] of manifests under its lock, shared host
//! ports ([`sharing`]), whether a recorded container lives ([`liveness`]), and how a file
//! is written to survive a crash ([`durable`], over [`crate::kernel::safefile`]).

pub mod durable;
pub mod ledger;
pub mod liveness;
pub mod sharing;
