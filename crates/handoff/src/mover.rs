//! The sending side of a handoff: one connection offered to a taker, as a
//! state machine with time passed in (no I/O, no clock), and a thin async
//! driver ([`drive`]) that runs it on tokio's clock.
//!
//! The mover is the same for every sender: the switch handing a client's
//! connection to a node, passing on a connection a node gave back, and a
//! node moving a connection to another node. Whoever runs it has sent a
//! `Create` for the connection (with the descriptor or the `TCP_REPAIR`
//! state) and still holds a copy it could serve from (the original socket
//! in repair mode, the original descriptor, or the dumped state).
//!
//! # No connection is served twice
//!
//! The copy left with the sender is the danger: if the sender serves it
//! while the taker serves its own, the client gets two answers on one byte
//! stream. The mover therefore gives the connection back to its sender
//! ([`Outcome::TakeBack`]) only on a *definitive* answer that the taker will
//! never serve it, and otherwise either leaves it to the taker
//! ([`Outcome::Moved`]) or gives it up ([`Outcome::Abandon`]): the sender
//! closes its copy without writing and never serves it.
//!
//! The argument rests on three promises of the taker ([`crate::taker`],
//! 1 to 3) and one of the control stream (4):
//!
//! 1. a taker answers each `Create` exactly once, `Accepted` or `Drop`;
//! 2. a taker serves a connection only after its `Accepted` has been
//!    written to the control stream; a connection answered `Drop` (or never
//!    answered) is never served;
//! 3. on a `Cancel` for a `Create` it has not answered yet, a taker answers
//!    `Drop` with [`DropReason::Cancelled`]; on a `Cancel` for one it has
//!    answered it does nothing (its answer is already in the stream);
//! 4. the control stream is ordered and, when it ends cleanly (end of
//!    stream; for a Unix socket also a reset, which a dead peer's socket
//!    reports only after everything that peer wrote has been read), every
//!    frame the taker wrote has been read.
//!
//! From these: a `Drop` for the id means the taker will not serve it (2), so
//! taking back is safe. An `Accepted` means it will, so the sender must not.
//! A clean end of the stream before any answer means the taker wrote none
//! (4), so it serves nothing (2): taking back is safe. A timeout proves
//! nothing — the taker may be slow, not gone — so the mover sends `Cancel`
//! and waits again: the next answer (late `Accepted`, or `Drop`) is definitive
//! by (1) and (3). When even that answer does not come in time, or the stream
//! fails with an error that may have lost frames (a TCP reset, a frame that
//! does not decode, a failed write), nothing is known, and the mover
//! abandons the connection: the client loses it, but it is never served by
//! two processes. Safety over liveness.
//!
//! Only one answer is ever needed: every event ends the offer (see
//! [`Mover::handle`]); later ones (a `Drop` for an accepted connection that
//! broke afterwards, a duplicate) are the sender's ordinary bookkeeping, not
//! the mover's.
//!
//! A timer expiry that would end the offer must be *fenced* against an
//! answer already read but not yet delivered to the mover: [`drive`] calls
//! its `withdraw` hook first, and if an answer is already on its way, it
//! waits for that answer instead of abandoning.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::proto::{DropReason, Message};

/// How long a mover waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoverConfig {
    /// From the `Create` to the answer before the mover cancels.
    pub answer_timeout: Duration,
    /// From the `Cancel` to the answer before the mover abandons.
    pub cancel_timeout: Duration,
}

impl MoverConfig {
    /// The same wait for the answer and for the answer to the `Cancel`.
    pub fn symmetric(timeout: Duration) -> Self {
        MoverConfig {
            answer_timeout: timeout,
            cancel_timeout: timeout,
        }
    }
}

