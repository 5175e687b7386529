//! The user-space half of the kernel-module ABI, against the fake module.
#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;

use common::*;
use hal::{AlignedRange, PageSize, VirtAddr};
use linux_glue::abi::{self, AbiHeader, AbiStruct, FaultInArgs, InvalidationRecord};
use linux_glue::kmod::{
    DmaDirection, FAKE_PFN_BASE, FakeModule, ModuleBackend, ModuleClient, RealModule,
};
use linux_glue::{Access, FaultKind, GlueError};

const BASE: u64 = 0x7f00_0000_0000;

fn range(start: u64, len: u64) -> AlignedRange<VirtAddr> {
    AlignedRange::new(VirtAddr::new(start), len, PageSize::Size4K).unwrap()
}

fn client() -> (Arc<FakeModule>, ModuleClient<Arc<FakeModule>>) {
    let fake = Arc::new(FakeModule::new());
    let c = ModuleClient::connect(Arc::clone(&fake)).unwrap();
    (fake, c)
}

#[test]
fn the_handshake_refuses_another_abi_version() {
    // ABI 1 was the fake-only ABI before the module existed.
    let e = ModuleClient::connect(FakeModule::with_version(1)).unwrap_err();
    assert_eq!(
        e,
        GlueError::AbiVersion {
            ours: abi::ABI_VERSION,
            theirs: 1
        }
    );
    let (_, c) = client();
    assert_eq!(
        c.features(),
        abi::FEATURE_HUGE | abi::FEATURE_RING | abi::FEATURE_RESOLVE | abi::FEATURE_DMA
    );
}

#[test]
fn dma_without_a_device_is_enodev_after_the_usual_checks() {
    let (fake, c) = client();
    let enodev = GlueError::Os {
        op: "nprdma-glue ioctl",
        errno: libc::ENODEV,
    };
    assert_eq!(c.dma_attach().unwrap_err(), enodev);
    let r = c
        .register(VirtAddr::new(BASE), 0x2000, Access::Write)
        .unwrap();
    let e = c
        .dma(&r, VirtAddr::new(BASE + 8), 64, DmaDirection::FromDevice, 0)
        .unwrap_err();
    assert_eq!(e, enodev);
    let mut old = abi::DmaArgs {
        hdr: AbiHeader {
            abi_version: 2,
            struct_size: 80,
        },
        ..Default::default()
    };
    assert_eq!(
        fake.ioctl(abi::IOC_DMA, old.as_bytes_mut()),
        Err(libc::EPROTO)
    );
}

#[test]
fn the_module_rejects_wrong_sizes_and_versions() {
    let fake = FakeModule::new();
    let mut a = FaultInArgs {
        hdr: AbiHeader::for_struct::<FaultInArgs>(),
        ..Default::default()
    };
    let bytes = a.as_bytes_mut();
    // A struct one word short, and a header that claims another size.
    assert_eq!(
        fake.ioctl(abi::IOC_FAULT_IN, &mut bytes[..56]),
        Err(libc::EINVAL)
    );
    let mut wrong_size = FaultInArgs {
        hdr: AbiHeader {
            abi_version: abi::ABI_VERSION,
            struct_size: 60,
        },
        ..Default::default()
    };
    assert_eq!(
        fake.ioctl(abi::IOC_FAULT_IN, wrong_size.as_bytes_mut()),
        Err(libc::EINVAL)
    );
    let mut wrong_version = FaultInArgs {
        hdr: AbiHeader {
            abi_version: 9,
            struct_size: 64,
        },
        ..Default::default()
    };
    assert_eq!(
        fake.ioctl(abi::IOC_FAULT_IN, wrong_version.as_bytes_mut()),
        Err(libc::EPROTO)
    );
    assert_eq!(fake.ioctl(0xdead_beef, a.as_bytes_mut()), Err(libc::ENOTTY));
}

