//! `lint-haproxy FILE…`: the files read (a directory as haproxy reads it),
//! this host's addresses and name gathered, [`crate::lint`]'s report
//! printed.

use std::net::IpAddr;

use super::{listen_setting, setting, usage_error, Args, Io, FINDING, OK};

pub(super) const HELP: &str = "\
usage: gitlab-haproxy-agent lint-haproxy FILE... [-listen-addr ADDR] [-max-line-bytes N]
           [-haproxy-version V | -haproxy-bin PATH] [-reply-up]

Reads haproxy configuration files as haproxy does (sections, defaults and
default-server inheritance, server-template, quoting, .if blocks; a
directory FILE stands for its *.cfg files in alphabetical order, as with
haproxy -f, and one holding none is an error; global's setenv, presetenv,
unsetenv and resetenv apply in order before ${VAR} expands, and a variable
set nowhere is named) and, for every server with agent-check (saying so
when there is none), reports what keeps the
agent's replies from working: errors (no explicit weight; agent-send
missing, without a real newline, or a first line the agent does not answer;
agent-port or agent-addr not reaching ADDR) and warnings (no slowstart, no
agent-inter, an identity that is not <backend>/<server>, two servers
sending the same identity, a static algorithm (static-rr, or map-based
hashing) that ignores N% weights and slowstart; a server-template, whose
slots all send one identity, gets one finding per line). A word a few letters
from an agent keyword (agent-sned) gets did you mean. On haproxy 3.3 and 3.4, a
server with no default-server line before it is an error (it stays DOWN
after maint: add a default-server line, or run the agent with -reply-up);
V is the haproxy line linted for (e.g. 3.4), PATH a haproxy binary whose
-v tells it (default: the haproxy on PATH, else /usr/sbin/haproxy; when
none runs, the line is unknown and the finding a warning). -reply-up: the agent runs
with it (default GITLAB_HAPROXY_AGENT_REPLY_UP). ADDR is the agent's -listen-addr: default
GITLAB_HAPROXY_AGENT_LISTEN_ADDR, else :9777. With a wildcard ADDR (:P,
0.0.0.0:P, [::]:P) the agent-check target must be an address of this host:
run the lint on the haproxy host, or give the agent's IP as -listen-addr.
N is the agent's -max-line-bytes (a longer first line gets no reply):
default GITLAB_HAPROXY_AGENT_MAX_LINE_BYTES, else 256.
Exit 0: no error (warnings allowed); 1: at least one error; 2: usage.
";

pub(super) fn run(a: &Args, io: &mut Io<'_>) -> u8 {
    if a.positional.is_empty() {
        return usage_error(io, "lint-haproxy", "no configuration file given");
    }
    let listen = match listen_setting(a, io, "listen-addr", ":9777") {
        Ok(listen) => listen,
        Err(e) => return usage_error(io, "lint-haproxy", &e),
    };
    let (text, from) = setting(a, io, "max-line-bytes", "256");
    let max_line = match crate::config::max_line_bytes(&text) {
        Ok(n) => n,
        Err(e) => {
            let e = format!("invalid value {text:?} for {from}: {e}");
            return usage_error(io, "lint-haproxy", &e);
        }
    };
    let haproxy = match haproxy_line(a) {
        Ok(line) => line,
        Err(e) => return usage_error(io, "lint-haproxy", &e),
    };
    let (up, from) = setting(a, io, "reply-up", "false");
    let reply_up = a.flag("reply-up")
        || match crate::gocompat::parse_go_bool(&up) {
            Some(b) => b,
            None => {
                let e = format!("invalid value {up:?} for {from}: not a boolean");
                return usage_error(io, "lint-haproxy", &e);
            }
        };
    let mut files = Vec::new();
    let mut empty = Vec::new();
    for name in &a.positional {
        let before = files.len();
        if let Err(e) = read_config(name, &mut files) {
            return usage_error(io, "lint-haproxy", &e);
        }
        if files.len() == before && std::fs::metadata(name).is_ok_and(|m| m.is_dir()) {
            empty.push(name);
        }
    }
    let env = config_env(io.env);
    let target = crate::lint::Agent {
        listen: &listen,
        max_line,
        reply_up,
        haproxy,
    };
    let mut report = crate::lint::lint(&files, &target, &local_addresses(), &env);
    // The summary counts the empty directories' errors too.
    report.errors += empty.len();
    let code = match report.errors {
        0 => OK,
        _ => FINDING,
    };
    for dir in empty {
        // haproxy -f DIR loads only DIR's *.cfg files: none is no
        // configuration at all, which haproxy refuses.
        let dir = crate::safe::output(dir);
        let _ = writeln!(io.out, "{dir}: error: this directory holds no *.cfg file: haproxy -f {dir} reads only *.cfg files, so it would load nothing here");
    }
    // Names read from the configurations are outside text.
    let _ = io
        .out
        .write_all(crate::safe::output(&report.render()).as_bytes());
    code
}

