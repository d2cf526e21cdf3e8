//! The book (`book/`) against the binary: its reference pages are what `turnpike reference`
//! prints now (a renamed flag fails here until the page is regenerated), every manifest and
//! script it shows (code blocks marked `toml title=NAME`) loads as an app, every shell snippet
//! (code blocks marked `sh`, unless also `no-run`) runs, and `mdbook build` succeeds.
//!
//! A page's snippets run in order as one script, in a fresh directory holding the page's
//! titled files, with `turnpike` on the `PATH` and in a network namespace of their own (so a
//! snippet's `turnpike serve &` listens on the documented default ports): what a reader types,
//! byte for byte.

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
    for (page, file) in [
        ("cli", "cli.md"),
        ("config", "config.md"),
        ("entries", "entries.md"),
        ("errors", "errors.md"),
        ("api", "api.md"),
    ] {
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

/// Builds the book with mdBook into a fresh directory.
fn build_book() -> tempfile::TempDir {
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
    out_dir
}

/// A raw `GET path` (sent as written: an HTTP client would normalise `..` and `%2e%2e` away).
async fn raw_get(base: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// The book builds, and `turnpike serve --book` serves it at `/book/`, where the console's help
/// link points: its pages sandboxed (their scripts cannot reach the console's token), nothing
/// outside the built directory. Without `--book`, `/book/` says where the book is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_book_builds_and_serve_shows_it_as_the_consoles_help() {
    let built = build_book();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "not the book's").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        built.path().join("linked.txt"),
    )
    .unwrap();
    let book_dir = built.path().display().to_string();
    let server =
        turnpike_tests::edge::Server::start(&binary(), None, &["--book", &book_dir], false)
            .unwrap();
    let http = reqwest::Client::new();
    let console = http
        .get(format!("{}/", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        console.contains("href=\"/book/\""),
        "the console links its help to the book"
    );
    let page = http
        .get(format!("{}/book/concepts/record.html", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.starts_with("sandbox allow-scripts"), "{policy}");
    assert!(!policy.contains("allow-same-origin"), "{policy}");
    assert_eq!(page.headers()["access-control-allow-origin"], "*");
    let etag = page.headers()["etag"].to_str().unwrap().to_owned();
    assert!(page.text().await.unwrap().contains("batch one"));
    let again = http
        .get(format!("{}/book/concepts/record.html", server.base))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304, "revalidated by its ETag");
    // An API error's `type` is its code's place in the reference this server serves.
    let missing = server
        .client(turnpike_tests::edge::ALICE)
        .get("/v1/conversations/conv_01M92G275KHV6Q5A82PFW70EBR")
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    let explained = missing.body["type"].as_str().unwrap().to_owned();
    assert_eq!(explained, "/book/reference/errors.html#not_found");
    let (path, anchor) = explained.split_once('#').unwrap();
    let reference = http
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        reference.contains(&format!("id=\"{anchor}\"")),
        "{anchor} has no anchor"
    );
    let (status, first) = raw_get(&server.base, "/book/").await;
    assert_eq!(status, 200);
    assert!(first.contains("Turnpike"), "{first}");
    for bad in [
        "/book/../Cargo.toml",
        "/book/%2e%2e/%2e%2e/etc/passwd",
        "/book/reference/..%2f..%2fsecret.txt",
        "/book/linked.txt",
        "/book/%2Fetc%2Fpasswd",
        "/book/missing.html",
    ] {
        let (status, text) = raw_get(&server.base, bad).await;
        assert!(status == 404 || status == 400, "{bad}: {status}\n{text}");
        assert!(
            !text.contains("not the book's") && !text.contains("root:"),
            "{bad}"
        );
    }
    drop(server);
    let bare = turnpike_tests::edge::Server::start(&binary(), None, &[], false).unwrap();
    let (status, text) = raw_get(&bare.base, "/book/").await;
    assert_eq!(status, 200);
    assert!(text.contains("does not serve the book"), "{text}");
    assert!(text.contains("book/src/SUMMARY.md"), "{text}");
}

