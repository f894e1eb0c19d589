//! The crate's one decimal parser: Go's `strconv.ParseUint(s, 10, 64)`,
//! which is also HTTP's `1*DIGIT` (RFC 9110 `Content-Length`), so flags,
//! ports, the dev KV's parameters and the HTTP framing all read numbers
//! the same way.
//!
//! In: bytes. Out: the number, or why not.
//!
//! Always holds:
//! - pure;
//! - only ASCII digits are accepted (no sign, space or `_`);
//! - no overflow, ever.

/// Why [`parse_uint`] refused its input; displayed as Go words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UintError {
    /// Empty, or a byte that is not an ASCII digit (a sign, a space, `_`).
    Syntax,
    /// Only digits, but more than `u64::MAX`.
    Range,
}

impl std::fmt::Display for UintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UintError::Syntax => "invalid syntax",
            UintError::Range => "value out of range",
        })
    }
}

/// Go's `strconv.ParseUint(s, 10, 64)`: one or more ASCII digits, nothing
/// else (no sign, no space), within `u64`. The same grammar as HTTP's
/// `1*DIGIT` (RFC 9110 `Content-Length`), so the HTTP parser uses it too:
/// the one decimal parser of the crate.
pub fn parse_uint(digits: &[u8]) -> Result<u64, UintError> {
    if digits.is_empty() {
        return Err(UintError::Syntax);
    }
    let mut n: Option<u64> = Some(0);
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(UintError::Syntax);
        }
        // Keep scanning after an overflow: a later non-digit is a syntax error.
        n = n
            .and_then(|n| n.checked_mul(10))
            .and_then(|n| n.checked_add(u64::from(b - b'0')));
    }
    n.ok_or(UintError::Range)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uints() {
        let p = |s: &str| parse_uint(s.as_bytes());
        assert_eq!(p("0"), Ok(0));
        assert_eq!(p("007"), Ok(7));
        assert_eq!(p("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(p("18446744073709551616"), Err(UintError::Range));
        assert_eq!(p("99999999999999999999999"), Err(UintError::Range));
        assert_eq!(p("99999999999999999999999x"), Err(UintError::Syntax));
        for bad in ["", "+1", "-1", " 1", "1 ", "1_000", "1e3", "٣"] {
            assert_eq!(p(bad), Err(UintError::Syntax), "{bad:?}");
        }
        assert_eq!(UintError::Syntax.to_string(), "invalid syntax");
        assert_eq!(UintError::Range.to_string(), "value out of range");
    }
}
