//! One memfd that holds the bodies of cached objects, each at its own page-aligned offset, so
//! that sendfile(2) can send any of them without a copy through a single descriptor.
//!
//! A memfd per object would cost a descriptor per cached body: a cache of 1 GiB in 20 KiB
//! objects holds 50,000 of them, past the descriptor limit of many hosts, and the node needs
//! its descriptors for connections. Here the objects share one file; which pages each holds is
//! decided by `offset-allocator` (two-level segregated fit, constant time), in pages.
//!
//! The pages of an object that goes are punched out of the file (`FALLOC_FL_PUNCH_HOLE`)
//! before its range is handed out again. That is what makes reuse safe: sendfile queues
//! references to the file's pages on the socket, not copies, and a response may still be in
//! a socket buffer when its object is evicted. A write into the same pages would change the
//! bytes of that response; punched pages leave the file, stay with the socket until it lets
//! them go, and the next object gets fresh ones. Objects start on page boundaries so that no
//! page is shared (a partial page is zeroed in place by a punch, not taken out).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use nix::fcntl::{fallocate, FallocateFlags};
use offset_allocator::{Allocation, Allocator};
use parking_lot::Mutex;

/// Bytes per page of the arena (the kernel's page size).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// The memfd and which of its pages are taken.
#[derive(Debug)]
pub struct Arena {
    file: File,
    page: u64,
    pages: Mutex<Pages>,
}

/// The allocator of the arena's pages and how many objects hold some.
#[derive(Debug)]
struct Pages {
    alloc: Allocator,
    objects: u32,
    max_objects: u32,
}

/// One object's bytes in the [`Arena`]; its pages are given back when it is dropped.
pub struct Slice {
    arena: Arc<Arena>,
    alloc: Allocation,
    len: u64,
}

impl Arena {
    /// An arena of `capacity` bytes (rounded up to pages; the file is sparse, so only the
    /// pages written take memory) for at most `max_objects` objects at a time.
    pub fn new(capacity: u64, max_objects: u32) -> io::Result<Arc<Arena>> {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let page = page_size();
        let pages = capacity.div_ceil(page).clamp(1, u64::from(u32::MAX) - 1);
        let fd = memfd_create(c"switchyard-objects", MFdFlags::MFD_CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(pages * page)?;
        // The allocator keeps a node per taken range and per free one between them: twice
        // as many as objects, and one more. Its limit stays below its index type's largest.
        let max_objects = max_objects.clamp(1, u32::MAX / 2 - 2);
        let nodes = 2 * max_objects + 1;
        Ok(Arc::new(Arena {
            file,
            page,
            pages: Mutex::new(Pages {
                alloc: Allocator::with_max_allocs(pages as u32, nodes),
                objects: 0,
                max_objects,
            }),
        }))
    }

    /// Copy `bytes` into the arena; `Ok(None)` when no range of that many pages is free (or
    /// the arena holds as many objects as it may), and the caller keeps them another way.
    pub fn store(self: &Arc<Self>, bytes: &[u8]) -> io::Result<Option<Slice>> {
        let len = bytes.len() as u64;
        let Ok(pages) = u32::try_from(self.charge(len) / self.page) else {
            return Ok(None);
        };
        let alloc = {
            let mut p = self.pages.lock();
            if p.objects == p.max_objects {
                return Ok(None);
            }
            let Some(alloc) = p.alloc.allocate(pages) else {
                return Ok(None);
            };
            p.objects += 1;
            alloc
        };
        // Owned from here: an error below gives the pages back.
        let slice = Slice {
            arena: self.clone(),
            alloc,
            len,
        };
        self.file.write_all_at(bytes, slice.offset())?;
        Ok(Some(slice))
    }

    /// Bytes the arena's objects take, in whole pages, for an object of `len` bytes.
    pub fn charge(&self, len: u64) -> u64 {
        len.div_ceil(self.page).max(1) * self.page
    }
}

impl std::fmt::Debug for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slice")
            .field("offset", &self.offset())
            .field("len", &self.len)
            .finish()
    }
}

impl Slice {
    /// The arena's file, to send from with sendfile at [`offset`](Self::offset).
    pub fn file(&self) -> &File {
        &self.arena.file
    }