/// The shell snippets of a page that run (```` ```sh ````, not marked `no-run`), in order.
fn shell_blocks(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Inside a block: `Some(text)` for a snippet that runs, `None` for any other block.
    let mut inside: Option<Option<String>> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (inside.take(), fence) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                let runs = words.next() == Some("sh") && !words.any(|w| w == "no-run");
                inside = Some(runs.then(String::new));
            }
            (None, None) => {}
            (Some(block), Some(_)) => out.extend(block),
            (Some(block), None) => {
                inside = Some(block.map(|mut text| {
                    text.push_str(line);
                    text.push('\n');
                    text
                }));
            }
        }
    }
    out
}

/// Runs a page's snippets as a reader would (see the module docs); the script's output when it
/// fails.
fn run_snippets(page: &Path, markdown: &str) -> Result<(), String> {
    let blocks = shell_blocks(markdown);
    if blocks.is_empty() {
        return Ok(());
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in titled_blocks(markdown) {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    // Whatever a snippet starts in the background stops with the script.
    let mut script = String::from(
        "set -euo pipefail\n\
         trap 'status=$?; kill $(jobs -p) 2>/dev/null || true; wait || true; exit $status' EXIT\n\
         ip link set lo up\n",
    );
    for block in &blocks {
        script.push_str(block);
    }
    let bin = binary();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .args(["300", "unshare", "-rn", "bash", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("HOME", dir.path())
        .env_remove("TURNPIKE_DATA_DIR")
        .env_remove("TURNPIKE_URL")
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: its snippets failed ({}):\n--- script\n{script}--- stdout\n{}--- stderr\n{}",
            page.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_shell_snippet_in_the_book_runs() {
    let mut all = Vec::new();
    pages(&book().join("src"), &mut all);
    all.sort();
    let mut ran = 0;
    for page in all {
        let markdown = std::fs::read_to_string(&page).unwrap();
        ran += shell_blocks(&markdown).len();
        run_snippets(&page, &markdown).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(ran >= 2, "the book runs {ran} snippets");
}

#[test]
fn a_snippet_with_a_renamed_flag_fails() {
    // The check above would catch a page whose commands no longer fit the binary.
    let good =
        "```sh\nturnpike conversation create --actor local:me --app demo --agent echo\n```\n";
    run_snippets(Path::new("good.md"), good).unwrap_or_else(|e| panic!("{e}"));
    let renamed = good.replace("--agent", "--agent-name");
    let failed = run_snippets(Path::new("bad.md"), &renamed).expect_err("an unknown flag fails");
    assert!(failed.contains("--agent-name"), "{failed}");
    let skipped = "```sh no-run\nfalse\n```\n```toml\n[x]\n```\n";
    assert!(shell_blocks(skipped).is_empty());
}

/// Every crate of the workspace says, in its crate-level docs, which pages of the book it
/// implements; each page named is there.
#[test]
fn every_crates_docs_name_pages_of_the_book_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("the workspace's members");
    let crates: Vec<&str> = members.split('"').skip(1).step_by(2).collect();
    assert!(crates.len() >= 10, "{crates:?}");
    for krate in crates {
        let lib = std::fs::read_to_string(root.join(krate).join("src/lib.rs")).unwrap();
        let docs: String = lib
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let line = docs
            .lines()
            .find(|l| l.starts_with("//! The book: "))
            .unwrap_or_else(|| panic!("{krate}'s docs name no page of the book"));
        let named: Vec<&str> = line
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|p| p.starts_with("book/"))
            .collect();
        assert!(!named.is_empty(), "{krate}: {line}");
        for page in named {
            assert!(
                root.join(page).is_file(),
                "{krate} names {page}, which is not there"
            );
        }
    }
}
