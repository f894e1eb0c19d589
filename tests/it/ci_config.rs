//! The CI and packaging files against the repository, without running CI:
//! every script `.gitlab-ci.yml` calls exists and is executable, the pins in
//! `ci/versions.yml` are the Dockerfiles' defaults and hash to the recorded
//! CI image tag, no job hardcodes an instance, the environment file lists
//! every flag and variable of `-help` with its default, the developer
//! commands (mise.toml, scripts/prepare-dev-env.sh) are the ones CI runs,
//! and the release waits for every test job, signs its versioned checksums
//! file and makes the image of the archives' binaries.
//!
//! Plain string scanning: no YAML crate (the YAML itself is parsed in review
//! with `python3 -c 'import yaml; yaml.safe_load(open(".gitlab-ci.yml"))'`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The lines of a YAML or shell file that are not comments.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with('#'))
}

#[test]
fn every_script_the_pipeline_calls_exists_and_is_executable() {
    let ci = read(".gitlab-ci.yml");
    let mut seen = Vec::new();
    for line in code_lines(&ci) {
        let mut rest = line;
        while let Some(i) = rest.find("scripts/") {
            // A path, not the tail of another word (fuzz/scripts/...).
            let before = rest[..i].chars().next_back();
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| c.is_whitespace() || "\"'`;|&)".contains(c))
                .unwrap_or(tail.len());
            if before.is_none_or(|c| c.is_whitespace() || "\"'-:[".contains(c)) {
                seen.push(tail[..end].to_string());
            }
            rest = &tail[end..];
        }
    }
    assert!(
        seen.iter().any(|s| s == "scripts/release.sh"),
        "no release job? saw {seen:?}"
    );
    for script in &seen {
        let path = root().join(script);
        let meta = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!(".gitlab-ci.yml calls {script}: {e}"));
        assert!(
            meta.is_file() && meta.permissions().mode() & 0o111 != 0,
            "{script} is not an executable file"
        );
    }
}

#[test]
fn pipeline_names_no_instance() {
    // The push mirror runs the same file: addresses come from CI_* variables.
    for (n, line) in read(".gitlab-ci.yml").lines().enumerate() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        assert!(
            !line.contains("gitlab.com") && !line.contains("gitlab.net"),
            ".gitlab-ci.yml:{}: {line}",
            n + 1
        );
    }
    assert!(
        read(".gitlab-ci.yml").contains("local: ci/versions.yml"),
        "the pins are not included"
    );
}

fn pins() -> BTreeMap<String, String> {
    let text = read("ci/versions.yml");
    let mut out = BTreeMap::new();
    for line in code_lines(&text) {
        let Some((k, v)) = line.trim().split_once(':') else {
            continue;
        };
        let v = v.trim().trim_matches('"');
        if !v.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            out.insert(k.to_string(), v.to_string());
        }
    }
    out
}

#[test]
fn dockerfile_defaults_equal_the_pins() {
    let pins = pins();
    for name in [
        "RUST_VERSION",
        "RUST_NIGHTLY",
        "CARGO_FUZZ_VERSION",
        "HAPROXY_MINOR",
        "CONSUL_VERSION",
        "ZIG_VERSION",
        "CARGO_ZIGBUILD_VERSION",
        "PY_CONSUL_VERSION",
        "TEST_IMAGE_TAG",
    ] {
        assert!(
            pins.contains_key(name),
            "ci/versions.yml pins no {name}: {pins:?}"
        );
    }
    for dockerfile in ["Dockerfile", "ci/test-image.Dockerfile"] {
        for line in read(dockerfile).lines() {
            let Some(arg) = line.strip_prefix("ARG ") else {
                continue;
            };
            let Some((name, default)) = arg.split_once('=') else {
                continue;
            };
            if let Some(pin) = pins.get(name) {
                assert_eq!(
                    default, pin,
                    "{dockerfile}: ARG {name} default differs from ci/versions.yml"
                );
            }
        }
    }
    assert!(
        read("Dockerfile").contains("ARG RUST_VERSION="),
        "Dockerfile does not take the pinned Rust"
    );
    // Both images build releases the same way (scripts/release.sh, with
    // cargo-zigbuild): both take the pinned zig and cargo-zigbuild.
    for dockerfile in ["Dockerfile", "ci/test-image.Dockerfile"] {
        for name in ["ZIG_VERSION", "CARGO_ZIGBUILD_VERSION"] {
            assert!(
                read(dockerfile).contains(&format!("ARG {name}=")),
                "{dockerfile} does not take the pinned {name}"
            );
        }
    }
}

