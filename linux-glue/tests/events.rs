//! Invalidation events from the userfaultfd monitor: DONTNEED, munmap and mremap of registered
//! ranges, and never anything for unregistered memory.
#![cfg(target_os = "linux")]

mod common;

use common::*;
use hal::{AlignedRange, PageSize, VirtAddr};
use linux_glue::mapping::{Advice, Mapping, Protection};
use linux_glue::{Access, GlueError, InvalidationCause};

fn range(start: VirtAddr, len: u64) -> AlignedRange<VirtAddr> {
    AlignedRange::new(start, len, PageSize::Size4K).unwrap()
}

fn needs_uffd(glue: &linux_glue::Glue, test: &str) -> bool {
    if !glue.capabilities().userfaultfd {
        skip(
            test,
            "userfaultfd is not available (needs Linux 5.11+ and root or vm.unprivileged_userfaultfd)",
        );
        return false;
    }
    true
}

#[test]
fn dontneed_is_reported_for_exactly_the_registered_pages() {
    let (glue, rx) = glue();
    if !needs_uffd(&glue, "dontneed") {
        return;
    }
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    m.stamp_pages(1).unwrap();
    // Register the middle four pages only; DONTNEED the whole mapping.
    let id = glue
        .register(m.at(2 * PAGE), 4 * PAGE, Access::Write)
        .unwrap();
    let resolver = glue.resolver();
    resolver.resolve(m.at(3 * PAGE), Access::Write).unwrap();
    assert!(resolver.lookup(m.at(3 * PAGE)).is_some());
    m.advise(0, m.len(), Advice::DontNeed).unwrap();
    let inv = next_event(&rx);
    assert_eq!(inv.region, id);
    assert_eq!(inv.range, range(m.at(2 * PAGE), 4 * PAGE));
    assert_eq!(inv.cause, InvalidationCause::Removed);
    assert_eq!(
        resolver.lookup(m.at(3 * PAGE)),
        None,
        "the invalidation untracked the page"
    );
    assert_quiet(&rx, 50);
    // DONTNEED really happened (anonymous private memory reads back as zero).
    assert_eq!(m.read_u64(3 * PAGE).unwrap(), 0);
    // A DONTNEED outside the registered pages says nothing.
    m.advise(0, 2 * PAGE, Advice::DontNeed).unwrap();
    m.advise(6 * PAGE, 2 * PAGE, Advice::DontNeed).unwrap();
    assert_quiet(&rx, 100);
}

#[test]
fn munmap_is_reported_and_the_range_is_gone() {
    let (glue, rx) = glue();
    if !needs_uffd(&glue, "munmap") {
        return;
    }
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    m.unmap_part(PAGE, 3 * PAGE).unwrap();
    let inv = next_event(&rx);
    assert_eq!(
        (inv.region, inv.range, inv.cause),
        (id, range(m.at(PAGE), 3 * PAGE), InvalidationCause::Unmapped)
    );
    let resolver = glue.resolver();
    assert_eq!(
        resolver.resolve(m.at(2 * PAGE), Access::Write),
        Err(GlueError::RegionGone {
            id: id.0,
            addr: m.at(2 * PAGE).as_u64()
        })
    );
    // The rest of the region still works.
    assert!(resolver.resolve(m.at(5 * PAGE), Access::Write).is_ok());
    let info = glue.region(id).unwrap();
    assert_eq!(
        info.live,
        vec![(m.at(0), m.at(PAGE)), (m.at(4 * PAGE), m.at(8 * PAGE))]
    );
    // Unmapping the rest reports the two remaining pieces.
    drop(m);
    let mut pieces = [next_event(&rx), next_event(&rx)];
    pieces.sort_by_key(|i| i.range.start());
    assert!(
        pieces
            .iter()
            .all(|i| i.cause == InvalidationCause::Unmapped && i.region == id)
    );
    assert_eq!(pieces[0].range.len() + pieces[1].range.len(), 5 * PAGE);
    // Deregistering a region whose memory is gone still works.
    glue.deregister(id).unwrap();
}

