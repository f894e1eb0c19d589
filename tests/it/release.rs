//! The release archive, end to end: `scripts/release.sh` builds this
//! machine's archive into a temporary `DIST_DIR`, then the test checks
//! the versioned checksums file against the archive, unpacks it with `tar`, checks the
//! files every archive ships, and runs the unpacked binary's `-version`.
//!
//! The release binary is linked against glibc 2.17 symbol versions
//! (cargo-zigbuild): the test reads the highest `GLIBC_x.y` version it needs
//! from `objdump -T` (or `readelf`) and fails on anything newer, as a plain
//! `cargo build --release` on a current distribution gives (2.34 or later).
//!
//! The release build uses its own `CARGO_TARGET_DIR` (`target/release-test`)
//! so it never contends with the test build's target dir. It takes a release
//! build (a minute or two the first time), and zig and cargo-zigbuild
//! (`.ci/run` installs them; `scripts/release.sh` names the commands).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VERSION: &str = "0.0.0-test";

/// The checksums file of [`VERSION`]: goreleaser's name, versioned.
fn sums_name() -> String {
    format!("gitlab-haproxy-agent_{VERSION}_checksums.txt")
}

/// The oldest glibc the release binary must run on (README, Install).
const GLIBC_FLOOR: [u32; 2] = [2, 17];

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

