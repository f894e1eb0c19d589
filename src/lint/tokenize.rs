//! haproxy configuration text -> lines of words, pure.
//!
//! In: a file's bytes, and for each line the context `$` expansion needs
//! (the environment, the file name, the current section). Out: per physical
//! line its 1-based number and either its words or why haproxy refuses it.
//! Always holds: the words are what haproxy 2.6 and 3.0 hand to their
//! keyword parsers (`readcfgfile` in `src/cfgparse.c`, `parse_line` in
//! `src/tools.c`, called with `ENV | DQUOTE | SQUOTE | BKSLASH | SHARP |
//! WORD_EXPAND`):
//!
//! - a line ends at `\n`; `\r` and NUL also end what is parsed of it (so a
//!   CRLF file parses, and bytes after a lone `\r` are ignored). There is no
//!   line continuation in either version: a trailing `\` is a literal
//!   backslash word (haproxy 2.6.12 rejects it as an unknown keyword);
//! - leading blanks are skipped; a line starting with `[` is a scope line
//!   and yields no words;
//! - blanks (space, tab, VT, FF) outside quotes separate words; `#` outside
//!   quotes starts a comment, even inside a word;
//! - `"…"` groups; inside it `\` escapes and `$VAR` / `${VAR}` /
//!   `${VAR-default}` / `${VAR[*]}` expand from the given environment (as
//!   haproxy expands from its own: the lint sees the values of the shell it
//!   runs in), `$.LINE`, `$.FILE`, `$.SECTION` are haproxy's pseudo
//!   variables; an unset variable directly followed by the closing `"`
//!   swallows that quote and the blanks after it, as haproxy does;
//! - `'…'` groups literally: no escape, no expansion (`'a\n'` is `a`, `\`,
//!   `n`);
//! - outside single quotes `\` turns ` `, `\`, `#`, `'`, `"` into
//!   themselves, `t`, `n`, `r` into TAB, LF, CR, `xHH` into that byte, and
//!   `$` into `$` inside double quotes; any other `\c` stays `\c`;
//! - a trailing empty word (`server a ""`) is not a word.
//!
//! haproxy rejects the line (and the file) for an unmatched quote or brace,
//! a bad variable name, a bad `\x` sequence or a bad `[*]`; a NUL byte makes
//! it stop reading the file ("stray NUL").

/// One word after unquoting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Word {
    pub text: Vec<u8>,
    /// The word's last byte was inside single quotes: tells `'a\n'` (ends
    /// in a literal backslash-n) from the rest.
    pub single_quoted_tail: bool,
}

/// Why haproxy refuses a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    Quote,
    Brace,
    VarName,
    Hex,
    WordExpand,
    StrayNul,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LineError::Quote => "unmatched quote",
            LineError::Brace => "unmatched brace in environment variable name",
            LineError::VarName => "forbidden first char in environment variable name",
            LineError::Hex => "truncated or invalid hexadecimal sequence",
            LineError::WordExpand => "truncated or invalid word expansion sequence",
            LineError::StrayNul => "stray NUL character",
        })
    }
}

/// What `$` expansion reads besides the line itself.
pub struct Context<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub file: &'a str,
    /// haproxy's `.SECTION`: the current section's name (or keyword).
    pub section: &'a str,
    /// The variables the line names that are set nowhere (no default
    /// either): haproxy reads them as empty.
    pub unset: std::cell::RefCell<Vec<String>>,
}

/// Splits a file into `(line number, line without its \n)`, as `fgets`
/// reads it. A final line without `\n` still counts.
pub fn physical_lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let lines = (!text.is_empty()).then(|| body.split(|&b| b == b'\n'));
    lines
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
}

