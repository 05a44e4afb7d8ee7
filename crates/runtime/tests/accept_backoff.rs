//! Out of descriptors: the accept loop backs off instead of spinning and
//! takes the waiting connection once descriptors are free again.
//!
//! One test in its own binary: it lowers the process's descriptor limit.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use switchyard_runtime::accept::{accept_loop, AcceptStats, Incoming, WhenFull, BACKOFF_MAX};
use tokio::sync::Semaphore;

fn nofile() -> libc::rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r
}

fn set_nofile(r: &libc::rlimit) {
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, r) }, 0);
}

#[test]
fn emfile_backs_off_then_recovers() {
    // Virtual time: the pauses pass at once, and their number over a stretch of time shows
    // whether the loop spins.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let listener = {
        let _g = rt.enter();
        switchyard_runtime::listen("127.0.0.1:0".parse().unwrap()).unwrap()
    };
    // The client connects before descriptors run out; the kernel queues it for accept.
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();

    let saved = nofile();
    let mut spent = Vec::new();
    // Use up every descriptor below a low limit.
    let mut low = saved;
    low.rlim_cur = 256.min(saved.rlim_cur);
    set_nofile(&low);
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => spent.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
        }
    }

    let stats = Arc::new(AcceptStats::default());
    let slots = Arc::new(Semaphore::new(8));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    rt.block_on(async {
        let st = stats.clone();
        let task = tokio::spawn(async move {
            accept_loop(
                &listener,
                &slots,
                &Default::default(),
                WhenFull::Wait,
                &st,
                |incoming| {
                    if let Incoming::Admitted { peer, .. } = incoming {
                        let _ = tx.send(peer);
                    }
                },
            )
            .await
        });
        let stretch = Duration::from_secs(10);
        tokio::time::sleep(stretch).await;
        let failures = stats.failures.load(Relaxed);
        let backoffs = stats.backoffs.load(Relaxed);
        // At least one pause per failure, each at most BACKOFF_MAX once they have grown: a
        // spinning loop would fail many thousands of times.
        let most = (stretch.as_millis() / BACKOFF_MAX.as_millis()) as u64 + 10;
        assert!(failures >= 2, "{failures} failures");
        assert!(failures <= most, "{failures} failures in {stretch:?}");
        assert_eq!(backoffs, failures);

        // Descriptors are back: the waiting connection is accepted.
        drop(spent);
        let peer = rx.recv().await.expect("the queued connection is accepted");
        assert_eq!(peer, client.local_addr().unwrap());
        task.abort();
    });
    set_nofile(&saved);
}
