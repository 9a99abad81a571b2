//! The plugin's settings: its environment's `NATLEDGER_*` variables.

use super::*;

/// A bad `NATLEDGER_*` value is refused in clap's words (a typo is no longer taken as
/// `auto`): the error object of CHECK and ADD, before anything is done; VERSION answers.
/// (DEL, GC and STATUS go on with the default and a warning: `tests/it/cni`.)
#[test]
fn a_bad_setting_is_the_error_object_in_clap_words() {
    let vars = env("CHECK");
    let lookup = |name: &str| match name {
        "NATLEDGER_BACKEND" => Some(OsString::from("nfts")),
        _ => vars.get(name).cloned(),
    };
    let plugin = plugin::Natledger::new(
        crate::entry::settings::Settings::from_env(&lookup),
        Some(crate::entry::settings::Settings::lenient(&lookup)),
    );
    let out = run(&serde_json::to_vec(&config()).unwrap(), &lookup, &plugin);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let error: ErrorResult = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (error.code, error.msg.as_str()),
        (4, "invalid natledger setting")
    );
    assert!(
        error
            .details
            .starts_with("invalid value 'nfts' for '--backend <BACKEND>' [possible values:"),
        "{}",
        error.details
    );
    let version = |name: &str| match name {
        "CNI_COMMAND" => Some(OsString::from("VERSION")),
        _ => lookup(name),
    };
    assert_eq!(run(b"{}", &version, &plugin).code, 0);
}
