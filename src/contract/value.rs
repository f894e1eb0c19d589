//! A KV value, pure: the bytes under a state key -> [`Desired`] -> the
//! reply line haproxy reads.
//!
//! - In: raw KV values (already base64-decoded). Out: a typed desired
//!   state or why it is invalid ([`InvalidValue`]), and its reply line.
//! - Every reply names an admin state *and* a weight, ends in `\n`, and is
//!   one of a fixed set of `'static` strings: the hot path never formats
//!   or allocates.
//! - [`Desired`]'s `Display` is the canonical KV spelling a writer puts.

use crate::labels::label_enum;

/// The admin state haproxy is told to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admin {
    Ready,
    Drain,
    Maint,
}

/// A valid KV value, decoded once per consul update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Desired {
    admin: Admin,
    /// Weight as a percentage of the server line's configured weight, 0..=256.
    weight_pct: u16,
}

label_enum! {
    /// Why a KV value is invalid (metric label `reason`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum InvalidValue {
        /// Not a word of the grammar: empty, control or non-UTF-8 bytes, several
        /// words, a sign, a fraction, `maxconn:N`, anything unknown.
        Syntax => "syntax",
        /// `up`, `down`, `stopped`, `fail`: health belongs to haproxy's checks.
        HealthWord => "health_word",
        /// `N%` with N past 256.
        OutOfRange => "out_of_range",
    }
}

impl Desired {
    /// The absent-key state: `ready 100%`.
    pub const READY: Desired = Desired {
        admin: Admin::Ready,
        weight_pct: 100,
    };

    pub fn admin(self) -> Admin {
        self.admin
    }

    pub fn weight_pct(self) -> u16 {
        self.weight_pct
    }

    /// `drain 100%`.
    pub const DRAIN: Desired = Desired {
        admin: Admin::Drain,
        weight_pct: 100,
    };

    /// `maint 100%`.
    pub const MAINT: Desired = Desired {
        admin: Admin::Maint,
        weight_pct: 100,
    };

    /// The highest weight percentage haproxy accepts from an agent.
    pub const MAX_WEIGHT_PCT: u16 = 256;

    /// `ready N%`, for `N <= 256`.
    pub fn ready_pct(weight_pct: u16) -> Option<Desired> {
        (weight_pct <= Self::MAX_WEIGHT_PCT).then_some(Desired {
            admin: Admin::Ready,
            weight_pct,
        })
    }

    /// The canonical reply line, `\n` included: `ready N%\n`, `drain 100%\n`,
    /// `maint 100%\n`. A `'static` slice from a table built once.
    pub fn reply(self) -> &'static [u8] {
        self.line(&REPLIES)
    }

    /// The reply, with the agent's own health vote when `up` (`-reply-up`):
    /// `ready N% up\n`, `drain 100% up\n`, `maint 100% up\n`. haproxy 3.3
    /// and 3.4 (before upstream 7aec1e6d9) start a server without a
    /// `default-server` line with agent health 0, and only ` up` brings it
    /// back; a failing health check still takes the server DOWN.
    pub fn reply_voting(self, up: bool) -> &'static [u8] {
        self.line(if up { &REPLIES_UP } else { &REPLIES })
    }

    fn line(self, table: &'static ReplyTable) -> &'static [u8] {
        let row = match self.admin {
            // Constructors keep `weight_pct <= 256`; `min` keeps the index in
            // bounds even so.
            Admin::Ready => usize::from(self.weight_pct.min(Self::MAX_WEIGHT_PCT)),
            Admin::Drain => DRAIN_ROW,
            Admin::Maint => MAINT_ROW,
        };
        let len = usize::from(table.lens[row]);
        &table.lines[row][..len]
    }
}

/// Rows of [`REPLIES`]: `ready 0%` ..= `ready 256%`, then drain, then maint.
const DRAIN_ROW: usize = Desired::MAX_WEIGHT_PCT as usize + 1;
const MAINT_ROW: usize = DRAIN_ROW + 1;
const ROWS: usize = MAINT_ROW + 1;
/// The longest reply, `ready 256% up\n`.
const LINE_MAX: usize = 14;

/// Every reply line the agent can write, built at compile time so that
/// [`Desired::reply`] is an index, never a format or an allocation.
struct ReplyTable {
    lines: [[u8; LINE_MAX]; ROWS],
    lens: [u8; ROWS],
}

static REPLIES: ReplyTable = ReplyTable::build(b"\n");
static REPLIES_UP: ReplyTable = ReplyTable::build(b" up\n");

