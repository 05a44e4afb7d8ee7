//! Same-host handoff without privileges: a client socket and the bytes
//! already read travel over a Unix socket (SCM_RIGHTS); the receiver serves
//! the client on it directly.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use switchyard_handoff::fdpass::{recv_with_fds, send_with_fd, FdConn};
use switchyard_handoff::proto::{Message, Transfer};

fn create(id: u64, pre: &[u8]) -> Message {
    Message::Create {
        id,
        client: "127.0.0.1:1".parse().unwrap(),
        local: "127.0.0.1:2".parse().unwrap(),
        transfer: Transfer::Fd,
        preread: pre.to_vec(),
        route: switchyard_handoff::proto::Routing::Own,
    }
}

#[tokio::test]
async fn client_socket_moves_to_another_task_and_is_served_there() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    });
    let (mut accepted, peer) = listener.accept().unwrap();
    let mut pre = [0u8; 64];
    let n = accepted.read(&mut pre).unwrap();

    let (sw, node) = FdConn::pair().unwrap();
    let (_sw_rx, mut sw_tx) = sw.split();
    let (mut node_rx, mut node_tx) = node.split();
    let m = Message::Create {
        id: 9,
        client: peer,
        local: addr,
        transfer: Transfer::Fd,
        preread: pre[..n].to_vec(),
        route: switchyard_handoff::proto::Routing::Own,
    };
    sw_tx.send(&m, Some(accepted.as_fd())).await.unwrap();
    drop(accepted); // the switch's copy; the node holds its own now

    let (got, fd) = tokio::time::timeout(Duration::from_secs(5), node_rx.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Message::Create { id, preread, .. } = got else {
        panic!()
    };
    assert_eq!(id, 9);
    assert!(preread.starts_with(b"GET / HTTP/1.1"));
    let mut s = std::net::TcpStream::from(fd.unwrap());
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        .unwrap();
    drop(s);
    node_tx
        .send(
            &Message::Closed {
                id,
                requests: 1,
                bytes: 5,
            },
            None,
        )
        .await
        .unwrap();
    assert!(client.join().unwrap().ends_with("hello"));
}

#[tokio::test]
async fn many_frames_with_and_without_descriptors_keep_their_order() {
    let (a, b) = FdConn::pair().unwrap();
    let (ar, mut at) = a.split();
    let (mut br, _bt) = b.split();
    let files: Vec<std::fs::File> = (0..50).map(|_| tempfile::tempfile().unwrap()).collect();
    let sender = tokio::spawn(async move {
        for (i, f) in files.iter().enumerate() {
            // a big pre-read makes frames span several reads
            let pre = vec![i as u8; (i * 997) % 70_000];
            at.send(&create(i as u64, &pre), Some(f.as_fd()))
                .await
                .unwrap();
            at.send(&Message::Ping { nonce: i as u64 }, None)
                .await
                .unwrap();
        }
        files
    });
    for i in 0..50u64 {
        let (m, fd) = br.recv().await.unwrap().unwrap();
        assert_eq!(m.id(), Some(i));
        let fd: OwnedFd = fd.expect("descriptor with its frame");
        // the descriptor is a real, open file
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        let (m, fd) = br.recv().await.unwrap().unwrap();
        assert_eq!(m, Message::Ping { nonce: i });
        assert!(fd.is_none());
    }
    sender.await.unwrap();
    drop(ar); // the socket closes when both halves are gone
              // clean end of stream
    assert!(br.recv().await.unwrap().is_none());
}

#[tokio::test]
async fn wrong_descriptor_use_is_refused() {
    let (a, _b) = FdConn::pair().unwrap();
    let (_r, mut t) = a.split();
    let f = tempfile::tempfile().unwrap();
    assert!(t.send(&create(1, b""), None).await.is_err());
    assert!(t
        .send(&Message::Ping { nonce: 1 }, Some(f.as_fd()))
        .await
        .is_err());
}

#[tokio::test]
async fn frame_needing_a_descriptor_that_arrives_without_one_is_an_error() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let frame = create(1, b"x").to_frame().unwrap();
    // raw write: the frame without its descriptor
    send_with_fd(a.as_raw_fd(), &frame, None).unwrap();
    b.set_nonblocking(true).unwrap();
    let (mut r, _t) = FdConn::new(tokio::net::UnixStream::from_std(b).unwrap()).split();
    assert!(r.recv().await.is_err());
}

#[tokio::test]
async fn truncated_stream_is_an_error_and_garbage_is_refused() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let frame = Message::Ping { nonce: 3 }.to_frame().unwrap();
    send_with_fd(a.as_raw_fd(), &frame[..5], None).unwrap();
    drop(a);
    b.set_nonblocking(true).unwrap();
    let (mut r, _t) = FdConn::new(tokio::net::UnixStream::from_std(b).unwrap()).split();
    assert!(r.recv().await.is_err());

    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    send_with_fd(a.as_raw_fd(), b"GET / HTTP/1.1\r\n\r\n", None).unwrap();
    b.set_nonblocking(true).unwrap();
    let (mut r, _t) = FdConn::new(tokio::net::UnixStream::from_std(b).unwrap()).split();
    assert!(r.recv().await.is_err());
}

