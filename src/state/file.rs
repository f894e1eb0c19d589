//! The state file's format: what the agent last read from consul, kept
//! so that a restart while consul is unreachable still answers.
//!
//! In: a [`Snapshot`], its prefix and the time ([`encode`]); a file's
//! bytes, the prefix and the time ([`decode`]). Out: the bytes to write;
//! the snapshot read back, or why the file cannot be used.
//!
//! Always holds:
//! - pure;
//! - a file is used only if it is whole (a checksum line covers every byte
//!   before it, so a file cut at any byte, or with any byte changed, is
//!   refused), of this format and version, for this prefix, and younger
//!   than the maximum age;
//! - building from what it holds gives the snapshot that was written (every
//!   key with its raw value and ModifyIndex, valid or not).
//!
//! Layout: one line of JSON, then `fnv1a64 <16 hex digits>` and a newline.
//!
//! ```text
//! {"format":"gitlab-haproxy-agent-state","version":1,"prefix":"…","index":42,
//!  "written_unix_ms":1764763200000,"keys":[{"key":"…","value":"<base64>","modify_index":7},…]}
//! fnv1a64 0123456789abcdef
//! ```

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::Snapshot;
use crate::kv::KvPair;

/// The `format` field: a file of anything else is not ours.
const FORMAT: &str = "gitlab-haproxy-agent-state";
/// The one version this build reads and writes.
const VERSION: u32 = 1;
const CHECKSUM: &str = "fnv1a64 ";

#[derive(Serialize, Deserialize)]
struct Document {
    format: String,
    version: u32,
    prefix: String,
    index: u64,
    written_unix_ms: u64,
    keys: Vec<Key>,
}

#[derive(Serialize, Deserialize)]
struct Key {
    key: String,
    /// Base64, as consul sends it: values may be any bytes.
    value: String,
    modify_index: u64,
    /// The expiry consul's `Flags` carried (absent: none; a file of an
    /// earlier build has none).
    #[serde(default, skip_serializing_if = "is_zero")]
    flags: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A state file read back.
#[derive(Debug)]
pub struct Loaded {
    pub snapshot: Snapshot,
    /// When the agent wrote it.
    pub written: SystemTime,
    /// How old it is (0 if written "in the future": a clock that moved).
    pub age: Duration,
}

/// Why a state file was not used (logged as one line, then ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Cut short, or no checksum line: a write that never completed.
    Truncated,
    /// The checksum does not match, or the checksummed text is not JSON.
    Corrupt,
    /// Not a state file of this agent.
    Foreign,
    Version(u32),
    OtherPrefix(String),
    TooOld(Duration),
    /// Written further ahead of our clock than [`CLOCK_ALLOWANCE`]: it
    /// would never age out (a file forged, or a clock far off).
    Future(Duration),
}

/// How far ahead of our clock a file's written-at may be (clocks of
/// hosts sharing a volume, a clock stepped back a little).
pub const CLOCK_ALLOWANCE: Duration = Duration::from_secs(300);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Truncated => {
                f.write_str("truncated, or not a state file (no complete checksum line)")
            }
            Refused::Corrupt => f.write_str("corrupt (checksum mismatch or not JSON)"),
            Refused::Foreign => f.write_str("not a gitlab-haproxy-agent state file"),
            Refused::Version(v) => write!(f, "format version {v}, this build reads {VERSION}"),
            Refused::OtherPrefix(p) => write!(f, "written for another -kv-prefix ({p:?})"),
            Refused::TooOld(age) => write!(f, "older than -state-max-age ({}s old)", age.as_secs()),
            Refused::Future(ahead) => write!(
                f,
                "written {}s in the future (more than {}s ahead of this clock: it would never age out)",
                ahead.as_secs(),
                CLOCK_ALLOWANCE.as_secs()
            ),
        }
    }
}

/// The file's bytes for `snapshot` (read under `prefix`), written at `now`.
pub fn encode(snapshot: &Snapshot, prefix: &str, now: SystemTime) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let keys = snapshot
        .raw_pairs(prefix)
        .map(|(key, value, modify_index, flags)| Key {
            key,
            value: b64.encode(value),
            modify_index,
            flags,
        })
        .collect();
    let doc = Document {
        format: FORMAT.to_owned(),
        version: VERSION,
        prefix: prefix.to_owned(),
        index: snapshot.index(),
        written_unix_ms: unix_ms(now),
        keys,
    };
    let mut out = serde_json::to_vec(&doc).unwrap_or_default();
    let sum = fnv1a64(&out);
    out.extend_from_slice(format!("\n{CHECKSUM}{sum:016x}\n").as_bytes());
    out
}