    /// Where the object starts in the file.
    pub fn offset(&self) -> u64 {
        u64::from(self.alloc.offset) * self.arena.page
    }

    /// The object's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The memory the object holds: its length in whole pages.
    pub fn charge(&self) -> u64 {
        self.arena.charge(self.len)
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the object's bytes.
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let mut v = vec![0; self.len as usize];
        self.arena.file.read_exact_at(&mut v, self.offset())?;
        Ok(v)
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        let a = &self.arena;
        let pages = a.pages.lock().alloc.allocation_size(self.alloc);
        let punched = fallocate(
            &a.file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            self.offset() as i64,
            (u64::from(pages) * a.page) as i64,
        );
        match punched {
            Ok(()) => {
                let mut p = a.pages.lock();
                p.alloc.free(self.alloc);
                p.objects -= 1;
            }
            // Pages that cannot be taken out of the file are never written again (a response
            // may still read them): the range stays taken.
            Err(e) => {
                tracing::warn!(error = %e, offset = self.offset(), "cannot free an object's pages")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    use super::*;

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn objects_go_in_and_come_out_whole() {
        let arena = Arena::new(1 << 20, 64).unwrap();
        let page = page_size();
        let a = arena.store(&bytes(10_000, 1)).unwrap().unwrap();
        let b = arena.store(&bytes(1, 2)).unwrap().unwrap();
        let c = arena.store(&bytes(3 * page as usize, 3)).unwrap().unwrap();
        assert_eq!(a.to_vec().unwrap(), bytes(10_000, 1));
        assert_eq!(b.to_vec().unwrap(), bytes(1, 2));
        assert_eq!(c.to_vec().unwrap(), bytes(3 * page as usize, 3));
        // Each on its own pages.
        let mut at = [
            (a.offset(), a.len()),
            (b.offset(), b.len()),
            (c.offset(), c.len()),
        ];
        at.sort();
        for w in at.windows(2) {
            assert_eq!(w[0].0 % page, 0);
            assert!(w[0].0 + arena.charge(w[0].1) <= w[1].0, "{at:?}");
        }
        assert_eq!(arena.charge(10_000), 3 * page);
        assert_eq!(arena.charge(1), page);
    }

    #[test]
    fn a_full_arena_says_so_and_takes_objects_again_once_some_go() {
        let page = page_size() as usize;
        let arena = Arena::new(4 * page as u64, 64).unwrap();
        let a = arena.store(&bytes(3 * page, 1)).unwrap().unwrap();
        assert!(arena.store(&bytes(2 * page, 2)).unwrap().is_none());
        drop(a);
        let b = arena.store(&bytes(4 * page, 2)).unwrap().unwrap();
        assert_eq!(b.to_vec().unwrap(), bytes(4 * page, 2));
        // At most `max_objects` at a time.
        let few = Arena::new(1 << 20, 2).unwrap();
        let kept: Vec<_> = (0..2).map(|i| few.store(&bytes(10, i)).unwrap()).collect();
        assert!(kept.iter().all(Option::is_some));
        assert!(few.store(&bytes(10, 9)).unwrap().is_none());
    }

    /// The pages of a dropped object that a socket still holds (sent with sendfile, not yet
    /// read by the peer) keep their bytes when the range is reused: the peer reads the old
    /// object, not the new one written in its place.
    #[test]
    fn a_response_in_flight_keeps_its_bytes_when_its_pages_are_reused() {
        let arena = Arena::new(1 << 20, 64).unwrap();
        let len = 4 * page_size() as usize;
        let old = arena.store(&bytes(len, 1)).unwrap().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        let mut off = old.offset() as i64;
        let sent =
            nix::sys::sendfile::sendfile64(sender.as_fd(), old.file().as_fd(), Some(&mut off), len)
                .unwrap();
        assert_eq!(sent, len, "the whole object fits in the socket buffers");
        let at = old.offset();
        drop(old);
        let new = arena.store(&bytes(len, 2)).unwrap().unwrap();
        assert_eq!(new.offset(), at, "the freed range is the one reused");
        sender.flush().unwrap();
        drop(sender);
        let mut got = Vec::new();
        receiver.read_to_end(&mut got).unwrap();
        assert!(got == bytes(len, 1), "the response in flight changed");
        assert_eq!(new.to_vec().unwrap(), bytes(len, 2));
    }
}
