//! haproxy's other CLI answers that `wait-drained` and
//! `save-server-state` read, sans-IO: `show info` (which process answers a
//! stats socket), the master CLI's `show proc` (every worker, old ones
//! included), `show servers state` (each server's admin state, which `show
//! stat` does not show for a DOWN server) and the same answer whole, to be
//! saved as haproxy's `server-state-file` ([`DumpReader`]).
//!
//! In: an answer's bytes in any slices, as they arrive. Out: once its
//! closing blank line is read (or the peer closed, for `show proc`), what
//! it says; or why the bytes are not that answer.
//!
//! Always holds:
//! - memory is one line in progress (at most [`MAX_RECORD`]) plus what is
//!   kept (the servers asked for, the workers), however long the answer
//!   runs;
//! - a field that is not what haproxy writes there is an error, never a 0.

use std::collections::{HashMap, HashSet};

use super::stat::{ServerKey, MAX_RECORD};
use crate::decimal::parse_uint;

/// Splits an answer into lines, fed in slices, until its blank line.
#[derive(Debug, Default)]
pub struct Lines {
    held: Vec<u8>,
    done: bool,
}

impl Lines {
    /// Hands each complete line (without its `\n` or `\r\n`) to `line`;
    /// `Ok(true)` once the closing blank line is read (what follows is not
    /// read). An empty `input` is the peer's close.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        mut line: impl FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<bool, String> {
        while !self.done && !input.is_empty() {
            let Some(end) = input.iter().position(|&b| b == b'\n') else {
                if self.held.len() + input.len() > MAX_RECORD {
                    return Err(format!("a line over {} KiB", MAX_RECORD >> 10));
                }
                self.held.extend_from_slice(input);
                return Ok(false);
            };
            if self.held.len() + end > MAX_RECORD {
                return Err(format!("a line over {} KiB", MAX_RECORD >> 10));
            }
            self.held.extend_from_slice(&input[..end]);
            input = &input[end + 1..];
            let whole = std::mem::take(&mut self.held);
            let text = whole.strip_suffix(b"\r").unwrap_or(&whole);
            if text.is_empty() {
                self.done = true;
            } else {
                line(text)?;
            }
        }
        Ok(self.done)
    }

    pub fn done(&self) -> bool {
        self.done
    }
}

/// The process behind a stats socket, from `show info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pub pid: u64,
    /// `Start_time_sec` (Unix seconds; 2.6 and later write it).
    pub start: Option<u64>,
}

/// Reads a `show info` answer.
#[derive(Debug, Default)]
pub struct InfoReader {
    lines: Lines,
    pid: Option<u64>,
    start: Option<u64>,
    first: bool,
}

impl InfoReader {
    pub fn feed(&mut self, input: &[u8]) -> Result<bool, String> {
        let (pid, start, first) = (&mut self.pid, &mut self.start, &mut self.first);
        self.lines.feed(input, |line| {
            let Some((name, value)) = split_once(line, b": ") else {
                return Err(not_answer("show info", line));
            };
            if !*first && name != b"Name" {
                return Err(not_answer("show info", line));
            }
            *first = true;
            let number = || {
                parse_uint(value).map_err(|_| {
                    format!(
                        "show info: {} is {:?}, not a number",
                        name.escape_ascii(),
                        value.escape_ascii().to_string()
                    )
                })
            };
            match name {
                b"Pid" => *pid = Some(number()?),
                b"Start_time_sec" => *start = Some(number()?),
                _ => {}
            }
            Ok(())
        })
    }

    pub fn finish(self) -> Result<Process, String> {
        if !self.lines.done() {
            return Err("the show info answer was cut short".into());
        }
        let pid = self.pid.ok_or("show info without a Pid line")?;
        Ok(Process {
            pid,
            start: self.start,
        })
    }
}

/// One worker the master lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worker {
    pub pid: u64,
    /// Listed under `# old workers`: a reload left it serving its
    /// sessions.
    pub old: bool,
}

/// Where a `show proc` line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Section {
    #[default]
    Header,
    Master,
    Workers,
    OldWorkers,
    /// `# programs` and any later section: not workers.
    Other,
}

