//! systemd's service notification protocol (`sd_notify(3)`), without
//! libsystemd: a `Type=notify` unit learns when the agent answers, what it
//! answers from, and that its loop still turns.
//!
//! In: `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` as systemd sets
//! them (parsed once at start by [`settings`], pure), then on every loop
//! turn whether the agent answers and from what ([`Answering`]). Out: the
//! datagrams [`Notifier`] decides on (`READY=1`, `STATUS=…`, `WATCHDOG=1`,
//! `STOPPING=1`, newline-separated), which [`NotifySocket`] sends to the
//! socket, one nonblocking `sendto` each.
//!
//! What always holds:
//! - `READY=1` is sent once: when the agent first answers (a complete
//!   consul read or its state file), or [`READY_WITHIN`] after the start
//!   without either, with a `STATUS=` saying why, so boot is never held by
//!   a consul outage;
//! - `STATUS=` is sent when its text changes, never repeated;
//! - `WATCHDOG=1` is sent at half the interval systemd asks for, and only
//!   from the loop's own turn ([`Notifier::on_time`]): a wedged loop stops
//!   petting and systemd restarts it;
//! - a socket systemd did not set up, or one that fails, never stops the
//!   agent: a warning, and the agent runs on.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `READY=1` at the latest this long after the start, answering or not.
pub const READY_WITHIN: Duration = Duration::from_secs(10);

/// Where `NOTIFY_SOCKET` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A socket file.
    Path(PathBuf),
    /// A Linux abstract socket (`@name`): the name without the `@`.
    Abstract(Vec<u8>),
}

/// What systemd asked for, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub target: Target,
    /// `WATCHDOG_USEC`, when it is meant for this process.
    pub watchdog: Option<Duration>,
}

/// The longest socket path `sockaddr_un` holds (with its NUL).
const SUN_PATH_MAX: usize = 107;

/// `NOTIFY_SOCKET` (`/path` or `@abstract`), `WATCHDOG_USEC` and
/// `WATCHDOG_PID` (the watchdog is this process's only when it names
/// `pid`, or is unset) into [`Settings`]; `None` without a socket. What
/// cannot be used is a warning, never an error: the agent must start.
pub fn settings(
    socket: Option<&str>,
    watchdog_usec: Option<&str>,
    watchdog_pid: Option<&str>,
    pid: u32,
    warnings: &mut Vec<String>,
) -> Option<Settings> {
    let target = match parse_socket(socket?) {
        Ok(t) => t,
        Err(why) => {
            warnings.push(format!(
                "NOTIFY_SOCKET={:?}: {why}: systemd is not told when the agent is ready",
                socket?
            ));
            return None;
        }
    };
    let ours = watchdog_pid.is_none_or(|p| p.trim() == pid.to_string());
    let watchdog = match watchdog_usec.filter(|_| ours).map(parse_watchdog) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(why)) => {
            warnings.push(format!(
                "WATCHDOG_USEC={:?}: {why}: no watchdog pings",
                watchdog_usec?
            ));
            None
        }
    };
    Some(Settings { target, watchdog })
}

/// `NOTIFY_SOCKET`: an absolute path, or `@` and an abstract name.
pub fn parse_socket(text: &str) -> Result<Target, &'static str> {
    let target = if let Some(name) = text.strip_prefix('@') {
        Target::Abstract(name.as_bytes().to_vec())
    } else if text.starts_with('/') {
        Target::Path(PathBuf::from(text))
    } else {
        return Err("not a socket path or @abstract name (vsock: is not supported)");
    };
    let len = match &target {
        Target::Abstract(name) if name.is_empty() => return Err("an empty abstract name"),
        Target::Abstract(name) => name.len(),
        Target::Path(_) => text.len(),
    };
    if len > SUN_PATH_MAX || text.contains('\0') {
        return Err("too long for a unix socket address, or holds a NUL");
    }
    Ok(target)
}

/// `WATCHDOG_USEC`: microseconds, more than zero.
pub fn parse_watchdog(text: &str) -> Result<Duration, &'static str> {
    match crate::decimal::parse_uint(text.trim().as_bytes()) {
        Ok(0) | Err(_) => Err("not a number of microseconds above zero"),
        Ok(usec) => Ok(Duration::from_micros(usec)),
    }
}

/// What the agent answers from, as the loop sees it this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answering<'a> {
    /// No state yet: checks get no answer; consul's last error, if any.
    Not { last_error: Option<&'a str> },
    /// The state file, until the first complete consul read.
    FromStateFile,
    /// A complete consul read.
    FromConsul,
}

/// The decisions: what to send when (sans-IO; time is an argument).
#[derive(Debug)]
pub struct Notifier {
    ready_by: Instant,
    ready: bool,
    status: String,
    watchdog: Option<Duration>,
    next_pet: Option<Instant>,
    stopping: bool,
}