/// The top-level entries of `.gitlab-ci.yml` (jobs, templates, keywords):
/// (name, text up to the next one), comments left out.
fn jobs() -> Vec<(String, String)> {
    let ci = read(".gitlab-ci.yml");
    let mut jobs: Vec<(String, String)> = Vec::new();
    for line in code_lines(&ci) {
        if line.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '.') {
            let name = line.split(':').next().unwrap_or_default().to_string();
            jobs.push((name, String::new()));
        }
        if let Some((_, job)) = jobs.last_mut() {
            job.push_str(line);
            job.push('\n');
        }
    }
    jobs
}

fn job(name: &str) -> String {
    jobs()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!(".gitlab-ci.yml has no job {name}"))
        .1
}

/// The job names under a job's `needs:` (`- name` or `- job: name`).
fn needs(job: &str) -> Vec<String> {
    let Some((_, rest)) = job.split_once("\n  needs:\n") else {
        return Vec::new();
    };
    rest.lines()
        .take_while(|l| l.starts_with("    "))
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|l| l.trim_start_matches("job:").trim().to_string())
        .collect()
}

/// The job that builds a Dockerfile passes every pinned ARG it declares as
/// `--build-arg "NAME=$NAME"`, so the pin, not the ARG default, is built.
#[test]
fn image_jobs_pass_every_pinned_build_arg() {
    let pins = pins();
    let jobs: Vec<String> = jobs().into_iter().map(|j| j.1).collect();
    for dockerfile in ["ci/test-image.Dockerfile"] {
        let call = format!("scripts/ci/build-image.sh {dockerfile} ");
        let job = jobs
            .iter()
            .find(|j| j.contains(&call))
            .unwrap_or_else(|| panic!("no job runs `{call}`"));
        for line in read(dockerfile).lines() {
            let Some((name, _)) = line.strip_prefix("ARG ").and_then(|a| a.split_once('=')) else {
                continue;
            };
            if pins.contains_key(name) {
                assert!(
                    job.contains(&format!("--build-arg \"{name}=${name}\"")),
                    "the job building {dockerfile} does not pass the pinned {name}"
                );
            }
        }
    }
}

/// The haproxy LTS lines of the `haproxy-lts` matrix are exactly Debian's
/// (`HAPROXY_MINOR`) and the upstream ones pinned as
/// `HAPROXY_LTS_<line>_VERSION` (with a sha256), each built by the CI image
/// from a build argument the ci-image job passes; `.ci/run` builds the 3.0
/// pin.
#[test]
fn haproxy_lts_matrix_matches_the_pins() {
    let pins = pins();
    let ci = read(".gitlab-ci.yml");
    let dockerfile = read("ci/test-image.Dockerfile");
    let matrix: Vec<String> = code_lines(&ci)
        .find_map(|l| l.trim().strip_prefix("- HAPROXY_LTS:"))
        .expect("no HAPROXY_LTS matrix in .gitlab-ci.yml")
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|v| v.trim().trim_matches('"').to_string())
        .collect();
    let mut want = vec![pins["HAPROXY_MINOR"].clone()];
    for (name, version) in &pins {
        let Some(line) = name
            .strip_prefix("HAPROXY_LTS_")
            .and_then(|n| n.strip_suffix("_VERSION"))
        else {
            continue;
        };
        let line = line.replace('_', ".");
        assert!(
            version.starts_with(&format!("{line}.")),
            "{name} = {version} is not on the {line} line"
        );
        let sum_name = format!("HAPROXY_LTS_{}_SHA256", line.replace('.', "_"));
        let sum = pins
            .get(&sum_name)
            .unwrap_or_else(|| panic!("ci/versions.yml pins no {sum_name}"));
        assert!(
            sum.len() == 64 && sum.chars().all(|c| c.is_ascii_hexdigit()),
            "{sum_name} is not a sha256: {sum}"
        );
        for pin in [name, &sum_name] {
            assert!(
                ci.contains(&format!("--build-arg \"{pin}=${pin}\"")),
                "the ci-image job does not pass {pin}"
            );
            assert!(
                dockerfile.contains(&format!("ARG {pin}=")),
                "ci/test-image.Dockerfile takes no {pin}"
            );
        }
        assert!(
            dockerfile.contains(&format!("build \"${{{name}}}\" \"${{{sum_name}}}\"")),
            "ci/test-image.Dockerfile does not build {name}"
        );
        want.push(line);
    }
    assert_eq!(
        matrix, want,
        "the haproxy-lts matrix differs from the lines pinned in ci/versions.yml"
    );
    for line in ["2.6", "2.8", "3.0", "3.2"] {
        assert!(matrix.iter().any(|l| l == line), "LTS {line} not tested");
    }
    let tarball = format!("haproxy-{}.tar.gz", pins["HAPROXY_LTS_3_0_VERSION"]);
    assert!(
        read(".ci/run").contains(&tarball),
        ".ci/run does not build {tarball}"
    );
}

