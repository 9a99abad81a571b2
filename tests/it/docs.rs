//! `natledger-docs OUTDIR` (man pages and completions from the clap definitions) and
//! `natledger --version`. The expected subcommands and options come from
//! `natledger::entry::cli::command()`, so a new subcommand or option without its page or completion
//! fails here.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use natledger::entry::cli;

const DOCS: &str = env!("CARGO_BIN_EXE_natledger-docs");
const NATLEDGER: &str = env!("CARGO_BIN_EXE_natledger");

fn ok(output: Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout
}

fn generate(dir: &Path) {
    let out = Command::new(DOCS)
        .arg(dir)
        .output()
        .expect("running natledger-docs");
    ok(out, "natledger-docs");
}

/// The visible subcommands and, for each, its long options (globals included) and
/// positionals' value names; the help subcommand excluded as natledger-docs does.
fn subcommands() -> Vec<(String, Vec<String>)> {
    let mut root = cli::command().disable_help_subcommand(true);
    root.build();
    root.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| (s.get_name().to_string(), names(s)))
        .collect()
}

fn names(cmd: &clap::Command) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .map(|a| match a.get_long() {
            Some(long) => format!("--{long}"),
            None => a.get_id().as_str().to_uppercase(),
        })
        .collect()
}

/// One page as `man -l` shows it at 80 columns; groff's warnings must be none.
fn render(page: &Path) -> String {
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(page)
        .env("MANWIDTH", "80")
        .env("LC_ALL", "C")
        .env("MAN_KEEP_FORMATTING", "")
        .output()
        .expect("running man");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = ok(out, &format!("man -l {}", page.display()));
    assert!(stderr.is_empty(), "man -l {}: {stderr}", page.display());
    text
}

/// One page per visible subcommand plus `natledger.8`, each rendered by `man --warnings -l` at
/// MANWIDTH=80 without a warning, naming every option of `cli::command()` (globals included),
/// the subcommands on `natledger(8)`.
#[test]
fn man_pages_render_and_name_every_subcommand_and_option() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let man8 = dir.path().join("man/man8");
    let subs = subcommands();
    assert!(subs.len() >= 7, "subcommands: {subs:?}");

    let mut expected: BTreeSet<String> = subs
        .iter()
        .map(|(sub, _)| format!("natledger-{sub}.8"))
        .collect();
    expected.insert("natledger.8".into());
    let found: BTreeSet<String> = std::fs::read_dir(&man8)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(found, expected, "the pages in {}", man8.display());

    let root = render(&man8.join("natledger.8"));
    assert!(root.starts_with("natledger(8)"), "{root}");
    for option in names(&cli::command()) {
        assert!(
            root.contains(&option),
            "natledger(8) lacks {option}:\n{root}"
        );
    }
    for (sub, options) in &subs {
        // The root page lists the subcommand, and its page is reachable from it.
        let reference = format!("natledger-{sub}(8)");
        assert!(
            root.contains(&reference),
            "natledger(8) lacks {reference}:\n{root}"
        );
        let page = render(&man8.join(format!("natledger-{sub}.8")));
        assert!(page.starts_with(&reference), "{page}");
        let words = page.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains(&format!("SYNOPSIS natledger {sub}")),
            "{reference}: no synopsis:\n{page}"
        );
        assert!(
            page.contains("natledger(8)"),
            "{reference}: no SEE ALSO:\n{page}"
        );
        for option in options {
            // Whole on one line: no hyphenation inside an option name.
            assert!(
                page.contains(option.as_str()),
                "{reference} lacks {option}:\n{page}"
            );
        }
        for line in page.lines() {
            assert!(
                line.len() <= 80,
                "{reference}: {} columns: {line}",
                line.len()
            );
        }
    }
}