/// Reads the master CLI's `show proc` answer (the master closes the
/// connection after it; it has no closing blank line before 3.x).
#[derive(Debug, Default)]
pub struct ProcReader {
    lines: Lines,
    section: Section,
    workers: Vec<Worker>,
    /// Bytes read so far: at most [`MAX_PROC`].
    read: usize,
}

/// The longest `show proc` answer read: a line is some 80 bytes, so 1 MiB
/// is over 10,000 processes (a host has a handful: the master, its worker,
/// the old workers of recent reloads). Bounds the workers kept.
pub const MAX_PROC: usize = 1 << 20;

impl ProcReader {
    pub fn feed(&mut self, input: &[u8]) -> Result<bool, String> {
        self.read = self.read.saturating_add(input.len());
        if self.read > MAX_PROC {
            return Err(format!("a show proc answer over {} MiB", MAX_PROC >> 20));
        }
        let (section, workers) = (&mut self.section, &mut self.workers);
        self.lines.feed(input, |line| {
            if *section == Section::Header {
                if !line.starts_with(b"#<PID>") {
                    return Err(not_answer("show proc", line));
                }
                *section = Section::Master;
                return Ok(());
            }
            if let Some(name) = line.strip_prefix(b"# ") {
                *section = match name.trim_ascii() {
                    b"workers" => Section::Workers,
                    b"old workers" => Section::OldWorkers,
                    _ => Section::Other,
                };
                return Ok(());
            }
            let old = match *section {
                Section::Workers => false,
                Section::OldWorkers => true,
                _ => return Ok(()),
            };
            let mut fields = line
                .split(|b| b.is_ascii_whitespace())
                .filter(|f| !f.is_empty());
            let (Some(pid), Some(kind)) = (fields.next(), fields.next()) else {
                return Err(format!(
                    "show proc: a worker line {:?}",
                    line.escape_ascii().to_string()
                ));
            };
            if kind != b"worker" {
                return Ok(());
            }
            let pid = parse_uint(pid).map_err(|_| {
                format!(
                    "show proc: a worker pid {:?}",
                    pid.escape_ascii().to_string()
                )
            })?;
            workers.push(Worker { pid, old });
            Ok(())
        })
    }

    /// The workers, once the answer ended (its blank line or the close).
    pub fn finish(self) -> Result<Vec<Worker>, String> {
        match self.section {
            Section::Header => Err("an empty show proc answer".into()),
            _ if self.workers.is_empty() => Err("show proc lists no worker".into()),
            _ => Ok(self.workers),
        }
    }
}

/// Reads a `show servers state` answer: each asked-for server's
/// `srv_admin_state` (haproxy's `SRV_ADMF_*` bits: 0x01 forced maint,
/// 0x08 forced drain, …; 0 takes new sessions).
#[derive(Debug)]
pub struct StateReader {
    lines: Lines,
    wanted: HashSet<ServerKey>,
    /// The columns of be_name, srv_name and srv_admin_state.
    columns: Option<[usize; 3]>,
    version: bool,
    admin: HashMap<ServerKey, u64>,
}

impl StateReader {
    pub fn new(wanted: HashSet<ServerKey>) -> StateReader {
        StateReader {
            lines: Lines::default(),
            wanted,
            columns: None,
            version: false,
            admin: HashMap::new(),
        }
    }

