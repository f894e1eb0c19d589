//! The Kubernetes example works as shipped (SPEC §10), read as Kubernetes
//! reads it: `packaging/kubernetes/sidecar.yaml` parsed (PyYAML, into
//! JSON), then checked for
//!
//! - one agent per haproxy node, replaced on its node (a DaemonSet, or a
//!   Deployment that never surges);
//! - a state directory the agent's user can write (an `emptyDir`, or a
//!   `hostPath` an init container prepares);
//! - haproxy's master socket (`-S`) and its `server-state-file` on volumes
//!   both containers mount, the haproxy configuration mounted read-only
//!   into the agent container at haproxy's path, `load-server-state-from-file`
//!   in that configuration;
//! - the Pod Security "restricted" level docs/install.md names;
//! - docs/install.md's `kubectl exec` forms of the runbook against the
//!   manifest's own paths, the state saved before the reload;
//! - and run: the example's haproxy command line and configuration on a
//!   real haproxy (its paths moved under a temporary directory), the
//!   agent's `wait-drained` reaching it through the master socket, and a
//!   reload (SIGUSR2) that keeps it answering there.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::haproxy::haproxy_bin;
use crate::support::{wait_for, Proc, BIN};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every document of the manifest, as JSON.
fn manifest() -> Vec<Value> {
    let path = root().join("packaging/kubernetes/sidecar.yaml");
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&path)
        .output()
        .expect("python3 not on PATH (the manifest is read with PyYAML: apt-get install python3-yaml)");
    assert!(
        out.status.success(),
        "cannot parse {} (PyYAML missing? apt-get install python3-yaml): {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// The workload and its pod spec.
fn workload(docs: &[Value]) -> (&Value, &Value) {
    let w = docs
        .iter()
        .find(|d| matches!(str_of(&d["kind"]), "DaemonSet" | "Deployment"))
        .expect("no DaemonSet or Deployment");
    (w, &w["spec"]["template"]["spec"])
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    list(&pod["containers"])
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The container's argv: command then args.
fn argv(c: &Value) -> Vec<&str> {
    list(&c["command"])
        .iter()
        .chain(list(&c["args"]))
        .map(str_of)
        .collect()
}

/// The volume mounted at the directory holding `path` in `c` (the longest
/// mount path that is a prefix), and whether read-only.
fn mount_of<'a>(c: &'a Value, path: &str) -> Option<(&'a str, bool)> {
    list(&c["volumeMounts"])
        .iter()
        .filter(|m| {
            let at = str_of(&m["mountPath"]).trim_end_matches('/');
            path.starts_with(&format!("{at}/"))
        })
        .max_by_key(|m| str_of(&m["mountPath"]).len())
        .map(|m| (str_of(&m["name"]), m["readOnly"] == true))
}

fn volume<'a>(pod: &'a Value, name: &str) -> &'a Value {
    list(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

/// haproxy.cfg of the ConfigMap the pod mounts.
fn haproxy_cfg(docs: &[Value]) -> String {
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("no ConfigMap");
    str_of(&cm["data"]["haproxy.cfg"]).to_string()
}

/// The value after `keyword` on a line of haproxy's configuration.
fn cfg_value(cfg: &str, keyword: &str) -> Option<String> {
    cfg.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some(keyword)).then(|| words.next().unwrap_or_default().to_string())
    })
}

const AGENT: &str = "gitlab-haproxy-agent";

#[test]
fn one_agent_per_node_replaced_on_its_node() {
    let docs = manifest();
    let (w, pod) = workload(&docs);
    match str_of(&w["kind"]) {
        "DaemonSet" => {
            let surge = &w["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"];
            assert!(
                surge.is_null() || surge == 0,
                "a DaemonSet that surges puts two agents on a node: {surge}"
            );
        }
        _ => {
            // A Deployment must never need another node to roll.
            let ru = &w["spec"]["strategy"]["rollingUpdate"];
            assert_eq!(
                ru["maxSurge"], 0,
                "a surging Deployment moves pods off their node"
            );
        }
    }
    assert!(
        !pod["nodeSelector"].is_null(),
        "no nodeSelector: which nodes run haproxy?"
    );
    assert_eq!(list(&pod["containers"]).len(), 2);
}

