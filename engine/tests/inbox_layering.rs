//! The layering of `engine/src/inbox/`, written once, and the check that
//! the code keeps to it.
//!
//! [`LAYERS`] lists the inbox's units from the top down. A unit is a
//! module path under `inbox` (a folder, a file, or `""` for `inbox/mod.rs`);
//! a file belongs to the longest unit its module path starts with. A file
//! may use its own unit and any unit of a *lower* layer; a use of a unit in
//! its own layer or above is refused, unless [`EXCEPTIONS`] names it (and an
//! exception nothing needs any more is refused too, so the list only
//! shrinks).
//!
//! The check reads the source, not the compiler's view: every path that
//! starts with `crate::`, `$crate::`, `super::` or `self::` outside comments
//! (in `use` lines and in code), brace groups expanded. Tests are exempt:
//! a `tests.rs` file and everything after `#[cfg(test)] mod tests`.
//! `docs/ARCHITECTURE.md` ("Floor plan") explains the layers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The inbox's units, top layer first. Within a layer, units may not use
/// each other.
const LAYERS: &[&[&str]] = &[
    // The `Inbox` API's commands and reads (`impl Inbox`), and the
    // re-exports.
    &[""],
    // More of the API (more `impl Inbox` blocks) and the tools over it.
    &["read_api", "inspect", "kinds"],
    // Replication drives the sequencer from the consensus layer, and
    // installs a leader's image with salvage's writer.
    &["replica"],
    &["salvage"],
    // The `Inbox` struct: opening, submitting a command, stopping. Every
    // `impl Inbox` block above uses it.
    &["handle"],
    // The generic round-and-commit engine.
    &["sequencer"],
    // The engine's commands, one variant per subsystem.
    &["command"],
    // The subsystems' commands, decisions and reads.
    &["compaction"],
    &["snapshots"],
    &["devices"],
    &["messaging"],
    // Fan-out across groups: the send path's hook and the forwarder's
    // commands, below messaging, which calls the hook.
    &["fanout"],
    // What a decision hands the sequencer; a reply to wait for, then a
    // read to run; what the sequencer, the completion stage and readers
    // share.
    &["round"],
    &["pending"],
    &["read"],
    &["shared"],
    // What `Shared` holds of the sequencer: the completion stage's queue
    // of rounds, each with its leader's link and entry (the sequencer
    // gives the link a callback, so the link names no sequencer).
    &["sequencer::completion_queue"],
    &["replica::link"],
    // Replay, the check of every location it recovered, and checkpoints.
    &["recover"],
    &["consistency"],
    &["checkpoint"],
    // The one `evt` record enum and its apply.
    &["effect"],
    // The subsystems' records: kind, codec, apply; their checkpoint
    // sections.
    &["messaging::apply"],
    &[
        "messaging::record",
        "devices::record",
        "snapshots::record",
        "compaction::record",
        "replica::record",
        "fanout::record",
    ],
    // The large-group switch's records, which messaging's record set
    // holds (its commands and reads are in `messaging::large`).
    &["messaging::large_record"],
    &["messaging::checkpoint"],
    // The tables, the `Record` trait and the invariants.
    &["state"],
    // Parts of a subsystem that the state and `Shared` hold: rows, the
    // idempotency table, stores and runtimes. They use only what is below.
    &[
        "devices::ack_view",
        "devices::touches",
        "snapshots::store",
        "compaction::runtime",
    ],
    // Messaging's rows include the user, which holds the devices' and
    // snapshots' rows.
    &["messaging::rows", "messaging::idem"],
    &["devices::rows", "snapshots::rows", "fanout::rows"],
    // Generic compact containers.
    &["containers"],
    // Batch tokens, then byte helpers, the configuration, the walk of a
    // damaged frame's records (salvage and recovery), and how replies
    // travel.
    &["token"],
    &["codec", "config", "frames", "reply"],
    // Slots and placement: the configuration holds a placement.
    &["fanout::slot"],
];

