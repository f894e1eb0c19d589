//! A consul stand-in in front of the dev KV that follows consul's rules
//! where the dev KV has no notion of them (ACLs) and loses answers the way
//! a network does. Each rule cites consul's source.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gitlab_haproxy_agent::http::{parse_request_head, Framing, Parse};

/// How the next `PUT /v1/txn` loses its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Applied by consul, then the connection closes with no answer.
    Dropped,
    /// Applied, then 500 "leadership lost while committing log"
    /// (hashicorp/raft `ErrLeadershipLost`, which consul's `wrap`
    /// returns as a 500): the entry may still be committed by the
    /// next leader.
    Status500,
    /// The connection closes before consul saw it: not applied.
    Unsent,
}

#[derive(Default)]
pub struct Rules {
    /// Key prefixes the token may not write.
    pub deny_write: Vec<String>,
    /// Key prefixes the token may not read.
    pub deny_read: Vec<String>,
    /// What happens to the next transactions' answers, in order.
    pub losses: VecDeque<Loss>,
    /// Run when the next loss is taken, before it: another writer
    /// racing the lost transaction.
    pub before_loss: Option<Box<dyn FnOnce() + Send>>,
    /// Transactions received.
    pub txns: usize,
}

pub struct Standin {
    pub addr: SocketAddr,
    pub rules: Arc<Mutex<Rules>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Standin {
    pub fn start(upstream: SocketAddr) -> Standin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let rules = Arc::new(Mutex::new(Rules::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (Arc::clone(&rules), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((c, _)) => serve(upstream, &r, c),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Standin { addr, rules, stop }
    }

    pub fn with(&self, f: impl FnOnce(&mut Rules)) {
        f(&mut self.rules.lock().unwrap());
    }
}

/// One request per connection (the writers open one each).
fn serve(upstream: SocketAddr, rules: &Mutex<Rules>, mut c: TcpStream) {
    c.set_nonblocking(false).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let (head, used) = loop {
        if let Parse::Done(h, used) = parse_request_head(&buf, 1 << 20) {
            break (h, used);
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let len = match head.framing {
        Framing::Length(n) => n as usize,
        _ => 0,
    };
    while buf.len() < used + len {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = &buf[used..used + len];
    let target = match head.query.is_empty() {
        true => head.path.clone(),
        false => format!("{}?{}", head.path, head.query),
    };
    let forward = || super::support::http_full(upstream, &head.method_name, &target, body);
    let (answer, filtered) = match (head.method_name.as_str(), head.path.as_str()) {
        ("PUT", "/v1/txn") => (txn(rules, body, forward), false),
        ("GET", path) => read(rules, path, &head.query, forward),
        _ => (forward().map(|(s, _, b)| (s, b)), false),
    };
    if let Some((status, body)) = answer {
        // Consul says when it left entries out (`agent/http.go`
        // `setResultsFilteredByACLs`, for a token that is authenticated).
        let filtered = match filtered {
            true => "X-Consul-Results-Filtered-By-ACLs: true\r\n",
            false => "",
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{filtered}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = c.write_all(head.as_bytes());
        let _ = c.write_all(&body);
    }
}

type Answer = Option<(u16, Vec<u8>)>;

/// consul checks every operation's ACL before the transaction reaches
/// raft (`agent/consul/txn_endpoint.go` `Txn.Apply` -> `preCheck` ->
/// `kvsPreApply`: `KeyWriteAllowed` for writes), lists each denied
/// one in `Errors` with `What: err.Error()`, and `agent/txn_endpoint.go`
/// `Txn` answers 409 for any error. `acl/errors.go`
/// `PermissionDeniedError.Error`: "Permission denied: token with
/// AccessorID '%s' lacks permission 'key:write' on %q" (1.12+).
fn txn(
    rules: &Mutex<Rules>,
    body: &[u8],
    forward: impl FnOnce() -> Option<(u16, super::support::Headers, Vec<u8>)>,
) -> Answer {
    let ops: Vec<serde_json::Value> = serde_json::from_slice(body).unwrap_or_default();
    let (loss, denied) = {
        let mut r = rules.lock().unwrap();
        r.txns += 1;
        let denied: Vec<serde_json::Value> = ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| {
                let key = op["KV"]["Key"].as_str()?;
                r.deny_write.iter().any(|p| key.starts_with(p.as_str())).then(|| {
                    serde_json::json!({"OpIndex": i, "What": format!(
                        "Permission denied: token with AccessorID '5e1f0000-0000-0000-0000-000000000000' lacks permission 'key:write' on {key:?}"
                    )})
                })
            })
            .collect();
        let loss = match denied.is_empty() {
            true => r.losses.pop_front(),
            false => None,
        };
        if loss.is_some() {
            if let Some(race) = r.before_loss.take() {
                race();
            }
        }
        (loss, denied)
    };
    if !denied.is_empty() {
        let answer = serde_json::json!({"Results": null, "Errors": denied});
        return Some((409, answer.to_string().into_bytes()));
    }
    match loss {
        Some(Loss::Unsent) => None,
        Some(Loss::Dropped) => {
            forward();
            None
        }
        Some(Loss::Status500) => {
            forward();
            Some((500, b"leadership lost while committing log".to_vec()))
        }
        None => forward().map(|(s, _, b)| (s, b)),
    }
}

/// A recursive listing is filtered by ACL, not refused
/// (`agent/consul/kvs_endpoint.go` `KVS.List` -> `filterACL`), and an
/// emptied one is 404; a single key without `key:read` is 403
/// (`KVS.Get`: `acl.ErrPermissionDenied`; `agent/http.go` `wrap`).
fn read(
    rules: &Mutex<Rules>,
    path: &str,
    query: &str,
    forward: impl FnOnce() -> Option<(u16, super::support::Headers, Vec<u8>)>,
) -> (Answer, bool) {
    let deny = rules.lock().unwrap().deny_read.clone();
    let key = path.strip_prefix("/v1/kv/").unwrap_or("").to_owned();
    let hidden = |k: &str| deny.iter().any(|p| k.starts_with(p.as_str()));
    if !query.contains("recurse") && hidden(&key) {
        return (Some((403, b"Permission denied".to_vec())), false);
    }
    let Some((status, _, body)) = forward() else {
        return (None, false);
    };
    if status != 200 || !query.contains("recurse") {
        return (Some((status, body)), false);
    }
    let mut list: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    let all = list.len();
    list.retain(|e| !hidden(e["Key"].as_str().unwrap_or("")));
    let filtered = list.len() < all;
    match list.is_empty() {
        true => (Some((404, Vec::new())), filtered),
        false => (Some((200, serde_json::to_vec(&list).unwrap())), filtered),
    }
}
