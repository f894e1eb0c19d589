//! The KV contract between the daemon and the writers, pure: what the
//! keys under the state prefix mean, and what the writers put beside them.
//! Both sides use it; it imports nothing of `cli`, `state`, `consul` or
//! `event_loop`.
//!
//! - [`value`]: a value's bytes -> [`Desired`] -> the reply line.
//! - [`identity`]: a key suffix -> the identity an agent-send line names.
//! - [`expiry`]: the expiry a key's consul Flags carry.
//! - [`record`]: a writer's record, beside each state key it writes.
//! - [`txn`]: the guarded transaction that writes both, and its answer.

pub mod expiry;
pub mod identity;
pub mod record;
pub mod txn;
pub mod value;

pub use identity::{is_control, parse_identity};
pub use value::{parse_value, Admin, Desired, InvalidValue};
