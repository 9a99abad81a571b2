//! The wrapper runtime, for Docker and containerd, which have no hook configuration: they run
//! `natledger-runtime` (this binary under that name, or `natledger runtime`) where they would
//! run runc. On `create` and `run` it adds natledger's hooks to the bundle's `config.json`
//! when the container asks for ports; then it execs the real runtime with the same arguments,
//! so stdio, exit status and even the pid are the runtime's own. Every other command passes
//! through untouched.
//!
//! Its own options come first and are all `--natledger-…`, since Docker's `runtimeArgs` are
//! put before the runtime's arguments; nothing after them is interpreted except to find the
//! command and the bundle.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::entry::bundle::{self, BundleError, HookSpec};

/// Where the real runtime is looked for when neither `--natledger-runtime` nor
/// `NATLEDGER_RUNTIME` names it.
pub const RUNTIME_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];
pub const RUNTIME_ENV: &str = "NATLEDGER_RUNTIME";
/// Seconds the runtime gives each injected hook.
pub const HOOK_TIMEOUT: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum WrapperError {
    #[error("{0} needs a value")]
    MissingValue(&'static str),
    #[error("{0} is not KEY=VALUE")]
    BadEnv(crate::model::echo::Echo),
    #[error("no runc in {}; name the runtime with --natledger-runtime or NATLEDGER_RUNTIME", RUNTIME_DIRS.join(", "))]
    NoRuntime,
    #[error("the runtime {} is natledger itself; name the real one", .0.display())]
    Loop(PathBuf),
    #[error("cannot find the natledger binary")]
    SelfPath(#[source] std::io::Error),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("cannot run {}", runtime.display())]
    Exec {
        runtime: PathBuf,
        source: std::io::Error,
    },
}

/// The wrapper's own options and the runtime's arguments.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    pub runtime: Option<PathBuf>,
    pub hook_env: Vec<String>,
    pub args: Vec<OsString>,
}

/// Split the leading `--natledger-runtime PATH` and `--natledger-hook-env KEY=VALUE` options
/// (also in `--opt=value` form) from the runtime's arguments.
pub fn parse(args: Vec<OsString>) -> Result<Invocation, WrapperError> {
    let mut out = Invocation::default();
    let mut rest = args.into_iter().peekable();
    while let Some(arg) = rest.peek().and_then(|a| a.to_str()).map(str::to_string) {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let option: &'static str = match name.as_str() {
            "--natledger-runtime" => "--natledger-runtime",
            "--natledger-hook-env" => "--natledger-hook-env",
            _ => break,
        };
        rest.next();
        let value = match inline {
            Some(v) => v,
            None => rest
                .next()
                .and_then(|v| v.into_string().ok())
                .ok_or(WrapperError::MissingValue(option))?,
        };
        if option == "--natledger-runtime" {
            out.runtime = Some(value.into());
        } else if value.contains('=') {
            out.hook_env.push(value);
        } else {
            return Err(WrapperError::BadEnv(value.into()));
        }
    }
    out.args = rest.collect();
    Ok(out)
}

/// runc's global options that take a value (`--root DIR`, …).
const GLOBAL_WITH_VALUE: &[&str] = &["--root", "--log", "--log-format", "--criu", "--rootless"];

/// The bundle a `create` or `run` command names (`--bundle DIR`, `-b DIR`, `--bundle=DIR`;
/// the current directory by default), or `None` for any other command.
pub fn bundle_of(args: &[OsString]) -> Option<PathBuf> {
    let mut i = 0;
    let command = loop {
        let arg = args.get(i)?.to_str()?;
        if !arg.starts_with('-') {
            break arg;
        }
        i += if GLOBAL_WITH_VALUE.contains(&arg) {
            2
        } else {
            1
        };
    };
    if command != "create" && command != "run" {
        return None;
    }
    let mut rest = args[i + 1..].iter().map(|a| a.as_os_str());
    while let Some(arg) = rest.next() {
        let text = arg.to_str().unwrap_or("");
        if text == "--" {
            break;
        }
        if text == "--bundle" || text == "-b" {
            return rest.next().map(PathBuf::from);
        }
        for prefix in ["--bundle=", "-b="] {
            if let Some(dir) = text.strip_prefix(prefix) {
                return Some(PathBuf::from(dir));
            }
        }
    }
    Some(PathBuf::from("."))
}

