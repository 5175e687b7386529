//! The touch fallback on a registered file mapping that was unmapped behind the glue's back
//! (userfaultfd does not report the munmap of a file mapping): a typed error, not a SIGSEGV.
//!
//! A binary of its own, with this one test: the check needs the freed address range to stay
//! free until the glue looks at it, and in a binary whose other tests run in parallel threads
//! any of them (or a new thread's stack) can map into the hole, and unmap it again between
//! the glue's check of the live mappings and its touch, which is a real SIGSEGV.
#![cfg(target_os = "linux")]

mod common;

use common::*;
use linux_glue::mapping::{Mapping, Protection};
use linux_glue::{Access, FaultInMethod, Glue, GlueConfig, GlueError};

#[test]
fn the_touch_fallback_refuses_a_registered_file_mapping_that_was_unmapped() {
    let (glue, _rx) = Glue::new(GlueConfig {
        fault_in: FaultInMethod::Touch,
        ..Default::default()
    })
    .unwrap();
    let path = std::env::temp_dir().join(format!("linux-glue-touch-{}", std::process::id()));
    std::fs::write(&path, vec![1u8; 4 * PAGE as usize]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let file = Mapping::file(&f, 4 * PAGE, Protection::Read, false).unwrap();
    std::fs::remove_file(&path).unwrap();
    glue.register(file.addr(), file.len(), Access::Read)
        .unwrap();
    let range = file.range().unwrap();
    file.unmap().unwrap();
    if hole_refilled(range.start(), range.len()) {
        skip("touch after munmap", "something mapped into the hole");
        return;
    }
    let result = glue.fault_in(range, Access::Read);
    assert!(
        matches!(result, Err(GlueError::Unmapped { .. })),
        "{result:?}"
    );
}
