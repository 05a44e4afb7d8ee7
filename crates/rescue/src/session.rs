//! One rescue-protocol connection as a state machine without I/O: numbering of outgoing
//! requests, matching of responses, answers to malformed requests, and timeouts against a time
//! passed in.
//!
//! Either side may send requests (§4.4.2); each side numbers its own from 1, and a response
//! carries the number of the request it answers. The session keeps the requests it sent until
//! they are answered. Its rules for a connection that can no longer be trusted:
//!
//! * a line that is too long, or not even a request or response, a response to a number that
//!   is not outstanding, or a response of the wrong kind (a grant for a RATE) is *fatal*;
//! * a request that is not answered within the timeout is fatal;
//! * a request that reads as one (number, then a word) but does not decode is answered by the
//!   session itself with `400 BadRequest` or `501 Unknown` and the connection goes on.
//!
//! A fatal error closes the session: the caller drops the connection and tells the core
//! ([`crate::Core::on_peer_lost`]), which ends the relationship with that peer on this side; the
//! peer sees the connection end and does the same on its side. So a lost or misbehaving
//! connection never leaves one side redirecting to, or proxying for, a peer that has let go.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::proto::{code, LineReader, Message, ProtoError, Request, RequestKind, Response, Seq};

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The peer sent bytes that are not a protocol line.
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    /// A response to a request that is not outstanding.
    #[error("response to request {0}, which is not outstanding")]
    UnexpectedResponse(Seq),
    /// A response that cannot answer the request it names.
    #[error("response {code} does not answer {kind:?} request {seq}")]
    Mismatched {
        /// The request's number.
        seq: Seq,
        /// Its kind.
        kind: RequestKind,
        /// The response's code.
        code: u16,
    },
    /// No answer in time.
    #[error("{kind:?} request {seq} not answered in time")]
    Timeout {
        /// The request's number.
        seq: Seq,
        /// Its kind.
        kind: RequestKind,
    },
    /// A message of ours could not be encoded (a bad name in the configuration, for example).
    #[error("cannot send: {0}")]
    Encode(ProtoError),
    /// The session has already ended.
    #[error("session closed")]
    Closed,
}

/// What the peer sent, for the core ([`crate::Core::on_message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// A request to answer.
    Request {
        /// Its number, to be echoed in the response.
        seq: Seq,
        /// The request.
        request: Request,
    },
    /// The answer to one of our requests.
    Response {
        /// The request's number.
        seq: Seq,
        /// The request it answers, as we sent it.
        request: Request,
        /// The answer.
        response: Response,
    },
}