#[test]
fn registration_errors_come_back_as_typed_status_codes() {
    let (fake, c) = client();
    let r = c
        .register(VirtAddr::new(BASE), 16 * PAGE, Access::Write)
        .unwrap();
    assert_eq!(r.range, range(BASE, 16 * PAGE));
    assert!(
        matches!(c.register(VirtAddr::new(BASE + 8 * PAGE), PAGE, Access::Read), Err(GlueError::AlreadyRegistered { existing }) if existing == r.id)
    );
    assert!(matches!(
        c.register(VirtAddr::new(BASE + 1), PAGE, Access::Read),
        Err(GlueError::Misaligned { .. })
    ));
    assert_eq!(
        c.register(VirtAddr::new(BASE), 0, Access::Read)
            .unwrap_err(),
        GlueError::EmptyRange
    );
    assert!(matches!(
        c.register(VirtAddr::new(!0xfff), 2 * PAGE, Access::Read),
        Err(GlueError::Overflow { .. })
    ));
    let id = r.id;
    // Fault-in beyond the region, and write access on a read region.
    let ro = c
        .register(VirtAddr::new(BASE + 64 * PAGE), 4 * PAGE, Access::Read)
        .unwrap();
    assert!(matches!(
        c.fault_in(&r, range(BASE + 15 * PAGE, 2 * PAGE), Access::Read),
        Err(GlueError::NotRegistered { .. })
    ));
    assert!(matches!(
        c.fault_in(&ro, ro.range, Access::Write),
        Err(GlueError::NotWritable { .. })
    ));
    c.unregister(r).unwrap();
    // The id is unknown now: unregistering it again is a typed status.
    let mut u = abi::UnregisterArgs {
        hdr: AbiHeader::for_struct::<abi::UnregisterArgs>(),
        region_id: id,
        ..Default::default()
    };
    fake.ioctl(abi::IOC_UNREGISTER, u.as_bytes_mut()).unwrap();
    assert_eq!(u.status, GlueError::UnknownRegion { id }.code());
    let again = c
        .register(VirtAddr::new(BASE), 16 * PAGE, Access::Write)
        .unwrap();
    assert_ne!(again.id, id);
}

#[test]
fn ensure_present_faults_only_absent_pages_and_snapshots_validate() {
    let (fake, c) = client();
    let r = c
        .register(VirtAddr::new(BASE), 32 * PAGE, Access::Write)
        .unwrap();
    let whole = r.range;
    assert!(whole.pages().all(|p| !r.entry(p).unwrap().present()));

    let snap = c
        .ensure_present(&r, range(BASE + 4 * PAGE, 8 * PAGE), Access::Write)
        .unwrap();
    for i in 0..32 {
        let e = r.entry(VirtAddr::new(BASE + i * PAGE)).unwrap();
        assert_eq!(e.present(), (4..12).contains(&i), "page {i}");
        if e.present() {
            assert!(e.writable());
            assert_eq!(e.version(), 1, "one remap since registration");
        }
    }
    assert!(r.still_valid(&snap));

    // A second call with an overlapping range faults in only the new pages.
    let rep = c
        .fault_in(&r, range(BASE + 8 * PAGE, 8 * PAGE), Access::Write)
        .unwrap();
    assert_eq!(
        (rep.pages_mapped, rep.minor_faults, rep.major_faults),
        (8, 4, 0)
    );

    // Invalidate two pages (the MMU-notifier path): the snapshot is no longer valid.
    let generation = r.generation();
    fake.invalidate(
        VirtAddr::new(BASE + 6 * PAGE),
        2 * PAGE,
        abi::cause::REMOVED,
        0,
    );
    assert_eq!(r.generation(), generation + 1);
    let e = r.entry(VirtAddr::new(BASE + 6 * PAGE)).unwrap();
    assert!(!e.present());
    assert_eq!(e.version(), 2);
    assert!(!r.still_valid(&snap));
    // A snapshot of untouched pages survives an unrelated invalidation (per-page versions).
    let other = c
        .ensure_present(&r, range(BASE + 20 * PAGE, 2 * PAGE), Access::Read)
        .unwrap();
    fake.invalidate(VirtAddr::new(BASE + 6 * PAGE), PAGE, abi::cause::REMOVED, 0);
    assert!(r.still_valid(&other));
    // Re-faulting repairs the range.
    let snap2 = c
        .ensure_present(&r, range(BASE + 4 * PAGE, 8 * PAGE), Access::Write)
        .unwrap();
    assert!(r.still_valid(&snap2));
    assert_eq!(
        r.entry(VirtAddr::new(BASE + 6 * PAGE)).unwrap().version(),
        4
    );
}