/// A release never ships past a failing check: the release job needs every
/// lint and test job, the haproxy LTS matrix and the reproducible build
/// included (it once waited for fmt, clippy and test only).
#[test]
fn the_release_waits_for_every_test_job() {
    let release = needs(&job("release-archives"));
    let checks: Vec<String> = jobs()
        .into_iter()
        .filter(|(_, text)| {
            text.contains("\n  stage: test\n") || text.contains("\n  stage: lint\n")
        })
        .map(|(name, _)| name)
        .collect();
    for name in ["fmt", "clippy", "test", "haproxy-lts", "reproducible-build"] {
        assert!(
            checks.iter().any(|c| c == name),
            "no {name} job in lint/test"
        );
    }
    for check in &checks {
        assert!(
            release.contains(check),
            "release-archives does not need {check} (needs {release:?})"
        );
    }
    let repro = job("reproducible-build");
    for target in ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"] {
        assert!(repro.contains(target), "reproducible-build skips {target}");
    }
    assert!(repro.contains("scripts/ci/reproducible.sh --target \"$RELEASE_TARGET\""));
}

/// The image is the archives' binaries (amd64 and arm64), not a third
/// build: its job takes the release job's artifacts, and Dockerfile.release
/// copies a binary and runs nothing.
#[test]
fn the_image_is_built_from_the_archives_for_both_architectures() {
    let image = job("container-image");
    assert!(
        image.contains("    - job: release-archives\n      artifacts: true\n"),
        "container-image does not take the archives:\n{image}"
    );
    assert!(
        image.contains("scripts/ci/release-image.sh dist"),
        "{image}"
    );
    assert!(!image.contains("build-image.sh Dockerfile "), "{image}");
    let dockerfile = read("Dockerfile.release");
    for line in code_lines(&dockerfile) {
        assert!(
            !line.starts_with("RUN ") && !line.contains(" AS "),
            "Dockerfile.release builds something: {line}"
        );
    }
    assert!(
        dockerfile.contains("\nCOPY ${TARGETARCH}/gitlab-haproxy-agent /gitlab-haproxy-agent\n")
    );
    let script = read("scripts/ci/release-image.sh");
    for want in [
        "for arch in amd64 arm64; do",
        "--platform \"linux/$arch\" --manifest \"$image\"",
        "sha256sum --check --strict",
        "buildah manifest push --all",
    ] {
        assert!(script.contains(want), "release-image.sh lacks {want:?}");
    }
}

/// `<project>_<version>_checksums.txt`, signed in the release job, its
/// signature published beside it.
#[test]
fn the_checksums_file_is_versioned_and_signed() {
    assert!(read("scripts/release.sh").contains("sums=${name}_${version}_checksums.txt\n"));
    let release = job("release-archives");
    let (build, sign) = (
        release
            .find("scripts/release.sh ")
            .expect("no release build"),
        release
            .find("scripts/ci/sign-checksums.sh dist")
            .expect("the release job signs nothing"),
    );
    assert!(build < sign, "signed before it is built");
    let publish = read("scripts/ci/publish-release.sh");
    assert!(
        publish.contains("files+=(\"$sums\" \"$sums.sig\")"),
        "the signature is not published"
    );
}

