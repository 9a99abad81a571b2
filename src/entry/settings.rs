//! Settings: the global flags and natledger's environment variables, resolved once, at start,
//! into one [`Settings`] value that `main` passes on (the library reads no variable), and
//! whose parts are handed down as values, never kept process-wide: the runner and the
//! machine (the host root), the kernel handle (the xtables lock, the conntrack dump choice).
//!
//! `main` has clap parse the flags with their variables ([`Global`], `env =`), then adds the
//! variables that have no flag. The CNI plugin and the wrapper runtime have no such command
//! line: [`Settings::from_env`] parses the same variables through the same clap definitions,
//! so a bad value is refused in the words a bad flag value gets. Every boolean follows one
//! rule, clap's `BoolishValueParser` (true/false, yes/no, on/off, 1/0; anything else refused;
//! an empty value is false, `cli::EmptyIsFalse`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Args as _, FromArgMatches as _};

use crate::backend::{BackendChoice, Netfilter};
use crate::entry::cli::{Global, PortConflict};
use crate::kernel::conntrack::DumpChoice;
use crate::kernel::dbus;
use crate::kernel::exec::{Runner, SystemRunner};
use crate::kernel::host::Roots;
use crate::kernel::host_root::{self, HostRoot};
use crate::kernel::machine::Machine;

/// A variable's value by name: the process environment in `main`, a map in tests.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// `NATLEDGER_RUNTIME`: the real runtime the wrapper runtime execs.
pub const RUNTIME_ENV: &str = crate::entry::wrapper::RUNTIME_ENV;
/// `NATLEDGER_CONNTRACK_DUMP`: how flows are found (`crate::kernel::conntrack`).
pub const CONNTRACK_DUMP_ENV: &str = crate::kernel::conntrack::DUMP_ENV;
/// `XTABLES_LOCKFILE`: iptables' own variable for its lock (iptables 1.6.2 and later).
pub const XTABLES_LOCK_ENV: &str = "XTABLES_LOCKFILE";
/// iptables' lock when `XTABLES_LOCKFILE` names none.
const XTABLES_LOCK: &str = "/run/xtables.lock";
/// `DBUS_SYSTEM_BUS_ADDRESS`: the system bus, as libdbus reads it (`watch` listens there for
/// firewalld's reloads).
pub const SYSTEM_BUS_ENV: &str = "DBUS_SYSTEM_BUS_ADDRESS";

/// `NATLEDGER_HOST_ROOT`: the host's root directory, when natledger runs from an image; the
/// tools it runs are found under it and run chrooted into it (`crate::kernel::host_root`).
pub const HOST_ROOT_ENV: &str = "NATLEDGER_HOST_ROOT";

/// Where the system bus is: the socket of [`SYSTEM_BUS_ENV`]'s `unix:path=`, else
/// `/run/dbus/system_bus_socket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SystemBus {
    At(PathBuf),
    /// An address naming no `unix:path=` socket (another transport), as given: never
    /// refused (only `watch` uses it, and it goes on without the bus).
    Unspoken(String),
}

impl SystemBus {
    fn of(value: Option<OsString>) -> SystemBus {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return SystemBus::At(PathBuf::from(dbus::SYSTEM_BUS));
        };
        let text = value.to_string_lossy();
        match dbus::socket_path(&text) {
            Some(path) => SystemBus::At(path),
            None => SystemBus::Unspoken(text.into_owned()),
        }
    }
}

/// Everything natledger is told by its flags and environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub state_dir: PathBuf,
    pub backend: BackendChoice,
    pub log_level: log::LevelFilter,
    /// The direct paths (nf_tables netlink, iptables-legacy socket options) may be used:
    /// not `--no-netlink`.
    pub direct: bool,
    pub port_conflict: PortConflict,
    /// The real runtime the wrapper execs, when named by [`RUNTIME_ENV`].
    pub runtime: Option<PathBuf>,
    pub xtables_lock: PathBuf,
    pub conntrack_dump: DumpChoice,
    pub system_bus: SystemBus,
    /// The host root of [`HOST_ROOT_ENV`], when set.
    pub host_root: Option<HostRoot>,
}