impl ReplyTable {
    /// Every line, each ending in `end`.
    const fn build(end: &[u8]) -> ReplyTable {
        let mut table = ReplyTable {
            lines: [[0; LINE_MAX]; ROWS],
            lens: [0; ROWS],
        };
        let mut weight = 0;
        while weight < DRAIN_ROW {
            let line = &mut table.lines[weight];
            let mut len = put(line, 0, b"ready ");
            // Digits without leading zeros: `ready 0%`, `ready 50%`, `ready 256%`.
            if weight >= 100 {
                line[len] = b'0' + (weight / 100) as u8;
                len += 1;
            }
            if weight >= 10 {
                line[len] = b'0' + (weight / 10 % 10) as u8;
                len += 1;
            }
            line[len] = b'0' + (weight % 10) as u8;
            len += 1;
            len = put(line, len, b"%");
            len = put(line, len, end);
            table.lens[weight] = len as u8;
            weight += 1;
        }
        let drain = &mut table.lines[DRAIN_ROW];
        let len = put(drain, 0, b"drain 100%");
        table.lens[DRAIN_ROW] = put(drain, len, end) as u8;
        let maint = &mut table.lines[MAINT_ROW];
        let len = put(maint, 0, b"maint 100%");
        table.lens[MAINT_ROW] = put(maint, len, end) as u8;
        table
    }
}

/// Copies `bytes` into `line` at `at`; returns the new length.
const fn put(line: &mut [u8; LINE_MAX], at: usize, bytes: &[u8]) -> usize {
    let mut i = 0;
    while i < bytes.len() {
        line[at + i] = bytes[i];
        i += 1;
    }
    at + bytes.len()
}

impl std::fmt::Display for Desired {
    /// The canonical KV spelling: `ready`, `drain`, `maint` or `N%`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.admin {
            Admin::Ready if self.weight_pct == 100 => f.write_str("ready"),
            Admin::Ready => write!(f, "{}%", self.weight_pct),
            Admin::Drain => f.write_str("drain"),
            Admin::Maint => f.write_str("maint"),
        }
    }
}

/// Parses a KV value as the KV contract says (trim ASCII whitespace, case-insensitive
/// words, `N%` with 1-3 digits and N <= 256).
pub fn parse_value(raw: &[u8]) -> Result<Desired, InvalidValue> {
    let value = raw.trim_ascii();
    for (word, desired) in [
        ("ready", Desired::READY),
        ("drain", Desired::DRAIN),
        ("maint", Desired::MAINT),
    ] {
        if value.eq_ignore_ascii_case(word.as_bytes()) {
            return Ok(desired);
        }
    }
    if HEALTH_WORDS
        .iter()
        .any(|word| value.eq_ignore_ascii_case(word.as_bytes()))
    {
        return Err(InvalidValue::HealthWord);
    }
    parse_percent(value)
}

/// Words of the agent-check protocol that set health, not admin state.
const HEALTH_WORDS: [&str; 4] = ["up", "down", "stopped", "fail"];

