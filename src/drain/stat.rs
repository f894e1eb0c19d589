//! haproxy's `show stat` answer (CSV) -> each asked-for server's current
//! sessions (`scur`), queue (`qcur`) and `status`, sans-IO and streaming.
//!
//! In: the answer's bytes in any slices, as they arrive. Out: once the
//! answer's closing blank line has been read, the servers asked for that it
//! lists; or why the bytes are not a `show stat` answer.
//!
//! Always holds:
//! - the columns are found by the header's names (`# pxname,svname,…`), not
//!   by position;
//! - a quoted field (RFC 4180: `""` is a quote, commas and newlines are
//!   data; haproxy 2.6 quotes `last_agt`, which can hold a newline) is one
//!   field;
//! - memory is one record in progress (at most [`MAX_RECORD`]) plus the
//!   servers asked for, however long the answer runs, so a peer that never
//!   stops sending costs only the caller's time.

use std::collections::{HashMap, HashSet};

use crate::decimal::parse_uint;

/// The longest record (line) accepted: a server row of haproxy 2.6 or 3.0
/// is well under 2 KiB.
pub const MAX_RECORD: usize = 64 * 1024;

/// What haproxy says of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStat {
    /// `scur`: sessions on the server now.
    pub sessions: u64,
    /// `qcur`: requests queued for it.
    pub queued: u64,
    /// `status`: `UP`, `UP 1/3`, `DRAIN`, `DRAIN (agent)`, `MAINT`,
    /// `MAINT (via b/s)`, `DOWN`, `no check`, …
    pub status: String,
    /// `show servers state`'s `srv_admin_state`, once asked (`show stat`
    /// does not say that a DOWN server is held in drain).
    pub admin: Option<u64>,
}

/// `(backend, server)`.
pub type ServerKey = (String, String);

/// The columns read, by index in a record.
#[derive(Debug, Clone, Copy)]
struct Columns {
    pxname: usize,
    svname: usize,
    qcur: usize,
    scur: usize,
    status: usize,
}

impl Columns {
    fn width(&self) -> usize {
        1 + [self.pxname, self.svname, self.qcur, self.scur, self.status]
            .into_iter()
            .max()
            .unwrap_or(0)
    }
}

/// Reads one `show stat` answer, fed in slices.
#[derive(Debug)]
pub struct StatReader {
    wanted: HashSet<ServerKey>,
    /// The record in progress (complete ones are consumed at once).
    record: Vec<u8>,
    /// Whether the end of `record` is inside quotes.
    quoted: bool,
    columns: Option<Columns>,
    servers: HashMap<ServerKey, ServerStat>,
    done: bool,
}

impl StatReader {
    /// A reader keeping only the servers in `wanted`.
    pub fn new(wanted: HashSet<ServerKey>) -> StatReader {
        StatReader {
            wanted,
            record: Vec::new(),
            quoted: false,
            columns: None,
            servers: HashMap::new(),
            done: false,
        }
    }

    /// Reads `input`. `Ok(true)` once the closing blank line is read (the
    /// rest of `input` is ignored); `Ok(false)` for more.
    pub fn feed(&mut self, mut input: &[u8]) -> Result<bool, String> {
        while !self.done && !input.is_empty() {
            let (end, rest) = self.scan(input);
            let taken = input.len() - rest.len();
            if self.record.len() + taken > MAX_RECORD {
                return Err(format!("a line over {} KiB", MAX_RECORD >> 10));
            }
            self.record.extend_from_slice(&input[..taken]);
            input = rest;
            if end {
                let record = std::mem::take(&mut self.record);
                self.record_done(&record)?;
                self.record = record;
                self.record.clear();
            }
        }
        Ok(self.done)
    }

    /// The servers asked for that the answer lists, once it is complete;
    /// an answer that ended before its closing blank line is an error.
    pub fn finish(self) -> Result<HashMap<ServerKey, ServerStat>, String> {
        if !self.done {
            return Err(match self.columns {
                None if self.record.is_empty() => "an empty answer".to_owned(),
                None => not_show_stat(&self.record),
                Some(_) => "the answer was cut short".to_owned(),
            });
        }
        Ok(self.servers)
    }

