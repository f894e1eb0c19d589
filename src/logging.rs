//! Logs on stderr: JSON lines by default (`time` RFC 3339 UTC with
//! ms, `level`, `msg`, then the record's key-values), or human text through
//! simplelog with `GITLAB_LOG_FORMAT=text`. Structured fields come from the
//! `log` crate's key-values (`info!(key = k, old = o; "msg")`).
//!
//! Always holds: bytes from outside (KV keys, request lines) are passed
//! through [`crate::safe::escape`] before they reach a log field, so no line break or
//! control byte is ever written raw.
//!
//! Lines never block the loop: each is built whole and queued (bounded in
//! bytes); a writer thread writes them to stderr; past the bound they are
//! dropped, counted (`log_lines_dropped_total`) and reported in one line
//! (`queue`).
//!
//! JSON: each line is built whole, then queued as one write. Integer and float fields are JSON numbers, booleans JSON
//! booleans, everything else a JSON string (serde_json escapes it). A field
//! named `time`, `level` or `msg` is written as `fields.<name>` (logrus's
//! rule) so it cannot shadow the line's own keys.
//!
//! Text: simplelog's line (`<time> [LEVEL] msg`), the key-values appended as
//! ` key=value` (quoted when empty or holding a space, `"`, `=` or a control
//! character, and then escaped as Rust strings are), since simplelog itself
//! drops them; a control character in the message is escaped too.

mod queue;

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use log::kv::{Key, Value, VisitSource};
use log::{Log, Metadata, Record};

use queue::{LineSink, Queue};

/// Every line goes through this queue to the writer thread: the loop
/// never waits on stderr.
static QUEUE: Queue = Queue::new();
/// At exit, wait at most this long for queued lines to be written.
const FLUSH_WITHIN: Duration = Duration::from_secs(2);

/// `GITLAB_LOG_FORMAT`: JSON lines (the default) or simplelog's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Installs the global logger and starts its writer thread. A second call
/// leaves the first logger in place.
pub fn init(format: LogFormat, level: log::LevelFilter) {
    let logger: Box<dyn Log> = match format {
        LogFormat::Json => Box::new(JsonLogger { level }),
        LogFormat::Text => Box::new(TextLogger {
            inner: simplelog::WriteLogger::new(level, text_config(), LineSink::new(&QUEUE)),
        }),
    };
    if log::set_boxed_logger(logger).is_err() {
        return;
    }
    log::set_max_level(level);
    // The writer copies the descriptor table before init returns, so the
    // copy holds only what is open now (stdio), never a listener bound
    // later: closing one must close it.
    let (unshared, wait) = std::sync::mpsc::channel();
    let writer = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            own_descriptor_table();
            let _ = unshared.send(());
            let report = |n: u64| {
                log::warn!(dropped = n, dropped_total = QUEUE.dropped(); "log lines dropped: the log reader (stderr) was too slow; answers went on");
            };
            QUEUE.run_writer(&mut std::io::stderr(), &report)
        });
    match writer {
        Ok(_) => {
            let _ = wait.recv_timeout(std::time::Duration::from_secs(1));
        }
        Err(e) => eprintln!("gitlab-haproxy-agent: cannot start the log writer thread: {e}"),
    }
}

/// Gives the calling thread (the log writer) its own copy of the file
/// descriptor table. While a process has one thread sharing its table, the
/// kernel looks descriptors up without reference counting; a second thread
/// sharing it costs every socket call of the loop an atomic pair (measured:
/// about 3 µs more CPU per check with `scripts/bench-ab.sh`). The writer
/// only needs stderr, which its copy holds; it must copy the table before
/// the daemon opens anything else (see [`init`]).
fn own_descriptor_table() {
    // SAFETY: unshare(2) with CLONE_FILES only copies this thread's
    // descriptor table; it touches no memory of ours.
    let _ = unsafe { libc::unshare(libc::CLONE_FILES) };
}

/// Log lines dropped so far because the queue was full.
pub fn dropped() -> u64 {
    QUEUE.dropped()
}

// ---------------------------------------------------------------------------
// JSON lines.

