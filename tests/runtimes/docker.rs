//! Docker end to end through the wrapper runtime: Debian's dockerd 20.10 (with the containerd
//! it starts itself) inside a node namespace, every piece of its state in a temporary
//! directory, natledger registered as the runtime `natledger` (a `natledger-runtime` symlink)
//! in its daemon.json. And the wrapper's pass-through of runc's own commands, compared with
//! runc itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// The address the container claims through NATLEDGER_IP (it has no network of its own).
const CONTAINER_IP: &str = "10.77.0.5";
const T: Duration = Duration::from_secs(10);

/// The real runtime the wrapper finds by default: the first runc in its directories.
fn system_runc() -> PathBuf {
    natledger::entry::wrapper::RUNTIME_DIRS
        .iter()
        .map(|d| Path::new(d).join("runc"))
        .find(|p| p.exists())
        .expect("runc is installed (apt-get install runc)")
}

/// `docker run --runtime natledger -e NATLEDGER_PORTS=8080:80 -e NATLEDGER_IP=10.77.0.5`:
/// the wrapper turns the variables into annotations and injects both hooks (with the state
/// directory and backend from daemon.json's runtimeArgs), so while the container runs the
/// DNAT rule 8080 -> 10.77.0.5:80 is in the backend under test and a manifest exists; a
/// server at 10.77.0.5 (a topology namespace standing in, since the container has no
/// network) is reached through it from an external client. `docker rm -f` runs poststop:
/// no rule, no manifest. A container without the variables gets no hooks. dockerd stops
/// cleanly and neither it nor its containerd leave a process or mount behind.
#[test]
fn docker_wrapper_runtime_forwards_and_rm_removes() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let started = Instant::now();
        let mut node = Node::new(backend);
        let what = format!("docker, {backend:?}");
        let stand_in = node.topo.add_container(5);
        assert_eq!(stand_in.v4.to_string(), CONTAINER_IP);
        let _server = serve_tcp(&stand_in.ns, stand_in.sock_v4(80), "c5 tcp");

        let t = Instant::now();
        let mut dockerd = Dockerd::start(&node, &DockerdOptions::default());
        let dockerd_start = t.elapsed();
        let tarball = image_tarball(node.dir.path());
        dockerd.ok(&["import", &tarball.display().to_string(), IMAGE]);

        let t = Instant::now();
        let id = dockerd.start_container(&[
            "-e",
            "NATLEDGER_PORTS=8080:80",
            "-e",
            &format!("NATLEDGER_IP={CONTAINER_IP}"),
        ]);
        let run_time = t.elapsed();
        let running = dockerd.ok(&["inspect", "--format", "{{.State.Running}}", &id]);
        assert_eq!(running, "true", "{what}: container not running");
        // dockerd's own containerd and the container's shim, all with state under our dir.
        let ours = dockerd.own.processes();
        for program in ["containerd --config", "containerd-shim-runc-v2"] {
            assert!(
                ours.iter().any(|(_, cmdline)| cmdline.contains(program)),
                "{what}: no {program} process of this dockerd: {ours:#?}"
            );
        }

        let config = dockerd.bundle_config(&id);
        assert_eq!(config["annotations"]["io.natledger.ports"], "8080:80");
        assert_eq!(config["annotations"]["io.natledger.ip"], CONTAINER_IP);
        let state_env = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
        let backend_env = format!("NATLEDGER_BACKEND={}", backend.name());
        for (stage, arg) in [
            ("createRuntime", "create-runtime"),
            ("poststop", "poststop"),
        ] {
            let hooks = natledger_hooks(&config, stage);
            assert_eq!(
                hooks.len(),
                1,
                "{what}: {stage} hooks: {:#}",
                config["hooks"]
            );
            let hook = hooks[0];
            assert_eq!(hook["args"], serde_json::json!(["natledger", "hook", arg]));
            assert_eq!(hook["env"], serde_json::json!([state_env, backend_env]));
            let path = hook["path"].as_str().unwrap_or_default();
            assert!(
                Path::new(path).canonicalize().ok() == Path::new(BIN).canonicalize().ok(),
                "{what}: {stage} hook runs {path}, not the natledger binary {BIN}"
            );
        }

        let dest = format!("{CONTAINER_IP}:80");
        assert_forward(&node.dump(), backend, &id, 8080, &dest);
        assert!(node.manifest_exists(&id), "{what}: no manifest");
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("c5 tcp"),
            "{what}: the forward docker's container installed does not reach {CONTAINER_IP}"
        );

        // Without NATLEDGER_PORTS the wrapper leaves the bundle alone.
        let plain = dockerd.start_container(&[]);
        let plain_config = dockerd.bundle_config(&plain);
        assert!(
            natledger_hooks(&plain_config, "createRuntime").is_empty()
                && natledger_hooks(&plain_config, "poststop").is_empty()
                && plain_config["annotations"]
                    .get("io.natledger.ports")
                    .is_none(),
            "{what}: natledger in a plain container's bundle: {plain_config:#}"
        );
        assert!(
            !node.manifest_exists(&plain),
            "{what}: manifest for a plain container"
        );
        dockerd.ok(&["rm", "--force", &plain]);

        // Ports without any address to forward to: refused, in Docker's terms.
        let refused = dockerd.run(&httpd_run_args(
            &[
                "--runtime",
                "natledger",
                "--network",
                "none",
                "-e",
                "NATLEDGER_PORTS=8081:80",
            ],
            IMAGE,
        ));
        let says = stderr(&refused);
        assert!(
            !refused.status.success()
                && says.contains("no global address")
                && says.contains("--network none")
                && says.contains("NATLEDGER_IP")
                && !says.contains("network hook"),
            "{what}: a container without a network is refused in Docker's terms: {says}"
        );
        dockerd.ok(&["container", "prune", "--force"]);

        let t = Instant::now();
        dockerd.ok(&["rm", "--force", &id]);
        let rm_time = t.elapsed();
        assert_removed(&node, &id, T);
        assert!(
            tcp_request(&ext, sock(NODE_V4, 8080), Duration::from_secs(1)).is_err(),
            "{what}: still forwarded after docker rm -f"
        );
        let ps = dockerd.ok(&["ps", "--all", "--quiet"]);
        assert!(ps.is_empty(), "{what}: containers left: {ps}");

        let stop_time = dockerd
            .stop()
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", dockerd.log()));
        dockerd.own.assert_clean(T);
        drop(dockerd);
        eprintln!(
            "{what}: dockerd start {dockerd_start:?}, docker run {run_time:?}, docker rm {rm_time:?}, \
             dockerd stop {stop_time:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

/// `docker run -d --runtime natledger OPTIONS IMAGE` of a process that waits for SIGTERM, with
/// `NATLEDGER_PORTS=8080:80` only, as a user asks in a container joining another's network:
/// its namespace has no address of its own here (X's forward goes to `NATLEDGER_IP`), which a
/// container that only shares X's rules does not need; the output of `docker run`.
fn run_waiter(dockerd: &Dockerd, options: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "-d", "--runtime", "natledger"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["-e", "NATLEDGER_PORTS=8080:80", IMAGE]);
    args.extend_from_slice(&WAIT_FOR_TERM);
    dockerd.run(&args)
}

