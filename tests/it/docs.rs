//! The documentation holds together (issue 34): every relative link and
//! every `#anchor` in README.md and docs/*.md resolves (anchors as GitHub
//! and GitLab make them from headings), and the flags table of
//! docs/flags.md is the agent's own `-help`: every flag, with its default,
//! and no other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, as paths relative to the repository.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// A heading's anchor: lowercased, punctuation but `-` and `_` dropped,
/// spaces made `-` (GitHub's and GitLab's rule).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// Every anchor a page's headings make (a repeated heading gets `-1`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let s = slug(&line[hashes..]);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every `](target)` of a page's prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(root().join(&page)).unwrap();
        let dir = page.parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.starts_with('<') {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let full = root().join(&file);
            if !full.exists() {
                broken.push(format!(
                    "{}: {target}: no {}",
                    page.display(),
                    file.display()
                ));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let into = std::fs::read_to_string(&full).unwrap_or_default();
            if !anchors(&into).contains(anchor) {
                broken.push(format!(
                    "{}: {target}: no heading #{anchor} in {}",
                    page.display(),
                    file.display()
                ));
            }
        }
    }
    assert!(
        checked > 25,
        "only {checked} links found: is the scan right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_landing_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < 400,
        "README.md has {lines} lines: move the detail to docs/"
    );
    for page in pages().iter().skip(1) {
        let name = page.strip_prefix("docs").unwrap().to_str().unwrap();
        assert!(
            readme.contains(&format!("(docs/{})", name.trim_start_matches('/'))),
            "README.md does not link {}",
            page.display()
        );
    }
}

/// `(flag, default)` of every flag the agent's `-help` lists.
fn help_flags() -> Vec<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_gitlab-haproxy-agent"))
        .arg("-help")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let flag = l.strip_prefix('-')?.split_whitespace().next()?;
            let default = l.split_once("(default \"")?.1.split_once('"')?.0;
            Some((format!("-{flag}"), default.to_owned()))
        })
        .collect()
}

#[test]
fn the_flags_table_is_the_agents_help() {
    let help = help_flags();
    assert!(help.len() > 20, "{help:?}");
    let page = std::fs::read_to_string(root().join("docs/flags.md")).unwrap();
    let mut table = BTreeMap::new();
    for line in page.lines().filter(|l| l.starts_with("| `-")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        table.insert(cells[1].trim_matches('`').to_owned(), cells[2].to_owned());
    }
    for (flag, default) in &help {
        let Some(cell) = table.remove(flag) else {
            panic!("docs/flags.md has no row for {flag}");
        };
        let ok = match default.as_str() {
            "" => cell.is_empty() || cell.starts_with("empty"),
            "false" => cell == "`false`" || cell == "off",
            d => cell == format!("`{d}`"),
        };
        assert!(
            ok,
            "{flag}: docs/flags.md says {cell:?}, -help says {default:?}"
        );
    }
    table.remove("-h`, `-help`, `-version");
    assert!(
        table.is_empty(),
        "rows for flags the agent does not have: {table:?}"
    );
}