impl Settings {
    /// From the flags (and their variables) clap parsed, and the variables with no flag.
    pub fn new(global: &Global, lookup: Lookup) -> Result<Settings, clap::Error> {
        let log_level = match (global.log_level, global.trace) {
            (Some(level), _) => level.into(),
            (None, true) => log::LevelFilter::Debug,
            (None, false) => log::LevelFilter::Info,
        };
        let nonempty = |name: &str| lookup(name).filter(|v| !v.is_empty());
        Ok(Settings {
            state_dir: global.state_dir.clone(),
            backend: global.backend,
            log_level,
            direct: !global.no_netlink,
            port_conflict: global.port_conflict,
            runtime: nonempty(RUNTIME_ENV).map(PathBuf::from),
            xtables_lock: nonempty(XTABLES_LOCK_ENV)
                .map_or_else(|| PathBuf::from(XTABLES_LOCK), PathBuf::from),
            conntrack_dump: conntrack_dump(lookup(CONNTRACK_DUMP_ENV))?,
            system_bus: SystemBus::of(lookup(SYSTEM_BUS_ENV)),
            host_root: host_root(lookup(HOST_ROOT_ENV))?,
        })
    }

    /// From the environment alone (the CNI plugin, the wrapper runtime): every variable a
    /// global flag reads, parsed by clap as if given as that flag.
    pub fn from_env(lookup: Lookup) -> Result<Settings, clap::Error> {
        Settings::new(&global_from_env(lookup)?, lookup)
    }

    /// Whether a container's start is refused over a conflict when its annotation does not say.
    pub fn refuse_conflicts(&self) -> bool {
        self.port_conflict == PortConflict::Refuse
    }

    /// The iptables lock natledger's own iptables-legacy writer takes: under a host root the
    /// host's (the chrooted tools take that one), whatever the image mounts at its own `/run`.
    pub fn lock_taken(&self) -> PathBuf {
        let host = self.host_root.as_ref();
        host.and_then(|r| r.file(&self.xtables_lock))
            .unwrap_or_else(|| self.xtables_lock.clone())
    }

    /// The log level, for the process (`log`'s maximum level is the one setting kept
    /// process-wide: the library logs through `log`). Every other setting is passed: the
    /// runner, the machine, the kernel handle and doctor's evidence roots below carry theirs.
    pub fn install(&self) {
        log::set_max_level(self.log_level);
    }

    /// Where the host's tools and paths are: under [`HOST_ROOT_ENV`]'s root, if set.
    pub fn host(&self) -> host_root::Lookup<'_> {
        host_root::Lookup(self.host_root.as_ref())
    }

    /// The runner of the host's tools: chrooted into the host root, if set.
    pub fn runner(&self) -> SystemRunner {
        SystemRunner::in_root(self.host_root.clone())
    }

    /// This machine, the namespace paths runtimes name read under the host root, if set.
    pub fn machine(&self) -> Machine {
        Machine::in_root(self.host_root.clone())
    }

    /// The kernel handle of one run that reaches the kernel ([`Netfilter::on_kernel`]: the
    /// hooks', the CNI plugin's, sweep's), with the direct paths unless `--no-netlink`,
    /// taking [`Settings::lock_taken`] and dumping conntrack as [`CONNTRACK_DUMP_ENV`] says.
    pub fn netfilter<'r>(&self, runner: &'r dyn Runner) -> Netfilter<'r> {
        Netfilter::on_kernel(runner, self.direct)
            .with_settings(self.lock_taken(), self.conntrack_dump)
    }

    /// Where doctor reads the host's evidence: the host's own files, and as the xtables lock
    /// [`Settings::lock_taken`].
    pub fn evidence_roots(&self) -> Roots {
        Roots {
            xtables_lock: self.lock_taken(),
            ..Roots::default()
        }
    }
}

/// The global flags' command, its arguments reading no variable themselves.
fn global_command() -> clap::Command {
    Global::augment_args(
        clap::Command::new("natledger")
            .disable_help_flag(true)
            .disable_version_flag(true),
    )
    .mut_args(|arg| arg.env(None))
}