    /// Finds the end of the record in `input` (a newline outside quotes):
    /// (found, the input after it).
    fn scan<'a>(&mut self, input: &'a [u8]) -> (bool, &'a [u8]) {
        for (i, &b) in input.iter().enumerate() {
            match b {
                b'"' => self.quoted = !self.quoted,
                b'\n' if !self.quoted => return (true, &input[i + 1..]),
                _ => {}
            }
        }
        (false, &[])
    }

    /// One whole record, its newline included.
    fn record_done(&mut self, record: &[u8]) -> Result<(), String> {
        let line = record.strip_suffix(b"\n").unwrap_or(record);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(columns) = self.columns else {
            self.columns = Some(header(line)?);
            return Ok(());
        };
        if line.is_empty() {
            self.done = true;
            return Ok(());
        }
        let fields = fields(line);
        if fields.len() < columns.width() {
            return Err(format!(
                "a row of {} fields, fewer than the header names",
                fields.len()
            ));
        }
        let key = (
            String::from_utf8_lossy(&fields[columns.pxname]).into_owned(),
            String::from_utf8_lossy(&fields[columns.svname]).into_owned(),
        );
        if !self.wanted.contains(&key) {
            return Ok(());
        }
        let number = |i: usize, name: &str| {
            parse_uint(&fields[i]).map_err(|_| {
                format!(
                    "{}/{}: {name} is {:?}, not a count",
                    key.0,
                    key.1,
                    String::from_utf8_lossy(&fields[i])
                )
            })
        };
        let stat = ServerStat {
            sessions: number(columns.scur, "scur")?,
            queued: number(columns.qcur, "qcur")?,
            status: String::from_utf8_lossy(&fields[columns.status]).into_owned(),
            admin: None,
        };
        // haproxy before 3.4 accepts two servers of one name in a backend
        // when both have an explicit `id`: their rows are summed, so the
        // second cannot hide the first's sessions.
        match self.servers.entry(key) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(stat);
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let held = e.get_mut();
                held.sessions = held.sessions.saturating_add(stat.sessions);
                held.queued = held.queued.saturating_add(stat.queued);
                if !held.status.split(',').any(|s| s == stat.status) {
                    held.status = format!("{},{}", held.status, stat.status);
                }
            }
        }
        Ok(())
    }
}

/// The header record: `# pxname,svname,…` with the columns read.
fn header(line: &[u8]) -> Result<Columns, String> {
    let Some(names) = line.strip_prefix(b"# ") else {
        return Err(not_show_stat(line));
    };
    let names = fields(names);
    let find = |name: &str| {
        names
            .iter()
            .position(|n| n == name.as_bytes())
            .ok_or_else(|| format!("the header has no {name} column"))
    };
    if names.first().map(Vec::as_slice) != Some(b"pxname") {
        return Err(not_show_stat(line));
    }
    Ok(Columns {
        pxname: find("pxname")?,
        svname: find("svname")?,
        qcur: find("qcur")?,
        scur: find("scur")?,
        status: find("status")?,
    })
}

/// What an answer that is not `show stat` began with (haproxy's own error
/// text, usually: "Unknown command", "Permission denied").
fn not_show_stat(first: &[u8]) -> String {
    let line = first.split(|&b| b == b'\n').next().unwrap_or_default();
    let shown = &line[..line.len().min(120)];
    format!(
        "not a show stat answer: \"{}\"",
        shown.trim_ascii().escape_ascii()
    )
}

