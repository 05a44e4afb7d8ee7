//! Real engines for the tests (`switchyard_testkit::engines`: an etcd cluster and a BIND 9
//! `named` with a TSIG key and zones), with what only these tests need: the etcd leader and
//! A records with their TTLs through hickory.

#![allow(dead_code, unused_imports)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_client::client::{AsyncClient, ClientHandle};
use hickory_proto::iocompat::AsyncIoTokioAsStd;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use hickory_proto::tcp::TcpClientStream;

pub use switchyard_testkit::engines::{
    free_ports, require, spawn, Etcd, Log, Named, Zone, KEY, KEY_NAME,
};

/// The index of the leader of `etcd`, as member `asked` sees it.
pub async fn leader(etcd: &Etcd, asked: usize) -> Option<usize> {
    let mut c = etcd_client::Client::connect([&etcd.members[asked].client_url], None)
        .await
        .ok()?;
    let st = tokio::time::timeout(Duration::from_secs(2), c.status())
        .await
        .ok()?
        .ok()?;
    let leader = st.leader();
    for (i, m) in etcd.members.iter().enumerate() {
        let Ok(mut c) = etcd_client::Client::connect([&m.client_url], None).await else {
            continue;
        };
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), c.status()).await {
            if s.header().map(|h| h.member_id()) == Some(leader) {
                return Some(i);
            }
        }
    }
    None
}

/// Starts named on a free port with [`named_on`]'s zones.
pub fn named() -> Named {
    named_on(free_ports(1)[0])
}

/// Starts named on `port` with zone `origin.test` (updates allowed with the key; `www` at
/// 10.0.0.1) and zone `refuse.test` (no updates allowed), and waits until it runs.
pub fn named_on(port: u16) -> Named {
    let www = [("www", "10.0.0.1")];
    let mut refuse = Zone::updatable("refuse.test", &www);
    refuse.updatable = false;
    Named::start_zones(port, &[Zone::updatable("origin.test", &www), refuse])
}

/// The A records of `name` at `server` (an unsigned query), with their TTLs, sorted.
pub async fn a_records(server: SocketAddr, name: &str) -> Vec<(IpAddr, u32)> {
    let (stream, handle) = TcpClientStream::<AsyncIoTokioAsStd<tokio::net::TcpStream>>::new(server);
    let (mut c, bg) = AsyncClient::new(stream, handle, None).await.unwrap();
    tokio::spawn(bg);
    let resp = c
        .query(Name::from_ascii(name).unwrap(), DNSClass::IN, RecordType::A)
        .await
        .unwrap();
    let mut v: Vec<(IpAddr, u32)> = resp
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            Some(RData::A(a)) => Some((IpAddr::V4(a.0), r.ttl())),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

/// Waits until `f` holds for the value in `rx`, at most `limit`; panics with `what` otherwise.
pub async fn wait_until<T: Clone>(
    rx: &mut tokio::sync::watch::Receiver<T>,
    limit: Duration,
    what: &str,
    mut f: impl FnMut(&T) -> bool,
) -> T {
    match tokio::time::timeout(limit, rx.wait_for(|v| f(v))).await {
        Ok(Ok(v)) => v.clone(),
        Ok(Err(_)) => panic!("{what}: the sender went away"),
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}
