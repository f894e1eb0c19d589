//! `.if` / `.elif` / `.else` / `.endif` blocks, pure.
//!
//! In: each line's words, in file order. Out: whether the line is a
//! directive (consumed here), and whether a non-directive line is active.
//! Always holds: nesting is tracked exactly as `readcfgfile` does
//! (`src/cfgparse.c`): a block inside a dropped branch is dropped whatever
//! its condition, and at most one branch of a block is taken.
//!
//! Conditions (`cfg_eval_condition`, `src/cfgcond.c`): the words joined by
//! spaces; `!` negates, `&&` binds tighter than `||`, `( … )` groups, an
//! integer is true when non-zero, the empty condition is false;
//! `defined(VAR)` reads the environment given, `streq`, `strneq`, `strstr`
//! compare their two arguments. What the lint cannot know
//! (`feature(…)`, `version_atleast(…)`, `enabled(…)`, OpenSSL versions) and
//! what it cannot parse counts as true, so the first such branch is the one
//! checked. Lone `.elif` / `.else` / `.endif` (which haproxy refuses) are
//! reported and ignored.
//!
//! Two limits are haproxy's and end its reading of the configuration
//! ([`Line::Abort`]): a condition nested deeper than its parser allows
//! (`MAX_CFG_RECURSION`, 1024 levels of expression / and / term, so 340
//! parentheses; haproxy says "unparsable conditional sub-expression"), and
//! [`MAX_NESTED_IFS`] open `.if` blocks (`MAXNESTEDCONDS`). The reader here
//! has the same depth budget, so its recursion is bounded too.

/// haproxy's `MAX_CFG_RECURSION` (`include/haproxy/defaults.h`): the depth
/// budget of its condition parser, one level per expression, `&&` chain
/// and term.
pub const MAX_CFG_RECURSION: u32 = 1024;

/// haproxy's `MAXNESTEDCONDS`: the 100th nested `.if` is refused.
pub const MAX_NESTED_IFS: usize = 100;

const TOO_DEEP: &str = "unparsable conditional sub-expression: nested deeper than haproxy's parser allows (MAX_CFG_RECURSION 1024, about 340 parentheses)";
const TOO_MANY_IFS: &str = "too many nested '.if', max is 100";

/// One open `.if` block.
struct Block {
    /// Every enclosing block takes its current branch.
    parent_active: bool,
    /// This block's current branch is taken.
    taking: bool,
    /// Some branch of this block was taken already (or `.else` was seen).
    done: bool,
    /// A condition of this block so far held what the lint cannot know
    /// (or could not parse): its current branch may not be haproxy's.
    guessed: bool,
}

/// The open blocks of one file.
#[derive(Default)]
pub struct Conditions {
    blocks: Vec<Block>,
}

