use std::collections::BTreeMap;
use std::vec::Vec;

use hal::dma::HostDma;
use hal::{Iova, PageSize, PhysAddr};

use super::*;
use crate::pagetable::{
    Attributes, Invalidations, PageTable, PageTableConfig, Permissions, TlbInvalidation,
    TlbMaintenance,
};
use crate::walk::{WalkConfig, WalkFault, walk};
use crate::{Result, SmmuError};

const STREAM: StreamId = StreamId(0x14e8);
const OTHER_STREAM: StreamId = StreamId(0x4d0);
const RW_REGION: u64 = 0x10_0000;
const RO_REGION: u64 = 0x80_0000;
const REGION_LEN: u64 = 0x40_0000;
const BUDGET_NS: u64 = 20_000;

/// A pager: pages in `resident` are minor faults (a frame is at hand), the rest are major
/// (read from a backing store into a fresh frame).
struct Pager {
    regions: RegionSet<4>,
    resident: BTreeMap<u64, PhysAddr>,
    next_frame: u64,
    minor_ns: u64,
    estimate_override: Option<ResolveEstimate>,
    resolve_calls: u32,
    fail_with: Option<u32>,
    /// Hand out read-only attributes even for writes (a buggy resolver).
    wrong_permissions: bool,
    /// Hand out a fresh frame for every resolution (copy-on-write).
    copy_on_write: bool,
    size: PageSize,
}

impl Pager {
    fn new() -> Self {
        let mut regions = RegionSet::new();
        regions
            .register(RegisteredRegion {
                stream: STREAM,
                start: Iova::new(RW_REGION),
                len: REGION_LEN,
                writable: true,
            })
            .unwrap();
        regions
            .register(RegisteredRegion {
                stream: STREAM,
                start: Iova::new(RO_REGION),
                len: REGION_LEN,
                writable: false,
            })
            .unwrap();
        Self {
            regions,
            resident: BTreeMap::new(),
            next_frame: 0x2_0000_0000,
            minor_ns: 1_000,
            estimate_override: None,
            resolve_calls: 0,
            fail_with: None,
            wrong_permissions: false,
            copy_on_write: false,
            size: PageSize::Size4K,
        }
    }

    fn page(&self, iova: Iova) -> u64 {
        iova.align_down(self.size).as_u64()
    }
}

impl FaultResolver for Pager {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        self.regions.find(stream, iova)
    }

    fn estimate(&self, _stream: StreamId, iova: Iova, _access: AccessKind) -> ResolveEstimate {
        if let Some(e) = self.estimate_override {
            return e;
        }
        if self.resident.contains_key(&self.page(iova)) {
            ResolveEstimate::Minor {
                expected_ns: self.minor_ns,
            }
        } else {
            ResolveEstimate::Major
        }
    }

    fn resolve(
        &mut self,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> core::result::Result<ResolvedPage, ResolveError> {
        self.resolve_calls += 1;
        if let Some(code) = self.fail_with {
            return Err(ResolveError(code));
        }
        let region = self.regions.find(stream, iova).ok_or(ResolveError(99))?;
        let page = self.page(iova);
        let (frame, cost) = match self.resident.get(&page) {
            Some(f) if !self.copy_on_write => (*f, FaultCost::Minor),
            _ => {
                let f = PhysAddr::new(self.next_frame);
                self.next_frame += self.size.bytes();
                self.resident.insert(page, f);
                (f, FaultCost::Major)
            }
        };
        // Read faults on writable regions map writable too (no dirty tracking here).
        let _ = access;
        let permissions = if region.writable && !self.wrong_permissions {
            Permissions::READ_WRITE
        } else {
            Permissions::READ_ONLY
        };
        Ok(ResolvedPage {
            frame,
            size: self.size,
            attributes: Attributes::normal(permissions),
            cost,
        })
    }
}

/// Records break-before-make invalidations.
#[derive(Default)]
struct Tlb {
    calls: Vec<Invalidations>,
}

impl TlbMaintenance for Tlb {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> Result<()> {
        self.calls.push(*invalidations);
        Ok(())
    }
}

fn record(iova: u64, access: AccessKind, kind: FaultKind, stalled: bool) -> FaultRecord {
    FaultRecord {
        smmu: SmmuId {
            flavour: SmmuFlavour::V2,
            instance: 0,
        },
        stream: STREAM,
        iova: Iova::new(iova),
        access,
        kind,
        level: Some(3),
        stall: stalled.then_some(StallTag(3)),
        syndrome: RawSyndrome::default(),
    }
}