impl Notifier {
    /// Started at `now`; the first turn pets the watchdog at once.
    pub fn new(watchdog: Option<Duration>, now: Instant) -> Notifier {
        Notifier {
            ready_by: now + READY_WITHIN,
            ready: false,
            status: String::new(),
            watchdog,
            next_pet: watchdog.map(|_| now),
            stopping: false,
        }
    }

    /// When [`Notifier::on_time`] has something to send without any other
    /// event: the readiness grace, the next watchdog ping.
    pub fn deadline(&self) -> Option<Instant> {
        let ready_by = (!self.ready).then_some(self.ready_by);
        [ready_by, self.next_pet].into_iter().flatten().min()
    }

    /// The datagram to send this turn, if any.
    pub fn on_time(&mut self, now: Instant, answering: Answering<'_>) -> Option<String> {
        let mut msg = String::new();
        if !self.stopping {
            let answers = !matches!(answering, Answering::Not { .. });
            if !self.ready && (answers || now >= self.ready_by) {
                self.ready = true;
                msg.push_str("READY=1\n");
            }
            let status = status_line(answering, self.ready);
            if status != self.status {
                msg.push_str(&format!("STATUS={status}\n"));
                self.status = status;
            }
        }
        if let (Some(interval), Some(due)) = (self.watchdog, self.next_pet) {
            if now >= due {
                msg.push_str("WATCHDOG=1\n");
                self.next_pet = Some(now + interval / 2);
            }
        }
        (!msg.is_empty()).then_some(msg)
    }

    /// The datagram for the start of a shutdown; no `STATUS=` after it.
    pub fn stopping(&mut self) -> String {
        self.stopping = true;
        "STOPPING=1\nSTATUS=shutting down: finishing in-flight answers\n".to_owned()
    }
}

/// The `STATUS=` text an operator reads in `systemctl status`.
fn status_line(answering: Answering<'_>, ready: bool) -> String {
    match answering {
        Answering::FromConsul => "answering from consul".to_owned(),
        Answering::FromStateFile => {
            "answering from the state file until the first complete consul read".to_owned()
        }
        Answering::Not { last_error } => {
            let head = if ready {
                format!(
                    "not answering: no complete consul read and no usable state file within {}s; \
                     haproxy keeps each server's state until the agent answers",
                    READY_WITHIN.as_secs()
                )
            } else {
                "starting: waiting for the first consul read".to_owned()
            };
            match last_error {
                Some(e) => format!("{head} (last consul error: {e})"),
                None => head,
            }
        }
    }
}

/// The unbound datagram socket the messages leave from, and where they go.
#[derive(Debug)]
pub struct NotifySocket {
    socket: UnixDatagram,
    to: SocketAddr,
}

impl NotifySocket {
    pub fn open(target: &Target) -> io::Result<NotifySocket> {
        let to = match target {
            Target::Path(path) => SocketAddr::from_pathname(path)?,
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
        };
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(NotifySocket { socket, to })
    }

    /// One datagram; never blocks (a full socket buffer is an error).
    pub fn send(&self, msg: &str) -> io::Result<()> {
        self.socket
            .send_to_addr(msg.as_bytes(), &self.to)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn socket_forms() {
        assert_eq!(
            parse_socket("/run/systemd/notify"),
            Ok(Target::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            parse_socket("@/org/freedesktop/systemd1/notify/42"),
            Ok(Target::Abstract(
                b"/org/freedesktop/systemd1/notify/42".to_vec()
            ))
        );
        for bad in ["", "@", "vsock:2:1234", "relative/path", "/a\0b"] {
            assert!(parse_socket(bad).is_err(), "{bad:?}");
        }
        assert!(parse_socket(&format!("/{}", "x".repeat(106))).is_ok());
        assert!(parse_socket(&format!("/{}", "x".repeat(107))).is_err());
    }

    #[test]
    fn watchdog_is_ours_only_for_our_pid() {
        let mut w = Vec::new();
        let s = settings(Some("/n"), Some("30000000"), None, 7, &mut w).unwrap();
        assert_eq!(s.watchdog, Some(Duration::from_secs(30)));
        let s = settings(Some("/n"), Some("30000000"), Some("7"), 7, &mut w).unwrap();
        assert_eq!(s.watchdog, Some(Duration::from_secs(30)));
        let s = settings(Some("/n"), Some("30000000"), Some("8"), 7, &mut w).unwrap();
        assert_eq!(s.watchdog, None);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(settings(None, Some("30000000"), None, 7, &mut w), None);
    }

    #[test]
    fn unusable_values_are_warnings() {
        let mut w = Vec::new();
        assert_eq!(settings(Some("vsock:2:9"), None, None, 7, &mut w), None);
        let s = settings(Some("@n"), Some("0"), None, 7, &mut w).unwrap();
        assert_eq!(s.watchdog, None);
        let s = settings(Some("@n"), Some("soon"), None, 7, &mut w).unwrap();
        assert_eq!(s.watchdog, None);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].starts_with("NOTIFY_SOCKET=\"vsock:2:9\": "), "{w:?}");
        assert!(w[1].starts_with("WATCHDOG_USEC=\"0\": "), "{w:?}");
    }

