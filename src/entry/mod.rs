//! The ways in: the command line ([`cli`]), the CNI plugin ([`cni`]), the wrapper runtime
//! ([`wrapper`]) and the bundle it edits ([`bundle`]), `selftest`, and the metrics file.

pub mod bundle;
pub mod cli;
pub mod cni;
pub mod install_cni;
pub mod metrics;
pub mod selftest;
pub mod settings;
pub mod watch;
pub mod wrapper;
