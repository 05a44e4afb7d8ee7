//! Buffers that connections give up when they go idle, kept on their thread for the next
//! request to take.
//!
//! An idle keep-alive connection holds no buffers, so that thousands of them cost little. So
//! every request of a busy connection took its buffers anew and freed them at its next wait:
//! the client read buffer (4 KiB), the read buffer of a pooled connection to a node (16 KiB)
//! and the switch's output buffers, four allocations of sizes the allocator serves on its
//! slower path, about 700 instructions per relayed request. Given back here, they are taken
//! by the next request on the same thread at the cost of a thread-local push and pop. At most
//! [`KEEP`] of each kind are kept per thread, none over [`MAX_CAPACITY`] bytes, so an idle
//! thread holds at most about 2 MiB of them. This is the buffer pool of HAProxy and nginx,
//! small enough not to need a crate.

use std::cell::RefCell;

use bytes::BytesMut;

/// Buffers of each kind kept per thread.
pub const KEEP: usize = 32;

/// Buffers grown larger than this (by an unusual head or body) are freed, not kept.
pub const MAX_CAPACITY: usize = 32 * 1024;

struct Spare {
    bytes: Vec<BytesMut>,
    vecs: Vec<Vec<u8>>,
}

thread_local! {
    static SPARE: RefCell<Spare> = const {
        RefCell::new(Spare {
            bytes: Vec::new(),
            vecs: Vec::new(),
        })
    };
}

/// An empty read buffer, with room if one was given back on this thread.
pub fn take_bytes() -> BytesMut {
    SPARE
        .try_with(|s| s.borrow_mut().bytes.pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keep `b`'s memory for the next [`take_bytes`] on this thread (its content is dropped).
pub fn give_bytes(mut b: BytesMut) {
    if b.capacity() == 0 || b.capacity() > MAX_CAPACITY {
        return;
    }
    b.clear();
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.bytes.len() < KEEP {
            s.bytes.push(b);
        }
    });
}

/// An empty output buffer, with room if one was given back on this thread.
pub fn take_vec() -> Vec<u8> {
    SPARE
        .try_with(|s| s.borrow_mut().vecs.pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keep `v`'s memory for the next [`take_vec`] on this thread (its content is dropped).
pub fn give_vec(mut v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > MAX_CAPACITY {
        return;
    }
    v.clear();
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.vecs.len() < KEEP {
            s.vecs.push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Given buffers come back empty with their room, on their own thread only, up to
    /// `KEEP`; oversized and empty ones are not kept.
    #[test]
    fn buffers_come_back_empty_on_their_thread_up_to_the_limit() {
        let mut b = BytesMut::with_capacity(4096);
        b.extend_from_slice(b"left over");
        give_bytes(b);
        let b = take_bytes();
        assert!(b.is_empty());
        assert!(b.capacity() >= 4096);
        assert_eq!(take_bytes().capacity(), 0, "one given, one taken");

        give_vec(Vec::with_capacity(MAX_CAPACITY + 1));
        give_vec(Vec::new());
        assert_eq!(take_vec().capacity(), 0);

        for _ in 0..KEEP + 5 {
            give_vec(b"x".repeat(100));
        }
        std::thread::spawn(|| assert_eq!(take_vec().capacity(), 0))
            .join()
            .unwrap();
        let mut kept = 0;
        while take_vec().capacity() > 0 {
            kept += 1;
        }
        assert_eq!(kept, KEEP);
    }
}
