//! The release archive, end to end: `scripts/release.sh` builds this
//! machine's archive into a temporary `DIST_DIR`, then the test checks
//! `checksums.txt` against the archive, unpacks it with `tar`, checks the
//! files every archive ships, and runs the unpacked binary's `-version`.
//!
//! The release build uses its own `CARGO_TARGET_DIR` (`target/release-test`)
//! so it never contends with the test build's target dir. It takes a release
//! build (a minute or two the first time).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VERSION: &str = "0.0.0-test";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no release archive for architecture {other}"),
    }
}

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("gha-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn release_archive_unpacks_and_runs() {
    let tmp = TempDir::new("release");
    let dist = tmp.0.join("dist");
    let out = run(Command::new(root().join("scripts/release.sh"))
        .args(["--version", VERSION])
        .current_dir(root())
        .env("CARGO_TARGET_DIR", root().join("target/release-test"))
        .env("DIST_DIR", &dist)
        .env_remove("CI_COMMIT_TAG"));
    let log = String::from_utf8_lossy(&out.stdout);

    let dir = format!("gitlab-haproxy-agent_{VERSION}_linux_{}", host_arch());
    let archive = dist.join(format!("{dir}.tar.gz"));
    assert!(
        archive.is_file(),
        "no {} after release.sh:\n{log}",
        archive.display()
    );

    // checksums.txt: exactly one line, in sha256sum's format, for the archive.
    let sums = std::fs::read_to_string(dist.join("checksums.txt")).expect("checksums.txt");
    assert_eq!(
        sums,
        format!("{}  {dir}.tar.gz\n", sha256(&archive)),
        "checksums.txt"
    );
    run(Command::new("sha256sum")
        .args(["--check", "--strict", "checksums.txt"])
        .current_dir(&dist));

    // One top-level directory holding everything, owned by root (0/0).
    let listing = run(Command::new("tar")
        .arg("-tzvf")
        .arg(&archive)
        .env("TZ", "UTC"));
    let listing = String::from_utf8(listing.stdout).unwrap();
    for line in listing.lines() {
        let name = line.split_whitespace().last().unwrap();
        assert!(
            name == format!("{dir}/") || name.starts_with(&format!("{dir}/")),
            "outside {dir}/: {line}"
        );
        assert!(line.contains(" 0/0 "), "not owned by 0/0: {line}");
    }

    let unpacked = tmp.0.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked));
    let top = unpacked.join(&dir);
    for f in [
        "gitlab-haproxy-agent",
        "README.md",
        "LICENSE",
        "packaging/gitlab-haproxy-agent.service",
        "packaging/gitlab-haproxy-agent.env",
    ] {
        assert!(
            top.join(f).is_file(),
            "{f} missing from {dir}.tar.gz:\n{listing}"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(top.join("gitlab-haproxy-agent"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "binary mode");

    let out = run(Command::new(top.join("gitlab-haproxy-agent")).arg("-version"));
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(
        line.starts_with(&format!("gitlab-haproxy-agent {VERSION} (")),
        "-version of the unpacked binary printed {line:?}: the version release.sh passes as \
         GITLAB_HAPROXY_AGENT_VERSION must win over Cargo.toml's"
    );
}

/// Same sources, same SOURCE_DATE_EPOCH, same archive bytes: only the build
/// itself may differ, so repacking the unchanged binary changes nothing.
#[test]
fn release_archive_is_reproducible() {
    let tmp = TempDir::new("repro");
    let mut sums = Vec::new();
    for i in 0..2 {
        let dist = tmp.0.join(format!("dist{i}"));
        run(Command::new(root().join("scripts/release.sh"))
            .args(["--version", VERSION])
            .current_dir(root())
            .env("CARGO_TARGET_DIR", root().join("target/release-test"))
            .env("DIST_DIR", &dist)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .env_remove("CI_COMMIT_TAG"));
        sums.push(std::fs::read_to_string(dist.join("checksums.txt")).unwrap());
    }
    assert_eq!(sums[0], sums[1], "two runs packed different archives");
}

#[test]
fn release_script_rejects_bad_input_with_one_line() {
    for (args, want) in [
        (
            &["--version", "1.0 beta"][..],
            "release.sh: invalid version \"1.0 beta\"",
        ),
        (
            &["--target", "x86_64-apple-darwin"],
            "release.sh: unsupported target x86_64-apple-darwin",
        ),
        (&["--bogus"], "release.sh: unknown argument: --bogus"),
        (&["--version"], "release.sh: --version needs a value"),
    ] {
        let out = Command::new(root().join("scripts/release.sh"))
            .args(args)
            .current_dir(root())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with(want), "{args:?}: {err}");
    }
}