/// What happened that the mover must know about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The taker answered `Accepted`.
    Accepted,
    /// The taker answered `Drop`.
    Dropped(DropReason),
    /// The `Create` never left: the control link was down when it was to be
    /// queued, or the frame could not be encoded.
    NotSent,
    /// The control stream ended cleanly before an answer: everything the
    /// taker wrote has been read.
    ControlEnded,
    /// The control stream failed in a way that may have lost the taker's
    /// frames (or a frame of ours may have reached it in part or whole).
    ControlFailed,
}

/// Why the sender serves the connection itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeBackReason {
    /// The `Create` never reached the taker.
    NotSent,
    /// The taker answered `Drop` in time.
    Refused(DropReason),
    /// The taker did not answer in time; it answered the `Cancel` (or the
    /// `Create`, late) with `Drop`.
    Cancelled(DropReason),
    /// The control stream ended cleanly without an answer.
    ControlEnded,
}

/// Why the connection is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonReason {
    /// No answer to the `Create` nor to the `Cancel`.
    CancelTimeout,
    /// The control stream failed before an answer.
    ControlFailed,
}

impl AbandonReason {
    /// A short name for metrics.
    pub fn label(self) -> &'static str {
        match self {
            AbandonReason::CancelTimeout => "cancel_timeout",
            AbandonReason::ControlFailed => "control_failed",
        }
    }
}

/// How an offer ended; exactly one per mover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The taker serves the connection; the sender closes its copy without
    /// writing (`late`: the `Accepted` came after the `Cancel` was sent).
    Moved {
        /// Accepted after the answer timeout.
        late: bool,
    },
    /// The taker will never serve it: the sender serves the connection.
    TakeBack(TakeBackReason),
    /// Unknown whether the taker serves it: the sender closes its copy
    /// without writing and never serves it.
    Abandon(AbandonReason),
}

impl Outcome {
    /// Whether the taker may serve the connection.
    pub fn taker_may_serve(self) -> bool {
        !matches!(self, Outcome::TakeBack(_))
    }

    /// Whether the sender serves the connection.
    pub fn sender_serves(self) -> bool {
        matches!(self, Outcome::TakeBack(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `Create` sent; waiting for its answer until the deadline.
    Waiting {
        deadline: Instant,
    },
    /// `Cancel` sent; waiting for the one answer until the deadline.
    Cancelling {
        deadline: Instant,
    },
    Done(Outcome),
}

/// One connection being offered to a taker.
#[derive(Debug)]
pub struct Mover {
    id: u64,
    cfg: MoverConfig,
    started: Instant,
    state: State,
    /// A `Cancel` to send.
    cancel: bool,
}

impl Mover {
    /// The `Create` for connection `id` was handed to the control link at
    /// `now`.
    pub fn new(id: u64, cfg: MoverConfig, now: Instant) -> Mover {
        Mover {
            id,
            cfg,
            started: now,
            state: State::Waiting {
                deadline: now + cfg.answer_timeout,
            },
            cancel: false,
        }
    }

    /// The connection id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// When the `Create` was sent.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Feeds one event; events after the outcome are ignored. Returns
    /// whether the event was taken.
    pub fn handle(&mut self, event: Event) -> bool {
        let late = match self.state {
            State::Done(_) => return false,
            State::Waiting { .. } => false,
            State::Cancelling { .. } => true,
        };
        let outcome = match event {
            Event::Accepted => Outcome::Moved { late },
            Event::Dropped(r) if late => Outcome::TakeBack(TakeBackReason::Cancelled(r)),
            Event::Dropped(r) => Outcome::TakeBack(TakeBackReason::Refused(r)),
            Event::NotSent => Outcome::TakeBack(TakeBackReason::NotSent),
            Event::ControlEnded => Outcome::TakeBack(TakeBackReason::ControlEnded),
            Event::ControlFailed => Outcome::Abandon(AbandonReason::ControlFailed),
        };
        self.finish(outcome);
        true
    }

    /// Feeds a control message: an `Accepted` or `Drop` for this mover's id
    /// is its answer; anything else is not the mover's business.
    pub fn handle_message(&mut self, msg: &Message) -> bool {
        match msg {
            Message::Accepted { id } if *id == self.id => self.handle(Event::Accepted),
            Message::Drop { id, reason, .. } if *id == self.id => {
                self.handle(Event::Dropped(*reason))
            }
            _ => false,
        }
    }

    /// The timer fired at `now` (early or repeated calls do nothing).
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Waiting { deadline } if now >= deadline => {
                self.state = State::Cancelling {
                    deadline: now + self.cfg.cancel_timeout,
                };
                self.cancel = true;
            }
            State::Cancelling { deadline } if now >= deadline => {
                self.finish(Outcome::Abandon(AbandonReason::CancelTimeout));
            }
            _ => {}
        }
    }

    /// When [`Mover::handle_timeout`] must be called next (`None` once
    /// ended).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Waiting { deadline } | State::Cancelling { deadline } => Some(deadline),
            State::Done(_) => None,
        }
    }

    /// Whether the next expiry ends the offer (the driver fences it first).
    pub fn expiry_is_final(&self) -> bool {
        matches!(self.state, State::Cancelling { .. })
    }

    /// A frame to send to the taker, if any (the `Cancel`).
    pub fn poll_transmit(&mut self) -> Option<Message> {
        if std::mem::take(&mut self.cancel) && !matches!(self.state, State::Done(_)) {
            return Some(Message::Cancel { id: self.id });
        }
        None
    }

    /// The outcome, once there is one.
    pub fn outcome(&self) -> Option<Outcome> {
        match self.state {
            State::Done(o) => Some(o),
            _ => None,
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.state = State::Done(outcome);
        self.cancel = false;
    }
}

