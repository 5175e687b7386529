//! Fault-in, resolution and page state on real memory.
#![cfg(target_os = "linux")]

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use hal::{AlignedRange, PageSize, VirtAddr};
use linux_glue::mapping::{Advice, Mapping, Protection};
use linux_glue::{
    Access, FaultInMethod, FaultKind, Glue, GlueConfig, StatePreference, StateSource, ThpMode,
};

fn range(start: VirtAddr, len: u64) -> AlignedRange<VirtAddr> {
    AlignedRange::new(start, len, PageSize::Size4K).unwrap()
}

#[test]
fn first_touch_is_a_minor_fault_and_the_frame_matches_pagemap() {
    let (glue, _rx) = glue();
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::NoHugePage).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();
    let r = glue.resolver();

    assert_eq!(r.lookup(m.at(3 * PAGE)), None, "nothing handed out yet");
    let first = r.resolve(m.at(3 * PAGE + 100), Access::Write).unwrap();
    let tracked = r.lookup(m.at(3 * PAGE + 8)).unwrap();
    assert_eq!(
        (tracked.addr, tracked.frame, tracked.huge),
        (m.at(3 * PAGE), first.frame, false)
    );
    assert_eq!(r.lookup(m.at(4 * PAGE)), None);
    assert_eq!(first.addr, m.at(3 * PAGE));
    assert_eq!(first.kind, FaultKind::Minor);
    assert_eq!(first.size, PageSize::Size4K);
    assert_eq!(first.mapping, range(m.at(3 * PAGE), PAGE));
    assert!(!first.huge);

    let state = glue.page_states(range(m.at(3 * PAGE), PAGE)).unwrap()[0];
    assert!(state.present && state.exclusive && !state.swapped);
    assert_eq!(state.source, StateSource::Pagemap);
    if glue.capabilities().pfn_visible {
        assert!(first.frame.is_some());
        assert!(!state.zero_page);
        // The frame reported is the one pagemap shows. Compaction may move the page between
        // the two reads; a retry drops the page and checks a fresh first touch.
        until_agree("first-touch frame", |attempt| {
            let (res, now) = if attempt == 0 {
                (first, state.frame)
            } else {
                m.advise(3 * PAGE, PAGE, Advice::DontNeed).unwrap();
                let res = r.resolve(m.at(3 * PAGE), Access::Write).unwrap();
                (res, frames(&glue, range(m.at(3 * PAGE), PAGE))[0])
            };
            match (res.kind, res.frame) {
                (FaultKind::Minor, f) if f == now => Ok(()),
                (kind, f) => Err(format!("{kind:?} fault, frame {f:?}, pagemap {now:?}")),
            }
        });
    } else {
        skip("frame check", "PFNs need CAP_SYS_ADMIN");
        assert_eq!(first.frame, None);
    }

    // Resolving a present page faults nothing and reports the frame the page is in (pagemap is
    // read just before; compaction moving the page in between is retried).
    until_agree("frame of a present page", |_| {
        let now = frames(&glue, range(m.at(3 * PAGE), PAGE))[0];
        let again = r.resolve(m.at(3 * PAGE), Access::Write).unwrap();
        match (again.kind, again.frame) {
            (FaultKind::AlreadyPresent, f) if f == now => Ok(()),
            (kind, f) => Err(format!("{kind:?} reported {f:?}, pagemap showed {now:?}")),
        }
    });
    // Only the resolved page was faulted in.
    let states = glue.page_states(m.range().unwrap()).unwrap();
    assert_eq!(states.iter().filter(|s| s.present).count(), 1);
}