#[test]
fn the_state_directory_is_writable_by_the_agent() {
    let docs = manifest();
    let (_, pod) = workload(&docs);
    let agent = container(pod, AGENT);
    let file = list(&agent["env"])
        .iter()
        .find(|e| e["name"] == "GITLAB_HAPROXY_AGENT_STATE_FILE")
        .map(|e| str_of(&e["value"]).to_string())
        .expect("no state file");
    let (name, ro) = mount_of(agent, &file).expect("the state file is on no volume");
    assert!(!ro, "the state directory is mounted read-only");
    let v = volume(pod, name);
    if v["emptyDir"].is_null() {
        // A hostPath is root's 0755 as the kubelet makes it: an init
        // container must hand it to the agent's user.
        assert!(!v["hostPath"].is_null(), "state volume {name}: {v}");
        let prepared = list(&pod["initContainers"]).iter().any(|c| {
            list(&c["volumeMounts"]).iter().any(|m| m["name"] == name)
                && argv(c).iter().any(|a| a.contains("chown"))
        });
        assert!(
            prepared,
            "hostPath {name} is not prepared by an init container"
        );
    }
    let user = agent["securityContext"]["runAsUser"]
        .as_u64()
        .expect("agent uid");
    assert_ne!(user, 0);
}

#[test]
fn the_runbook_can_reach_haproxy_from_the_agent_container() {
    let docs = manifest();
    let (_, pod) = workload(&docs);
    let (agent, haproxy) = (container(pod, AGENT), container(pod, "haproxy"));
    let args = argv(haproxy);
    let master = args
        .iter()
        .position(|a| *a == "-S")
        .map(|i| args[i + 1].split(',').next().unwrap().to_string())
        .expect("haproxy runs without a master CLI (-S)");
    let config = args
        .iter()
        .position(|a| *a == "-f")
        .map(|i| args[i + 1].to_string())
        .expect("haproxy's -f");
    assert!(args.contains(&"-W"), "not master-worker: {args:?}");
    let cfg = haproxy_cfg(&docs);
    let state = cfg_value(&cfg, "server-state-file").expect("no server-state-file in haproxy.cfg");
    assert!(
        state.starts_with('/'),
        "server-state-file {state} is relative"
    );
    let load = cfg_value(&cfg, "load-server-state-from-file");
    assert!(
        matches!(load.as_deref(), Some("global" | "local")),
        "haproxy.cfg loads no server state: {load:?}"
    );
    let stats = cfg_value(&cfg, "stats").is_some() && cfg.contains("stats socket /");
    assert!(stats, "no stats socket");
    for (what, path, agent_writes) in [
        ("the master socket", master.as_str(), true),
        ("the server-state-file", state.as_str(), true),
        ("the configuration", config.as_str(), false),
    ] {
        let (h, _) = mount_of(haproxy, path)
            .unwrap_or_else(|| panic!("{what} {path}: no volume in haproxy"));
        let (a, ro) = mount_of(agent, path)
            .unwrap_or_else(|| panic!("{what} {path}: not mounted in the agent"));
        assert_eq!(h, a, "{what} {path}: different volumes");
        assert_eq!(
            ro, !agent_writes,
            "{what} {path}: read-only {ro} in the agent"
        );
    }
    // The two users share a group the volumes belong to.
    let fs_group = pod["securityContext"]["fsGroup"]
        .as_u64()
        .expect("no fsGroup");
    assert_eq!(
        Some(fs_group),
        agent["securityContext"]["runAsGroup"].as_u64()
    );
}

/// Pod Security "restricted": what the docs say the example needs.
#[test]
fn the_pod_meets_the_restricted_pod_security_level() {
    let docs = manifest();
    let (_, pod) = workload(&docs);
    let pod_sc = &pod["securityContext"];
    assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(pod["hostNetwork"].is_null() && pod["hostPID"].is_null());
    let all = list(&pod["containers"])
        .iter()
        .chain(list(&pod["initContainers"]));
    for c in all {
        let sc = &c["securityContext"];
        let name = str_of(&c["name"]);
        assert!(
            sc["runAsNonRoot"] == true
                || (pod_sc["runAsNonRoot"] == true && sc["runAsNonRoot"].is_null()),
            "{name}: runAsNonRoot"
        );
        assert_ne!(sc["runAsUser"], 0, "{name}: root");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{name}"
        );
        assert!(
            list(&c["ports"]).iter().all(|p| p["hostPort"].is_null()),
            "{name}: hostPort"
        );
    }
    for v in list(&pod["volumes"]) {
        let kind = v
            .as_object()
            .unwrap()
            .keys()
            .find(|k| *k != "name")
            .unwrap()
            .clone();
        assert!(
            [
                "configMap",
                "emptyDir",
                "secret",
                "downwardAPI",
                "projected",
                "persistentVolumeClaim",
                "csi",
                "ephemeral"
            ]
            .contains(&kind.as_str()),
            "volume {} is {kind}: not allowed at the restricted level",
            v["name"]
        );
    }
    let install = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    assert!(
        install.contains("Pod Security") && install.contains("`restricted`"),
        "docs/install.md does not name the Pod Security level"
    );
}

