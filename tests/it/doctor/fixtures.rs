//! Every fixture under `tests/fixtures/doctor/` (seeds, hand-written, real rulesets of other
//! owners), alone and with the other backend's dump of the same host: doctor never fails or
//! crashes on them, and every sentence it writes parses (`common::garbled`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;

/// Every fixture file, with the backend its name says (`NAME.legacy.txt`, `NAME.nft.txt`),
/// grouped by host (the name before the backend).
fn fixtures() -> BTreeMap<String, Vec<(String, PathBuf)>> {
    let mut hosts: BTreeMap<String, Vec<(String, PathBuf)>> = BTreeMap::new();
    let mut dirs = vec![fixture("")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some((host, backend)) = ["legacy", "nft"].iter().find_map(|b| {
                name.strip_suffix(&format!(".{b}.txt"))
                    .map(|h| (h.to_string(), b.to_string()))
            }) else {
                continue;
            };
            hosts.entry(host).or_default().push((backend, path));
        }
    }
    hosts
}

fn label(backend: &str, path: &Path) -> String {
    format!("{backend}:{}", path.display())
}

#[test]
fn every_sentence_over_every_fixture_parses() {
    let hosts = fixtures();
    assert!(hosts.len() >= 12, "{hosts:?}");
    let mut runs = 0;
    for (host, files) in &hosts {
        let mut sets: Vec<Vec<String>> = files.iter().map(|(b, p)| vec![label(b, p)]).collect();
        if files.len() > 1 {
            sets.push(files.iter().map(|(b, p)| label(b, p)).collect());
        }
        for set in sets {
            let mut args = vec!["--from"];
            args.extend(set.iter().map(String::as_str));
            // JSON: schema and prose checked by `Doc::of`.
            let d = doctor_json(&args);
            assert!((0..=2).contains(&d.code), "{host}: {set:?}\n{}", d.show());
            // Text: the same findings, every line a person reads.
            let d = doctor(&args);
            assert!((0..=2).contains(&d.code), "{host}: {set:?}\n{}", d.show());
            for line in d
                .stdout
                .lines()
                .filter(|l| !l.trim_start().starts_with("-A "))
            {
                let bad: Vec<String> = garbled(line.trim_start())
                    .into_iter()
                    .filter(|b| !b.starts_with("dangling"))
                    .collect();
                assert!(bad.is_empty(), "{host}: {bad:?} in {line:?}\n{}", d.stdout);
            }
            runs += 1;
        }
    }
    assert!(runs > hosts.len(), "{runs}");
}

/// The guard itself: the sentence of the issue, and the other known-bad shapes, are caught;
/// doctor's own phrases are not.
#[test]
fn garbled_catches_the_known_bad_shapes() {
    for bad in [
        "For tcp packets to port 8080 for a local address not in on docker0, nat rule 1",
        "packets in on docker0",
        "it is a duplicate nat rule 4 of DOCKER ().",
        "tcp packets  to port 80",
        "tcp packets to port 80 for a.",
        "tcp packets to port 80 goes to 10.0.0.2",
        "packets to , arriving",
    ] {
        assert!(!garbled(bad).is_empty(), "{bad}");
    }
    for good in [
        "For tcp packets to port 8080 of a local address that arrive on any interface but \
         docker0, nat rule 2 of DOCKER (DNAT to 172.17.0.2:80) takes every packet first, so \
         rule 3 of DOCKER (DNAT to 172.17.0.3:80) never matches.",
        "rule 5 of DOCKER (DNAT to 172.17.0.9:80) never matches: it duplicates nat rule 4 of \
         DOCKER (DNAT to 172.17.0.9:80).",
        "tcp packets to port 80 go to 10.0.0.2, which nothing holds any more: that traffic is \
         lost.",
    ] {
        assert_eq!(garbled(good), Vec::<String>::new(), "{good}");
    }
}

/// `natledger doctor | head`: a reader that goes away is not a crash. The pipe's read end is
/// closed before doctor writes, so its first write fails with EPIPE (Rust ignores SIGPIPE);
/// doctor still exits with its own status (2: the seed has errors) and says nothing on stderr.
#[test]
fn a_reader_that_goes_away_is_not_a_crash() {
    for json in [false, true] {
        let path = fixture("seed002_cni_portmap_stale.legacy.txt");
        let mut cmd = std::process::Command::new(BIN);
        cmd.arg("doctor");
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .args(["--from", &label("legacy", &path)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "json {json}: {stderr}");
        assert!(stderr.is_empty(), "json {json}: {stderr}");
    }
}
