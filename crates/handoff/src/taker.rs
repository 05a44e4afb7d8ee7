//! The receiving side of a handoff: which `Create`s a taker has answered, as
//! a small pure state type. The node's control connections use it; so will a
//! node that takes connections from another node.
//!
//! A taker keeps the promises the mover's safety argument rests on (see
//! [`crate::mover`]):
//!
//! * every `Create` is answered exactly once, `Accepted` or `Drop`:
//!   [`Taker::accept`] and [`Taker::refuse`] return the answer to send only
//!   for a `Create` still unanswered, and an answer already given is never
//!   replaced;
//! * a `Cancel` for a `Create` not answered yet is answered `Drop` with
//!   [`DropReason::Cancelled`] ([`Taker::cancel`]), after which
//!   [`Taker::accept`] refuses to give an `Accepted`: the connection must
//!   not be served; a `Cancel` for one answered (or unknown) is ignored;
//! * the connection is served only once its `Accepted` has been *written*
//!   to the control stream. This the type cannot enforce: the code that
//!   runs it must wait for the write (the node's receiver does), so that a
//!   taker that dies between answering and writing has served nothing.
//!
//! A taker that answers each `Create` before reading the next frame (the
//! node today) never sees a `Cancel` for an unanswered `Create`; one that
//! answers later (an asynchronous restore, a look-ahead over frames read in
//! one batch) relies on [`Taker::cancel`] to turn the pending `Create` into a
//! refusal.

use crate::proto::{DropReason, Message};

/// Why a `Create` cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TakerError {
    /// A second `Create` for an id that is still unanswered.
    #[error("duplicate Create for unanswered connection {0}")]
    Duplicate(u64),
}

/// The `Create`s of one control connection that are not answered yet.
#[derive(Debug, Default)]
pub struct Taker {
    /// Ids in arrival order; short (answered right away, or within a batch).
    unanswered: Vec<u64>,
}

impl Taker {
    /// A taker with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// A `Create` for `id` arrived: it must be answered with
    /// [`Taker::accept`] or [`Taker::refuse`] (unless a `Cancel` answers it
    /// first).
    pub fn created(&mut self, id: u64) -> Result<(), TakerError> {
        if self.unanswered.contains(&id) {
            return Err(TakerError::Duplicate(id));
        }
        self.unanswered.push(id);
        Ok(())
    }

    /// The taker will serve `id`: the `Accepted` to write, or `None` when
    /// the `Create` is not pending (answered already, e.g. cancelled): then
    /// the connection must not be served.
    #[must_use]
    pub fn accept(&mut self, id: u64) -> Option<Message> {
        self.take(id).then_some(Message::Accepted { id })
    }

    /// The taker will not serve `id`: the `Drop` to write, or `None` when it
    /// was answered already.
    #[must_use]
    pub fn refuse(&mut self, id: u64, reason: DropReason, detail: String) -> Option<Message> {
        self.take(id)
            .then_some(Message::Drop { id, reason, detail })
    }

    /// A `Cancel` for `id` arrived: a `Drop` with [`DropReason::Cancelled`]
    /// to write if the `Create` was still unanswered (it is never served),
    /// `None` when the answer was already given.
    #[must_use]
    pub fn cancel(&mut self, id: u64) -> Option<Message> {
        self.refuse(
            id,
            DropReason::Cancelled,
            "cancelled before answered".into(),
        )
    }

    /// Whether `id` awaits its answer.
    pub fn is_pending(&self, id: u64) -> bool {
        self.unanswered.contains(&id)
    }

    /// `Create`s not answered yet.
    pub fn pending(&self) -> usize {
        self.unanswered.len()
    }

    fn take(&mut self, id: u64) -> bool {
        match self.unanswered.iter().position(|&x| x == id) {
            Some(i) => {
                self.unanswered.remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_create_is_answered_once() {
        let mut t = Taker::new();
        t.created(1).unwrap();
        t.created(2).unwrap();
        assert_eq!(t.created(1), Err(TakerError::Duplicate(1)));
        assert_eq!(t.accept(1), Some(Message::Accepted { id: 1 }));
        assert_eq!(t.accept(1), None);
        assert_eq!(t.refuse(1, DropReason::Busy, String::new()), None);
        assert!(matches!(
            t.refuse(2, DropReason::Busy, String::new()),
            Some(Message::Drop {
                id: 2,
                reason: DropReason::Busy,
                ..
            })
        ));
        assert_eq!(t.pending(), 0);
        // Answered ids may come again (a connection handed back and in again).
        t.created(1).unwrap();
        assert!(t.is_pending(1));
    }

    #[test]
    fn cancel_refuses_a_pending_create_and_ignores_answered_ones() {
        let mut t = Taker::new();
        t.created(5).unwrap();
        t.created(6).unwrap();
        // Create 5 and its Cancel read in one batch: refused, never served.
        assert!(matches!(
            t.cancel(5),
            Some(Message::Drop {
                id: 5,
                reason: DropReason::Cancelled,
                ..
            })
        ));
        assert_eq!(t.accept(5), None);
        // Already answered: the Cancel changes nothing.
        assert_eq!(t.accept(6), Some(Message::Accepted { id: 6 }));
        assert_eq!(t.cancel(6), None);
        // Unknown: ignored.
        assert_eq!(t.cancel(99), None);
        assert_eq!(t.pending(), 0);
    }
}
