//! `-listen-allow`: the source addresses whose agent connections are
//! served (pure).
//!
//! In: the flag's text, `CIDR[,CIDR...]` (an address alone is a /32 or
//! /128), then each accepted connection's source address. Out: whether to
//! serve it.
//!
//! Always holds:
//! - an empty list allows everyone (the original agent's behaviour);
//! - an IPv4 source seen through a dual-stack listener (`::ffff:a.b.c.d`)
//!   matches the IPv4 ranges;
//! - a malformed entry is an error naming it, never a silently wider or
//!   narrower list.

use std::net::IpAddr;

/// One range: the network's address (host bits cleared) and its prefix
/// length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    net: IpAddr,
    len: u8,
}

/// The allowed source ranges; empty: everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    ranges: Vec<Cidr>,
}

impl Allow {
    /// Parses `CIDR[,CIDR...]` (spaces around commas allowed; empty:
    /// everyone). The error names the entry and what is wrong with it.
    pub fn parse(text: &str) -> Result<Allow, String> {
        let mut ranges = Vec::new();
        if text.trim().is_empty() {
            return Ok(Allow { ranges });
        }
        for entry in text.split(',').map(str::trim) {
            ranges.push(cidr(entry).map_err(|why| format!("{entry:?}: {why}"))?);
        }
        Ok(Allow { ranges })
    }

    /// Whether connections from `source` are served.
    pub fn permits(&self, source: IpAddr) -> bool {
        if self.ranges.is_empty() {
            return true;
        }
        let source = source.to_canonical();
        self.ranges.iter().any(|r| r.net == masked(source, r.len))
    }

    /// Allows everyone (the default).
    pub fn is_everyone(&self) -> bool {
        self.ranges.is_empty()
    }
}

fn cidr(entry: &str) -> Result<Cidr, &'static str> {
    if entry.is_empty() {
        return Err("empty entry (a stray comma?)");
    }
    let (addr, len) = match entry.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (entry, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| "not an IP address or CIDR (like 10.0.0.0/8 or fd00::/8)")?;
    let addr = addr.to_canonical();
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) if !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit()) => {
            l.parse::<u8>().map_err(|_| "prefix length too long")?
        }
        Some(_) => return Err("prefix length is not a number"),
    };
    if len > max {
        return Err("prefix length longer than the address");
    }
    Ok(Cidr {
        net: masked(addr, len),
        len,
    })
}

/// `addr` with its bits after the first `len` cleared (an address of the
/// other family than the range's never matches: its mask differs in width).
fn masked(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            IpAddr::V4((bits & mask).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            IpAddr::V6((bits & mask).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn empty_allows_everyone() {
        let a = Allow::parse("").unwrap();
        assert!(a.is_everyone());
        assert!(a.permits(ip("203.0.113.9")) && a.permits(ip("::1")));
        assert!(Allow::parse("  ").unwrap().is_everyone());
    }

    #[test]
    fn ranges_match_their_sources_only() {
        let a = Allow::parse("10.1.0.0/16, 192.0.2.7,fd00::/8").unwrap();
        assert!(a.permits(ip("10.1.255.3")));
        assert!(!a.permits(ip("10.2.0.1")));
        assert!(a.permits(ip("192.0.2.7")));
        assert!(!a.permits(ip("192.0.2.8")));
        assert!(a.permits(ip("fd12::1")));
        assert!(!a.permits(ip("fe80::1")));
        // Seen through a dual-stack listener.
        assert!(a.permits(ip("::ffff:10.1.2.3")));
        assert!(!a.permits(ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn host_bits_in_the_range_are_ignored_and_zero_length_is_everything() {
        let a = Allow::parse("127.0.0.1/8").unwrap();
        assert!(a.permits(ip("127.9.9.9")));
        let all4 = Allow::parse("0.0.0.0/0").unwrap();
        assert!(all4.permits(ip("198.51.100.1")) && !all4.permits(ip("2001:db8::1")));
        assert!(Allow::parse("::/0").unwrap().permits(ip("2001:db8::1")));
    }

    #[test]
    fn a_malformed_entry_is_named() {
        for (text, bad, why) in [
            ("10.0.0.0/33", "10.0.0.0/33", "longer"),
            ("10.0.0.0/8,", "", "empty"),
            ("10.0.0.0/x", "10.0.0.0/x", "not a number"),
            ("10.0.0.0/", "10.0.0.0/", "not a number"),
            ("10.0.0.0/+8", "10.0.0.0/+8", "not a number"),
            ("::1/129", "::1/129", "longer"),
            ("haproxy1", "haproxy1", "not an IP"),
            ("10.0.0.0/0008", "10.0.0.0/0008", "not a number"),
        ] {
            let e = Allow::parse(text).unwrap_err();
            assert!(
                e.starts_with(&format!("{bad:?}")) && e.contains(why),
                "{text}: {e}"
            );
        }
    }
}