/// What a line is, for the block structure.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A directive, consumed; `Some(reason)` when haproxy refuses it.
    Directive(Option<&'static str>),
    /// A configuration line: whether the current branches take it.
    Config { active: bool },
    /// A directive after which haproxy stops reading the configuration.
    Abort(&'static str),
}

impl Conditions {
    fn active(&self) -> bool {
        self.blocks.last().is_none_or(|b| b.taking)
    }

    /// Whether the current line's place (taken or not) rests on a
    /// condition the lint could not evaluate, in any open block.
    pub fn guessed(&self) -> bool {
        self.blocks.iter().any(|b| b.guessed)
    }

    /// Classifies one line (its words after unquoting).
    pub fn line(&mut self, words: &[&[u8]], env: &dyn Fn(&str) -> Option<String>) -> Line {
        let condition = || words.get(1..).unwrap_or_default().join(&b' ');
        let reason = match words.first().copied() {
            Some(b".if") => {
                if self.blocks.len() + 1 >= MAX_NESTED_IFS {
                    return Line::Abort(TOO_MANY_IFS);
                }
                let parent_active = self.active();
                let (taking, guessed) = match parent_active.then(|| evaluate(&condition(), env)) {
                    None => (false, false),
                    Some(Ok(verdict)) => verdict,
                    Some(Err(reason)) => return Line::Abort(reason),
                };
                self.blocks.push(Block {
                    parent_active,
                    taking,
                    done: taking,
                    guessed,
                });
                None
            }
            Some(b".elif") => {
                let evaluated = match self.blocks.last() {
                    Some(b) if b.parent_active && !b.done => evaluate(&condition(), env),
                    _ => Ok((false, false)),
                };
                let Ok((taking, guessed)) = evaluated else {
                    return Line::Abort(TOO_DEEP);
                };
                self.innermost(".elif", |b| {
                    b.taking = taking;
                    b.done |= b.taking;
                    b.guessed |= guessed;
                })
            }
            Some(b".else") => self.innermost(".else", |b| {
                b.taking = b.parent_active && !b.done;
                b.done = true;
            }),
            Some(b".endif") => self.blocks.pop().is_none().then_some("lone '.endif'"),
            _ => {
                return Line::Config {
                    active: self.active(),
                }
            }
        };
        Line::Directive(reason)
    }

    /// Applies `f` to the innermost block, or gives the reason a lone
    /// directive is refused.
    fn innermost(&mut self, what: &str, f: impl FnOnce(&mut Block)) -> Option<&'static str> {
        match self.blocks.last_mut() {
            Some(b) => {
                f(b);
                None
            }
            None if what == ".else" => Some("lone '.else'"),
            None => Some("lone '.elif'"),
        }
    }
}

/// Evaluates a condition; what cannot be evaluated is true; `Err` when
/// haproxy refuses it for its depth.
pub fn eval(text: &[u8], env: &dyn Fn(&str) -> Option<String>) -> Result<bool, &'static str> {
    evaluate(text, env).map(|(value, _)| value)
}

/// [`eval`], and whether the value was guessed (a predicate the lint
/// cannot know, or text it cannot parse).
fn evaluate(
    text: &[u8],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(bool, bool), &'static str> {
    let text = String::from_utf8_lossy(text);
    let mut p = CondParser {
        rest: text.trim(),
        env,
        too_deep: false,
        guessed: false,
    };
    if p.rest.is_empty() {
        return Ok((false, false));
    }
    let value = p.or(MAX_CFG_RECURSION);
    if p.too_deep {
        return Err(TOO_DEEP);
    }
    Ok(match value {
        Some(v) if p.rest.trim().is_empty() => (v, p.guessed),
        _ => (true, true),
    })
}

/// A recursive-descent reader over the rest of the condition; `None` is
/// "cannot parse". Each level takes one from `depth`, as haproxy's
/// `maxdepth`; at 0 the reader gives up and sets `too_deep`.
struct CondParser<'a, 'e> {
    rest: &'a str,
    env: &'e dyn Fn(&str) -> Option<String>,
    too_deep: bool,
    /// A predicate the lint cannot know was read.
    guessed: bool,
}

impl CondParser<'_, '_> {
    fn skip_blanks(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_blanks();
        let ate = self.rest.starts_with(token);
        if ate {
            self.rest = &self.rest[token.len()..];
        }
        ate
    }

    /// Takes one level from `depth`, or marks the condition too deep.
    fn descend(&mut self, depth: u32) -> Option<u32> {
        self.too_deep |= depth == 0;
        depth.checked_sub(1)
    }

    /// `and || and || …`; haproxy reads the right side as a nested
    /// expression, so each `||` takes a level too.
    fn or(&mut self, mut depth: u32) -> Option<bool> {
        let mut v = false;
        loop {
            depth = self.descend(depth)?;
            v |= self.and(depth)?;
            if !self.eat("||") {
                return Some(v);
            }
        }
    }

