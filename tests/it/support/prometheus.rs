//! Prometheus in the tests: its binaries found on `PATH` (a missing one is a
//! failure that says how to install it, never a skip), a server started with
//! its own configuration and rule files, and its HTTP API; the files of
//! `monitoring/` and the dashboard's queries as Prometheus runs them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gitlab_haproxy_agent::http::{percent_encode, EncodeSet};

use super::{free_port, http, wait_for, Proc};

/// The repository's `monitoring/` folder.
pub fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring")
}

/// `prometheus` or `promtool` from `PATH` (or `/usr/local/bin`, where
/// scripts/install-prometheus.sh puts them); panics with the install line.
pub fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/local/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH: the monitoring tests need Debian's prometheus package's binaries. Install them alone (the package would also start a Prometheus server) with `sudo scripts/install-prometheus.sh`, or put prometheus and promtool on PATH")
        })
}

/// A Prometheus server on loopback, killed when dropped, with its data in a
/// directory of its own.
pub struct Prometheus {
    pub addr: SocketAddr,
    pub proc: Proc,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `/-/metrics` on each of `targets` as job
    /// `gitlab-haproxy-agent`, every second, evaluating `rule_files` (name,
    /// content) every second. Waits until it is ready.
    pub fn start(targets: &[SocketAddr], rule_files: &[(&str, String)]) -> Prometheus {
        let dir = std::env::temp_dir().join(format!(
            "gha-prometheus-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = String::from(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\nrule_files:\n",
        );
        for (name, content) in rule_files {
            std::fs::write(dir.join(name), content).unwrap();
            config.push_str(&format!("  - {name}\n"));
        }
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        config.push_str(&format!(
            "scrape_configs:\n  - job_name: gitlab-haproxy-agent\n    metrics_path: /-/metrics\n    static_configs: [{{targets: [{}]}}]\n",
            targets.join(", ")
        ));
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut cmd = Command::new(tool("prometheus"));
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .current_dir(&dir);
        let mut proc = Proc::spawn(cmd);
        wait_for(Duration::from_secs(30), "prometheus ready", || {
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", proc.log().join("\n"));
            }
            http(addr, "GET", "/-/ready", b"")
                .filter(|(st, _)| *st == 200)
                .map(|_| ())
        });
        Prometheus { addr, proc, dir }
    }

    /// A GET on the HTTP API, `data` of a `success` answer.
    pub fn api(&self, path_and_query: &str) -> serde_json::Value {
        let (st, body) = http(self.addr, "GET", path_and_query, b"")
            .unwrap_or_else(|| panic!("prometheus answers {path_and_query}"));
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "{path_and_query}: not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            )
        });
        assert!(
            st == 200 && doc["status"] == "success",
            "{path_and_query}: {st} {doc}"
        );
        doc["data"].clone()
    }

    /// An instant query: its result vector.
    pub fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let data = self.api(&format!(
            "/api/v1/query?query={}",
            percent_encode(expr, EncodeSet::GO_QUERY)
        ));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// A range query over `[start, end]` (unix seconds), one point a second.
    pub fn query_range(&self, expr: &str, start: f64, end: f64) -> serde_json::Value {
        self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            percent_encode(expr, EncodeSet::GO_QUERY)
        ))["result"]
            .clone()
    }

    /// The state (`pending`, `firing`) of `alert` for `instance`, `None`
    /// when it is not active.
    pub fn alert_state(&self, alert: &str, instance: &str) -> Option<String> {
        self.api("/api/v1/alerts")["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == alert && a["labels"]["instance"] == instance)
            .and_then(|a| a["state"].as_str().map(str::to_owned))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One query of a dashboard panel.
pub struct PanelQuery {
    pub panel: String,
    pub unit: String,
    pub expr: String,
    pub legend: String,
}

/// Every query of every panel of `monitoring/dashboard.json`, with the
/// dashboard's variables as an "All" selection puts them (`$job` and
/// `$instance` match everything, `$__rate_interval` is 4s, what Grafana
/// makes of it with a 1 s scrape interval).
pub fn dashboard_queries() -> Vec<PanelQuery> {
    let dashboard = dashboard();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(PanelQuery {
                panel: panel["title"].as_str().unwrap().to_owned(),
                unit: panel["fieldConfig"]["defaults"]["unit"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                expr: target["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "4s")
                    .replace("$job", ".+")
                    .replace("$instance", ".+"),
                legend: target["legendFormat"].as_str().unwrap_or("").to_owned(),
            });
        }
    }
    out
}

/// `monitoring/dashboard.json`, parsed.
pub fn dashboard() -> serde_json::Value {
    let path = monitoring_dir().join("dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
