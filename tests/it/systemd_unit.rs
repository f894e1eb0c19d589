//! The systemd unit works on every systemd the install docs name for it
//! (SPEC §10): each setting of `packaging/gitlab-haproxy-agent.service` and
//! of its drop-ins is dated against systemd's NEWS (the table below), and
//!
//! - the unit itself uses nothing newer than the oldest systemd of the
//!   docs' distro table (`docs/install.md`, "systemd per distribution"):
//!   older systemd drops an unknown setting or specifier with a warning
//!   only (`%d` before 251 left the agent without its consul token), or
//!   fails on it;
//! - `packaging/gitlab-haproxy-agent.service.d/systemd-<N>.conf` uses
//!   nothing newer than N, and N is a systemd some named distro runs;
//! - a setting not in the table fails the test: date it first.
//!
//! No systemd can be booted here; where `systemd-analyze` is on PATH, the
//! unit, alone and with every drop-in, also passes `systemd-analyze verify`
//! with no warning.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The systemd version that introduced each setting the unit files use
/// (section, key, value prefix: "" for any value), from systemd's NEWS
/// ("CHANGES WITH <N>"), systemd.exec(5)/systemd.service(5) and the
/// packaging review's dating (/work/shared/research/packaging-review.md).
/// A version at or below 219 means "older than any systemd still in a
/// fleet" (CentOS 7's); the table does not need more precision there.
const SINCE: &[(&str, &str, &str, u32)] = &[
    ("Unit", "Description", "", 1),
    ("Unit", "After", "", 1),
    ("Unit", "Wants", "", 1),
    // NEWS 230: StartLimitInterval= became StartLimitIntervalSec= in [Unit].
    ("Unit", "StartLimitIntervalSec", "", 230),
    ("Install", "WantedBy", "", 1),
    ("Service", "Type", "notify", 1),
    ("Service", "NotifyAccess", "main", 1),
    // NEWS 183: the service watchdog (WatchdogSec=, sd_notify WATCHDOG=1).
    ("Service", "WatchdogSec", "", 183),
    ("Service", "Environment", "", 1),
    ("Service", "EnvironmentFile", "", 1),
    ("Service", "ExecStart", "", 1),
    ("Service", "KillSignal", "", 1),
    ("Service", "TimeoutStopSec", "", 1),
    ("Service", "Restart", "", 1),
    ("Service", "RestartSec", "", 1),
    // NEWS 189.
    ("Service", "RestartPreventExitStatus", "", 189),
    ("Service", "LimitNOFILE", "", 1),
    ("Service", "UMask", "", 1),
    ("Service", "PrivateTmp", "", 1),
    ("Service", "CapabilityBoundingSet", "", 1),
    // NEWS 187.
    ("Service", "NoNewPrivileges", "", 187),
    ("Service", "SystemCallFilter", "~@privileged", 231),
    // NEWS 231: the @system-service group.
    ("Service", "SystemCallFilter", "@system-service", 231),
    // NEWS 209 / 211 / 213.
    ("Service", "PrivateDevices", "", 209),
    ("Service", "SystemCallErrorNumber", "", 209),
    ("Service", "RestrictAddressFamilies", "", 211),
    ("Service", "SystemCallArchitectures", "", 213),
    // NEWS 214.
    ("Service", "ProtectHome", "", 214),
    // NEWS 229.
    ("Service", "AmbientCapabilities", "", 229),
    // NEWS 231.
    ("Service", "MemoryDenyWriteExecute", "", 231),
    ("Service", "RestrictRealtime", "", 231),
    // NEWS 232: ProtectSystem=strict, the ProtectKernel*/ControlGroups trio,
    // DynamicUser=, PrivateUsers=, RemoveIPC=.
    ("Service", "ProtectSystem", "strict", 232),
    ("Service", "ProtectKernelTunables", "", 232),
    ("Service", "ProtectKernelModules", "", 232),
    ("Service", "ProtectControlGroups", "", 232),
    ("Service", "DynamicUser", "", 232),
    ("Service", "PrivateUsers", "", 232),
    ("Service", "RemoveIPC", "", 232),
    // NEWS 233.
    ("Service", "RestrictNamespaces", "", 233),
    // NEWS 235: StateDirectory= (with DynamicUser=), LockPersonality=,
    // KeyringMode=.
    ("Service", "StateDirectory", "", 235),
    ("Service", "StateDirectoryMode", "", 235),
    ("Service", "LockPersonality", "", 235),
    ("Service", "KeyringMode", "", 235),
    // NEWS 239.
    ("Service", "PrivateMounts", "", 239),
    // NEWS 242.
    ("Service", "ProtectHostname", "", 242),
    ("Service", "RestrictSUIDSGID", "", 242),
    // NEWS 244.
    ("Service", "ProtectKernelLogs", "", 244),
    // NEWS 245.
    ("Service", "ProtectClock", "", 245),
    // NEWS 247: ProtectProc=, ProcSubset=, LoadCredential=.
    ("Service", "ProtectProc", "", 247),
    ("Service", "LoadCredential", "", 247),
    // ProcSubset=pid exists from 247, but with ProtectKernelTunables= it
    // could not be set up before 250 (NEWS 250): the unit failed to start.
    ("Service", "ProcSubset", "", 250),
];