    #[test]
    fn ready_when_the_first_read_answers() {
        let t0 = Instant::now();
        let mut n = Notifier::new(None, t0);
        let waiting = Answering::Not { last_error: None };
        assert_eq!(
            n.on_time(t0, waiting).as_deref(),
            Some("STATUS=starting: waiting for the first consul read\n")
        );
        assert_eq!(n.on_time(t0 + ms(10), waiting), None, "no repeat");
        assert_eq!(n.deadline(), Some(t0 + READY_WITHIN));
        assert_eq!(
            n.on_time(t0 + ms(20), Answering::FromConsul).as_deref(),
            Some("READY=1\nSTATUS=answering from consul\n")
        );
        assert_eq!(n.deadline(), None);
        assert_eq!(n.on_time(t0 + ms(30), Answering::FromConsul), None);
    }

    #[test]
    fn ready_from_the_state_file_then_status_follows_consul() {
        let t0 = Instant::now();
        let mut n = Notifier::new(None, t0);
        let msg = n.on_time(t0 + ms(1000), Answering::FromStateFile).unwrap();
        assert!(
            msg.starts_with("READY=1\nSTATUS=answering from the state file"),
            "{msg}"
        );
        assert_eq!(
            n.on_time(t0 + ms(3000), Answering::FromConsul).as_deref(),
            Some("STATUS=answering from consul\n")
        );
    }

    #[test]
    fn ready_after_the_grace_without_an_answer_says_why() {
        let t0 = Instant::now();
        let mut n = Notifier::new(None, t0);
        let down = Answering::Not {
            last_error: Some("connection refused"),
        };
        let first = n.on_time(t0, down).unwrap();
        assert!(!first.contains("READY=1"), "{first}");
        assert_eq!(n.on_time(t0 + READY_WITHIN - ms(1), down), None);
        let msg = n.on_time(t0 + READY_WITHIN, down).unwrap();
        assert!(
            msg.starts_with("READY=1\nSTATUS=not answering: no complete consul read")
                && msg.ends_with("(last consul error: connection refused)\n"),
            "{msg}"
        );
        assert_eq!(n.deadline(), None);
        // Consul answers later: the status says so, READY is not repeated.
        assert_eq!(
            n.on_time(t0 + ms(15_000), Answering::FromConsul).as_deref(),
            Some("STATUS=answering from consul\n")
        );
    }

    #[test]
    fn watchdog_pets_at_half_the_interval_only_when_the_loop_turns() {
        let t0 = Instant::now();
        let mut n = Notifier::new(Some(ms(1000)), t0);
        let msg = n.on_time(t0, Answering::FromConsul).unwrap();
        assert_eq!(msg, "READY=1\nSTATUS=answering from consul\nWATCHDOG=1\n");
        assert_eq!(n.deadline(), Some(t0 + ms(500)));
        assert_eq!(n.on_time(t0 + ms(499), Answering::FromConsul), None);
        assert_eq!(
            n.on_time(t0 + ms(500), Answering::FromConsul).as_deref(),
            Some("WATCHDOG=1\n")
        );
        // A loop stalled for 3 s pets once when it turns again, not six
        // times: a ping says "the loop turns now".
        assert_eq!(
            n.on_time(t0 + ms(3500), Answering::FromConsul).as_deref(),
            Some("WATCHDOG=1\n")
        );
        assert_eq!(n.deadline(), Some(t0 + ms(4000)));
    }

    #[test]
    fn stopping_ends_the_status_updates_but_not_the_pings() {
        let t0 = Instant::now();
        let mut n = Notifier::new(Some(ms(1000)), t0);
        n.on_time(t0, Answering::FromConsul);
        assert!(n.stopping().starts_with("STOPPING=1\n"));
        assert_eq!(
            n.on_time(t0 + ms(600), Answering::Not { last_error: None })
                .as_deref(),
            Some("WATCHDOG=1\n")
        );
    }

    /// The datagram reaches a real socket, by path and by abstract name.
    #[test]
    fn sends_one_datagram_to_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("gha-notify-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let name = format!("@gha-notify-unit-{}", std::process::id());
        let by_path = UnixDatagram::bind(&path).unwrap();
        let by_name = {
            use std::os::linux::net::SocketAddrExt;
            let addr = SocketAddr::from_abstract_name(&name.as_bytes()[1..]).unwrap();
            UnixDatagram::bind_addr(&addr).unwrap()
        };
        for (target, socket) in [
            (path.to_str().unwrap(), &by_path),
            (name.as_str(), &by_name),
        ] {
            let s = NotifySocket::open(&parse_socket(target).unwrap()).unwrap();
            s.send("READY=1\n").unwrap();
            let mut buf = [0; 64];
            let n = socket.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"READY=1\n", "{target}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