struct JsonLogger {
    level: log::LevelFilter,
}

impl Log for JsonLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut line = format_json_line(record, SystemTime::now());
        line.push('\n');
        QUEUE.push(line.into_bytes());
    }

    fn flush(&self) {
        QUEUE.flush(FLUSH_WITHIN);
    }
}

fn level_name(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "error",
        log::Level::Warn => "warn",
        log::Level::Info => "info",
        log::Level::Debug => "debug",
        log::Level::Trace => "trace",
    }
}

/// One JSON object (no trailing newline) for `record`, stamped `now`.
fn format_json_line(record: &Record<'_>, now: SystemTime) -> String {
    let mut out = String::with_capacity(160);
    out.push_str("{\"time\":\"");
    out.push_str(&rfc3339_millis(now));
    out.push_str("\",\"level\":\"");
    out.push_str(level_name(record.level()));
    out.push_str("\",\"msg\":");
    match record.args().as_str() {
        Some(msg) => push_json_str(&mut out, msg),
        None => push_json_str(&mut out, &record.args().to_string()),
    }
    let _ = record.key_values().visit(&mut JsonFields { out: &mut out });
    out.push('}');
    out
}

/// A JSON string, its hidden characters (C1, bidi, zero-width ...)
/// escaped too ([`crate::safe`]: JSON's escapes), so a log read raw in a
/// terminal is safe as well.
fn push_json_str(out: &mut String, s: &str) {
    // Serializing a str to JSON cannot fail.
    let json = serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""));
    out.push_str(&crate::safe::output(&json));
}

struct JsonFields<'a> {
    out: &'a mut String,
}

impl<'kvs> VisitSource<'kvs> for JsonFields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        self.out.push(',');
        let key = key.as_str();
        if matches!(key, "time" | "level" | "msg") {
            push_json_str(self.out, &format!("fields.{key}"));
        } else {
            push_json_str(self.out, key);
        }
        self.out.push(':');
        push_json_value(self.out, &value);
        Ok(())
    }
}

fn push_json_value(out: &mut String, value: &Value<'_>) {
    if let Some(b) = value.to_bool() {
        out.push_str(if b { "true" } else { "false" });
    } else if let Some(n) = value.to_i64() {
        let _ = write!(out, "{n}");
    } else if let Some(n) = value.to_u64() {
        let _ = write!(out, "{n}");
    } else if let Some(n) = value.to_i128() {
        let _ = write!(out, "{n}");
    } else if let Some(n) = value.to_u128() {
        let _ = write!(out, "{n}");
    } else if let Some(n) = value.to_f64().and_then(serde_json::Number::from_f64) {
        // from_f64 refuses NaN and infinities, which JSON cannot hold.
        let _ = write!(out, "{n}");
    } else if let Some(s) = value.to_borrowed_str() {
        push_json_str(out, s);
    } else {
        push_json_str(out, &value.to_string());
    }
}

/// `2026-12-02T15:04:05Z`: Unix seconds, for operators.
pub fn utc_seconds(secs: u64) -> String {
    // A time no clock can hold (from outside bytes: a record's `until`)
    // is shown as the number it is.
    let Some(t) = UNIX_EPOCH.checked_add(std::time::Duration::from_secs(secs)) else {
        return format!("{secs} (Unix seconds)");
    };
    let ms = rfc3339_millis(t);
    format!("{}Z", &ms[..ms.len() - 5])
}

/// `2026-12-02T15:04:05.123Z`. A clock before 1970 prints the epoch.
fn rfc3339_millis(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let sod = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

// ---------------------------------------------------------------------------
// Text.

fn text_config() -> simplelog::Config {
    simplelog::ConfigBuilder::new()
        // UTC is simplelog's default offset; milliseconds, as the JSON
        // lines (RFC 3339 leaves the fraction to us: simplelog's own gives
        // 8 or 9 digits, trailing zeros cut).
        .set_time_format_custom(simplelog::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        ))
        .set_thread_level(log::LevelFilter::Off)
        .set_target_level(log::LevelFilter::Off)
        .set_location_level(log::LevelFilter::Off)
        .build()
}