/// Specifiers in values and the systemd that resolves them (NEWS); an
/// unknown one is dropped with the whole line, with a warning only.
const SPECIFIERS: &[(&str, u32)] = &[("%S", 236), ("%d", 251), ("%n", 1), ("%i", 1)];

/// (section, key, value, line number) of each assignment of a unit file.
fn settings(text: &str) -> Vec<(String, String, String, usize)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not key=value: {line}", n + 1));
        out.push((
            section.clone(),
            key.trim().to_string(),
            value.trim().to_string(),
            n + 1,
        ));
    }
    out
}

/// The newest systemd a file needs, and what needs it; panics on a
/// setting the table does not date.
fn needs(path: &Path) -> (u32, String) {
    let mut newest = (0, String::new());
    for (section, key, value, line) in settings(&read(path)) {
        let since = SINCE
            .iter()
            .filter(|(s, k, prefix, _)| *s == section && *k == key && value.starts_with(prefix))
            .map(|row| row.3)
            .max()
            .unwrap_or_else(|| {
                panic!(
                    "{}:{line}: [{section}] {key}={value} is not dated in SINCE: look it up in systemd's NEWS first",
                    path.display()
                )
            });
        let mut need = (since, format!("{key}= ({}:{line})", path.display()));
        for (spec, v) in SPECIFIERS {
            if value.contains(spec) && *v > need.0 {
                need = (
                    *v,
                    format!("the {spec} specifier in {key}= ({}:{line})", path.display()),
                );
            }
        }
        let unknown = value
            .match_indices('%')
            .map(|(i, _)| &value[i..(i + 2).min(value.len())])
            .find(|s| !SPECIFIERS.iter().any(|(k, _)| k == s));
        assert!(
            unknown.is_none(),
            "{}:{line}: specifier {unknown:?} not dated in SPECIFIERS",
            path.display()
        );
        if need.0 > newest.0 {
            newest = need;
        }
    }
    newest
}

/// The docs' table "systemd per distribution": (distro, systemd version)
/// rows of docs/install.md between that heading and the next.
fn distros() -> Vec<(String, u32)> {
    let docs = read(&root().join("docs/install.md"));
    let table = docs
        .split_once("### systemd per distribution")
        .expect("docs/install.md has no \"### systemd per distribution\" table")
        .1;
    let table = table.split("\n#").next().unwrap();
    let rows: Vec<(String, u32)> = table
        .lines()
        .filter(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let version = cells.get(1)?.parse().ok()?;
            Some((cells[0].to_string(), version))
        })
        .collect();
    assert!(rows.len() >= 4, "the distro table parsed to {rows:?}");
    rows
}

fn drop_ins() -> Vec<(PathBuf, u32)> {
    let dir = root().join("packaging/gitlab-haproxy-agent.service.d");
    let mut out: Vec<(PathBuf, u32)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            let version = name
                .strip_prefix("systemd-")
                .and_then(|n| n.strip_suffix(".conf"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("drop-in {name} is not named systemd-<version>.conf"));
            (p, version)
        })
        .collect();
    out.sort_by_key(|d| d.1);
    out
}