#[test]
fn reads_of_private_memory_get_a_stable_frame_not_the_zero_page() {
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::NoHugePage).unwrap();

    let (exact, _rx) = Glue::new(GlueConfig {
        stable_frames: false,
        ..Default::default()
    })
    .unwrap();
    exact.register(m.addr(), 2 * PAGE, Access::Read).unwrap();
    let res = exact.resolver().resolve(m.addr(), Access::Read).unwrap();
    assert_eq!(res.faulted_for, Access::Read);
    let s = exact.page_states(range(m.addr(), PAGE)).unwrap()[0];
    assert!(s.present);
    if exact.capabilities().kpageflags {
        assert!(
            s.zero_page,
            "a read fault on untouched anonymous memory maps the shared zero page"
        );
    }

    let (stable, _rx) = glue();
    stable
        .register(m.at(2 * PAGE), 2 * PAGE, Access::Read)
        .unwrap();
    let res = stable
        .resolver()
        .resolve(m.at(2 * PAGE), Access::Read)
        .unwrap();
    assert_eq!(res.faulted_for, Access::Write);
    let s = stable.page_states(range(m.at(2 * PAGE), PAGE)).unwrap()[0];
    assert!(s.present && s.exclusive && !s.zero_page);
}

#[test]
fn touch_ahead_faults_in_the_range() {
    let (glue, _rx) = glue();
    let m = Mapping::anonymous(64 * PAGE, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::NoHugePage).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    let rep = glue
        .fault_in(range(m.at(16 * PAGE), 32 * PAGE), Access::Write)
        .unwrap();
    assert_eq!(rep.pages_present, 32);
    assert_eq!(rep.minor_faults, 32, "one zero-fill fault per 4 KiB page");
    assert_eq!(rep.major_faults, 0);
    assert_eq!(rep.huge_blocks, 0);
    assert_eq!(rep.method, FaultInMethod::Populate);
    assert_eq!(glue.region(id).unwrap().tracked_pages, 32);
    let states = glue.page_states(m.range().unwrap()).unwrap();
    let present: Vec<bool> = states.iter().map(|s| s.present).collect();
    let expected: Vec<bool> = (0..64).map(|i| (16..48).contains(&i)).collect();
    assert_eq!(present, expected);
    // Faulting in again costs nothing.
    let rep = glue
        .fault_in(range(m.at(16 * PAGE), 32 * PAGE), Access::Write)
        .unwrap();
    assert_eq!((rep.minor_faults, rep.major_faults), (0, 0));
}

#[test]
fn the_touch_fallback_faults_in_without_losing_concurrent_writes() {
    let (glue, _rx) = Glue::new(GlueConfig {
        fault_in: FaultInMethod::Touch,
        ..Default::default()
    })
    .unwrap();
    let m = Mapping::anonymous(16 * PAGE, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::NoHugePage).unwrap();
    m.stamp_pages(0x77).unwrap();
    m.advise(8 * PAGE, 8 * PAGE, Advice::DontNeed).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();

    let rep = glue.fault_in(m.range().unwrap(), Access::Write).unwrap();
    assert_eq!(rep.method, FaultInMethod::Touch);
    assert_eq!(rep.pages_present, 16);
    assert_eq!(
        rep.minor_faults, 8,
        "the 8 dropped pages are zero-filled; the others were present"
    );
    for i in 0..8 {
        assert_eq!(
            m.read_u64(i * PAGE).unwrap(),
            0x77 ^ i,
            "touching must not change data"
        );
    }

    // A writer increments the first word of page 0 while the resolver write-touches it many
    // times (each touch is a CAS of the word with itself): no increment may be lost.
    let counter = m.addr().as_u64() as usize;
    m.write_u64(0, 0).unwrap();
    let r = glue.resolver();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: the word lies in the mapping owned by this test and is only accessed
            // atomically while the threads run.
            let w = unsafe { AtomicU64::from_ptr(counter as *mut u64) };
            for _ in 0..200_000 {
                w.fetch_add(1, Ordering::Relaxed);
            }
        });
        s.spawn(|| {
            for _ in 0..2_000 {
                r.resolve(m.addr(), Access::Write).unwrap();
            }
        });
    });
    assert_eq!(m.read_u64(0).unwrap(), 200_000);
}