/// [`run_waiter`] in container `x`'s network namespace (`--network container:X`); its id.
fn join(dockerd: &mut Dockerd, x: &str) -> String {
    let network = format!("container:{x}");
    let out = run_waiter(dockerd, &["--network", &network]);
    let id = container_id(
        stdout_of(&out, "docker run --network container:X", ""),
        "docker",
    );
    dockerd.own.ids.push(id.clone());
    id
}

/// Docker's `--network container:X`: X (`--network none`, the forward to the stand-in at
/// `NATLEDGER_IP`) installs 8080; Y in X's namespace asking for the same mapping starts and
/// shares X's rules (one DNAT, the manifests say so); `docker rm -f Y` changes nothing. Z in
/// a namespace of its own asking for 8080 is refused naming X "in another network namespace"
/// and leaves nothing. With another Y running, `docker stop X`: Docker keeps Y running, X's
/// poststop keeps its rules and manifest, the forward still reaches the server, and so after
/// `docker rm X` (Docker allows it); `docker rm -f Y` (the last member) removes them: the
/// tables as before X, no manifest. The stand-in namespace serves at `NATLEDGER_IP` (the
/// containers have no network), so the traffic proves the rules, not the containers.
#[test]
fn docker_network_container_shares_the_forward_until_the_last_goes() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let started = Instant::now();
        let mut node = Node::new(backend);
        let what = format!("docker --network container:, {backend:?}");
        let stand_in = node.topo.add_container(5);
        let _server = serve_tcp(&stand_in.ns, stand_in.sock_v4(80), "c5 tcp");
        node.warm_up();
        let mut dockerd = Dockerd::start(&node, &DockerdOptions::default());
        let tarball = image_tarball(node.dir.path());
        dockerd.ok(&["import", &tarball.display().to_string(), IMAGE]);
        let before = node.dump();
        let ext = node.topo.ext().to_string();
        let reaches = || tcp_request(&ext, sock(NODE_V4, 8080), T).ok();
        let dest = format!("{CONTAINER_IP}:80");

        let x = dockerd.start_container(&[
            "-e",
            "NATLEDGER_PORTS=8080:80",
            "-e",
            &format!("NATLEDGER_IP={CONTAINER_IP}"),
        ]);
        let with_x = node.dump();
        assert_forward(&with_x, backend, &x, 8080, &dest);
        let y = join(&mut dockerd, &x);
        assert_eq!(node.dump(), with_x, "{what}: Y's start changed the tables");
        assert_eq!(dnats(&with_x, 8080).len(), 1, "{what}: DNATs:\n{with_x}");
        let mut expected = vec![format!("{x}.json"), format!("{y}.json")];
        expected.sort();
        assert_eq!(node.manifests(), expected, "{what}: manifests");
        let mapping = serde_json::json!([{"host_ports": {"start": 8080, "end": 8080},
            "container_ports": {"start": 80, "end": 80}, "protocol": "tcp"}]);
        let shares_x = serde_json::json!([{"holder": x, "mappings": mapping}]);
        assert_eq!(
            node.manifest(&y)["shares"],
            shares_x,
            "{what}: Y's manifest"
        );
        assert_eq!(node.manifest(&x)["shared_by"], serde_json::json!([y]));
        assert_eq!(reaches().as_deref(), Some("c5 tcp"), "{what}: with Y");

        dockerd.ok(&["rm", "--force", &y]);
        assert!(!node.manifest_exists(&y), "{what}: Y's manifest after rm");
        assert_eq!(
            node.dump(),
            with_x,
            "{what}: Y's removal changed the tables"
        );
        assert_eq!(reaches().as_deref(), Some("c5 tcp"), "{what}: Y removed");

        // Another network namespace asking for the held port.
        let refused = run_waiter(&dockerd, &["--network", "none"]);
        let says = stderr(&refused);
        assert!(
            !refused.status.success()
                && says.contains(&format!(
                    "host port 8080:80/tcp is held by live container {x}"
                ))
                && says.contains("in another network namespace"),
            "{what}: Z in its own namespace is refused naming X: {}",
            show(&refused)
        );
        dockerd.ok(&["container", "prune", "--force"]);
        assert_eq!(
            node.dump(),
            with_x,
            "{what}: the refused Z changed the tables"
        );
        assert_eq!(node.manifests(), [format!("{x}.json")], "{what}: after Z");

        // The holder stops while a member lives.
        let y = join(&mut dockerd, &x);
        let t = Instant::now();
        dockerd.ok(&["stop", "--time", "0", &x]);
        let stop_time = t.elapsed();
        // containerd removes the bundle after `runc delete`, which ran X's poststop.
        let bundle = dockerd
            .own
            .dir
            .join("exec/containerd/daemon/io.containerd.runtime.v2.task/moby")
            .join(&x);
        assert!(poll(T, || !bundle.exists()), "{what}: X's task stays");
        let y_running = dockerd.ok(&["inspect", "--format", "{{.State.Running}}", &y]);
        eprintln!("{what}: after `docker stop X`, Y running: {y_running}");
        assert_eq!(y_running, "true", "{what}: Docker stopped Y with X");
        assert_eq!(node.dump(), with_x, "{what}: X's stop changed the tables");
        // `shared_by` is a hint: the first Y's name may stay in it.
        let shared_by = node.manifest(&x)["shared_by"].clone();
        assert!(
            shared_by
                .as_array()
                .is_some_and(|s| s.contains(&y.as_str().into())),
            "{what}: X's manifest after its stop: shared_by {shared_by}"
        );
        assert_eq!(reaches().as_deref(), Some("c5 tcp"), "{what}: X stopped");
        // Docker removes X while Y lives in its namespace; X's rules stay for Y.
        dockerd.ok(&["rm", &x]);
        assert_eq!(
            node.dump(),
            with_x,
            "{what}: `docker rm X` changed the tables"
        );
        assert!(
            node.manifest_exists(&x),
            "{what}: X's manifest after docker rm X"
        );
        assert_eq!(reaches().as_deref(), Some("c5 tcp"), "{what}: X removed");

        let t = Instant::now();
        dockerd.ok(&["rm", "--force", &y]);
        let rm_time = t.elapsed();
        assert_eq!(node.manifests(), Vec::<String>::new(), "{what}: manifests");
        assert_eq!(
            node.dump(),
            before,
            "{what}: the tables after the last member"
        );
        assert!(
            tcp_request(&ext, sock(NODE_V4, 8080), Duration::from_secs(1)).is_err(),
            "{what}: still forwarded after the last member"
        );
        let ps = dockerd.ok(&["ps", "--all", "--quiet"]);
        assert!(ps.is_empty(), "{what}: containers left: {ps}");
        dockerd
            .stop()
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", dockerd.log()));
        dockerd.own.assert_clean(T);
        drop(dockerd);
        eprintln!(
            "{what}: docker stop X {stop_time:?}, docker rm -f Y (last) {rm_time:?}, \
             whole test {:?}",
            started.elapsed()
        );
    });
}

