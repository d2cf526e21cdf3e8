//! The book (`book/`) against the binary: its reference pages are what `turnpike reference`
//! prints now (a renamed flag fails here until the page is regenerated), every manifest and
//! script it shows (code blocks marked `toml title=NAME`) loads as an app, and `mdbook build`
//! succeeds.

use std::path::{Path, PathBuf};
use std::process::Command;

fn book() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("book")
}

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

#[test]
fn the_reference_pages_are_what_the_binary_prints() {
    for (page, file) in [("cli", "cli.md"), ("config", "config.md")] {
        let out = Command::new(binary())
            .args(["reference", page])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8(out.stdout).unwrap();
        let path = book().join("src/reference").join(file);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if printed != committed {
            let line = printed
                .lines()
                .zip(committed.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(printed.lines().count().min(committed.lines().count()));
            panic!(
                "{} differs from `turnpike reference {page}` (first at line {}): regenerate it with\n  cargo run -- reference {page} > book/src/reference/{file}",
                path.display(),
                line + 1
            );
        }
    }
}

/// The `toml title=NAME` code blocks of a page, as (name, text).
fn titled_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().starts_with("```");
        if let Some((name, mut text)) = current.take() {
            if fence {
                out.push((name, text));
            } else {
                text.push_str(line);
                text.push('\n');
                current = Some((name, text));
            }
        } else if let Some(info) = line.trim_start().strip_prefix("```toml") {
            current = info
                .split_whitespace()
                .find_map(|w| w.strip_prefix("title="))
                .map(|name| (name.to_owned(), String::new()));
        }
    }
    out
}

fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            pages(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

#[test]
fn every_manifest_in_the_book_loads() {
    let mut all = Vec::new();
    pages(&book().join("src"), &mut all);
    let mut manifests = 0;
    for page in all {
        let blocks = titled_blocks(&std::fs::read_to_string(&page).unwrap());
        if blocks.is_empty() {
            continue;
        }
        // A page's files together, as an apps folder (a manifest names its script beside it).
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in &blocks {
            assert!(
                !name.contains('/') && !name.is_empty(),
                "{}: {name}",
                page.display()
            );
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let apps = turnpike_worker::Apps::new()
            .load_dir(dir.path(), &turnpike_worker::Registry::builtin())
            .unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let _ = apps;
        manifests += blocks
            .iter()
            .filter(|(n, _)| !n.ends_with(".script.toml"))
            .count();
    }
    assert!(manifests >= 4, "the book shows {manifests} manifests");
}

#[test]
fn a_broken_manifest_in_a_page_is_found() {
    // The check above would catch a page whose manifest no longer fits.
    let page = "```toml title=bad.toml\napp = \"bad\"\n[agents.x]\nprovider = \"nonesuch\"\n```\n";
    let blocks = titled_blocks(page);
    assert_eq!(blocks.len(), 1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(&blocks[0].0), &blocks[0].1).unwrap();
    let refused = turnpike_worker::Apps::new()
        .load_dir(dir.path(), &turnpike_worker::Registry::builtin())
        .err()
        .expect("an unknown provider is refused");
    assert!(refused.contains("provider"), "{refused}");
}

#[test]
fn the_book_builds() {
    let mdbook = std::env::var("TURNPIKE_MDBOOK").unwrap_or_else(|_| "mdbook".into());
    let out_dir = tempfile::tempdir().unwrap();
    let built = Command::new(&mdbook)
        .arg("build")
        .arg(book())
        .arg("--dest-dir")
        .arg(out_dir.path())
        .output()
        .unwrap_or_else(|e| {
            panic!("no mdbook ({mdbook}: {e}): run `scripts/services install tests`")
        });
    assert!(
        built.status.success(),
        "mdbook build failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(out_dir.path().join("reference/cli.html").is_file());
}