fn tolerant() -> StreamFaultConfig {
    StreamFaultConfig::stall_tolerant(BUDGET_NS)
}

struct World {
    dma: HostDma,
}

impl World {
    fn new() -> Self {
        Self {
            dma: HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap(),
        }
    }

    fn table(&self) -> PageTable<&HostDma> {
        PageTable::new(&self.dma, PageTableConfig::default()).unwrap()
    }

    /// What the SMMU's walker sees.
    fn walk(
        &self,
        table: &PageTable<&HostDma>,
        iova: u64,
    ) -> core::result::Result<crate::walk::Leaf, WalkFault> {
        walk(table.root(), Iova::new(iova), &WalkConfig::SMMU_48, |pa| {
            self.dma.read_phys_u64(pa)
        })
    }
}

const ALL_POLICIES: [StandardPolicy; 3] = [
    StandardPolicy::StallOnly,
    StandardPolicy::RetransmitOnly,
    StandardPolicy::Hybrid,
];

#[test]
fn a_fault_outside_every_region_is_aborted_and_never_mapped() {
    let world = World::new();
    for policy in ALL_POLICIES {
        for stalled in [false, true] {
            let mut table = world.table();
            let mut pager = Pager::new();
            let mut tlb = Tlb::default();
            let mut handler = FaultHandler::new(policy);
            let tables = table.tables_in_use();
            // Just past the end of the read-write region, and another stream's fault inside
            // this stream's region.
            let outside = record(
                RW_REGION + REGION_LEN,
                AccessKind::Read,
                FaultKind::Translation,
                stalled,
            );
            let mut foreign = record(RW_REGION, AccessKind::Read, FaultKind::Translation, stalled);
            foreign.stream = OTHER_STREAM;
            for r in [outside, foreign] {
                let out = handler
                    .handle(&r, &tolerant(), &mut pager, &mut table, &mut tlb)
                    .unwrap();
                assert_eq!(
                    out.decision,
                    FaultDecision::Abort(SmmuError::OutsideRegisteredRegion {
                        stream: r.stream.0,
                        iova: r.iova
                    })
                );
                assert_eq!(out.mapped, None);
                assert!(out.invalidations.is_empty());
                assert_eq!(table.translate(r.iova).unwrap(), None);
            }
            assert_eq!(pager.resolve_calls, 0);
            assert_eq!(
                table.tables_in_use(),
                tables,
                "not even a table was allocated"
            );
            assert!(tlb.calls.is_empty());
            // Other transfers keep going.
            let inside = record(
                RW_REGION + 0x3000,
                AccessKind::Write,
                FaultKind::Translation,
                stalled,
            );
            let out = handler
                .handle(&inside, &tolerant(), &mut pager, &mut table, &mut tlb)
                .unwrap();
            assert!(
                !matches!(out.decision, FaultDecision::Abort(_))
                    || (policy == StandardPolicy::StallOnly && !stalled)
            );
            if !matches!(out.decision, FaultDecision::Abort(_)) {
                assert!(world.walk(&table, RW_REGION + 0x3000).unwrap().writable());
            }
            assert_eq!(
                handler.stats().aborted,
                2 + u64::from(matches!(out.decision, FaultDecision::Abort(_)))
            );
        }
    }
}

#[test]
fn a_stream_that_is_not_stall_tolerant_never_gets_resume() {
    let world = World::new();
    let estimates = [
        None,
        Some(ResolveEstimate::Minor { expected_ns: 0 }),
        Some(ResolveEstimate::Major),
        Some(ResolveEstimate::Unknown),
    ];
    for policy in ALL_POLICIES {
        for stalled in [false, true] {
            for estimate in estimates {
                let table = world.table();
                let mut pager = Pager::new();
                pager.estimate_override = estimate;
                let mut handler = FaultHandler::new(policy);
                let r = record(RW_REGION, AccessKind::Read, FaultKind::Translation, stalled);
                let plan = handler
                    .decide(&r, &StreamFaultConfig::NEVER_STALL, &pager, &table)
                    .unwrap();
                assert_ne!(
                    plan.decision,
                    FaultDecision::Resume,
                    "{policy:?} {stalled} {estimate:?}"
                );
                let expected = match policy {
                    StandardPolicy::StallOnly => FaultDecision::Abort(SmmuError::TransferLost {
                        stream: STREAM.0,
                        iova: r.iova,
                    }),
                    _ => FaultDecision::TerminateAndRetransmit,
                };
                assert_eq!(plan.decision, expected);
            }
        }
    }
}