/// runc's stderr without its log timestamps (`time="..."`), which differ between two runs.
fn without_timestamps(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .split_whitespace()
        .filter(|w| !w.starts_with("time="))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every runc command other than create/run goes through the wrapper untouched: the same exit
/// code, stdout and (timestamps aside) stderr as runc given the same arguments, whether the
/// wrapper is reached as `natledger-runtime` or `natledger runtime`, with or without its own
/// `--natledger-*` options in front. create/run of a bundle without a config.json pass
/// through too, so runc reports the problem itself.
#[test]
fn wrapper_passes_runc_commands_through() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let dir = tempfile::tempdir_in("/run").expect("tempdir in /run");
    let root = dir.path().join("runc-root");
    std::fs::create_dir(&root).unwrap();
    let root = root.display().to_string();
    // runc creates a missing --root itself; so must the wrapper (through runc).
    let fresh_root = dir.path().join("fresh-root");
    let fresh = fresh_root.display().to_string();
    let no_bundle = dir.path().join("no-bundle").display().to_string();
    let link = wrapper_symlink(dir.path());
    let runc = system_runc();
    let runc_path = runc.display().to_string();
    const ID: &str = "nlt-no-such-container";
    // (runc arguments, whether stderr must match too)
    let cases: &[(&[&str], bool)] = &[
        (&["--version"], true),
        (&["--help"], true),
        (&["--root", &root, "list"], true),
        (&["--root", &root, "list", "--format", "json"], true),
        (&["--root", &root, "list", "--quiet"], true),
        (&["--root", &fresh, "list"], true),
        (&["--root", &root, "state", ID], true),
        (&["--root", &root, "kill", ID, "KILL"], true),
        (&["--root", &root, "delete", ID], true),
        (&["--root", &root, "delete", "--force", ID], true),
        (&["--root", &root, "ps", ID], true),
        (&["--root", &root, "exec", ID, "true"], true),
        (&["--root", &root, "pause", ID], true),
        (&["--root", &root, "no-such-command"], true),
        (&["--no-such-option"], true),
        (
            &["--root", &root, "create", "--bundle", &no_bundle, ID],
            true,
        ),
        (&["--root", &root, "run", "-b", &no_bundle, ID], true),
    ];
    let prefix: &[&str] = &[
        "--natledger-hook-env",
        "NATLEDGER_STATE_DIR=/nonexistent",
        "--natledger-runtime",
        &runc_path,
    ];
    for (case, same_stderr) in cases {
        let args = case.join(" ");
        let _ = std::fs::remove_dir(&fresh_root);
        let expected = output(Command::new(&runc).args(*case));
        let runc_made_root = fresh_root.exists();
        let with_options = [prefix, case].concat();
        let via_subcommand = [&["runtime"], *case].concat();
        let wrappers: [(&str, &Path, &[&str]); 3] = [
            ("natledger-runtime", &link, case),
            ("natledger-runtime --natledger-…", &link, &with_options),
            ("natledger runtime", Path::new(BIN), &via_subcommand),
        ];
        for (how, program, wrapper_args) in wrappers {
            let _ = std::fs::remove_dir(&fresh_root);
            let got = output(
                Command::new(program)
                    .args(wrapper_args)
                    .env_remove("NATLEDGER_RUNTIME"),
            );
            assert_eq!(
                got.status.code(),
                expected.status.code(),
                "{how} {args}: exit status\nrunc: {}\nwrapper: {}",
                show(&expected),
                show(&got)
            );
            assert_eq!(
                String::from_utf8_lossy(&got.stdout),
                String::from_utf8_lossy(&expected.stdout),
                "{how} {args}: stdout"
            );
            if *same_stderr {
                assert_eq!(
                    without_timestamps(&got.stderr),
                    without_timestamps(&expected.stderr),
                    "{how} {args}: stderr"
                );
            }
            assert_eq!(
                fresh_root.exists(),
                runc_made_root,
                "{how} {args}: --root made"
            );
        }
    }
    // Nothing was created in the state root, and no bundle appeared.
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    assert!(!Path::new(&no_bundle).exists());
}

