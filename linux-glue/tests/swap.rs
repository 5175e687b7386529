//! Swap: reclaim detection, major faults from the swap device, and cleanup guarantees.
//!
//! These need root (swapon, sysctl, PFNs) and a file system that takes swap files; they skip
//! with a message otherwise. Every swap user (these tests and the benchmark, in any process)
//! takes `SwapLock`, so they never interleave their sysctl changes.
#![cfg(target_os = "linux")]

mod common;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use common::*;
use linux_glue::mapping::{Advice, Mapping, Protection};
use linux_glue::swap::{self, SwapLab};
use linux_glue::{Access, FaultKind, GlueError, InvalidationCause};

/// Serialises the tests of this binary. `SwapLab` serialises the sysctl changes themselves, but
/// both tests also read `vm.page-cluster` before opening and after closing their lab; without
/// this, the other test's lab could be open at either read (value 0 instead of the original).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // A failed test poisons the lock; the next test must still run.
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn page_cluster() -> String {
    std::fs::read_to_string("/proc/sys/vm/page-cluster")
        .unwrap()
        .trim()
        .to_string()
}

fn open_lab(test: &str, bytes: u64) -> Option<SwapLab> {
    if !root() {
        skip(test, "swap needs root (swapon, sysctl)");
        return None;
    }
    match SwapLab::open(&std::env::temp_dir(), bytes, Some(0)) {
        Ok(lab) => Some(lab),
        Err(e @ (GlueError::Unavailable { .. } | GlueError::PermissionDenied { .. })) => {
            skip(test, &format!("cannot enable a swap file here: {e}"));
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn swap_out_is_detected_and_swap_in_reads_the_device() {
    let _serial = serial();
    let Some(lab) = open_lab("swap lifecycle", 64 * MIB) else {
        return;
    };
    let saved = lab.saved_page_cluster().map(str::to_string);
    let file = lab.swap().path().to_path_buf();
    assert!(lab.swap().is_listed());
    assert_eq!(page_cluster(), "0");

    let (glue, rx) = glue();
    let pages = 256;
    let m = Mapping::anonymous(pages * PAGE, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::NoHugePage).unwrap();
    m.stamp_pages(0xfeed).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    glue.fault_in(m.range().unwrap(), Access::Write).unwrap();

    let pswpout = swap::vmstat("pswpout").unwrap();
    let ev = swap::evict(m.range().unwrap()).unwrap();
    assert!(
        swap::vmstat("pswpout").unwrap() >= pswpout + ev.on_device,
        "pages on the device were written"
    );
    assert!(ev.on_device > 0, "nothing reached the swap device: {ev:?}");

    // Reclaim is silent for userfaultfd; the scan finds it.
    let swapped: u64 = glue
        .page_states(m.range().unwrap())
        .unwrap()
        .iter()
        .filter(|s| s.swapped)
        .count() as u64;
    assert_eq!(swapped, ev.on_device + ev.in_swap_cache);
    let invs = glue.scan_for_reclaim().unwrap();
    let reported: u64 = invs
        .iter()
        .filter(|i| i.cause == InvalidationCause::SwappedOut)
        .map(|i| i.range.page_count())
        .sum();
    assert_eq!(reported, swapped);
    assert!(invs.iter().all(|i| i.region == id));
    assert_eq!(
        rx.try_iter().count(),
        invs.len(),
        "delivered on the channel as well"
    );

    // Resolving reads the pages back from the device: major faults, and pswpin rises.
    let pswpin = swap::vmstat("pswpin").unwrap();
    let migrated = swap::vmstat("pgmigrate_success").ok();
    let r = glue.resolver();
    let mut majors = 0;
    // The frame each page came back in, per its resolution and per pagemap right after it.
    let (mut resolved, mut seen) = (Vec::new(), Vec::new());
    for i in 0..pages {
        let res = r.resolve(m.at(i * PAGE), Access::Write).unwrap();
        let page = hal::AlignedRange::new(m.at(i * PAGE), PAGE, hal::PageSize::Size4K).unwrap();
        seen.push(frames(&glue, page)[0]);
        resolved.push(res.frame);
        if res.kind == FaultKind::Major {
            majors += 1;
        }
    }
    let read = swap::vmstat("pswpin").unwrap() - pswpin;
    println!("eviction {ev:?}; {majors} major faults; pswpin +{read}");
    assert!(
        majors > 0 && majors <= ev.on_device,
        "majors {majors}, evicted {ev:?}"
    );
    assert!(
        read >= majors,
        "each major fault read a page from the device (pswpin +{read})"
    );
    for i in 0..pages {
        assert_eq!(
            m.read_u64(i * PAGE).unwrap(),
            0xfeed ^ i,
            "page {i} came back intact"
        );
    }
    // The resolver re-tracked the pages with their new frames: the scan is quiet, except for
    // pages the kernel has moved (compaction) or reclaimed (memory pressure) since, which
    // pagemap still shows afterwards. A resolution pagemap disagreed with right after it is
    // excused only if the kernel migrated pages meanwhile.
    let invs = glue.scan_for_reclaim().unwrap();
    let now = glue.page_states(m.range().unwrap()).unwrap();
    let kernel_migrated = migrated.is_some() && swap::vmstat("pgmigrate_success").ok() > migrated;
    for inv in &invs {
        for p in 0..inv.range.page_count() {
            let i = ((inv.range.start().as_u64() - m.addr().as_u64()) / PAGE + p) as usize;
            let (now, then) = (now[i], resolved[i]);
            let explained = match inv.cause {
                InvalidationCause::FrameChanged => {
                    assert!(
                        seen[i] == then || kernel_migrated,
                        "page {i} resolved to {then:?}, pagemap showed {:?}",
                        seen[i]
                    );
                    now.present && now.frame != then
                }
                InvalidationCause::SwappedOut => now.swapped,
                _ => false,
            };
            assert!(explained, "page {i} reported in {inv:?}, now {now:?}");
        }
    }

    // Swapped out and back in *between* two scans: only a frame change can tell. Compaction
    // may also move a page between a read of its frame and the scan (no bug, but counted by
    // only one of them): each attempt re-tracks the range and checks that nothing moved.
    if glue.capabilities().pfn_visible {
        let moved = until_agree("frame changes after swap-in", |_| {
            // Re-tracks every page with the frame it is in now.
            glue.fault_in(m.range().unwrap(), Access::Write).unwrap();
            let before = frames(&glue, m.range().unwrap());
            let handed_out: Vec<_> = (0..pages)
                .map(|i| r.lookup(m.at(i * PAGE)).and_then(|t| t.frame))
                .collect();
            if handed_out != before {
                return Err("fault-in tracked other frames than pagemap shows".into());
            }
            let pswpout = swap::vmstat("pswpout").unwrap();
            let ev = swap::evict(m.range().unwrap()).unwrap();
            println!("second eviction {ev:?}");
            // Checked as the first eviction: without pages on the device, no frame changes.
            assert!(
                swap::vmstat("pswpout").unwrap() >= pswpout + ev.on_device,
                "pages on the device were written"
            );
            assert!(
                ev.on_device > 0,
                "second eviction: nothing reached the swap device: {ev:?}"
            );
            m.advise(0, m.len(), Advice::PopulateWrite).unwrap();
            let after = frames(&glue, m.range().unwrap());
            let invs = glue.scan_for_reclaim().unwrap();
            if frames(&glue, m.range().unwrap()) != after {
                return Err("a page moved during the scan".into());
            }
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as u64;
            let changed: u64 = invs
                .iter()
                .filter(|i| i.cause == InvalidationCause::FrameChanged)
                .map(|i| i.range.page_count())
                .sum();
            if changed == moved {
                Ok(moved)
            } else {
                Err(format!("{moved} pages moved, {changed} reported: {invs:?}"))
            }
        });
        assert!(moved > 0, "swap-in put at least one page in a new frame");
    }

    drop(glue);
    drop(m);
    drop(lab);
    assert!(!swap::listed(&file), "swap switched off");
    assert!(!file.exists(), "swap file removed");
    assert_eq!(Some(page_cluster()), saved, "vm.page-cluster restored");
}

#[test]
fn swap_and_sysctl_are_restored_even_when_a_test_panics() {
    if !root() {
        skip("swap cleanup on panic", "swap needs root");
        return;
    }
    let _serial = serial();
    let seen: Mutex<Option<(PathBuf, String)>> = Mutex::new(None);
    let before = page_cluster();
    let outcome = std::panic::catch_unwind(|| {
        let Some(lab) = open_lab("swap cleanup on panic", 16 * MIB) else {
            return;
        };
        *seen.lock().unwrap() = Some((lab.swap().path().to_path_buf(), page_cluster()));
        panic!("deliberate panic with swap enabled");
    });
    let Some((file, during)) = seen.into_inner().unwrap() else {
        return;
    };
    assert!(outcome.is_err(), "the closure panicked");
    assert_eq!(during, "0", "the sysctl was changed while the lab was open");
    assert!(!swap::listed(&file), "swap switched off during unwinding");
    assert!(!file.exists(), "swap file removed during unwinding");
    assert_eq!(
        page_cluster(),
        before,
        "vm.page-cluster restored during unwinding"
    );
}

#[test]
fn eviction_gives_up_on_pages_the_kernel_keeps_mapped() {
    let test = "eviction_gives_up_on_pages_the_kernel_keeps_mapped";
    let _serial = serial();
    // No swap user may switch swap on meanwhile (SwapLab holds the same lock).
    let _swap = swap::SwapLock::acquire().unwrap();
    // Without swap space anonymous pages cannot be paged out: MADV_PAGEOUT leaves them mapped,
    // as it does a page another process shares. The eviction must report them and stop trying
    // rather than spend all of its rounds on them.
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    if swaps.lines().count() > 1 {
        skip(test, "swap is active on this machine (every page could go)");
        return;
    }
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    m.stamp_pages(0x10c4).unwrap();
    let ev = swap::evict(m.range().unwrap()).unwrap();
    println!("{ev:?}");
    assert_eq!((ev.present, ev.on_device), (4, 0), "{ev:?}");
    assert!(ev.rounds < 20, "gave up after a few rounds: {ev:?}");
    for i in 0..4 {
        assert_eq!(m.read_u64(i * PAGE).unwrap(), 0x10c4 ^ i, "page {i} intact");
    }
}
