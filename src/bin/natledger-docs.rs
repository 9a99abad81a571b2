//! `natledger-docs OUTDIR`: the man pages and shell completions of `natledger`, rendered from
//! its clap definitions (`natledger::entry::cli::command`), for packaging.
//!
//! Writes `OUTDIR/man/man8/natledger.8` and one `natledger-SUBCOMMAND.8` per subcommand, and
//! `OUTDIR/completions/{bash/natledger, zsh/_natledger, fish/natledger.fish}`; prints each
//! path written. A binary of its own so that clap_mangen and clap_complete are linked into
//! neither the hook's binary nor its start-up.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap_complete::Shell;
use clap_mangen::Man;

use natledger::entry::cli;

/// The name every page and completion is for.
const BIN: &str = "natledger";
/// System administration commands: natledger runs as root and changes the firewall.
const SECTION: &str = "8";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(outdir), None) = (args.next(), args.next()) else {
        eprintln!("usage: natledger-docs OUTDIR");
        return ExitCode::from(2);
    };
    match write_all(Path::new(&outdir)) {
        Ok(paths) => {
            for path in paths {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("natledger-docs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Every man page and completion file under `outdir`; the paths written.
fn write_all(outdir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man_dir = outdir.join("man").join(format!("man{SECTION}"));
    for (name, page) in man_pages()? {
        written.push(write(&man_dir.join(format!("{name}.{SECTION}")), &page)?);
    }
    let completions = outdir.join("completions");
    for (shell, file) in [
        (Shell::Bash, "bash/natledger"),
        (Shell::Zsh, "zsh/_natledger"),
        (Shell::Fish, "fish/natledger.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cli::command(), BIN, &mut text);
        written.push(write(&completions.join(file), &text)?);
    }
    Ok(written)
}

/// `natledger(8)` and `natledger-SUBCOMMAND(8)` for each visible subcommand (help excluded),
/// as (page name, roff text). Built first, so each subcommand's page lists the global options.
fn man_pages() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut root = cli::command().disable_help_subcommand(true);
    root.build();
    let source = format!("{BIN} {}", env!("CARGO_PKG_VERSION"));
    let subs: Vec<clap::Command> = root
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let sub_name = |sub: &clap::Command| format!("{BIN}-{}", sub.get_name());

    let mut pages = Vec::new();
    let see_also: Vec<String> = subs.iter().map(sub_name).collect();
    pages.push((BIN.to_string(), page(root.clone(), &source, &see_also)?));
    for sub in subs {
        let name = sub_name(&sub);
        // The display name clap gives a built subcommand is already `natledger-SUB`; set it
        // anyway, since the title, NAME and file name are taken from it.
        let bin_name = format!("{BIN} {}", sub.get_name());
        let sub = sub.display_name(name.clone()).bin_name(bin_name);
        pages.push((name, page(sub, &source, &[BIN.to_string()])?));
    }
    Ok(pages)
}

/// One page in roff: clap_mangen's sections, then SEE ALSO naming `see_also` in section 8.
fn page(cmd: clap::Command, source: &str, see_also: &[String]) -> anyhow::Result<Vec<u8>> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let mut text = Vec::new();
    Man::new(cmd)
        .section(SECTION)
        .date(date())
        .source(source)
        .manual("System Administration")
        .render(&mut text)
        .with_context(|| format!("rendering {name}({SECTION})"))?;
    // No hyphenation (a command, option or path broken over two lines is copied wrong) and
    // ragged right (no stretched gaps inside a command); `AD` is groff's man default.
    let th = text
        .windows(4)
        .position(|w| w == b"\n.TH")
        .and_then(|at| {
            text[at + 1..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|end| at + 2 + end)
        })
        .with_context(|| format!("{name}({SECTION}): clap_mangen wrote no .TH line"))?;
    text.splice(th..th, b".nh\n.ds AD l\n.ad l\n".iter().copied());
    let refs: Vec<String> = see_also
        .iter()
        .map(|page| format!("\\fB{}\\fR({SECTION})", page.replace('-', "\\-")))
        .collect();
    text.extend_from_slice(format!(".SH \"SEE ALSO\"\n{}\n", refs.join(",\n")).as_bytes());
    Ok(text)
}

/// The pages' date, YYYY-MM-DD: `SOURCE_DATE_EPOCH` (reproducible builds), else the date of
/// the commit built, else `undated`. Never empty: clap_mangen does not quote an empty date,
/// and `.TH` would then take the source for the date.
fn date() -> String {
    if let Some(secs) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
    {
        return civil_date(secs.div_euclid(86_400));
    }
    match env!("NATLEDGER_COMMIT_DATE") {
        "" => "undated".to_string(),
        date => date.to_string(),
    }
}

/// Days since 1970-01-01 as YYYY-MM-DD (proleptic Gregorian; Howard Hinnant's algorithm).
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Writes `bytes` to `path`, creating its directory; the path.
fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.to_path_buf())
}
