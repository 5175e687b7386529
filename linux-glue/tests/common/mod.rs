//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use hal::{AlignedRange, PhysAddr, VirtAddr};
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

/// How many times [`until_agree`] makes its observation.
pub const TRIES: usize = 4;

/// Makes an observation (`attempt`, given its number from 0) until it agrees with what the test
/// expects, at most [`TRIES`] times; panics with every disagreement if it never did.
///
/// For observations the kernel spoils now and then without any bug: it moves a page to another
/// frame (compaction, e.g. for a concurrent test's THP or hugetlb allocation; NUMA balancing)
/// between two reads of its frame, and under memory pressure it reclaims a page, or holds its
/// lock, between a check and a fault. That hits an attempt rarely and several in a row
/// practically never, while a wrong frame or fault kind is wrong on every attempt. Each attempt
/// must set up again what it checks (a fresh fault, a re-tracked range), so that a later attempt
/// tests the same thing as the first.
pub fn until_agree<T>(what: &str, mut attempt: impl FnMut(usize) -> Result<T, String>) -> T {
    let mut seen = Vec::new();
    for i in 0..TRIES {
        match attempt(i) {
            Ok(t) => return t,
            Err(why) => {
                eprintln!("{what}: attempt {i} disagreed: {why}");
                seen.push(why);
            }
        }
    }
    panic!("{what}: disagreed on all {TRIES} attempts: {seen:#?}");
}

/// The frame of each 4 KiB page of `range` per pagemap (None: not present, or PFNs hidden).
pub fn frames(glue: &Glue, range: AlignedRange<VirtAddr>) -> Vec<Option<PhysAddr>> {
    glue.page_states(range)
        .unwrap()
        .iter()
        .map(|s| s.frame)
        .collect()
}
