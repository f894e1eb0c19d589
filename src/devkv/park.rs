//! Blocking queries of the dev KV, parked until they must be answered.
//!
//! In: a [`Wait`] per connection that sent a blocking GET (`park`), the KV
//! after each write (`woken`), the time (`expired`). Out: the connections
//! to answer now, each with its wait (the KV renders the answer).
//!
//! Always holds:
//! - a connection has at most one parked query;
//! - a query leaves exactly once (woken, expired or `unpark`ed when its
//!   connection closes), so a connection is never answered twice.
//!
//! Connections are named by the caller's handle `C` (the core's
//! connection id); the caller unparks a handle before reusing it. A few hundred parked queries at
//! most (the dev KV's pool), so a vector scanned per write is the right size.

use std::time::Instant;

use super::{DevKv, Wait};

/// The parked queries.
#[derive(Debug)]
pub struct Parking<C> {
    parked: Vec<(C, Wait)>,
}

impl<C> Default for Parking<C> {
    fn default() -> Parking<C> {
        Parking { parked: Vec::new() }
    }
}

impl<C: Copy + PartialEq> Parking<C> {
    /// Parks `wait` for connection `conn` (replacing any query it had).
    pub fn park(&mut self, conn: C, wait: Wait) {
        self.unpark(conn);
        self.parked.push((conn, wait));
    }

    /// Takes the query parked for `conn` (its connection is closing).
    pub fn unpark(&mut self, conn: C) -> Option<Wait> {
        let i = self.parked.iter().position(|(c, _)| *c == conn)?;
        Some(self.parked.swap_remove(i).1)
    }

    pub fn is_parked(&self, conn: C) -> bool {
        self.parked.iter().any(|(c, _)| *c == conn)
    }

    pub fn len(&self) -> usize {
        self.parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// After a write: takes every query whose prefix moved past its index.
    pub fn woken(&mut self, kv: &DevKv) -> Vec<(C, Wait)> {
        self.take_where(|w| kv.is_ready(w))
    }

    /// Takes every query whose wait is over at `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<(C, Wait)> {
        self.take_where(|w| w.deadline <= now)
    }

    /// When the next wait ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.parked.iter().map(|(_, w)| w.deadline).min()
    }

    fn take_where(&mut self, due: impl Fn(&Wait) -> bool) -> Vec<(C, Wait)> {
        if !self.parked.iter().any(|(_, w)| due(w)) {
            return Vec::new(); // the usual case: no allocation
        }
        let (take, keep) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|(_, w)| due(w));
        self.parked = keep;
        take
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::devkv::Handled;
    use crate::http::{parse_request_head, Parse};

    fn send(kv: &mut DevKv, method: &str, target: &str, body: &[u8], now: Instant) -> Handled {
        let raw = format!(
            "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let Parse::Done(head, _) = parse_request_head(raw.as_bytes(), 8192) else {
            panic!("bad test request {raw:?}");
        };
        kv.handle(&head, body, now)
    }

    fn put(kv: &mut DevKv, key: &str, now: Instant) -> u64 {
        assert!(matches!(
            send(kv, "PUT", &format!("/v1/kv/{key}"), b"drain", now),
            Handled::Respond(_)
        ));
        kv.generation()
    }

    fn wait(kv: &mut DevKv, prefix: &str, index: u64, secs: u64, now: Instant) -> Wait {
        let target = format!("/v1/kv/{prefix}/?recurse&index={index}&wait={secs}s");
        match send(kv, "GET", &target, b"", now) {
            Handled::Wait(w) => w,
            Handled::Respond(r) => panic!("{target} answered at once: {}", r.status),
        }
    }

    fn keys(v: &[(usize, Wait)]) -> Vec<usize> {
        let mut k: Vec<usize> = v.iter().map(|(k, _)| *k).collect();
        k.sort();
        k
    }

    #[test]
    fn a_write_wakes_only_the_queries_on_its_prefix() {
        let now = Instant::now();
        let mut kv = DevKv::new(false);
        // (An empty prefix's index is the table's: every write moves it.)
        put(&mut kv, "b/x", now);
        let i = put(&mut kv, "a/x", now);
        let mut p = Parking::default();
        p.park(1, wait(&mut kv, "a", i, 60, now));
        p.park(2, wait(&mut kv, "b", i, 60, now));
        p.park(3, wait(&mut kv, "a", i, 60, now));
        assert!(p.woken(&kv).is_empty(), "nothing written yet");
        put(&mut kv, "a/y", now);
        assert_eq!(keys(&p.woken(&kv)), [1, 3]);
        assert_eq!(p.len(), 1);
        assert!(p.is_parked(2) && !p.is_parked(1));
        assert!(p.woken(&kv).is_empty(), "each query leaves once");
    }

    #[test]
    fn waits_end_at_their_deadline() {
        let now = Instant::now();
        let mut kv = DevKv::new(false);
        let i = put(&mut kv, "a/x", now);
        let mut p = Parking::default();
        assert_eq!(p.next_deadline(), None);
        p.park(7, wait(&mut kv, "a", i, 2, now));
        p.park(8, wait(&mut kv, "a", i, 5, now));
        assert_eq!(p.next_deadline(), Some(now + Duration::from_secs(2)));
        assert!(p.expired(now + Duration::from_secs(1)).is_empty());
        assert_eq!(keys(&p.expired(now + Duration::from_secs(2))), [7]);
        assert_eq!(p.next_deadline(), Some(now + Duration::from_secs(5)));
        assert_eq!(keys(&p.expired(now + Duration::from_secs(9))), [8]);
        assert!(p.is_empty());
    }

    #[test]
    fn a_closing_connection_takes_its_query_with_it() {
        let now = Instant::now();
        let mut kv = DevKv::new(false);
        let i = put(&mut kv, "a/x", now);
        let mut p = Parking::default();
        p.park(4, wait(&mut kv, "a", i, 60, now));
        // Parking again replaces: one query per connection.
        p.park(4, wait(&mut kv, "a", i, 30, now));
        assert_eq!(p.len(), 1);
        assert!(p.unpark(4).is_some());
        assert!(p.unpark(4).is_none());
        put(&mut kv, "a/y", now);
        assert!(p.woken(&kv).is_empty());
    }
}