#[test]
fn the_touch_fallback_checks_the_live_mappings_not_the_registration_snapshot() {
    // A change userfaultfd does not report: an mprotect of registered memory. Touching it
    // would be a SIGSEGV in this process.
    let (glue, _rx) = Glue::new(GlueConfig {
        fault_in: FaultInMethod::Touch,
        ..Default::default()
    })
    .unwrap();
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();
    m.protect(Protection::Read).unwrap();
    assert!(matches!(
        glue.fault_in(m.range().unwrap(), Access::Write),
        Err(linux_glue::GlueError::NotWritable { .. })
    ));
    // Reads are still fine (the pages are readable); with stable frames a read of private
    // writable memory is a write touch, which the live VMA now forbids.
    m.protect(Protection::None).unwrap();
    assert!(matches!(
        glue.fault_in(m.range().unwrap(), Access::Read),
        Err(linux_glue::GlueError::NotReadable { .. })
    ));

    // The munmap of a registered file mapping: tests/touch_unmapped.rs, a binary of its own.
}

#[test]
fn huge_pages_are_resolved_as_2m_blocks() {
    let (glue, _rx) = glue();
    let caps = glue.capabilities();
    if caps.thp_mode == ThpMode::Never || caps.thp_mode == ThpMode::Unknown {
        skip("huge_pages", "transparent huge pages are disabled");
        return;
    }
    let m = Mapping::anonymous_aligned(4 * MIB, 2 * MIB, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::HugePage).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    // smaps says THPeligible; with PROCMAP_QUERY anonymous memory is registered without
    // reading smaps, so eligibility is unknown and resolution checks the block.
    let expected = if caps.procmap_query { None } else { Some(true) };
    assert_eq!(glue.region(id).unwrap().vmas[0].thp_eligible, expected);
    let res = glue
        .resolver()
        .resolve(m.at(2 * MIB + 5 * PAGE), Access::Write)
        .unwrap();
    if !res.huge {
        let fallback = linux_glue::swap::vmstat("thp_fault_fallback").unwrap_or(0);
        // This process's own count: the system-wide thp_fault_alloc moves whenever any other
        // process (or test thread) gets a THP.
        assert_eq!(
            anon_huge_kb(m.at(2 * MIB)),
            Some(0),
            "a THP was allocated but not reported"
        );
        skip(
            "huge_pages",
            &format!("the kernel fell back to 4 KiB pages (thp_fault_fallback {fallback})"),
        );
        return;
    }
    assert_eq!(
        res.kind,
        FaultKind::Minor,
        "one fault maps the whole 2 MiB block"
    );
    assert_eq!(res.size, PageSize::Size2M);
    assert_eq!(
        res.mapping,
        AlignedRange::new(m.at(2 * MIB), 2 * MIB, PageSize::Size2M).unwrap()
    );
    let states = glue.page_states(m.range().unwrap()).unwrap();
    assert!(
        states[..512].iter().all(|s| !s.present),
        "the first block was not touched"
    );
    assert!(states[512..].iter().all(|s| s.present && s.huge));
    if caps.pfn_visible {
        let frame = res.frame.unwrap().as_u64();
        assert_eq!(frame % (2 * MIB), 0, "a PMD maps a 2 MiB-aligned frame");
        for (i, s) in states[512..].iter().enumerate() {
            assert_eq!(s.frame.unwrap().as_u64(), frame + i as u64 * PAGE);
        }
    }
    if caps.kpageflags {
        assert!(states[512..].iter().all(|s| s.thp));
    }
    assert_eq!(glue.region(id).unwrap().tracked_pages, 512);
    // Touch-ahead over both blocks reports one more huge block and one fault.
    let rep = glue.fault_in(m.range().unwrap(), Access::Write).unwrap();
    if anon_huge_kb(m.addr()) != Some(4 * MIB / 1024) {
        // The first block's THP allocation fell back to 4 KiB pages (fragmented memory, or
        // the hugetlb test reserving huge pages at the same moment): only one block is huge.
        assert_eq!(rep.huge_blocks, 1, "{rep:?}");
        skip(
            "huge_pages",
            "the kernel fell back to 4 KiB pages for the first block",
        );
        return;
    }
    assert_eq!(rep.huge_blocks, 2);
    assert_eq!(rep.minor_faults, 1);
}

