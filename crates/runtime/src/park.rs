//! Parking idle keep-alive connections without a task of their own.
//!
//! A connection that has waited on its client for a moment without a new request gives up its
//! task: its socket and the little state needed to resume it (for the node: its slot, its
//! place in the shedding list, its worker's `Live` handle) go into its worker's [`Parking`],
//! and the task ends. What a parked connection costs is then its table entry, one small waker
//! and the socket's registration with the runtime, instead of a whole task with its future
//! (a connection's future is about 1 KiB, and its task cell is aligned to 128 bytes).
//!
//! The socket stays registered with the runtime's event loop, so parking and resuming make no
//! system call (but a peek when the runtime calls the socket readable, which may be stale):
//! parking polls the socket once with a waker that names the table entry
//! ([`tokio::net::TcpStream::poll_peek`] keeps one waker per socket, no future). When bytes or the client's close arrive, the waker queues the entry's key and
//! wakes the worker's one parking task ([`Parking::run`]), which takes the connection out of
//! the table and hands it back ([`Unparked::Ready`]) to be served by a new task. The same task
//! closes parked connections whose idle deadline passed ([`Unparked::Expired`]; one timer for
//! the whole table, at its earliest deadline) and, on shutdown, all of them
//! ([`Unparked::Shutdown`]).
//!
//! Shedding ([`crate::shed`]) needs nothing more: a parked connection keeps its place in the
//! list, and the shed's `shutdown(SHUT_RD)` makes the socket readable, so it is resumed, reads
//! the end of its input and closes by its ordinary path.
//!
//! The table itself ([`Table`]) is plain data: no I/O and no clock (the caller passes the time
//! in), with stale keys refused by a generation count, so that a late wakeup of an entry that
//! was resumed or closed meanwhile cannot take its slot's next tenant.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Wake, Waker};

use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Names one entry of a [`Table`]; a key outlives its entry harmlessly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    index: u32,
    generation: u32,
}

/// Entries, each with a deadline, in slots reused as entries leave: the decision part of
/// parking, without I/O or clock. `T` is the time (any ordered value the caller passes in).
#[derive(Debug)]
pub struct Table<E, T> {
    slots: Vec<Slot<E, T>>,
    /// Indices of empty slots.
    free: Vec<u32>,
    /// Every entry's deadline, earliest first.
    deadlines: BTreeSet<(T, Key)>,
}

#[derive(Debug)]
struct Slot<E, T> {
    generation: u32,
    entry: Option<(E, T)>,
}

impl<E, T: Ord + Copy> Default for Table<E, T> {
    fn default() -> Self {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            deadlines: BTreeSet::new(),
        }
    }
}

impl<E, T: Ord + Copy> Table<E, T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `entry`, due at `deadline`.
    pub fn insert(&mut self, entry: E, deadline: T) -> Key {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    entry: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.entry = Some((entry, deadline));
        let key = Key {
            index,
            generation: slot.generation,
        };
        self.deadlines.insert((deadline, key));
        key
    }

    /// The entry `key` names, if it is still in the table.
    pub fn get(&self, key: Key) -> Option<&E> {
        let slot = self.slots.get(key.index as usize)?;
        match &slot.entry {
            Some((e, _)) if slot.generation == key.generation => Some(e),
            _ => None,
        }
    }

    /// Take out the entry `key` names; `None` if it left already (the key is stale).
    pub fn remove(&mut self, key: Key) -> Option<E> {
        let slot = self.slots.get_mut(key.index as usize)?;
        if slot.generation != key.generation {
            return None;
        }
        let (entry, deadline) = slot.entry.take()?;
        // The slot's next tenant gets another generation: this key is stale from now on.
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(key.index);
        self.deadlines.remove(&(deadline, key));
        Some(entry)
    }

    /// Take out an entry whose deadline is at or before `now`, the earliest first.
    pub fn pop_expired(&mut self, now: T) -> Option<E> {
        let &(deadline, key) = self.deadlines.first()?;
        if deadline > now {
            return None;
        }
        self.remove(key)
    }

    /// The earliest deadline of the entries in the table.
    pub fn next_deadline(&self) -> Option<T> {
        self.deadlines.first().map(|&(d, _)| d)
    }

    /// Take out every entry, earliest deadline first.
    pub fn drain(&mut self) -> Vec<E> {
        let mut out = Vec::with_capacity(self.len());
        while let Some(&(_, key)) = self.deadlines.first() {
            out.extend(self.remove(key));
        }
        out
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// Whether the table holds no entry.
    pub fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }
}

