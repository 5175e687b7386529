//! Registration without pinning, and bad input.
#![cfg(target_os = "linux")]

mod common;

use common::*;
use hal::{AlignedRange, PageSize, VirtAddr};
use linux_glue::mapping::{Advice, Mapping, Protection};
use linux_glue::{Access, Backing, Glue, GlueConfig, GlueError, RegionId, VmaSource};

#[test]
fn registration_touches_no_page_and_records_the_vma() {
    let (glue, rx) = glue();
    let m = Mapping::anonymous(64 * MIB, Protection::ReadWrite).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();

    let states = glue.page_states(m.range().unwrap()).unwrap();
    assert_eq!(states.len(), 16384);
    assert!(
        states.iter().all(|s| !s.present && !s.swapped),
        "registration must not fault anything in"
    );

    let info = glue.region(id).unwrap();
    assert_eq!(info.range, m.range().unwrap());
    assert_eq!(info.vmas.len(), 1);
    let v = &info.vmas[0];
    assert_eq!((v.start, v.end), (m.addr(), m.at(m.len())));
    assert_eq!(v.backing, Backing::Anonymous);
    assert!(v.readable && v.writable && !v.shared);
    assert_eq!(info.tracked_pages, 0);
    if glue.capabilities().userfaultfd {
        assert_eq!(info.monitored, vec![(m.addr(), m.at(m.len()))]);
    }
    // The application's own first touches are served by the kernel as before: the monitor
    // never sees a fault (WP registration with nothing write-protected).
    m.stamp_pages(0x5eed).unwrap();
    assert_eq!(m.read_u64(4096 * 77).unwrap(), 0x5eed ^ 77);
    assert_eq!(glue.stats().unexpected_faults, 0);
    glue.deregister(id).unwrap();
    assert_quiet(&rx, 50);
}

#[test]
fn vmas_are_the_same_from_procmap_query_and_from_maps_text() {
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    // Split into three VMAs.
    m.advise(3 * PAGE, 2 * PAGE, Advice::HugePage).unwrap();
    let (a, _) = Glue::new(GlueConfig::default()).unwrap();
    let (b, _) = Glue::new(GlueConfig {
        vma_source: VmaSource::MapsText,
        invalidation_events: false,
        ..Default::default()
    })
    .unwrap();
    let ia = a.register(m.addr(), m.len(), Access::Read).unwrap();
    let va = a.region(ia).unwrap().vmas;
    a.deregister(ia).unwrap();
    let ib = b.register(m.addr(), m.len(), Access::Read).unwrap();
    let vb = b.region(ib).unwrap().vmas;
    b.deregister(ib).unwrap();
    assert_eq!(va.len(), 3);
    // With PROCMAP_QUERY, anonymous memory is registered without smaps: compare what both
    // sources say, then the smaps part of the maps-text registration.
    let without_smaps = |v: &[linux_glue::VmaInfo]| -> Vec<linux_glue::VmaInfo> {
        v.iter()
            .cloned()
            .map(|mut x| {
                x.thp_eligible = None;
                x.vm_flags = None;
                x
            })
            .collect()
    };
    assert_eq!(without_smaps(&va), without_smaps(&vb));
    assert_eq!(vb[1].has_flag(b"hg"), Some(true));
    println!("capabilities: {:?}", a.capabilities());
}

#[test]
fn a_range_spanning_several_vmas_records_each() {
    // The maps text plus smaps, so that VmFlags are known.
    let (glue, _rx) = Glue::new(GlueConfig {
        vma_source: VmaSource::MapsText,
        ..Default::default()
    })
    .unwrap();
    let m = Mapping::anonymous(6 * PAGE, Protection::ReadWrite).unwrap();
    // Make the middle two pages a separate VMA by changing their THP advice.
    m.advise(2 * PAGE, 2 * PAGE, Advice::NoHugePage).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    let info = glue.region(id).unwrap();
    let bounds: Vec<_> = info.vmas.iter().map(|v| (v.start, v.end)).collect();
    assert_eq!(
        bounds,
        vec![
            (m.at(0), m.at(2 * PAGE)),
            (m.at(2 * PAGE), m.at(4 * PAGE)),
            (m.at(4 * PAGE), m.at(6 * PAGE))
        ]
    );
    assert_eq!(info.vmas[1].has_flag(b"nh"), Some(true));
    assert_eq!(info.vmas[0].has_flag(b"nh"), Some(false));
}