/// docs/install.md's `kubectl exec` forms name the manifest's own paths,
/// and the reload saves the server state first.
#[test]
fn the_docs_give_the_runbook_as_kubectl_exec_against_the_manifest() {
    let docs = manifest();
    let (_, pod) = workload(&docs);
    let args = argv(container(pod, "haproxy"));
    let master = args[args.iter().position(|a| *a == "-S").unwrap() + 1]
        .split(',')
        .next()
        .unwrap()
        .to_string();
    let config = args[args.iter().position(|a| *a == "-f").unwrap() + 1].to_string();
    let install = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let exec = format!("-c {AGENT} -- /gitlab-haproxy-agent ");
    for command in [
        "status",
        "wait-drained",
        "save-server-state",
        "lint-haproxy",
    ] {
        let line = install
            .lines()
            .find(|l| l.contains("kubectl exec") && l.contains(&format!("{exec}{command}")))
            .unwrap_or_else(|| panic!("docs/install.md has no `kubectl exec … {exec}{command}`"));
        match command {
            "wait-drained" | "save-server-state" => {
                assert!(
                    line.contains(&master),
                    "{command} does not use {master}: {line}"
                )
            }
            "lint-haproxy" => assert!(line.contains(&config), "{line}"),
            _ => {}
        }
    }
    let save = install.find(&format!("{exec}save-server-state")).unwrap();
    let reload = install
        .find("-c haproxy -- sh -c 'kill -USR2 1'")
        .expect("no reload form in docs/install.md");
    assert!(save < reload, "the reload is shown before the save");
}

/// The example's haproxy, as the pod runs it: its `command` and its
/// ConfigMap, with the pod's directories moved into a temporary one (and
/// the frontend on a free loopback port); the agent's `wait-drained`
/// reaches it through the master socket, before and after a reload.
#[test]
fn the_examples_haproxy_runs_and_the_agent_reaches_its_master_socket() {
    let docs = manifest();
    let (_, pod) = workload(&docs);
    let args = argv(container(pod, "haproxy"));
    let dir = std::env::temp_dir().join(format!("gha-k8s-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (run, lib, etc) = (dir.join("run"), dir.join("lib"), dir.join("etc"));
    for d in [&run, &lib, &etc] {
        std::fs::create_dir_all(d).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let moved = |text: &str| {
        text.replace("/var/run/haproxy", run.to_str().unwrap())
            .replace("/var/lib/haproxy", lib.to_str().unwrap())
            .replace("/usr/local/etc/haproxy", etc.to_str().unwrap())
            .replace("bind :8080", &format!("bind 127.0.0.1:{port}"))
    };
    std::fs::write(etc.join("haproxy.cfg"), moved(&haproxy_cfg(&docs))).unwrap();
    assert_eq!(args[0], "haproxy", "{args:?}");
    let mut cmd = Command::new(haproxy_bin());
    cmd.args(args[1..].iter().map(|a| moved(a)));
    let mut haproxy = Proc::spawn(cmd);
    let master = run.join("master.sock");
    wait_for(Duration::from_secs(10), "haproxy's master socket", || {
        master.exists().then_some(())
    });
    let drained = || {
        Command::new(BIN)
            .args(["wait-drained", "be_web/web-1", "-haproxy-master-socket"])
            .arg(&master)
            .args(["-timeout", "5s"])
            .output()
            .unwrap()
    };
    let out = drained();
    assert!(
        out.status.success(),
        "wait-drained through the example's master socket: {}\n{}\nhaproxy: {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        haproxy.log()
    );
    haproxy.signal(libc::SIGUSR2);
    wait_for(Duration::from_secs(10), "the reload", || {
        haproxy
            .log()
            .iter()
            .any(|l| l.contains("Former worker") || l.contains("Loading success"))
            .then_some(())
    });
    assert!(
        drained().status.success(),
        "after the reload: {:?}",
        haproxy.log()
    );
    assert!(
        haproxy.wait_exit(Duration::from_millis(1)).is_none(),
        "haproxy exited"
    );
    drop(haproxy);
    let _ = std::fs::remove_dir_all(&dir);
}
