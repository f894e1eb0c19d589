//! A request body as consul's `lib.DecodeJSON` reads it (`lib/json.go`:
//! `json.NewDecoder(data)`, `DisallowUnknownFields`, one `Decode`), so a
//! body it refuses gets Go's words: `EOF`, `unexpected EOF`, or
//! `invalid character 'x' looking for beginning of value`.
//!
//! - In: the body. Out: its first JSON value as [`GoJson`], or Go's error
//!   text.
//! - Go's `Decoder.readValue` (`encoding/json/stream.go`) runs the scanner
//!   of `encoding/json/scanner.go` to the end of the first value: bytes
//!   after it are never read, a body of white space is `io.EOF`, a value cut
//!   short is `io.ErrUnexpectedEOF`, and a bad byte is a `SyntaxError` whose
//!   text names the byte and the scanner state ([`go_quote_char`] and the
//!   contexts below, each that file's `s.error(c, ...)`).
//! - The value is then built by serde on Go's span, with invalid UTF-8 in
//!   strings replaced as Go's `unquote` does (U+FFFD). Approximated: a lone
//!   UTF-16 surrogate escape (Go: U+FFFD), nesting deeper than serde's 128
//!   (Go: 10,000) and a number outside f64 (Go: a type error naming it)
//!   keep serde's text; the scan counts no depth, so a body left open past
//!   10,000 levels is `unexpected EOF` where Go says `exceeded max depth`.

use crate::gocompat::GoJson;

