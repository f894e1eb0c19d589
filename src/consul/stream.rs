//! What the consul connection runs over: a nonblocking byte stream with a
//! handshake of its own ([`Transport`]: a socket, TLS over it, or a test
//! peer) and what opens one ([`Connect`]). A leaf: the TLS stream and the
//! transport steps both build on it.

use std::io::{self, Read, Write};

/// A byte stream to consul: nonblocking reads and writes, the end of a
/// nonblocking connect, and a handshake of its own (TLS) after it.
pub trait Transport: Read + Write {
    /// `Ok(true)` once connected, `Ok(false)` while still connecting.
    fn connected(&mut self) -> io::Result<bool>;

    /// Drives the transport's own handshake on a connected stream:
    /// `Ok(true)` once done. A plain stream has none.
    fn handshake(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    /// Bytes of the transport's own wait for the stream to take them (TLS
    /// records): wait for writable too, whatever the phase waits for.
    fn wants_write(&self) -> bool {
        false
    }
}

/// Opens connections to consul.
pub trait Connect {
    type Stream: Transport;
    /// Starts a nonblocking connect.
    fn connect(&mut self) -> io::Result<Self::Stream>;
}