/// Every `GLIBC_x.y[.z]` symbol version the dynamic symbols of `binary`
/// need, from `objdump -T`, else `readelf --dyn-syms` (both print
/// `GLIBC_2.17`-style names; `GLIBC_PRIVATE` is no version and is skipped).
fn glibc_versions(binary: &Path) -> Vec<Vec<u32>> {
    let tools: [(&str, &[&str]); 2] = [("objdump", &["-T"]), ("readelf", &["--dyn-syms", "-W"])];
    let mut text = None;
    for (tool, args) in tools {
        let mut cmd = Command::new(tool);
        cmd.args(args).arg(binary);
        match cmd.output() {
            Ok(out) => {
                assert!(
                    out.status.success(),
                    "{cmd:?} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                text = Some(String::from_utf8_lossy(&out.stdout).into_owned());
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("cannot run {tool}: {e}"),
        }
    }
    let text = text.expect("neither objdump nor readelf on PATH (Debian package binutils)");
    let mut out: Vec<Vec<u32>> = text
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let v: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let parts: Vec<u32> = v
                .trim_end_matches('.')
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<_>>()?;
            (parts.len() >= 2).then_some(parts)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn assert_runs_on_glibc_floor(binary: &Path) {
    let versions = glibc_versions(binary);
    let max = versions.last().unwrap_or_else(|| {
        panic!(
            "{}: no GLIBC_ symbol versions (not a glibc binary?)",
            binary.display()
        )
    });
    let show = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(".");
    assert!(
        max.as_slice() <= &GLIBC_FLOOR[..],
        "{} needs GLIBC_{}, newer than the floor GLIBC_{} (all: {}): build it with \
         scripts/release.sh (cargo zigbuild --target <triple>.{}), not plain cargo build",
        binary.display(),
        show(max),
        show(&GLIBC_FLOOR),
        versions
            .iter()
            .map(|v| show(v))
            .collect::<Vec<_>>()
            .join(" "),
        show(&GLIBC_FLOOR),
    );
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

    // The checksums file: exactly one line, in sha256sum's format, for the archive.
    let sums = std::fs::read_to_string(dist.join(sums_name())).expect("the checksums file");
    assert_eq!(
        sums,
        format!("{}  {dir}.tar.gz\n", sha256(&archive)),
        "{}",
        sums_name()
    );
    run(Command::new("sha256sum")
        .args(["--check", "--strict", &sums_name()])
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
        "docs/incident.md",
        "docs/flags.md",
        "LICENSE",
        "packaging/gitlab-haproxy-agent.service",
        "packaging/gitlab-haproxy-agent.env",
        "packaging/haproxy.service.d/gitlab-haproxy-agent.conf",
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

    // Runs on RHEL/Rocky 8, Ubuntu 20.04, Debian 11 and older: glibc 2.17+.
    assert_runs_on_glibc_floor(&top.join("gitlab-haproxy-agent"));
    assert_names_no_build_path(&top.join("gitlab-haproxy-agent"));
}

/// The shipped binary carries no debug info and names no path of the
/// machine that built it (the checkout, CARGO_HOME, the target directory):
/// where a tag is built must not change its bytes (scripts/ci/reproducible.sh
/// compares two whole builds; this is the cheap half, on every run).
fn assert_names_no_build_path(binary: &Path) {
    let bytes = std::fs::read(binary).unwrap();
    let home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    let paths = [
        root().display().to_string(),
        home,
        root().join("target/release-test").display().to_string(),
    ];
    for path in paths {
        let n = bytes
            .windows(path.len())
            .filter(|w| *w == path.as_bytes())
            .count();
        assert_eq!(n, 0, "{} names {path} {n} times", binary.display());
    }
    // The section headers (std's backtrace code holds ".debug_info" as a
    // string, so the bytes alone cannot tell).
    let out = run(Command::new("readelf").args(["-S", "-W"]).arg(binary));
    let sections = String::from_utf8_lossy(&out.stdout);
    let debug: Vec<&str> = sections
        .lines()
        .filter(|l| l.contains(" .debug_"))
        .collect();
    assert!(
        debug.is_empty(),
        "{} has debug info: {debug:?}",
        binary.display()
    );
}

/// The checksums file is per version and lists every archive of that version in
/// DIST_DIR: one left by an earlier run (another architecture) stays listed,
/// the rebuilt one's stale line is replaced, another version's is dropped.
#[test]
fn checksums_list_every_archive_of_the_version() {
    let tmp = TempDir::new("sums");
    let dist = tmp.0.join("dist");
    std::fs::create_dir_all(&dist).unwrap();
    let host = format!(
        "gitlab-haproxy-agent_{VERSION}_linux_{}.tar.gz",
        host_arch()
    );
    let other_arch = if host_arch() == "amd64" {
        "arm64"
    } else {
        "amd64"
    };
    let other = format!("gitlab-haproxy-agent_{VERSION}_linux_{other_arch}.tar.gz");
    let old_version = "gitlab-haproxy-agent_0.0.0-old_linux_amd64.tar.gz";
    std::fs::write(dist.join(&other), b"an earlier run's archive").unwrap();
    std::fs::write(dist.join(&host), b"stale").unwrap();
    std::fs::write(dist.join(old_version), b"another version").unwrap();
    let zeros = "0".repeat(64);
    std::fs::write(
        dist.join(sums_name()),
        format!("{zeros}  {host}\n{zeros}  {old_version}\n"),
    )
    .unwrap();

    run(Command::new(root().join("scripts/release.sh"))
        .args(["--version", VERSION])
        .current_dir(root())
        .env("CARGO_TARGET_DIR", root().join("target/release-test"))
        .env("DIST_DIR", &dist)
        .env_remove("CI_COMMIT_TAG"));

    let sums = std::fs::read_to_string(dist.join(sums_name())).unwrap();
    // One line per archive, in file name order (as the shell's glob).
    let mut want = [
        (&host, sha256(&dist.join(&host))),
        (&other, sha256(&dist.join(&other))),
    ];
    want.sort();
    let want: String = want
        .iter()
        .map(|(name, sum)| format!("{sum}  {name}\n"))
        .collect();
    assert_eq!(sums, want, "{}", sums_name());
    run(Command::new("sha256sum")
        .args(["--check", "--strict", &sums_name()])
        .current_dir(&dist));
}

/// Without cargo-zigbuild (or zig) the script stops before building, with
/// one line that says how to install it.
#[test]
fn release_script_names_the_missing_build_tool() {
    let tmp = TempDir::new("notools");
    // PATH is one directory holding only what the script runs before its
    // tool check (cargo and rustc are the toolchain's own binaries, not
    // rustup's proxies), and CARGO_HOME is empty: cargo finds no
    // cargo-zigbuild wherever it is installed on this machine.
    let bin = tmp.0.join("bin");
    let cargo_home = tmp.0.join("cargo-home");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&cargo_home).unwrap();
    let cargo = PathBuf::from(env!("CARGO"));
    let mut tools = vec![
        ("cargo".to_string(), cargo.clone()),
        ("rustc".to_string(), cargo.with_file_name("rustc")),
    ];
    let path = std::env::var_os("PATH").unwrap_or_default();
    for tool in ["bash", "dirname", "awk", "sed", "tar", "gzip", "sha256sum"] {
        let found = std::env::split_paths(&path)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{tool} not on PATH"));
        tools.push((tool.to_string(), found));
    }
    for (name, target) in &tools {
        std::os::unix::fs::symlink(target, bin.join(name)).unwrap();
    }
    let out = Command::new(root().join("scripts/release.sh"))
        .current_dir(root())
        .env("PATH", &bin)
        .env("CARGO_HOME", &cargo_home)
        .env_remove("CI_COMMIT_TAG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "release.sh: cargo-zigbuild not found: cargo install --locked cargo-zigbuild"
        ),
        "{err}"
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
        sums.push(std::fs::read_to_string(dist.join(sums_name())).unwrap());
    }
    assert_eq!(sums[0], sums[1], "two runs packed different archives");
}

/// The release built from two checkouts at different paths, with different
/// CARGO_HOME and target directories, is the same bytes (what gitlab.com
/// and the push mirror publish for one tag). Two release builds: minutes;
/// CI's reproducible-build job runs the script itself, for both targets.
#[test]
#[ignore = "two release builds; run by CI's reproducible-build job (scripts/ci/reproducible.sh)"]
fn two_checkouts_build_the_same_bytes() {
    let out = run(&mut Command::new(root().join("scripts/ci/reproducible.sh")));
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("==> identical"), "{log}");
}

/// The checksums file is signed with an Ed25519 key and the signature
/// checks against the public key with plain openssl; a key that is not the
/// release key fails the job with one line, leaving no signature.
#[test]
fn the_checksums_signature_verifies_and_a_wrong_key_fails() {
    let tmp = TempDir::new("sign");
    let dist = tmp.0.join("dist");
    std::fs::create_dir_all(&dist).unwrap();
    let key = |name: &str| {
        let path = tmp.0.join(name);
        run(Command::new("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(&path));
        path
    };
    let (release, other) = (key("release.pem"), key("other.pem"));
    let public = tmp.0.join("release.pub.pem");
    run(Command::new("openssl")
        .arg("pkey")
        .arg("-in")
        .arg(&release)
        .args(["-pubout", "-out"])
        .arg(&public));
    let sums = dist.join(sums_name());
    std::fs::write(&sums, format!("{}  x.tar.gz\n", "0".repeat(64))).unwrap();
    let sign = |key: &Path| {
        Command::new(root().join("scripts/ci/sign-checksums.sh"))
            .arg(&dist)
            .env("RELEASE_SIGNING_KEY", key)
            .env("RELEASE_SIGNING_PUBLIC_KEY", &public)
            .output()
            .unwrap()
    };
    let sig = dist.join(format!("{}.sig", sums_name()));
    let out = sign(&other);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is not the release key"), "{err}");
    assert!(!sig.exists(), "a signature by the wrong key was left");

    assert!(sign(&release).status.success());
    let verify = |file: &Path| {
        Command::new("openssl")
            .args(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey"])
            .arg(&public)
            .arg("-in")
            .arg(file)
            .arg("-sigfile")
            .arg(&sig)
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(verify(&sums), "the signature does not verify");
    let tampered = tmp.0.join("tampered.txt");
    std::fs::write(&tampered, format!("{}  x.tar.gz\n", "1".repeat(64))).unwrap();
    assert!(!verify(&tampered), "a changed checksums file verifies");
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
        (
            // Only the floor: a newer glibc suffix would break old systems.
            &["--target", "x86_64-unknown-linux-gnu.2.28"],
            "release.sh: unsupported target x86_64-unknown-linux-gnu.2.28",
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
