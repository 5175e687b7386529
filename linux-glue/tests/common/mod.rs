//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use linux_glue::{Glue, GlueConfig, Invalidate};

pub const PAGE: u64 = 4096;
pub const MIB: u64 = 1 << 20;

/// A glue with the default configuration.
pub fn glue() -> (Glue, Receiver<Invalidate>) {
    Glue::new(GlueConfig::default()).expect("open glue")
}

/// Prints why a test is skipped (visible with --nocapture, and in the captured output).
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIP {test}: {why}");
}

/// The next invalidation, or a panic after a generous timeout.
pub fn next_event(rx: &Receiver<Invalidate>) -> Invalidate {
    rx.recv_timeout(Duration::from_secs(5))
        .expect("an invalidation within 5 s")
}

/// Asserts that no invalidation arrives within `ms` milliseconds.
pub fn assert_quiet(rx: &Receiver<Invalidate>, ms: u64) {
    match rx.recv_timeout(Duration::from_millis(ms)) {
        Err(RecvTimeoutError::Timeout) => {}
        Ok(inv) => panic!("unexpected invalidation {inv:?}"),
        Err(e) => panic!("channel closed: {e}"),
    }
}

/// Whether this process can see PFNs (CAP_SYS_ADMIN).
pub fn root() -> bool {
    // Root is the only way CAP_SYS_ADMIN is present in this project's CI.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether anything is mapped in `[addr, addr + len)` now, per /proc/self/maps. A test that
/// unmaps part of its mapping and expects `Unmapped` asks this afterwards: another test thread's
/// small `mmap` may land in the fresh hole first, and then the expectation does not apply.
pub fn hole_refilled(addr: hal::VirtAddr, len: u64) -> bool {
    let (start, end) = (addr.as_u64(), addr.as_u64() + len);
    linux_glue::vma::maps_in_range(start, end).is_ok_and(|vmas| !vmas.is_empty())
}
