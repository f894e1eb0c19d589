//! Query strings, percent-decoding and the one percent-encoder.
//!
//! In: a raw query string or a percent-encoded component; or text to escape
//! and the set of bytes that may stay as they are. Out: decoded pairs or
//! bytes; escaped text.
//!
//! Always holds:
//! - no panics;
//! - decoded output is never longer than its input;
//! - escapes are `%XX` with upper-case hex, as Go writes them.

/// Splits a raw query (`a=1&b&c=x%20y`) into percent-decoded pairs; a flag
/// without `=` has an empty value. `+` decodes as a space in both name and
/// value, like Go's `url.ParseQuery` (which consul uses).
///
/// Also like `url.ParseQuery`, pieces that cannot be trusted are skipped
/// rather than guessed at: empty pieces (`a&&b`), pieces holding `;` (Go
/// refuses them since 1.17), pieces with a malformed escape (`%zz`, `%4`),
/// and pieces that do not decode to UTF-8. An empty name (`=x`) is kept.
pub fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query
        .split('&')
        .filter(|piece| !piece.is_empty() && !piece.contains(';'))
        .filter_map(|piece| {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            Some((decode_component(name)?, decode_component(value)?))
        })
}

/// One query component: `+` as space, then percent-decoding, then UTF-8.
fn decode_component(s: &str) -> Option<String> {
    let bytes = percent_decode_bytes(s.as_bytes(), true)?;
    String::from_utf8(bytes).ok()
}

/// Percent-decodes bytes; `None` for a malformed escape. `+` stays `+`.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    percent_decode_bytes(s.as_bytes(), false)
}

fn percent_decode_bytes(s: &[u8], plus_is_space: bool) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                let hi = hex(*s.get(i + 1)?)?;
                let lo = hex(*s.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Which bytes [`percent_encode`] leaves as they are, besides RFC 3986's
/// unreserved ones (`A-Z a-z 0-9 - . _ ~`), and whether a space becomes `+`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeSet {
    keep: &'static [u8],
    space_as_plus: bool,
}

impl EncodeSet {
    /// A consul KV key in a request path: `/` separates the segments.
    pub const KV_PATH: EncodeSet = EncodeSet {
        keep: b"/",
        space_as_plus: false,
    };
    /// A path as Go's `URL.EscapedPath` writes it (`url.PathEscape` rules,
    /// with `/` kept).
    pub const GO_URL_PATH: EncodeSet = EncodeSet {
        keep: b"$&+,/:;=@",
        space_as_plus: false,
    };
    /// A query name or value, as Go's `url.QueryEscape`.
    pub const GO_QUERY: EncodeSet = EncodeSet {
        keep: b"",
        space_as_plus: true,
    };
}

/// Percent-encodes every byte of `s` outside `set`.
pub fn percent_encode(s: &str, set: EncodeSet) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || set.keep.contains(&b) {
            out.push(b as char);
        } else if b == b' ' && set.space_as_plus {
            out.push('+');
        } else {
            out.push('%');
            out.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
            out.push(char::from(HEX_DIGITS[usize::from(b & 0xf)]));
        }
    }
    out
}

const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        query_pairs(q).collect()
    }

    fn p(name: &str, value: &str) -> (String, String) {
        (name.to_string(), value.to_string())
    }

    #[test]
    fn consul_blocking_query() {
        assert_eq!(
            pairs("recurse&index=42&wait=5s"),
            vec![p("recurse", ""), p("index", "42"), p("wait", "5s")]
        );
        assert_eq!(pairs(""), vec![]);
    }

    #[test]
    fn decoding_and_plus() {
        assert_eq!(
            pairs("a=x%20y&b=c+d&c=%2B&key%2Fname=v%3Dw"),
            vec![
                p("a", "x y"),
                p("b", "c d"),
                p("c", "+"),
                p("key/name", "v=w")
            ]
        );
        assert_eq!(
            pairs("k=v=w&e=&n+m=%C3%A9"),
            vec![p("k", "v=w"), p("e", ""), p("n m", "é")]
        );
        assert_eq!(pairs("=x"), vec![p("", "x")]);
    }

    #[test]
    fn untrusted_pieces_are_skipped() {
        assert_eq!(pairs("a=%zz&b=1"), vec![p("b", "1")]);
        assert_eq!(pairs("a=%4&b=1&c=%"), vec![p("b", "1")]);
        assert_eq!(pairs("%g1=x&b=2"), vec![p("b", "2")]);
        assert_eq!(pairs("&&a=1&"), vec![p("a", "1")]);
        assert_eq!(pairs("a=1;b=2&c=3"), vec![p("c", "3")]);
        assert_eq!(pairs("a=%ff&b=%C3"), vec![]);
    }

    #[test]
    fn percent_encode_sets() {
        let all = "a/b c+&=~é%";
        assert_eq!(
            percent_encode(all, EncodeSet::KV_PATH),
            "a/b%20c%2B%26%3D~%C3%A9%25"
        );
        assert_eq!(
            percent_encode(all, EncodeSet::GO_URL_PATH),
            "a/b%20c+&=~%C3%A9%25"
        );
        assert_eq!(
            percent_encode(all, EncodeSet::GO_QUERY),
            "a%2Fb+c%2B%26%3D~%C3%A9%25"
        );
        assert_eq!(percent_encode("", EncodeSet::GO_QUERY), "");
        assert_eq!(percent_encode("\x00\x7f", EncodeSet::KV_PATH), "%00%7F");
        // Whatever is encoded decodes back to itself.
        let text = "gitlab/web 01?#%+é";
        for set in [EncodeSet::KV_PATH, EncodeSet::GO_URL_PATH] {
            let encoded = percent_encode(text, set);
            assert_eq!(percent_decode(&encoded).as_deref(), Some(text.as_bytes()));
        }
    }

    #[test]
    fn percent_decode_rules() {
        assert_eq!(
            percent_decode("gitlab%2Fweb-01").as_deref(),
            Some(&b"gitlab/web-01"[..])
        );
        assert_eq!(percent_decode("a+b").as_deref(), Some(&b"a+b"[..]));
        assert_eq!(percent_decode("%c3%A9").as_deref(), Some(&[0xc3, 0xa9][..]));
        assert_eq!(percent_decode("%00%FF").as_deref(), Some(&[0x00, 0xff][..]));
        assert_eq!(percent_decode("").as_deref(), Some(&b""[..]));
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%a"), None);
        assert_eq!(percent_decode("abc%"), None);
        assert_eq!(percent_decode("%g0"), None);
        assert_eq!(percent_decode("%0g"), None);
        assert_eq!(percent_decode("%+1"), None);
        // Multi-byte UTF-8 right after an escape does not split a char.
        assert_eq!(percent_decode("%2é").as_deref(), None);
        assert_eq!(percent_decode("é%2F").as_deref(), Some("é/".as_bytes()));
    }
}
