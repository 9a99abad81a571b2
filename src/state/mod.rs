//! What natledger keeps on disk: the [`ledger`] of manifests under its lock, shared host
//! ports ([`sharing`]), whether a recorded container lives ([`liveness`]), and the file
//! primitives it is written with ([`safefile`], [`durable`]).

pub mod durable;
pub mod ledger;
pub mod liveness;
pub mod safefile;
pub mod sharing;
