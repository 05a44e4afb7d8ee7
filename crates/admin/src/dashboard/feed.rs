//! Fan-out of dashboard updates to viewers over server-sent events (`text/event-stream`).
//!
//! One sampler task calls [`Publisher::publish`] per update: the update is encoded once, kept
//! in a short history and announced on a `tokio::sync::watch` channel. Each viewer's task
//! writes the already encoded events it has not sent yet (so a viewer that fell behind catches
//! up from the history instead of skipping points) and nothing else: a viewer costs one write
//! per update. At most `max_viewers` are served at once; beyond that a viewer is refused with
//! `503` and a body that says why. A viewer that does not read for [`WRITE_TIMEOUT`] is
//! dropped.
//!
//! Events: `meta` (a [`Meta`]: node names and columns) first and whenever it changes, then
//! `update` (an [`Update`]) per sample. A new viewer gets the meta and the history, so its
//! charts start with the last minutes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

use super::{Meta, Step, Update};

/// How long one write to a viewer may take before the viewer is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the viewers see: the meta event and the last updates, encoded.
#[derive(Debug, Default)]
pub struct Frames {
    /// Changes whenever the meta does.
    pub meta_version: u64,
    /// The `meta` event, encoded (empty before the first update).
    pub meta: Arc<str>,
    /// The meta as JSON.
    pub meta_json: Arc<str>,
    /// `(sequence number, encoded update event, update JSON)`, oldest first.
    pub updates: VecDeque<(u64, Arc<str>, Arc<str>)>,
}

/// The sampler's end.
#[derive(Debug)]
pub struct Publisher {
    tx: watch::Sender<Arc<Frames>>,
    /// The viewers' slots (shared with the feed): the taken ones are the viewers.
    slots: Arc<Semaphore>,
    max_viewers: usize,
    history: usize,
    seq: u64,
    meta_version: u64,
}

/// The viewers' end: cheap to clone.
#[derive(Clone, Debug)]
pub struct Feed {
    rx: watch::Receiver<Arc<Frames>>,
    slots: Arc<Semaphore>,
    max_viewers: usize,
}

/// A publisher and its feed: at most `max_viewers` at once, new viewers get the last
/// `history` updates.
pub fn channel(max_viewers: usize, history: usize) -> (Publisher, Feed) {
    let (tx, rx) = watch::channel(Arc::new(Frames::default()));
    let slots = Arc::new(Semaphore::new(max_viewers));
    (
        Publisher {
            tx,
            slots: slots.clone(),
            max_viewers,
            history: history.max(1),
            seq: 0,
            meta_version: 0,
        },
        Feed {
            rx,
            slots,
            max_viewers,
        },
    )
}

/// One server-sent event.
fn event(name: &str, data: &str) -> String {
    // JSON text has no raw newlines, so the data is one line.
    debug_assert!(!data.contains('\n'));
    format!("event: {name}\ndata: {data}\n\n")
}

impl Publisher {
    /// Encode `step` once and announce it to every viewer.
    pub fn publish(&mut self, step: &Step) {
        // Plain data with string keys: serialization cannot fail.
        let json: Arc<str> = serde_json::to_string(&step.update)
            .unwrap_or_default()
            .into();
        let old = self.tx.borrow().clone();
        let (meta, meta_json) = if step.meta_changed || old.meta.is_empty() {
            self.meta_version += 1;
            let m = serde_json::to_string(&*step.meta).unwrap_or_default();
            (event("meta", &m).into(), m.into())
        } else {
            (old.meta.clone(), old.meta_json.clone())
        };
        self.seq += 1;
        let mut updates = old.updates.clone();
        if step.meta_changed {
            // Rows of an older node list would be read against the new names.
            updates.clear();
        }
        updates.push_back((self.seq, event("update", &json).into(), json));
        while updates.len() > self.history {
            updates.pop_front();
        }
        self.tx.send_replace(Arc::new(Frames {
            meta_version: self.meta_version,
            meta,
            meta_json,
            updates,
        }));
    }

    /// Viewers connected now (streams of the feed being served).
    pub fn viewers(&self) -> usize {
        self.max_viewers
            .saturating_sub(self.slots.available_permits())
    }
}

impl Feed {
    /// The latest meta and update as one JSON object `{"meta":…,"update":…}` (both `null`
    /// before the first update), for scripts.
    pub fn latest_json(&self) -> String {
        let f = self.rx.borrow().clone();
        let meta: &str = if f.meta_json.is_empty() {
            "null"
        } else {
            &f.meta_json
        };
        let update = f.updates.back().map_or("null", |(_, _, j)| j);
        format!("{{\"meta\":{meta},\"update\":{update}}}")
    }

    /// The latest update, decoded.
    pub fn latest(&self) -> Option<(Meta, Update)> {
        let f = self.rx.borrow().clone();
        let meta = serde_json::from_str(&f.meta_json).ok()?;
        let update = serde_json::from_str(&f.updates.back()?.2).ok()?;
        Some((meta, update))
    }

    /// Serve one viewer on `stream` (whose request head was read) until it goes away or
    /// `shutdown` turns true. `head_only`: a HEAD request, answered with the head alone.
    pub(crate) async fn serve(
        &self,
        mut stream: TcpStream,
        head_only: bool,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            let body = format!(
                "too many dashboard viewers: at most {} at once; try again later\n",
                self.max_viewers
            );
            let head = format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nRetry-After: 10\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
                body.len()
            );
            tracing::debug!(max = self.max_viewers, "dashboard viewer refused");
            stream.write_all(head.as_bytes()).await?;
            if !head_only {
                stream.write_all(body.as_bytes()).await?;
            }
            return Ok(());
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\n";
        write(&mut stream, head.as_bytes()).await?;
        if head_only {
            return Ok(());
        }
        write(&mut stream, b"retry: 2000\n\n").await?;
        let mut rx = self.rx.clone();
        let mut meta_sent = 0u64;
        let mut last_seq = 0u64;
        loop {
            let frames = rx.borrow_and_update().clone();
            let mut out = String::new();
            if frames.meta_version != meta_sent && !frames.meta.is_empty() {
                out.push_str(&frames.meta);
                meta_sent = frames.meta_version;
            }
            for (seq, ev, _) in &frames.updates {
                if *seq > last_seq {
                    out.push_str(ev);
                    last_seq = *seq;
                }
            }
            if !out.is_empty() {
                write(&mut stream, out.as_bytes()).await?;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Ok(()) },
                _ = shutdown.changed() => if *shutdown.borrow() { return Ok(()) },
            }
        }
    }
}

async fn write(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}
