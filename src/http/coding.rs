//! Content codings (RFC 9110 §8.4): which one a response says it used,
//! whether a request accepts gzip, and gzip itself, both ways.
//!
//! In: `Content-Encoding` / `Accept-Encoding` values; a gzip stream in
//! whatever pieces the socket delivered it. Out: the coding (or why it is
//! not one we decode); the inflated bytes, a bounded step at a time, or a
//! reason the stream is not acceptable. Always holds: the [`Inflater`]
//! buffers nothing of its input (the caller keeps what was not consumed),
//! never produces more than its bound plus one byte, never more than the
//! step it is given per call, and its result never depends on how the input
//! was split. The deflate data itself is decoded by flate2's pure-Rust
//! backend (miniz_oxide); the gzip member framing around it (RFC 1952:
//! header, CRC-32, size) is read here, byte by byte, so that no input is
//! ever held back inside a reader.

use flate2::{Crc, Decompress, FlushDecompress, Status};

/// Consul's gzip handler compresses bodies of at least this many bytes
/// (`gziphandler.MinSize(1400)` in `agent/http.go`).
pub const GZIP_MIN_SIZE: usize = 1400;

/// A content coding the consul client decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

/// The coding named by a response's `Content-Encoding` header lines (all
/// of them, in order). `identity` and empty members are no coding; `gzip`
/// (or its alias `x-gzip`) once is gzip; anything else, or more than one
/// coding, is an error naming what was sent.
pub fn content_coding<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Result<Coding, String> {
    let mut coding = Coding::Identity;
    for value in values {
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            if token.is_empty() || token.eq_ignore_ascii_case(b"identity") {
                continue;
            }
            let gzip = token.eq_ignore_ascii_case(b"gzip") || token.eq_ignore_ascii_case(b"x-gzip");
            if !gzip || coding == Coding::Gzip {
                let shown = crate::safe::escape(value, 64);
                return Err(format!("unsupported Content-Encoding {shown:?}"));
            }
            coding = Coding::Gzip;
        }
    }
    Ok(coding)
}

/// Whether a request's `Accept-Encoding` accepts gzip, as consul's gzip
/// handler reads it: a `gzip` member whose `q` is absent or above zero
/// (`*` and `x-gzip` do not count there, so they do not here).
pub fn accepts_gzip(accept_encoding: Option<&[u8]>) -> bool {
    let Some(value) = accept_encoding.and_then(|v| std::str::from_utf8(v).ok()) else {
        return false;
    };
    value.split(',').any(|member| {
        let mut parts = member.split(';');
        let coding = parts.next().unwrap_or("").trim();
        if !coding.eq_ignore_ascii_case("gzip") {
            return false;
        }
        // gziphandler's parseCoding: a bad `q` counts as 0.
        parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .next_back()
            .is_none_or(|q| q.trim().parse::<f64>().is_ok_and(|q| q > 0.0))
    })
}

/// `data` gzipped at the default level (6), as Go's `gzip.NewWriter` does.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8 + 64),
        flate2::Compression::default(),
    );
    // Writing into a Vec cannot fail.
    enc.write_all(data).expect("gzip into a Vec");
    enc.finish().expect("gzip into a Vec")
}

/// Why a gzip stream cannot be inflated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// Not gzip, or damaged: the detail names what was wrong.
    Corrupt(&'static str),
    /// The inflated body would pass the caller's bound.
    TooLarge,
    /// The stream ended inside a member.
    Truncated,
}

impl std::fmt::Display for InflateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InflateError::Corrupt(why) => write!(f, "corrupt gzip body: {why}"),
            InflateError::TooLarge => f.write_str("gzip body inflates past the bound"),
            InflateError::Truncated => f.write_str("gzip body truncated"),
        }
    }
}

// RFC 1952 header flags.
const FHCRC: u8 = 2;
const FEXTRA: u8 = 4;
const FNAME: u8 = 8;
const FCOMMENT: u8 = 16;
const FRESERVED: u8 = 0xe0;
/// Inflate into the output at most this much at a time (the zeroed room
/// handed to the deflate decoder).
const ROOM: usize = 64 * 1024;

