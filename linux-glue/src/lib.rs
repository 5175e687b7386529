//! nprdma on the real Linux memory manager, from user space.
//!
//! The kernel side of this job is an MMU notifier plus fault-in (`hmm_range_fault`) in a small
//! kernel module, nprdma.ko (`linux-glue/kernel/`, C). This crate builds what the real Linux mm
//! allows from user space, measures it, and holds the module's ABI and user-space half:
//!
//! - **Registration without pinning** ([`Glue::register`]): validates a range against the
//!   process's VMAs and records their properties; touches no page; O(VMAs).
//! - **Page state** ([`Glue::page_states`]): present, swapped, huge, frame (root), from
//!   /proc/self/pagemap, /proc/kpageflags and PAGEMAP_SCAN, with mincore as the fallback.
//! - **Fault-in** ([`Glue::fault_in`], [`Resolver::resolve`]): `MADV_POPULATE_READ/WRITE` or a
//!   touching fallback, reporting minor/major faults and huge pages.
//! - **Invalidations** ([`Invalidate`]): a userfaultfd monitor for `madvise(DONTNEED)`, `munmap`
//!   and `mremap`, and a pagemap scan for reclaim ([`Glue::scan_for_reclaim`]), which user space
//!   is not told about.
//! - **The kernel-module ABI** ([`abi`]) and its user-space half ([`kmod`]), tested against an
//!   in-process fake module, and against the module itself by `cargo xtask kernel-test` (the
//!   binary `linux-glue-kmod-test`).
//! - **Backend choice** ([`backend`]): the kernel module when its device is usable, user space
//!   otherwise; `NPRDMA_BACKEND=auto|kernel|user` forces one.
//! - **Swap experiments** ([`swap`]): a swap file and sysctl changes that are always undone.
//!
//! What each mechanism can and cannot see, and the measured costs, are in docs/linux-glue.md.
//!
//! The crate is Linux-only. On any other OS it compiles to an empty crate (and the benchmark
//! binary to a stub that says so), so that a workspace build on another host does not fail.
#![cfg(target_os = "linux")]

pub mod abi;
pub mod backend;
mod classify;
mod error;
mod faultin;
mod glue;
pub mod kmod;
pub mod mapping;
pub mod pagemap;
mod registry;
mod resolver;
mod smmu;
pub mod swap;
mod sys;
mod uffd;
pub mod vma;

pub use error::{GlueError, Result};
pub use faultin::FaultInMethod;
pub use glue::{
    Capabilities, FaultInReport, Glue, GlueConfig, GlueStats, RegionInfo, StatePreference,
    VmaSource,
};
pub use pagemap::{KPageFlags, PageState, PagemapEntry, StateSource};
pub use registry::{Access, Invalidate, InvalidationCause, RegionId};
pub use resolver::{FaultKind, Likely, Resolution, Resolver, TrackedPage};
pub use smmu::SmmuResolver;
pub use vma::{Backing, ThpMode, VmaInfo};