#[test]
fn bad_input_gets_typed_errors() {
    let (glue, _rx) = glue();
    let m = Mapping::anonymous(16 * PAGE, Protection::ReadWrite).unwrap();

    // Unaligned start and length, empty, overflowing.
    assert_eq!(
        glue.register(m.at(8), PAGE, Access::Read),
        Err(GlueError::Misaligned {
            value: m.addr().as_u64() + 8,
            align: PAGE
        })
    );
    assert_eq!(
        glue.register(m.addr(), 100, Access::Read),
        Err(GlueError::Misaligned {
            value: 100,
            align: PAGE
        })
    );
    assert_eq!(
        glue.register(m.addr(), 0, Access::Read),
        Err(GlueError::EmptyRange)
    );
    let top = VirtAddr::new(0xffff_ffff_ffff_f000);
    assert_eq!(
        glue.register(top, 2 * PAGE, Access::Read),
        Err(GlueError::Overflow {
            start: top.as_u64(),
            len: 2 * PAGE
        })
    );

    // Unmapped: a hole in the middle of the range, and an address nothing maps.
    m.unmap_part(4 * PAGE, 2 * PAGE).unwrap();
    let hole = glue.register(m.addr(), m.len(), Access::Read);
    if hole_refilled(m.at(4 * PAGE), 2 * PAGE) {
        skip(
            "unmapped hole",
            "another test thread mapped into the hole first",
        );
    } else {
        assert_eq!(
            hole,
            Err(GlueError::Unmapped {
                addr: m.at(4 * PAGE).as_u64()
            })
        );
    }
    assert_eq!(
        glue.register(VirtAddr::new(0x1000), PAGE, Access::Read),
        Err(GlueError::Unmapped { addr: 0x1000 })
    );

    // Write access to a read-only mapping; any access to PROT_NONE.
    let ro = Mapping::anonymous(4 * PAGE, Protection::Read).unwrap();
    assert_eq!(
        glue.register(ro.addr(), ro.len(), Access::Write),
        Err(GlueError::NotWritable {
            addr: ro.addr().as_u64()
        })
    );
    let read_only_id = glue.register(ro.addr(), ro.len(), Access::Read).unwrap();
    let none = Mapping::anonymous(PAGE, Protection::None).unwrap();
    assert_eq!(
        glue.register(none.addr(), PAGE, Access::Read),
        Err(GlueError::NotReadable {
            addr: none.addr().as_u64()
        })
    );

    // Registering twice (same range, or overlapping it).
    let id = glue.register(m.addr(), 4 * PAGE, Access::Write).unwrap();
    assert_eq!(
        glue.register(m.addr(), 4 * PAGE, Access::Write),
        Err(GlueError::AlreadyRegistered { existing: id.0 })
    );
    assert_eq!(
        glue.register(m.at(3 * PAGE), PAGE, Access::Read),
        Err(GlueError::AlreadyRegistered { existing: id.0 })
    );

    // Deregistering unknown regions, or twice.
    assert_eq!(
        glue.deregister(RegionId(9999)),
        Err(GlueError::UnknownRegion { id: 9999 })
    );
    glue.deregister(id).unwrap();
    assert_eq!(
        glue.deregister(id),
        Err(GlueError::UnknownRegion { id: id.0 })
    );

    // Fault-in and resolution outside any region, or beyond what was registered.
    let resolver = glue.resolver();
    assert_eq!(
        resolver.resolve(m.addr(), Access::Read),
        Err(GlueError::NotRegistered {
            addr: m.addr().as_u64()
        })
    );
    assert_eq!(
        resolver.resolve(ro.addr(), Access::Write),
        Err(GlueError::NotWritable {
            addr: ro.addr().as_u64()
        })
    );
    let beyond = AlignedRange::new(ro.addr(), 8 * PAGE, PageSize::Size4K).unwrap();
    assert!(matches!(
        glue.fault_in(beyond, Access::Read),
        Err(GlueError::NotRegistered { .. })
    ));
    glue.deregister(read_only_id).unwrap();
}