#[test]
fn ci_image_tag_is_the_hash_of_the_pins() {
    let out = Command::new(root().join("scripts/ci/test-image-tag.sh"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn environment_file_lists_every_flag_and_variable_with_its_default() {
    let help = Command::new(env!("CARGO_BIN_EXE_gitlab-haproxy-agent"))
        .arg("-help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let env = read("packaging/gitlab-haproxy-agent.env");
    for line in env.lines() {
        assert!(
            line.is_empty() || line.starts_with('#'),
            "an uncommented setting: {line:?}"
        );
    }
    let mut flags = 0;
    for line in help.lines() {
        // `  -flag type   text (default "V"; env NAME)`
        if let Some(i) = line.find("(default \"") {
            let rest = &line[i + "(default \"".len()..];
            let (default, rest) = rest.split_once("\"; env ").expect(line);
            let var = rest.trim_end_matches(')');
            assert!(
                env.contains(&format!("\n#{var}={default}\n")),
                "env file lacks `#{var}={default}`"
            );
            flags += 1;
        }
    }
    assert!(flags >= 12, "parsed only {flags} flags from -help:\n{help}");
    for var in [
        "GITLAB_LOG_FORMAT",
        "GITLAB_LOG_LEVEL",
        "CONSUL_HTTP_ADDR",
        "CONSUL_HTTP_TOKEN",
        "CONSUL_HTTP_TOKEN_FILE",
    ] {
        assert!(env.contains(&format!("\n#{var}=")), "env file lacks {var}");
    }
}

#[test]
fn systemd_unit_reads_the_environment_file_and_is_hardened() {
    let unit = read("packaging/gitlab-haproxy-agent.service");
    for want in [
        "EnvironmentFile=-/etc/default/gitlab-haproxy-agent",
        "ExecStart=/usr/local/bin/gitlab-haproxy-agent",
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "LimitNOFILE=1048576",
        "Restart=always",
        "Type=notify\n",
        "WatchdogSec=",
        "CapabilityBoundingSet=\n",
        "StateDirectory=gitlab-haproxy-agent\n",
        "Environment=GITLAB_HAPROXY_AGENT_STATE_FILE=%S/gitlab-haproxy-agent/state.json\n",
    ] {
        assert!(unit.contains(want), "unit lacks {want:?}");
    }
}

/// The developer commands are the suite's command split, not a second
/// copy of it: mise.toml's tasks run `scripts/test.sh unit` and
/// `scripts/test.sh integration`, whose halves are the two test targets:
/// the lib's unit tests and `tests/it/` (the bin has none, and no other
/// `[[test]]` links the library again); `.ci/run` installs through
/// `scripts/prepare-dev-env.sh` and runs `scripts/test.sh`.
#[test]
fn developer_commands_are_the_suite_split_and_ci_prepares_as_developers_do() {
    let mise = read("mise.toml");
    for (task, run) in [
        ("[tasks.\"test:unit\"]", "run = \"scripts/test.sh unit\""),
        (
            "[tasks.\"test:integration\"]",
            "run = \"scripts/test.sh integration\"",
        ),
    ] {
        let body = mise
            .split_once(task)
            .unwrap_or_else(|| panic!("mise.toml has no {task}"))
            .1;
        let body = body.split("\n[").next().unwrap_or_default();
        assert!(body.contains(run), "{task} does not {run}");
    }
    let test_sh = read("scripts/test.sh");
    assert!(test_sh.contains("unit) shift; exec cargo test --lib \"$@\""));
    assert!(test_sh.contains("integration) shift; exec cargo test --test it \"$@\""));
    let cargo = read("Cargo.toml");
    assert_eq!(
        cargo.matches("\n[[test]]\n").count(),
        1,
        "one integration target"
    );
    let bin = cargo.split_once("\n[[bin]]\n").unwrap().1;
    let bin = bin.split("\n[").next().unwrap();
    assert!(
        bin.contains("\ntest = false\n"),
        "the bin target has no tests: {bin}"
    );
    assert!(test_sh.contains("*) exec cargo test \"$@\""));
    let ci_run = read(".ci/run");
    let run: Vec<&str> = code_lines(&ci_run).map(str::trim).collect();
    for line in ["scripts/prepare-dev-env.sh", "scripts/test.sh"] {
        assert!(
            run.iter().any(|l| l.starts_with(line)),
            ".ci/run does not run {line}"
        );
    }
    for script in ["scripts/prepare-dev-env.sh", "scripts/test.sh"] {
        let meta = std::fs::metadata(root().join(script)).unwrap();
        assert!(meta.permissions().mode() & 0o111 != 0, "{script}");
    }
}

/// The structure gates run in CI after clippy: no import circle
/// (`scripts/import-circles.py`) and rustdoc without warnings, private
/// items included.
#[test]
fn ci_checks_import_circles_and_the_docs() {
    let ci_run = read(".ci/run");
    let run: Vec<&str> = code_lines(&ci_run).map(str::trim).collect();
    let at = |line: &str| {
        run.iter()
            .position(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!(".ci/run does not run {line}"))
    };
    let clippy = at("cargo clippy --all-targets -- -D warnings");
    assert!(at("scripts/import-circles.py") > clippy);
    assert!(at("RUSTDOCFLAGS='-D warnings' cargo doc --no-deps --document-private-items") > clippy);
    let meta = std::fs::metadata(root().join("scripts/import-circles.py")).unwrap();
    assert!(meta.permissions().mode() & 0o111 != 0);
}

/// The circle checker on small crates: two files importing each other are
/// a circle (exit 1, the cycle named); a parent declaring its child, the
/// child using the parent, and a parent's bare re-export of the child are
/// not (exit 0); test code counts only with `--tests`.
#[test]
fn the_circle_checker_finds_a_circle_and_only_a_circle() {
    let run = |files: &[(&str, &str)], flags: &[&str]| {
        let dir = std::env::temp_dir().join(format!(
            "import-circles-{}-{}",
            std::process::id(),
            files.len() * 10 + flags.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join("src").join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let out = Command::new("python3")
            .arg(root().join("scripts/import-circles.py"))
            .arg("--root")
            .arg(&dir)
            .args(flags)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let circle = [
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::X;\npub struct Y;\n"),
        ("b.rs", "pub struct X;\nfn f() { let _ = crate::a::Y; }\n"),
    ];
    let (code, out) = run(&circle, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("a.rs -> b.rs -> a.rs"), "{out}");
    assert!(out.contains("module circles: 1"), "{out}");
    let outline = [
        ("lib.rs", "mod p;\n"),
        ("p/mod.rs", "mod c;\npub use c::Z;\npub struct W;\n"),
        ("p/c.rs", "use super::W;\npub struct Z(W);\n"),
    ];
    let (code, out) = run(&outline, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(run(&outline, &["--reexports"]).0, Some(1));
    let tests_only = [
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "pub struct Y;\n#[cfg(test)]\nmod tests {\n    use crate::b::X;\n}\n",
        ),
        ("b.rs", "use crate::a::Y;\npub struct X;\n"),
    ];
    assert_eq!(run(&tests_only, &[]).0, Some(0));
    assert_eq!(run(&tests_only, &["--tests"]).0, Some(1));
    // A visibility path names where an item is seen; it imports nothing.
    let visibility = [
        ("lib.rs", "mod p;\n"),
        ("p/mod.rs", "mod c;\nfn f() { let _ = self::c::Z; }\n"),
        ("p/c.rs", "pub(in crate::p) struct Z;\n"),
    ];
    assert_eq!(run(&visibility, &["--tests"]).0, Some(0));
    let imported = [("p/c.rs", "pub struct Z;\nfn g() { crate::p::f(); }\n")];
    let imported = [visibility[0], visibility[1], imported[0]];
    assert_eq!(run(&imported, &["--tests"]).0, Some(1));
}