/// A parked connection: its state, then its socket, so that the state (a place in the
/// shedding list, which must be left before the socket closes) drops first.
struct Parked<S> {
    state: S,
    stream: TcpStream,
}

/// What [`Parking::run`] hands back.
pub enum Unparked<S> {
    /// The client sent bytes or closed (or the connection was shed): serve it again.
    Ready(TcpStream, S),
    /// The idle deadline passed with nothing from the client: close it.
    Expired(TcpStream, S),
    /// The process shuts down: close it.
    Shutdown(TcpStream, S),
}

struct Inner<S> {
    table: Table<Parked<S>, Instant>,
    /// Set on shutdown: nothing is parked any more.
    closed: bool,
}

struct Shared<S> {
    inner: Mutex<Inner<S>>,
    /// Keys whose sockets became readable, for the parking task.
    ready: Mutex<Vec<Key>>,
    /// Wakes the parking task: a key is ready, or an entry with an earlier deadline came in.
    wake: Notify,
}

/// One worker's parked connections (see the module's documentation). Cloning gives another
/// handle to the same table.
pub struct Parking<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for Parking<S> {
    fn clone(&self) -> Self {
        Parking {
            shared: self.shared.clone(),
        }
    }
}

impl<S: Send + 'static> Default for Parking<S> {
    fn default() -> Self {
        Self::new()
    }
}

/// The waker a parked socket holds: it names the socket's entry. It holds the table weakly, so
/// that the table (which holds the socket, which holds the waker) is not kept alive by it.
struct KeyWaker<S> {
    key: Key,
    shared: Weak<Shared<S>>,
}

