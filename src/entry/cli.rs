//! The command line: every subcommand and option of `natledger`, as clap definitions.
//!
//! `main` parses with [`Cli`]; `natledger-docs` renders the man pages and shell completions
//! from [`command`], so the manual and the completions cannot drift from the parser.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::{BoolishValueParser, TypedValueParser};
use clap::{ArgAction, Args, CommandFactory as _, Parser, Subcommand, ValueEnum};

use crate::analysis::doctor::DumpFile;
use crate::backend::BackendChoice;
use crate::model::oci::Stage;

/// What `natledger --version` prints after the name: the package version and the git commit
/// it was built from (`build.rs`: `git rev-parse --short HEAD`, or `unknown` outside a git
/// work tree, e.g. from a source tarball).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NATLEDGER_COMMIT"),
    ")"
);

/// The whole command, for the man pages and completions.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Environment variables with no flag of their own, for the long help and the man page.
const ENVIRONMENT: &str = "\
Environment (read once at start; a flag given beside its variable wins):
  NATLEDGER_RUNTIME          the real runtime the wrapper runtime execs (default: runc)
  NATLEDGER_CONNTRACK_DUMP   how flows are found: adaptive (default), filtered, unfiltered
                             or refused (the fallback on demand, for tests)
  XTABLES_LOCKFILE           the iptables lock (default: /run/xtables.lock), as iptables reads it
  NATLEDGER_HOST_ROOT        the host's root directory when run from an image (e.g. /host): the
                             iptables tools are found under it and run chrooted into it
  NATLEDGER_FAULT            a fault point at which natledger kills itself (crash tests only)
Booleans (--trace, --no-netlink and their variables) take true/false, yes/no, on/off or 1/0.";

#[derive(Parser)]
#[command(
    name = "natledger",
    version = VERSION,
    about = "Container host-port forwards that never outlive their container",
    after_long_help = ENVIRONMENT
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// The options every command takes, each also read from its environment variable.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct Global {
    /// Where manifests and the lock live.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_STATE_DIR",
        default_value = "/run/natledger"
    )]
    pub state_dir: PathBuf,
    /// Backend for new rules (removal and sweep look in all three). auto: the backend the
    /// host's `iptables` symlink names, or nftables (natledger's own tables, no tool needed)
    /// where no iptables tool is installed.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_BACKEND",
        value_enum,
        default_value = "auto"
    )]
    pub backend: BackendChoice,
    /// What natledger says on stderr: error, warn, info (the default) or more, debug (each
    /// command run and its time, each table read, the peak RSS) or trace.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_LOG",
        value_enum,
        value_name = "LEVEL"
    )]
    pub log_level: Option<LogLevel>,
    /// Log at debug level (unless --log-level says otherwise).
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_TRACE",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        action = ArgAction::Set,
        value_parser = EmptyIsFalse,
        hide_default_value = true,
        hide_possible_values = true
    )]
    pub trace: bool,
    /// Change rules only through the `*-restore` tools: no nf_tables netlink, no
    /// iptables-legacy socket options.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_NO_NETLINK",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        action = ArgAction::Set,
        value_parser = EmptyIsFalse,
        hide_default_value = true,
        hide_possible_values = true
    )]
    pub no_netlink: bool,
    /// What a container's start does over another owner's forward of, or a listener on, one
    /// of its host ports, unless its annotation io.natledger.port-conflict says: warn, or
    /// refuse the start.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_PORT_CONFLICT",
        value_enum,
        default_value = "warn"
    )]
    pub port_conflict: PortConflict,
}

/// `--log-level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl From<LogLevel> for log::LevelFilter {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }
}