/// One result of [`Session::receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Hand this to the core.
    Deliver(Inbound),
    /// Write these bytes to the peer: the session's own answer to a malformed request.
    Reply(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Outstanding {
    request: Request,
    deadline: Duration,
}

/// One connection's protocol state. See the module documentation.
#[derive(Debug, Clone)]
pub struct Session {
    timeout: Duration,
    next_seq: Seq,
    outstanding: BTreeMap<Seq, Outstanding>,
    reader: LineReader,
    closed: bool,
}

impl Session {
    /// A new session whose requests must be answered within `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Session {
            timeout,
            next_seq: 1,
            outstanding: BTreeMap::new(),
            reader: LineReader::new(),
            closed: false,
        }
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether no request of ours waits for an answer.
    pub fn is_idle(&self) -> bool {
        self.outstanding.is_empty()
    }

    /// Our requests that wait for an answer, by number.
    pub fn outstanding(&self) -> impl Iterator<Item = (Seq, &Request)> {
        self.outstanding.iter().map(|(s, o)| (*s, &o.request))
    }

    fn take_seq(&mut self) -> Seq {
        loop {
            let s = self.next_seq;
            self.next_seq = if s == Seq::MAX { 1 } else { s + 1 };
            if !self.outstanding.contains_key(&s) {
                return s;
            }
        }
    }

    /// Numbers `request`, remembers it until answered (or until `now + timeout`) and returns
    /// its number and the line to write.
    pub fn send_request(
        &mut self,
        now: Duration,
        request: Request,
    ) -> Result<(Seq, Vec<u8>), SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        let seq = self.take_seq();
        let line = Message::Request {
            seq,
            request: request.clone(),
        }
        .to_line()
        .map_err(SessionError::Encode)?;
        self.outstanding.insert(
            seq,
            Outstanding {
                request,
                deadline: now.saturating_add(self.timeout),
            },
        );
        Ok((seq, line))
    }

    /// The line answering the peer's request `seq`.
    pub fn send_response(&mut self, seq: Seq, response: Response) -> Result<Vec<u8>, SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        Message::Response { seq, response }
            .to_line()
            .map_err(SessionError::Encode)
    }

    /// Takes bytes from the connection; returns what to deliver and what to answer, in order.
    /// A fatal error closes the session (see the module documentation); what was decoded before
    /// it is lost with the connection.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<Vec<Received>, SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        self.reader.push(bytes);
        let mut out = Vec::new();
        loop {
            let line = match self.reader.next_line() {
                Ok(Some(l)) => l,
                Ok(None) => return Ok(out),
                Err(e) => return Err(self.fail(e.into())),
            };
            match Message::decode(&line) {
                Ok(Message::Request { seq, request }) => {
                    out.push(Received::Deliver(Inbound::Request { seq, request }))
                }
                Ok(Message::Response { seq, response }) => {
                    let Some(o) = self.outstanding.get(&seq) else {
                        return Err(self.fail(SessionError::UnexpectedResponse(seq)));
                    };
                    let kind = o.request.kind();
                    if !response.answers(kind) {
                        let code = response.code();
                        return Err(self.fail(SessionError::Mismatched { seq, kind, code }));
                    }
                    let o = self.outstanding.remove(&seq).expect("checked above");
                    out.push(Received::Deliver(Inbound::Response {
                        seq,
                        request: o.request,
                        response,
                    }));
                }
                Err(e) => match Message::request_seq(&line) {
                    Some(seq) => {
                        let c = if matches!(e, ProtoError::UnknownCommand(_)) {
                            code::UNKNOWN_COMMAND
                        } else {
                            code::BAD_REQUEST
                        };
                        let reply = Message::Response {
                            seq,
                            response: Response::refused(c),
                        }
                        .to_line()
                        .expect("a fixed refusal always encodes");
                        out.push(Received::Reply(reply));
                    }
                    None => return Err(self.fail(e.into())),
                },
            }
        }
    }

    /// When the earliest outstanding request times out, if any.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.outstanding.values().map(|o| o.deadline).min()
    }

    /// Fails the session if a request has waited past its deadline at `now`.
    pub fn check_timeouts(&mut self, now: Duration) -> Result<(), SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        let late = self
            .outstanding
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .min_by_key(|(s, o)| (o.deadline, **s))
            .map(|(s, o)| (*s, o.request.kind()));
        match late {
            Some((seq, kind)) => Err(self.fail(SessionError::Timeout { seq, kind })),
            None => Ok(()),
        }
    }

    /// Ends the session (the connection is gone); returns the requests that will never be
    /// answered.
    pub fn close(&mut self) -> Vec<(Seq, Request)> {
        self.closed = true;
        std::mem::take(&mut self.outstanding)
            .into_iter()
            .map(|(s, o)| (s, o.request))
            .collect()
    }

    fn fail(&mut self, e: SessionError) -> SessionError {
        self.closed = true;
        self.outstanding.clear();
        self.reader = LineReader::new();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Grant, Sos};

    const T: Duration = Duration::from_secs(5);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn sos() -> Request {
        Request::Sos(Sos {
            fqdn: "www.origin.com".into(),
            ip: [1, 2, 3, 4].into(),
            port: 8080,
            max_idle_secs: 600,
            want_kbps: None,
        })
    }

    #[test]
    fn numbers_requests_and_matches_responses() {
        let mut s = Session::new(T);
        let (a, line) = s.send_request(secs(0), sos()).unwrap();
        assert_eq!(
            (a, &line[..]),
            (1, &b"1 SOS www.origin.com 1.2.3.4 8080 600\n"[..])
        );
        let (b, line) = s.send_request(secs(1), Request::Shutdown).unwrap();
        assert_eq!((b, &line[..]), (2, &b"2 SHUTDOWN\n"[..]));
        assert_eq!(s.next_deadline(), Some(secs(5)));
        // Answers out of order, delivered in two pieces.
        assert_eq!(s.receive(b"2 200 O").unwrap(), vec![]);
        let got = s.receive(b"K\n1 403 Reject\n").unwrap();
        assert_eq!(
            got,
            vec![
                Received::Deliver(Inbound::Response {
                    seq: 2,
                    request: Request::Shutdown,
                    response: Response::Ok
                }),
                Received::Deliver(Inbound::Response {
                    seq: 1,
                    request: sos(),
                    response: Response::reject()
                }),
            ]
        );
        assert!(s.is_idle());
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn peer_requests_are_delivered_and_answered() {
        let mut s = Session::new(T);
        let got = s.receive(b"1 RATE 60\n").unwrap();
        assert_eq!(
            got,
            vec![Received::Deliver(Inbound::Request {
                seq: 1,
                request: Request::Rate { kbps: 60 }
            })]
        );
        assert_eq!(s.send_response(1, Response::Ok).unwrap(), b"1 200 OK\n");
    }

    #[test]
    fn malformed_requests_are_answered_and_the_session_goes_on() {
        let mut s = Session::new(T);
        let got = s.receive(b"4 HELLO\n5 RATE x\n6 SHUTDOWN\n").unwrap();
        assert_eq!(got[0], Received::Reply(b"4 501 Unknown\n".to_vec()));
        assert_eq!(got[1], Received::Reply(b"5 400 BadRequest\n".to_vec()));
        assert!(matches!(
            got[2],
            Received::Deliver(Inbound::Request {
                seq: 6,
                request: Request::Shutdown
            })
        ));
        assert!(!s.is_closed());
    }

    #[test]
    fn fatal_errors_close_the_session() {
        let cases: &[&[u8]] = &[
            b"garbage\n",
            b"9 200 OK\n",
            b"1 200 OK\n",
            b"1 200 OK a.b 1.2.3.4 80 5\n",
            b"\n",
        ];
        for (i, bytes) in cases.iter().enumerate() {
            let mut s = Session::new(T);
            let req = if i == 2 {
                sos()
            } else {
                Request::Rate { kbps: 1 }
            };
            s.send_request(secs(0), req).unwrap();
            let e = s.receive(bytes).unwrap_err();
            match i {
                1 => assert_eq!(e, SessionError::UnexpectedResponse(9)),
                2 | 3 => assert!(matches!(e, SessionError::Mismatched { seq: 1, .. }), "{e}"),
                _ => assert!(matches!(e, SessionError::Proto(_)), "{e}"),
            }
            assert!(s.is_closed());
            assert!(s.is_idle());
            assert_eq!(s.receive(b"1 SHUTDOWN\n"), Err(SessionError::Closed));
            assert_eq!(
                s.send_request(secs(0), Request::Shutdown),
                Err(SessionError::Closed)
            );
        }
        let mut s = Session::new(T);
        assert!(matches!(
            s.receive(&[b'1'; 600]),
            Err(SessionError::Proto(ProtoError::LineTooLong { .. }))
        ));
    }

    #[test]
    fn timeouts_on_the_virtual_clock() {
        let mut s = Session::new(T);
        s.send_request(secs(10), Request::Rate { kbps: 5 }).unwrap();
        s.send_request(secs(12), Request::Shutdown).unwrap();
        assert_eq!(s.check_timeouts(secs(14)), Ok(()));
        assert_eq!(
            s.check_timeouts(secs(15)),
            Err(SessionError::Timeout {
                seq: 1,
                kind: RequestKind::Rate
            })
        );
        assert!(s.is_closed());
    }

    #[test]
    fn close_returns_what_was_outstanding() {
        let mut s = Session::new(T);
        s.send_request(secs(0), Request::Shutdown).unwrap();
        assert_eq!(s.close(), vec![(1, Request::Shutdown)]);
        assert!(s.is_closed());
    }

    #[test]
    fn sequence_numbers_wrap_and_skip_outstanding_ones() {
        let mut s = Session::new(T);
        s.next_seq = Seq::MAX;
        assert_eq!(
            s.send_request(secs(0), Request::Shutdown).unwrap().0,
            Seq::MAX
        );
        assert_eq!(s.send_request(secs(0), Request::Shutdown).unwrap().0, 1);
        s.next_seq = 1;
        assert_eq!(s.send_request(secs(0), Request::Shutdown).unwrap().0, 2);
    }

    #[test]
    fn an_unencodable_request_is_not_remembered() {
        let mut s = Session::new(T);
        let bad = Request::Sos(Sos {
            fqdn: "no spaces allowed".into(),
            ip: [1, 2, 3, 4].into(),
            port: 80,
            max_idle_secs: 1,
            want_kbps: None,
        });
        assert!(matches!(
            s.send_request(secs(0), bad),
            Err(SessionError::Encode(_))
        ));
        assert!(s.is_idle());
        let g = Response::Granted(Grant {
            alias: "a".into(),
            ip: [1, 1, 1, 1].into(),
            port: 80,
            d_redi_kbps: 1,
        });
        assert_eq!(s.send_response(3, g).unwrap(), b"3 200 OK a 1.1.1.1 80 1\n");
    }
}
