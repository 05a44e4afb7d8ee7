//! A tiny scriptable HTTP/1.x server on 127.0.0.1 for the load generator's tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub minor_version: u8,
    pub host: Option<String>,
    /// Index of the connection (in accept order).
    pub conn: usize,
}

/// What the server does with a request.
pub enum Reply {
    /// Write these bytes and keep reading.
    Send(Vec<u8>),
    /// Write these bytes and close the connection.
    SendClose(Vec<u8>),
    /// Never answer (keep the connection open).
    Silent,
    /// Reset the connection (SO_LINGER 0).
    Reset,
    /// Close the connection without answering.
    Close,
}

pub struct Server {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Options: requests whose path starts with `hold.0` are held until a request for `hold.1`
/// arrives on the same connection, then all are answered in order.
#[derive(Default, Clone)]
pub struct Opts {
    pub hold: Option<(&'static str, &'static str)>,
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

pub fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Server {
    start_with(Opts::default(), handler)
}

pub fn start_with(opts: Opts, handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Server {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler: Arc<Handler> = Arc::new(handler);
    {
        let accepted = accepted.clone();
        let seen = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((s, _)) = l.accept().await else {
                        continue;
                    };
                    let conn = accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(s, conn, handler.clone(), seen.clone(), opts.clone()));
                }
            });
        });
    }
    Server {
        addr,
        accepted,
        seen,
    }
}

async fn serve(
    mut s: TcpStream,
    conn: usize,
    handler: Arc<Handler>,
    seen: Arc<Mutex<Vec<Seen>>>,
    opts: Opts,
) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::with_capacity(8192);
    let mut tmp = [0u8; 8192];
    let mut held: Vec<Seen> = Vec::new();
    let mut out = Vec::new();
    loop {
        let n = match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&tmp[..n]);
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            let len = match req.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => break,
                Err(_) => return,
            };
            let r = Seen {
                method: req.method.unwrap_or("").to_owned(),
                path: req.path.unwrap_or("").to_owned(),
                minor_version: req.version.unwrap_or(1),
                host: req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("host"))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned()),
                conn,
            };
            buf.drain(..len);
            seen.lock().unwrap().push(r.clone());
            let batch: Vec<Seen> = match opts.hold {
                Some((prefix, release)) if r.path.starts_with(prefix) => {
                    let release_now = r.path == release;
                    held.push(r);
                    if release_now {
                        std::mem::take(&mut held)
                    } else {
                        Vec::new()
                    }
                }
                _ => vec![r],
            };
            for r in batch {
                match handler(&r) {
                    Reply::Send(b) => out.extend_from_slice(&b),
                    Reply::SendClose(b) => {
                        out.extend_from_slice(&b);
                        let _ = s.write_all(&out).await;
                        let _ = s.shutdown().await;
                        return;
                    }
                    Reply::Silent => {}
                    Reply::Reset => {
                        let _ = s.set_zero_linger();
                        return;
                    }
                    Reply::Close => {
                        let _ = s.write_all(&out).await;
                        return;
                    }
                }
            }
        }
        if !out.is_empty() {
            if s.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
    }
}

/// A response with a Content-Length body.
pub fn response(status: u16, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body);
    v
}

pub fn ok(body: &[u8]) -> Vec<u8> {
    response(200, "", body)
}

/// A chunked response carrying `body` in chunks of `chunk` bytes.
pub fn chunked(status: u16, body: &[u8], chunk: usize) -> Vec<u8> {
    let mut v = format!("HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
    for c in body.chunks(chunk.max(1)) {
        v.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        v.extend_from_slice(c);
        v.extend_from_slice(b"\r\n");
    }
    v.extend_from_slice(b"0\r\n\r\n");
    v
}