/// A policy that always says `Resume`, to check the handler's own rules.
struct AlwaysResume;

impl FaultPolicy for AlwaysResume {
    fn decide(&self, _input: &PolicyInput<'_>) -> FaultDecision {
        FaultDecision::Resume
    }
}

#[test]
fn the_handler_overrides_a_policy_that_breaks_the_rules() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(AlwaysResume);
    // Stalled PCIe transaction: terminate instead.
    let r = record(RW_REGION, AccessKind::Read, FaultKind::Translation, true);
    let plan = handler
        .decide(&r, &StreamFaultConfig::NEVER_STALL, &pager, &table)
        .unwrap();
    assert_eq!(plan.decision, FaultDecision::TerminateAndRetransmit);
    // Outside every region: abort, and fix refuses to map even if asked.
    let out = record(0x4000_0000, AccessKind::Read, FaultKind::Translation, true);
    let plan = handler.decide(&out, &tolerant(), &pager, &table).unwrap();
    let abort = SmmuError::OutsideRegisteredRegion {
        stream: STREAM.0,
        iova: out.iova,
    };
    assert_eq!(plan.decision, FaultDecision::Abort(abort));
    let forged = FaultPlan {
        decision: FaultDecision::Resume,
        ..plan
    };
    assert_eq!(
        handler.fix(&forged, &mut pager, &mut table, &mut tlb),
        Err(abort)
    );
    assert_eq!(pager.resolve_calls, 0);
    assert_eq!(handler.stats().policy_overrides, 2);
}

#[test]
fn hybrid_resumes_minor_faults_within_budget_and_retransmits_the_rest() {
    let world = World::new();
    let cases = [
        // (stalled, estimate, expected)
        (
            true,
            ResolveEstimate::Minor {
                expected_ns: BUDGET_NS,
            },
            FaultDecision::Resume,
        ),
        (
            true,
            ResolveEstimate::Minor {
                expected_ns: BUDGET_NS + 1,
            },
            FaultDecision::TerminateAndRetransmit,
        ),
        (
            true,
            ResolveEstimate::Major,
            FaultDecision::TerminateAndRetransmit,
        ),
        (
            true,
            ResolveEstimate::Unknown,
            FaultDecision::TerminateAndRetransmit,
        ),
        (
            false,
            ResolveEstimate::Minor { expected_ns: 0 },
            FaultDecision::TerminateAndRetransmit,
        ),
    ];
    for (stalled, estimate, expected) in cases {
        let table = world.table();
        let mut pager = Pager::new();
        pager.estimate_override = Some(estimate);
        let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
        let r = record(
            RW_REGION + 0x1000,
            AccessKind::Write,
            FaultKind::Translation,
            stalled,
        );
        let plan = handler.decide(&r, &tolerant(), &pager, &table).unwrap();
        assert_eq!(plan.decision, expected, "{stalled} {estimate:?}");
    }
}

#[test]
fn a_major_fault_under_hybrid_is_terminated_then_mapped_for_retransmission() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let r = record(
        RW_REGION + 0x5123,
        AccessKind::Write,
        FaultKind::Translation,
        true,
    );
    let plan = handler.decide(&r, &tolerant(), &pager, &table).unwrap();
    assert_eq!(plan.estimate, FaultEstimate::Major);
    assert_eq!(plan.decision, FaultDecision::TerminateAndRetransmit);
    assert_eq!(pager.resolve_calls, 0, "deciding resolves nothing");
    // (The driver terminates the stall here.)
    let fixed = handler
        .fix(&plan, &mut pager, &mut table, &mut tlb)
        .unwrap();
    let page = fixed.mapped.unwrap();
    assert_eq!(page.cost, FaultCost::Major);
    assert!(
        fixed.invalidations.is_empty(),
        "mapped into an invalid entry"
    );
    let leaf = world.walk(&table, RW_REGION + 0x5123).unwrap();
    assert_eq!(
        leaf.phys(Iova::new(RW_REGION + 0x5123)),
        PhysAddr::new(0x2_0000_0123)
    );
    assert!(leaf.writable());
    // The same page is now resident: a second fault on it is minor and resumed.
    table
        .unmap(Iova::new(RW_REGION + 0x5000), 0x1000, &mut tlb)
        .unwrap();
    let plan = handler.decide(&r, &tolerant(), &pager, &table).unwrap();
    assert_eq!(plan.estimate, FaultEstimate::Minor { expected_ns: 1_000 });
    assert_eq!(plan.decision, FaultDecision::Resume);
    assert_eq!(
        handler
            .fix(&plan, &mut pager, &mut table, &mut tlb)
            .unwrap()
            .mapped
            .unwrap()
            .cost,
        FaultCost::Minor
    );
    let stats = handler.stats();
    assert_eq!(
        (
            stats.faults,
            stats.retransmitted,
            stats.resumed,
            stats.major,
            stats.minor
        ),
        (2, 1, 1, 1, 1)
    );
}