/// `SOURCE_DATE_EPOCH` dates the pages.
#[test]
fn man_page_date_follows_source_date_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(DOCS)
        .arg(dir.path())
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap();
    ok(out, "natledger-docs");
    let page = std::fs::read_to_string(dir.path().join("man/man8/natledger-sweep.8")).unwrap();
    let th = page.lines().find(|l| l.starts_with(".TH ")).unwrap();
    assert_eq!(
        th,
        format!(
            ".TH natledger-sweep 8 2023-11-14 \"natledger {}\" \"System Administration\"",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// Runs `script` in a bash without start-up files after sourcing the bash completion.
fn bash_completion(file: &Path, script: &str) -> String {
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c"])
        .arg(format!("set -e; source '{}'; {script}", file.display()))
        .output()
        .expect("running bash");
    ok(out, &format!("bash: {script}"))
}

/// What the completion function offers for the words of a command line, the last being the
/// one completed (bash calls it with the command, the current word and the previous word).
fn complete(file: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let script = format!(
        "COMP_WORDS=({}); COMP_CWORD={cword}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         _natledger natledger '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        quoted.join(" "),
        words.join(" "),
        words[cword],
        words[cword - 1],
    );
    bash_completion(file, &script)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The bash completion registers with `complete -F` and completes `natledger sw` to `sweep`,
/// every subcommand, every long option of each and `--backend`'s values.
#[test]
fn bash_completion_loads_and_completes_subcommands_and_options() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let file = dir.path().join("completions/bash/natledger");

    let registered = bash_completion(&file, "complete -p natledger");
    assert!(
        registered.contains("-F _natledger") && registered.trim_end().ends_with(" natledger"),
        "{registered}"
    );
    assert_eq!(complete(&file, &["natledger", "sw"]), ["sweep"]);
    let all: BTreeSet<String> = complete(&file, &["natledger", ""]).into_iter().collect();
    for (sub, options) in subcommands() {
        assert!(all.contains(&sub), "natledger <TAB> lacks {sub}: {all:?}");
        let offered: BTreeSet<String> = complete(&file, &["natledger", &sub, "--"])
            .into_iter()
            .collect();
        for option in options.iter().filter(|o| o.starts_with("--")) {
            assert!(
                offered.contains(option),
                "natledger {sub} --<TAB> lacks {option}: {offered:?}"
            );
        }
    }
    let backends = complete(&file, &["natledger", "--backend", ""]);
    assert_eq!(backends, ["auto", "legacy", "nft", "nftables"]);
}

fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// zsh (`zsh -n`) and fish (`fish --no-execute`) parse theirs and name every subcommand
/// (skipped with a note where not installed).
#[test]
fn zsh_and_fish_completions_name_every_subcommand_and_parse() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let subs = subcommands();
    for (shell, file, check) in [
        ("zsh", "zsh/_natledger", ["zsh", "-n"]),
        ("fish", "fish/natledger.fish", ["fish", "--no-execute"]),
    ] {
        let path = dir.path().join("completions").join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        for (sub, _) in &subs {
            assert!(text.contains(sub.as_str()), "{file} lacks {sub}");
        }
        if installed(shell) {
            let out = Command::new(check[0])
                .arg(check[1])
                .arg(&path)
                .output()
                .unwrap();
            ok(out, &format!("{} {}", check.join(" "), path.display()));
        } else {
            // scripts/test.sh installs both; elsewhere the syntax check is skipped.
            eprintln!("{shell} not installed: {file} not syntax-checked");
        }
    }
}

/// The commit of this source tree as build.rs finds it, or "unknown" outside a git work
/// tree.
fn source_commit() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string())
    };
    match git(&["rev-parse", "--show-toplevel"]) {
        Some(top) if Path::new(&top).canonicalize().ok() == Path::new(dir).canonicalize().ok() => {
            git(&["rev-parse", "--short", "HEAD"]).unwrap()
        }
        _ => "unknown".into(),
    }
}

/// `natledger --version` names the commit.
#[test]
fn version_names_the_commit() {
    let out = Command::new(NATLEDGER).arg("--version").output().unwrap();
    let stdout = ok(out, "natledger --version");
    let commit = std::env::var("NATLEDGER_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(source_commit);
    assert_eq!(
        stdout,
        format!(
            "natledger {} (commit {commit})\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// `--help` gives each command one line; the paragraph is in the long help (`help CMD`) and
/// the man page.
#[test]
fn help_gives_each_command_one_line() {
    let out = Command::new(NATLEDGER).arg("--help").output().unwrap();
    let stdout = ok(out, "natledger --help");
    let commands: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(commands.len(), 10, "{stdout}");
    for line in &commands {
        assert!(line.len() <= 80, "{line:?} is not one line");
    }
    let out = Command::new(NATLEDGER)
        .args(["help", "doctor"])
        .output()
        .unwrap();
    assert!(ok(out, "natledger help doctor").contains("3 doctor itself failed"));
}

/// A usage error exits 2 (clap's), doctor's 3 (doctor failing), decided by the command clap
/// parsed, whatever words the arguments hold; a bad variable is refused as a bad flag value.
#[test]
fn usage_errors_exit_2_and_doctors_3_whatever_the_words() {
    let code = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(NATLEDGER)
            .args(args)
            .envs(env.iter().copied())
            .env("NATLEDGER_STATE_DIR", "/nonexistent/natledger-docs-test")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(
        code(&["--state-dir", "doctor", "sweep", "--bogus"], &[]).0,
        Some(2)
    );
    assert_eq!(code(&["doctor", "--bogus"], &[]).0, Some(3));
    assert_eq!(code(&["doctor", "--port", "x"], &[]).0, Some(3));
    let (status, stderr) = code(&["list"], &[("NATLEDGER_BACKEND", "nfts")]);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid value 'nfts' for '--backend <BACKEND>'"),
        "{stderr}"
    );
    let (status, stderr) = code(&["list"], &[("NATLEDGER_TRACE", "maybe")]);
    assert_eq!(status, Some(2), "{stderr}");
    // One rule for booleans: 0 is off (no trace's peak RSS line), 1 on.
    let (_, stderr) = code(&["list", "--json"], &[("NATLEDGER_TRACE", "0")]);
    assert!(!stderr.contains("peak rss"), "{stderr}");
    let (_, stderr) = code(&["list", "--json"], &[("NATLEDGER_TRACE", "1")]);
    assert!(stderr.contains("natledger: peak rss "), "{stderr}");
}
