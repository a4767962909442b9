//! The house rules a test can hold: the source files of every crate, the tests and the
//! benchmarks stay short enough to read whole (#29, #51: no file over 700 lines), generated code
//! aside; the library names no kind of farm-apiserver's (#51).

use std::path::{Path, PathBuf};

/// Longest a hand-written source file may be.
const MAX_LINES: usize = 700;

/// What a generator wrote says so in its first line (the etcd protos' code from
/// `cargo run -p farm-etcd-proto`); nobody reads it as prose.
fn generated(text: &str) -> bool {
    text.lines()
        .next()
        .is_some_and(|line| line.contains("@generated"))
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_700_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src",
        "aggregated-apiserver/src",
        "aggregated-apiserver/examples",
        "fieldmanager/src",
        "etcd-proto/src",
        "tests",
        "bench/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 150, "found only {} source files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).expect("source file");
            let lines = text.lines().count();
            (lines > MAX_LINES && !generated(&text)).then(|| {
                let name = path.strip_prefix(root).unwrap_or(path);
                name.display().to_string()
            })
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:#?}");
}

/// aggregated-apiserver serves whatever kinds it is given: its sources (tests included) never
/// name farm-apiserver's kinds, group or crate. Its own tests serve kinds of `zoo.example.com`.
#[test]
fn the_library_names_no_kind_of_farm_apiserver() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("aggregated-apiserver/src"), &mut files);
    assert!(files.len() > 50, "found only {} source files", files.len());
    let words = [
        "llama",
        "farmpod",
        "farm.example.com",
        "farm_apiserver",
        "farm-apiserver",
    ];
    let mut named: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("source file");
            let name = path
                .strip_prefix(root)
                .unwrap_or(path)
                .display()
                .to_string();
            text.lines()
                .enumerate()
                .filter(|(_, line)| {
                    let line = line.to_ascii_lowercase();
                    words.iter().any(|word| line.contains(word))
                })
                .map(|(i, line)| format!("{name}:{}: {}", i + 1, line.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    named.sort();
    assert!(
        named.is_empty(),
        "the library names farm-apiserver's: {named:#?}"
    );
}

/// The steps of a write (#51) exist once, in `rest/pipeline.rs`'s `Writing::commit`: no verb
/// prepares, admits or stores an object itself. Admission prepares a mutated object again,
/// as the kind's strategy would.
#[test]
fn the_write_steps_are_taken_in_one_place() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("aggregated-apiserver/src"), &mut files);
    let steps = [
        (
            "prepare_create(",
            &["rest/pipeline.rs", "rest/admit.rs"][..],
        ),
        ("prepare_update(", &["rest/pipeline.rs", "rest/admit.rs"]),
        ("admit_create(", &["rest/pipeline.rs"]),
        ("admit_update(", &["rest/pipeline.rs"]),
        ("guaranteed::write(", &["rest/pipeline.rs"]),
    ];
    let mut found = 0;
    for (step, allowed) in steps {
        let mut callers: Vec<String> = Vec::new();
        for path in &files {
            let text = std::fs::read_to_string(path).expect("source file");
            let calls = text.lines().any(|line| {
                let line = line.trim();
                line.contains(step) && !line.starts_with("//") && !line.contains("fn ")
            });
            if calls {
                let name = path.strip_prefix(root.join("aggregated-apiserver/src"));
                callers.push(name.unwrap_or(path).display().to_string());
            }
        }
        found += callers.len();
        let strays: Vec<&String> = callers
            .iter()
            .filter(|caller| !allowed.contains(&caller.as_str()))
            .collect();
        assert!(
            strays.is_empty(),
            "{step} is called outside the write pipeline, by {strays:?}"
        );
    }
    assert!(found >= 5, "the write steps were not found at all");
}

/// The library's top-level modules in layers (#51): a module uses only those of its own layer
/// and the layers before it, so a reader can take the crate from the bottom up (kinds → store →
/// rendering → REST → group → server). Tests and comments aside.
const LAYERS: &[&[&str]] = &[
    &["error", "json_patch", "net", "request_info"],
    &["resource", "observe"],
    &["store", "auth"],
    &["render", "audit"],
    &["admission", "api"],
    &["rest"],
    &["group"],
    &["server"],
];

/// The top-level modules `code` names through `crate::` (paths and `use crate::{...}` trees).
fn crate_modules(code: &str) -> Vec<String> {
    let mut named = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(tree) = rest.strip_prefix('{') {
            // The tree's top-level items, up to its closing brace.
            let (mut depth, mut item) = (0, String::new());
            for c in tree.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => named.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            named.push(item);
        } else {
            named.push(rest.to_owned());
        }
    }
    named
        .iter()
        .map(|item| {
            let item = item.trim();
            let end = item
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(item.len());
            item[..end].to_owned()
        })
        .filter(|name| !name.is_empty() && name != "self")
        .collect()
}

#[test]
fn the_librarys_layers_import_only_the_layers_before_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("aggregated-apiserver/src");
    let layer_of = |name: &str| LAYERS.iter().position(|layer| layer.contains(&name));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut checked = 0;
    let mut upward = Vec::new();
    for path in &files {
        let name = path.strip_prefix(&src).unwrap_or(path);
        let top = name.iter().next().and_then(|s| s.to_str()).unwrap_or("");
        let top = top.trim_end_matches(".rs");
        if top == "lib" || top == "testing" {
            continue;
        }
        let own = layer_of(top).unwrap_or_else(|| panic!("{top} is in no layer of LAYERS"));
        let text = std::fs::read_to_string(path).expect("source file");
        let code: String = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for used in crate_modules(&code) {
            let Some(theirs) = layer_of(&used) else {
                continue; // a crate-root item (Error, Result)
            };
            checked += 1;
            if theirs > own {
                upward.push(format!("{} uses {used}", name.display()));
            }
        }
    }
    assert!(checked > 300, "only {checked} uses of crate:: found");
    upward.sort();
    upward.dedup();
    assert!(upward.is_empty(), "imports of a later layer: {upward:#?}");
}
