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

/// What the two kinds of buffer have in common here.
trait Buffer: Default {
    fn room(&self) -> usize;
    fn empty(&mut self);
}

impl Buffer for BytesMut {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn empty(&mut self) {
        self.clear()
    }
}

impl Buffer for Vec<u8> {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn empty(&mut self) {
        self.clear()
    }
}

fn take<B: Buffer>(list: fn(&mut Spare) -> &mut Vec<B>) -> B {
    SPARE
        .try_with(|s| list(&mut s.borrow_mut()).pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn give<B: Buffer>(mut b: B, list: fn(&mut Spare) -> &mut Vec<B>) {
    if b.room() == 0 || b.room() > MAX_CAPACITY {
        return;
    }
    b.empty();
    // (At thread exit the list is gone: the buffer is freed.)
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        let l = list(&mut s);
        if l.len() < KEEP {
            l.push(b);
        }
    });
}

/// An empty read buffer, with room if one was given back on this thread.
pub fn take_bytes() -> BytesMut {
    take(|s| &mut s.bytes)
}

/// Keep `b`'s memory for the next [`take_bytes`] on this thread (its content is dropped).
pub fn give_bytes(b: BytesMut) {
    give(b, |s| &mut s.bytes)
}

/// An empty output buffer, with room if one was given back on this thread.
pub fn take_vec() -> Vec<u8> {
    take(|s| &mut s.vecs)
}

/// Keep `v`'s memory for the next [`take_vec`] on this thread (its content is dropped).
pub fn give_vec(v: Vec<u8>) {
    give(v, |s| &mut s.vecs)
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
