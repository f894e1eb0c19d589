//! Prometheus, asked what haproxy's own exporter (`prometheus-exporter`)
//! says of some servers: the instant query, and its JSON answer -> per
//! server, per haproxy instance, the current sessions, queue and status.
//!
//! In: the servers; then the answer body of `GET /api/v1/query`. Out: the
//! query's path and query string; each server's instances.
//!
//! Always holds:
//! - pure;
//! - an answer that is not a `success` vector of these metrics with numeric
//!   values is an error naming what is wrong, never an empty result (the
//!   command never reads "no answer" as "no sessions").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::Deserialize;

use super::stat::ServerKey;
use crate::http::{percent_encode, EncodeSet};

pub const SESSIONS: &str = "haproxy_server_current_sessions";
pub const QUEUE: &str = "haproxy_server_current_queue";
/// One series per `state` label (`UP`, `DOWN`, `MAINT`, `DRAIN`, `NOLB`),
/// the current one at 1.
pub const STATUS: &str = "haproxy_server_status";

/// Labels that name the server or the metric, not the haproxy instance.
const NOT_INSTANCE: &[&str] = &["__name__", "proxy", "server", "state"];

/// What one haproxy instance (one scrape target) reports of a server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Instance {
    /// The `instance` label, else the instance's labels as `k=v,…`.
    pub name: String,
    pub sessions: Option<f64>,
    pub queued: Option<f64>,
    /// The `state` whose status series is 1.
    pub status: Option<String>,
}

/// Every instance's process start time (Unix seconds, as haproxy
/// exports it): a change is a restart or a reload, whose old process the
/// exporter no longer shows.
pub const START_TIME: &str = "haproxy_process_start_time_seconds";

/// What one poll of Prometheus says: the servers' series now, the
/// instances that reported each within the lookback, and each instance's
/// process start time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub servers: HashMap<ServerKey, Vec<Instance>>,
    pub seen: HashMap<ServerKey, BTreeSet<String>>,
    pub starts: HashMap<String, f64>,
    /// Each instance's start-time changes within the lookback (a reload or
    /// restart shortly before the run).
    pub restarts: HashMap<String, f64>,
}

/// The selector of `metrics` for `servers`, every instance's series apart.
fn selector(metrics: &str, servers: &[ServerKey]) -> String {
    let alternatives = |names: Vec<&str>| {
        let mut names: Vec<String> = names.into_iter().map(regex_literal).collect();
        names.sort();
        names.dedup();
        names.join("|")
    };
    let proxies = alternatives(servers.iter().map(|(b, _)| b.as_str()).collect());
    let names = alternatives(servers.iter().map(|(_, s)| s.as_str()).collect());
    format!(
        "{{__name__=~\"{metrics}\",proxy=~\"{}\",server=~\"{}\"}}",
        promql_string(&proxies),
        promql_string(&names),
    )
}

/// `/api/v1/query?query=…` (below the URL's path prefix).
fn query(prefix: &str, promql: &str) -> String {
    format!(
        "{prefix}/api/v1/query?query={}",
        percent_encode(promql, EncodeSet::GO_QUERY)
    )
}

/// The query of the three metrics of `servers` now.
pub fn query_target(prefix: &str, servers: &[ServerKey]) -> String {
    query(
        prefix,
        &selector(&format!("{SESSIONS}|{QUEUE}|{STATUS}"), servers),
    )
}

/// The query of the instances that reported `servers`' sessions within
/// `lookback` (`last_over_time`: a series that vanished since is still
/// there, so a scrape gap or a stopped haproxy cannot pass for drained).
pub fn lookback_target(prefix: &str, servers: &[ServerKey], lookback: Duration) -> String {
    let range = format!("{}s", lookback.as_secs().max(1));
    query(
        prefix,
        &format!("last_over_time({}[{range}])", selector(SESSIONS, servers)),
    )
}

/// The query of every instance's process start time.
pub fn start_times_target(prefix: &str) -> String {
    query(prefix, START_TIME)
}

/// The query of how often each instance's start time changed within
/// `lookback` (`changes`: a reload shortly before the run, which the
/// instant value alone cannot show).
pub fn restarts_target(prefix: &str, lookback: Duration) -> String {
    let range = format!("{}s", lookback.as_secs().max(1));
    query(prefix, &format!("changes({START_TIME}[{range}])"))
}