/// Runs `mover` to its outcome on tokio's clock.
///
/// * `answer`: resolves with the one event for this connection (the
///   answer, or the end of the control stream); resolving with `None` (its
///   sender gone without a word) counts as [`Event::ControlFailed`];
/// * `transmit`: sends a frame to the taker (the `Cancel`); if it cannot,
///   the end of the control stream will be reported through `answer`;
/// * `withdraw`: called before a final expiry; returns `true` when no answer
///   can reach `answer` any more (the sender removed its waiting entry), or
///   `false` when one is already on its way, which is then awaited.
pub async fn drive<A, T, W>(
    mover: &mut Mover,
    answer: A,
    mut transmit: T,
    mut withdraw: W,
) -> Outcome
where
    A: Future<Output = Option<Event>>,
    T: FnMut(Message),
    W: FnMut() -> bool,
{
    tokio::pin!(answer);
    loop {
        while let Some(m) = mover.poll_transmit() {
            transmit(m);
        }
        if let Some(o) = mover.outcome() {
            return o;
        }
        let Some(deadline) = mover.poll_timeout() else {
            unreachable!("a mover without an outcome has a deadline");
        };
        tokio::select! {
            e = &mut answer => {
                mover.handle(e.unwrap_or(Event::ControlFailed));
            }
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                if mover.expiry_is_final() && !withdraw() {
                    // The answer was read just now: it decides.
                    let e = (&mut answer).await;
                    mover.handle(e.unwrap_or(Event::ControlFailed));
                } else {
                    mover.handle_timeout(tokio::time::Instant::now().into_std());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(100);

    fn mover(now: Instant) -> Mover {
        Mover::new(7, MoverConfig::symmetric(T), now)
    }

    fn accepted() -> Message {
        Message::Accepted { id: 7 }
    }

    fn dropped(reason: DropReason) -> Message {
        Message::Drop {
            id: 7,
            reason,
            detail: String::new(),
        }
    }

    #[test]
    fn accepted_in_time_is_moved() {
        let t0 = Instant::now();
        let mut m = mover(t0);
        assert_eq!(m.poll_timeout(), Some(t0 + T));
        m.handle_timeout(t0 + T / 2);
        assert!(m.poll_transmit().is_none());
        assert!(m.handle_message(&accepted()));
        assert_eq!(m.outcome(), Some(Outcome::Moved { late: false }));
        assert_eq!(m.poll_timeout(), None);
        assert!(m.poll_transmit().is_none());
    }

    #[test]
    fn dropped_in_time_is_taken_back() {
        let t0 = Instant::now();
        let mut m = mover(t0);
        assert!(m.handle_message(&dropped(DropReason::Busy)));
        assert_eq!(
            m.outcome(),
            Some(Outcome::TakeBack(TakeBackReason::Refused(DropReason::Busy)))
        );
    }

    /// Expires the answer timeout: the mover asks to send `Cancel` once.
    fn cancelling(t0: Instant) -> Mover {
        let mut m = mover(t0);
        m.handle_timeout(t0 + T);
        assert_eq!(m.outcome(), None);
        assert_eq!(m.poll_transmit(), Some(Message::Cancel { id: 7 }));
        assert_eq!(m.poll_transmit(), None);
        assert_eq!(m.poll_timeout(), Some(t0 + 2 * T));
        assert!(m.expiry_is_final());
        m
    }

    #[test]
    fn timeout_then_late_accept_is_moved() {
        let t0 = Instant::now();
        let mut m = cancelling(t0);
        m.handle_timeout(t0 + T + T / 2);
        assert!(m.handle_message(&accepted()));
        assert_eq!(m.outcome(), Some(Outcome::Moved { late: true }));
    }

    #[test]
    fn timeout_then_drop_is_taken_back() {
        let t0 = Instant::now();
        let mut m = cancelling(t0);
        assert!(m.handle_message(&dropped(DropReason::Cancelled)));
        assert_eq!(
            m.outcome(),
            Some(Outcome::TakeBack(TakeBackReason::Cancelled(
                DropReason::Cancelled
            )))
        );
    }

    #[test]
    fn cancel_unanswered_is_abandoned() {
        let t0 = Instant::now();
        let mut m = cancelling(t0);
        m.handle_timeout(t0 + 2 * T - Duration::from_nanos(1));
        assert_eq!(m.outcome(), None);
        m.handle_timeout(t0 + 2 * T);
        assert_eq!(
            m.outcome(),
            Some(Outcome::Abandon(AbandonReason::CancelTimeout))
        );
        // A late answer changes nothing.
        assert!(!m.handle_message(&accepted()));
        assert_eq!(
            m.outcome(),
            Some(Outcome::Abandon(AbandonReason::CancelTimeout))
        );
    }

    #[test]
    fn clean_end_takes_back_and_failure_abandons_in_either_state() {
        let t0 = Instant::now();
        for cancel in [false, true] {
            let mut m = if cancel { cancelling(t0) } else { mover(t0) };
            m.handle(Event::ControlEnded);
            assert_eq!(
                m.outcome(),
                Some(Outcome::TakeBack(TakeBackReason::ControlEnded))
            );
            let mut m = if cancel { cancelling(t0) } else { mover(t0) };
            m.handle(Event::ControlFailed);
            assert_eq!(
                m.outcome(),
                Some(Outcome::Abandon(AbandonReason::ControlFailed))
            );
        }
        let mut m = mover(t0);
        m.handle(Event::NotSent);
        assert_eq!(
            m.outcome(),
            Some(Outcome::TakeBack(TakeBackReason::NotSent))
        );
    }

    #[test]
    fn other_ids_duplicates_and_other_messages_are_ignored() {
        let t0 = Instant::now();
        let mut m = mover(t0);
        assert!(!m.handle_message(&Message::Accepted { id: 8 }));
        assert!(!m.handle_message(&Message::Closed {
            id: 7,
            requests: 1,
            bytes: 1
        }));
        assert!(!m.handle_message(&Message::Cancel { id: 7 }));
        assert_eq!(m.outcome(), None);
        assert!(m.handle_message(&accepted()));
        // A Drop after the Accepted (the connection broke later) is not the mover's.
        assert!(!m.handle_message(&dropped(DropReason::Aborted)));
        assert!(!m.handle(Event::ControlEnded));
        assert!(!m.handle_message(&accepted()));
        assert_eq!(m.outcome(), Some(Outcome::Moved { late: false }));
        m.handle_timeout(t0 + 10 * T);
        assert!(m.poll_transmit().is_none());
        assert_eq!(m.outcome(), Some(Outcome::Moved { late: false }));
    }

    /// The driver on tokio's paused clock: an answer that comes after the
    /// Cancel was sent, and one already on its way when the final timer fires.
    #[test]
    fn driver_cancels_then_takes_the_late_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut tx = Some(tx);
            let mut m = Mover::new(
                7,
                MoverConfig::symmetric(T),
                tokio::time::Instant::now().into_std(),
            );
            let mut sent = Vec::new();
            let o = drive(
                &mut m,
                async { rx.await.ok() },
                |f| {
                    sent.push(f);
                    // The taker answers the Cancel.
                    let _ = tx
                        .take()
                        .unwrap()
                        .send(Event::Dropped(DropReason::Cancelled));
                },
                || true,
            )
            .await;
            assert_eq!(sent, vec![Message::Cancel { id: 7 }]);
            assert_eq!(
                o,
                Outcome::TakeBack(TakeBackReason::Cancelled(DropReason::Cancelled))
            );

            // Nothing answers; at the final expiry an answer turns out to be on its way.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut tx = Some(tx);
            let mut m = Mover::new(
                8,
                MoverConfig::symmetric(T),
                tokio::time::Instant::now().into_std(),
            );
            let o = drive(
                &mut m,
                async { rx.await.ok() },
                |_| {},
                || {
                    let _ = tx.take().unwrap().send(Event::Accepted);
                    false
                },
            )
            .await;
            assert_eq!(o, Outcome::Moved { late: true });

            // Nothing answers at all: abandoned after both timeouts.
            let (_tx, rx) = tokio::sync::oneshot::channel::<Event>();
            let start = tokio::time::Instant::now();
            let mut m = Mover::new(9, MoverConfig::symmetric(T), start.into_std());
            let o = drive(&mut m, async { rx.await.ok() }, |_| {}, || true).await;
            assert_eq!(o, Outcome::Abandon(AbandonReason::CancelTimeout));
            assert_eq!(start.elapsed(), 2 * T);
        });
    }

    mod props {
        use std::collections::VecDeque;

        use proptest::prelude::*;

        use super::*;
        use crate::taker::Taker;

        /// One step of a run: the mover, a taker, the stream both ways and
        /// the clock.
        #[derive(Debug, Clone)]
        enum Op {
            /// The clock moves on by this many tenths of the timeout.
            Advance(u8),
            /// The next frame to the taker arrives.
            DeliverToTaker,
            /// The taker answers its oldest pending `Create` (accept or refuse).
            Answer(bool),
            /// The next frame to the mover arrives.
            DeliverToMover,
            /// A frame about another connection arrives at the mover.
            Stray,
            /// The taker closes the stream cleanly (its frames all arrive).
            End,
            /// The stream fails: only this many of the taker's frames arrive.
            Fail(u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0u8..25).prop_map(Op::Advance),
                3 => Just(Op::DeliverToTaker),
                2 => any::<bool>().prop_map(Op::Answer),
                3 => Just(Op::DeliverToMover),
                1 => Just(Op::Stray),
                1 => Just(Op::End),
                1 => (0u8..3).prop_map(Op::Fail),
            ]
        }

        struct Run {
            now: Instant,
            mover: Mover,
            taker: Taker,
            to_taker: VecDeque<Message>,
            to_mover: VecDeque<Message>,
            link_up: bool,
            /// The taker wrote `Accepted`, so it serves the connection.
            served: bool,
        }

        impl Run {
            fn tick(&mut self) {
                self.mover.handle_timeout(self.now);
                while let Some(m) = self.mover.poll_transmit() {
                    if self.link_up {
                        self.to_taker.push_back(m);
                    }
                }
            }

            fn step(&mut self, op: &Op) {
                match *op {
                    Op::Advance(d) => {
                        self.now += T * u32::from(d) / 10;
                        self.tick();
                    }
                    Op::DeliverToTaker if self.link_up => match self.to_taker.pop_front() {
                        Some(Message::Create { id, .. }) => self.taker.created(id).unwrap(),
                        Some(Message::Cancel { id }) => {
                            if let Some(a) = self.taker.cancel(id) {
                                self.to_mover.push_back(a);
                            }
                        }
                        _ => {}
                    },
                    Op::Answer(yes) if self.link_up && self.taker.is_pending(7) => {
                        let a = if yes {
                            let a = self.taker.accept(7);
                            self.served |= a.is_some();
                            a
                        } else {
                            self.taker.refuse(7, DropReason::Busy, String::new())
                        };
                        self.to_mover.extend(a);
                    }
                    Op::DeliverToMover => {
                        if let Some(m) = self.to_mover.pop_front() {
                            self.mover.handle_message(&m);
                        }
                    }
                    Op::Stray => {
                        self.mover.handle_message(&Message::Accepted { id: 8 });
                        self.mover.handle_message(&Message::Drop {
                            id: 9,
                            reason: DropReason::Cancelled,
                            detail: String::new(),
                        });
                    }
                    Op::End if self.link_up => {
                        self.link_up = false;
                        while let Some(m) = self.to_mover.pop_front() {
                            self.mover.handle_message(&m);
                        }
                        self.mover.handle(Event::ControlEnded);
                    }
                    Op::Fail(n) if self.link_up => {
                        self.link_up = false;
                        for _ in 0..n {
                            if let Some(m) = self.to_mover.pop_front() {
                                self.mover.handle_message(&m);
                            }
                        }
                        self.to_mover.clear();
                        self.mover.handle(Event::ControlFailed);
                    }
                    _ => {}
                }
            }
        }

        proptest! {
            /// Whatever happens in whatever order, the offer ends exactly
            /// once, and never with both the taker serving and the sender
            /// taking the connection back.
            #[test]
            fn never_served_twice(ops in proptest::collection::vec(op(), 0..40)) {
                let t0 = Instant::now();
                let mut r = Run {
                    now: t0,
                    mover: Mover::new(7, MoverConfig::symmetric(T), t0),
                    taker: Taker::new(),
                    to_taker: VecDeque::from([Message::Create {
                        id: 7,
                        client: "10.0.0.1:1000".parse().unwrap(),
                        local: "10.0.0.2:80".parse().unwrap(),
                        transfer: crate::proto::Transfer::Fd,
                        preread: Vec::new(),
                        route: crate::proto::Routing::Own,
                    }]),
                    to_mover: VecDeque::new(),
                    link_up: true,
                    served: false,
                };
                let mut first = None;
                for op in &ops {
                    r.step(op);
                    if let Some(o) = r.mover.outcome() {
                        // Once ended, the outcome never changes.
                        prop_assert_eq!(*first.get_or_insert(o), o);
                    }
                }
                // Let time run out: every offer ends.
                r.now += 3 * T;
                r.tick();
                r.now += 3 * T;
                r.tick();
                let o = r.mover.outcome();
                prop_assert!(o.is_some());
                let o = o.unwrap();
                if let Some(f) = first {
                    prop_assert_eq!(f, o);
                }
                // The taker keeps going after the mover has decided.
                for op in &ops {
                    r.step(op);
                }
                prop_assert_eq!(r.mover.outcome(), Some(o));
                prop_assert!(!(r.served && o.sender_serves()), "served twice: {:?}", o);
                if let Outcome::Moved { .. } = o {
                    prop_assert!(r.served);
                }
            }
        }
    }
}