/// The haproxy line linted for: `-haproxy-version 3.4[.0]`, or what
/// `-haproxy-bin PATH -v` says; `None` when neither is given.
fn haproxy_line(a: &super::Args) -> Result<Option<(u32, u32)>, String> {
    match (a.value("haproxy-version"), a.value("haproxy-bin")) {
        (Some(_), Some(_)) => Err("give -haproxy-version or -haproxy-bin, not both".into()),
        (Some(v), None) => version_line(v)
            .map(Some)
            .ok_or_else(|| format!("invalid value {v:?} for flag -haproxy-version: a haproxy version such as 3.4 or 2.6.12")),
        (None, Some(path)) => binary_line(path).map(Some),
        // The haproxy of this host, if one runs.
        (None, None) => Ok(["haproxy", "/usr/sbin/haproxy"]
            .into_iter()
            .find_map(|path| binary_line(path).ok())),
    }
}

/// What `path -v` says its line is.
fn binary_line(path: &str) -> Result<(u32, u32), String> {
    let out = std::process::Command::new(path)
        .arg("-v")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {path} -v: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "HAProxy version 3.4.0-64a3353 2026/…".
    text.split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .and_then(version_line)
        .ok_or_else(|| {
            let first = text.lines().next().unwrap_or("");
            format!("{path} -v does not name a haproxy version: {first:?}")
        })
}

/// `3.4`, `3.4.0`, `2.6.12-1+deb12u4` -> (major, minor).
fn version_line(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The environment haproxy reads its configuration with.
pub(super) fn config_env<'a>(
    env: &'a dyn Fn(&str) -> Option<String>,
) -> impl Fn(&str) -> Option<String> + 'a {
    let hostname = hostname();
    move |name: &str| match name {
        // haproxy overwrites it with the host name before reading.
        "HAPROXY_LOCALPEER" => hostname.clone(),
        _ => env(name),
    }
}

/// Appends `name`'s (name, bytes), or for a directory those of its
/// configuration files, as haproxy's `cfgfiles_expand_directories`
/// (`src/haproxy.c`) lists them: `DIR/entry` for each entry that
/// [`is_config_entry`] takes and that is (or links to) a regular file,
/// sorted by name (`alphasort`, byte order in haproxy's C locale).
pub(super) fn read_config(name: &str, files: &mut Vec<(String, Vec<u8>)>) -> Result<(), String> {
    let cannot = |e: std::io::Error| format!("cannot read {name}: {e}");
    let read = |path: &str| {
        crate::files::read_regular(path.as_ref(), crate::files::MAX_CONFIG_BYTES)
            .map_err(|e| format!("cannot read {path}: {e}"))
    };
    if !std::fs::metadata(name).map_err(cannot)?.is_dir() {
        files.push((name.to_owned(), read(name)?));
        return Ok(());
    }
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(name).map_err(cannot)? {
        let entry = entry.map_err(cannot)?.file_name();
        let Some(entry) = entry.to_str().filter(|e| is_config_entry(e)) else {
            continue;
        };
        let path = format!("{name}/{entry}");
        let cannot = |e: std::io::Error| format!("cannot read {path}: {e}");
        if std::fs::metadata(&path).map_err(cannot)?.is_file() {
            entries.push(path);
        }
    }
    entries.sort();
    for path in entries {
        let bytes = read(&path)?;
        files.push((path, bytes));
    }
    Ok(())
}