/// `name` as an RE2 regular expression matching exactly it.
fn regex_literal(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The inside of a PromQL double-quoted string holding `s`.
fn promql_string(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct Series {
    metric: BTreeMap<String, String>,
    value: (serde_json::Number, String),
}

/// A success vector's series, or what the answer is instead.
fn vector(body: &[u8]) -> Result<Vec<Series>, String> {
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| format!("not a Prometheus query answer: {e}"))?;
    if answer.status != "success" {
        // Outside text, cut as consul's error bodies are: a 3 MB error
        // would otherwise reach the terminal at every poll.
        let cut = |t: Option<&str>| crate::safe::error_body(t.unwrap_or("?").as_bytes(), &[]);
        return Err(format!(
            "Prometheus answered {}: {}: {}",
            cut(Some(&answer.status)),
            cut(answer.error_type.as_deref()),
            cut(answer.error.as_deref())
        ));
    }
    let data = answer
        .data
        .ok_or("a success answer without data".to_owned())?;
    if data.result_type != "vector" {
        return Err(format!("a {} result, not a vector", data.result_type));
    }
    serde_json::from_value(data.result)
        .map_err(|e| format!("a vector result that is not a list of series: {e}"))
}

/// A series' value as a count or a time: finite, not negative.
fn value(s: &Series, what: impl Fn() -> String) -> Result<f64, String> {
    s.value
        .1
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{} is {:?}, not a count", what(), s.value.1))
}

/// A server series' `proxy` and `server`.
fn server_of(s: &Series) -> Result<ServerKey, String> {
    match (s.metric.get("proxy"), s.metric.get("server")) {
        (Some(p), Some(v)) => Ok((p.clone(), v.clone())),
        _ => Err(format!("a series without proxy or server: {:?}", s.metric)),
    }
}

/// The answer body -> each server's instances (a server no instance
/// reports is absent).
pub fn read_answer(body: &[u8]) -> Result<HashMap<ServerKey, Vec<Instance>>, String> {
    let mut servers: HashMap<ServerKey, BTreeMap<String, Instance>> = HashMap::new();
    for s in vector(body)? {
        let Some(metric) = s.metric.get("__name__") else {
            return Err(format!("a series without __name__: {:?}", s.metric));
        };
        let (proxy, server) = server_of(&s)?;
        let value = value(&s, || format!("{metric} of {proxy}/{server}"))?;
        let key = instance_key(&s.metric);
        let instance = servers
            .entry((proxy, server))
            .or_default()
            .entry(key)
            .or_insert_with(|| Instance {
                name: instance_name(&s.metric),
                ..Instance::default()
            });
        match metric.as_str() {
            SESSIONS => instance.sessions = Some(value),
            QUEUE => instance.queued = Some(value),
            STATUS if value == 1.0 => instance.status = s.metric.get("state").cloned(),
            STATUS => {}
            other => return Err(format!("a series of {other}, which was not asked for")),
        }
    }
    Ok(servers
        .into_iter()
        .map(|(k, instances)| (k, instances.into_values().collect()))
        .collect())
}

/// The lookback answer -> the instances that reported each server.
pub fn read_seen(body: &[u8]) -> Result<HashMap<ServerKey, BTreeSet<String>>, String> {
    let mut seen: HashMap<ServerKey, BTreeSet<String>> = HashMap::new();
    for s in vector(body)? {
        seen.entry(server_of(&s)?)
            .or_default()
            .insert(instance_name(&s.metric));
    }
    Ok(seen)
}

/// The start-time (or start-time changes) answer -> each instance's value.
pub fn read_starts(body: &[u8]) -> Result<HashMap<String, f64>, String> {
    vector(body)?
        .iter()
        .map(|s| {
            let name = instance_name(&s.metric);
            let start = value(s, || format!("{START_TIME} of {name}"))?;
            Ok((name, start))
        })
        .collect()
}

/// The `instance` label, else the labels that tell instances apart.
fn instance_name(labels: &BTreeMap<String, String>) -> String {
    labels
        .get("instance")
        .cloned()
        .unwrap_or_else(|| instance_key(labels))
}

/// The labels that tell haproxy instances apart, as `k=v,…`.
fn instance_key(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .filter(|(k, _)| !NOT_INSTANCE.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: &str, s: &str) -> ServerKey {
        (b.into(), s.into())
    }

    #[test]
    fn the_query_asks_for_exactly_the_servers_names_escaped() {
        let t = query_target(
            "/prom",
            &[key("app", "s.1"), key("app", "s2"), key("w\"b", "s2")],
        );
        let q = t.strip_prefix("/prom/api/v1/query?query=").unwrap();
        let q =
            String::from_utf8(crate::http::percent_decode(&q.replace('+', " ")).unwrap()).unwrap();
        assert_eq!(
            q,
            r#"{__name__=~"haproxy_server_current_sessions|haproxy_server_current_queue|haproxy_server_status",proxy=~"app|w\"b",server=~"s2|s\\.1"}"#
        );
    }

    const ANSWER: &str = r#"{"status":"success","data":{"resultType":"vector","result":[
        {"metric":{"__name__":"haproxy_server_current_sessions","instance":"lb1:8405","job":"haproxy","proxy":"app","server":"s1"},"value":[1700000000.5,"2"]},
        {"metric":{"__name__":"haproxy_server_current_queue","instance":"lb1:8405","job":"haproxy","proxy":"app","server":"s1"},"value":[1700000000.5,"0"]},
        {"metric":{"__name__":"haproxy_server_status","instance":"lb1:8405","job":"haproxy","proxy":"app","server":"s1","state":"UP"},"value":[1700000000.5,"0"]},
        {"metric":{"__name__":"haproxy_server_status","instance":"lb1:8405","job":"haproxy","proxy":"app","server":"s1","state":"DRAIN"},"value":[1700000000.5,"1"]},
        {"metric":{"__name__":"haproxy_server_current_sessions","instance":"lb2:8405","job":"haproxy","proxy":"app","server":"s1"},"value":[1700000000.5,"0"]},
        {"metric":{"__name__":"haproxy_server_current_sessions","job":"x","proxy":"app","server":"s2"},"value":[1700000000,"1e0"]}
    ]}}"#;

    #[test]
    fn series_are_grouped_by_server_and_instance() {
        let got = read_answer(ANSWER.as_bytes()).unwrap();
        assert_eq!(got.len(), 2);
        let s1 = &got[&key("app", "s1")];
        assert_eq!(
            s1,
            &vec![
                Instance {
                    name: "lb1:8405".into(),
                    sessions: Some(2.0),
                    queued: Some(0.0),
                    status: Some("DRAIN".into()),
                },
                Instance {
                    name: "lb2:8405".into(),
                    sessions: Some(0.0),
                    queued: None,
                    status: None,
                },
            ]
        );
        let s2 = &got[&key("app", "s2")];
        assert_eq!(s2[0].name, "job=x");
        assert_eq!(s2[0].sessions, Some(1.0));
    }

    #[test]
    fn no_series_is_an_empty_answer_not_an_error() {
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(read_answer(empty.as_bytes()).unwrap().is_empty());
    }

    #[test]
    fn errors_and_garbage_are_named() {
        let cases = [
            (
                r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
                "Prometheus answered error: bad_data: parse error",
            ),
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#,
                "a scalar result, not a vector",
            ),
            (r#"{"status":"success"}"#, "a success answer without data"),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"haproxy_server_current_sessions","proxy":"a","server":"b"},"value":[1,"NaN"]}]}}"#,
                "haproxy_server_current_sessions of a/b is \"NaN\", not a count",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"haproxy_server_current_sessions","proxy":"a","server":"b"},"value":[1,"-1"]}]}}"#,
                "haproxy_server_current_sessions of a/b is \"-1\", not a count",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"up","proxy":"a","server":"b"},"value":[1,"1"]}]}}"#,
                "a series of up, which was not asked for",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(read_answer(body.as_bytes()).unwrap_err(), want, "{body}");
        }
        for garbage in [
            &b""[..],
            b"<html>",
            b"{\"status\":1}",
            b"{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":{}}}",
        ] {
            assert!(read_answer(garbage).is_err(), "{garbage:?}");
        }
        let no_labels = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"haproxy_server_current_sessions"},"value":[1,"0"]}]}}"#;
        assert!(read_answer(no_labels.as_bytes())
            .unwrap_err()
            .starts_with("a series without proxy or server"));
        let no_name = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"proxy":"a","server":"b"},"value":[1,"0"]}]}}"#;
        assert!(read_answer(no_name.as_bytes())
            .unwrap_err()
            .starts_with("a series without __name__"));
        assert!(read_seen(no_labels.as_bytes()).is_err());
        let start = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"lb1"},"value":[1,"-5"]}]}}"#;
        assert_eq!(
            read_starts(start.as_bytes()),
            Err("haproxy_process_start_time_seconds of lb1 is \"-5\", not a count".into())
        );
    }

    #[test]
    fn the_lookback_and_start_time_answers_name_each_instance() {
        let seen = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"instance":"lb1","job":"haproxy","proxy":"app","server":"s1"},"value":[1,"0"]},
            {"metric":{"instance":"lb2","job":"haproxy","proxy":"app","server":"s1"},"value":[1,"3"]},
            {"metric":{"job":"haproxy","proxy":"app","server":"s2"},"value":[1,"3"]}]}}"#;
        let got = read_seen(seen.as_bytes()).unwrap();
        assert_eq!(
            got[&key("app", "s1")],
            ["lb1".to_owned(), "lb2".to_owned()].into()
        );
        assert_eq!(got[&key("app", "s2")], ["job=haproxy".to_owned()].into());
        let starts = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"haproxy_process_start_time_seconds","instance":"lb1","job":"haproxy"},"value":[1,"1700000000"]}]}}"#;
        assert_eq!(
            read_starts(starts.as_bytes()),
            Ok([("lb1".to_owned(), 1_700_000_000.0)].into())
        );
        let lookback = lookback_target("/p", &[key("app", "s1")], Duration::from_secs(600));
        assert!(
            lookback.starts_with("/p/api/v1/query?query=last_over_time%28"),
            "{lookback}"
        );
        assert!(lookback.ends_with("%5B600s%5D%29"), "{lookback}");
    }

    #[test]
    fn a_huge_or_hostile_error_is_cut_and_escaped() {
        let body = format!(
            r#"{{"status":"error","errorType":"bad_data","error":"\u001b]52;c;x\u0007{}"}}"#,
            "A".repeat(3_000_000)
        );
        let got = read_answer(body.as_bytes()).unwrap_err();
        assert!(got.len() < 1024, "{}", got.len());
        assert!(
            !got.contains('\u{1b}') && got.starts_with("Prometheus answered error: bad_data: "),
            "{got}"
        );
    }
}
