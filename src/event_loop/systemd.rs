//! The loop's side of systemd's notification protocol: the socket and the
//! [`Notifier`] that decides what to send ([`crate::notify`]). The loop
//! calls [`Notify::on_turn`] at the end of every turn (the only place a
//! watchdog ping comes from, so a wedged loop stops them) and
//! [`Notify::stopping`] when a shutdown starts.

use std::io;
use std::time::Instant;

use log::{info, warn};

use crate::notify::{Answering, Notifier, NotifySocket, Settings};

/// The notify socket and its machine; a failed send is logged once (then
/// once more when sends work again).
pub(super) struct Notify {
    socket: NotifySocket,
    machine: Notifier,
    failing: bool,
}

impl Notify {
    pub(super) fn open(settings: &Settings, start: Instant) -> io::Result<Notify> {
        Ok(Notify {
            socket: NotifySocket::open(&settings.target)?,
            machine: Notifier::new(settings.watchdog, start),
            failing: false,
        })
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        self.machine.deadline()
    }

    pub(super) fn on_turn(&mut self, now: Instant, answering: Answering<'_>) {
        if let Some(msg) = self.machine.on_time(now, answering) {
            self.send(&msg);
        }
    }

    pub(super) fn stopping(&mut self) {
        let msg = self.machine.stopping();
        self.send(&msg);
    }

    fn send(&mut self, msg: &str) {
        match (self.socket.send(msg), self.failing) {
            (Ok(()), true) => {
                info!("systemd notify socket works again");
                self.failing = false;
            }
            (Err(e), false) => {
                warn!(error = e.to_string(); "cannot send to systemd's notify socket: readiness or watchdog pings are lost");
                self.failing = true;
            }
            _ => {}
        }
    }
}
