//! A raw HTTP/1.x test client over blocking sockets.
//!
//! [`Client`] sends whatever bytes a test gives it and reads responses one
//! at a time off a keep-alive connection, keeping bytes that arrive early
//! (pipelined answers) for the next read. [`read_response`] does the same
//! for callers that hold their own stream and buffer (a stream made in
//! another network namespace, say), and [`get_once`] is a one-shot
//! HTTP/1.0 `GET` read to the end of the connection. Bodies are framed by
//! `Content-Length`; a response without one has an empty body.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Parses the head at the start of `buf`: the response without its body,
/// the head's length and the body's length, or `None` while the head is
/// incomplete. `head_only` (an answer to HEAD), 1xx and 304 have no body.
fn parse_head(buf: &[u8], head_only: bool) -> Result<Option<(Response, usize, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(n) = r.parse(buf).map_err(|e| format!("bad response: {e}"))?
    else {
        return Ok(None);
    };
    let status = r.code.unwrap();
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let len: usize = match headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        Some((_, v)) => v
            .trim()
            .parse()
            .map_err(|_| format!("bad Content-Length {v:?}"))?,
        None => 0,
    };
    let body_len = if head_only || status == 304 || status < 200 {
        0
    } else {
        len
    };
    let resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    Ok(Some((resp, n, body_len)))
}

/// Takes one whole response off the front of `buf`, or `None` while it is
/// incomplete.
fn take_response(buf: &mut Vec<u8>, head_only: bool) -> Result<Option<Response>, String> {
    match parse_head(buf, head_only)? {
        Some((mut resp, n, body_len)) if buf.len() >= n + body_len => {
            resp.body = buf[n..n + body_len].to_vec();
            buf.drain(..n + body_len);
            Ok(Some(resp))
        }
        _ => Ok(None),
    }
}

/// A keep-alive connection to a server under test.
pub struct Client {
    /// The connection (tests write odd bytes to it directly, or peek).
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to `addr`; reads time out after 10 s.
    pub fn connect(addr: SocketAddr) -> Client {
        Client::over(TcpStream::connect(addr).unwrap())
    }

    /// Connects to `addr` with a receive buffer of about `bytes` set before the handshake, so
    /// that the server's writes to it stop where the small window is full and go on as the
    /// test reads; reads time out after 10 s.
    pub fn connect_with_receive_buffer(addr: SocketAddr, bytes: usize) -> Client {
        let domain = socket2::Domain::for_address(addr);
        let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        socket.connect(&addr.into()).unwrap();
        Client::over(TcpStream::from(socket))
    }

    /// A client on a connected `stream`, whose reads time out after 10 s.
    fn over(stream: TcpStream) -> Client {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// Writes `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// GET `path` on this connection and read the response.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        self.response(false)
    }

    /// Like `get`, but I/O problems are an `Err` instead of a panic.
    pub fn try_get(&mut self, path: &str) -> Result<Response, String> {
        self.stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        self.try_response(false)
    }

    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 65536];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Read one response; `head_only` for answers to HEAD. Panics on a
    /// malformed response or a connection that ends before it.
    pub fn response(&mut self, head_only: bool) -> Response {
        self.try_response(head_only).unwrap()
    }

    /// Read one response; `head_only` for answers to HEAD.
    pub fn try_response(&mut self, head_only: bool) -> Result<Response, String> {
        loop {
            if let Some(r) = take_response(&mut self.buf, head_only)? {
                return Ok(r);
            }
            let had_head = parse_head(&self.buf, head_only)?.is_some();
            if self.fill().map_err(|e| e.to_string())? == 0 {
                return Err(if had_head {
                    "connection closed mid-body".into()
                } else {
                    format!(
                        "connection closed before a response; got {:?}",
                        String::from_utf8_lossy(&self.buf)
                    )
                });
            }
        }
    }

    /// Whether the server closed the connection (EOF or a reset, with nothing pending). Waits
    /// up to the read timeout for the close; a connection still open then is not closed.
    pub fn is_closed(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        match self.stream.read(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    /// A slow client (slowloris): sends `head` and then `z`s, one byte every
    /// `every`, until the server answers or closes; the pause between bytes
    /// is a wait for that answer, not a sleep. Panics if the server has
    /// neither answered nor closed after `limit`. Reads time out after 10 s
    /// again afterwards; the answer is left for [`Client::response`].
    pub fn drip(&mut self, head: &[u8], every: Duration, limit: Duration) {
        let t = Instant::now();
        self.stream.set_read_timeout(Some(every)).unwrap();
        for b in head.iter().chain(std::iter::repeat(&b'z')) {
            if self.stream.write_all(&[*b]).is_err() {
                break;
            }
            match self.stream.peek(&mut [0u8; 1]) {
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("slow client: {e}"),
            }
            assert!(t.elapsed() < limit, "slow client was not cut off");
        }
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
    }

    /// Send raw bytes and read one response.
    pub fn raw(&mut self, bytes: &[u8]) -> Response {
        self.send(bytes);
        self.response(false)
    }
}

/// Sends `request` on a fresh connection and returns the response's status.
pub fn status_of(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut c = Client::connect(addr);
    c.send(request);
    c.response(false).status
}

/// Reads one response from `s`, using and keeping in `buf` the bytes read
/// before and after it. Gives up with `TimedOut` once 20 s have passed
/// between reads that return data (the stream's own read timeout bounds a
/// silent peer).
pub fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Response> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tmp = vec![0u8; 64 * 1024];
    loop {
        if let Some(r) = take_response(buf, false).map_err(std::io::Error::other)? {
            return Ok(r);
        }
        let had_head = parse_head(buf, false)
            .map_err(std::io::Error::other)?
            .is_some();
        let n = s.read(&mut tmp)?;
        if n == 0 {
            let what = if had_head {
                "EOF in the middle of a body"
            } else {
                "EOF before a response head"
            };
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, what));
        }
        buf.extend_from_slice(&tmp[..n]);
        if Instant::now() > deadline {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
    }
}

/// One HTTP/1.0 `GET path` on a new connection to `addr`, read to the end
/// of the connection: the status and everything after the head.
pub fn get_once(addr: SocketAddr, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n")?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)?;
    let split = find(&all, b"\r\n\r\n").ok_or_else(|| std::io::Error::other("no response head"))?;
    let status = all
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    Ok((status, all[split + 4..].to_vec()))
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelined_responses_come_off_the_buffer_one_at_a_time() {
        let mut buf =
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: 1\r\n\r\nabcHTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Le"
                .to_vec();
        let r = take_response(&mut buf, false).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abc"[..]));
        assert_eq!(r.header("x-a"), Some("1"));
        let r = take_response(&mut buf, false).unwrap().unwrap();
        assert_eq!((r.status, r.body.len()), (304, 0), "a 304 has no body");
        assert!(take_response(&mut buf, false).unwrap().is_none());
        assert!(buf.starts_with(b"HTTP/1.1 404"), "the partial head stays");
    }

    #[test]
    fn an_answer_to_head_has_no_body_and_garbage_is_an_error() {
        let mut buf = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_vec();
        assert!(take_response(&mut buf.clone(), false).unwrap().is_none());
        let r = take_response(&mut buf, true).unwrap().unwrap();
        assert_eq!((r.status, r.body.len()), (200, 0));
        assert!(buf.is_empty());
        assert!(take_response(&mut b"NOT HTTP\r\n\r\n".to_vec(), false).is_err());
    }
}