/// haproxy's blank (C `isspace`); `\n` and `\r` never get here inside a line.
fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The words of one line (`line` holds no `\n`), or why haproxy refuses it.
pub fn parse_line(line: &[u8], number: usize, ctx: &Context) -> Result<Vec<Word>, LineError> {
    let start = line
        .iter()
        .position(|&b| !is_blank(b))
        .unwrap_or(line.len());
    if line.get(start) == Some(&b'[') {
        return Ok(Vec::new());
    }
    let mut p = Parser::default();
    let mut i = start;
    while let Some(&c) = line.get(i) {
        match c {
            0 | b'\n' | b'\r' => break,
            b'#' if !p.squote && !p.dquote => break,
            b'"' if !p.squote => {
                p.dquote = !p.dquote;
                i += 1;
            }
            b'\'' if !p.dquote => {
                p.squote = !p.squote;
                i += 1;
            }
            b'\\' if !p.squote => i = p.backslash(line, i)?,
            c if is_blank(c) && !p.squote && !p.dquote => {
                while line.get(i).is_some_and(|&b| is_blank(b)) {
                    i += 1;
                }
                p.next_word();
            }
            b'$' if p.dquote => i = p.dollar(line, i, number, ctx)?,
            c => {
                p.emit(c);
                i += 1;
            }
        }
    }
    if p.squote || p.dquote {
        return Err(LineError::Quote);
    }
    if line[start..].contains(&0) {
        return Err(LineError::StrayNul);
    }
    Ok(p.finish())
}

#[derive(Default)]
struct Parser {
    words: Vec<Word>,
    current: Word,
    squote: bool,
    dquote: bool,
}

impl Parser {
    fn emit(&mut self, b: u8) {
        self.current.text.push(b);
        self.current.single_quoted_tail = self.squote;
    }

    fn next_word(&mut self) {
        self.words.push(std::mem::take(&mut self.current));
    }

    fn finish(mut self) -> Vec<Word> {
        if !self.current.text.is_empty() {
            self.next_word();
        }
        self.words
    }

    /// `line[i]` is a `\` outside single quotes; returns the next index.
    fn backslash(&mut self, line: &[u8], i: usize) -> Result<usize, LineError> {
        let (byte, used) = match line.get(i + 1) {
            Some(&c @ (b' ' | b'\\' | b'#' | b'\'' | b'"')) => (c, 2),
            Some(b't') => (b'\t', 2),
            Some(b'n') => (b'\n', 2),
            Some(b'r') => (b'\r', 2),
            Some(b'$') if self.dquote => (b'$', 2),
            Some(b'x') => {
                let hex = |k: usize| line.get(k).and_then(|&b| (b as char).to_digit(16));
                match (hex(i + 2), hex(i + 3)) {
                    (Some(h), Some(l)) => ((h * 16 + l) as u8, 4),
                    _ => return Err(LineError::Hex),
                }
            }
            _ => (b'\\', 1),
        };
        self.emit(byte);
        Ok(i + used)
    }

    /// `line[i]` is a `$` inside double quotes; returns the next index.
    fn dollar(
        &mut self,
        line: &[u8],
        mut i: usize,
        number: usize,
        ctx: &Context,
    ) -> Result<usize, LineError> {
        let at = |k: usize| line.get(k).copied().unwrap_or(0);
        i += 1;
        let brace = at(i) == b'{';
        i += usize::from(brace);
        let first = at(i);
        if !(first.is_ascii_alphabetic() || first == b'_' || first == b'.') {
            return Err(LineError::VarName);
        }
        let name_start = i;
        i += usize::from(first == b'.');
        while at(i).is_ascii_alphanumeric() || at(i) == b'_' {
            i += 1;
        }
        let name = String::from_utf8_lossy(&line[name_start..i]).into_owned();
        let mut value = lookup(&name, number, ctx)?;
        let expand = brace && at(i) == b'[';
        if expand {
            if line.get(i + 1..i + 3) != Some(b"*]".as_slice()) {
                return Err(LineError::WordExpand);
            }
            i += 3;
        }
        if brace {
            if at(i) == b'-' {
                let close = line[i..].iter().position(|&b| b == b'}' || b == 0);
                let end = close.map(|c| i + c).filter(|&e| at(e) == b'}');
                let end = end.ok_or(LineError::Brace)?;
                value = value.or_else(|| Some(line[i + 1..end].to_vec()));
                i = end;
            }
            if at(i) != b'}' {
                return Err(LineError::Brace);
            }
            i += 1;
        }
        if value.is_none() {
            ctx.unset.borrow_mut().push(name.clone());
        }
        Ok(self.expanded(line, i, value, expand, name.starts_with('.')))
    }