/// `AnonHugePages` (kB) of the VMA containing `addr`, from /proc/self/smaps: the THPs mapped
/// there, independent of pagemap and of other processes.
fn anon_huge_kb(addr: VirtAddr) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        if let Ok(v) = linux_glue::vma::parse_maps_line(line) {
            inside = v.start <= addr && addr < v.end;
        } else if inside && let Some(kb) = line.strip_prefix("AnonHugePages:") {
            return kb.trim().trim_end_matches("kB").trim().parse().ok();
        }
    }
    None
}

#[test]
fn page_cache_faults_are_minor_then_major_after_the_cache_is_dropped() {
    let path = std::env::temp_dir().join(format!("linux-glue-pagecache-{}", std::process::id()));
    let data: Vec<u8> = (0..64 * PAGE).map(|i| (i / PAGE) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let m = Mapping::file(&f, 64 * PAGE, Protection::Read, true).unwrap();
    std::fs::remove_file(&path).unwrap();
    let (glue, _rx) = glue();
    glue.register(m.addr(), m.len(), Access::Read).unwrap();
    let r = glue.resolver();

    // In the page cache (just written): a minor fault, which maps neighbours too (fault-around).
    // Under memory pressure reclaim may take the page (it is read back: major) or hold its lock
    // (the fault is retried, which counts as major) just then: a retry unmaps the page and
    // reads it into the cache again.
    let res = until_agree("page-cache hit", |attempt| {
        if attempt > 0 {
            m.advise(5 * PAGE, PAGE, Advice::DontNeed).unwrap();
            f.read_exact_at(&mut [0; 8], 5 * PAGE).unwrap();
        }
        let res = r.resolve(m.at(5 * PAGE), Access::Read).unwrap();
        match res.kind {
            FaultKind::Minor => Ok(res),
            kind => Err(format!("{kind:?} fault on a cached page")),
        }
    });
    assert_eq!(
        res.faulted_for,
        Access::Read,
        "a shared mapping keeps its frame on CPU writes"
    );
    assert_eq!(m.read_u64(5 * PAGE).unwrap(), 0x0505_0505_0505_0505);

    // Write back, unmap from us and drop the cache: the next fault reads the disk. The drop is
    // confirmed first (it can leave pages behind); a retry covers the page being read back in
    // between, which nothing here should do.
    let dropped = until_agree("fault after the cache drop", |_| {
        m.advise(0, m.len(), Advice::DontNeed).unwrap();
        if !drop_cached(&f, m.at(40 * PAGE)) {
            return Ok(false);
        }
        let res = r.resolve(m.at(40 * PAGE), Access::Read).unwrap();
        match res.kind {
            FaultKind::Major => Ok(true),
            kind => Err(format!("{kind:?} fault on a page mincore showed uncached")),
        }
    });
    if !dropped {
        skip(
            "page cache drop",
            "POSIX_FADV_DONTNEED left the page in the page cache for 1 s",
        );
        return;
    }
    assert_eq!(m.read_u64(40 * PAGE).unwrap(), 0x2828_2828_2828_2828);
}

/// Writes `f` back and drops its page cache until mincore shows the page at `addr` (in a shared
/// mapping of `f` that maps none of its pages now) uncached; false if it stays cached. One
/// POSIX_FADV_DONTNEED skips pages that are dirty, under writeback, locked (reclaim, read-ahead)
/// or still in a CPU's LRU batch, so under load it may take a few.
fn drop_cached(f: &std::fs::File, addr: VirtAddr) -> bool {
    for _ in 0..100 {
        f.sync_all().unwrap();
        // SAFETY: fadvise on an fd the caller owns.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        if !linux_glue::pagemap::mincore(addr.as_u64(), 1).unwrap()[0] {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

#[test]
fn a_page_state_query_too_large_to_buffer_is_an_error() {
    // 2^50 pages: no buffer of one entry per page can be allocated, with either source.
    let huge = range(VirtAddr::new(0), 1 << 62);
    for state_source in [StatePreference::Auto, StatePreference::Mincore] {
        let (glue, _rx) = Glue::new(GlueConfig {
            state_source,
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(
            glue.page_states(huge),
            Err(linux_glue::GlueError::InvalidArgument { .. })
        ));
    }
}

#[test]
fn mincore_answers_presence_when_asked_to() {
    let (glue, _rx) = Glue::new(GlueConfig {
        state_source: StatePreference::Mincore,
        ..Default::default()
    })
    .unwrap();
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    m.advise(0, m.len(), Advice::NoHugePage).unwrap();
    m.write_u64(2 * PAGE, 1).unwrap();
    m.write_u64(5 * PAGE, 1).unwrap();
    let states = glue.page_states(m.range().unwrap()).unwrap();
    assert!(
        states
            .iter()
            .all(|s| s.source == StateSource::Mincore && s.frame.is_none())
    );
    let present: Vec<usize> = states
        .iter()
        .enumerate()
        .filter(|(_, s)| s.present)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(present, vec![2, 5]);
    // mincore reports ENOMEM for unmapped memory.
    m.unmap_part(6 * PAGE, 2 * PAGE).unwrap();
    let hole = glue.page_states(m.range().unwrap());
    if hole_refilled(m.at(6 * PAGE), 2 * PAGE) {
        skip(
            "mincore hole",
            "another test thread mapped into the hole first",
        );
    } else {
        assert!(
            matches!(hole, Err(linux_glue::GlueError::Unmapped { .. })),
            "{hole:?}"
        );
    }
}

#[test]
fn file_pages_reclaimed_behind_our_back_are_found_by_the_scan() {
    // Memory pressure may also reclaim pages of the file on its own (or compaction move them),
    // which the scans rightly report too: a run so disturbed is repeated with a fresh file.
    until_agree("file reclaim", file_reclaim_is_found);
}

/// One run of the test above (`attempt` keeps the file names apart).
fn file_reclaim_is_found(attempt: usize) -> Result<(), String> {
    let path = std::env::temp_dir().join(format!(
        "linux-glue-reclaim-{}-{attempt}",
        std::process::id()
    ));
    std::fs::write(&path, vec![9u8; 16 * PAGE as usize]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    // Clean pages read back from disk: reclaim does not write back dirty file pages for
    // MADV_PAGEOUT.
    f.sync_all().unwrap();
    // SAFETY: fadvise on an fd this test owns.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let m = Mapping::file(&f, 16 * PAGE, Protection::Read, false).unwrap();
    std::fs::remove_file(&path).unwrap();
    let (glue, rx) = glue();
    let id = glue.register(m.addr(), m.len(), Access::Read).unwrap();
    glue.fault_in(m.range().unwrap(), Access::Read).unwrap();
    let early = glue.scan_for_reclaim().unwrap();
    if !early.is_empty() {
        return Err(format!("reported before anything changed: {early:?}"));
    }

    // Reclaim (clean page-cache pages mapped only here): no userfaultfd event exists for it.
    m.advise(0, 8 * PAGE, Advice::PageOut).unwrap();
    let gone = glue
        .page_states(range(m.addr(), 8 * PAGE))
        .unwrap()
        .iter()
        .filter(|s| !s.present)
        .count() as u64;
    if gone == 0 {
        skip(
            "file reclaim",
            "MADV_PAGEOUT reclaimed nothing (page shared elsewhere?)",
        );
        return Ok(());
    }
    let invs = glue.scan_for_reclaim().unwrap();
    let pages: u64 = invs.iter().map(|i| i.range.page_count()).sum();
    let as_expected = invs.iter().all(|i| {
        i.region == id
            && i.cause == linux_glue::InvalidationCause::Dropped
            && i.range.end() <= m.at(8 * PAGE)
    });
    if pages != gone || !as_expected {
        return Err(format!("{gone} of pages 0..8 gone, reported {invs:?}"));
    }
    // Delivered on the channel too, and not reported twice.
    let delivered = rx.try_iter().count();
    if delivered != invs.len() {
        return Err(format!("{delivered} delivered, {} reported", invs.len()));
    }
    let again = glue.scan_for_reclaim().unwrap();
    if !again.is_empty() {
        return Err(format!("reported again: {again:?}"));
    }
    Ok(())
}

#[test]
fn the_scan_reports_unmapped_file_pages_and_goes_on_to_later_regions() {
    // File mappings are not watched by userfaultfd, so only the scan notices their unmapping;
    // mincore refuses a range with a hole, which must neither fail the scan nor hide the
    // regions after it.
    for state_source in [StatePreference::Mincore, StatePreference::Auto] {
        until_agree("unmapped file pages", |attempt| {
            unmapped_file_pages_are_found(state_source, attempt)
        });
    }
}

/// One run of the test above.
fn unmapped_file_pages_are_found(
    state_source: StatePreference,
    attempt: usize,
) -> Result<(), String> {
    let path = std::env::temp_dir().join(format!(
        "linux-glue-unmapped-{}-{state_source:?}-{attempt}",
        std::process::id()
    ));
    std::fs::write(&path, vec![5u8; 4 * PAGE as usize]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let maps: Vec<Mapping> = (0..2)
        .map(|_| Mapping::file(&f, 4 * PAGE, Protection::Read, false).unwrap())
        .collect();
    std::fs::remove_file(&path).unwrap();
    let (glue, rx) = Glue::new(GlueConfig {
        state_source,
        ..Default::default()
    })
    .unwrap();
    let ids: Vec<_> = maps
        .iter()
        .map(|m| {
            let id = glue.register(m.addr(), m.len(), Access::Read).unwrap();
            glue.fault_in(m.range().unwrap(), Access::Read).unwrap();
            id
        })
        .collect();
    // Page 1 of each mapping goes; it was handed out, so it must be reported.
    for m in &maps {
        m.unmap_part(PAGE, PAGE).unwrap();
    }
    if maps.iter().any(|m| hole_refilled(m.at(PAGE), PAGE)) {
        return Err("another thread mapped into a hole first".into());
    }
    let invs = glue
        .scan_for_reclaim()
        .map_err(|e| format!("the scan failed: {e}"))?;
    let mut seen: Vec<_> = invs
        .iter()
        .map(|i| (i.region, i.range.start(), i.range.page_count(), i.cause))
        .collect();
    seen.sort_by_key(|s| s.1);
    let mut want: Vec<_> = maps
        .iter()
        .zip(&ids)
        .map(|(m, id)| (*id, m.at(PAGE), 1, linux_glue::InvalidationCause::Dropped))
        .collect();
    want.sort_by_key(|w| w.1);
    if seen != want {
        return Err(format!("reported {seen:?}, expected {want:?}"));
    }
    assert_eq!(rx.try_iter().count(), 2, "both delivered to the sink");
    let again = glue.scan_for_reclaim().unwrap();
    assert!(again.is_empty(), "reported again: {again:?}");
    Ok(())
}

#[test]
fn hugetlb_pages_resolve_with_their_page_size() {
    if !root() {
        skip("hugetlb", "reserving huge pages needs root");
        return;
    }
    // Serialise system-setting changes with the swap users (same lock).
    let _lock = linux_glue::swap::SwapLock::acquire().unwrap();
    let old: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let Ok(_guard) = linux_glue::swap::SysctlGuard::set("vm.nr_hugepages", &(old + 2).to_string())
    else {
        skip("hugetlb", "cannot change vm.nr_hugepages");
        return;
    };
    let Ok(m) = Mapping::hugetlb_2m(4 * MIB) else {
        skip("hugetlb", "no 2 MiB huge pages could be reserved");
        return;
    };
    let (glue, _rx) = glue();
    // Registration must follow the VMA's page size.
    assert_eq!(
        glue.register(m.at(PAGE), PAGE, Access::Write),
        Err(linux_glue::GlueError::Misaligned {
            value: m.at(PAGE).as_u64(),
            align: 2 * MIB
        })
    );
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    assert_eq!(glue.region(id).unwrap().vmas[0].page_size, PageSize::Size2M);
    let res = glue
        .resolver()
        .resolve(m.at(2 * MIB + 7 * PAGE), Access::Write);
    let res = match res {
        Ok(r) => r,
        Err(e) => {
            skip("hugetlb", &format!("fault-in failed: {e}"));
            return;
        }
    };
    assert!(res.huge);
    assert_eq!(res.size, PageSize::Size2M);
    assert_eq!(
        res.mapping,
        AlignedRange::new(m.at(2 * MIB), 2 * MIB, PageSize::Size2M).unwrap()
    );
    assert_eq!(res.kind, FaultKind::Minor);
    if let Some(f) = res.frame {
        assert_eq!(f.as_u64() % (2 * MIB), 0);
    }
    let states = glue.page_states(m.range().unwrap()).unwrap();
    assert!(states[512..].iter().all(|s| s.present && s.huge));
    assert!(states[..512].iter().all(|s| !s.present));
    // Hugetlb memory shows as a file in /proc/self/maps, but userfaultfd watches it: a
    // DONTNEED is reported and the tracked block forgotten.
    let info = glue.region(id).unwrap();
    if glue.capabilities().userfaultfd {
        assert!(
            info.monitored.iter().any(|&(s, _)| s == m.addr()),
            "{info:?}"
        );
        m.advise(2 * MIB, 2 * MIB, linux_glue::mapping::Advice::DontNeed)
            .unwrap();
        let inv = next_event(&_rx);
        assert_eq!(inv.cause, linux_glue::InvalidationCause::Removed);
        assert!(glue.resolver().lookup(m.at(2 * MIB)).is_none());
    }
    drop(glue);
    drop(m);
}

/// VmRSS of this process in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap()
}

#[test]
fn the_tracked_table_does_not_grow_with_the_untouched_part() {
    let (glue, _rx) = glue();
    let len = 16 * 1024 * MIB;
    let Ok(m) = Mapping::anonymous(len, Protection::ReadWrite) else {
        skip("tracked table", "cannot reserve 16 GiB of address space");
        return;
    };
    m.advise(0, 4 * MIB, Advice::NoHugePage).unwrap();
    let id = glue.register(m.addr(), len, Access::Write).unwrap();
    let before = rss_kib();
    let r = glue.resolver();
    r.resolve(m.at(0), Access::Write).unwrap();
    r.resolve(m.at(len - PAGE), Access::Write).unwrap();
    let grew = rss_kib().saturating_sub(before);
    let info = glue.region(id).unwrap();
    assert_eq!(info.tracked_pages, 2);
    assert_eq!(
        info.tracked_table_bytes,
        2 * 4096,
        "one 4 KiB chunk per 2 MiB holding a tracked page"
    );
    // A dense table would be 32 MiB here; two pages and two chunks are a few KiB.
    assert!(grew < 4096, "RSS grew by {grew} KiB");
    glue.deregister(id).unwrap();
}