#[test]
fn a_write_to_a_read_only_region_is_aborted_with_a_typed_error() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    // The page is mapped read-only (after a read fault)...
    let read = record(
        RO_REGION + 0x2000,
        AccessKind::Read,
        FaultKind::Translation,
        true,
    );
    let out = handler
        .handle(&read, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert!(!out.mapped.unwrap().attributes.permissions.writable);
    let calls = pager.resolve_calls;
    // ... then written: a permission fault.
    for kind in [FaultKind::Permission, FaultKind::Translation] {
        let write = record(RO_REGION + 0x2008, AccessKind::Write, kind, true);
        let out = handler
            .handle(&write, &tolerant(), &mut pager, &mut table, &mut tlb)
            .unwrap();
        assert_eq!(
            out.decision,
            FaultDecision::Abort(SmmuError::WriteToReadOnlyRegion {
                stream: STREAM.0,
                iova: write.iova
            })
        );
        assert_eq!(
            out.decision,
            FaultDecision::Abort(SmmuError::WriteToReadOnlyRegion {
                stream: 0x14e8,
                iova: Iova::new(0x80_2008)
            })
        );
    }
    assert_eq!(pager.resolve_calls, calls);
    assert!(!world.walk(&table, RO_REGION + 0x2000).unwrap().writable());
}

#[test]
fn stall_only_resumes_even_major_faults_but_loses_terminated_ones() {
    let world = World::new();
    let table = world.table();
    let pager = Pager::new();
    let mut handler = FaultHandler::new(StandardPolicy::StallOnly);
    let stalled = record(RW_REGION, AccessKind::Read, FaultKind::Translation, true);
    assert_eq!(
        handler
            .decide(&stalled, &tolerant(), &pager, &table)
            .unwrap()
            .decision,
        FaultDecision::Resume
    );
    let terminated = record(RW_REGION, AccessKind::Read, FaultKind::Translation, false);
    assert_eq!(
        handler
            .decide(&terminated, &tolerant(), &pager, &table)
            .unwrap()
            .decision,
        FaultDecision::Abort(SmmuError::TransferLost {
            stream: STREAM.0,
            iova: Iova::new(RW_REGION)
        })
    );
}

#[test]
fn retransmit_only_never_resumes() {
    let world = World::new();
    let table = world.table();
    let mut pager = Pager::new();
    pager.estimate_override = Some(ResolveEstimate::Minor { expected_ns: 0 });
    let mut handler = FaultHandler::new(StandardPolicy::RetransmitOnly);
    let r = record(RW_REGION, AccessKind::Read, FaultKind::Translation, true);
    assert_eq!(
        handler
            .decide(&r, &tolerant(), &pager, &table)
            .unwrap()
            .decision,
        FaultDecision::TerminateAndRetransmit
    );
}

#[test]
fn faults_no_mapping_can_fix_are_aborted() {
    let world = World::new();
    let table = world.table();
    let pager = Pager::new();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    for kind in [
        FaultKind::AddressSize,
        FaultKind::External,
        FaultKind::Unknown,
    ] {
        let r = record(RW_REGION, AccessKind::Read, kind, true);
        assert_eq!(
            handler
                .decide(&r, &tolerant(), &pager, &table)
                .unwrap()
                .decision,
            FaultDecision::Abort(SmmuError::UnrecoverableFault {
                stream: STREAM.0,
                iova: r.iova,
                kind
            })
        );
    }
}

