//! The in-memory KV: keys sorted bytewise, a global raft-like index, and
//! tombstones so a prefix's index keeps rising after deletes.