/// The fields of one record, quotes removed.
fn fields(line: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut field = Vec::new();
    let mut quoted = false;
    let mut bytes = line.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        match (quoted, b) {
            (true, b'"') if bytes.peek() == Some(&b'"') => {
                bytes.next();
                field.push(b'"');
            }
            (true, b'"') | (false, b'"') => quoted = !quoted,
            (false, b',') => out.push(std::mem::take(&mut field)),
            (_, b) => field.push(b),
        }
    }
    out.push(field);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// haproxy 2.6's answer to `show stat -1 4 -1`, cut to the columns
    /// that matter and a few more, with a quoted multi-line `last_agt`.
    const ANSWER: &str = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,weight,last_agt,\n\
        app,s1,0,0,3,5,,9,DRAIN,100,\"drain 100%\n\",\n\
        app,s.2,1,1,0,0,,1,UP,100,,\n\
        other,s1,0,0,7,7,,7,MAINT (via app/s1),1,,\n\
        \n";

    fn wanted(ids: &[(&str, &str)]) -> HashSet<ServerKey> {
        ids.iter()
            .map(|(b, s)| (b.to_string(), s.to_string()))
            .collect()
    }

    fn read_in(
        slice: usize,
        text: &[u8],
        ids: &[(&str, &str)],
    ) -> Result<HashMap<ServerKey, ServerStat>, String> {
        let mut r = StatReader::new(wanted(ids));
        for part in text.chunks(slice.max(1)) {
            if r.feed(part)? {
                break;
            }
        }
        r.finish()
    }

    fn stat(sessions: u64, queued: u64, status: &str) -> ServerStat {
        ServerStat {
            sessions,
            queued,
            status: status.into(),
            admin: None,
        }
    }

    #[test]
    fn reads_the_asked_servers_by_column_name_in_any_slices() {
        let ids = [
            ("app", "s1"),
            ("app", "s.2"),
            ("other", "s1"),
            ("app", "nope"),
        ];
        for slice in [1, 2, 3, 7, 64, 4096] {
            let got = read_in(slice, ANSWER.as_bytes(), &ids).unwrap();
            assert_eq!(got.len(), 3, "slice {slice}");
            assert_eq!(got[&("app".into(), "s1".into())], stat(3, 0, "DRAIN"));
            assert_eq!(got[&("app".into(), "s.2".into())], stat(0, 1, "UP"));
            assert_eq!(
                got[&("other".into(), "s1".into())],
                stat(7, 0, "MAINT (via app/s1)")
            );
        }
        let only = read_in(4096, ANSWER.as_bytes(), &[("app", "s.2")]).unwrap();
        assert_eq!(only.len(), 1, "servers not asked for are not kept");
    }

    #[test]
    fn the_closing_blank_line_ends_the_answer_and_what_follows_is_ignored() {
        let mut r = StatReader::new(wanted(&[("app", "s1")]));
        assert_eq!(r.feed(b"# pxname,svname,qcur,scur,status\n"), Ok(false));
        assert_eq!(r.feed(b"app,s1,0,2,UP\r\n\r\nnot,csv\n"), Ok(true));
        assert_eq!(
            r.finish().unwrap()[&("app".into(), "s1".into())],
            stat(2, 0, "UP")
        );
    }

    #[test]
    fn haproxys_own_errors_and_cut_answers_are_named() {
        let unknown = b"Unknown command, but maybe one of the following ones is a better match:\n  show fd\n\n";
        assert_eq!(
            read_in(9, unknown, &[]).unwrap_err(),
            "not a show stat answer: \"Unknown command, but maybe one of the following ones is a better match:\""
        );
        assert_eq!(
            read_in(9, b"Permission denied\n", &[]).unwrap_err(),
            "not a show stat answer: \"Permission denied\""
        );
        assert_eq!(read_in(9, b"", &[]).unwrap_err(), "an empty answer");
        assert_eq!(
            read_in(9, b"Permis", &[]).unwrap_err(),
            "not a show stat answer: \"Permis\""
        );
        let cut = &ANSWER.as_bytes()[..ANSWER.len() - 1];
        assert_eq!(
            read_in(5, cut, &[]).unwrap_err(),
            "the answer was cut short"
        );
        assert_eq!(
            read_in(5, b"# pxname,svname,scur,status\n\n", &[]).unwrap_err(),
            "the header has no qcur column"
        );
        assert_eq!(
            read_in(5, b"# a,pxname,svname,qcur,scur,status\n\n", &[]).unwrap_err(),
            "not a show stat answer: \"# a,pxname,svname,qcur,scur,status\""
        );
    }

    #[test]
    fn a_short_row_or_a_count_that_is_not_one_is_garbage() {
        let head = "# pxname,svname,qcur,scur,status\n";
        let short = format!("{head}app,s1,0\n\n");
        assert_eq!(
            read_in(64, short.as_bytes(), &[]).unwrap_err(),
            "a row of 3 fields, fewer than the header names"
        );
        let bad = format!("{head}app,s1,0,x,UP\n\n");
        assert_eq!(
            read_in(64, bad.as_bytes(), &[("app", "s1")]).unwrap_err(),
            "app/s1: scur is \"x\", not a count"
        );
        let empty = format!("{head}app,s1,,0,UP\n\n");
        assert!(read_in(64, empty.as_bytes(), &[("app", "s1")]).is_err());
        // Not asked for: not read, so not an error.
        assert!(read_in(64, bad.as_bytes(), &[]).unwrap().is_empty());
    }

    #[test]
    fn a_line_without_end_is_refused_at_the_record_limit() {
        let mut r = StatReader::new(HashSet::new());
        r.feed(b"# pxname,svname,qcur,scur,status\n").unwrap();
        let chunk = vec![b'a'; 4096];
        let mut fed = 0;
        let err = loop {
            match r.feed(&chunk) {
                Ok(false) => fed += chunk.len(),
                Ok(true) => panic!("no blank line was sent"),
                Err(e) => break e,
            }
            assert!(fed <= MAX_RECORD, "kept more than a record");
        };
        assert_eq!(err, "a line over 64 KiB");
        // An open quote makes the rest one record: the same limit holds.
        let mut r = StatReader::new(HashSet::new());
        r.feed(b"# pxname,svname,qcur,scur,status\napp,\"").unwrap();
        let nl = vec![b'\n'; 4096];
        let err = (0..100).find_map(|_| r.feed(&nl).err()).unwrap();
        assert_eq!(err, "a line over 64 KiB");
    }

    #[test]
    fn two_rows_of_one_server_are_summed() {
        // 2.6 to 3.2 accept two `server s1` lines with explicit ids.
        let got = read_in(
            64,
            b"# pxname,svname,qcur,scur,status\napp,s1,1,3,DRAIN (agent)\napp,s1,0,0,MAINT\napp,s1,0,2,DRAIN (agent)\n\n",
            &[("app", "s1")],
        )
        .unwrap();
        let s1 = &got[&("app".to_owned(), "s1".to_owned())];
        assert_eq!((s1.sessions, s1.queued), (5, 1));
        assert_eq!(s1.status, "DRAIN (agent),MAINT");
    }

    #[test]
    fn quoted_fields_hold_commas_quotes_and_newlines() {
        assert_eq!(
            fields(b"a,\"b,\"\"c\"\"\nd\",,e"),
            vec![b"a".to_vec(), b"b,\"c\"\nd".to_vec(), vec![], b"e".to_vec()]
        );
    }
}
