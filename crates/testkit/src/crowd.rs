//! A flash crowd's client for the rescue suites: requests for a site's small files from a
//! loopback address of their own (the origin never redirects its rescue servers' address,
//! 127.0.0.1), following a redirect to the rescue server it names.

use std::net::SocketAddr;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Files of the crowd's site: `/f0.html`.. .
pub const FILES: usize = 20;
/// Bytes of each (seed 001's mean file of 6 KB).
pub const FILE_BYTES: usize = 6000;
/// Where the crowd comes from: not a rescue server's address (127.0.0.1), whose requests are
/// never redirected.
pub const CLIENT_IP: [u8; 4] = [127, 0, 0, 5];

/// Writes the site's files below `root`.
pub fn fill(root: &Path) {
    for i in 0..FILES {
        crate::write(
            root,
            &format!("f{i}.html"),
            &vec![b'a' + (i % 26) as u8; FILE_BYTES],
        );
    }
}

/// `GET` over a new connection from [`CLIENT_IP`]: (status, Location, body length).
pub async fn get(addr: SocketAddr, host: &str, target: &str) -> (u16, Option<String>, usize) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((CLIENT_IP, 0))).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let location = head
        .lines()
        .find_map(|l| l.strip_prefix("Location: "))
        .map(str::to_string);
    (status, location, body.len())
}

/// Client `n` of the crowd: one file from `site` (asked for as `host`); a redirect is
/// followed to `rescue`, which must serve that file and the next two under the name the
/// redirect gave. A 503 (the origin's redirect bound) is an answer too.
pub async fn one_client(
    site: SocketAddr,
    host: String,
    rescue: SocketAddr,
    n: usize,
) -> Result<(), String> {
    let target = format!("/f{}.html", n % FILES);
    let (status, location, len) = get(site, &host, &target).await;
    match status {
        200 if len == FILE_BYTES => Ok(()),
        302 => {
            let location = location.ok_or("a redirect without Location")?;
            let rest = location.strip_prefix("http://").ok_or(location.clone())?;
            let (host, path) = rest.split_at(rest.find('/').ok_or(location.clone())?);
            if path != target {
                return Err(format!("redirected {target} to {location}"));
            }
            for p in [
                path.to_string(),
                format!("/f{}.html", (n + 1) % FILES),
                format!("/f{}.html", (n + 2) % FILES),
            ] {
                let (s, _, len) = get(rescue, host, &p).await;
                if (s, len) != (200, FILE_BYTES) {
                    return Err(format!("{host}{p}: {s}, {len} bytes"));
                }
            }
            Ok(())
        }
        503 => Ok(()),
        s => Err(format!("{target}: status {s}, {len} bytes")),
    }
}