/// simplelog drops key-values: append them to the message first.
struct TextLogger {
    inner: Box<simplelog::WriteLogger<LineSink<'static>>>,
}

impl Log for TextLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let fields = text_fields(record);
        let msg = match record.args().as_str() {
            Some(m) => text_msg(m),
            None => text_msg(&record.args().to_string()).into_owned().into(),
        };
        if fields.is_empty() && matches!(msg, std::borrow::Cow::Borrowed(_)) {
            self.inner.log(record);
            return;
        }
        self.inner.log(
            &Record::builder()
                .args(format_args!("{msg}{fields}"))
                .metadata(record.metadata().clone())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build(),
        );
    }

    fn flush(&self) {
        self.inner.flush();
        QUEUE.flush(FLUSH_WITHIN);
    }
}

/// The message rendered by [`crate::safe::text`], so a message formatted
/// from outside bytes by mistake still cannot break the line or reach the
/// terminal raw; borrowed when there is nothing to escape (the usual case).
fn text_msg(msg: &str) -> std::borrow::Cow<'_, str> {
    crate::safe::text(msg)
}

/// ` key=value` for each key-value of `record`.
fn text_fields(record: &Record<'_>) -> String {
    struct Fields(String);
    impl<'kvs> VisitSource<'kvs> for Fields {
        fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
            let value = value.to_string();
            let quote = value.is_empty()
                || value
                    .chars()
                    .any(|c| c == ' ' || c == '"' || c == '=' || crate::safe::hidden(c));
            if quote {
                let value = value.replace('\\', "\\\\").replace('"', "\\\"");
                let value = crate::safe::text(&value);
                let _ = write!(self.0, " {key}=\"{value}\"");
            } else {
                let _ = write!(self.0, " {key}={value}");
            }
            Ok(())
        }
    }
    let mut fields = Fields(String::new());
    let _ = record.key_values().visit(&mut fields);
    fields.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::kv::Value;
    use log::Level;
    use std::time::Duration;

    /// 2026-12-02T15:04:05.123Z
    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_796_223_845_123)
    }

    #[test]
    fn rfc3339_time() {
        assert_eq!(utc_seconds(1_767_225_599), "2025-12-31T23:59:59Z");
        assert_eq!(rfc3339_millis(t0()), "2026-12-02T15:04:05.123Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // Leap day, and the last millisecond of a year.
        assert_eq!(
            rfc3339_millis(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339_millis(UNIX_EPOCH + Duration::from_millis(1_767_225_599_999)),
            "2025-12-31T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339_millis(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn civil_dates_round_trip_over_four_centuries() {
        // Walk day by day from 1970 and check against a naive calendar.
        let (mut y, mut m, mut d) = (1970i64, 1u32, 1u32);
        for days in 0..146_097i64 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let month_len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ][m as usize - 1];
            d += 1;
            if d > month_len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    fn line(level: Level, msg: std::fmt::Arguments<'_>, kvs: &[(&str, Value<'_>)]) -> String {
        format_json_line(
            &Record::builder()
                .level(level)
                .target("t")
                .args(msg)
                .key_values(&kvs)
                .build(),
            t0(),
        )
    }

    #[test]
    fn json_line_without_fields() {
        assert_eq!(
            line(Level::Info, format_args!("consul synced"), &[]),
            r#"{"time":"2026-12-02T15:04:05.123Z","level":"info","msg":"consul synced"}"#
        );
        for (level, name) in [
            (Level::Error, "error"),
            (Level::Warn, "warn"),
            (Level::Debug, "debug"),
            (Level::Trace, "trace"),
        ] {
            let l = line(level, format_args!("x"), &[]);
            assert!(l.contains(&format!(r#""level":"{name}""#)), "{l}");
        }
    }

    #[test]
    fn json_line_with_fields() {
        let keys = 12u64;
        let ratio = 0.5f64;
        let name = "be_web/srv1";
        let l = line(
            Level::Warn,
            format_args!("state {} changed", 3),
            &[
                ("keys", Value::from(keys)),
                ("delta", Value::from(-4i32)),
                ("ratio", Value::from(ratio)),
                ("synced", Value::from(true)),
                ("identity", Value::from(name)),
                ("addr", Value::from_display(&std::net::Ipv4Addr::LOCALHOST)),
                ("big", Value::from(u128::MAX)),
            ],
        );
        assert_eq!(
            l,
            concat!(
                r#"{"time":"2026-12-02T15:04:05.123Z","level":"warn","msg":"state 3 changed","#,
                r#""keys":12,"delta":-4,"ratio":0.5,"synced":true,"identity":"be_web/srv1","#,
                r#""addr":"127.0.0.1","big":340282366920938463463374607431768211455}"#
            )
        );
        let parsed: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(parsed["keys"], 12);
        assert_eq!(parsed["identity"], "be_web/srv1");
    }

    #[test]
    fn json_line_escapes_strings_and_never_breaks_the_line() {
        let nasty = "a\"b\\c\nd\re\u{1}f\u{9b}g\u{202e}h\u{200b}";
        let l = line(
            Level::Info,
            format_args!("{nasty}"),
            &[("v\n", Value::from(nasty))],
        );
        assert!(!l.chars().any(crate::safe::hidden), "{l}");
        let parsed: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(parsed["msg"], nasty);
        assert_eq!(parsed["v\n"], nasty);
    }

    #[test]
    fn json_line_keeps_reserved_names_apart() {
        let l = line(
            Level::Info,
            format_args!("real"),
            &[
                ("msg", Value::from("fake")),
                ("time", Value::from(1)),
                ("level", Value::from("x")),
            ],
        );
        let parsed: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(parsed["msg"], "real");
        assert_eq!(parsed["level"], "info");
        assert_eq!(parsed["time"], "2026-12-02T15:04:05.123Z");
        assert_eq!(parsed["fields.msg"], "fake");
        assert_eq!(parsed["fields.time"], 1);
        assert_eq!(parsed["fields.level"], "x");
    }

    #[test]
    fn json_line_non_finite_float_is_a_string() {
        let l = line(
            Level::Info,
            format_args!("m"),
            &[("f", Value::from(f64::NAN))],
        );
        let parsed: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(parsed["f"], "NaN");
    }

    #[test]
    fn text_fields_are_appended_and_quoted_when_needed() {
        let kvs: &[(&str, Value<'_>)] = &[
            ("key", Value::from("be_web/srv1")),
            ("old", Value::from("ready 100%")),
            ("n", Value::from(3)),
            ("empty", Value::from("")),
            ("nl", Value::from("a\nb")),
            ("bidi", Value::from("x\u{202e}y")),
            ("q", Value::from("\"a\\b\"")),
        ];
        let record = Record::builder()
            .args(format_args!("m"))
            .key_values(&kvs)
            .build();
        assert_eq!(
            text_fields(&record),
            r#" key=be_web/srv1 old="ready 100%" n=3 empty="" nl="a\u000ab" bidi="x\u202ey" q="\"a\\b\"""#
        );
        let none = Record::builder().args(format_args!("m")).build();
        assert_eq!(text_fields(&none), "");
    }

    #[test]
    fn text_message_control_characters_are_escaped() {
        assert!(matches!(
            text_msg("state change"),
            std::borrow::Cow::Borrowed("state change")
        ));
        assert_eq!(
            text_msg("a\nb\r\u{1b}[0m\u{0}\u{9b}\u{202e}"),
            "a\\u000ab\\u000d\\u001b[0m\\u0000\\u009b\\u202e"
        );
        let out = text_msg("x\ny\u{200b}");
        assert!(!out.chars().any(crate::safe::hidden), "{out}");
    }

    #[test]
    fn json_logger_filters_by_level() {
        let logger = JsonLogger {
            level: log::LevelFilter::Warn,
        };
        let at = |level| Metadata::builder().level(level).build();
        assert!(logger.enabled(&at(Level::Error)));
        assert!(logger.enabled(&at(Level::Warn)));
        assert!(!logger.enabled(&at(Level::Info)));
        assert!(!logger.enabled(&at(Level::Trace)));
    }
}
