//! Go's standard library, as far as this program must answer like a Go
//! program: `time.ParseDuration`, `strconv.ParseBool`/`Quote`,
//! `url.Values.Encode`, `encoding/json`'s HTML escaping, and `net/http`'s
//! path cleaning and redirect. The flags take Go syntax (the agent this one
//! replaces is a Go program) and the dev KV answers like consul, a Go
//! server.
//!
//! In: text (a flag value, a query parameter, a request path, JSON bytes).
//! Out: the value or bytes the Go function gives. Always holds: pure, no
//! panics on any input; where Go reports an error, the result says so and
//! no value is guessed.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::http::{percent_encode, EncodeSet, Method, Response};

/// Parses a Go duration (`300ms`, `1.5s`, `1m30s`, `2h`; units ns us µs ms s m h)
/// with the sign kept apart: `(negative, magnitude)`.
///
/// As Go's `time.ParseDuration`: a sequence of decimal numbers, each with an
/// optional fraction and a required unit; `0` alone needs no unit; a leading
/// `+` or `-` is allowed. Not a duration, or one past Go's limit (about 292
/// years), gives `None`. Consul, for one, reads a negative `wait` as "the
/// default"; flags refuse negative durations.
pub fn parse_signed_duration(s: &str) -> Option<(bool, Duration)> {
    const MAX_NANOS: u128 = i64::MAX as u128;
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some((negative, Duration::ZERO));
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (nanos, after) = duration_term(rest)?;
        total = total.checked_add(nanos)?;
        if total > MAX_NANOS {
            return None;
        }
        rest = after;
    }
    Some((negative, Duration::from_nanos(total as u64)))
}

/// One `<number>[.<fraction>]<unit>` of a duration: its nanoseconds and the
/// text after it.
fn duration_term(s: &str) -> Option<(u128, &str)> {
    let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, after) = s.split_at(int_len);
    let (frac_part, after) = match after.strip_prefix('.') {
        Some(frac) => {
            let n = frac.bytes().take_while(u8::is_ascii_digit).count();
            frac.split_at(n)
        }
        None => ("", after),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let unit_len = after
        .find(|c: char| c == '.' || c.is_ascii_digit())
        .unwrap_or(after.len());
    let (unit, after) = after.split_at(unit_len);
    let unit_nanos: u128 = match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    };
    let int_digits = int_part.trim_start_matches('0');
    if int_digits.len() > 19 {
        return None;
    }
    let int: u128 = if int_digits.is_empty() {
        0
    } else {
        int_digits.parse().ok()?
    };
    let mut nanos = int * unit_nanos;
    if !frac_part.is_empty() {
        // Digits past the 18th are below a nanosecond even for hours.
        let digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = digits.parse().ok()?;
        nanos += frac * unit_nanos / 10u128.pow(digits.len() as u32);
    }
    Some((nanos, after))
}

/// Go's `time.ParseDuration` as consul reads a query duration. `None`: not
/// a duration. `Some(None)`: a negative duration (only its sign matters).
pub fn parse_go_duration(s: &str) -> Option<Option<Duration>> {
    let (negative, d) = parse_signed_duration(s)?;
    Some((!negative || d.is_zero()).then_some(d))
}

/// One argv word as Go's `flag` package reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoArg<'a> {
    /// Not a flag: no leading `-`, or a lone `-`.
    NotFlag,
    /// `-name`, `--name`, `-name=value`, `--name=value`: the name and the
    /// value after `=`, if any.
    Flag(&'a str, Option<&'a str>),
    /// `---name` or `-=value`: Go's "bad flag syntax".
    BadSyntax,
}