#[test]
fn mremap_is_reported_with_the_new_address() {
    let (glue, rx) = glue();
    if !needs_uffd(&glue, "mremap") {
        return;
    }
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    m.stamp_pages(0xabc).unwrap();
    let old = m.addr();
    let id = glue.register(old, m.len(), Access::Write).unwrap();
    let moved = m.move_elsewhere().unwrap();
    let inv = next_event(&rx);
    assert_eq!(inv.region, id);
    assert_eq!(inv.range, range(old, 4 * PAGE));
    assert_eq!(inv.cause, InvalidationCause::Remapped { to: moved.addr() });
    assert_eq!(
        moved.read_u64(2 * PAGE).unwrap(),
        0xabc ^ 2,
        "the data moved with the pages"
    );
    assert!(matches!(
        glue.resolver().resolve(old, Access::Read),
        Err(GlueError::RegionGone { .. })
    ));
    // The kernel moved the userfaultfd registration with the VMA (EVENT_REMAP keeps it); the
    // glue unregistered it, since the moved pages are no registered region: no userfaultfd
    // flag is left on them, and dropping them says nothing.
    let flags = vm_flags(moved.addr().as_u64());
    assert!(
        !flags.split_whitespace().any(|f| f == "uw" || f == "um"),
        "{flags}"
    );
    moved.advise(0, moved.len(), Advice::DontNeed).unwrap();
    assert_quiet(&rx, 100);
}

/// The `VmFlags:` line of the VMA starting at `start` in /proc/self/smaps.
fn vm_flags(start: u64) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let header = format!("{start:x}-");
    smaps
        .lines()
        .skip_while(|l| !l.starts_with(&header))
        .find(|l| l.starts_with("VmFlags:"))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn unregistered_memory_never_produces_events() {
    let (glue, rx) = glue();
    if !needs_uffd(&glue, "unregistered") {
        return;
    }
    let registered = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    glue.register(registered.addr(), registered.len(), Access::Write)
        .unwrap();
    let other = Mapping::anonymous(16 * PAGE, Protection::ReadWrite).unwrap();
    other.stamp_pages(3).unwrap();
    other.advise(0, 8 * PAGE, Advice::DontNeed).unwrap();
    other.unmap_part(8 * PAGE, 4 * PAGE).unwrap();
    let other2 = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    let moved = other2.move_elsewhere().unwrap();
    drop(moved);
    drop(other);
    assert_quiet(&rx, 150);
    assert_eq!(glue.stats().invalidations, 0);
}

#[test]
fn events_are_read_promptly_so_the_application_never_hangs() {
    // Threads that DONTNEED or munmap registered memory wait until the monitor has read the
    // event; many of them in a row must all complete.
    let (glue, rx) = glue();
    if !needs_uffd(&glue, "prompt") {
        return;
    }
    let m = Mapping::anonymous(64 * PAGE, Protection::ReadWrite).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let m = &m;
            s.spawn(move || {
                for round in 0..25 {
                    let page = (t * 16 + round % 16) * PAGE;
                    m.write_u64(page, round).unwrap();
                    m.advise(page, PAGE, Advice::DontNeed).unwrap();
                }
            });
        }
    });
    // Every madvise returned, so the monitor read every event; each becomes one invalidation
    // (possibly a moment after the madvise returned).
    for _ in 0..100 {
        let inv = next_event(&rx);
        assert_eq!(
            (inv.cause, inv.range.len()),
            (InvalidationCause::Removed, PAGE)
        );
    }
    assert_quiet(&rx, 50);
    let stats = glue.stats();
    assert_eq!(stats.uffd_events, 100, "one REMOVE per madvise call");
    assert_eq!(stats.unexpected_faults, 0);
}

#[test]
fn dropping_the_glue_releases_the_registration() {
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    {
        let (glue, _rx) = glue();
        glue.register(m.addr(), m.len(), Access::Write).unwrap();
        let _keep = glue.resolver();
    }
    // With no monitor left, a blocking event would hang this thread; it must not.
    m.advise(0, m.len(), Advice::DontNeed).unwrap();
    drop(m);
}

#[test]
fn map_fixed_over_a_registered_range_is_an_unmap_but_mprotect_says_nothing() {
    let (glue, rx) = glue();
    if !needs_uffd(&glue, "map_fixed") {
        return;
    }
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    // SAFETY: replaces two pages of a mapping this test owns; nothing references them.
    let p = unsafe {
        libc::mmap(
            m.at(2 * PAGE).as_u64() as *mut libc::c_void,
            (2 * PAGE) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p as u64, m.at(2 * PAGE).as_u64());
    let inv = next_event(&rx);
    assert_eq!(
        (inv.region, inv.range, inv.cause),
        (
            id,
            range(m.at(2 * PAGE), 2 * PAGE),
            InvalidationCause::Unmapped
        )
    );
    // A protection change is invisible to userfaultfd (an MMU notifier would see it).
    m.protect(Protection::Read).unwrap();
    assert_quiet(&rx, 100);
}