/// Where in a gzip member the next byte belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Between members (or before the first): the stream may end here.
    Between,
    /// The 10 fixed header bytes, `got` of them so far.
    Fixed {
        got: usize,
        buf: [u8; 10],
    },
    /// `FEXTRA`'s 2-byte length, then that many bytes.
    ExtraLen {
        got: usize,
        buf: [u8; 2],
    },
    Extra {
        left: usize,
    },
    /// `FNAME` and `FCOMMENT`: up to a NUL.
    Name,
    Comment,
    /// `FHCRC`: the low 16 bits of the header's CRC-32.
    HeaderCrc {
        got: usize,
        buf: [u8; 2],
    },
    Deflate,
    /// CRC-32 and size (mod 2^32) of the member's data.
    Trailer {
        got: usize,
        buf: [u8; 8],
    },
}

/// Inflates a gzip stream fed in arbitrary pieces (several members in a row
/// are one stream, as RFC 1952 and Go's reader have it).
///
/// Lifecycle: `Between -> Fixed -> [ExtraLen -> Extra] -> [Name] ->
/// [Comment] -> [HeaderCrc] -> Deflate -> Trailer -> Between`; any error is
/// sticky. An empty stream is an empty body (as Go's client reads it).
pub struct Inflater {
    stage: Stage,
    flags: u8,
    header_crc: Crc,
    deflate: Decompress,
    /// Of the current member's output.
    crc: Crc,
    member_out: u64,
    total_out: u64,
    max_out: u64,
    failed: Option<InflateError>,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("stage", &self.stage)
            .field("total_out", &self.total_out)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Inflater {
    /// `max_out` bounds the inflated size (past it: `TooLarge`, reported as
    /// soon as one byte more was inflated).
    pub fn new(max_out: usize) -> Inflater {
        Inflater {
            stage: Stage::Between,
            flags: 0,
            header_crc: Crc::new(),
            deflate: Decompress::new(false),
            crc: Crc::new(),
            member_out: 0,
            total_out: 0,
            max_out: u64::try_from(max_out).unwrap_or(u64::MAX),
            failed: None,
        }
    }

    /// Inflated bytes so far.
    pub fn total_out(&self) -> u64 {
        self.total_out
    }

    /// Feeds gzip bytes; appends at most `step` inflated bytes to `out` and
    /// returns how many input bytes were consumed. It stops only when the
    /// input is used up (and nothing more can be inflated without more), or
    /// when `step` bytes were produced: with a step left over, everything
    /// was consumed. After an error every call returns the same error.
    pub fn feed(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        step: usize,
    ) -> Result<usize, InflateError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.run(input, out, step)
            .inspect_err(|&e| self.failed = Some(e))
    }