#[test]
fn a_snapshot_of_a_range_beyond_the_region_is_an_error() {
    let (_fake, c) = client();
    let r = c
        .register(VirtAddr::new(BASE), 4 * PAGE, Access::Write)
        .unwrap();
    // 2^50 pages from the region's start: the first page past the region is reported, without
    // first reserving room for every page the range names.
    let err = r.snapshot(range(BASE, 1 << 62)).unwrap_err();
    assert!(
        matches!(err, GlueError::NotRegistered { addr } if addr == BASE + 4 * PAGE),
        "{err:?}"
    );
}

#[test]
fn invalidations_arrive_on_the_ring_in_order() {
    let (fake, mut c) = client();
    assert!(
        matches!(c.setup_ring(3), Err(GlueError::InvalidArgument { .. })),
        "not a power of two"
    );
    c.setup_ring(8).unwrap();
    let a = c
        .register(VirtAddr::new(BASE), 16 * PAGE, Access::Write)
        .unwrap();
    let b = c
        .register(VirtAddr::new(BASE + 32 * PAGE), 16 * PAGE, Access::Write)
        .unwrap();
    // Spanning both regions and the gap between them: one record per region, clipped.
    assert_eq!(
        fake.invalidate(
            VirtAddr::new(BASE + 12 * PAGE),
            24 * PAGE,
            abi::cause::UNMAPPED,
            0
        ),
        2
    );
    fake.invalidate(
        VirtAddr::new(BASE + 20 * PAGE),
        4 * PAGE,
        abi::cause::UNMAPPED,
        0,
    );
    fake.invalidate(
        VirtAddr::new(BASE),
        2 * PAGE,
        abi::cause::REMAPPED,
        BASE + 0x100_0000,
    );
    let mut out = Vec::new();
    assert_eq!(c.poll_invalidations(&mut out).unwrap(), 3);
    assert_eq!(
        out,
        vec![
            InvalidationRecord {
                seq: 0,
                region_id: a.id,
                start: BASE + 12 * PAGE,
                len: 4 * PAGE,
                cause: abi::cause::UNMAPPED,
                flags: 0,
                new_start: 0
            },
            InvalidationRecord {
                seq: 1,
                region_id: b.id,
                start: BASE + 32 * PAGE,
                len: 4 * PAGE,
                cause: abi::cause::UNMAPPED,
                flags: 0,
                new_start: 0
            },
            InvalidationRecord {
                seq: 2,
                region_id: a.id,
                start: BASE,
                len: 2 * PAGE,
                cause: abi::cause::REMAPPED,
                flags: 0,
                new_start: BASE + 0x100_0000
            },
        ]
    );
    out.clear();
    assert_eq!(c.poll_invalidations(&mut out).unwrap(), 0);
    // Wrap around the ring several times.
    for i in 0..20 {
        fake.invalidate(
            VirtAddr::new(BASE + (i % 16) * PAGE),
            PAGE,
            abi::cause::SWAPPED_OUT,
            0,
        );
        c.poll_invalidations(&mut out).unwrap();
    }
    assert_eq!(
        out.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (3..23).collect::<Vec<_>>()
    );
}

#[test]
fn a_full_ring_drops_and_says_how_many_were_lost() {
    let (fake, mut c) = client();
    c.setup_ring(2).unwrap();
    let _r = c
        .register(VirtAddr::new(BASE), 16 * PAGE, Access::Write)
        .unwrap();
    for i in 0..5 {
        fake.invalidate(VirtAddr::new(BASE + i * PAGE), PAGE, abi::cause::DROPPED, 0);
    }
    let mut out = Vec::new();
    assert_eq!(
        c.poll_invalidations(&mut out),
        Err(GlueError::RingOverrun { lost: 3 })
    );
    assert_eq!(out.len(), 2, "the records that fit are not lost");
    assert_eq!(out[1].start, BASE + PAGE);
    out.clear();
    assert_eq!(c.poll_invalidations(&mut out), Ok(0));
}

