//! The `prevResult` natledger reads: the container's addresses (SPEC.md §5 "ADD Success").
//! The result itself stays an opaque JSON value, passed through unchanged; only `ips` and
//! `interfaces` are looked at here.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use super::spec::{CniError, Code};
use crate::model::echo::Echo;
use crate::model::family::{Family, IfAddr};

#[derive(Deserialize)]
struct View {
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<Ip>,
}

#[derive(Deserialize)]
struct Interface {
    #[serde(default)]
    name: String,
    #[serde(default)]
    sandbox: String,
}

#[derive(Deserialize)]
struct Ip {
    address: String,
    #[serde(default)]
    interface: Option<u64>,
}

/// The container's address per family, with its prefix (the interface's subnet): the first
/// `ips` entry of that family on the container's interface `ifname`. An entry's `interface` is an index into `interfaces`; an
/// entry naming another interface, or a host-side one (empty `sandbox`), is not the
/// container's. An entry without an index, or with one past the list, is taken: portmap does
/// the same, and being stricter would break chains portmap serves. IPv4 first.
pub fn container_addresses(prev: &Value, ifname: &str) -> Result<Vec<IfAddr>, CniError> {
    let view: View = serde_json::from_value(prev.clone())
        .map_err(|e| CniError::new(Code::Decode, "error decoding prevResult", e.to_string()))?;
    let mut found: Vec<IfAddr> = Vec::new();
    for ip in &view.ips {
        let address = cidr_address(&ip.address)?;
        let other_interface = ip
            .interface
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| view.interfaces.get(i))
            .is_some_and(|i| i.name != ifname || i.sandbox.is_empty());
        if other_interface {
            continue;
        }
        if !found
            .iter()
            .any(|a| Family::of(a.addr) == Family::of(address.addr))
        {
            found.push(address);
        }
    }
    found.sort_by_key(|a| a.addr.is_ipv6());
    Ok(found)
}

/// The address of `a.b.c.d/n` and its prefix.
fn cidr_address(text: &str) -> Result<IfAddr, CniError> {
    let bad = || {
        CniError::new(
            Code::Decode,
            "error decoding prevResult",
            format!(
                "ips address {} is not an address in CIDR notation",
                Echo::from(text)
            ),
        )
    };
    let (addr, prefix) = text.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    match prefix.parse::<u8>() {
        Ok(p) if p <= max && !prefix.starts_with('+') => Ok(IfAddr {
            addr,
            prefix: Some(p),
        }),
        _ => Err(bad()),
    }
}