/// Each global flag's variable that is set and not empty, as `--flag=VALUE`, with its name.
fn env_flags(lookup: Lookup) -> Vec<(String, OsString)> {
    let cmd = Global::augment_args(clap::Command::new("natledger"));
    let mut flags = Vec::new();
    for arg in cmd.get_arguments() {
        let (Some(long), Some(name)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let Some(name) = name.to_str() else { continue };
        if let Some(value) = lookup(name).filter(|v| !v.is_empty()) {
            let mut flag = OsString::from(format!("--{long}="));
            flag.push(value);
            flags.push((name.to_string(), flag));
        }
    }
    flags
}

/// The global flags as clap parses them from their variables alone: each variable set (and
/// not empty: an empty variable is unset) becomes `--flag=VALUE` on a command line of
/// [`Global`] whose arguments read no variable themselves (so only `lookup` is consulted).
fn global_from_env(lookup: Lookup) -> Result<Global, clap::Error> {
    let argv = std::iter::once(OsString::from("natledger"))
        .chain(env_flags(lookup).into_iter().map(|(_, flag)| flag));
    let matches = global_command().try_get_matches_from(argv)?;
    Global::from_arg_matches(&matches)
}

/// The variables whose value is refused (clap's words for each), of the global flags and
/// [`CONNTRACK_DUMP_ENV`] and [`HOST_ROOT_ENV`]; an empty variable is unset, never refused.
pub fn refused(lookup: Lookup) -> Vec<(String, clap::Error)> {
    let mut refused: Vec<(String, clap::Error)> = env_flags(lookup)
        .into_iter()
        .filter_map(|(name, flag)| {
            let argv = [OsString::from("natledger"), flag];
            global_command()
                .try_get_matches_from(argv)
                .err()
                .map(|e| (name, e))
        })
        .collect();
    if let Err(e) = conntrack_dump(lookup(CONNTRACK_DUMP_ENV)) {
        refused.push((CONNTRACK_DUMP_ENV.to_string(), e));
    }
    if let Err(e) = host_root(lookup(HOST_ROOT_ENV)) {
        refused.push((HOST_ROOT_ENV.to_string(), e));
    }
    refused
}

impl Settings {
    /// From the environment alone, each refused variable left at its default: for what must
    /// not fail over a setting it does not need (a CNI DEL, GC or STATUS, the wrapper
    /// runtime, a poststop). The refusals come back too, for a warning.
    pub fn lenient(lookup: Lookup) -> (Settings, Vec<(String, clap::Error)>) {
        let refused = refused(lookup);
        let usable = |name: &str| {
            if refused.iter().any(|(bad, _)| bad == name) {
                None
            } else {
                lookup(name)
            }
        };
        let settings = Settings::from_env(&usable).unwrap_or_else(|_| Settings::defaults());
        (settings, refused)
    }

    /// Every setting at its default.
    fn defaults() -> Settings {
        let global = global_command()
            .try_get_matches_from(["natledger"])
            .and_then(|m| Global::from_arg_matches(&m))
            .expect("the global flags parse from nothing");
        Settings::new(&global, &|_| None).expect("no variable is refused when none is set")
    }
}

/// [`CONNTRACK_DUMP_ENV`]'s value; adaptive when unset.
fn conntrack_dump(value: Option<OsString>) -> Result<DumpChoice, clap::Error> {
    const NAMES: [(&str, DumpChoice); 4] = [
        ("adaptive", DumpChoice::Adaptive),
        ("filtered", DumpChoice::Filtered),
        ("unfiltered", DumpChoice::Unfiltered),
        ("refused", DumpChoice::Refused),
    ];
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(DumpChoice::Adaptive);
    };
    NAMES
        .iter()
        .find(|(name, _)| value == *name)
        .map(|(_, choice)| *choice)
        .ok_or_else(|| {
            let names: Vec<&str> = NAMES.iter().map(|(name, _)| *name).collect();
            clap::Error::raw(
                ErrorKind::InvalidValue,
                format!(
                    "invalid value '{}' for '{CONNTRACK_DUMP_ENV}'\n  [possible values: {}]\n",
                    value.to_string_lossy(),
                    names.join(", ")
                ),
            )
        })
}

