//! Socket calls the connection drivers share (the target's, the
//! initiator's, the probes'): the TCP options both ends set, and a
//! non-blocking `recv(2)` into a buffer's spare room. The wire format
//! (`iscsi_wire`) does no I/O; this is where its bytes meet the socket.
//!
//! **Congestion control.** iSCSI runs over LANs and loopback, where the
//! round trip is tens of microseconds and traffic is bursts of requests and
//! replies. A pacing congestion control such as BBR (the kernel default on
//! some distributions) spaces out every burst at its estimate of the path's
//! bandwidth, and an application-limited flow keeps that estimate low: on
//! loopback, 128 KiB replies at queue depth 8 ran at 2.7–3.1 GB/s under BBR
//! and 4.2–5.4 GB/s under CUBIC, which sends what the window allows at once
//! (docs/PERFORMANCE.md, "What makes it fast"). So connections ask for
//! [`DEFAULT_CONGESTION`] unless configured otherwise; "system" keeps the
//! kernel's default (`net.ipv4.tcp_congestion_control`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The congestion control connections ask for by default.
pub const DEFAULT_CONGESTION: &str = "cubic";

/// The name that keeps the kernel's default congestion control.
pub const SYSTEM_CONGESTION: &str = "system";

/// Longest algorithm name the kernel accepts (TCP_CA_NAME_MAX is 16, with
/// the terminating NUL).
const NAME_MAX: usize = 15;

/// Checks a configured congestion control name: [`SYSTEM_CONGESTION`], or
/// 1 to 15 ASCII letters, digits, `_` or `-` (whether the kernel has it is
/// known only when a socket asks).
pub fn check_congestion_name(name: &str) -> Result<(), String> {
    if name == SYSTEM_CONGESTION {
        return Ok(());
    }
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(format!(
            "congestion control {name:?}: 1 to {NAME_MAX} characters, or \"{SYSTEM_CONGESTION}\""
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "congestion control {name:?}: letters, digits, '_' and '-' only"
        ));
    }
    Ok(())
}

/// Sets the socket's congestion control to `name` (`TCP_CONGESTION`);
/// [`SYSTEM_CONGESTION`] leaves it alone. Fails (`ENOENT`) when the kernel
/// has no such algorithm, or (`EPERM`) when an unprivileged process asks
/// for one not in `net.ipv4.tcp_allowed_congestion_control`.
pub fn set_congestion(sock: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    if name == SYSTEM_CONGESTION {
        return Ok(());
    }
    check_congestion_name(name).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    // SAFETY: the descriptor is borrowed for the call, and the option value
    // is `name.len()` readable bytes (the kernel copies at most that many).
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The socket's congestion control, as the kernel names it.
pub fn congestion(sock: BorrowedFd<'_>) -> io::Result<String> {
    let mut buf = [0u8; NAME_MAX + 1];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is `len` writable bytes and `len` a valid pointer; the
    // kernel writes at most `len` bytes and stores the length it wrote.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let got = &buf[..(len as usize).min(buf.len())];
    let end = got.iter().position(|&b| b == 0).unwrap_or(got.len());
    Ok(String::from_utf8_lossy(&got[..end]).into_owned())
}

/// One `recv(2)` with `flags` into the spare room of `buf` (its
/// [`bytes::BufMut::chunk_mut`]), which then advances by what came:
/// received straight where the bytes are going, never through a buffer of
/// our own. `Ok(0)` at end of stream (or when `buf` has no room).
pub fn recv_into(
    sock: BorrowedFd<'_>,
    buf: &mut impl bytes::BufMut,
    flags: libc::c_int,
) -> io::Result<usize> {
    let room = buf.chunk_mut();
    // SAFETY: recv(2) writes at most `room.len()` bytes at the pointer,
    // which is valid spare room of `buf` (writing uninitialised memory is
    // fine), and `sock` is an open descriptor for the call.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            room.as_mut_ptr().cast(),
            room.len(),
            flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: recv(2) initialised those `n` bytes, within the spare room.
    unsafe { buf.advance_mut(n as usize) };
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn names_are_checked_before_any_socket_sees_them() {
        assert!(check_congestion_name("cubic").is_ok());
        assert!(check_congestion_name("system").is_ok());
        assert!(check_congestion_name("").is_err());
        assert!(check_congestion_name("a-name-far-too-long").is_err());
        assert!(check_congestion_name("cu bic").is_err());
        assert!(check_congestion_name("cubic\0").is_err());
    }

    #[test]
    fn a_connection_takes_the_algorithm_asked_for() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let before = congestion(s.as_fd()).unwrap();
        set_congestion(s.as_fd(), SYSTEM_CONGESTION).unwrap();
        assert_eq!(
            congestion(s.as_fd()).unwrap(),
            before,
            "system keeps the default"
        );
        // reno is built into every Linux kernel.
        set_congestion(s.as_fd(), "reno").unwrap();
        assert_eq!(congestion(s.as_fd()).unwrap(), "reno");
        let e = set_congestion(s.as_fd(), "no_such_cc").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(
            congestion(s.as_fd()).unwrap(),
            "reno",
            "a refused name changes nothing"
        );
    }
}
