//! The listening sockets, bound at start-up before the loop exists (a
//! bind failure is fatal, exit 1, with the flag named by the caller).
//!
//! In: the configured listen addresses. Out: bound, nonblocking std
//! listeners, handed to [`super::EventLoop::new`]. Always holds:
//! `SO_REUSEADDR` (a restart never waits for TIME_WAIT), backlog
//! [`BACKLOG`], and `:port` is `[::]` dual-stack, or `0.0.0.0` where the
//! host has no IPv6.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

use crate::config::ListenAddr;

/// The listen backlog: new connections wait here while the gate is closed.
pub const BACKLOG: i32 = 4096;

/// Listeners bound at start-up (`None`: disabled by an empty address).
pub struct Listeners {
    pub agent: Option<TcpListener>,
    pub monitoring: Option<TcpListener>,
    pub pprof: Option<TcpListener>,
    pub devkv: Option<TcpListener>,
}

/// Binds a listener: `SO_REUSEADDR`, nonblocking, backlog [`BACKLOG`];
/// `:port` is `[::]` dual-stack, or `0.0.0.0` where IPv6 is absent.
pub fn bind(addr: &ListenAddr) -> io::Result<TcpListener> {
    match addr {
        ListenAddr::Addr(sa) => bind_one(*sa, false),
        ListenAddr::AnyDualStack(port) => {
            match bind_one(SocketAddr::from((Ipv6Addr::UNSPECIFIED, *port)), true) {
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL)
                    ) =>
                {
                    bind_one(SocketAddr::from((Ipv4Addr::UNSPECIFIED, *port)), false)
                }
                bound => bound,
            }
        }
    }
}

fn bind_one(sa: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    if dual_stack {
        s.set_only_v6(false)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&sa.into())?;
    s.listen(BACKLOG)?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_nonblocking_on_the_asked_address() {
        let l = bind(&ListenAddr::Addr("127.0.0.1:0".parse().unwrap())).unwrap();
        let at = l.local_addr().unwrap();
        assert!(at.ip().is_loopback() && at.port() != 0);
        let e = l.accept().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "nonblocking");
    }

    #[test]
    fn any_address_listens_on_every_family_it_can() {
        let l = bind(&ListenAddr::AnyDualStack(0)).unwrap();
        assert!(l.local_addr().unwrap().ip().is_unspecified());
    }
}