/// The first JSON value of `body`, or why Go's decoder refuses the body.
pub(super) fn decode_first(body: &[u8]) -> Result<GoJson, String> {
    let end = scan_first(body)?;
    // Go's `unquote`: each byte of invalid UTF-8 is one U+FFFD (the scan
    // let such bytes through only inside strings).
    let mut text = String::with_capacity(end);
    for chunk in body[..end].utf8_chunks() {
        text.push_str(chunk.valid());
        text.extend(chunk.invalid().iter().map(|_| char::REPLACEMENT_CHARACTER));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// What an open container expects next (`scanner.go` `parseObjectKey`,
/// `parseObjectValue`, `parseArrayValue`).
#[derive(Clone, Copy)]
enum Open {
    Array,
    Object,
}

/// Go's `Decoder.readValue`: the end of the first value of `b`, or the
/// decoder's error.
fn scan_first(b: &[u8]) -> Result<usize, String> {
    let mut s = Scan { b, at: 0 };
    let mut open: Vec<Open> = Vec::new();
    s.skip_space();
    if s.at == b.len() {
        return Err("EOF".into());
    }
    loop {
        // A value begins (`stateBeginValue`).
        s.value(&mut open)?;
        // The value ended (`stateEndValue`): the next byte is outside it.
        loop {
            let Some(&container) = open.last() else {
                return Ok(s.at);
            };
            s.skip_space();
            let c = s.next()?;
            match (container, c) {
                (Open::Array, b',') => break,
                (Open::Object, b',') => {
                    s.skip_space();
                    s.key()?;
                    break;
                }
                (Open::Array, b']') | (Open::Object, b'}') => {
                    open.pop();
                }
                (Open::Array, _) => return Err(invalid(c, "after array element")),
                (Open::Object, _) => return Err(invalid(c, "after object key:value pair")),
            }
        }
    }
}

struct Scan<'a> {
    b: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn skip_space(&mut self) {
        while self.b.get(self.at).is_some_and(|c| is_space(*c)) {
            self.at += 1;
        }
    }

    /// The next byte; the body's end inside a value is `unexpected EOF`.
    fn next(&mut self) -> Result<u8, String> {
        let c = *self.b.get(self.at).ok_or("unexpected EOF")?;
        self.at += 1;
        Ok(c)
    }

    /// The byte after the value's last, not consumed (`None` at the end).
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    /// One value, or the opening of a container (pushed on `open`, left
    /// where its first value or key begins).
    fn value(&mut self, open: &mut Vec<Open>) -> Result<(), String> {
        loop {
            self.skip_space();
            let c = self.next()?;
            match c {
                b'{' | b'[' => {
                    let object = c == b'{';
                    self.skip_space();
                    if self.peek() == Some(if object { b'}' } else { b']' }) {
                        self.at += 1;
                        return Ok(());
                    }
                    if object {
                        open.push(Open::Object);
                        self.key()?;
                    } else {
                        open.push(Open::Array);
                    }
                    // Loop to begin the first member's value or element.
                }
                b'"' => return self.string(),
                b'-' | b'0'..=b'9' => return self.number(c),
                b't' => return self.literal(b"rue", "true"),
                b'f' => return self.literal(b"alse", "false"),
                b'n' => return self.literal(b"ull", "null"),
                _ => return Err(invalid(c, "looking for beginning of value")),
            }
        }
    }

    /// An object key and its `:` (`stateBeginString`, `stateEndValue` in
    /// `parseObjectKey`), leaving the scan where the member's value begins.
    fn key(&mut self) -> Result<(), String> {
        let c = self.next()?;
        if c != b'"' {
            return Err(invalid(c, "looking for beginning of object key string"));
        }
        self.string()?;
        self.skip_space();
        match self.next()? {
            b':' => Ok(()),
            c => Err(invalid(c, "after object key")),
        }
    }

    /// The rest of a string after its `"` (`stateInString`,
    /// `stateInStringEsc`, `stateInStringEscU*`).
    fn string(&mut self) -> Result<(), String> {
        loop {
            match self.next()? {
                b'"' => return Ok(()),
                b'\\' => match self.next()? {
                    b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {}
                    b'u' => {
                        for _ in 0..4 {
                            let h = self.next()?;
                            if !h.is_ascii_hexdigit() {
                                return Err(invalid(h, "in \\u hexadecimal character escape"));
                            }
                        }
                    }
                    c => return Err(invalid(c, "in string escape code")),
                },
                c if c < 0x20 => return Err(invalid(c, "in string literal")),
                _ => {}
            }
        }
    }

    /// A number from its first byte `c` (`stateNeg`, `state0`, `state1`,
    /// `stateDot`, `stateE`...). It ends at the first byte that cannot
    /// continue it, which is not consumed; the body's end ends it too at
    /// top level (Go's decoder steps a space at EOF).
    fn number(&mut self, c: u8) -> Result<(), String> {
        let digits = |s: &mut Self| {
            while s.peek().is_some_and(|c| c.is_ascii_digit()) {
                s.at += 1;
            }
        };
        // The byte that must be a digit here, else `why`.
        let digit = |s: &mut Self, why: &str| match s.next()? {
            d if d.is_ascii_digit() => Ok(d),
            other => Err(invalid(other, why)),
        };
        let first = match c {
            b'-' => digit(self, "in numeric literal")?,
            d => d,
        };
        if first != b'0' {
            digits(self);
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            digit(self, "after decimal point in numeric literal")?;
            digits(self);
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            digit(self, "in exponent of numeric literal")?;
            digits(self);
        }
        Ok(())
    }

    /// The rest of `true`, `false` or `null` (`stateT`, `stateTr`, ...).
    fn literal(&mut self, rest: &[u8], name: &str) -> Result<(), String> {
        for &want in rest {
            let c = self.next()?;
            if c != want {
                let why = format!("in literal {name} (expecting {})", go_quote_char(want));
                return Err(invalid(c, &why));
            }
        }
        Ok(())
    }
}

/// `scanner.go` `isSpace`.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// `scanner.go` `s.error`: `SyntaxError`'s text.
fn invalid(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", go_quote_char(c))
}

/// `scanner.go` `quoteChar`: the byte as a rune (so 0xff is `'ÿ'`),
/// `strconv.Quote`d between single quotes (`strconv/quote.go`
/// `appendEscapedRune`: the C escapes, `\xNN` below space and for DEL,
/// `\uNNNN` for the Latin-1 runes `IsPrint` refuses).
fn go_quote_char(c: u8) -> String {
    let inner = match c {
        b'\'' => r"\'".into(),
        b'"' => "\"".into(),
        b'\\' => r"\\".into(),
        0x07 => r"\a".into(),
        0x08 => r"\b".into(),
        0x0c => r"\f".into(),
        b'\n' => r"\n".into(),
        b'\r' => r"\r".into(),
        b'\t' => r"\t".into(),
        0x0b => r"\v".into(),
        c if c < 0x20 || c == 0x7f => format!("\\x{c:02x}"),
        0x80..=0xa0 | 0xad => format!("\\u{c:04x}"),
        c => char::from(c).to_string(),
    };
    format!("'{inner}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &[u8]) -> String {
        decode_first(body).unwrap_err()
    }

    /// Go's texts, as `json.NewDecoder(strings.NewReader(body)).Decode(&v)`
    /// gives them.
    #[test]
    fn a_body_go_refuses_gets_gos_text() {
        let cases: [(&[u8], &str); 22] = [
            (b"", "EOF"),
            (b" \r\n\t", "EOF"),
            (b"[", "unexpected EOF"),
            (br#"[{"KV": {"Verb": "se"#, "unexpected EOF"),
            (b"tru", "unexpected EOF"),
            (b"-", "unexpected EOF"),
            (b"1.", "unexpected EOF"),
            (
                b"{not json",
                "invalid character 'n' looking for beginning of object key string",
            ),
            (
                b"not json",
                "invalid character 'o' in literal null (expecting 'u')",
            ),
            (b"x", "invalid character 'x' looking for beginning of value"),
            (
                b"[1,]",
                "invalid character ']' looking for beginning of value",
            ),
            (b"[1 2]", "invalid character '2' after array element"),
            (b"[01]", "invalid character '1' after array element"),
            (br#"{"a" 1}"#, "invalid character '1' after object key"),
            (
                br#"{"a":1 "b"}"#,
                "invalid character '\"' after object key:value pair",
            ),
            (
                br#"{"a":1,}"#,
                "invalid character '}' looking for beginning of object key string",
            ),
            (b"\"a\x01\"", "invalid character '\\x01' in string literal"),
            (br#""\x""#, "invalid character 'x' in string escape code"),
            (
                br#""\u12g4""#,
                "invalid character 'g' in \\u hexadecimal character escape",
            ),
            (b"-a", "invalid character 'a' in numeric literal"),
            (
                b"1.e",
                "invalid character 'e' after decimal point in numeric literal",
            ),
            (
                b"[1e+]",
                "invalid character ']' in exponent of numeric literal",
            ),
        ];
        for (body, why) in cases {
            assert_eq!(refused(body), why, "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(
            refused(b"'"),
            r"invalid character '\'' looking for beginning of value"
        );
        assert_eq!(
            refused(b"\xff"),
            "invalid character 'ÿ' looking for beginning of value"
        );
        assert_eq!(
            refused(b"\x85"),
            r"invalid character '\u0085' looking for beginning of value"
        );
        assert_eq!(
            refused(b"\x7f"),
            r"invalid character '\x7f' looking for beginning of value"
        );
        assert_eq!(
            refused(b"\\"),
            r"invalid character '\\' looking for beginning of value"
        );
        assert_eq!(
            refused(b"\"\n\""),
            r"invalid character '\n' in string literal"
        );
        assert_eq!(refused(b"\n"), "EOF");
        assert_eq!(refused(b"[\n"), "unexpected EOF");
        assert_eq!(refused(&[b'['; 100_000]), "unexpected EOF", "no recursion");
    }

    /// `Decode` reads one value: what follows it is never looked at, and a
    /// number at top level ends at the body's end.
    #[test]
    fn the_first_value_is_decoded_and_what_follows_is_ignored() {
        let v = |b: &[u8]| decode_first(b).unwrap();
        assert_eq!(v(b"[] trailing {"), GoJson::Array(Vec::new()));
        assert_eq!(v(br#""x"garbage"#), GoJson::String("x".into()));
        assert_eq!(v(b"12"), GoJson::Number(12.into()));
        assert_eq!(v(b"0123"), GoJson::Number(0.into()));
        assert_eq!(v(b" null "), GoJson::Null);
        let doc = v(br#"[{"KV": {"Key": "a\u00e9\n", "Flags": -1.5e3}}, true, false]"#);
        let GoJson::Array(items) = doc else {
            panic!("{doc:?}")
        };
        assert_eq!(items.len(), 3);
        assert_eq!(
            v(b"\"a\xe2\x80b\""),
            GoJson::String("a\u{fffd}\u{fffd}b".into()),
            "invalid UTF-8 is U+FFFD, as Go's unquote"
        );
    }
}