    /// Emits a variable's value (splitting it into words when `expand`), or
    /// for an unset one swallows a closing `"` and the blanks after it.
    fn expanded(
        &mut self,
        line: &[u8],
        mut i: usize,
        value: Option<Vec<u8>>,
        expand: bool,
        pseudo: bool,
    ) -> usize {
        match value {
            Some(value) => {
                let mut bytes = value.iter().copied().peekable();
                while let Some(b) = bytes.next() {
                    if expand && is_blank(b) {
                        while bytes.next_if(|&b| is_blank(b)).is_some() {}
                        self.next_word();
                    } else {
                        self.emit(b);
                    }
                }
            }
            None if !pseudo && line.get(i) == Some(&b'"') => {
                i += 1;
                while line.get(i).is_some_and(|&b| is_blank(b)) {
                    i += 1;
                }
                self.dquote = false;
            }
            None => {}
        }
        i
    }
}

fn lookup(name: &str, number: usize, ctx: &Context) -> Result<Option<Vec<u8>>, LineError> {
    Ok(Some(match name {
        ".LINE" => number.to_string().into_bytes(),
        ".FILE" => ctx.file.as_bytes().to_vec(),
        ".SECTION" => ctx.section.as_bytes().to_vec(),
        _ if name.starts_with('.') => return Err(LineError::VarName),
        _ => return Ok((ctx.env)(name).map(String::into_bytes)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("10.0.0.1".into()),
            "TWO" => Some("a  b".into()),
            _ => None,
        }
    }

    fn parse(line: &str) -> Result<Vec<String>, LineError> {
        let ctx = Context {
            env: &env,
            file: "h.cfg",
            section: "be",
            unset: Default::default(),
        };
        let words = parse_line(line.as_bytes(), 7, &ctx)?;
        Ok(words
            .into_iter()
            .map(|w| String::from_utf8_lossy(&w.text).into_owned())
            .collect())
    }

    fn words(line: &str) -> Vec<String> {
        parse(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn blanks_separate_words_and_leading_blanks_are_skipped() {
        assert_eq!(
            words("  server s1\t127.0.0.1:80 \x0b check"),
            ["server", "s1", "127.0.0.1:80", "check"]
        );
        assert_eq!(words(""), Vec::<String>::new());
        assert_eq!(words(" \t "), Vec::<String>::new());
    }

    #[test]
    fn hash_outside_quotes_starts_a_comment_even_inside_a_word() {
        assert_eq!(words("# all comment"), Vec::<String>::new());
        assert_eq!(words("weight 100 # the weight"), ["weight", "100"]);
        assert_eq!(words("a#b c"), ["a"]);
        assert_eq!(words(r##"a "#b" '#c' \#d"##), ["a", "#b", "#c", "#d"]);
    }

    #[test]
    fn double_quotes_group_and_decode_escapes() {
        assert_eq!(words(r#"agent-send "be/s1\n""#), ["agent-send", "be/s1\n"]);
        assert_eq!(words(r#""a b" "\t\r\\\"\x41\x7a""#), ["a b", "\t\r\\\"Az"]);
        assert_eq!(words(r#""\q\1""#), ["\\q\\1"], "unknown escapes stay");
        assert_eq!(words(r#"x"y z"w"#), ["xy zw"], "quotes join a word");
    }

    #[test]
    fn single_quotes_are_literal() {
        assert_eq!(words(r"agent-send 'be/s1\n'"), ["agent-send", "be/s1\\n"]);
        assert_eq!(words(r#"'a "b" $HOST \x41'"#), [r#"a "b" $HOST \x41"#]);
        assert_eq!(words(r#""it's" 'say "hi"'"#), ["it's", "say \"hi\""]);
    }

    #[test]
    fn single_quoted_tail_marks_the_last_byte() {
        let ctx = Context {
            env: &env,
            file: "f",
            section: "s",
            unset: Default::default(),
        };
        let tails: Vec<bool> = parse_line(br#"'a\n' "a\n" 'a'b a'b'"#, 1, &ctx)
            .unwrap()
            .iter()
            .map(|w| w.single_quoted_tail)
            .collect();
        assert_eq!(tails, [true, false, false, true]);
    }

    #[test]
    fn backslash_outside_quotes_escapes() {
        assert_eq!(words(r"a\ b c"), ["a b", "c"]);
        assert_eq!(words(r"\n\t\\ \x41 \' \$"), ["\n\t\\", "A", "'", "\\$"]);
        assert_eq!(words(r#"\"x\""#), ["\"x\""]);
    }

    #[test]
    fn no_line_continuation_a_trailing_backslash_is_a_word() {
        assert_eq!(words("check \\"), ["check", "\\"]);
        let lines: Vec<(usize, &[u8])> = physical_lines(b"a \\\nb\n").collect();
        assert_eq!(lines, [(1, &b"a \\"[..]), (2, &b"b"[..])]);
    }

    #[test]
    fn physical_lines_number_from_one_and_keep_a_last_line_without_newline() {
        let lines: Vec<(usize, &[u8])> = physical_lines(b"a\n\nb").collect();
        assert_eq!(lines, [(1, &b"a"[..]), (2, &b""[..]), (3, &b"b"[..])]);
        assert_eq!(physical_lines(b"").count(), 0);
        assert_eq!(physical_lines(b"\n").count(), 1);
    }

    #[test]
    fn carriage_return_ends_the_parsed_line() {
        assert_eq!(words("weight 100\r"), ["weight", "100"]);
        assert_eq!(words("weight 100\r agent-check"), ["weight", "100"]);
        assert_eq!(words(r#""a\rb""#), ["a\rb"], "an escaped \\r is data");
    }

    #[test]
    fn environment_expands_inside_double_quotes_only() {
        assert_eq!(
            words(r#""$HOST:80" $HOST '$HOST'"#),
            ["10.0.0.1:80", "$HOST", "$HOST"]
        );
        assert_eq!(words(r#""${HOST}x" "\$HOST""#), ["10.0.0.1x", "$HOST"]);
        assert_eq!(
            words(r#""${UNSET-dflt}" "${HOST-dflt}""#),
            ["dflt", "10.0.0.1"]
        );
        assert_eq!(words(r#""${TWO[*]}" "${TWO}""#), ["a", "b", "a  b"]);
        assert_eq!(
            words(r#""$.LINE" "$.FILE" "${.SECTION}""#),
            ["7", "h.cfg", "be"]
        );
    }

    #[test]
    fn a_variable_set_nowhere_is_named_and_one_with_a_default_is_not() {
        let ctx = Context {
            env: &env,
            file: "h.cfg",
            section: "be",
            unset: Default::default(),
        };
        parse_line(br#""${PORT}" "$HOST" "${X-1}" "$.LINE" "$Y""#, 1, &ctx).unwrap();
        assert_eq!(ctx.unset.into_inner(), ["PORT", "Y"]);
    }

    #[test]
    fn an_unset_variable_before_the_closing_quote_swallows_it_and_the_blanks() {
        assert_eq!(words(r#"a "$UNSET" b"#), ["a", "b"]);
        assert_eq!(words(r#"a "x$UNSET" b"#), ["a", "xb"]);
        assert_eq!(words(r#"a "$UNSET y""#), ["a", " y"]);
    }

    #[test]
    fn a_trailing_empty_word_is_dropped_a_middle_one_kept() {
        assert_eq!(words(r#"agent-send """#), ["agent-send"]);
        assert_eq!(words(r#"a "" b"#), ["a", "", "b"]);
        assert_eq!(words(r#""""#), Vec::<String>::new());
    }

    #[test]
    fn scope_lines_yield_no_words() {
        assert_eq!(words("  [scope]"), Vec::<String>::new());
    }

    #[test]
    fn refused_lines_say_why() {
        for (line, want) in [
            (r#"agent-send "be/s1\n"#, LineError::Quote),
            ("agent-send 'be/s1", LineError::Quote),
            (r#""a" "b"#, LineError::Quote),
            (r"\x4", LineError::Hex),
            (r"\xZZ", LineError::Hex),
            (r#""$1""#, LineError::VarName),
            (r#""$.NOPE""#, LineError::VarName),
            (r#""${HOST""#, LineError::Brace),
            (r#""${HOST-x""#, LineError::Brace),
            (r#""${HOST[x]}""#, LineError::WordExpand),
            ("a\0b", LineError::StrayNul),
        ] {
            assert_eq!(parse(line), Err(want), "{line:?}");
        }
    }
}