/// The wrapper becomes the real runtime (exec, not a child): the runtime sees the wrapper's
/// pid, the arguments after the wrapper's own options unchanged, the same stdin, and its exit
/// code is the wrapper's. The runtime is named by NATLEDGER_RUNTIME or --natledger-runtime.
#[test]
fn wrapper_execs_the_runtime_with_the_same_pid_stdio_and_exit_code() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Stdio;

    let dir = tempfile::tempdir_in("/run").expect("tempdir in /run");
    let link = wrapper_symlink(dir.path());
    let fake = dir.path().join("fake-runc");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"$$ $*\"\ncat\necho oops >&2\nexit 7\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake_path = fake.display().to_string();
    let runtime_args = ["--root", "/nonexistent", "state", "some id"];

    let by_option = [
        &["--natledger-runtime", fake_path.as_str()][..],
        &runtime_args,
    ]
    .concat();
    let runs: [(&str, &[&str], bool); 2] = [
        ("NATLEDGER_RUNTIME", &runtime_args, true),
        ("--natledger-runtime", &by_option, false),
    ];
    for (how, args, by_env) in runs {
        let mut cmd = Command::new(&link);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if by_env {
            cmd.env("NATLEDGER_RUNTIME", &fake);
        } else {
            cmd.env_remove("NATLEDGER_RUNTIME");
        }
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"from stdin\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(7), "{how}: {}", show(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{pid} {}\nfrom stdin\n", runtime_args.join(" ")),
            "{how}: the runtime runs as the wrapper's pid with its arguments and stdin"
        );
        assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n", "{how}");
    }
}
