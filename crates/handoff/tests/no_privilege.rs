//! Without CAP_NET_ADMIN: TCP_REPAIR is refused with a clear error (the
//! switch then relays), while the same-host handoff (SCM_RIGHTS) works.
//! The test drops every effective capability on its own thread, so it means
//! the same as root or not.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};

use switchyard_handoff::fdpass::{recv_with_fds, send_with_fd};
use switchyard_handoff::proto::{Message, Transfer};
use switchyard_handoff::repair::{self, RepairState};
use switchyard_handoff::HandoffError;

/// Clears the calling thread's effective capabilities (capset(2) acts per
/// thread).
fn drop_effective_caps() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset with the v3 header and two data words.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()), 0);
        d[0].effective = 0;
        d[1].effective = 0;
        assert_eq!(libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()), 0);
    }
}

#[test]
fn repair_without_cap_net_admin_is_a_clear_error_and_fd_passing_works() {
    std::thread::spawn(|| {
        drop_effective_caps();
        let e = repair::check_capability().unwrap_err();
        assert!(matches!(e, HandoffError::NoPrivilege { .. }), "{e}");
        assert!(e.to_string().contains("CAP_NET_ADMIN"), "{e}");
        let e = repair::restore(
            &RepairState::default(),
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        )
        .unwrap_err();
        assert!(e.is_no_privilege(), "{e}");

        // dump of a live connection fails cleanly and leaves it usable
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert!(repair::dump(s.as_fd()).unwrap_err().is_no_privilege());
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();

        // same-host handoff: pass the accepted socket over a Unix socket
        let (a, z) = std::os::unix::net::UnixStream::pair().unwrap();
        let frame = Message::Create {
            id: 1,
            client: c.local_addr().unwrap(),
            local: s.local_addr().unwrap(),
            transfer: Transfer::Fd,
            preread: b.to_vec(),
            route: switchyard_handoff::proto::Routing::Own,
        }
        .to_frame()
        .unwrap();
        assert_eq!(
            send_with_fd(a.as_raw_fd(), &frame, Some(s.as_fd())).unwrap(),
            frame.len()
        );
        drop(s);
        let mut fds = std::collections::VecDeque::new();
        let mut buf = vec![0u8; 4096];
        let n = recv_with_fds(z.as_raw_fd(), &mut buf, &mut fds).unwrap();
        let (m, _) = Message::decode(&buf[..n]).unwrap().unwrap();
        assert!(m.needs_fd());
        let mut moved = std::net::TcpStream::from(fds.pop_front().unwrap());
        moved.write_all(b"pong").unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"pong");
    })
    .join()
    .unwrap();
}