/// Uses against [`LAYERS`] that the code still makes: (from unit, to unit,
/// why). Empty: every import of the inbox points down. A line added here
/// is a debt, to be removed when the use goes.
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// A source file of the inbox and the module path of the code in it.
struct Source {
    file: PathBuf,
    module: Vec<String>,
    code: String,
}

#[test]
fn every_inbox_import_points_down_the_layers() {
    let sources = inbox_sources();
    let mut refused = Vec::new();
    let mut used_exceptions = BTreeSet::new();
    for src in &sources {
        let from = unit_of(&src.module)
            .unwrap_or_else(|| panic!("{} is in no unit of LAYERS", src.file.display()));
        for path in paths_in(&src.code, &src.module) {
            let Some(rest) = path.strip_prefix(&["inbox".to_string()][..]) else {
                continue;
            };
            let Some(to) = unit_of(rest) else {
                continue; // an item of `inbox/mod.rs` re-exported from below
            };
            if to == from || layer_of(to) > layer_of(from) {
                continue;
            }
            if EXCEPTIONS.iter().any(|(f, t, _)| *f == from && *t == to) {
                used_exceptions.insert((from, to));
                continue;
            }
            refused.push(format!(
                "{}: `{}` uses `{}` (unit `{to}`, layer {}) from unit `{from}` (layer {})",
                src.file.display(),
                from,
                path.join("::"),
                layer_of(to),
                layer_of(from),
            ));
        }
    }
    refused.sort();
    refused.dedup();
    assert!(
        refused.is_empty(),
        "imports against LAYERS:\n{}",
        refused.join("\n")
    );
    let stale: Vec<_> = EXCEPTIONS
        .iter()
        .filter(|(f, t, _)| !used_exceptions.contains(&(*f, *t)))
        .collect();
    assert!(
        stale.is_empty(),
        "exceptions nothing needs any more: {stale:?}"
    );
}

#[test]
fn every_unit_of_the_layers_is_listed_once_and_names_a_module() {
    let sources = inbox_sources();
    let mut seen = BTreeSet::new();
    for unit in LAYERS.iter().flat_map(|l| l.iter()) {
        assert!(seen.insert(*unit), "unit `{unit}` is listed twice");
        let parts: Vec<String> = split(unit);
        assert!(
            sources.iter().any(|s| s.module.starts_with(&parts)),
            "unit `{unit}` names no module"
        );
    }
    for (from, to, why) in EXCEPTIONS {
        assert!(seen.contains(from) && seen.contains(to), "{from} -> {to}");
        assert!(!why.is_empty(), "exception {from} -> {to} says why");
    }
}

#[test]
fn the_path_reader_resolves_use_trees_and_relative_paths() {
    let module = split("messaging::read");
    let code = "use super::{state::State, devices::{self, rows}};\n\
                // use crate::inbox::effect::Effect;\n\
                fn f() { crate::inbox::codec::Writer::new(); self::x(); }";
    let paths: Vec<String> = paths_in(&without_comments(code), &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "inbox::messaging::state::State",
            "inbox::messaging::devices",
            "inbox::messaging::devices::rows",
            "inbox::codec::Writer::new",
            "inbox::messaging::read::x",
        ]
        .map(String::from)
    );
    // `super` from a folder's `mod.rs` is the folder's parent.
    let paths = paths_in("use super::state::State;", &split("messaging"));
    assert_eq!(paths, [split("inbox::state::State")]);
}

fn split(path: &str) -> Vec<String> {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn layer_of(unit: &str) -> usize {
    LAYERS.iter().position(|l| l.contains(&unit)).unwrap()
}

/// The longest unit `module` (a path below `inbox`) starts with.
fn unit_of(module: &[String]) -> Option<&'static str> {
    let all = LAYERS.iter().flat_map(|l| l.iter().copied());
    all.filter(|u| module.starts_with(&split(u)))
        .max_by_key(|u| split(u).len())
}

