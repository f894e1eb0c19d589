//! Go's standard library, as far as this program must answer like a Go
//! program: `time.ParseDuration`, `strconv.ParseBool`/`Quote`,
//! `url.Values.Encode`, `encoding/json`'s HTML escaping, and `net/http`'s
//! path cleaning and redirect. The flags take Go syntax (the agent this one
//! replaces is a Go program) and the dev KV answers like consul, a Go
//! server.
//!
//! In: text (a flag value, a query parameter, a request path, JSON bytes).
//! Out: the value or bytes the Go function gives.
//!
//! Always holds:
//! - pure, no panics on any input;
//! - where Go reports an error, the result says so and no value is guessed.

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

/// A JSON document as Go's `encoding/json` walks it into a struct: an
/// object's members stay in document order, so a name given twice (or in
/// two spellings that fold together) is decoded twice and the last wins,
/// and the first member Go refuses is the one its error names.
#[derive(Debug, Clone, PartialEq)]
pub enum GoJson {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<GoJson>),
    Object(Vec<(String, GoJson)>),
}

impl GoJson {
    /// How Go's `UnmarshalTypeError` names this value when it cannot go
    /// into a field (`decode.go` `literalStore`): `"number 1.5"` when a
    /// number does not fit an integer field (`int_field`), else its kind.
    pub fn go_kind(&self, int_field: bool) -> String {
        match self {
            GoJson::Null => "null".into(),
            GoJson::Bool(_) => "bool".into(),
            GoJson::Number(n) if int_field => format!("number {n}"),
            GoJson::Number(_) => "number".into(),
            GoJson::String(_) => "string".into(),
            GoJson::Array(_) => "array".into(),
            GoJson::Object(_) => "object".into(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for GoJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GoJson, D::Error> {
        d.deserialize_any(GoJsonVisitor)
    }
}

struct GoJsonVisitor;

impl<'de> serde::de::Visitor<'de> for GoJsonVisitor {
    type Value = GoJson;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<GoJson, E> {
        Ok(GoJson::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<GoJson, E> {
        Ok(GoJson::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<GoJson, E> {
        Ok(GoJson::Number(n.into()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<GoJson, E> {
        Ok(GoJson::Number(n.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<GoJson, E> {
        serde_json::Number::from_f64(n)
            .map(GoJson::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }
    fn visit_str<E>(self, s: &str) -> Result<GoJson, E> {
        Ok(GoJson::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<GoJson, E> {
        Ok(GoJson::String(s))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<GoJson, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(GoJson::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<GoJson, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry()? {
            members.push(member);
        }
        Ok(GoJson::Object(members))
    }
}

/// Whether the JSON member name `key` selects the Go struct field named
/// `field` (an ASCII name). `encoding/json` prefers an exact match and
/// otherwise takes a name that folds equal (`fold.go` `foldName`: ASCII
/// letters case-insensitively, and any other rune as the smallest of its
/// `unicode.SimpleFold` orbit, so the Kelvin sign `K` is `K` and the long
/// `ſ` is `S`; no other non-ASCII rune folds to ASCII). So `"verb"` sets
/// `Verb`.
pub fn go_json_field_is(key: &str, field: &str) -> bool {
    let fold = |c: char| match c {
        '\u{212A}' => 'K',
        '\u{17F}' => 'S',
        c => c.to_ascii_uppercase(),
    };
    key.chars().map(fold).eq(field.chars().map(fold))
}

/// Go's `base64.StdEncoding.DecodeString`: padded, trailing bits not
/// checked, `\r` and `\n` skipped; an error names the offset as
/// `CorruptInputError` does ("illegal base64 data at input byte N").
pub fn go_base64_decode(s: &str) -> Result<Vec<u8>, String> {
    use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurpose};
    use base64::Engine as _;
    const GO_STD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        general_purpose::PAD
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let kept: String = s.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    GO_STD.decode(&kept).map_err(|e| {
        let at = match e {
            base64::DecodeError::InvalidByte(at, _)
            | base64::DecodeError::InvalidLastSymbol(at, _) => at,
            // A last group cut short or badly padded: Go names where it starts.
            _ => kept.len() / 4 * 4,
        };
        format!("illegal base64 data at input byte {at}")
    })
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
    #[test]
    fn json_field_names_fold_as_go_matches_them() {
        for key in ["Verb", "verb", "VERB", "vErB"] {
            assert!(go_json_field_is(key, "Verb"), "{key}");
        }
        assert!(
            go_json_field_is("\u{212A}V", "KV"),
            "the Kelvin sign folds to K"
        );
        assert!(
            go_json_field_is("\u{17F}ession", "Session"),
            "the long s folds to S"
        );
        for key in ["Verbs", "Ver", "Vérb", "V\u{130}rb", ""] {
            assert!(!go_json_field_is(key, "Verb"), "{key}");
        }
    }

    #[test]
    fn go_json_keeps_members_in_order_and_names_kinds_as_go() {
        let doc: GoJson = serde_json::from_str(r#"{"b":1,"a":[true,null],"B":"x"}"#).unwrap();
        let GoJson::Object(members) = doc else {
            panic!("not an object");
        };
        let names: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["b", "a", "B"]);
        assert_eq!(members[0].1.go_kind(false), "number");
        assert_eq!(members[0].1.go_kind(true), "number 1");
        assert_eq!(members[1].1.go_kind(true), "array");
        assert_eq!(members[2].1.go_kind(true), "string");
        let neg: GoJson = serde_json::from_str("-1.5").unwrap();
        assert_eq!(neg.go_kind(true), "number -1.5");
    }

    #[test]
    fn base64_decodes_as_gos_std_encoding() {
        assert_eq!(go_base64_decode("ZHJhaW4="), Ok(b"drain".to_vec()));
        assert_eq!(go_base64_decode("ZHJh\r\naW4="), Ok(b"drain".to_vec()));
        // Go does not check the unused bits of the last symbol.
        assert_eq!(go_base64_decode("YR=="), Ok(b"a".to_vec()));
        assert_eq!(
            go_base64_decode("ZH!h"),
            Err("illegal base64 data at input byte 2".into())
        );
        assert_eq!(
            go_base64_decode("ZHJhaW4"),
            Err("illegal base64 data at input byte 4".into())
        );
    }
}