/// Reads one argv word (`--` alone is the caller's: it ends the flags).
pub fn go_flag(arg: &str) -> GoArg<'_> {
    let body = match arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) {
        Some(body) if !body.is_empty() => body,
        _ => return GoArg::NotFlag,
    };
    if body.starts_with('-') || body.starts_with('=') {
        return GoArg::BadSyntax;
    }
    match body.split_once('=') {
        Some((name, value)) => GoArg::Flag(name, Some(value)),
        None => GoArg::Flag(body, None),
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.Quote`, close enough for error messages.
pub fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Go's encoder escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings;
/// these can only occur inside strings in JSON text, so a byte rewrite of
/// the whole document is exact.
pub fn go_html_escape(json: Vec<u8>) -> Vec<u8> {
    let needs = |w: &[u8]| matches!(w, [b'<' | b'>' | b'&', ..] | [0xe2, 0x80, 0xa8 | 0xa9, ..]);
    if !(0..json.len()).any(|i| needs(&json[i..])) {
        return json;
    }
    let mut out = Vec::with_capacity(json.len() + 16);
    let mut i = 0;
    while i < json.len() {
        match &json[i..] {
            [b'<', ..] => out.extend_from_slice(b"\\u003c"),
            [b'>', ..] => out.extend_from_slice(b"\\u003e"),
            [b'&', ..] => out.extend_from_slice(b"\\u0026"),
            [0xe2, 0x80, b @ (0xa8 | 0xa9), ..] => {
                out.extend_from_slice(if *b == 0xa8 { b"\\u2028" } else { b"\\u2029" });
                i += 2;
            }
            [b, ..] => out.push(*b),
            [] => unreachable!(),
        }
        i += 1;
    }
    out
}

/// Go's `url.Values.Encode` over decoded query pairs: keys sorted, each
/// key's values in their order, query-escaped.
pub fn go_encode_query(pairs: &[(String, String)]) -> String {
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (k, v) in pairs {
        by_key.entry(k).or_default().push(v);
    }
    let mut out = String::new();
    for (k, vs) in by_key {
        for v in vs {
            if !out.is_empty() {
                out.push('&');
            }
            out.push_str(&percent_encode(k, EncodeSet::GO_QUERY));
            out.push('=');
            out.push_str(&percent_encode(v, EncodeSet::GO_QUERY));
        }
    }
    out
}

/// Go's `net/http` `cleanPath`: `path.Clean` on a rooted path, keeping a
/// trailing `/`.
pub fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut out = String::with_capacity(p.len() + 1);
    for s in &parts {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || p.ends_with('/') {
        out.push('/');
    }
    out
}

/// Go's `http.Redirect` with 301 to `path` (decoded, already clean) plus the
/// raw `query`: `Location` escaped as `URL.EscapedPath`, and for GET and HEAD
/// the short HTML body.
pub fn go_redirect(method: Method, path: &str, query: &str) -> Response {
    let mut location = percent_encode(path, EncodeSet::GO_URL_PATH);
    if !query.is_empty() {
        location.push('?');
        location.push_str(query);
    }
    let mut resp = Response {
        status: 301,
        headers: vec![("Location", location.clone())],
        body: Vec::new(),
    };
    if method == Method::Get || method == Method::Head {
        resp.headers
            .insert(0, ("Content-Type", "text/html; charset=utf-8".to_owned()));
        resp.body = format!(
            "<a href=\"{}\">Moved Permanently</a>.\n\n",
            html_escape(&location)
        )
        .into_bytes();
    }
    resp
}

/// Go's `html.EscapeString`.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        // Non-negative durations, as the flags take them.
        let parse_duration = |s: &str| match parse_signed_duration(s)? {
            (true, d) if !d.is_zero() => None,
            (_, d) => Some(d),
        };
        let cases: &[(&str, Option<Duration>)] = &[
            ("100ms", Some(ms(100))),
            ("1m30s", Some(ms(90_000))),
            ("1.5s", Some(ms(1500))),
            (".5s", Some(ms(500))),
            ("1.s", Some(ms(1000))),
            ("2h", Some(Duration::from_secs(7200))),
            ("1h2m3s4ms5us6ns", Some(Duration::new(3723, 4_005_006))),
            ("3µs", Some(Duration::from_micros(3))),
            ("3μs", Some(Duration::from_micros(3))),
            ("3us", Some(Duration::from_micros(3))),
            ("7ns", Some(Duration::from_nanos(7))),
            ("0", Some(Duration::ZERO)),
            ("+0", Some(Duration::ZERO)),
            ("-0", Some(Duration::ZERO)),
            ("0s", Some(Duration::ZERO)),
            ("+5s", Some(Duration::from_secs(5))),
            ("1.0000000001s", Some(Duration::from_secs(1))),
            (
                "2562047h47m16.854775807s",
                Some(Duration::from_nanos(i64::MAX as u64)),
            ),
            ("2562047h47m16.854775808s", None),
            ("9999999999999999999999h", None),
            ("5", None),
            ("-1s", None),
            ("1x", None),
            ("", None),
            ("s", None),
            (".s", None),
            ("1.2.3s", None),
            ("1s ", None),
            (" 1s", None),
            ("1S", None),
            ("+", None),
            ("-", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_duration(s), *want, "{s:?}");
        }
    }

    #[test]
    fn go_durations() {
        let ok = |s: &str| parse_go_duration(s).unwrap().unwrap();
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("2h"), Duration::from_secs(7200));
        assert_eq!(ok("60000ms"), Duration::from_secs(60));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("10\u{b5}s"), Duration::from_micros(10));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("+3s"), Duration::from_secs(3));
        assert_eq!(parse_go_duration("-3s"), Some(None));
        // "1.s5": a trailing number without a unit.
        for bad in ["", "10", "s", "1x", ".s", "1.s5", "3000000h", "--1s", "1 s"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
        assert_eq!(ok("1.s"), Duration::from_secs(1));
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", " true", "2"] {
            assert_eq!(parse_go_bool(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn quote_and_html_escape() {
        assert_eq!(go_quote("a\"b\n"), r#""a\"b\n""#);
        assert_eq!(
            go_html_escape(b"{\"k\":\"<a&b>\xe2\x80\xa8\xe2\x80\xa9\"}".to_vec()),
            br#"{"k":"\u003ca\u0026b\u003e\u2028\u2029"}"#.to_vec()
        );
        assert_eq!(go_html_escape(b"[1]".to_vec()), b"[1]".to_vec());
    }

    #[test]
    fn encode_query_sorts_keys_and_keeps_value_order() {
        let pairs: Vec<(String, String)> = [("cas", "1"), ("acquire", "a b"), ("cas", "&")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(go_encode_query(&pairs), "acquire=a+b&cas=1&cas=%26");
        assert_eq!(go_encode_query(&[]), "");
    }

    #[test]
    fn clean_paths() {
        for (p, want) in [
            ("/v1/kv//foo", "/v1/kv/foo"),
            ("/v1/kv/a/./b", "/v1/kv/a/b"),
            ("/v1/kv/a/../b", "/v1/kv/b"),
            ("/v1/kv/dir/", "/v1/kv/dir/"),
            ("/../..", "/"),
            ("", "/"),
            ("/a/b/..", "/a"),
        ] {
            assert_eq!(clean_path(p), want, "{p:?}");
        }
    }

    #[test]
    fn redirect_body_only_for_get_and_head() {
        let r = go_redirect(Method::Get, "/v1/kv/a b\"", "recurse&x=<");
        assert_eq!(r.status, 301);
        assert_eq!(
            r.headers,
            [
                ("Content-Type", "text/html; charset=utf-8".to_owned()),
                ("Location", "/v1/kv/a%20b%22?recurse&x=<".to_owned()),
            ]
        );
        assert_eq!(
            r.body,
            b"<a href=\"/v1/kv/a%20b%22?recurse&amp;x=&lt;\">Moved Permanently</a>.\n\n"
        );
        let r = go_redirect(Method::Put, "/v1/kv/a", "");
        assert_eq!(r.headers, [("Location", "/v1/kv/a".to_owned())]);
        assert!(r.body.is_empty());
    }
}