impl<S: Send + 'static> Wake for KeyWaker<S> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.ready).push(self.key);
            shared.wake.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The table stays consistent whatever panicked while holding it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S: Send + 'static> Parking<S> {
    /// An empty table.
    pub fn new() -> Self {
        Parking {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    table: Table::new(),
                    closed: false,
                }),
                ready: Mutex::new(Vec::new()),
                wake: Notify::new(),
            }),
        }
    }

    /// Park the connection on `stream` with `state` until its client sends or closes, or
    /// `deadline` passes. Given back when the table no longer takes connections (the process
    /// shuts down): the caller closes it.
    pub fn park(
        &self,
        stream: TcpStream,
        state: S,
        deadline: Instant,
    ) -> Result<(), (TcpStream, S)> {
        let mut inner = lock(&self.shared.inner);
        if inner.closed {
            return Err((stream, state));
        }
        let earliest = inner.table.next_deadline().is_none_or(|d| deadline < d);
        let key = inner.table.insert(Parked { state, stream }, deadline);
        let waker = Waker::from(Arc::new(KeyWaker {
            key,
            shared: Arc::downgrade(&self.shared),
        }));
        // The runtime keeps this waker (one per socket, replacing any earlier one) until the
        // socket is readable; if it is already, no waker is kept and the key is queued now.
        // The runtime's readiness can be stale (it is cleared only by a read that finds
        // nothing, and a socket just accepted is reported readable), so it is checked with a
        // peek, which clears it and keeps the waker when the socket holds nothing.
        let ready = inner.table.get(key).is_some_and(|p| {
            let mut byte = [0u8; 1];
            p.stream
                .poll_peek(
                    &mut Context::from_waker(&waker),
                    &mut ReadBuf::new(&mut byte),
                )
                .is_ready()
        });
        drop(inner);
        if ready {
            lock(&self.shared.ready).push(key);
            self.shared.wake.notify_one();
        } else if earliest {
            // The parking task's timer must move up to this deadline.
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Connections parked now.
    pub fn len(&self) -> usize {
        lock(&self.shared.inner).table.len()
    }

    /// Whether no connection is parked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The worker's parking task: hand each connection whose socket became readable to
    /// `unparked` as [`Unparked::Ready`], each whose deadline passed as [`Unparked::Expired`],
    /// until `shutdown` turns true; then every parked connection as [`Unparked::Shutdown`],
    /// and no more are taken. Run one per table, on the runtime its sockets are registered
    /// with; `unparked` runs without the table locked (it may park again).
    pub async fn run(
        &self,
        mut shutdown: watch::Receiver<bool>,
        mut unparked: impl FnMut(Unparked<S>),
    ) {
        let shared = &self.shared;
        loop {
            // Enabled before the queue is read: a wake after the read is not lost.
            let woken = shared.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let keys = std::mem::take(&mut *lock(&shared.ready));
            for key in keys {
                // A stale key (its entry expired or was resumed before) finds nothing.
                let p = lock(&shared.inner).table.remove(key);
                if let Some(p) = p {
                    unparked(Unparked::Ready(p.stream, p.state));
                }
            }
            let now = Instant::now();
            loop {
                let p = lock(&shared.inner).table.pop_expired(now);
                match p {
                    Some(p) => unparked(Unparked::Expired(p.stream, p.state)),
                    None => break,
                }
            }
            let next = lock(&shared.inner).table.next_deadline();
            tokio::select! {
                () = &mut woken => {}
                () = sleep_until(next) => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
        }
        let all = {
            let mut inner = lock(&shared.inner);
            inner.closed = true;
            inner.table.drain()
        };
        for p in all {
            unparked(Unparked::Shutdown(p.stream, p.state));
        }
    }
}

/// Sleep until `at`, or forever without it.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stale_keys_find_nothing_and_slots_are_reused() {
        let mut t: Table<&str, u64> = Table::new();
        let a = t.insert("a", 10);
        let b = t.insert("b", 5);
        assert_eq!(t.len(), 2);
        assert_eq!(t.next_deadline(), Some(5));
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.remove(a), None);
        // `a`'s slot goes to `c`; `a`'s key does not reach it.
        let c = t.insert("c", 7);
        assert_eq!(c.index, a.index);
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(c), Some(&"c"));
        assert_eq!(t.pop_expired(4), None);
        assert_eq!(t.pop_expired(7), Some("b"));
        assert_eq!(t.pop_expired(7), Some("c"));
        assert_eq!(t.pop_expired(100), None);
        assert!(t.is_empty());
        assert_eq!(t.remove(b), None);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u8),
        Remove(usize),
        Advance(u8),
        Drain,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u8>().prop_map(Op::Insert),
            3 => any::<usize>().prop_map(Op::Remove),
            2 => any::<u8>().prop_map(Op::Advance),
            1 => Just(Op::Drain),
        ]
    }

    proptest! {
        /// Against a list of every entry ever inserted: an entry leaves exactly once (removed
        /// by its key, expired, or drained), only while it is in the table; expiry takes
        /// exactly the entries due by now, earliest first; the length and the next deadline
        /// are always the model's.
        #[test]
        fn the_table_behaves_like_its_model(ops in proptest::collection::vec(op(), 1..200)) {
            let mut t: Table<usize, u64> = Table::new();
            // (key, deadline, still in the table)
            let mut model: Vec<(Key, u64, bool)> = Vec::new();
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Insert(d) => {
                        let deadline = now + u64::from(d);
                        let key = t.insert(model.len(), deadline);
                        model.push((key, deadline, true));
                    }
                    Op::Remove(i) if !model.is_empty() => {
                        let i = i % model.len();
                        let got = t.remove(model[i].0);
                        prop_assert_eq!(got, model[i].2.then_some(i));
                        model[i].2 = false;
                    }
                    Op::Remove(_) => {}
                    Op::Advance(by) => {
                        now += u64::from(by);
                        let mut last = 0;
                        while let Some(i) = t.pop_expired(now) {
                            prop_assert!(model[i].2, "entry {} left twice", i);
                            prop_assert!(model[i].1 <= now);
                            prop_assert!(model[i].1 >= last, "not earliest first");
                            last = model[i].1;
                            model[i].2 = false;
                        }
                        prop_assert!(model.iter().all(|m| !m.2 || m.1 > now));
                    }
                    Op::Drain => {
                        let mut got = t.drain();
                        got.sort_unstable();
                        let want: Vec<usize> = (0..model.len()).filter(|&i| model[i].2).collect();
                        prop_assert_eq!(got, want);
                        for m in &mut model {
                            m.2 = false;
                        }
                    }
                }
                let live: Vec<&(Key, u64, bool)> = model.iter().filter(|m| m.2).collect();
                prop_assert_eq!(t.len(), live.len());
                prop_assert_eq!(t.next_deadline(), live.iter().map(|m| m.1).min());
                for (i, m) in model.iter().enumerate() {
                    prop_assert_eq!(t.get(m.0), m.2.then_some(&i));
                }
            }
        }
    }
}