#[test]
fn huge_backing_and_swap_are_reported_by_fault_in() {
    let (fake, c) = client();
    let base = BASE; // 2 MiB aligned
    let r = c
        .register(VirtAddr::new(base), 4 * MIB, Access::Write)
        .unwrap();
    fake.back_with_huge_pages(VirtAddr::new(base), 2 * MIB);
    let rep = c.fault_in(&r, range(base, 4 * MIB), Access::Write).unwrap();
    assert_eq!(rep.huge_blocks, 1);
    assert_eq!(rep.pages_mapped, 1024);
    assert!(r.entry(VirtAddr::new(base + 100 * PAGE)).unwrap().huge());
    assert!(!r.entry(VirtAddr::new(base + 2 * MIB)).unwrap().huge());

    fake.swap_out(VirtAddr::new(base + 2 * MIB), 3 * PAGE);
    let rep = c
        .fault_in(&r, range(base + 2 * MIB, 4 * PAGE), Access::Write)
        .unwrap();
    assert_eq!((rep.major_faults, rep.minor_faults), (3, 0));
}

#[test]
fn the_real_backend_says_the_module_is_not_loaded() {
    if std::path::Path::new(abi::DEVICE_NODE).exists() {
        skip("real backend", "the module is loaded on this machine");
        return;
    }
    assert_eq!(
        RealModule::open().unwrap_err(),
        GlueError::ModuleNotLoaded {
            path: abi::DEVICE_NODE.to_string()
        }
    );
    assert_eq!(
        GlueError::ModuleNotLoaded {
            path: String::new()
        }
        .code(),
        14
    );
}

/// The fake behind a transport whose table mappings fail while `fail` is set.
struct FlakyMaps {
    fake: Arc<FakeModule>,
    fail: std::sync::atomic::AtomicBool,
}

impl ModuleBackend for FlakyMaps {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        self.fake.ioctl(cmd, arg)
    }
    fn map(&self, offset: u64, len: u64) -> linux_glue::Result<linux_glue::kmod::SharedMemory> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(linux_glue::GlueError::InvalidArgument {
                what: "mapping refused by the test",
            });
        }
        self.fake.map(offset, len)
    }
}

#[test]
fn a_registration_whose_table_cannot_be_mapped_is_given_back_to_the_module() {
    let flaky = Arc::new(FlakyMaps {
        fake: Arc::new(FakeModule::new()),
        fail: std::sync::atomic::AtomicBool::new(true),
    });
    let c = ModuleClient::connect(Arc::clone(&flaky)).unwrap();
    let r = range(0x7000_0000, 4 * PAGE);
    assert!(matches!(
        c.register(r.start(), r.len(), Access::Write),
        Err(GlueError::InvalidArgument { .. })
    ));
    // Had the module kept the region, this would be AlreadyRegistered.
    flaky
        .fail
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let region = c.register(r.start(), r.len(), Access::Write).unwrap();
    c.unregister(region).unwrap();
}

/// A module whose MMU notifier fires (reclaim, migration) right after the first `times`
/// fault-ins returned, invalidating the first page of the region at `base`.
struct InvalidateAfterFaultIn {
    fake: Arc<FakeModule>,
    base: u64,
    times: std::sync::atomic::AtomicU32,
}

impl ModuleBackend for InvalidateAfterFaultIn {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        let r = self.fake.ioctl(cmd, arg);
        let left = &self.times;
        if cmd == abi::IOC_FAULT_IN
            && left
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |n| n.checked_sub(1),
                )
                .is_ok()
        {
            self.fake
                .invalidate(VirtAddr::new(self.base), PAGE, abi::cause::SWAPPED_OUT, 0);
        }
        r
    }

    fn map(&self, offset: u64, len: u64) -> linux_glue::Result<linux_glue::kmod::SharedMemory> {
        self.fake.map(offset, len)
    }
}

