//! Guard regions (`MADV_GUARD_INSTALL`, Linux 6.13+): markers inside a VMA that make any
//! access fault. The VMAs do not show them, pagemap does (bit 58, and bit 62 like a swap
//! entry). A binary of its own: if the touch fallback ever touched one, the SIGSEGV would take
//! the whole test process down.

mod common;

use linux_glue::mapping::{Mapping, Protection};
use linux_glue::{Access, FaultInMethod, Glue, GlueConfig, GlueError, InvalidationCause};

use common::{PAGE, glue, skip};

const MADV_GUARD_INSTALL: i32 = 102;

/// Installs a guard marker over one page; `false` where the kernel has no guard regions.
fn install_guard(m: &Mapping, offset: u64) -> bool {
    // SAFETY: a page of a mapping this test owns; the marker only makes accesses fault.
    let rc = unsafe {
        libc::madvise(
            m.at(offset).as_u64() as *mut libc::c_void,
            PAGE as usize,
            MADV_GUARD_INSTALL,
        )
    };
    rc == 0
}

#[test]
fn the_touch_fallback_refuses_a_guard_page_instead_of_touching_it() {
    let (glue, _rx) = Glue::new(GlueConfig {
        fault_in: FaultInMethod::Touch,
        ..Default::default()
    })
    .unwrap();
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();
    if !install_guard(&m, PAGE) {
        skip(
            "the_touch_fallback_refuses_a_guard_page",
            "no guard regions",
        );
        return;
    }
    let res = glue.fault_in(m.range().unwrap(), Access::Write);
    assert!(
        matches!(res, Err(GlueError::NotReadable { addr }) if addr == m.at(PAGE).as_u64()),
        "{res:?}"
    );
}

#[test]
fn a_guard_page_is_neither_swapped_nor_kept_by_the_reclaim_scan() {
    let (glue, _rx) = glue();
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();
    let resolver = glue.resolver();
    resolver.resolve(m.at(PAGE), Access::Write).unwrap();
    if !install_guard(&m, PAGE) {
        skip("a_guard_page_is_neither_swapped", "no guard regions");
        return;
    }
    let page = hal::AlignedRange::new(m.at(PAGE), PAGE, hal::PageSize::Size4K).unwrap();
    let state = glue.page_states(page).unwrap()[0];
    assert!(state.guard && !state.swapped && !state.present, "{state:?}");
    // The marker zapped the tracked page without a userfaultfd event; the scan finds it gone.
    let scan = glue.scan_for_reclaim().unwrap();
    assert!(
        scan.iter()
            .any(|i| i.cause == InvalidationCause::Dropped && i.range.start() == m.at(PAGE)),
        "{scan:?}"
    );
    assert!(resolver.lookup(m.at(PAGE)).is_none());
}