/// [`HOST_ROOT_ENV`]'s directory; none when unset. One that is not an existing directory is
/// refused, naming it.
fn host_root(value: Option<OsString>) -> Result<Option<HostRoot>, clap::Error> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    HostRoot::new(PathBuf::from(&value)).map(Some).map_err(|e| {
        clap::Error::raw(
            ErrorKind::InvalidValue,
            format!(
                "invalid value '{}' for '{HOST_ROOT_ENV}': {}\n",
                value.to_string_lossy(),
                crate::causes::Causes(&e)
            ),
        )
    })
}

/// A clap error as one line (the CNI error object's details): without clap's `error: `
/// and its hint to try `--help`.
pub fn one_line(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let text = text
        .split("\n\nFor more information")
        .next()
        .unwrap_or(text);
    text.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::entry::cli::LogLevel;

    fn from(vars: &[(&str, &str)]) -> Result<Settings, clap::Error> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Settings::from_env(&|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_is_the_defaults() {
        let s = from(&[]).unwrap();
        assert_eq!(s.state_dir, PathBuf::from("/run/natledger"));
        assert_eq!(s.backend, BackendChoice::Auto);
        assert_eq!(s.log_level, log::LevelFilter::Info);
        assert!(s.direct);
        assert!(!s.refuse_conflicts());
        assert_eq!(s.runtime, None);
        assert_eq!(s.xtables_lock, PathBuf::from("/run/xtables.lock"));
        assert_eq!(s.conntrack_dump, DumpChoice::Adaptive);
        assert_eq!(
            s.system_bus,
            SystemBus::At(PathBuf::from("/run/dbus/system_bus_socket"))
        );
        assert_eq!(s.host_root, None);
    }

    #[test]
    fn every_variable_is_read() {
        let s = from(&[
            ("NATLEDGER_STATE_DIR", "/tmp/ledger"),
            ("NATLEDGER_BACKEND", "nftables"),
            ("NATLEDGER_NO_NETLINK", "1"),
            ("NATLEDGER_PORT_CONFLICT", "refuse"),
            ("NATLEDGER_RUNTIME", "/usr/bin/crun"),
            ("XTABLES_LOCKFILE", "/tmp/x.lock"),
            ("NATLEDGER_CONNTRACK_DUMP", "refused"),
            ("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/tmp/bus"),
        ])
        .unwrap();
        assert_eq!(s.state_dir, PathBuf::from("/tmp/ledger"));
        assert_eq!(
            s.backend,
            BackendChoice::Named(crate::backend::Backend::OwnNftables)
        );
        assert!(!s.direct);
        assert!(s.refuse_conflicts());
        assert_eq!(s.runtime, Some(PathBuf::from("/usr/bin/crun")));
        assert_eq!(s.xtables_lock, PathBuf::from("/tmp/x.lock"));
        assert_eq!(s.conntrack_dump, DumpChoice::Refused);
        assert_eq!(s.system_bus, SystemBus::At(PathBuf::from("/tmp/bus")));
    }

    /// A bus address natledger does not speak is kept for watch to name, never refused.
    #[test]
    fn an_unspoken_bus_address_is_kept_not_refused() {
        let s = from(&[("DBUS_SYSTEM_BUS_ADDRESS", "unix:abstract=/tmp/x")]).unwrap();
        assert_eq!(
            s.system_bus,
            SystemBus::Unspoken("unix:abstract=/tmp/x".into())
        );
        let s = from(&[("DBUS_SYSTEM_BUS_ADDRESS", "")]).unwrap();
        assert_eq!(
            s.system_bus,
            SystemBus::At(PathBuf::from("/run/dbus/system_bus_socket"))
        );
    }

    /// One rule for every boolean: `NATLEDGER_TRACE=0` is off (it used to turn tracing on).
    #[test]
    fn booleans_follow_one_rule() {
        for (value, on) in [
            ("1", true),
            ("true", true),
            ("yes", true),
            ("on", true),
            ("0", false),
            ("false", false),
            ("no", false),
            ("off", false),
            ("", false),
        ] {
            let s = from(&[("NATLEDGER_TRACE", value), ("NATLEDGER_NO_NETLINK", value)]).unwrap();
            let level = if on {
                log::LevelFilter::Debug
            } else {
                log::LevelFilter::Info
            };
            assert_eq!((s.log_level, s.direct), (level, !on), "{value}");
        }
        let e = from(&[("NATLEDGER_TRACE", "maybe")]).unwrap_err();
        assert!(
            one_line(&e).contains("invalid value 'maybe' for '--trace"),
            "{e}"
        );
    }

    #[test]
    fn log_level_wins_over_trace() {
        let s = from(&[("NATLEDGER_TRACE", "1"), ("NATLEDGER_LOG", "warn")]).unwrap();
        assert_eq!(s.log_level, log::LevelFilter::Warn);
        let global = Global {
            state_dir: "/x".into(),
            backend: BackendChoice::Named(crate::backend::Backend::IptablesLegacy),
            log_level: Some(LogLevel::Trace),
            trace: false,
            no_netlink: false,
            port_conflict: PortConflict::Warn,
        };
        let s = Settings::new(&global, &|_| None).unwrap();
        assert_eq!(s.log_level, log::LevelFilter::Trace);
    }

    /// A typo is refused in clap's words for the flag, not taken as `auto`.
    #[test]
    fn a_bad_value_is_refused_as_clap_refuses_a_flag() {
        let e = from(&[("NATLEDGER_BACKEND", "nfts")]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        let line = one_line(&e);
        assert!(
            line.starts_with("invalid value 'nfts' for '--backend <BACKEND>'")
                && line.contains("[possible values: auto, legacy, nft, nftables]"),
            "{line}"
        );
        let e = from(&[("NATLEDGER_PORT_CONFLICT", "refuses")]).unwrap_err();
        assert!(
            one_line(&e).contains("'--port-conflict <PORT_CONFLICT>'"),
            "{e}"
        );
        let e = from(&[("NATLEDGER_CONNTRACK_DUMP", "some")]).unwrap_err();
        assert_eq!(
            one_line(&e),
            "invalid value 'some' for 'NATLEDGER_CONNTRACK_DUMP' [possible values: adaptive, \
             filtered, unfiltered, refused]"
        );
    }

    /// Under a host root the iptables lock taken is the host's, as the chrooted tools take it.
    #[test]
    fn the_iptables_lock_is_the_host_roots() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("run")).unwrap();
        let root = dir.path().as_os_str().to_str().unwrap();
        let s = from(&[("NATLEDGER_HOST_ROOT", root)]).unwrap();
        assert_eq!(s.lock_taken(), dir.path().join("run/xtables.lock"));
        let s = from(&[("NATLEDGER_HOST_ROOT", root), ("XTABLES_LOCKFILE", "/x/l")]).unwrap();
        assert_eq!(
            s.lock_taken(),
            PathBuf::from("/x/l"),
            "no /x under the root"
        );
        let s = from(&[]).unwrap();
        assert_eq!(s.lock_taken(), PathBuf::from("/run/xtables.lock"));
    }

    /// What the settings hand down carries them, with no process-wide state: the runner,
    /// the tool lookup and the machine share the host root; the kernel handle and doctor's
    /// roots take the lock [`Settings::lock_taken`] names.
    #[test]
    fn the_settings_are_handed_down_as_values() {
        use crate::backend::{Backend, tool};
        use crate::model::family::Family;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        std::fs::create_dir_all(dir.path().join("usr/sbin")).unwrap();
        std::fs::write(dir.path().join("usr/sbin/iptables-legacy-restore"), "").unwrap();
        let root = dir.path().to_str().unwrap();
        let s = from(&[("NATLEDGER_HOST_ROOT", root)]).unwrap();
        let runner = s.runner();
        assert_eq!(runner.lookup().0, s.host_root.as_ref());
        assert_eq!(s.host().0, s.host_root.as_ref());
        let found = tool(
            runner.lookup(),
            Backend::IptablesLegacy,
            Family::Ipv4,
            "restore",
        )
        .unwrap();
        assert_eq!(found, PathBuf::from("/usr/sbin/iptables-legacy-restore"));
        let missing = tool(s.host(), Backend::IptablesNft, Family::Ipv4, "restore").unwrap_err();
        let under = format!(" under host root {root}");
        assert!(missing.to_string().ends_with(&under), "{missing}");
        let lock = dir.path().join("run/xtables.lock");
        assert_eq!(s.netfilter(&runner).xtables_lock(), lock);
        assert_eq!(s.evidence_roots().xtables_lock, lock);
        let here = from(&[]).unwrap();
        assert_eq!(here.runner().lookup().0, None);
        let lock = PathBuf::from("/run/xtables.lock");
        assert_eq!(here.netfilter(&here.runner()).xtables_lock(), lock);
    }

    /// `NATLEDGER_HOST_ROOT` is an existing directory, or refused naming it.
    #[test]
    fn the_host_root_is_an_existing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        let s = from(&[("NATLEDGER_HOST_ROOT", path)]).unwrap();
        assert_eq!(s.host_root.unwrap().dir(), dir.path());
        assert_eq!(
            from(&[("NATLEDGER_HOST_ROOT", "")]).unwrap().host_root,
            None
        );
        let missing = dir.path().join("missing");
        let missing = missing.to_str().unwrap();
        let e = from(&[("NATLEDGER_HOST_ROOT", missing)]).unwrap_err();
        let line = one_line(&e);
        assert!(
            line.starts_with(&format!(
                "invalid value '{missing}' for 'NATLEDGER_HOST_ROOT': host root {missing}: "
            )),
            "{line}"
        );
        let lookup = |name: &str| (name == "NATLEDGER_HOST_ROOT").then(|| OsString::from(missing));
        let (s, refused) = Settings::lenient(&lookup);
        assert_eq!(s.host_root, None);
        assert_eq!(refused[0].0, "NATLEDGER_HOST_ROOT");
    }

    #[test]
    fn empty_paths_are_unset() {
        let s = from(&[("NATLEDGER_RUNTIME", ""), ("XTABLES_LOCKFILE", "")]).unwrap();
        assert_eq!(s.runtime, None);
        assert_eq!(s.xtables_lock, PathBuf::from("/run/xtables.lock"));
    }

    /// Every variable empty is every setting at its default: an empty value is unset.
    #[test]
    fn empty_values_are_unset() {
        let names = [
            "NATLEDGER_STATE_DIR",
            "NATLEDGER_BACKEND",
            "NATLEDGER_LOG",
            "NATLEDGER_TRACE",
            "NATLEDGER_NO_NETLINK",
            "NATLEDGER_PORT_CONFLICT",
            "NATLEDGER_CONNTRACK_DUMP",
        ];
        let vars: Vec<(&str, &str)> = names.iter().map(|n| (*n, "")).collect();
        let s = from(&vars).unwrap();
        assert_eq!(
            (s.log_level, s.direct, s.port_conflict, s.conntrack_dump),
            (
                log::LevelFilter::Info,
                true,
                PortConflict::Warn,
                DumpChoice::Adaptive
            )
        );
    }

    /// Leniently, each refused variable is at its default and named; the others are taken.
    #[test]
    fn leniently_a_refused_variable_is_its_default_and_named() {
        let vars: HashMap<&str, &str> = [
            ("NATLEDGER_PORT_CONFLICT", "allow"),
            ("NATLEDGER_CONNTRACK_DUMP", "auto"),
            ("NATLEDGER_TRACE", "1"),
            ("NATLEDGER_RUNTIME", "/usr/bin/crun"),
        ]
        .into_iter()
        .collect();
        let lookup = |name: &str| vars.get(name).map(OsString::from);
        assert!(Settings::from_env(&lookup).is_err());
        let (s, refused) = Settings::lenient(&lookup);
        let mut names: Vec<&str> = refused.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["NATLEDGER_CONNTRACK_DUMP", "NATLEDGER_PORT_CONFLICT"]
        );
        assert_eq!(
            (s.port_conflict, s.conntrack_dump, s.log_level),
            (
                PortConflict::Warn,
                DumpChoice::Adaptive,
                log::LevelFilter::Debug
            )
        );
        assert_eq!(s.runtime, Some(PathBuf::from("/usr/bin/crun")));
    }
}