#[test]
fn a_page_invalidated_right_after_its_fault_in_is_faulted_in_again_before_the_snapshot() {
    let base = 0x7f00_0000_0000u64;
    let fake = Arc::new(FakeModule::new());
    let backend = |fake: &Arc<FakeModule>, times| InvalidateAfterFaultIn {
        fake: Arc::clone(fake),
        base,
        times: std::sync::atomic::AtomicU32::new(times),
    };
    let c = ModuleClient::connect(backend(&fake, 1)).unwrap();
    let r = c
        .register(VirtAddr::new(base), 4 * PAGE, Access::Write)
        .unwrap();
    let snap = c
        .ensure_present(&r, range(base, 4 * PAGE), Access::Write)
        .unwrap();
    assert!(snap.present && snap.writable);
    assert!(r.still_valid(&snap));
    // A snapshot taken while a page is absent is never valid, whatever the generation says.
    r.snapshot(range(base, 4 * PAGE)).unwrap();
    fake.invalidate(VirtAddr::new(base), PAGE, abi::cause::SWAPPED_OUT, 0);
    let stale = r.snapshot(range(base, 4 * PAGE)).unwrap();
    assert!(!stale.present && !r.still_valid(&stale));
    // A page invalidated after every fault-in: a typed error, not a snapshot of absent pages.
    let c = ModuleClient::connect(backend(&Arc::new(FakeModule::new()), u32::MAX)).unwrap();
    let r = c
        .register(VirtAddr::new(base), 4 * PAGE, Access::Write)
        .unwrap();
    assert!(matches!(
        c.ensure_present(&r, range(base, 4 * PAGE), Access::Write),
        Err(GlueError::Contended { .. })
    ));
}

#[test]
fn resolve_returns_the_frame_the_mapping_size_and_the_fault_kind() {
    let (fake, c) = client();
    let base = 0x7f00_0000_0000u64;
    let r = c
        .register(VirtAddr::new(base), 2 * MIB + 2 * PAGE, Access::Write)
        .unwrap();
    fake.back_with_huge_pages(VirtAddr::new(base), 2 * MIB);
    // A query of a page nobody faulted in: absent, nothing faulted.
    let q = c
        .resolve(&r, VirtAddr::new(base + 2 * MIB), Access::Read, true)
        .unwrap();
    assert_eq!(q.kind, None);
    assert!(!r.entry(VirtAddr::new(base + 2 * MIB)).unwrap().present());
    // A 4 KiB page: minor, then present; the version moves only with the fault.
    let p = base + 2 * MIB + PAGE;
    let first = c
        .resolve(&r, VirtAddr::new(p), Access::Write, false)
        .unwrap();
    assert_eq!(first.kind, Some(FaultKind::Minor));
    assert_eq!(first.size, PageSize::Size4K);
    assert_eq!(first.mapping, range(p, PAGE));
    assert_eq!(first.pfn, FAKE_PFN_BASE + (p >> 12));
    assert_eq!(first.frame(), first.pfn << 12);
    let again = c
        .resolve(&r, VirtAddr::new(p), Access::Write, false)
        .unwrap();
    assert_eq!(again.kind, Some(FaultKind::AlreadyPresent));
    assert_eq!(again.version, first.version);
    assert_eq!(r.entry(VirtAddr::new(p)).unwrap().version(), first.version);
    // Inside the huge block: the 2 MiB mapping and its first frame.
    let h = c
        .resolve(&r, VirtAddr::new(base + 5 * PAGE), Access::Read, false)
        .unwrap();
    let block = AlignedRange::new(VirtAddr::new(base), 2 * MIB, PageSize::Size2M).unwrap();
    assert_eq!((h.size, h.mapping), (PageSize::Size2M, block));
    assert_eq!(h.pfn % 512, 0);
    // Swapped out: a major fault brings it back, with a new version.
    fake.swap_out(VirtAddr::new(p), PAGE);
    let back = c
        .resolve(&r, VirtAddr::new(p), Access::Write, false)
        .unwrap();
    assert_eq!(back.kind, Some(FaultKind::Major));
    assert!(back.version > first.version);
    // Bad input: typed errors.
    assert_eq!(
        c.resolve(&r, VirtAddr::new(base + 3 * MIB), Access::Read, false),
        Err(GlueError::NotRegistered {
            addr: base + 3 * MIB
        })
    );
    assert!(matches!(
        c.resolve(&r, VirtAddr::new(p + 1), Access::Read, false),
        Err(GlueError::Misaligned { .. })
    ));
    let ro = c
        .register(VirtAddr::new(0x1000_0000), PAGE, Access::Read)
        .unwrap();
    assert_eq!(
        c.resolve(&ro, VirtAddr::new(0x1000_0000), Access::Write, false),
        Err(GlueError::NotWritable { addr: 0x1000_0000 })
    );
}