#[test]
fn blocking_helpers_pass_a_descriptor_with_the_first_byte() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let f = tempfile::tempfile().unwrap();
    assert_eq!(
        send_with_fd(a.as_raw_fd(), b"abc", Some(f.as_fd())).unwrap(),
        3
    );
    send_with_fd(a.as_raw_fd(), b"def", None).unwrap();
    let mut fds = std::collections::VecDeque::new();
    let mut buf = [0u8; 16];
    let n = recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap();
    assert!(n >= 3);
    assert_eq!(fds.len(), 1);
}

#[tokio::test]
async fn msg_reader_and_writer_over_tcp() {
    use switchyard_handoff::fdpass::{MsgReader, MsgWriter};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let c = tokio::spawn(async move {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_r, w) = s.into_split();
        let mut w = MsgWriter::new(w);
        for i in 0..100 {
            w.send(&Message::Closed {
                id: i,
                requests: i,
                bytes: i * 10,
            })
            .await
            .unwrap();
        }
        assert!(
            w.send(&create(1, b"")).await.is_err(),
            "no descriptors over TCP"
        );
    });
    let (s, _) = l.accept().await.unwrap();
    let mut r = MsgReader::new(s);
    for i in 0..100 {
        assert_eq!(r.recv().await.unwrap().unwrap().id(), Some(i));
    }
    c.await.unwrap();
    assert!(r.recv().await.unwrap().is_none());
}

#[tokio::test]
async fn batches_arrive_in_order_and_a_bad_frame_spoils_only_itself() {
    use switchyard_handoff::proto::DropReason;
    let (a, b) = FdConn::pair().unwrap();
    let (_a_rx, mut a_tx) = a.split();
    let (mut b_rx, _b_tx) = b.split();
    let batch = [
        Message::Accepted { id: 1 },
        Message::Served {
            id: 1,
            status: 200,
            bytes: 10,
            from_cache: false,
        },
        // Too long a detail: cannot be encoded.
        Message::Drop {
            id: 2,
            reason: DropReason::Other,
            detail: "x".repeat(5000),
        },
        Message::Closed {
            id: 1,
            requests: 1,
            bytes: 10,
        },
        // Needs a descriptor: not in a batch.
        create(3, b""),
    ];
    assert!(a_tx.send_many(&batch).await.is_err());
    for want in [&batch[0], &batch[1], &batch[3]] {
        let (m, fd) = b_rx.recv().await.unwrap().unwrap();
        assert_eq!(&m, want);
        assert!(fd.is_none());
    }
    a_tx.send_many(&[Message::Ping { nonce: 7 }]).await.unwrap();
    assert_eq!(
        b_rx.recv().await.unwrap().unwrap().0,
        Message::Ping { nonce: 7 }
    );
}

/// A sink written to without waiting keeps what the socket does not take and writes it later:
/// frames arrive in order, each descriptor with its own frame (told apart by file size), also
/// when the backlog spans several frames with descriptors.
#[tokio::test]
async fn a_sink_keeps_its_backlog_in_order_with_each_descriptor_on_its_frame() {
    use std::io::Write as _;
    use switchyard_handoff::fdpass::{control_unix, ControlSink};
    let (a, b) = tokio::net::UnixStream::pair().unwrap();
    let (ar, aw) = control_unix(a);
    let (mut br, _bw) = control_unix(b);
    let mut sink = ControlSink::new(aw);
    let mut backlog = false;
    for i in 0..50u64 {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0; i as usize + 1]).unwrap();
        // big pre-reads fill the socket long before the last frame
        let pre = vec![i as u8; (i as usize * 997) % 70_000];
        let all = sink.send(&create(i, &pre), Some(OwnedFd::from(f))).unwrap();
        backlog |= !all;
        sink.send(&Message::Ping { nonce: i }, None).unwrap();
    }
    assert!(
        backlog,
        "the socket took everything at once: nothing was tested"
    );
    // Bad frames leave nothing behind.
    assert!(sink
        .send(
            &Message::Ping { nonce: 0 },
            Some(OwnedFd::from(tempfile::tempfile().unwrap()))
        )
        .is_err());
    let ready = sink.ready();
    let flusher = tokio::spawn(async move {
        while !sink.try_flush().unwrap() {
            ready.writable().await.unwrap();
        }
        assert!(sink.is_flushed());
        sink
    });
    for i in 0..50u64 {
        let (m, fd) = br.recv().await.unwrap().unwrap();
        assert_eq!(m.id(), Some(i));
        let fd: OwnedFd = fd.expect("descriptor with its frame");
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_size, i as i64 + 1, "descriptor of frame {i}");
        let (m, fd) = br.recv().await.unwrap().unwrap();
        assert_eq!(m, Message::Ping { nonce: i });
        assert!(fd.is_none());
    }
    drop(flusher.await.unwrap());
    drop(ar); // the socket closes when both halves are gone
    assert!(br.recv().await.unwrap().is_none());
}
