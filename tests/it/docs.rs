//! README.md and docs/ against the code: each Rust snippet is code the build compiles (it appears
//! line for line in a source file), each link leads to a file and heading that exist, and README
//! stays a front door (#51: at most 250 lines).

use std::path::{Path, PathBuf};

pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page of docs/.
pub(crate) fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 9, "docs/ has {} pages", docs.len());
    pages.extend(docs);
    pages
}

/// The fenced blocks of `text` whose info string is `language`, as lines, each unindented by
/// its fence's indentation (a block inside a list item).
pub(crate) fn blocks(text: &str, language: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut current: Option<(usize, Vec<String>)> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(info)) if info.trim() == language => current = Some((indent, Vec::new())),
            (Some(_), Some(_)) => found.extend(current.take().map(|(_, lines)| lines)),
            (Some((indent, lines)), None) => {
                lines.push(line.get(*indent..).unwrap_or(line.trim_start()).to_owned());
            }
            (None, _) => {}
        }
    }
    found
}

/// `text`'s lines, trimmed, empty ones left out: a snippet indented in a list matches its code.
fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

fn rust_sources(dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(std::fs::read_to_string(&path).expect("source"));
        }
    }
}

#[test]
fn every_rust_snippet_is_compiled_code() {
    let mut sources = Vec::new();
    for dir in ["src", "aggregated-apiserver/src", "tests/it"] {
        rust_sources(&root().join(dir), &mut sources);
    }
    let sources: Vec<Vec<String>> = sources.iter().map(|s| lines(s)).collect();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        for snippet in blocks(&text, "rust") {
            let snippet = lines(&snippet.join("\n"));
            let compiled = sources.iter().any(|source| {
                source
                    .windows(snippet.len())
                    .any(|w| w == snippet.as_slice())
            });
            assert!(
                compiled,
                "{}: this snippet is not in any source file the build compiles:\n{}",
                page.display(),
                snippet.join("\n")
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} Rust snippets found");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_link_leads_to_a_file_and_heading_that_exist() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("dir");
        for (start, _) in text.match_indices("](") {
            let rest = &text[start + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, heading) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            assert!(
                file.exists(),
                "{}: link to {target}: no such file",
                page.display()
            );
            if !heading.is_empty() {
                let linked = std::fs::read_to_string(&file).expect("linked page");
                let headings: Vec<String> = linked
                    .lines()
                    .filter_map(|line| line.strip_prefix('#'))
                    .map(|line| anchor(line.trim_start_matches('#')))
                    .collect();
                assert!(
                    headings.iter().any(|h| h == heading),
                    "{}: link to {target}: no such heading in {}",
                    page.display(),
                    file.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} links found");
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let count = readme.lines().count();
    assert!(
        count <= 250,
        "README.md is {count} lines; the rest belongs in docs/"
    );
    // Its two commands, as .ci/run and a newcomer run them.
    assert!(readme.contains("```sh\ncargo run --release\n```"));
    assert!(readme.contains("```sh\ncargo test\n```"));
}
