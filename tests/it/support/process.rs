//! A process seen from outside:
//!
//! - the addresses the agent's `listening` line names;
//! - what `/proc/<pid>/` says: resident memory, CPU ticks, descriptors.

use std::net::SocketAddr;

/// The address `name=` names in the agent's `listening` log line
/// (`listen_addr`, `dev_kv_addr`, ...); `None` when absent or off.
pub fn logged_addr(line: &str, name: &str) -> Option<SocketAddr> {
    let key = format!("{name}=");
    let start = line.find(&key)? + key.len();
    let rest = &line[start..];
    let end = rest.find([' ', '"']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`); `None` once
/// the process is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = s
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    value.split_whitespace().next()?.parse().ok()
}

/// The resident set of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS").expect("VmRSS")
}

/// utime + stime of a process in clock ticks (`/proc/<pid>/stat`); `None`
/// once the process is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime, stime are 14, 15.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
