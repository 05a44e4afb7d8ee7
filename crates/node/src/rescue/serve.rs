//! The rescue server's part of the connection loop (a child of `conn`, whose buffers and
//! response helpers it uses): a request the virtual host table does not give to the node's
//! own site is answered here — refused, redirected back to an ended origin, or proxied.

use super::*;

use crate::rescue::fetch::{self, Kept, Target};
use crate::rescue::spool::{self, Spool, SpoolBroken};
use crate::rescue::{Answer, Decision, RescueProxy};
use switchyard_http::upstream::BodyLength;
use switchyard_rescue::Origin;

impl<R: Router> Conn<'_, R> {
    /// Answer `head` if a rescue server's name (or a name it does not serve) is asked for;
    /// `None` when the request is for the node's own site (and on a node that rescues no one).
    pub(super) async fn rescue(
        &mut self,
        head: &RequestHead,
        started: Instant,
    ) -> Option<Option<End>> {
        let proxy = self.ctx.rescue.clone()?;
        let decision = proxy.decide(head);
        if let Decision::Own = decision {
            return None;
        }
        let http10 = head.version == Version::Http10;
        let simple = matches!(head.method, Method::Get | Method::Head);
        if simple && head.framing != BodyFraming::None {
            if let Err(e) = self.discard_body(head).await {
                return Some(Some(e));
            }
        }
        // Other methods are refused without reading what they announced: the connection
        // closes (a `CONNECT` never becomes a tunnel).
        let keep = head.keep_alive && simple && !self.stopping();
        self.out.reserve(1024);
        // Bytes served on behalf of an origin count toward its d_resc (seed 001 §4.3).
        let rescued_for = match &decision {
            Decision::Proxy { origin, .. } => self.ctx.traffic.clone().map(|t| (t, origin.peer)),
            _ => None,
        };
        let before = self.produced();
        let end = self
            .rescue_answer(&proxy, decision, head, keep, http10, started)
            .await;
        if let Some((t, peer)) = rescued_for {
            t.rescued(peer, self.produced() - before);
        }
        Some(end)
    }

    async fn rescue_answer(
        &mut self,
        proxy: &Arc<RescueProxy>,
        decision: Decision,
        head: &RequestHead,
        keep: bool,
        http10: bool,
        started: Instant,
    ) -> Option<End> {
        match decision {
            Decision::Own => unreachable!("own-site requests leave `rescue` before this"),
            Decision::Refuse(status) => self.error_response(status, keep, head.method, http10),
            Decision::Redirect(location) => self.redirect_response(&location, keep, http10),
            Decision::Proxy { origin, path } => match proxy.answer(&origin, &path).await {
                Answer::Object(o) => self.proxied(head, &o, keep),
                Answer::Error(status) => self.error_response(status, keep, head.method, http10),
                Answer::Relay => {
                    return self
                        .relay_uncached(proxy, &origin, &path, head, keep, started)
                        .await
                }
                Answer::Spooled(spool) => return self.spooled(&spool, head, keep, started).await,
            },
        }
        self.finish_rescued(started, keep).await
    }

    /// After a response is in the output: account for it, and close or flush as due.
    async fn finish_rescued(&mut self, started: Instant, keep: bool) -> Option<End> {
        self.pending.push(started);
        if !keep {
            return Some(self.close().await);
        }
        if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
            return Some(End::Broken);
        }
        None
    }

    /// Write a stored (or just fetched) object: a 304 when the client's validators match it,
    /// else its status, entity headers and (except for `HEAD`) body.
    fn proxied(&mut self, head: &RequestHead, o: &fetch::Object, keep: bool) {
        let http10 = head.version == Version::Http10;
        let not_modified = o.status == 200
            && match (&head.if_none_match, &head.if_modified_since) {
                (Some(inm), _) => o.etag.as_deref().is_some_and(|e| none_match(inm, e)),
                (None, Some(ims)) => o
                    .last_modified
                    .as_deref()
                    .and_then(|lm| httpdate::parse_http_date(lm).ok())
                    .is_some_and(|lm| not_modified_since(ims, lm)),
                (None, None) => false,
            };
        let status = if not_modified { 304 } else { o.status };
        let bodiless = not_modified || matches!(o.status, 100..=199 | 204 | 304);
        with_date(|date_server| {
            let mut h = ResponseHead::new(&mut self.out, status).lines(date_server);
            for (name, v) in [
                ("Content-Type", &o.content_type),
                ("ETag", &o.etag),
                ("Last-Modified", &o.last_modified),
                ("Cache-Control", &o.cache_control),
                ("Location", &o.location),
            ] {
                if let Some(v) = v {
                    if !(not_modified && name == "Content-Type") {
                        h = h.header(name, v);
                    }
                }
            }
            if !bodiless {
                h = h.content_length(o.body.len() as u64);
            }
            h.connection(keep, http10).finish()
        });
        self.count_status(status);
        if head.method != Method::Head && !bodiless {
            self.out.extend_from_slice(&o.body);
        }
    }

    /// Write a large object from the one fetch shared by its clients: the head at once, then
    /// the body from the spool as it fills, at this client's pace. A fetch that breaks off
    /// before any of the body was sent is a 502; after, the connection closes (the client
    /// sees fewer bytes than `Content-Length` promised).
    async fn spooled(
        &mut self,
        spool: &Spool,
        head: &RequestHead,
        keep: bool,
        started: Instant,
    ) -> Option<End> {
        let http10 = head.version == Version::Http10;
        let bodiless = matches!(spool.status, 100..=199 | 204 | 304);
        let out_mark = self.out.len();
        let written_mark = self.stats.bytes;
        with_date(|date_server| {
            let mut h = ResponseHead::new(&mut self.out, spool.status).lines(date_server);
            let k = &spool.kept;
            for (name, v) in [
                ("Content-Type", &k.content_type),
                ("ETag", &k.etag),
                ("Last-Modified", &k.last_modified),
                ("Cache-Control", &k.cache_control),
                ("Location", &k.location),
            ] {
                if let Some(v) = v {
                    h = h.header(name, v);
                }
            }
            if !bodiless {
                h = h.content_length(spool.len);
            }
            h.connection(keep, http10).finish()
        });
        if head.method != Method::Head && !bodiless {
            let mut rx = spool.subscribe();
            let mut sent = 0u64;
            loop {
                match spool.read(&mut rx, sent, spool::CHUNK, &mut self.out).await {
                    Ok(0) => break,
                    Ok(n) => sent += n as u64,
                    Err(SpoolBroken) if sent == 0 && self.stats.bytes == written_mark => {
                        self.out.truncate(out_mark);
                        self.error_response(502, keep, head.method, http10);
                        return self.finish_rescued(started, keep).await;
                    }
                    Err(SpoolBroken) => return Some(End::Broken),
                }
                if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
                    return Some(End::Broken);
                }
            }
        }
        self.count_status(spool.status);
        self.finish_rescued(started, keep).await
    }

    /// Fetch `path` from `origin` for this client alone and relay the response as it comes,
    /// uncached (a body above the per-object cap, or a response not to be shared).
    async fn relay_uncached(
        &mut self,
        proxy: &RescueProxy,
        origin: &Origin,
        path: &str,
        head: &RequestHead,
        keep: bool,
        started: Instant,
    ) -> Option<End> {
        let http10 = head.version == Version::Http10;
        let is_head = head.method == Method::Head;
        let target = Target {
            addr: origin.addr,
            fqdn: &origin.fqdn,
            path,
            via: &proxy.config().server_name,
        };
        let req = fetch::request(target, if is_head { "HEAD" } else { "GET" }, None);
        let until = tokio::time::Instant::now() + proxy.config().proxy.fetch_timeout();
        let (mut pc, r) =
            match fetch::exchange(proxy.pool(), origin.addr, &req, is_head, until).await {
                Ok(ok) => ok,
                Err(e) => {
                    proxy.count_relay(true);
                    tracing::debug!(origin = %origin.addr, error = %e, "rescue relay failed");
                    self.error_response(fetch::failure_status(&e), keep, head.method, http10);
                    return self.finish_rescued(started, keep).await;
                }
            };
        let meta = r.meta;
        if meta.body == BodyLength::Chunked && http10 {
            // An HTTP/1.0 client cannot take a chunked body.
            proxy.count_relay(true);
            self.error_response(502, keep, head.method, http10);
            return self.finish_rescued(started, keep).await;
        }
        proxy.count_relay(false);
        let kept = Kept::from_head(&r.head);
        let keep = keep && meta.body != BodyLength::UntilClose;
        let out_mark = self.out.len();
        let written_mark = self.stats.bytes;
        with_date(|date_server| {
            let mut h = ResponseHead::new(&mut self.out, meta.status).lines(date_server);
            for (name, v) in [
                ("Content-Type", &kept.content_type),
                ("ETag", &kept.etag),
                ("Last-Modified", &kept.last_modified),
                ("Cache-Control", &kept.cache_control),
                ("Location", &kept.location),
            ] {
                if let Some(v) = v {
                    h = h.header(name, v);
                }
            }
            h = match meta.body {
                BodyLength::Length(n) => h.content_length(n),
                BodyLength::Chunked => h.header("Transfer-Encoding", "chunked"),
                BodyLength::None if is_head => match kept.content_length {
                    Some(n) => h.content_length(n),
                    None => h,
                },
                BodyLength::None if matches!(meta.status, 100..=199 | 204 | 304) => h,
                BodyLength::None => h.content_length(0),
                BodyLength::UntilClose => h,
            };
            h.connection(keep, http10).finish()
        });
        let opts = switchyard_upstream::RelayOptions {
            deadline: switchyard_upstream::Deadline::At(until),
            flush_at: FLUSH_AT,
            flush_end: false,
            direct: None,
        };
        match switchyard_upstream::relay_body(&mut pc, meta.body, meta.keep_alive, self, opts).await
        {
            Ok(done) => {
                if done.reusable {
                    proxy.pool().put(pc);
                }
            }
            Err(e) => {
                tracing::debug!(origin = %origin.addr, error = %e, "rescue relay broke off");
                if self.stats.bytes != written_mark || e.error.is_client() {
                    return Some(End::Broken);
                }
                // Nothing of it reached the client: answer with an error instead.
                self.out.truncate(out_mark);
                self.error_response(fetch::failure_status(&e.error), keep, head.method, http10);
                return self.finish_rescued(started, keep).await;
            }
        }
        self.count_status(meta.status);
        self.finish_rescued(started, keep).await
    }
}
