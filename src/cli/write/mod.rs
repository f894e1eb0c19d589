//! The writers, `set`, `unset` ([`set()`]) and `ramp` ([`ramp()`]): each
//! checks every word, reads the keys, and writes guarded transactions of
//! the KV contract ([`crate::contract`]), each key with its record.
//!
//! - The commands: [`set()`], [`ramp()`] (its steps: [`schedule`]); the
//!   one step loop both run: `machine` (a set is a ramp of one step).
//! - Their words: `words` (identities and values), [`recorder`] (the
//!   record's `-by`, `-reason`, `-for`, `-until`), `haproxy` (weights
//!   a static backend ignores).
//! - A key and its change: `key`, `change`; the undo: `undo`.
//! - Consul: `kv` (reads, one transaction sent), `deliver` (what its
//!   answer means: applied, conflict, refused, or lost and settled).

mod change;
mod deliver;
mod haproxy;
mod key;
mod kv;
mod machine;
mod ramp;
pub mod recorder;
pub mod schedule;
mod set;
mod undo;
mod words;

pub use kv::{Kv, RECORD_PREFIX};
pub use ramp::{run as ramp, HELP as RAMP_HELP};
pub(crate) use recorder::RECORD_FLAGS;
pub use set::{run_set as set, run_unset as unset, SET_HELP, UNSET_HELP};