    /// The input ended: fine between members, else `Truncated`.
    pub fn finish(&mut self) -> Result<(), InflateError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.stage == Stage::Between {
            return Ok(());
        }
        self.failed = Some(InflateError::Truncated);
        Err(InflateError::Truncated)
    }

    fn run(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        mut step: usize,
    ) -> Result<usize, InflateError> {
        let mut i = 0;
        loop {
            if self.stage == Stage::Deflate {
                let (used, made, end) = self.inflate(&input[i..], out, step)?;
                i += used;
                step -= made;
                if end {
                    self.stage = Stage::Trailer {
                        got: 0,
                        buf: [0; 8],
                    };
                } else if (used == 0 && made == 0) || step == 0 {
                    // Needs more input, or the step is spent.
                    return Ok(i);
                }
                continue;
            }
            let Some(&b) = input.get(i) else {
                return Ok(i);
            };
            i += 1;
            self.stage = self.framing_byte(b)?;
        }
    }

    /// One byte of a member's framing (everything but the deflate data).
    fn framing_byte(&mut self, b: u8) -> Result<Stage, InflateError> {
        // FHCRC covers every header byte before it.
        if self.stage == Stage::Between {
            self.header_crc.reset();
        }
        if !matches!(self.stage, Stage::Trailer { .. } | Stage::HeaderCrc { .. }) {
            self.header_crc.update(&[b]);
        }
        Ok(match self.stage {
            Stage::Between => Stage::Fixed {
                got: 1,
                buf: [b, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            },
            Stage::Fixed { got, mut buf } => {
                buf[got] = b;
                // Each fixed byte that means something is checked as it
                // comes: a body that is not gzip fails at its second byte.
                match got {
                    1 if buf[..2] != [0x1f, 0x8b] => {
                        return Err(InflateError::Corrupt("not gzip (bad magic)"))
                    }
                    2 if b != 8 => {
                        return Err(InflateError::Corrupt("compression method is not deflate"))
                    }
                    3 if b & FRESERVED != 0 => {
                        return Err(InflateError::Corrupt("reserved header flags set"))
                    }
                    9 => return Ok(self.start_member(buf[3])),
                    _ => {}
                }
                Stage::Fixed { got: got + 1, buf }
            }
            Stage::ExtraLen { got, mut buf } => {
                buf[got] = b;
                match (got, u16::from_le_bytes(buf)) {
                    (0, _) => Stage::ExtraLen { got: 1, buf },
                    (_, 0) => self.after(FEXTRA),
                    (_, len) => Stage::Extra {
                        left: usize::from(len),
                    },
                }
            }
            Stage::Extra { left: 1 } => self.after(FEXTRA),
            Stage::Extra { left } => Stage::Extra { left: left - 1 },
            Stage::Name if b == 0 => self.after(FNAME),
            Stage::Comment if b == 0 => self.after(FCOMMENT),
            s @ (Stage::Name | Stage::Comment) => s,
            Stage::HeaderCrc { got: 0, mut buf } => {
                buf[0] = b;
                Stage::HeaderCrc { got: 1, buf }
            }
            Stage::HeaderCrc { mut buf, .. } => {
                buf[1] = b;
                if u32::from(u16::from_le_bytes(buf)) != self.header_crc.sum() & 0xffff {
                    return Err(InflateError::Corrupt("header CRC mismatch"));
                }
                Stage::Deflate
            }
            Stage::Trailer { got, mut buf } => {
                buf[got] = b;
                if got + 1 < buf.len() {
                    return Ok(Stage::Trailer { got: got + 1, buf });
                }
                self.end_member(buf)?
            }
            Stage::Deflate => unreachable!("deflate data is not framing"),
        })
    }

    /// The fixed header is in (its flags byte checked): reset the member's
    /// decoder.
    fn start_member(&mut self, flags: u8) -> Stage {
        self.flags = flags;
        self.deflate.reset(false);
        self.crc.reset();
        self.member_out = 0;
        self.after(0)
    }

    /// The stage after the optional header field `done` (0: after the
    /// fixed part).
    fn after(&self, done: u8) -> Stage {
        const ORDER: [u8; 4] = [FEXTRA, FNAME, FCOMMENT, FHCRC];
        let from = ORDER.iter().position(|&f| f == done).map_or(0, |p| p + 1);
        match ORDER[from..].iter().find(|&&f| self.flags & f != 0) {
            Some(&FEXTRA) => Stage::ExtraLen {
                got: 0,
                buf: [0; 2],
            },
            Some(&FNAME) => Stage::Name,
            Some(&FCOMMENT) => Stage::Comment,
            Some(_) => Stage::HeaderCrc {
                got: 0,
                buf: [0; 2],
            },
            None => Stage::Deflate,
        }
    }

    fn end_member(&mut self, t: [u8; 8]) -> Result<Stage, InflateError> {
        let crc = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let size = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
        if crc != self.crc.sum() {
            return Err(InflateError::Corrupt("CRC-32 mismatch"));
        }
        if size != self.member_out as u32 {
            return Err(InflateError::Corrupt("size mismatch"));
        }
        Ok(Stage::Between)
    }

    /// Inflates deflate data into `out`, at most `step` bytes (and never
    /// past the bound by more than one): (input used, bytes made, the
    /// member's deflate stream ended).
    fn inflate(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        step: usize,
    ) -> Result<(usize, usize, bool), InflateError> {
        let (mut used, mut made) = (0, 0);
        loop {
            // One byte past the bound is how "too large" is seen.
            let left = self
                .max_out
                .saturating_add(1)
                .saturating_sub(self.total_out);
            let room = (step - made)
                .min(ROOM)
                .min(usize::try_from(left).unwrap_or(ROOM));
            let len = out.len();
            out.resize(len + room, 0);
            let (in0, out0) = (self.deflate.total_in(), self.deflate.total_out());
            let status =
                self.deflate
                    .decompress(&input[used..], &mut out[len..], FlushDecompress::None);
            let got = (self.deflate.total_out() - out0) as usize;
            out.truncate(len + got);
            let status = status.map_err(|_| InflateError::Corrupt("bad deflate data"))?;
            let took = (self.deflate.total_in() - in0) as usize;
            self.crc.update(&out[len..]);
            used += took;
            made += got;
            self.member_out += got as u64;
            self.total_out += got as u64;
            if self.total_out > self.max_out {
                return Err(InflateError::TooLarge);
            }
            if status == Status::StreamEnd {
                return Ok((used, made, true));
            }
            if (took == 0 && got == 0) || made == step {
                return Ok((used, made, false));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    /// A consul-shaped listing of `n` keys.
    fn listing(n: usize) -> Vec<u8> {
        let entries: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"LockIndex":0,"Key":"p/be/s{i}","Flags":0,"Value":"ZHJhaW4=","CreateIndex":{i},"ModifyIndex":{i}}}"#))
            .collect();
        format!("[{}]", entries.join(",")).into_bytes()
    }

    /// Feeds `input` cut at `cuts` the way the client does: unconsumed
    /// bytes stay pending, `step` bytes of output at most per call (calls
    /// repeat while output is being made). The inflated body, or the error.
    fn inflate_pieces(
        input: &[u8],
        cuts: &[usize],
        max: usize,
        step: usize,
    ) -> Result<Vec<u8>, InflateError> {
        let mut inf = Inflater::new(max);
        let mut out = Vec::new();
        let mut pending = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain(std::iter::once(&input.len())) {
            pending.extend_from_slice(&input[start..end]);
            start = end;
            loop {
                let before = out.len();
                let used = inf.feed(&pending, &mut out, step)?;
                pending.drain(..used);
                assert!(out.len() - before <= step, "more than a step");
                if out.len() - before < step {
                    assert!(
                        pending.is_empty(),
                        "stopped with a step left and input pending"
                    );
                    break;
                }
            }
        }
        inf.finish()?;
        Ok(out)
    }

    fn inflate(input: &[u8]) -> Result<Vec<u8>, InflateError> {
        inflate_pieces(input, &[], MAX, MAX)
    }

    /// A gzip member with every optional header field (FEXTRA, FNAME,
    /// FCOMMENT, FHCRC), as `gzip -N` and friends write them.
    fn member_with_every_field(data: &[u8]) -> Vec<u8> {
        let plain = gzip(data);
        let mut h = vec![
            0x1f,
            0x8b,
            8,
            FEXTRA | FNAME | FCOMMENT | FHCRC,
            1,
            2,
            3,
            4,
            0,
            3,
        ];
        h.extend_from_slice(&[3, 0, b'a', b'b', b'c']);
        h.extend_from_slice(b"listing.json\0a comment\0");
        let mut crc = Crc::new();
        crc.update(&h);
        h.extend_from_slice(&(crc.sum() as u16).to_le_bytes());
        h.extend_from_slice(&plain[10..]);
        h
    }

    #[test]
    fn a_listing_round_trips_and_shrinks_like_consuls() {
        let body = listing(1000);
        let z = gzip(&body);
        assert!(z.len() * 8 < body.len(), "{} -> {}", body.len(), z.len());
        assert_eq!(inflate(&z).unwrap(), body);
    }

    #[test]
    fn every_split_point_and_every_step_give_the_same_body() {
        let body = listing(40);
        for z in [gzip(&body), member_with_every_field(&body)] {
            for cut in 0..=z.len() {
                assert_eq!(
                    inflate_pieces(&z, &[cut], MAX, MAX).as_ref(),
                    Ok(&body),
                    "cut at {cut}"
                );
            }
            for step in [1, 7, 100, 4096] {
                assert_eq!(
                    inflate_pieces(&z, &[z.len() / 3], MAX, step).as_ref(),
                    Ok(&body),
                    "step {step}"
                );
            }
            let cuts: Vec<usize> = (1..z.len()).collect();
            assert_eq!(
                inflate_pieces(&z, &cuts, MAX, 3).as_ref(),
                Ok(&body),
                "byte at a time"
            );
        }
    }

    #[test]
    fn members_in_a_row_are_one_stream_and_empty_is_empty() {
        let mut z = gzip(b"[{\"Key\":");
        z.extend(gzip(b""));
        z.extend(member_with_every_field(b"\"a\"}]"));
        assert_eq!(inflate(&z).unwrap(), b"[{\"Key\":\"a\"}]");
        for cut in 0..=z.len() {
            assert_eq!(
                inflate_pieces(&z, &[cut], MAX, 2).unwrap(),
                b"[{\"Key\":\"a\"}]"
            );
        }
        assert_eq!(inflate(b"").unwrap(), b"");
    }

    #[test]
    fn each_bad_stream_is_corrupt() {
        let good = gzip(&listing(20));
        let n = good.len();
        let with = |at: usize, b: u8| {
            let mut z = good.clone();
            z[at] = b;
            z
        };
        let mut garbage_after = good.clone();
        garbage_after.extend_from_slice(b"\r\n");
        let cases: [(&str, Vec<u8>); 9] = [
            ("not gzip", b"[{\"Key\":\"p/a\"}]".to_vec()),
            ("bad magic", with(1, 0x8c)),
            ("not deflate", with(2, 7)),
            ("reserved flag", with(3, 0x20)),
            ("bad deflate block type", with(10, 0xff)),
            ("crc", with(n - 8, good[n - 8] ^ 1)),
            ("size", with(n - 1, good[n - 1] ^ 1)),
            ("header crc", {
                // The CRC follows 10 fixed bytes, 5 of FEXTRA and 23 of
                // name and comment.
                let mut z = member_with_every_field(b"x");
                z[38] ^= 1;
                z
            }),
            ("garbage after the member", garbage_after),
        ];
        for (what, z) in cases {
            for cut in [0, 1, z.len() / 2, z.len()] {
                match inflate_pieces(&z, &[cut], MAX, MAX) {
                    Err(InflateError::Corrupt(_)) => {}
                    other => panic!("{what}, cut at {cut}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_stream_cut_anywhere_is_truncated() {
        let z = member_with_every_field(&listing(20));
        for end in 1..z.len() {
            assert_eq!(
                inflate(&z[..end]),
                Err(InflateError::Truncated),
                "cut at {end}"
            );
        }
    }

    #[test]
    fn a_bomb_is_too_large_as_soon_as_it_passes_the_bound_and_memory_stays_bounded() {
        // 64 MiB of zeros: about 64 KiB of gzip.
        let z = gzip(&vec![0; 64 << 20]);
        assert!(z.len() < 100 << 10, "{}", z.len());
        let mut inf = Inflater::new(1 << 20);
        let mut out = Vec::new();
        let mut calls = 0;
        let mut fed = 0;
        let err = loop {
            calls += 1;
            match inf.feed(&z[fed..], &mut out, 256 << 10) {
                Ok(used) => fed += used,
                Err(e) => break e,
            }
        };
        assert_eq!(err, InflateError::TooLarge);
        assert_eq!(out.len(), (1 << 20) + 1, "one byte past the bound, no more");
        assert!(out.capacity() <= 2 << 20, "{}", out.capacity());
        assert!(calls <= 6, "{calls}");
        assert!(fed < z.len() / 8, "stopped early: {fed} of {}", z.len());
        // Sticky.
        assert_eq!(
            inf.feed(&z[fed..], &mut out, 1),
            Err(InflateError::TooLarge)
        );
        assert_eq!(inf.finish(), Err(InflateError::TooLarge));
        // Exactly the bound is fine.
        let body = vec![b'x'; 5000];
        assert_eq!(inflate_pieces(&gzip(&body), &[], 5000, 1000).unwrap(), body);
        assert_eq!(
            inflate_pieces(&gzip(&body), &[], 4999, 1000),
            Err(InflateError::TooLarge)
        );
    }

    #[test]
    fn content_coding_names() {
        let ok: [(&[&[u8]], Coding); 7] = [
            (&[], Coding::Identity),
            (&[b""], Coding::Identity),
            (&[b"identity"], Coding::Identity),
            (&[b"gzip"], Coding::Gzip),
            (&[b" GZip "], Coding::Gzip),
            (&[b"x-gzip"], Coding::Gzip),
            (&[b"identity, gzip", b""], Coding::Gzip),
        ];
        for (values, want) in ok {
            assert_eq!(
                content_coding(values.iter().copied()),
                Ok(want),
                "{values:?}"
            );
        }
        let bad: [&[&[u8]]; 5] = [
            &[b"br"],
            &[b"deflate"],
            &[b"gzip, gzip"],
            &[b"gzip", b"gzip"],
            &[b"gzip, br"],
        ];
        for values in bad {
            let e = content_coding(values.iter().copied()).unwrap_err();
            assert!(
                e.starts_with("unsupported Content-Encoding"),
                "{values:?}: {e}"
            );
        }
    }

    #[test]
    fn accept_encoding_as_consuls_gzip_handler_reads_it() {
        for (v, want) in [
            (None, false),
            (Some(&b"gzip"[..]), true),
            (Some(b"deflate, gzip;q=0.5"), true),
            (Some(b"GZIP"), true),
            (Some(b"gzip;q=0"), false),
            (Some(b"gzip;q=x"), false),
            (Some(b"*"), false),
            (Some(b"x-gzip"), false),
            (Some(b"br"), false),
        ] {
            assert_eq!(accepts_gzip(v), want, "{v:?}");
        }
    }
}