    /// `term && term && …`, each `&&` taking a level as in `or`.
    fn and(&mut self, mut depth: u32) -> Option<bool> {
        let mut v = true;
        loop {
            depth = self.descend(depth)?;
            v &= self.term(depth)?;
            if !self.eat("&&") {
                return Some(v);
            }
        }
    }

    fn term(&mut self, depth: u32) -> Option<bool> {
        let depth = self.descend(depth)?;
        let mut negate = false;
        while self.eat("!") {
            negate = !negate;
        }
        self.skip_blanks();
        let v = if self.rest.starts_with(|c: char| c.is_ascii_digit()) {
            let len = self.rest.find(|c: char| !c.is_ascii_alphanumeric());
            let (number, rest) = self.rest.split_at(len.unwrap_or(self.rest.len()));
            self.rest = rest;
            let digits = number.strip_prefix("0x").or(number.strip_prefix("0X"));
            let digits = digits
                .unwrap_or(number)
                .bytes()
                .take_while(u8::is_ascii_hexdigit);
            digits.into_iter().any(|b| b != b'0')
        } else if self.eat("(") {
            let v = self.or(depth)?;
            self.eat(")").then_some(v)?
        } else {
            self.predicate()?
        };
        Some(v != negate)
    }

    /// `name(arg, …)`: the ones the lint knows, else true.
    fn predicate(&mut self) -> Option<bool> {
        let open = self.rest.find('(')?;
        let close = open + self.rest[open..].find(')')?;
        let name = self.rest[..open].trim();
        let args: Vec<&str> = self.rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .collect();
        self.rest = &self.rest[close + 1..];
        Some(match (name, args.as_slice()) {
            ("defined", [var]) => (self.env)(var).is_some(),
            ("streq", [a, b]) => a == b,
            ("strneq", [a, b]) => a != b,
            ("strstr", [a, b]) => a.contains(b),
            _ => {
                self.guessed = true;
                true
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "SET").then(|| "1".into())
    }

    #[test]
    fn conditions_evaluate_like_haproxy() {
        for (text, want) in [
            ("", false),
            ("0", false),
            ("1", true),
            ("0x10", true),
            ("defined(SET)", true),
            ("defined(UNSET)", false),
            ("!defined(SET)", false),
            ("! ! defined(SET)", true),
            ("streq(a,a)", true),
            ("streq(a,b)", false),
            ("strneq(a,b)", true),
            ("strstr(abc,b)", true),
            ("defined(UNSET) || 1", true),
            ("1 && 0", false),
            ("0 || 1 && 0", false),
            ("(0 || 1) && 1", true),
            ("version_atleast(2.6)", true),
            ("feature(OPENSSL)", true),
            ("!feature(OPENSSL)", false),
            ("garbage here", true),
        ] {
            assert_eq!(eval(text.as_bytes(), &env), Ok(want), "{text:?}");
        }
    }

    fn run(lines: &[&str]) -> Vec<Line> {
        let mut c = Conditions::default();
        lines
            .iter()
            .map(|l| {
                let words: Vec<&[u8]> = l.split(' ').map(str::as_bytes).collect();
                c.line(&words, &env)
            })
            .collect()
    }

    const ON: Line = Line::Config { active: true };
    const OFF: Line = Line::Config { active: false };
    const DIRECTIVE: Line = Line::Directive(None);

    #[test]
    fn one_branch_of_a_block_is_taken() {
        let got = run(&[
            "a", ".if 0", "b", ".elif 1", "c", ".elif 1", "d", ".else", "e", ".endif", "f",
        ]);
        let want = [
            ON, DIRECTIVE, OFF, DIRECTIVE, ON, DIRECTIVE, OFF, DIRECTIVE, OFF, DIRECTIVE, ON,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn else_is_taken_when_nothing_was() {
        let got = run(&[".if defined(UNSET)", "a", ".else", "b", ".endif"]);
        assert_eq!(got, [DIRECTIVE, OFF, DIRECTIVE, ON, DIRECTIVE]);
    }

    #[test]
    fn blocks_inside_a_dropped_branch_are_dropped() {
        let got = run(&[
            ".if 0", ".if 1", "a", ".else", "b", ".endif", "c", ".endif", "d",
        ]);
        let want = [
            DIRECTIVE, DIRECTIVE, OFF, DIRECTIVE, OFF, DIRECTIVE, OFF, DIRECTIVE, ON,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn lone_directives_are_reported_and_ignored() {
        let got = run(&[".endif", ".else", ".elif 1", "a"]);
        let want = [
            Line::Directive(Some("lone '.endif'")),
            Line::Directive(Some("lone '.else'")),
            Line::Directive(Some("lone '.elif'")),
            ON,
        ];
        assert_eq!(got, want);
    }

    fn parens(n: usize) -> String {
        format!("{}1{}", "(".repeat(n), ")".repeat(n))
    }

    #[test]
    fn conditions_deeper_than_haproxys_parser_are_refused_without_recursing_further() {
        // haproxy 2.6.12 takes 340 parentheses and refuses 341.
        assert_eq!(eval(parens(340).as_bytes(), &env), Ok(true));
        assert_eq!(eval(parens(341).as_bytes(), &env), Err(TOO_DEEP));
        assert_eq!(eval(parens(50_000).as_bytes(), &env), Err(TOO_DEEP));
        let chain = vec!["0"; 2000].join(" || ");
        assert_eq!(eval(chain.as_bytes(), &env), Err(TOO_DEEP));
        let chain = vec!["1"; 2000].join(" && ");
        assert_eq!(eval(chain.as_bytes(), &env), Err(TOO_DEEP));
        let chain = vec!["0"; 300].join(" || ") + " || 1";
        assert_eq!(eval(chain.as_bytes(), &env), Ok(true));
    }

    #[test]
    fn a_too_deep_if_or_elif_aborts() {
        let deep = format!(".if {}", parens(50_000));
        assert_eq!(run(&[&deep]), [Line::Abort(TOO_DEEP)]);
        let deep = format!(".elif {}", parens(50_000));
        assert_eq!(run(&[".if 0", &deep])[1], Line::Abort(TOO_DEEP));
        let dropped = run(&[".if 0", ".if 0", &deep, ".endif", ".endif"]);
        assert_eq!(dropped, [DIRECTIVE; 5], "a dropped branch is not evaluated");
    }

    #[test]
    fn the_hundredth_nested_if_aborts() {
        let ifs = vec![".if 1"; MAX_NESTED_IFS];
        let got = run(&ifs);
        assert_eq!(got[MAX_NESTED_IFS - 2], DIRECTIVE);
        assert_eq!(got[MAX_NESTED_IFS - 1], Line::Abort(TOO_MANY_IFS));
    }

    #[test]
    fn a_branch_resting_on_what_the_lint_cannot_know_is_marked_guessed() {
        let mut c = Conditions::default();
        let guessed_at = |line: &str, c: &mut Conditions| {
            let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            c.line(&words, &env);
            c.guessed()
        };
        assert!(!guessed_at("server a", &mut c));
        assert!(!guessed_at(".if defined(SET)", &mut c));
        assert!(
            guessed_at(".if feature(OPENSSL)", &mut c),
            "taken on a guess"
        );
        assert!(guessed_at(".else", &mut c), "not taken on a guess");
        assert!(!guessed_at(".endif", &mut c));
        assert!(!guessed_at(".if defined(UNSET)", &mut c));
        assert!(guessed_at(".elif version_atleast(2.6)", &mut c));
        assert!(!guessed_at(".endif", &mut c));
        // A branch decided before the unknowable one is not guessed.
        assert!(!guessed_at(".if defined(SET)", &mut c));
        assert!(!guessed_at(".elif feature(X)", &mut c));
        assert!(!guessed_at(".endif", &mut c));
        assert!(guessed_at(".if streq(a,a) && enabled(X)", &mut c));
    }
}
