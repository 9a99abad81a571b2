//! The edit of one conflist's text, pure: every plugin of one `type` given another, in place
//! (`super::spans`): only the bytes of each such `type` value change. The result is parsed
//! again and must equal the original value with just those types changed, or nothing is
//! written.

use serde_json::Value;

use super::spans;

/// What a conflist's plugins are, for one switch from `from` to `to`.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// A `.conf`/`.json` holding one plugin, not a `plugins` list: not a chain.
    NotAList,
    /// No plugin of type `from`; `to` says whether one of type `to` is there.
    Absent { to: bool },
    /// Plugins of both types: switching would run `to` twice.
    Both,
    /// `count` plugins of type `from`: switched, natledger would run twice for one attachment
    /// (the ledger keys an attachment by container and interface: the second ADD would find
    /// the first one's manifest, and one DEL would remove both's rules).
    Several { count: usize },
    /// A Multus configuration: its `delegates` are not a chain libcni runs from this file, and
    /// not switched (the conflists it delegates to, in the conf dir, are). `from` says whether
    /// a delegate names a plugin of type `from`.
    Delegates { from: bool },
    /// A plugin of type `from` that `to` would refuse (its index, and why).
    Refused { plugin: usize, why: String },
    /// The text with `count` plugins switched.
    Switch { text: String, count: usize },
}

/// Why a conflist cannot be read as one (libcni would not load it either).
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error("not valid JSON")]
    Json(#[source] serde_json::Error),
    #[error("{0}")]
    Shape(&'static str),
    #[error("plugin {0}: {1}")]
    Plugin(usize, &'static str),
}

/// Switch every plugin of type `from` to `to` in `text` (a conflist; `list` when its name says
/// it must hold a `plugins` list, a `.conflist`). `judge` says why a plugin of type `from`
/// must stay as it is, if it must.
pub fn switch(
    text: &str,
    list: bool,
    from: &str,
    to: &str,
    judge: impl Fn(&Value) -> Option<String>,
) -> Result<Plan, Malformed> {
    let mut value: Value = serde_json::from_str(text).map_err(Malformed::Json)?;
    let top = spans::whole(text).ok_or(Malformed::Shape("not one JSON value"))?;
    let top = spans::members(text, top).ok_or(Malformed::Shape("not a JSON object"))?;
    let mut plugins = top.iter().filter(|(key, _)| key == "plugins");
    let Some((_, list_at)) = plugins.next() else {
        if let Some(delegates) = value.get("delegates").and_then(Value::as_array) {
            return Ok(Plan::Delegates {
                from: delegates.iter().any(|d| names(&d.to_string(), from)),
            });
        }
        return if list {
            Err(Malformed::Shape("no plugins list"))
        } else {
            Ok(Plan::NotAList)
        };
    };
    if plugins.next().is_some() {
        return Err(Malformed::Shape("two plugins keys"));
    }
    let elements =
        spans::elements(text, list_at.clone()).ok_or(Malformed::Shape("plugins is not a list"))?;
    let mut found = Vec::new();
    let mut has_to = false;
    for (i, element) in elements.into_iter().enumerate() {
        let members =
            spans::members(text, element).ok_or(Malformed::Plugin(i, "not a JSON object"))?;
        let mut types = members.into_iter().filter(|(key, _)| key == "type");
        let Some((_, at)) = types.next() else {
            continue;
        };
        if types.next().is_some() {
            return Err(Malformed::Plugin(i, "two type keys"));
        }
        let name: String = serde_json::from_str(&text[at.clone()])
            .map_err(|_| Malformed::Plugin(i, "type is not a string"))?;
        if name == from {
            found.push((i, at));
        } else if name == to {
            has_to = true;
        }
    }
    if found.is_empty() {
        return Ok(Plan::Absent { to: has_to });
    }
    if has_to {
        return Ok(Plan::Both);
    }
    if found.len() > 1 {
        return Ok(Plan::Several { count: found.len() });
    }
    for (i, _) in &found {
        if let Some(why) = judge(&value["plugins"][i]) {
            return Ok(Plan::Refused { plugin: *i, why });
        }
    }
    let mut edited = text.to_string();
    let quoted = Value::from(to).to_string();
    for (i, at) in found.iter().rev() {
        edited.replace_range(at.clone(), &quoted);
        value["plugins"][i]["type"] = Value::from(to);
    }
    let again: Value = serde_json::from_str(&edited).map_err(Malformed::Json)?;
    if again != value {
        return Err(Malformed::Shape("not editable in place"));
    }
    Ok(Plan::Switch {
        text: edited,
        count: found.len(),
    })
}

/// Whether a conflist (or a single plugin's `.conf`) names a plugin of type `plugin`, as
/// libcni would run it; text that is not JSON names nothing (libcni loads none of it).
pub fn names(text: &str, plugin: &str) -> bool {
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let is = |v: &Value| v.get("type").and_then(Value::as_str) == Some(plugin);
    is(&value)
        || value
            .get("plugins")
            .and_then(Value::as_array)
            .is_some_and(|plugins| plugins.iter().any(is))
}
