//! `/debug/state` as types: the daemon serializes each row (the document is
//! rendered in slices, a row at a time), `status` deserializes the whole
//! document into [`Document`]. A field renamed on one side is renamed on
//! the other; a field an agent did not send, or sent as another type, is an
//! error for `status`, never a zero.
//!
//! - [`Head`]: the scalars and small objects before the lists, written one
//!   member per line ([`head_lines`]);
//! - [`IdentityRow`], [`InvalidRow`], [`UnaskedRow`], [`Asked`]: one row
//!   each;
//! - [`StateDoc`], [`AskingDoc`]: the lists, written by the render part by
//!   part (their keys are pinned by the test that reads a render back).
//!
//! Fields are declared in alphabetical order inside a row: the order the
//! document had when it was built of `serde_json` maps, kept byte for byte.
//! Every `Option` field is required (present, maybe `null`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// An `Option` that must be present (`null` is `None`): serde takes a
/// missing `Option` field for `None` unless it has its own deserializer.
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// Where the state answered from came from.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Consul,
    StateFile,
}

/// The whole document, as `status` reads it.
#[derive(Deserialize, Debug, Clone, PartialEq)]
pub struct Document {
    #[serde(flatten)]
    pub head: Head,
    /// `None`: no state yet.
    #[serde(deserialize_with = "required")]
    pub state: Option<StateDoc>,
    /// `None`: the loop gave no asks to the render.
    #[serde(deserialize_with = "required")]
    pub asking: Option<AskingDoc>,
}

/// The document's first members, in the order written.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Head {
    pub version: String,
    pub synced: bool,
    #[serde(deserialize_with = "required")]
    pub source: Option<Source>,
    #[serde(deserialize_with = "required")]
    pub state_file: Option<StateFile>,
    pub kv_prefix: String,
    /// Since the last successful consul read.
    #[serde(deserialize_with = "required")]
    pub age_seconds: Option<f64>,
    #[serde(deserialize_with = "required")]
    pub last_change_unix_seconds: Option<f64>,
    pub absent_reply: String,
    pub expiry: Expiry,
    pub watcher: Watcher,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StateFile {
    #[serde(deserialize_with = "required")]
    pub age_seconds: Option<f64>,
    pub answering_from_it: bool,
    pub path: String,
    pub write_errors: u64,
    pub writes: u64,
    #[serde(deserialize_with = "required")]
    pub written_unix_seconds: Option<f64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    pub expired_keys: u64,
    #[serde(deserialize_with = "required")]
    pub next_unix_seconds: Option<u64>,
    /// The agent's clock: expiries are counted on it.
    pub now_unix_seconds: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Watcher {
    pub backing_off: bool,
    pub consecutive_failures: u64,
    pub index: u64,
    #[serde(deserialize_with = "required")]
    pub last_error: Option<String>,
    #[serde(deserialize_with = "required")]
    pub next_request_in_seconds: Option<f64>,
    /// `idle` or `awaiting_head` (a blocking query held open).
    pub phase: String,
    #[serde(deserialize_with = "required")]
    pub request_deadline_in_seconds: Option<f64>,
}

/// `"state"`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
pub struct StateDoc {
    pub index: u64,
    pub keys: u64,
    /// `all`, or `diverted` (`?diverted`).
    pub identities_shown: String,
    pub identities: BTreeMap<String, IdentityRow>,
    pub invalid: Vec<InvalidRow>,
}

/// One identity of the state, with its asks.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IdentityRow {
    /// `None`: no ask since the write yet, or no asks given to the render.
    #[serde(deserialize_with = "required")]
    pub asked_since_write: Option<bool>,
    /// The expiry in the key's Flags.
    #[serde(deserialize_with = "required")]
    pub expires_unix_seconds: Option<u32>,
    #[serde(deserialize_with = "required")]
    pub last_asked: Option<Asked>,
    pub modify_index: u64,
    pub reply: String,
    pub unasked: bool,
    #[serde(deserialize_with = "required")]
    pub unchanged_since_unix_seconds: Option<u64>,
    pub value: String,
}

/// A key the agent cannot apply.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct InvalidRow {
    pub key: String,
    pub modify_index: u64,
    pub reason: String,
    pub value: String,
}

/// A last ask: when (Unix seconds) and how long ago.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    pub seconds_ago: u64,
    pub unix_seconds: u64,
}

/// `"asking"`.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AskingDoc {
    pub unasked_after_seconds: u64,
    pub unknown_identities_count: u64,
    pub unknown_identities_overflow: u64,
    pub unasked: Vec<UnaskedRow>,
    /// The most recent, by identity (only counted with `?diverted`).
    pub unknown_identities: BTreeMap<String, Asked>,
}

/// A diverted key no check asked for.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct UnaskedRow {
    #[serde(deserialize_with = "required")]
    pub did_you_mean: Option<String>,
    pub identity: String,
    #[serde(deserialize_with = "required")]
    pub last_asked: Option<Asked>,
    pub modify_index: u64,
    pub reply: String,
    pub unchanged_since_unix_seconds: u64,
    pub value: String,
}

/// A row as compact JSON.
pub fn row<T: Serialize>(row: &T) -> String {
    serde_json::to_string(row).unwrap_or_default()
}

/// The head as the document's opening: `{`, then one `"member": value,`
/// a line (values compact).
pub fn head_lines(head: &Head) -> String {
    let mut out = Vec::with_capacity(1024);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, MemberLines { depth: 0 });
    if head.serialize(&mut ser).is_err() {
        return String::new();
    }
    // `...}` -> `...,\n`: the lists follow.
    out.pop();
    out.extend_from_slice(b",\n");
    String::from_utf8(out).unwrap_or_default()
}

/// Compact JSON but for the outermost object: one member a line, `": "`
/// between its keys and values.
struct MemberLines {
    depth: usize,
}

impl serde_json::ser::Formatter for MemberLines {
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth -= 1;
        w.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        match (self.depth, first) {
            (1, true) => w.write_all(b"\n"),
            (1, false) => w.write_all(b",\n"),
            (_, true) => Ok(()),
            (_, false) => w.write_all(b","),
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(if self.depth == 1 { b": " } else { b":" })
    }
}