/// The snapshot a file holds, if it may be answered from: whole, ours,
/// for `prefix`, at most `max_age` old at `now`.
pub fn decode(
    bytes: &[u8],
    prefix: &str,
    now: SystemTime,
    max_age: Duration,
) -> Result<Loaded, Refused> {
    let doc = checked(bytes)?;
    let doc: Document = serde_json::from_slice(doc).map_err(|_| Refused::Foreign)?;
    if doc.format != FORMAT {
        return Err(Refused::Foreign);
    }
    if doc.version != VERSION {
        return Err(Refused::Version(doc.version));
    }
    if doc.prefix != prefix {
        return Err(Refused::OtherPrefix(doc.prefix));
    }
    let written = SystemTime::UNIX_EPOCH + Duration::from_millis(doc.written_unix_ms);
    if let Ok(ahead) = written.duration_since(now) {
        if ahead > CLOCK_ALLOWANCE {
            return Err(Refused::Future(ahead));
        }
    }
    let age = now.duration_since(written).unwrap_or(Duration::ZERO);
    if age > max_age {
        return Err(Refused::TooOld(age));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let pairs = doc
        .keys
        .into_iter()
        .map(|k| {
            let value = b64.decode(k.value).map_err(|_| Refused::Corrupt)?;
            Ok(KvPair {
                key: k.key,
                value,
                modify_index: k.modify_index,
                flags: k.flags,
            })
        })
        .collect::<Result<Vec<_>, Refused>>()?;
    Ok(Loaded {
        snapshot: Snapshot::build(prefix, doc.index, pairs),
        written,
        age,
    })
}

/// The JSON line, once the checksum line after it vouches for it.
fn checked(bytes: &[u8]) -> Result<&[u8], Refused> {
    let body = bytes.strip_suffix(b"\n").ok_or(Refused::Truncated)?;
    let nl = body
        .iter()
        .rposition(|&b| b == b'\n')
        .ok_or(Refused::Truncated)?;
    let (doc, trailer) = (&body[..nl], &body[nl + 1..]);
    let hex = trailer
        .strip_prefix(CHECKSUM.as_bytes())
        .filter(|h| h.len() == 16)
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or(Refused::Truncated)?;
    if fnv1a64(doc) != hex {
        return Err(Refused::Corrupt);
    }
    Ok(doc)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is
/// not), and enough to catch a torn or damaged file.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "gitlab-haproxy-agent/state";
    const DAY: Duration = Duration::from_secs(86_400);

    fn pair(key: &str, value: &[u8], modify_index: u64) -> KvPair {
        KvPair {
            key: key.to_owned(),
            value: value.to_vec(),
            modify_index,
            flags: 0,
        }
    }

    /// Valid, invalid, binary and bad-key entries.
    fn sample() -> Snapshot {
        Snapshot::build(
            PREFIX,
            42,
            vec![
                pair(&format!("{PREFIX}/be/drained"), b" Drain\n", 7),
                pair(&format!("{PREFIX}/be/half"), b"050%", 8),
                pair(&format!("{PREFIX}/be/maint"), b"maint", 9),
                // An expiry in Flags survives the file.
                KvPair {
                    flags: 1_900_000_000,
                    ..pair(&format!("{PREFIX}/be/until"), b"drain", 9)
                },
                pair(&format!("{PREFIX}/be/health"), b"up", 10),
                pair(&format!("{PREFIX}/be/binary"), b"\xff\x00drain", 11),
                pair(&format!("{PREFIX}/trailing/"), b"drain", 12),
            ],
        )
    }

    fn sorted_pairs(s: &Snapshot) -> Vec<(String, Vec<u8>, u64, u64)> {
        let mut v: Vec<_> = s
            .raw_pairs(PREFIX)
            .map(|(k, v, i, f)| (k, v.to_vec(), i, f))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_round_trip_gives_the_same_state_and_raw_values() {
        let now = SystemTime::now();
        let s = sample();
        let bytes = encode(&s, PREFIX, now);
        let loaded = decode(&bytes, PREFIX, now + Duration::from_secs(90), DAY).unwrap();
        let back = &loaded.snapshot;
        assert_eq!(back.index(), 42);
        assert_eq!(sorted_pairs(back), sorted_pairs(&s));
        assert_eq!(back.len(), s.len());
        assert_eq!(back.invalid().len(), s.invalid().len());
        for id in ["be/drained", "be/half", "be/maint", "be/health", "be/x"] {
            assert_eq!(back.reply(id.as_bytes()), s.reply(id.as_bytes()), "{id}");
        }
        assert_eq!(loaded.age.as_secs(), 90);
        // Raw, not canonical: what consul said.
        assert!(sorted_pairs(back)
            .iter()
            .any(|(_, v, _, _)| v == b" Drain\n"));
    }

    #[test]
    fn an_empty_state_round_trips() {
        let now = SystemTime::now();
        let s = Snapshot::build(PREFIX, 3, vec![]);
        let back = decode(&encode(&s, PREFIX, now), PREFIX, now, DAY).unwrap();
        assert_eq!((back.snapshot.index(), back.snapshot.len()), (3, 0));
    }

    #[test]
    fn a_file_cut_at_any_byte_is_refused() {
        let now = SystemTime::now();
        let bytes = encode(&sample(), PREFIX, now);
        for cut in 0..bytes.len() {
            let got = decode(&bytes[..cut], PREFIX, now, DAY);
            assert!(
                matches!(got, Err(Refused::Truncated | Refused::Corrupt)),
                "cut at {cut}: {got:?}"
            );
        }
    }

    #[test]
    fn any_changed_byte_is_refused() {
        let now = SystemTime::now();
        let bytes = encode(&sample(), PREFIX, now);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad, PREFIX, now, DAY).is_err(), "byte {i}");
        }
    }

    #[test]
    fn files_of_another_kind_prefix_version_or_age_are_refused() {
        let now = SystemTime::now();
        let bytes = encode(&sample(), PREFIX, now);
        let other = decode(&bytes, "other/prefix", now, DAY).unwrap_err();
        assert_eq!(other, Refused::OtherPrefix(PREFIX.to_owned()));
        let old = decode(&bytes, PREFIX, now + DAY + Duration::from_secs(1), DAY).unwrap_err();
        assert!(matches!(old, Refused::TooOld(_)), "{old:?}");
        assert!(old.to_string().contains("-state-max-age"));
        // Written "later" than now (the clock moved back): age 0, used.
        let ahead = decode(&bytes, PREFIX, now - Duration::from_secs(60), DAY).unwrap();
        assert_eq!(ahead.age, Duration::ZERO);
        // Issue 39: a file dated far in the future never aged out.
        let far = decode(
            &bytes,
            PREFIX,
            now - CLOCK_ALLOWANCE - Duration::from_secs(1),
            DAY,
        );
        let far = far.unwrap_err();
        assert!(matches!(far, Refused::Future(_)), "{far:?}");
        assert!(far.to_string().contains("in the future"), "{far}");
        let with_sum = |doc: &str| {
            let mut b = doc.as_bytes().to_vec();
            b.extend_from_slice(
                format!("\n{CHECKSUM}{:016x}\n", fnv1a64(doc.as_bytes())).as_bytes(),
            );
            b
        };
        let foreign = with_sum(r#"{"hello":"world"}"#);
        assert_eq!(
            decode(&foreign, PREFIX, now, DAY).unwrap_err(),
            Refused::Foreign
        );
        let not_json = with_sum("drain");
        assert_eq!(
            decode(&not_json, PREFIX, now, DAY).unwrap_err(),
            Refused::Foreign
        );
        let text =
            String::from_utf8(bytes[..bytes.iter().position(|&b| b == b'\n').unwrap()].to_vec())
                .unwrap();
        let v2 = with_sum(&text.replace("\"version\":1", "\"version\":2"));
        assert_eq!(
            decode(&v2, PREFIX, now, DAY).unwrap_err(),
            Refused::Version(2)
        );
        let named = with_sum(&text.replace(FORMAT, "something-else"));
        assert_eq!(
            decode(&named, PREFIX, now, DAY).unwrap_err(),
            Refused::Foreign
        );
        let bad_b64 = with_sum(&text.replacen("\"value\":\"", "\"value\":\"!", 1));
        assert_eq!(
            decode(&bad_b64, PREFIX, now, DAY).unwrap_err(),
            Refused::Corrupt
        );
        assert_eq!(
            decode(b"", PREFIX, now, DAY).unwrap_err(),
            Refused::Truncated
        );
    }

    #[test]
    fn fnv1a64_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
