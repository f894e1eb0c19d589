//! Bakes the git commit into the binary as `GIT_COMMIT` for `-version`.
//!
//! `GITLAB_HAPROXY_AGENT_BUILD_COMMIT` (for release builds outside a
//! checkout) wins; else `git rev-parse --short=12 HEAD` when the package root
//! is the top of a git checkout (or worktree); else `unknown`. Never fails the
//! build. Reruns only when HEAD moves (HEAD, its reflog, the branch ref,
//! packed-refs), not on every source change.

use std::path::{Path, PathBuf};
use std::process::Command;

const COMMIT_VAR: &str = "GITLAB_HAPROXY_AGENT_BUILD_COMMIT";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed={COMMIT_VAR}");
    println!("cargo:rerun-if-env-changed=GITLAB_HAPROXY_AGENT_VERSION");
    let commit = std::env::var(COMMIT_VAR)
        .ok()
        .and_then(|v| sanitize(v.trim()))
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=GIT_COMMIT={commit}");
}

/// Something that is safe to print in a version line.
fn sanitize(v: &str) -> Option<String> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b));
    ok.then(|| v.to_string())
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn from_git() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let top = PathBuf::from(git(&dir, &["rev-parse", "--show-toplevel"])?);
    // A source tree unpacked inside some other repository is not a checkout
    // of this project: its HEAD would name the wrong commit.
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let mut watch = vec![
        "HEAD".to_string(),
        "logs/HEAD".to_string(),
        "packed-refs".to_string(),
    ];
    if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in &watch {
        // --git-path resolves worktrees: HEAD is per worktree, refs are shared.
        if let Some(path) = git(&dir, &["rev-parse", "--git-path", name]) {
            let path = dir.join(path);
            // A path that does not exist would make cargo rerun every time.
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    git(&dir, &["rev-parse", "--short=12", "HEAD"]).and_then(|c| sanitize(&c))
}