    pub fn feed(&mut self, input: &[u8]) -> Result<bool, String> {
        let (wanted, admin) = (&self.wanted, &mut self.admin);
        let (columns, version) = (&mut self.columns, &mut self.version);
        self.lines.feed(input, |line| {
            if !*version {
                // The format version, "1" since 1.6.
                if line.trim_ascii() != b"1" {
                    return Err(not_answer("show servers state", line));
                }
                *version = true;
                return Ok(());
            }
            let fields: Vec<&[u8]> = line
                .split(|b| b.is_ascii_whitespace())
                .filter(|f| !f.is_empty())
                .collect();
            let Some(cols) = *columns else {
                let find = |name: &[u8]| {
                    fields
                        .iter()
                        .position(|f| *f == name)
                        .map(|i| i - 1)
                        .ok_or_else(|| {
                            format!(
                                "show servers state: the header has no {} column",
                                name.escape_ascii()
                            )
                        })
                };
                if fields.first() != Some(&&b"#"[..]) {
                    return Err(not_answer("show servers state", line));
                }
                *columns = Some([
                    find(b"be_name")?,
                    find(b"srv_name")?,
                    find(b"srv_admin_state")?,
                ]);
                return Ok(());
            };
            if fields.first().is_some_and(|f| f.starts_with(b"#")) {
                return Ok(());
            }
            let [be, srv, adm] = cols;
            if fields.len() <= be.max(srv).max(adm) {
                return Err(format!(
                    "show servers state: a row of {} fields, fewer than the header names",
                    fields.len()
                ));
            }
            let key = (
                String::from_utf8_lossy(fields[be]).into_owned(),
                String::from_utf8_lossy(fields[srv]).into_owned(),
            );
            if wanted.contains(&key) {
                let state = parse_uint(fields[adm]).map_err(|_| {
                    format!(
                        "{}/{}: srv_admin_state is {:?}, not a number",
                        key.0,
                        key.1,
                        fields[adm].escape_ascii().to_string()
                    )
                })?;
                // Two servers of one name (haproxy before 3.4, explicit
                // ids): held out only if both are.
                let held = admin.entry(key).or_insert(state);
                *held = (*held).min(state);
            }
            Ok(())
        })
    }

    pub fn finish(self) -> Result<HashMap<ServerKey, u64>, String> {
        if !self.lines.done() {
            return Err("the show servers state answer was cut short".into());
        }
        Ok(self.admin)
    }
}

/// The most a saved `show servers state` answer may hold (about 200
/// bytes a server: 64 MiB is some 300,000 servers).
pub const MAX_DUMP: usize = 64 << 20;

/// A whole `show servers state` answer, checked, as haproxy's
/// `server-state-file` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// The answer's lines, each ended by `\n`, and the closing empty line.
    pub bytes: Vec<u8>,
    pub servers: u64,
    /// Backends with at least one server (distinct `be_id`).
    pub backends: u64,
}

/// Reads a `show servers state` answer whole, to be saved: the version
/// line `1`, the `# be_id …` header, rows of exactly the header's number
/// of fields, the closing empty line. Memory is the answer, at most
/// [`MAX_DUMP`].
#[derive(Debug, Default)]
pub struct DumpReader {
    lines: Lines,
    bytes: Vec<u8>,
    version: bool,
    /// The header's number of field names.
    fields: Option<usize>,
    servers: u64,
    backends: HashSet<Vec<u8>>,
}

impl DumpReader {
    pub fn feed(&mut self, input: &[u8]) -> Result<bool, String> {
        let (bytes, version, fields) = (&mut self.bytes, &mut self.version, &mut self.fields);
        let (servers, backends) = (&mut self.servers, &mut self.backends);
        let done = self.lines.feed(input, |line| {
            if bytes.len() + line.len() + 2 > MAX_DUMP {
                return Err(format!(
                    "a show servers state answer over {} MiB",
                    MAX_DUMP >> 20
                ));
            }
            let words = || {
                line.split(|b| b.is_ascii_whitespace())
                    .filter(|f| !f.is_empty())
            };
            if !*version {
                if line.trim_ascii() != b"1" {
                    return Err(not_answer("show servers state", line));
                }
                *version = true;
            } else if let Some(n) = *fields {
                let got = words().count();
                if got != n {
                    return Err(format!(
                        "show servers state: a row of {got} fields where the header names {n}"
                    ));
                }
                *servers += 1;
                if let Some(be_id) = words().next() {
                    if !backends.contains(be_id) {
                        backends.insert(be_id.to_vec());
                    }
                }
            } else {
                let mut names = words();
                if names.next() != Some(b"#") || names.next() != Some(b"be_id") {
                    return Err(not_answer("show servers state", line));
                }
                *fields = Some(1 + names.count());
            }
            bytes.extend_from_slice(line);
            bytes.push(b'\n');
            Ok(())
        })?;
        if done {
            self.bytes.push(b'\n');
        }
        Ok(done)
    }

    /// The answer, once its closing empty line was read.
    pub fn finish(self) -> Result<Dump, String> {
        match (self.version, self.fields, self.lines.done()) {
            (false, _, _) => return Err("an empty answer".into()),
            (true, None, _) => return Err("the show servers state answer has no header".into()),
            (true, Some(_), false) => {
                return Err("the show servers state answer was cut short".into())
            }
            (true, Some(_), true) => {}
        }
        if self.servers == 0 {
            return Err("the show servers state answer lists no server".into());
        }
        Ok(Dump {
            bytes: self.bytes,
            servers: self.servers,
            backends: self.backends.len() as u64,
        })
    }
}