#[test]
fn the_unit_needs_nothing_newer_than_the_oldest_named_distro() {
    let distros = distros();
    let (oldest_name, oldest) = distros.iter().min_by_key(|d| d.1).unwrap();
    let unit = root().join("packaging/gitlab-haproxy-agent.service");
    let (need, what) = needs(&unit);
    assert!(
        need <= *oldest,
        "{what} needs systemd {need}, but docs/install.md names {oldest_name} (systemd {oldest}): \
         move it to packaging/gitlab-haproxy-agent.service.d/systemd-{need}.conf"
    );
}

#[test]
fn each_drop_in_needs_nothing_newer_than_its_name() {
    let distros = distros();
    let drop_ins = drop_ins();
    assert!(!drop_ins.is_empty());
    for (path, version) in &drop_ins {
        let (need, what) = needs(path);
        assert!(
            need <= *version,
            "{what} needs systemd {need}, newer than the drop-in's name"
        );
        assert!(
            distros.iter().any(|d| d.1 >= *version),
            "{}: no distro of docs/install.md runs systemd {version} or later",
            path.display()
        );
        let text = read(path);
        assert!(
            text.contains(&format!("service.d/systemd-{version}.conf")),
            "{}: does not say where it is installed",
            path.display()
        );
    }
    // ProcSubset=pid fails to set up with ProtectKernelTunables= before 250.
    let unit = read(&root().join("packaging/gitlab-haproxy-agent.service"));
    assert!(
        !unit.contains("ProcSubset="),
        "ProcSubset= in the unit itself"
    );
}

/// The credential recipe needs no `%d` (251): the agent reads
/// `$CREDENTIALS_DIRECTORY` itself; readiness and the watchdog are on.
#[test]
fn the_unit_is_notify_with_a_watchdog_and_credentials_without_specifiers() {
    let unit = read(&root().join("packaging/gitlab-haproxy-agent.service"));
    for want in [
        "\nType=notify\n",
        "\nNotifyAccess=main\n",
        "\nWatchdogSec=30s\n",
        "#   LoadCredential=consul-token:",
        "#   SupplementaryGroups=gitlab-haproxy-agent\n",
    ] {
        assert!(unit.contains(want), "unit lacks {want:?}");
    }
    let docs = read(&root().join("docs/install.md"));
    for text in [&unit, &docs] {
        assert!(
            !text.contains("%d"),
            "the %d specifier (systemd 251) is still shown"
        );
    }
}

/// `systemd-analyze verify`, where it is installed, on the unit alone and
/// with every drop-in (as a systemd that has them all loads it), with the
/// agent binary as ExecStart: no output at all, exit 0.
#[test]
fn systemd_analyze_verifies_the_unit_and_its_drop_ins() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze not on PATH (Debian package systemd): verify not run");
        return;
    }
    let dir = std::env::temp_dir().join(format!("gha-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let unit = read(&root().join("packaging/gitlab-haproxy-agent.service")).replace(
        "ExecStart=/usr/local/bin/gitlab-haproxy-agent",
        &format!("ExecStart={}", env!("CARGO_BIN_EXE_gitlab-haproxy-agent")),
    );
    let mut all = unit.clone();
    for (path, _) in drop_ins() {
        all.push('\n');
        all.push_str(&read(&path));
    }
    for (tag, text) in [("alone", &unit), ("with-drop-ins", &all)] {
        let d = dir.join(tag);
        std::fs::create_dir_all(&d).unwrap();
        let file = d.join("gitlab-haproxy-agent.service");
        std::fs::write(&file, text).unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&file)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "systemd-analyze verify ({tag}): {}\n{said}",
            out.status
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every setting the unit files use is in the table once per value form.
#[test]
fn the_table_has_no_duplicates() {
    let mut seen = BTreeMap::new();
    for (s, k, v, n) in SINCE {
        assert!(
            seen.insert((s, k, v), n).is_none(),
            "{s} {k} {v} twice in SINCE"
        );
    }
}