fn inbox_sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/inbox");
    let mut files = Vec::new();
    collect_rs(&root, &mut files);
    files.sort();
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut sources = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().with_extension("");
        let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into()).collect();
        if module.last().is_some_and(|m| m == "tests") {
            continue;
        }
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_tests(&without_comments(&text)).to_string();
        sources.push(Source {
            file: file
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap()
                .into(),
            module,
            code,
        });
    }
    sources
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with `//` and `/* */` comments blanked (string literals kept as
/// they are: none in the inbox holds a path that looks like a module's).
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            let end = after.find('\n').unwrap_or(after.len());
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").map_or(after.len(), |e| e + 2);
            rest = &after[end..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// `code` up to its unit tests module, which may use anything.
fn without_tests(code: &str) -> &str {
    let mut at = 0;
    while let Some(i) = code[at..].find("#[cfg(test)]") {
        let after = code[at + i + "#[cfg(test)]".len()..].trim_start();
        let after = after.strip_prefix("pub(crate) ").unwrap_or(after);
        if after.starts_with("mod tests") {
            return &code[..at + i];
        }
        at += i + 1;
    }
    code
}

/// Every path in `code` that starts at the crate root or relative to
/// `module` (a path below `inbox`), resolved to a path from the crate root.
fn paths_in(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let here: Vec<String> = std::iter::once("inbox".to_string())
        .chain(module.iter().cloned())
        .collect();
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let starts_ident = i == 0 || !is_ident(bytes[i - 1]);
        let root = ["$crate::", "crate::", "super::", "self::"]
            .into_iter()
            .find(|r| code[i..].starts_with(r));
        match root {
            Some(r) if starts_ident && (i == 0 || bytes[i - 1] != b':') => {
                let (tree, end) = read_tree(code, i);
                for path in tree {
                    out.push(resolve(&path, &here));
                }
                i = end.max(i + r.len());
            }
            _ => i += 1,
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// Reads the path (or `use` tree) starting at `start`: the paths it names
/// and where it ends.
fn read_tree(code: &str, start: usize) -> (Vec<Vec<String>>, usize) {
    let bytes = code.as_bytes();
    let mut prefix = Vec::new();
    let mut i = start;
    loop {
        let s = i;
        while i < code.len() && is_ident(bytes[i]) {
            i += 1;
        }
        if i > s {
            prefix.push(code[s..i].to_string());
        }
        if code[i..].starts_with("::") {
            i += 2;
            let ws = code[i..].len() - code[i..].trim_start().len();
            i += ws;
            if code[i..].starts_with('{') {
                let mut paths = Vec::new();
                i += 1;
                loop {
                    let ws = code[i..].len() - code[i..].trim_start().len();
                    i += ws;
                    if code[i..].starts_with('}') {
                        return (paths, i + 1);
                    }
                    if code[i..].starts_with(',') {
                        i += 1;
                        continue;
                    }
                    let (inner, end) = read_tree(code, i);
                    for p in inner {
                        let mut full = prefix.clone();
                        if p != ["self"] {
                            full.extend(p);
                        }
                        paths.push(full);
                    }
                    if end == i {
                        // `*` or `as x`: skip one character.
                        i += 1;
                    } else {
                        i = end;
                    }
                }
            }
            continue;
        }
        return (
            if prefix.is_empty() {
                vec![]
            } else {
                vec![prefix]
            },
            i,
        );
    }
}

/// `path` (as written in a file of module `here`) from the crate root.
fn resolve(path: &[String], here: &[String]) -> Vec<String> {
    let mut out: Vec<String> = match path.first().map(String::as_str) {
        Some("crate" | "$crate") => Vec::new(),
        _ => here.to_vec(),
    };
    let mut rest = path;
    if matches!(rest.first().map(String::as_str), Some("crate" | "$crate")) {
        rest = &rest[1..];
    }
    for seg in rest {
        match seg.as_str() {
            "super" => {
                out.pop();
            }
            "self" => {}
            _ => out.push(seg.clone()),
        }
    }
    out
}
