//! The docs' terminal sessions run as shown (#51: every snippet in the docs is compiled or run
//! by a test). A ```console block is a session: `$ command` lines (a heredoc continues the
//! command), each followed by what it prints. A session that starts with
//! `export KUBECONFIG=$PWD/certs/kubeconfig` runs against the server as README starts it
//! (`cargo run --release` in the directory: development certificates in `certs/`), each command
//! through bash, and what it prints (stdout, then stderr) must be what the page shows, once
//! what differs from run to run is masked: ages, times, uids and resourceVersions. A command
//! the page shows no output for runs unchecked. `$ cat FILE` writes the page's FILE first.
//! A session of an installed server (docs/install.md's) needs a cluster and is not run here.
//!
//! Each ```sh command line that runs the server (`cargo run --release -- ARGS`) is parsed by the
//! binary's own flags (`ARGS --help` exits 0 only when every flag is known); one that runs the
//! tests or a benchmark names a test module, a script and flags that exist; each audit Policy
//! and TracingConfiguration shown is a file the server starts with. What needs a cluster
//! (kubectl apply -k, helm install, admission configurations) is run by the e2e tests, not here.

use std::process::Command;

use crate::common::{install::has_kubectl, process::Running};
use crate::docs::{self, blocks, root};

const DEV_SESSION: &str = "export KUBECONFIG=$PWD/certs/kubeconfig";

/// README.md and the pages of docs/, each with its name from the repository's root and its text.
fn pages() -> Vec<(String, String)> {
    docs::pages()
        .into_iter()
        .map(|path| {
            let name = path
                .strip_prefix(root())
                .unwrap_or(&path)
                .display()
                .to_string();
            let text = std::fs::read_to_string(&path).expect("page");
            (name, text)
        })
        .collect()
}

/// One command of a session and what the page shows it printing.
struct Step {
    command: String,
    shown: Vec<String>,
}

fn steps(block: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut heredoc: Option<String> = None;
    for line in block {
        if let Some(end) = &heredoc {
            let step = steps.last_mut().expect("a command before its heredoc");
            step.command.push('\n');
            step.command.push_str(line);
            if line.trim() == end {
                heredoc = None;
            }
        } else if let Some(command) = line.strip_prefix("$ ") {
            if let Some((_, marker)) = command.split_once("<<") {
                heredoc = Some(
                    marker
                        .trim()
                        .trim_matches('\'')
                        .trim_matches('"')
                        .to_owned(),
                );
            }
            steps.push(Step {
                command: command.to_owned(),
                shown: Vec::new(),
            });
        } else if let Some(step) = steps.last_mut() {
            step.shown.push(line.clone());
        }
    }
    for step in &mut steps {
        while step.shown.last().is_some_and(|line| line.trim().is_empty()) {
            step.shown.pop();
        }
    }
    steps
}

