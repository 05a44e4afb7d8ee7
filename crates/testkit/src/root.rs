//! The runner of the root test targets (`harness = false`, libtest-mimic):
//! the lab crate's and the binary's network-namespace suites.
//!
//! A root test builds network namespaces and moves sockets with
//! `TCP_REPAIR`, so it needs CAP_NET_ADMIN and CAP_SYS_ADMIN. Without them,
//! or with `SWITCHYARD_SKIP_ROOT_TESTS=1`, the runner reports each test as
//! *ignored* with the reason (`test NAME ... ignored, REASON`), never as
//! passed. With them, a missing tool or kernel feature fails the test with a
//! message that says what is missing. Test names, filters and the usual
//! libtest flags (`--list`, `--exact`, `--test-threads`) work as with the
//! built-in harness.

use libtest_mimic::{Arguments, Completion, Trial};
use switchyard_handoff::netns;

/// One test: its name and its body (which panics on failure).
pub type RootTest = (&'static str, fn());

/// Why the root tests do not run here, or `None` when they do.
pub fn skip_reason() -> Option<String> {
    if std::env::var("SWITCHYARD_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        return Some("SWITCHYARD_SKIP_ROOT_TESTS=1".into());
    }
    if !netns::has_admin_caps() {
        return Some(
            "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to build network namespaces".into(),
        );
    }
    None
}

/// Checks the tools and kernel features the root tests use; the error says
/// what is missing and how to get it.
pub fn requirements() -> Result<(), String> {
    for tool in ["ip", "tc", "nft", "clang", "bpftool", "curl"] {
        if netns::which(tool).is_none() {
            return Err(format!("`{tool}` is missing; run scripts/install-lab-deps"));
        }
    }
    if !std::path::Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        return Err("libbpf headers are missing; run scripts/install-lab-deps".into());
    }
    switchyard_handoff::repair::check_capability()
        .map_err(|e| format!("TCP_REPAIR is unavailable: {e}"))
}

/// The list of tests for [`main`], each named by its function:
/// `root::main(root::tests![first_test, second_test])`.
#[macro_export]
macro_rules! root_tests {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), $name as fn())),*]
    };
}
pub use crate::root_tests as tests;

/// Runs `tests` as this target's test harness and exits with its status.
pub fn main(tests: &[RootTest]) -> ! {
    let args = Arguments::from_args();
    let trials = tests
        .iter()
        .map(|&(name, body)| {
            Trial::ignorable_test(name, move || {
                if let Some(reason) = skip_reason() {
                    return Ok(Completion::ignored_with(reason));
                }
                requirements().map_err(|e| format!("{name}: {e}"))?;
                // A panic in `body` is caught by the harness and reported as
                // this test's failure.
                body();
                Ok(Completion::Completed)
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
