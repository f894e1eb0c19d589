//! An expiry in a state key's consul `Flags`, pure: the writers' `-for`
//! and `-until` put it there (Unix seconds), the daemon reads it back
//! (its tracking is `state::expiry`'s).
//!
//! - Flags is consul's opaque integer for the application (`api/kv.go`
//!   `KVPair.Flags`); consul's own lock and semaphore helpers set magic
//!   values there (`api/lock.go` `LockFlagValue` 0x2ddccbc058a50c18,
//!   `api/semaphore.go` `SemaphoreFlagValue` 0xe0f69a2baa414de0).
//! - So only a value from [`EARLIEST`] to before [`LATEST`] is an expiry
//!   ([`of_flags`]); a writer refuses one outside it.
//! - [`parse_until`]: an RFC 3339 time (`-until`) to the expiry written.

/// 2020-01-01T00:00:00Z: Flags below are not an expiry.
pub const EARLIEST: u64 = 1_577_836_800;
/// 2100-01-01T00:00:00Z: Flags from here on are not an expiry.
pub const LATEST: u64 = 4_102_444_800;

/// The expiry `flags` carry (Unix seconds), 0 for none.
pub fn of_flags(flags: u64) -> u32 {
    match (EARLIEST..LATEST).contains(&flags) {
        // LATEST < u32::MAX.
        true => flags as u32,
        false => 0,
    }
}

/// `-until TIME`: RFC 3339 (`2026-12-04T23:28:18Z`, or with an offset,
/// `+02:00`) to Unix seconds, within the window the daemon reads as an
/// expiry (2020-01-01 to 2100-01-01).
pub fn parse_until(text: &str) -> Result<u32, String> {
    let format = &time::format_description::well_known::Rfc3339;
    let at = time::OffsetDateTime::parse(text, format).map_err(|e| {
        format!("-until {text:?} is not an RFC 3339 time (2026-12-04T23:28:18Z, or with an offset: +02:00): {e}")
    })?;
    let secs = u64::try_from(at.unix_timestamp()).unwrap_or(0);
    match of_flags(secs) {
        0 => Err(format!(
            "-until {text:?} is outside 2020-01-01..2100-01-01, which the agent reads as an expiry"
        )),
        e => Ok(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// consul's lock and semaphore keys carry magic Flags (`api/lock.go`
    /// `LockFlagValue`, `api/semaphore.go` `SemaphoreFlagValue`): neither
    /// is an expiry, nor 0, nor anything outside 2020..2100.
    #[test]
    fn only_2020_to_2100_is_an_expiry() {
        assert_eq!(of_flags(0), 0);
        assert_eq!(of_flags(0x2ddc_cbc0_58a5_0c18), 0, "LockFlagValue");
        assert_eq!(of_flags(0xe0f6_9a2b_aa41_4de0), 0, "SemaphoreFlagValue");
        assert_eq!(of_flags(EARLIEST - 1), 0);
        assert_eq!(of_flags(EARLIEST), EARLIEST as u32);
        assert_eq!(of_flags(LATEST - 1), (LATEST - 1) as u32);
        assert_eq!(of_flags(LATEST), 0);
        assert_eq!(of_flags(42), 0);
    }

    #[test]
    fn until_is_rfc3339_with_an_offset_inside_the_expiry_window() {
        assert_eq!(parse_until("2026-12-04T23:28:18Z"), Ok(1_796_426_898));
        assert_eq!(parse_until("2026-12-05T01:28:18+02:00"), Ok(1_796_426_898));
        assert_eq!(parse_until("2026-12-04T23:28:18.5Z"), Ok(1_796_426_898));
        for bad in [
            "2026-12-04",
            "2026-12-04 23:28:18",
            "2h",
            "",
            "2126-01-01T00:00:00Z",
        ] {
            assert!(parse_until(bad).is_err(), "{bad:?}");
        }
        assert!(parse_until("2019-12-31T23:59:59Z")
            .unwrap_err()
            .contains("outside 2020-01-01..2100-01-01"));
    }
}
