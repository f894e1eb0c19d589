//! `contract::parse_value` against a reference written straight from the
//! KV contract (README), reason included, plus the reply and display round trip.
//!
//! Input: the raw (already base64-decoded) KV value.
#![no_main]

use gitlab_haproxy_agent::contract::{parse_value, Admin, Desired, InvalidValue};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq, Eq)]
enum Want {
    Ready(u16),
    Drain,
    Maint,
    Invalid(InvalidValue),
}

/// ASCII whitespace as WHATWG Infra (and Rust's `u8::is_ascii_whitespace`)
/// define it: TAB, LF, FF, CR, SPACE. Vertical tab is a control byte, not
/// whitespace, so `\x0bready` is invalid.
fn is_ascii_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' ')
}

fn lower(value: &[u8]) -> Vec<u8> {
    value
        .iter()
        .map(|&b| if b.is_ascii_uppercase() { b + 32 } else { b })
        .collect()
}

/// value grammar. Never calls the code under test.
fn reference(raw: &[u8]) -> Want {
    let mut value = raw;
    while let [b, rest @ ..] = value {
        if !is_ascii_space(*b) {
            break;
        }
        value = rest;
    }
    while let [rest @ .., b] = value {
        if !is_ascii_space(*b) {
            break;
        }
        value = rest;
    }
    match lower(value).as_slice() {
        b"ready" => return Want::Ready(100),
        b"drain" => return Want::Drain,
        b"maint" => return Want::Maint,
        b"up" | b"down" | b"stopped" | b"fail" => return Want::Invalid(InvalidValue::HealthWord),
        _ => {}
    }
    let [digits @ .., b'%'] = value else {
        return Want::Invalid(InvalidValue::Syntax);
    };
    if digits.is_empty() || digits.iter().any(|b| !b.is_ascii_digit()) {
        return Want::Invalid(InvalidValue::Syntax);
    }
    if digits.len() > 3 {
        return Want::Invalid(InvalidValue::OutOfRange);
    }
    let mut n: u16 = 0;
    for d in digits {
        n = n * 10 + u16::from(d - b'0');
    }
    if n > 256 {
        Want::Invalid(InvalidValue::OutOfRange)
    } else {
        Want::Ready(n)
    }
}

fn observed(r: Result<Desired, InvalidValue>) -> Want {
    match r {
        Ok(d) => match d.admin() {
            Admin::Ready => Want::Ready(d.weight_pct()),
            Admin::Drain => {
                assert_eq!(d.weight_pct(), 100);
                Want::Drain
            }
            Admin::Maint => {
                assert_eq!(d.weight_pct(), 100);
                Want::Maint
            }
        },
        Err(e) => Want::Invalid(e),
    }
}

fuzz_target!(|data: &[u8]| {
    let got = parse_value(data);
    let want = reference(data);
    assert_eq!(observed(got), want, "{:?}", String::from_utf8_lossy(data));

    if let Ok(desired) = got {
        let reply = match want {
            Want::Ready(n) => format!("ready {n}%\n"),
            Want::Drain => "drain 100%\n".to_owned(),
            Want::Maint => "maint 100%\n".to_owned(),
            Want::Invalid(_) => unreachable!(),
        };
        assert_eq!(desired.reply(), reply.as_bytes());
        // The canonical spelling parses back to the same state.
        assert_eq!(parse_value(desired.to_string().as_bytes()), Ok(desired));
    }
});
