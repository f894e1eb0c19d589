//! A table of open connections of one kind (agent checks, HTTP): slab
//! slots, their poll tokens and registrations, and their timers.
//!
//! In: connections to keep (`insert`), the readiness each waits for
//! (`set_interest`), deadlines (`arm`), the time (`expired`). Out: slot
//! keys, and the connections back on `remove`.
//!
//! Always holds:
//! - a connection in the table is registered with its poll under `base +
//!   key`, for exactly the interest last asked for (re-registered only when
//!   it changes);
//! - it is deregistered before its slot is freed, so a reused key never
//!   receives the old socket's events;
//! - a slot has at most one live timer record, and records left by closed
//!   or re-armed slots are ignored when they fire (each record carries the
//!   slot's generation) and dropped once they outnumber the live slots, so
//!   the heap stays within about twice the open connections however fast
//!   they churn.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::time::Instant;

use mio::event::Source;
use mio::{Interest, Registry, Token};
use slab::Slab;

/// A connection the table can register: it hands out its socket.
pub trait Pollable {
    fn source(&mut self) -> &mut dyn Source;
}

struct Slot<T> {
    conn: T,
    gen: u32,
    registered: Interest,
    /// The deadline of this slot's one live record in the heap (records
    /// with another time are stale).
    armed: Option<Instant>,
}

/// The connections of one kind.
pub struct ConnTable<T> {
    slots: Slab<Slot<T>>,
    /// Token of slot `key` is `base + key`.
    base: usize,
    next_gen: u32,
    /// (deadline, key, generation), earliest first.
    timers: BinaryHeap<Reverse<(Instant, usize, u32)>>,
}