#[test]
fn an_already_fixed_fault_maps_nothing_and_invalidates_only_a_stale_tlb_entry() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::RetransmitOnly);
    let first = record(
        RW_REGION + 0x7004,
        AccessKind::Write,
        FaultKind::Translation,
        false,
    );
    handler
        .handle(&first, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    let calls = pager.resolve_calls;
    // QEMU reports one event per 4 bytes of a faulting DMA: the duplicates find the page.
    let dup = record(
        RW_REGION + 0x7008,
        AccessKind::Write,
        FaultKind::Translation,
        false,
    );
    let out = handler
        .handle(&dup, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(out.estimate, FaultEstimate::Present { stale_tlb: false });
    assert_eq!(out.decision, FaultDecision::TerminateAndRetransmit);
    assert!(out.mapped.is_none());
    assert!(
        out.invalidations.is_empty(),
        "the invalid entry was never cached"
    );
    // A permission fault on a page the table already allows: the TLB is stale.
    let perm = record(
        RW_REGION + 0x7010,
        AccessKind::Write,
        FaultKind::Permission,
        false,
    );
    let out = handler
        .handle(&perm, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(out.estimate, FaultEstimate::Present { stale_tlb: true });
    assert_eq!(
        out.invalidations.iter().copied().collect::<Vec<_>>(),
        [TlbInvalidation {
            start: Iova::new(RW_REGION + 0x7000),
            count: 1,
            granule: PageSize::Size4K,
            leaf_only: true
        }]
    );
    assert_eq!(pager.resolve_calls, calls);
    assert_eq!(handler.stats().spurious, 2);
}

#[test]
fn an_unprivileged_fault_on_a_privileged_only_page_is_not_taken_for_fixed() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let page = RW_REGION + 0x3000;
    let frame = PhysAddr::new(0x3_0000_0000);
    let privileged_only = Attributes::normal(Permissions {
        unprivileged: false,
        ..Permissions::READ_WRITE
    });
    table
        .map(
            Iova::new(page),
            frame,
            PageSize::Size4K,
            &privileged_only,
            &mut tlb,
        )
        .unwrap();
    pager.resident.insert(page, frame);
    let smmu = SmmuId {
        flavour: SmmuFlavour::V2,
        instance: 0,
    };
    // FSR: PF | SS; FSYNR0: PLVL 3, PNU 0 (an unprivileged read, as the zDMA issues them).
    let unprivileged = crate::v2::decode_context_fault(
        smmu,
        0,
        (1 << 3) | (1 << 30),
        0x3,
        0,
        page + 8,
        0x14e8,
        0x7fff,
    )
    .unwrap();
    assert!(!unprivileged.access_request().privileged);
    let out = handler
        .handle(&unprivileged, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    // The leaf allows a privileged read only: the fault is real, and the page is remapped
    // with the resolver's attributes (which allow unprivileged access), not resumed as is.
    assert!(
        !matches!(out.estimate, FaultEstimate::Present { .. }),
        "{out:?}"
    );
    let leaf = world.walk(&table, page).unwrap();
    let request = unprivileged.access_request();
    assert!(crate::walk::check_access(&leaf, &request, true).is_ok());
    // The same fault from a privileged master (PNU = 1) is already fixed.
    let privileged = crate::v2::decode_context_fault(
        smmu,
        0,
        (1 << 3) | (1 << 30),
        0x3 | 1 << 5,
        0,
        page + 8,
        0x14e8,
        0x7fff,
    )
    .unwrap();
    assert!(privileged.access_request().privileged);
}

#[test]
fn a_permission_upgrade_changes_permissions_in_place_and_reports_the_page() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    // Map read-only first (the memory manager write-protects for dirty tracking).
    let frame = PhysAddr::new(0x3_0000_0000);
    table
        .map(
            Iova::new(RW_REGION + 0x9000),
            frame,
            PageSize::Size4K,
            &Attributes::normal(Permissions::READ_ONLY),
            &mut tlb,
        )
        .unwrap();
    pager.resident.insert(RW_REGION + 0x9000, frame);
    let r = record(
        RW_REGION + 0x9010,
        AccessKind::Write,
        FaultKind::Permission,
        true,
    );
    let out = handler
        .handle(&r, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(out.decision, FaultDecision::Resume);
    assert_eq!(
        out.invalidations.iter().copied().collect::<Vec<_>>(),
        [TlbInvalidation {
            start: Iova::new(RW_REGION + 0x9000),
            count: 1,
            granule: PageSize::Size4K,
            leaf_only: true
        }]
    );
    let leaf = world.walk(&table, RW_REGION + 0x9000).unwrap();
    assert!(leaf.writable());
    assert_eq!(leaf.output, frame);
    assert!(
        tlb.calls.is_empty(),
        "a permission change needs no break-before-make"
    );
}

#[test]
fn a_new_frame_for_a_mapped_page_is_installed_with_break_before_make() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    pager.copy_on_write = true;
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::RetransmitOnly);
    let old = PhysAddr::new(0x3_0000_0000);
    table
        .map(
            Iova::new(RW_REGION),
            old,
            PageSize::Size4K,
            &Attributes::normal(Permissions::READ_ONLY),
            &mut tlb,
        )
        .unwrap();
    let r = record(RW_REGION, AccessKind::Write, FaultKind::Permission, false);
    let out = handler
        .handle(&r, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(out.decision, FaultDecision::TerminateAndRetransmit);
    // The old page was invalidated (and completed) before the new one was written.
    assert_eq!(tlb.calls.len(), 1);
    assert!(tlb.calls[0].covers(Iova::new(RW_REGION)));
    assert!(out.invalidations.is_empty());
    let leaf = world.walk(&table, RW_REGION).unwrap();
    assert_eq!(leaf.output, PhysAddr::new(0x2_0000_0000));
    assert!(leaf.writable());
}

#[test]
fn resolver_failures_and_bad_pages_abort_without_mapping() {
    let world = World::new();
    let mut tlb = Tlb::default();
    let r = record(
        RW_REGION + 0x4000,
        AccessKind::Write,
        FaultKind::Translation,
        false,
    );

    let mut table = world.table();
    let mut pager = Pager::new();
    pager.fail_with = Some(7);
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let out = handler
        .handle(&r, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(
        out.decision,
        FaultDecision::Abort(SmmuError::ResolveFailed {
            stream: STREAM.0,
            iova: r.iova,
            code: 7
        })
    );
    assert_eq!(table.translate(r.iova).unwrap(), None);
    assert_eq!(handler.stats().fix_failures, 1);

    let mut pager = Pager::new();
    pager.wrong_permissions = true;
    let out = handler
        .handle(&r, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(
        out.decision,
        FaultDecision::Abort(SmmuError::ResolverContract {
            stream: STREAM.0,
            iova: r.iova
        })
    );
    assert_eq!(table.translate(r.iova).unwrap(), None);

    // A 2 MiB page that would stick out of the region.
    let mut pager = Pager::new();
    pager.size = PageSize::Size2M;
    let edge = record(
        RW_REGION + 0x1000,
        AccessKind::Read,
        FaultKind::Translation,
        false,
    );
    let out = handler
        .handle(&edge, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(
        out.decision,
        FaultDecision::Abort(SmmuError::ResolverContract {
            stream: STREAM.0,
            iova: edge.iova
        })
    );
    // Inside the region it maps a block.
    let inside = record(
        0x20_0000 + 0x1234,
        AccessKind::Read,
        FaultKind::Translation,
        false,
    );
    let out = handler
        .handle(&inside, &tolerant(), &mut pager, &mut table, &mut tlb)
        .unwrap();
    assert_eq!(out.decision, FaultDecision::TerminateAndRetransmit);
    assert_eq!(
        world.walk(&table, 0x20_1234).unwrap().size,
        PageSize::Size2M
    );
}

#[test]
fn a_region_removed_between_decide_and_fix_is_not_mapped() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let r = record(
        RW_REGION + 0x1000,
        AccessKind::Read,
        FaultKind::Translation,
        true,
    );
    let plan = handler.decide(&r, &tolerant(), &pager, &table).unwrap();
    assert_eq!(plan.decision, FaultDecision::TerminateAndRetransmit);
    pager
        .regions
        .unregister(STREAM, Iova::new(RW_REGION))
        .unwrap();
    assert_eq!(
        handler.fix(&plan, &mut pager, &mut table, &mut tlb),
        Err(SmmuError::OutsideRegisteredRegion {
            stream: STREAM.0,
            iova: r.iova
        })
    );
    assert_eq!(table.translate(r.iova).unwrap(), None);
}

#[test]
fn region_sets_reject_overlaps_and_keep_streams_apart() {
    let mut set = RegionSet::<2>::new();
    let region = |stream, start, len| RegisteredRegion {
        stream,
        start: Iova::new(start),
        len,
        writable: true,
    };
    set.register(region(STREAM, 0x1000, 0x2000)).unwrap();
    assert_eq!(
        set.register(region(STREAM, 0x2000, 0x1000)),
        Err(SmmuError::RegionOverlap {
            stream: STREAM.0,
            start: Iova::new(0x2000),
            len: 0x1000
        })
    );
    // Same IOVAs, other stream: fine.
    set.register(region(OTHER_STREAM, 0x1000, 0x2000)).unwrap();
    assert_eq!(
        set.register(region(STREAM, 0x8000, 0x1000)),
        Err(SmmuError::RegionCapacity { capacity: 2 })
    );
    assert!(matches!(
        set.register(region(STREAM, u64::MAX, 2)),
        Err(SmmuError::InvalidConfig { .. })
    ));
    assert_eq!(
        set.find(STREAM, Iova::new(0x2fff)).map(|r| r.stream),
        Some(STREAM)
    );
    assert_eq!(set.find(STREAM, Iova::new(0x3000)), None);
    assert_eq!(set.find(StreamId(1), Iova::new(0x1000)), None);
    assert!(set.unregister(STREAM, Iova::new(0x1000)).is_some());
    assert_eq!(set.find(STREAM, Iova::new(0x1000)), None);
    assert!(set.find(OTHER_STREAM, Iova::new(0x1000)).is_some());
}

#[test]
fn error_codes_are_stable() {
    assert_eq!(
        SmmuError::OutsideRegisteredRegion {
            stream: 0,
            iova: Iova::ZERO
        }
        .code(),
        13
    );
    assert_eq!(
        SmmuError::WriteToReadOnlyRegion {
            stream: 0,
            iova: Iova::ZERO
        }
        .code(),
        14
    );
    assert_eq!(
        SmmuError::TransferLost {
            stream: 0,
            iova: Iova::ZERO
        }
        .code(),
        16
    );
}

fn in_flight(stream: StreamId, start: u64, len: u64) -> InFlightAccess {
    InFlightAccess {
        stream,
        start: Iova::new(start),
        len,
    }
}

#[test]
fn a_fault_is_attributed_only_by_stream_and_address_together() {
    let accesses = [
        in_flight(STREAM, RW_REGION, 0x2000),
        in_flight(STREAM, RW_REGION + 0x10_0000, 0x2000),
        in_flight(OTHER_STREAM, RW_REGION, 0x2000),
    ];
    let at = |iova, stream| FaultRecord {
        stream,
        ..record(iova, AccessKind::Read, FaultKind::Translation, false)
    };
    assert_eq!(
        attribute(Some(&at(RW_REGION + 0x1fff, STREAM)), &accesses),
        Attribution::Access(0)
    );
    assert_eq!(
        attribute(Some(&at(RW_REGION + 0x10_0000, STREAM)), &accesses),
        Attribution::Access(1)
    );
    assert_eq!(
        attribute(Some(&at(RW_REGION, OTHER_STREAM)), &accesses),
        Attribution::Access(2)
    );
    // One past the end, and an empty FAR: the stream is known, the address is no access's.
    for iova in [RW_REGION + 0x2000, 0] {
        assert_eq!(
            attribute(Some(&at(iova, STREAM)), &accesses),
            Attribution::Bank(Unattributed::AddressOutsideInFlight {
                stream: STREAM,
                iova: Iova::new(iova),
            })
        );
    }
    // An empty CBFRSYNRA: stream 0, which nothing in flight uses.
    assert_eq!(
        attribute(Some(&at(RW_REGION, StreamId(0))), &accesses),
        Attribution::Bank(Unattributed::UnknownStream(StreamId(0)))
    );
    assert_eq!(
        attribute(None, &accesses),
        Attribution::Bank(Unattributed::NoRecord)
    );
    assert_eq!(
        attribute(Some(&at(RW_REGION, STREAM)), &[]),
        Attribution::Bank(Unattributed::UnknownStream(STREAM))
    );
    // A range at the top of the address space does not wrap.
    let top = [in_flight(STREAM, u64::MAX - 0xfff, 0x1000)];
    assert_eq!(
        attribute(Some(&at(u64::MAX, STREAM)), &top),
        Attribution::Access(0)
    );
    assert_eq!(
        attribute(Some(&at(0x10, STREAM)), &top),
        Attribution::Bank(Unattributed::AddressOutsideInFlight {
            stream: STREAM,
            iova: Iova::new(0x10),
        })
    );
}

#[test]
fn resolving_a_suspect_range_maps_each_missing_page_once_through_the_fault_path() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let smmu = record(0, AccessKind::Read, FaultKind::Translation, false).smmu;
    // Page 1 is resident (minor), pages 0 and 2 are not (major); the range starts inside
    // page 0 and ends inside page 2.
    pager
        .resident
        .insert(RW_REGION + 0x1000, PhysAddr::new(0x3_0000_0000));
    let range = in_flight(STREAM, RW_REGION + 0x800, 0x1900);
    let done = handler
        .resolve_range(
            smmu,
            &range,
            AccessKind::Write,
            &tolerant(),
            &mut pager,
            &mut table,
            &mut tlb,
        )
        .unwrap();
    assert_eq!(
        done,
        RangeResolution {
            pages: 3,
            mapped: 3,
            minor: 1,
            major: 2,
            abort: None,
        }
    );
    for page in 0..3 {
        assert!(
            world
                .walk(&table, RW_REGION + page * 0x1000)
                .unwrap()
                .writable()
        );
    }
    // Again: everything is present, nothing is resolved.
    let calls = pager.resolve_calls;
    let again = handler
        .resolve_range(
            smmu,
            &range,
            AccessKind::Write,
            &tolerant(),
            &mut pager,
            &mut table,
            &mut tlb,
        )
        .unwrap();
    assert_eq!((again.pages, again.mapped, again.abort), (3, 0, None));
    assert_eq!(pager.resolve_calls, calls);
    assert_eq!(handler.stats().range_pages, 6);
    // An empty range looks at nothing.
    let empty = in_flight(STREAM, RW_REGION, 0);
    let none = handler
        .resolve_range(
            smmu,
            &empty,
            AccessKind::Read,
            &tolerant(),
            &mut pager,
            &mut table,
            &mut tlb,
        )
        .unwrap();
    assert_eq!(none, RangeResolution::default());
}

#[test]
fn a_suspect_range_that_leaves_its_region_or_writes_read_only_memory_is_refused() {
    let world = World::new();
    let mut table = world.table();
    let mut pager = Pager::new();
    let mut tlb = Tlb::default();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let smmu = record(0, AccessKind::Read, FaultKind::Translation, false).smmu;
    let mut resolve = |range: InFlightAccess, access| {
        handler
            .resolve_range(
                smmu,
                &range,
                access,
                &tolerant(),
                &mut pager,
                &mut table,
                &mut tlb,
            )
            .unwrap()
    };
    // The last page of the region, then one page past its end.
    let end = RW_REGION + REGION_LEN;
    let over = resolve(in_flight(STREAM, end - 0x1000, 0x2000), AccessKind::Read);
    assert_eq!((over.pages, over.mapped), (2, 1));
    assert_eq!(
        over.abort,
        Some(SmmuError::OutsideRegisteredRegion {
            stream: STREAM.0,
            iova: Iova::new(end),
        })
    );
    let ro = resolve(in_flight(STREAM, RO_REGION, 0x1000), AccessKind::Write);
    assert!(matches!(
        ro.abort,
        Some(SmmuError::WriteToReadOnlyRegion { .. })
    ));
    assert_eq!(ro.mapped, 0);
    // Reading it is fine.
    let read = resolve(in_flight(STREAM, RO_REGION, 0x1000), AccessKind::Read);
    assert_eq!((read.mapped, read.abort), (1, None));
    // A range that wraps around the address space is the caller's mistake, not a page's.
    let wraps = handler.resolve_range(
        smmu,
        &in_flight(STREAM, u64::MAX - 0xff, 0x200),
        AccessKind::Read,
        &tolerant(),
        &mut pager,
        &mut table,
        &mut tlb,
    );
    assert!(matches!(wraps, Err(SmmuError::InvalidConfig { .. })));
}

#[test]
fn a_fault_two_accesses_of_the_stream_cover_is_the_banks() {
    // Two transfers over the same source on one stream: the record cannot say whose.
    let accesses = [
        in_flight(STREAM, RW_REGION, 0x2000),
        in_flight(STREAM, RW_REGION + 0x1000, 0x2000),
    ];
    let r = record(
        RW_REGION + 0x1800,
        AccessKind::Read,
        FaultKind::Translation,
        false,
    );
    assert_eq!(
        attribute(Some(&r), &accesses),
        Attribution::Bank(Unattributed::Ambiguous {
            stream: STREAM,
            iova: Iova::new(RW_REGION + 0x1800),
        })
    );
    // Where only one covers it, it is that one's.
    let r = record(
        RW_REGION + 0x800,
        AccessKind::Read,
        FaultKind::Translation,
        false,
    );
    assert_eq!(attribute(Some(&r), &accesses), Attribution::Access(0));
}