/// The real runtime: `--natledger-runtime`, `NATLEDGER_RUNTIME`, or runc from [`RUNTIME_DIRS`];
/// never natledger itself.
pub fn resolve_runtime(
    named: Option<PathBuf>,
    from_env: Option<PathBuf>,
    me: &Path,
) -> Result<PathBuf, WrapperError> {
    let runtime = named
        .or(from_env)
        .or_else(|| {
            RUNTIME_DIRS
                .iter()
                .map(|d| Path::new(d).join("runc"))
                .find(|p| p.exists())
        })
        .ok_or(WrapperError::NoRuntime)?;
    if runtime.canonicalize().ok().as_deref() == Some(me) {
        return Err(WrapperError::Loop(runtime));
    }
    Ok(runtime)
}

/// Run as the wrapper: inject if asked for, then become the real runtime (`from_env`: the
/// one [`RUNTIME_ENV`] names, `Settings::runtime`). Returns only on failure; the caller
/// reports it and exits non-zero (the runtime then never ran, so the container did not
/// start).
pub fn run(args: Vec<OsString>, from_env: Option<PathBuf>) -> WrapperError {
    match prepare(args, from_env) {
        Ok((runtime, args)) => {
            let source = Command::new(&runtime).args(&args).exec();
            WrapperError::Exec { runtime, source }
        }
        Err(e) => e,
    }
}

fn prepare(
    args: Vec<OsString>,
    from_env: Option<PathBuf>,
) -> Result<(PathBuf, Vec<OsString>), WrapperError> {
    let invocation = parse(args)?;
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(WrapperError::SelfPath)?;
    let runtime = resolve_runtime(invocation.runtime, from_env, &me)?;
    // No config.json: nothing to add to; the runtime reports the bundle problem itself.
    if let Some(bundle) = bundle_of(&invocation.args).filter(|b| b.join("config.json").exists()) {
        let spec = HookSpec {
            binary: me,
            env: invocation.hook_env,
            timeout: HOOK_TIMEOUT,
        };
        bundle::inject_if_wanted(&bundle, &spec)?;
    }
    Ok((runtime, invocation.args))
}

/// Whether this process was started as `natledger-runtime` (a symlink to natledger).
pub fn called_as_wrapper(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new("natledger-runtime"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn own_options_come_first_and_the_rest_passes_through() {
        let got = parse(os(&[
            "--natledger-runtime",
            "/usr/bin/runc",
            "--natledger-hook-env=NATLEDGER_BACKEND=nft",
            "--natledger-hook-env",
            "NATLEDGER_STATE_DIR=/run/x",
            "--root",
            "/run/docker/runtime-runc/moby",
            "--natledger-runtime",
            "create",
        ]))
        .unwrap();
        assert_eq!(got.runtime, Some("/usr/bin/runc".into()));
        assert_eq!(
            got.hook_env,
            ["NATLEDGER_BACKEND=nft", "NATLEDGER_STATE_DIR=/run/x"]
        );
        assert_eq!(
            got.args,
            os(&[
                "--root",
                "/run/docker/runtime-runc/moby",
                "--natledger-runtime",
                "create"
            ])
        );
        assert!(parse(os(&["--natledger-hook-env", "NOEQUALS"])).is_err());
        assert!(parse(os(&["--natledger-runtime"])).is_err());
        assert_eq!(parse(os(&[])).unwrap(), Invocation::default());
    }

    #[test]
    fn finds_the_bundle_of_create_and_run_only() {
        // As containerd's shim calls runc.
        let shim = os(&[
            "--root",
            "/run/containerd/runc/moby",
            "--log",
            "/x/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/run/b1",
            "--pid-file",
            "/run/b1/init.pid",
            "c1",
        ]);
        assert_eq!(bundle_of(&shim), Some("/run/b1".into()));
        assert_eq!(bundle_of(&os(&["run", "-b=/b2", "c2"])), Some("/b2".into()));
        assert_eq!(bundle_of(&os(&["create", "c3"])), Some(".".into()));
        for other in [
            &["--root", "create", "state", "c1"][..],
            &["delete", "-f", "c1"],
            &["--version"],
            &[],
        ] {
            assert_eq!(bundle_of(&os(other)), None, "{other:?}");
        }
    }

    #[test]
    fn the_runtime_is_never_natledger_itself() {
        let me = std::env::current_exe().unwrap().canonicalize().unwrap();
        assert!(matches!(
            resolve_runtime(Some(me.clone()), None, &me),
            Err(WrapperError::Loop(_))
        ));
        assert_eq!(
            resolve_runtime(None, Some("/opt/runc".into()), &me).unwrap(),
            PathBuf::from("/opt/runc")
        );
        assert!(called_as_wrapper(OsStr::new(
            "/usr/local/bin/natledger-runtime"
        )));
        assert!(!called_as_wrapper(OsStr::new("natledger")));
    }
}