impl<T: Pollable> ConnTable<T> {
    pub fn new(base: usize, capacity: usize) -> ConnTable<T> {
        ConnTable {
            slots: Slab::with_capacity(capacity),
            base,
            next_gen: 0,
            timers: BinaryHeap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The slot a token names (`None` if below `base`; the caller orders
    /// the bases so token ranges do not overlap).
    pub fn key_of(&self, token: Token) -> Option<usize> {
        token.0.checked_sub(self.base)
    }

    /// Registers `conn` for `interest` and keeps it; on a register error
    /// the connection is handed back.
    pub fn insert(
        &mut self,
        registry: &Registry,
        mut conn: T,
        interest: Interest,
    ) -> Result<usize, (T, io::Error)> {
        let entry = self.slots.vacant_entry();
        let key = entry.key();
        if let Err(e) = registry.register(conn.source(), Token(self.base + key), interest) {
            return Err((conn, e));
        }
        self.next_gen = self.next_gen.wrapping_add(1);
        entry.insert(Slot {
            conn,
            gen: self.next_gen,
            registered: interest,
            armed: None,
        });
        Ok(key)
    }

    pub fn get(&self, key: usize) -> Option<&T> {
        self.slots.get(key).map(|s| &s.conn)
    }

    pub fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        self.slots.get_mut(key).map(|s| &mut s.conn)
    }

    /// The generation of the connection in slot `key` (a reused slot has
    /// a new one).
    pub fn gen(&self, key: usize) -> Option<u32> {
        self.slots.get(key).map(|s| s.gen)
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.slots.iter().map(|(k, s)| (k, &s.conn))
    }

    /// Waits for `want` from now on: re-registers only if it changed.
    pub fn set_interest(
        &mut self,
        registry: &Registry,
        key: usize,
        want: Interest,
    ) -> io::Result<()> {
        let Some(slot) = self.slots.get_mut(key) else {
            return Ok(());
        };
        if slot.registered != want {
            registry.reregister(slot.conn.source(), Token(self.base + key), want)?;
            slot.registered = want;
        }
        Ok(())
    }

    /// Deregisters the connection, then frees its slot.
    pub fn remove(&mut self, registry: &Registry, key: usize) -> Option<T> {
        let slot = self.slots.get_mut(key)?;
        let _ = registry.deregister(slot.conn.source());
        Some(self.slots.remove(key).conn)
    }

    /// Wakes the table for slot `key` at `deadline`, unless a record at
    /// or before it is armed already (that one re-arms when it fires).
    pub fn arm(&mut self, key: usize, deadline: Instant) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        if slot.armed.is_none_or(|a| deadline < a) {
            slot.armed = Some(deadline);
            self.timers.push(Reverse((deadline, key, slot.gen)));
        }
        if self.timers.len() > 2 * self.slots.len() + 1024 {
            let slots = &self.slots;
            self.timers.retain(|Reverse((t, k, g))| {
                slots
                    .get(*k)
                    .is_some_and(|s| s.gen == *g && s.armed == Some(*t))
            });
            self.timers.shrink_to(2 * self.slots.len() + 1024);
        }
    }

    /// The earliest record's time (perhaps a stale one's: waking early
    /// for it costs one empty turn).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The next slot whose armed deadline is at or before `now`, disarmed
    /// (the caller closes it, or re-arms it for a later deadline).
    pub fn expired(&mut self, now: Instant) -> Option<usize> {
        while let Some(&Reverse((t, key, gen))) = self.timers.peek() {
            if t > now {
                return None;
            }
            self.timers.pop();
            if let Some(slot) = self.slots.get_mut(key) {
                if slot.gen == gen && slot.armed == Some(t) {
                    slot.armed = None;
                    return Some(key);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    use mio::Poll;

    use super::*;

    /// What the poll was asked, in order.
    type Calls = Rc<RefCell<Vec<String>>>;

    /// A socket stand-in that records its (de)registrations.
    struct Fake {
        name: &'static str,
        calls: Calls,
    }

    impl Source for Fake {
        fn register(&mut self, _: &Registry, t: Token, i: Interest) -> io::Result<()> {
            if self.name == "refused" {
                return Err(io::Error::other("no"));
            }
            self.calls
                .borrow_mut()
                .push(format!("register {} {} {i:?}", self.name, t.0));
            Ok(())
        }
        fn reregister(&mut self, _: &Registry, t: Token, i: Interest) -> io::Result<()> {
            self.calls
                .borrow_mut()
                .push(format!("reregister {} {} {i:?}", self.name, t.0));
            Ok(())
        }
        fn deregister(&mut self, _: &Registry) -> io::Result<()> {
            self.calls
                .borrow_mut()
                .push(format!("deregister {}", self.name));
            Ok(())
        }
    }

    impl Pollable for Fake {
        fn source(&mut self) -> &mut dyn Source {
            self
        }
    }

    fn table() -> (ConnTable<Fake>, Poll, Calls) {
        (
            ConnTable::new(100, 4),
            Poll::new().unwrap(),
            Calls::default(),
        )
    }

    fn fake(name: &'static str, calls: &Calls) -> Fake {
        Fake {
            name,
            calls: calls.clone(),
        }
    }

    fn taken(calls: &Calls) -> Vec<String> {
        std::mem::take(&mut *calls.borrow_mut())
    }

    #[test]
    fn registrations_follow_the_slot() {
        let (mut t, poll, calls) = table();
        let reg = poll.registry();
        let a = t
            .insert(reg, fake("a", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        assert_eq!(t.key_of(Token(100 + a)), Some(a));
        assert_eq!(t.key_of(Token(99)), None);
        assert_eq!(taken(&calls), [format!("register a {} READABLE", 100 + a)]);
        // The same interest again: no system call.
        t.set_interest(reg, a, Interest::READABLE).unwrap();
        assert!(taken(&calls).is_empty());
        t.set_interest(reg, a, Interest::WRITABLE).unwrap();
        assert_eq!(
            taken(&calls),
            [format!("reregister a {} WRITABLE", 100 + a)]
        );
        // Deregistered before the slot is reused.
        assert_eq!(t.remove(reg, a).map(|c| c.name), Some("a"));
        let b = t
            .insert(reg, fake("b", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        assert_eq!(b, a, "the slot is reused");
        assert_eq!(
            taken(&calls),
            [
                "deregister a".to_owned(),
                format!("register b {} READABLE", 100 + b)
            ]
        );
        assert!(t.remove(reg, 77).is_none());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_refused_registration_keeps_nothing() {
        let (mut t, poll, calls) = table();
        let Err((back, _)) = t.insert(poll.registry(), fake("refused", &calls), Interest::READABLE)
        else {
            panic!("inserted");
        };
        assert_eq!(back.name, "refused");
        assert!(t.is_empty());
    }

    #[test]
    fn timers_fire_once_in_deadline_order() {
        let (mut t, poll, calls) = table();
        let reg = poll.registry();
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let a = t
            .insert(reg, fake("a", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        let b = t
            .insert(reg, fake("b", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        t.arm(a, s(5));
        t.arm(b, s(3));
        assert_eq!(t.next_deadline(), Some(s(3)));
        assert_eq!(t.expired(s(2)), None);
        assert_eq!(t.expired(s(9)), Some(b));
        assert_eq!(t.expired(s(9)), Some(a));
        assert_eq!(t.expired(s(9)), None, "disarmed once fired");
    }

    #[test]
    fn an_earlier_deadline_rearms_a_later_one_waits_for_the_armed_record() {
        let (mut t, poll, calls) = table();
        let reg = poll.registry();
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let a = t
            .insert(reg, fake("a", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        t.arm(a, s(10));
        t.arm(a, s(4));
        t.arm(a, s(60)); // later than the armed one: no new record
        assert_eq!(t.timers.len(), 2);
        assert_eq!(t.expired(s(5)), Some(a));
        assert_eq!(t.expired(s(11)), None, "the 10 s record is stale");
    }

    #[test]
    fn records_of_closed_slots_are_ignored_and_compacted() {
        let (mut t, poll, calls) = table();
        let reg = poll.registry();
        let t0 = Instant::now();
        let a = t
            .insert(reg, fake("a", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        t.arm(a, t0);
        t.remove(reg, a);
        let b = t
            .insert(reg, fake("b", &calls), Interest::READABLE)
            .ok()
            .unwrap();
        assert_eq!(b, a);
        assert_eq!(t.expired(t0), None, "a's record is not b's");
        // Churn: records of closed slots never pile up.
        for i in 0..10_000u64 {
            let k = t
                .insert(reg, fake("c", &calls), Interest::READABLE)
                .ok()
                .unwrap();
            t.arm(k, t0 + Duration::from_secs(60 + i));
            t.remove(reg, k);
        }
        assert!(
            t.timers.len() <= 2 * t.len() + 1024 + 1,
            "{}",
            t.timers.len()
        );
    }
}