#[test]
fn special_mappings_are_refused() {
    let (glue, _rx) = glue();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let Some(line) = maps.lines().find(|l| l.ends_with("[vdso]")) else {
        skip(
            "special_mappings_are_refused",
            "no [vdso] mapping in this process",
        );
        return;
    };
    let v = linux_glue::vma::parse_maps_line(line).unwrap();
    let r = glue.register(v.start, v.end.as_u64() - v.start.as_u64(), Access::Read);
    assert!(
        matches!(r, Err(GlueError::UnsupportedMapping { .. })),
        "{r:?}"
    );
}

#[test]
fn file_mappings_register_but_userfaultfd_cannot_watch_them() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("linux-glue-regfile-{}", std::process::id()));
    std::fs::write(&path, vec![7u8; 8 * PAGE as usize]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let m = Mapping::file(&f, 8 * PAGE, Protection::Read, false).unwrap();
    std::fs::remove_file(&path).unwrap();

    let (glue, _rx) = glue();
    let id = glue.register(m.addr(), m.len(), Access::Read).unwrap();
    let info = glue.region(id).unwrap();
    assert_eq!(info.vmas[0].backing, Backing::File);
    assert!(
        info.monitored.is_empty(),
        "fs/userfaultfd.c accepts only anonymous, shmem and hugetlb VMAs"
    );
    glue.deregister(id).unwrap();

    if glue.capabilities().userfaultfd {
        let (strict, _rx) = Glue::new(GlueConfig {
            require_events: true,
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(
            strict.register(m.addr(), m.len(), Access::Read),
            Err(GlueError::Unavailable { .. })
        ));
        // And nothing stays registered after the refusal.
        let anon = Mapping::anonymous(PAGE, Protection::ReadWrite).unwrap();
        strict.register(anon.addr(), PAGE, Access::Write).unwrap();
    }
}

#[test]
fn deregistration_is_symmetric() {
    let (glue, rx) = glue();
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    let id = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    glue.deregister(id).unwrap();
    // No longer watched: dropping pages produces nothing, and the range can be registered again.
    m.advise(0, m.len(), Advice::DontNeed).unwrap();
    assert_quiet(&rx, 100);
    let again = glue.register(m.addr(), m.len(), Access::Write).unwrap();
    assert_ne!(again, id);
    let states = glue.page_states(m.range().unwrap()).unwrap();
    assert!(
        states.iter().all(|s| !s.present),
        "deregistration touches no page either"
    );
}

#[test]
fn smaps_is_read_only_where_procmap_query_does_not_answer() {
    let (glue, _rx) = glue();
    let anon = Mapping::anonymous(64 * PAGE, Protection::ReadWrite).unwrap();
    let path = std::env::temp_dir().join(format!("linux-glue-smaps-{}", std::process::id()));
    std::fs::write(&path, vec![1u8; 4 * PAGE as usize]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let file = Mapping::file(&f, 4 * PAGE, Protection::Read, false).unwrap();
    std::fs::remove_file(&path).unwrap();

    let before = glue.stats().smaps_reads;
    let id = glue
        .register(anon.addr(), anon.len(), Access::Write)
        .unwrap();
    let anon_reads = glue.stats().smaps_reads - before;
    let fid = glue
        .register(file.addr(), file.len(), Access::Read)
        .unwrap();
    let file_reads = glue.stats().smaps_reads - before - anon_reads;
    if glue.capabilities().procmap_query {
        assert_eq!(anon_reads, 0, "anonymous memory: PROCMAP_QUERY answers");
        assert_eq!(glue.region(id).unwrap().vmas[0].thp_eligible, None);
    } else {
        skip(
            "smaps_is_read_only_where_procmap_query_does_not_answer (anonymous part)",
            "no PROCMAP_QUERY (Linux < 6.11): the smaps walk is the fallback",
        );
        assert_eq!(anon_reads, 1);
    }
    assert_eq!(
        file_reads, 1,
        "a file mapping may be VM_IO/VM_PFNMAP: smaps is read"
    );
    glue.deregister(id).unwrap();
    glue.deregister(fid).unwrap();

    // The maps-text source (what a kernel without PROCMAP_QUERY gets) always reads smaps.
    let (text, _rx) = Glue::new(GlueConfig {
        vma_source: VmaSource::MapsText,
        ..Default::default()
    })
    .unwrap();
    let id = text
        .register(anon.addr(), anon.len(), Access::Write)
        .unwrap();
    assert_eq!(text.stats().smaps_reads, 1);
    assert!(text.region(id).unwrap().vmas[0].thp_eligible.is_some());
}