/// A line as words, with what differs from run to run masked. Words, not columns: kubectl pads
/// a table's columns to their widest cell, and an age of `1s` or `12s` moves the rest.
fn words(line: &str) -> Vec<String> {
    let uid = |w: &str| {
        let parts: Vec<&str> = w.split('-').collect();
        parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
            && parts
                .iter()
                .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
    };
    let age = |w: &str| {
        let digits = w.trim_end_matches(|c: char| "smhd".contains(c));
        w.len() > digits.len()
            && !digits.is_empty()
            && digits
                .split(|c: char| "smhd".contains(c))
                .all(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    };
    let mut masked = Vec::new();
    let mut after_version = false;
    for word in line.split_whitespace() {
        let bare = word.trim_matches('"');
        let value = if uid(bare) {
            "<uid>".to_owned()
        } else if age(bare) {
            "<age>".to_owned()
        } else if bare.len() == 20 && bare.ends_with('Z') && bare.chars().nth(10) == Some('T') {
            "<time>".to_owned()
        } else if after_version && bare.chars().all(|c| c.is_ascii_digit()) {
            "<resourceVersion>".to_owned()
        } else {
            word.to_owned()
        };
        after_version = word == "resourceVersion:";
        masked.push(value);
    }
    masked
}

#[test]
fn every_console_session_runs_as_shown() {
    if !has_kubectl() {
        eprintln!("SKIPPED: kubectl is not on PATH; the docs' sessions need it");
        return;
    }
    let mut commands = 0;
    for (page, text) in pages() {
        for block in blocks(&text, "console") {
            let steps = steps(&block);
            if steps.first().is_none_or(|step| step.command != DEV_SESSION) {
                continue;
            }
            // The server as README starts it, in a directory of the session's own.
            let dir = tempfile::tempdir().unwrap();
            let certs = dir.path().join("certs");
            let _server = Running::start([std::ffi::OsStr::new("--cert-dir"), certs.as_os_str()]);
            let cache = dir.path().join("kube-cache");
            let mut exports = Vec::new();
            for step in &steps {
                if step.command.starts_with("export ") {
                    exports.push(step.command.clone());
                    continue;
                }
                if let Some(file) = step.command.strip_prefix("cat ") {
                    let content = step.shown.join("\n") + "\n";
                    std::fs::write(dir.path().join(file.trim()), content).unwrap();
                }
                let script = format!("{}\n{}", exports.join("\n"), step.command);
                let out = Command::new("bash")
                    .args(["-c", &script])
                    .current_dir(dir.path())
                    .env("KUBECACHEDIR", &cache)
                    .env("HOME", dir.path())
                    .output()
                    .expect("bash");
                commands += 1;
                if step.shown.is_empty() {
                    continue;
                }
                let printed = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let printed: Vec<Vec<String>> = printed
                    .lines()
                    .filter(|line| !line.trim().is_empty())
                    .map(words)
                    .collect();
                let shown: Vec<Vec<String>> = step
                    .shown
                    .iter()
                    .filter(|line| !line.trim().is_empty())
                    .map(|line| words(line))
                    .collect();
                assert_eq!(
                    printed, shown,
                    "{page}: `$ {}` printed what the page does not show",
                    step.command
                );
            }
        }
    }
    assert!(commands >= 15, "only {commands} session commands ran");
}

#[test]
fn every_server_command_line_in_the_docs_parses() {
    let mut checked = 0;
    for (page, text) in pages() {
        for block in blocks(&text, "sh") {
            for line in &block {
                let line = line.split(" #").next().unwrap_or(line).trim();
                let Some(args) = line.strip_prefix("cargo run --release") else {
                    continue;
                };
                let args: Vec<&str> = args
                    .trim()
                    .strip_prefix("--")
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect();
                let out = Command::new(env!("CARGO_BIN_EXE_farm-apiserver"))
                    .args(&args)
                    .arg("--help")
                    .output()
                    .expect("farm-apiserver --help");
                assert!(
                    out.status.success(),
                    "{page}: `{line}`: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} server command lines found");
}

/// The server's own configuration files the docs show (an audit Policy, a
/// TracingConfiguration) are files the server starts with, under the flag the page names.
#[test]
fn every_server_configuration_in_the_docs_loads() {
    let mut loaded = 0;
    for (page, text) in pages() {
        for block in blocks(&text, "yaml") {
            let yaml = block.join("\n") + "\n";
            let flag = if yaml.contains("apiVersion: audit.k8s.io/v1\nkind: Policy") {
                "--audit-policy-file"
            } else if yaml.contains("kind: TracingConfiguration") {
                "--tracing-config-file"
            } else {
                continue;
            };
            assert!(
                text.contains(flag),
                "{page} shows a file for {flag} without naming it"
            );
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("config.yaml");
            std::fs::write(&file, &yaml).unwrap();
            let certs = dir.path().join("certs");
            let log = dir.path().join("audit.log");
            let mut args = vec![
                "--cert-dir".into(),
                certs.into_os_string(),
                flag.into(),
                file.into_os_string(),
            ];
            if flag == "--audit-policy-file" {
                args.extend(["--audit-log-path".into(), log.into_os_string()]);
            }
            // Running::start fails the test when the server exits instead of serving.
            let server = Running::start(args);
            assert!(server.addr.port() > 0, "{page}: {flag}");
            loaded += 1;
        }
    }
    assert!(loaded >= 2, "only {loaded} configuration files found");
}

/// Every ```sh line that runs the project's own tests or benchmarks names what exists: `cargo
/// test --test it NAME` a module of the test crate, `bench/SCRIPT --flag` a script that takes
/// that flag (`bench/run`'s are farm-bench's `run` flags).
#[test]
fn every_test_and_bench_command_in_the_docs_names_what_exists() {
    let tests = std::fs::read_to_string(root().join("tests/it/main.rs")).expect("main.rs");
    let bench_flags = std::fs::read_to_string(root().join("bench/src/main.rs")).expect("bench");
    let mut checked = 0;
    for (page, text) in pages() {
        for block in blocks(&text, "sh") {
            for line in &block {
                let line = line.split(" #").next().unwrap_or(line).trim();
                // Environment assignments before the command.
                let words: Vec<&str> = line
                    .split_whitespace()
                    .skip_while(|word| word.contains('=') && !word.starts_with('-'))
                    .collect();
                match words.as_slice() {
                    ["cargo", "test", "--test", "it", name, ..] if !name.starts_with('-') => {
                        let module = name.split("::").next().unwrap_or(name);
                        assert!(
                            tests.contains(&format!("mod {module};")),
                            "{page}: `{line}`: tests/it has no module {module}"
                        );
                    }
                    [script, args @ ..] if script.starts_with("bench/") => {
                        let file = root().join(script);
                        assert!(file.is_file(), "{page}: `{line}`: no {script}");
                        let own = std::fs::read_to_string(&file).expect("script");
                        for flag in args.iter().filter(|a| a.starts_with("--")) {
                            let flag = flag.split('=').next().unwrap_or(flag);
                            let known = if *script == "bench/run" {
                                let field = flag.trim_start_matches('-').replace('-', "_");
                                bench_flags.contains(&format!("    {field}: "))
                            } else {
                                own.contains(flag)
                            };
                            assert!(known, "{page}: `{line}`: {script} takes no {flag}");
                        }
                    }
                    _ => continue,
                }
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} test and bench command lines found"
    );
}
