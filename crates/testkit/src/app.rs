//! A small application server for the tests of dynamic content: a thread per connection,
//! keep-alive, requests parsed with httparse and bodies decoded by `Content-Length` or chunked
//! coding here (independently of the server crates under test).
//!
//! What it answers, by path (the query is read by `/app/sum` and `/app/big`):
//!
//! * `/app/sum?a=X&b=Y`: `sum=X+Y` (computed), with `X-App-Connection`, the number of the
//!   connection it came on (counted from 1), and `X-Seen-Forwarded-For`;
//! * `/app/echo`: the request body, decoded, with `X-Body-Length` and `X-Framing`
//!   (`length`, `chunked` or `none`);
//! * `/app/chunked?n=K`: K chunks `line i\n` in chunked coding;
//! * `/app/big?n=N`: N bytes of [`crate::pattern`] with seed 7;
//! * `/app/stall`: nothing, until the peer closes;
//! * `/app/close`: the connection closes without an answer;
//! * `/app/bad`: a response head with two `Content-Length`s;
//! * `/app/cut`: a `Content-Length` of 100 and 10 bytes, then a close;
//! * anything else: 404.
//!
//! Every request is recorded (method and target) once its body is read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the application server saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Requests read, as `METHOD target`, in order of arrival.
    pub requests: Mutex<Vec<String>>,
}

impl Seen {
    /// Requests read so far.
    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// Requests read so far whose `METHOD target` starts with `prefix`.
    pub fn count_of(&self, prefix: &str) -> usize {
        let r = self.requests.lock().unwrap();
        r.iter().filter(|s| s.starts_with(prefix)).count()
    }
}

/// A running application server on 127.0.0.1.
pub struct App {
    /// Its address.
    pub addr: SocketAddr,
    /// What it saw.
    pub seen: Arc<Seen>,
}

impl App {
    /// Start one on a free port.
    pub fn start() -> App {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let n = s.connections.fetch_add(1, Relaxed) + 1;
                let s = s.clone();
                std::thread::spawn(move || serve(c, n, &s));
            }
        });
        App { addr, seen }
    }
}

/// An address nothing listens on (a port just released).
pub fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A request as read.
struct Req {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    framing: &'static str,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn query(&self, key: &str) -> Option<u64> {
        let q = self.target.split_once('?')?.1;
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.parse().ok())
    }
}

/// Serve one connection until the peer closes or a request says to close.
fn serve(mut c: TcpStream, conn_no: u64, seen: &Seen) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut c, &mut buf) else {
            return;
        };
        seen.requests
            .lock()
            .unwrap()
            .push(format!("{} {}", req.method, req.target));
        let path = req.target.split('?').next().unwrap_or_default().to_owned();
        let head_only = req.method == "HEAD";
        let out = match path.as_str() {
            "/app/sum" => {
                let sum = req.query("a").unwrap_or(0) + req.query("b").unwrap_or(0);
                let xff = req.header("x-forwarded-for").unwrap_or("-").to_owned();
                response(
                    200,
                    &[
                        ("X-App-Connection", conn_no.to_string()),
                        ("X-Seen-Forwarded-For", xff),
                    ],
                    format!("sum={sum}\n").as_bytes(),
                    head_only,
                )
            }
            "/app/echo" => response(
                200,
                &[
                    ("X-Body-Length", req.body.len().to_string()),
                    ("X-Framing", req.framing.to_owned()),
                ],
                &req.body,
                head_only,
            ),
            "/app/chunked" => {
                let n = req.query("n").unwrap_or(3);
                let mut out =
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
                        .to_vec();
                for i in 0..n {
                    let line = format!("line {i}\n");
                    out.extend_from_slice(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes());
                }
                out.extend_from_slice(b"0\r\n\r\n");
                out
            }
            "/app/big" => {
                let n = req.query("n").unwrap_or(1000) as usize;
                response(200, &[], &crate::pattern(n, 7), head_only)
            }
            "/app/stall" => {
                // Hold the connection without answering until the peer gives up.
                let mut b = [0u8; 1024];
                while matches!(c.read(&mut b), Ok(n) if n > 0) {}
                return;
            }
            "/app/close" => return,
            "/app/bad" => {
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx".to_vec()
            }
            "/app/cut" => {
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789");
                return;
            }
            _ => response(404, &[], b"no such page\n", head_only),
        };
        if c.write_all(&out).is_err() {
            return;
        }
    }
}

fn response(status: u16, headers: &[(&str, String)], body: &[u8], head_only: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

/// Read more into `buf`; false at the peer's close or an error.
fn fill(c: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 64 * 1024];
    match c.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// Read one request (head and body) off the front of `buf`, reading as needed.
fn read_request(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Req> {
    let (mut req, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = r.parse(buf) {
            let req = Req {
                method: r.method.unwrap_or_default().to_owned(),
                target: r.path.unwrap_or_default().to_owned(),
                headers: r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect(),
                body: Vec::new(),
                framing: "none",
            };
            break (req, n);
        }
        if !fill(c, buf) {
            return None;
        }
    };
    buf.drain(..head_len);
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if chunked {
        req.framing = "chunked";
        req.body = read_chunked(c, buf)?;
    } else if let Some(n) = req.header("content-length") {
        let n: usize = n.trim().parse().ok()?;
        req.framing = "length";
        while buf.len() < n {
            if !fill(c, buf) {
                return None;
            }
        }
        req.body = buf.drain(..n).collect();
    }
    Some(req)
}

/// Take a CRLF-terminated line off the front of `buf`, reading as needed.
fn line(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let l = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 2);
            return Some(l);
        }
        if !fill(c, buf) {
            return None;
        }
    }
}

/// Decode a chunked body: size lines (extensions ignored), data, then trailers up to a blank
/// line.
fn read_chunked(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = line(c, buf)?;
        let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            while !line(c, buf)?.is_empty() {}
            return Some(body);
        }
        while buf.len() < size + 2 {
            if !fill(c, buf) {
                return None;
            }
        }
        body.extend_from_slice(&buf[..size]);
        if &buf[size..size + 2] != b"\r\n" {
            return None;
        }
        buf.drain(..size + 2);
    }
}
