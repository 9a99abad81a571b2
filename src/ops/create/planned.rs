//! The rules a create would record, computed without writing or recording anything: what a
//! CNI CHECK looks for when natledger has no manifest of the attachment (its state lost).

use crate::model::portspec::bounds::coalesce;
use crate::state::ledger::RuleRecord;

use super::{Context, Creating, Error, limits, plan};

/// The records [`super::create`] would write for `input` in `ctx.backend()` when it shares no
/// mapping with another container of its namespace: its mappings merged as create merges
/// them ([`limits::merged`]), then the same `plan::plan`. Pure but for `input.addresses`.
pub fn planned(ctx: &Context, input: &Creating) -> Result<Vec<RuleRecord>, Error> {
    let merged = limits::merged(ctx.driver.capabilities(), &input.id, &input.mappings)?;
    let mappings = coalesce(
        &merged,
        limits::writes_shifted_ranges(ctx.driver.capabilities()),
    );
    if mappings.is_empty() {
        return Ok(Vec::new());
    }
    let addresses = (input.addresses)()?;
    plan(ctx, input, &mappings, &addresses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Driver};
    use crate::model::portspec::parse_mappings;
    use crate::ops::testing::*;
    use crate::state::ledger::{CniAttachment, Ledger};

    /// An attachment of [`NETNS_PATH`] with `mappings`, towards 10.77.0.2 and fd77::2.
    fn attachment<'a>(
        ctx: &Context,
        mappings: &str,
        addresses: &'a dyn Fn() -> Result<Vec<crate::model::family::IfAddr>, Error>,
    ) -> Creating<'a> {
        let path = std::path::PathBuf::from(NETNS_PATH);
        Creating {
            id: "cid+eth0".parse().unwrap(),
            pid: None,
            bundle: None,
            mappings: parse_mappings(mappings).unwrap(),
            addresses,
            refuse_conflicts: false,
            held: super::super::Held::Stack,
            pod: None,
            netns: ctx.host.netns_at(&path).ok(),
            cni: Some(CniAttachment {
                container_id: "cid".into(),
                ifname: "eth0".into(),
                network: "net".into(),
                netns_path: Some(path),
                deleted: false,
            }),
        }
    }

    /// What CHECK plans is exactly what ADD recorded, record for record (on iptables-nft's
    /// fake driver), in the backend's own records elsewhere, the driver not asked: consecutive mappings merged as the backend merges them, both families, TCP and
    /// UDP.
    #[test]
    fn planned_records_are_what_create_records() {
        let addresses = || {
            Ok(vec![
                "10.77.0.2".parse::<std::net::IpAddr>().unwrap().into(),
                "fd77::2".parse::<std::net::IpAddr>().unwrap().into(),
            ])
        };
        for backend in Backend::ALL {
            let dir = tempfile::tempdir().unwrap();
            let host = fake_host();
            let fake = FakeDriver::new(backend);
            let drivers: [&dyn Driver; 1] = [&fake];
            let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
            let input = attachment(&ctx, "8080:80,8081:81,5353:53/udp", &addresses);
            let planned = planned(&ctx, &input).unwrap();
            assert!(fake.take_calls().is_empty(), "{backend:?}: nothing asked");
            if backend == Backend::IptablesNft {
                super::super::create(&ctx, &input).unwrap();
                let manifest = ctx.ledger.load(&input.id).unwrap().unwrap();
                assert_eq!(planned, manifest.rules, "{backend:?}");
            }
            assert!(planned.iter().all(|r| r.backend == backend), "{backend:?}");
            let dnats = planned
                .iter()
                .filter(|r| r.chain == crate::model::layout::DNAT_CHAIN)
                .count();
            // 8080-8081 merged into one range where the backend writes shifted ranges (not
            // nftables'), and 5353/udp; in two families.
            let ranges = if backend == Backend::OwnNftables {
                3
            } else {
                2
            };
            assert_eq!(dnats, 2 * ranges, "{backend:?}");
        }
    }

    /// No mapping asked: nothing planned, and no address needed. A mapping in a family the
    /// container has no address in is refused as create refuses it.
    #[test]
    fn nothing_asked_plans_nothing_and_a_family_without_address_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let fake = FakeDriver::new(Backend::IptablesNft);
        let drivers: [&dyn Driver; 1] = [&fake];
        let ctx = fake_context(Ledger::new(dir.path()), &fake, &drivers, &host);
        let no_address =
            || -> Result<Vec<crate::model::family::IfAddr>, Error> { panic!("not asked") };
        let mut input = attachment(&ctx, "8080:80", &no_address);
        input.mappings.clear();
        assert_eq!(planned(&ctx, &input).unwrap(), Vec::new());
        let v4_only = || {
            Ok(vec![
                "10.77.0.2".parse::<std::net::IpAddr>().unwrap().into(),
            ])
        };
        let input = attachment(&ctx, "[::]:8080:80", &v4_only);
        assert!(matches!(
            planned(&ctx, &input),
            Err(Error::FamilyMismatch { .. })
        ));
        assert!(fake.take_calls().is_empty(), "the driver not asked");
    }
}