/// `--port-conflict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PortConflict {
    Warn,
    Refuse,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run as an OCI hook (createRuntime or poststop)
    ///
    /// Run as an OCI hook; the container state comes on stdin. Without a stage, the state's
    /// status decides (creating: create-runtime, stopped: poststop).
    Hook {
        #[arg(value_enum)]
        stage: Option<Stage>,
    },
    /// Remove the rules of dead containers and of no one
    ///
    /// Remove the rules of dead containers, and every natledger rule no live container
    /// claims, in iptables-legacy and iptables-nft, IPv4 and IPv6. Never creates the
    /// state directory: when it is missing, or holds no manifest, the rules of containers no
    /// manifest knows are left (a mistyped --state-dir would take every live container's
    /// forwards) unless --boot. Exit status 0 when everything due was removed (a missing
    /// state directory included), 1 otherwise (the report says what remains and why).
    Sweep {
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print a JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// Remove everything natledger owns, live containers' rules, shared chains and
        /// jumps included (for uninstalling).
        #[arg(long)]
        all: bool,
        /// Also put back what live containers' manifests record and the tables lack (after
        /// a firewall reload, a restored ruleset, a flush), with the chains, jumps and guard
        /// they need, in the same transaction per table.
        #[arg(long, conflicts_with = "all")]
        repair: bool,
        /// First give exiting containers up to SECONDS to die (ends early once none has
        /// exited for 3 s).
        #[arg(long, value_name = "SECONDS")]
        wait: Option<u64>,
        /// The boot, before any runtime: nothing lives yet, so every tagged rule no manifest
        /// claims goes, even when the state directory holds no manifest or is missing.
        #[arg(long)]
        boot: bool,
        /// Also write the sweep's metrics (Prometheus text format) to FILE, atomically, for a
        /// node_exporter textfile collector; nothing is written when FILE's directory does not
        /// exist.
        #[arg(long, value_name = "FILE", conflicts_with = "dry_run")]
        metrics_file: Option<PathBuf>,
    },
    /// Keep live containers' forwards in place, whoever wipes the tables
    ///
    /// Run in the foreground, logging to stderr: put back what live containers' manifests
    /// record and the tables lack, and remove what sweep removes, under the hooks' lock,
    /// when something may have changed: an nf_tables commit (told by the kernel), an
    /// iptables-legacy table's size or entry count (compared every 500 ms), firewalld's
    /// Reloaded signal on the system bus (DBUS_SYSTEM_BUS_ADDRESS), SIGHUP, or every
    /// --period seconds. Repairs undone again and again back off. SIGTERM and SIGINT
    /// stop it with status 0.
    Watch {
        /// Reconcile at least every SECONDS, whatever was told.
        #[arg(long, value_name = "SECONDS", default_value_t = 60,
              value_parser = clap::value_parser!(u64).range(1..))]
        period: u64,
        /// Write watch's counters (Prometheus text format) to FILE, atomically, after each
        /// reconcile, as sweep --metrics-file does.
        #[arg(long, value_name = "FILE")]
        metrics_file: Option<PathBuf>,
        /// Also serve the counters as GET /metrics over HTTP on ADDR:PORT (e.g.
        /// 127.0.0.1:9655), for a container without a textfile collector.
        #[arg(long, value_name = "ADDR:PORT")]
        metrics_address: Option<std::net::SocketAddr>,
        /// Also run doctor's live analysis every SECONDS (0: never), on a thread of its own,
        /// and export its findings (natledger_doctor_findings{kind,severity}) with the
        /// counters; findings that change are logged once.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        doctor_period: u64,
        /// Compare the iptables-legacy tables every MS milliseconds (tests: a wipe that only
        /// another trigger may see soon).
        #[arg(long, value_name = "MS", default_value_t = 500, hide = true,
              value_parser = clap::value_parser!(u64).range(100..))]
        legacy_every_ms: u64,
    },
    /// Add natledger's hooks to an OCI bundle's config.json
    ///
    /// Add natledger's createRuntime and poststop hooks to BUNDLE/config.json (runc, crun),
    /// after any hooks already there. Idempotent; keeps every other field; refuses a
    /// malformed file and leaves it unchanged.
    Inject {
        bundle: PathBuf,
        /// The natledger binary the runtime runs (default: this one).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Environment for the hooks (repeatable), e.g. NATLEDGER_STATE_DIR=/run/natledger.
        #[arg(long = "hook-env", value_name = "KEY=VALUE", value_parser = key_value)]
        hook_env: Vec<String>,
        /// Seconds the runtime gives each hook.
        #[arg(long, default_value_t = crate::entry::wrapper::HOOK_TIMEOUT)]
        timeout: u32,
    },
    /// Wrapper runtime (Docker, containerd): adds the hooks, execs runc
    ///
    /// Wrapper runtime for Docker and containerd (also reached as `natledger-runtime`):
    /// [--natledger-runtime PATH] [--natledger-hook-env KEY=VALUE]... RUNC-ARGS...; on
    /// create/run, injects the hooks when the container asks for ports, then execs runc.
    #[command(disable_help_flag = true)]
    Runtime {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Find the rules that make a port unreachable, whoever wrote them
    ///
    /// Find the rules that make a port unreachable, whoever wrote them: shadowed rules, dead
    /// DNAT targets, hijacked listeners, rules split across backends, natledger's own state,
    /// in iptables (both backends) and in every owner's native nftables tables. Only reads;
    /// prints the fixing commands. Exit 0 no problem, 1 warnings only, 2 errors,
    /// 3 doctor itself failed.
    Doctor {
        /// Print a JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// Only findings about this host port.
        #[arg(long)]
        port: Option<u16>,
        /// Analyse saved dumps instead of this host: BACKEND[/FAMILY]:FILE for *-save dumps,
        /// e.g. legacy:iptables.txt nft/ipv6:ip6tables.txt; nftables:FILE for a saved
        /// `nft list ruleset` (or `nft -j list ruleset`).
        #[arg(long, num_args = 1.., value_name = "BACKEND[/FAMILY]:FILE")]
        from: Vec<DumpFile>,
        /// Also write the findings per kind and severity (Prometheus text format) to FILE, as
        /// sweep --metrics-file does.
        #[arg(long, value_name = "FILE")]
        metrics_file: Option<PathBuf>,
    },
    /// Prove natledger works on this host, in namespaces of its own
    ///
    /// Prove natledger works on this host, in private network namespaces it creates and
    /// removes: both backends accept its rules, a forwarded port answers, poststop leaves the
    /// tables as they were. One line per check; exit 1 on any failure.
    Selftest,
    /// Put natledger in portmap's place in this host's CNI configuration
    ///
    /// Install this binary as BIN_DIR/natledger (atomically; an identical file is left as it
    /// is, another file or a link is never replaced), then in every conflist of CONF_DIR that
    /// libcni loads, switch each plugin of type portmap to natledger: only that `type` changes,
    /// after the file is backed up as FILE.natledger-backup. A conflist without portmap, or
    /// whose portmap uses options natledger refuses (or whose cniVersion it does not
    /// implement), is left alone; one it cannot read (malformed, over 1 MiB) is named in a
    /// warning and never rewritten.
    /// Again: nothing changes. With --uninstall, switch back (in the current file), remove the
    /// backups, and remove the binary if install-cni wrote it, the state directory records no
    /// CNI attachment and no conflist still names natledger. One line per file; exit 0 when
    /// every file it could read is done, 1 when a file could not be written.
    InstallCni {
        /// The CNI plugin directory (the DaemonSet mounts the host's at /host/opt/cni/bin).
        #[arg(long, value_name = "DIR", default_value = "/opt/cni/bin")]
        bin_dir: PathBuf,
        /// The CNI configuration directory (the DaemonSet: /host/etc/cni/net.d).
        #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
        conf_dir: PathBuf,
        /// Switch the conflists back to portmap and remove what install-cni installed.
        #[arg(long)]
        uninstall: bool,
    },
    /// Show every manifest
    ///
    /// Show every manifest: container, pid, alive or dead, mappings, backend and rules.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// A `--hook-env` value: `KEY=VALUE` with a non-empty key.
fn key_value(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((k, _)) if !k.is_empty() => Ok(s.to_string()),
        _ => Err("expected KEY=VALUE".into()),
    }
}

/// clap's booleans (true/false, yes/no, on/off, 1/0; anything else refused in clap's words),
/// with an empty value false: `NATLEDGER_TRACE=` in a unit file or a hook's env is unset, as
/// an empty path variable is.
#[derive(Clone, Copy, Debug)]
pub struct EmptyIsFalse;

impl TypedValueParser for EmptyIsFalse {
    type Value = bool;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<bool, clap::Error> {
        if value.is_empty() {
            return Ok(false);
        }
        BoolishValueParser::new().parse_ref(cmd, arg, value)
    }
}