fn split_once<'a>(line: &'a [u8], sep: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    let at = line.windows(sep.len()).position(|w| w == sep)?;
    Some((&line[..at], &line[at + sep.len()..]))
}

/// What an answer that is not `what` began with (haproxy's own error text,
/// usually: "Unknown command", "Permission denied").
fn not_answer(what: &str, line: &[u8]) -> String {
    let shown = &line[..line.len().min(120)];
    format!(
        "not a {what} answer: \"{}\"",
        shown.trim_ascii().escape_ascii()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `answer` in slices of `n`; the reader's `finish`.
    fn read<R, T>(
        mut reader: R,
        answer: &[u8],
        n: usize,
        feed: fn(&mut R, &[u8]) -> Result<bool, String>,
        finish: fn(R) -> Result<T, String>,
    ) -> Result<T, String> {
        for part in answer.chunks(n.max(1)) {
            if feed(&mut reader, part)? {
                break;
            }
        }
        finish(reader)
    }

    /// 2.6.12's `show info`, cut.
    const INFO: &[u8] = b"Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nPid: 16512\nUptime_sec: 7\nStart_time_sec: 1796396409\nCurrConns: 0\n\n";

    #[test]
    fn show_info_names_the_process_in_any_slices() {
        for n in [1, 3, INFO.len()] {
            let got = read(
                InfoReader::default(),
                INFO,
                n,
                InfoReader::feed,
                InfoReader::finish,
            );
            assert_eq!(
                got,
                Ok(Process {
                    pid: 16512,
                    start: Some(1796396409)
                }),
                "slices of {n}"
            );
        }
        let old = b"Name: HAProxy\nPid: 7\n\n";
        let got = read(
            InfoReader::default(),
            old,
            64,
            InfoReader::feed,
            InfoReader::finish,
        );
        assert_eq!(
            got,
            Ok(Process {
                pid: 7,
                start: None
            })
        );
    }

    #[test]
    fn show_info_errors_are_named() {
        let cases: [(&[u8], &str); 4] = [
            (
                b"Unknown command: 'show info'\n\n",
                "not a show info answer: \"Unknown command: \\'show info\\'\"",
            ),
            (
                b"Name: HAProxy\nPid: x\n\n",
                "show info: Pid is \"x\", not a number",
            ),
            (
                b"Name: HAProxy\nUptime_sec: 1\n\n",
                "show info without a Pid line",
            ),
            (
                b"Name: HAProxy\nPid: 1\n",
                "the show info answer was cut short",
            ),
        ];
        for (answer, want) in cases {
            let got = read(
                InfoReader::default(),
                answer,
                64,
                InfoReader::feed,
                InfoReader::finish,
            );
            assert_eq!(got, Err(want.to_owned()));
        }
    }

    /// 2.6.12's `show proc` after a reload with a session held (2.6 ends
    /// with the close, 3.x as below).
    const PROC: &[u8] =
        b"#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
16421           master          1 [failed: 0]   0d00h00m02s     2.6.12-1+deb12u4\n\
# workers\n\
16512           worker          0               0d00h00m01s     2.6.12-1+deb12u4\n\
# old workers\n\
16423           worker          1               0d00h00m02s     2.6.12-1+deb12u4\n\
# programs\n\
16430           program         0               0d00h00m02s     -\n\n";

    #[test]
    fn show_proc_lists_the_workers_and_marks_the_old_ones() {
        for n in [1, 7, PROC.len()] {
            let got = read(
                ProcReader::default(),
                PROC,
                n,
                ProcReader::feed,
                ProcReader::finish,
            );
            assert_eq!(
                got,
                Ok(vec![
                    Worker {
                        pid: 16512,
                        old: false
                    },
                    Worker {
                        pid: 16423,
                        old: true
                    },
                ]),
                "slices of {n}"
            );
        }
        // 2.6: the answer ends with the close, without a blank line.
        let cut = &PROC[..PROC.len() - 1];
        let got = read(
            ProcReader::default(),
            cut,
            64,
            ProcReader::feed,
            ProcReader::finish,
        );
        assert_eq!(got.map(|w| w.len()), Ok(2));
    }

    #[test]
    fn show_proc_errors_are_named() {
        let cases: [(&[u8], &str); 3] = [
            (b"", "an empty show proc answer"),
            (
                b"Unknown command.\n",
                "not a show proc answer: \"Unknown command.\"",
            ),
            (
                b"#<PID> <type>\n1 master 0\n# workers\n# programs\n\n",
                "show proc lists no worker",
            ),
        ];
        for (answer, want) in cases {
            let got = read(
                ProcReader::default(),
                answer,
                64,
                ProcReader::feed,
                ProcReader::finish,
            );
            assert_eq!(got, Err(want.to_owned()));
        }
        let bad = b"#<PID>\n1 master\n# workers\nabc worker 0\n\n";
        let got = read(
            ProcReader::default(),
            bad,
            64,
            ProcReader::feed,
            ProcReader::finish,
        );
        assert_eq!(got, Err("show proc: a worker pid \"abc\"".to_owned()));
    }

    fn wanted() -> HashSet<ServerKey> {
        [("be", "s1"), ("be", "s2")]
            .into_iter()
            .map(|(b, s)| (b.to_owned(), s.to_owned()))
            .collect()
    }

    /// 2.6.12's `show servers state`: s1 in forced drain (8) and DOWN
    /// (op state 0), s2 ready.
    const STATE: &[u8] = b"1\n\
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
2 be 1 s1 127.0.0.1 0 8 100 100 1 1 0 2 0 0 0 0 - 1 - 0 0 - - 0\n\
2 be 2 s2 127.0.0.1 2 0 100 100 1 1 0 2 0 0 0 0 - 1 - 0 0 - - 0\n\
3 other 1 s1 127.0.0.1 2 1 100 100 1 1 0 2 0 0 0 0 - 1 - 0 0 - - 0\n\n";

    #[test]
    fn two_servers_of_one_name_are_held_only_if_both_are() {
        let twice = b"1\n# be_id be_name srv_id srv_name srv_admin_state\n2 be 1 s1 8\n2 be 2 s1 0\n2 be 3 s2 1\n2 be 4 s2 8\n\n";
        let got = read(
            StateReader::new(wanted()),
            twice,
            7,
            StateReader::feed,
            StateReader::finish,
        )
        .unwrap();
        assert_eq!(got[&("be".to_owned(), "s1".to_owned())], 0);
        assert_eq!(got[&("be".to_owned(), "s2".to_owned())], 1);
    }

    #[test]
    fn show_servers_state_gives_the_admin_bits_of_the_servers_asked() {
        for n in [1, 5, STATE.len()] {
            let got = read(
                StateReader::new(wanted()),
                STATE,
                n,
                StateReader::feed,
                StateReader::finish,
            )
            .unwrap();
            assert_eq!(got.len(), 2, "slices of {n}");
            assert_eq!(got[&("be".to_owned(), "s1".to_owned())], 8);
            assert_eq!(got[&("be".to_owned(), "s2".to_owned())], 0);
        }
    }

    #[test]
    fn show_servers_state_errors_are_named() {
        let cases: [(&[u8], &str); 4] = [
            (
                b"Permission denied\n\n",
                "not a show servers state answer: \"Permission denied\"",
            ),
            (
                b"1\n# be_name srv_name\n\n",
                "show servers state: the header has no srv_admin_state column",
            ),
            (
                b"1\n# be_name srv_name srv_admin_state\nbe s1\n\n",
                "show servers state: a row of 2 fields, fewer than the header names",
            ),
            (
                b"1\n# be_name srv_name srv_admin_state\nbe s1 x\n\n",
                "be/s1: srv_admin_state is \"x\", not a number",
            ),
        ];
        for (answer, want) in cases {
            let got = read(
                StateReader::new(wanted()),
                answer,
                64,
                StateReader::feed,
                StateReader::finish,
            );
            assert_eq!(got, Err(want.to_owned()), "{}", answer.escape_ascii());
        }
        let long = [b'x'; MAX_RECORD + 1];
        let got = read(
            StateReader::new(wanted()),
            &long,
            4096,
            StateReader::feed,
            StateReader::finish,
        );
        assert_eq!(got, Err("a line over 64 KiB".to_owned()));
    }

    fn dump(answer: &[u8], n: usize) -> Result<Dump, String> {
        read(
            DumpReader::default(),
            answer,
            n,
            DumpReader::feed,
            DumpReader::finish,
        )
    }

    #[test]
    fn a_whole_show_servers_state_is_kept_byte_for_byte_and_counted() {
        for n in [1, 3, 64, STATE.len()] {
            let got = dump(STATE, n).unwrap();
            assert_eq!(got.bytes, STATE, "slices of {n}");
            assert_eq!((got.servers, got.backends), (3, 2), "slices of {n}");
        }
        // What follows the closing empty line is not part of the answer.
        let mut trailing = STATE.to_vec();
        trailing.extend_from_slice(b"more\n");
        assert_eq!(dump(&trailing, 7).unwrap().bytes, STATE);
        // CRLF line ends are saved as haproxy writes its own file: LF.
        let crlf = b"1\r\n# be_id be_name\r\n2 be\r\n\r\n";
        assert_eq!(
            dump(crlf, 4).unwrap().bytes,
            b"1\n# be_id be_name\n2 be\n\n"
        );
    }

    #[test]
    fn anything_but_a_complete_show_servers_state_is_refused() {
        let header = "1\n# be_id be_name srv_id srv_name\n";
        let cases: [(String, &str); 9] = [
            (String::new(), "an empty answer"),
            ("\n".into(), "an empty answer"),
            (
                "Can't find the target PID matching the prefix '@!12'\n\n".into(),
                "not a show servers state answer: \"Can\\'t find the target PID matching the prefix \\'@!12\\'\"",
            ),
            ("2\n# be_id\n1 a\n\n".into(), "not a show servers state answer: \"2\""),
            ("1\n".into(), "the show servers state answer has no header"),
            ("1\n\n".into(), "the show servers state answer has no header"),
            ("1\n# be_name be_id\n\n".into(), "not a show servers state answer: \"# be_name be_id\""),
            (format!("{header}2 be 1\n\n"), "show servers state: a row of 3 fields where the header names 4"),
            (format!("{header}2 be 1 s1\n"), "the show servers state answer was cut short"),
        ];
        for (answer, want) in &cases {
            for n in [1, 5, 4096] {
                let got = dump(answer.as_bytes(), n);
                assert_eq!(got, Err(want.to_string()), "{answer:?} in slices of {n}");
            }
        }
        assert_eq!(
            dump(format!("{header}\n").as_bytes(), 4),
            Err("the show servers state answer lists no server".into())
        );
        let long_row = format!("{header}2 be 1 {}\n\n", "x".repeat(MAX_RECORD));
        assert_eq!(
            dump(long_row.as_bytes(), 4096),
            Err("a line over 64 KiB".into())
        );
    }

    #[test]
    fn a_dump_over_its_cap_is_refused_as_it_arrives() {
        let row = format!("2 be 1 s{}\n", "x".repeat(1000));
        let mut reader = DumpReader::default();
        assert_eq!(
            reader.feed(b"1\n# be_id be_name srv_id srv_name\n"),
            Ok(false)
        );
        let mut fed = 0;
        let got = loop {
            match reader.feed(row.as_bytes()) {
                Ok(false) => fed += row.len(),
                other => break other,
            }
        };
        assert!(fed <= MAX_DUMP && fed + 2 * row.len() > MAX_DUMP, "{fed}");
        assert_eq!(got, Err("a show servers state answer over 64 MiB".into()));
    }

    #[test]
    fn a_show_proc_answer_is_bounded_by_its_bytes() {
        let mut r = ProcReader::default();
        assert_eq!(r.feed(b"#<PID> <type>\n# workers\n"), Ok(false));
        let line = b"12345 worker 0 0d00h00m01s 2.6.12\n";
        let mut fed = 0;
        let got = loop {
            match r.feed(line) {
                Ok(false) => fed += line.len(),
                other => break other,
            }
        };
        assert!(fed <= MAX_PROC, "{fed}");
        assert_eq!(got, Err("a show proc answer over 1 MiB".into()));
    }
}