/// `N%`: ASCII digits then `%`. Up to 3 digits is a weight (in range or not);
/// more digits can only be past 256.
fn parse_percent(value: &[u8]) -> Result<Desired, InvalidValue> {
    let Some((b'%', digits)) = value.split_last() else {
        return Err(InvalidValue::Syntax);
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(InvalidValue::Syntax);
    }
    if digits.len() > 3 {
        return Err(InvalidValue::OutOfRange);
    }
    let weight = digits
        .iter()
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    Desired::ready_pct(weight).ok_or(InvalidValue::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(pct: u16) -> Desired {
        Desired::ready_pct(pct).unwrap()
    }

    #[track_caller]
    fn valid(raw: &[u8], want: Desired) {
        assert_eq!(
            parse_value(raw),
            Ok(want),
            "{:?}",
            String::from_utf8_lossy(raw)
        );
    }

    #[track_caller]
    fn invalid(raw: &[u8], want: InvalidValue) {
        assert_eq!(
            parse_value(raw),
            Err(want),
            "{:?}",
            String::from_utf8_lossy(raw)
        );
    }

    #[test]
    fn words() {
        valid(b"ready", Desired::READY);
        valid(b"drain", Desired::DRAIN);
        valid(b"maint", Desired::MAINT);
        assert_eq!(
            (Desired::DRAIN.admin(), Desired::DRAIN.weight_pct()),
            (Admin::Drain, 100)
        );
        assert_eq!(
            (Desired::MAINT.admin(), Desired::MAINT.weight_pct()),
            (Admin::Maint, 100)
        );
        assert_eq!(
            (Desired::READY.admin(), Desired::READY.weight_pct()),
            (Admin::Ready, 100)
        );
    }

    #[test]
    fn words_are_case_insensitive() {
        for raw in [&b"READY"[..], b"Ready", b"rEaDy"] {
            valid(raw, Desired::READY);
        }
        valid(b"DRAIN", Desired::DRAIN);
        valid(b"Drain", Desired::DRAIN);
        valid(b"MAINT", Desired::MAINT);
        valid(b"mAiNt", Desired::MAINT);
    }

    #[test]
    fn surrounding_ascii_whitespace_is_trimmed() {
        valid(b"drain\n", Desired::DRAIN);
        valid(b"drain\r\n", Desired::DRAIN);
        valid(b"  maint \t", Desired::MAINT);
        valid(b"\n\tready\x0c", Desired::READY);
        valid(b" 50%\n", ready(50));
    }

    #[test]
    fn percentages() {
        valid(b"0%", ready(0));
        valid(b"1%", ready(1));
        valid(b"50%", ready(50));
        valid(b"050%", ready(50));
        valid(b"007%", ready(7));
        valid(b"000%", ready(0));
        valid(b"100%", Desired::READY);
        valid(b"255%", ready(255));
        valid(b"256%", ready(256));
        assert_eq!(ready(256).admin(), Admin::Ready);
        assert_eq!(ready(256).weight_pct(), 256);
    }

    #[test]
    fn percentages_past_256_are_out_of_range() {
        invalid(b"257%", InvalidValue::OutOfRange);
        invalid(b"999%", InvalidValue::OutOfRange);
        invalid(b"1000%", InvalidValue::OutOfRange);
        invalid(b"0050%", InvalidValue::OutOfRange);
        invalid(b"99999999999999999999999%", InvalidValue::OutOfRange);
    }

    #[test]
    fn health_words_are_their_own_reason() {
        for raw in [
            &b"up"[..],
            b"down",
            b"stopped",
            b"fail",
            b"UP",
            b"Down",
            b"STOPPED",
            b" fail\n",
        ] {
            invalid(raw, InvalidValue::HealthWord);
        }
    }

    #[test]
    fn everything_else_is_syntax() {
        let cases: &[&[u8]] = &[
            b"",
            b"   ",
            b"\n",
            b"%",
            b"50",
            b"+50%",
            b"-50%",
            b"5.5%",
            b"50 %",
            b"50%%",
            b"%50",
            b"maxconn:3",
            b"ready 50%",
            b"drain maint",
            b"ready\0",
            b"re\x01ady",
            b"ready\x7f",
            b"\xffready",
            b"ready\xc3",
            b"\xc3\xa9",
            b"readyy",
            b"rdy",
            b"ready!",
            b"up 50%",
            b"\x0bready",
            b"\xef\xbc\x95\xef\xbc\x90%", // fullwidth digits
        ];
        for raw in cases {
            invalid(raw, InvalidValue::Syntax);
        }
    }

    #[test]
    fn labels() {
        assert_eq!(InvalidValue::Syntax.label(), "syntax");
        assert_eq!(InvalidValue::HealthWord.label(), "health_word");
        assert_eq!(InvalidValue::OutOfRange.label(), "out_of_range");
    }

    #[test]
    fn replies_carry_admin_state_and_weight() {
        assert_eq!(Desired::READY.reply(), b"ready 100%\n");
        assert_eq!(Desired::DRAIN.reply(), b"drain 100%\n");
        assert_eq!(Desired::MAINT.reply(), b"maint 100%\n");
        assert_eq!(ready(0).reply(), b"ready 0%\n");
        assert_eq!(ready(7).reply(), b"ready 7%\n");
        assert_eq!(ready(50).reply(), b"ready 50%\n");
        assert_eq!(ready(256).reply(), b"ready 256%\n");
        for pct in 0..=256 {
            assert_eq!(ready(pct).reply(), format!("ready {pct}%\n").as_bytes());
        }
    }

    #[test]
    fn reply_up_appends_the_vote_to_every_line() {
        for desired in (0..=256).map(ready).chain([Desired::DRAIN, Desired::MAINT]) {
            let plain = desired.reply();
            assert_eq!(desired.reply_voting(false), plain);
            let up = [&plain[..plain.len() - 1], b" up\n"].concat();
            assert_eq!(desired.reply_voting(true), &up[..]);
        }
        assert_eq!(Desired::DRAIN.reply_voting(true), b"drain 100% up\n");
        assert_eq!(ready(256).reply_voting(true), b"ready 256% up\n");
    }

    #[test]
    fn reply_is_static_and_shared() {
        assert!(std::ptr::eq(ready(42).reply(), ready(42).reply()));
    }

    #[test]
    fn display_is_the_canonical_kv_spelling_and_parses_back() {
        assert_eq!(Desired::READY.to_string(), "ready");
        assert_eq!(ready(50).to_string(), "50%");
        assert_eq!(ready(0).to_string(), "0%");
        assert_eq!(Desired::DRAIN.to_string(), "drain");
        assert_eq!(Desired::MAINT.to_string(), "maint");
        assert_eq!(parse_value(b"050%").unwrap().to_string(), "50%");
        for desired in (0..=256).map(ready).chain([Desired::DRAIN, Desired::MAINT]) {
            assert_eq!(parse_value(desired.to_string().as_bytes()), Ok(desired));
        }
    }

    #[test]
    fn ready_pct_bounds() {
        assert!(Desired::ready_pct(256).is_some());
        assert_eq!(Desired::ready_pct(257), None);
    }
}