/// haproxy's test on a directory entry: not hidden, and its first `.cfg`
/// ends the name (so `a.cfg.cfg` is skipped, as `strstr` finds the first).
fn is_config_entry(entry: &str) -> bool {
    !entry.starts_with('.') && entry.find(".cfg").is_some_and(|at| at + 4 == entry.len())
}

/// This host's name, as haproxy's `gethostname` gives it.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; one byte is kept for
    // the NUL that POSIX does not promise on truncation.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// The IPv4 and IPv6 addresses of this host's interfaces (`getifaddrs`);
/// empty when it fails (loopback still counts as local in the lint).
fn local_addresses() -> Vec<IpAddr> {
    let mut addrs = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return addrs;
    }
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs returned; its
        // `ifa_addr` is null or points to a sockaddr of `sa_family`'s kind.
        unsafe {
            let ifa = &*cursor;
            if let Some(ip) = sockaddr_ip(ifa.ifa_addr) {
                addrs.push(ip);
            }
            cursor = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    addrs
}

/// The IP of an `AF_INET` / `AF_INET6` sockaddr, else `None`.
///
/// # Safety
/// `sa` is null or points to a sockaddr whose size fits its family.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let sin = &*sa.cast::<libc::sockaddr_in>();
            Some(IpAddr::from(
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
            ))
        }
        libc::AF_INET6 => {
            let sin6 = &*sa.cast::<libc::sockaddr_in6>();
            Some(IpAddr::from(sin6.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_lists_what_haproxy_loads() {
        for (entry, want) in [
            ("a.cfg", true),
            ("10-web.cfg", true),
            (".hidden.cfg", false),
            (".cfg", false),
            ("a.cfg.bak", false),
            ("a.cfg.cfg", false),
            ("a.conf", false),
            ("cfg", false),
        ] {
            assert_eq!(is_config_entry(entry), want, "{entry}");
        }
    }

    #[test]
    fn a_directory_is_read_in_name_order_skipping_what_haproxy_skips() {
        let dir = std::env::temp_dir().join(format!("gha-lint-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub.cfg")).unwrap();
        for name in ["b.cfg", "a.cfg", "B.cfg", ".h.cfg", "c.txt"] {
            std::fs::write(dir.join(name), name).unwrap();
        }
        let mut files = Vec::new();
        let name = dir.to_str().unwrap();
        read_config(name, &mut files).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let got: Vec<(String, String)> = files
            .into_iter()
            .map(|(n, b)| (n, String::from_utf8(b).unwrap()))
            .collect();
        let want = ["B.cfg", "a.cfg", "b.cfg"].map(|e| (format!("{name}/{e}"), e.to_owned()));
        assert_eq!(got, want);
    }

    #[test]
    fn a_version_names_its_line() {
        for (v, want) in [
            ("3.4", Some((3, 4))),
            ("3.4.0", Some((3, 4))),
            ("2.6.12-1+deb12u4", Some((2, 6))),
            ("3.0.11-9e587df", Some((3, 0))),
            ("3", None),
            ("x.y", None),
            ("", None),
        ] {
            assert_eq!(version_line(v), want, "{v}");
        }
    }

    #[test]
    fn local_addresses_include_loopback() {
        let addrs = local_addresses();
        assert!(addrs.iter().any(IpAddr::is_loopback), "{addrs:?}");
    }
}
