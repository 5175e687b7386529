//! The SMMU fault path on the real Linux mm: `SmmuResolver` behind `FaultHandler`, mapping the
//! faulting page's real frame into an SMMU stage-1 table.

mod common;

use hal::dma::HostDma;
use hal::{Iova, PhysAddr};
use linux_glue::mapping::{Mapping, Protection};
use linux_glue::{Access, SmmuResolver};
use smmu_driver::fault::{
    AccessKind, FaultDecision, FaultHandler, FaultKind, FaultRecord, FaultResolver, RawSyndrome,
    ResolveEstimate, SmmuFlavour, SmmuId, StandardPolicy, StreamFaultConfig, StreamId,
};
use smmu_driver::pagetable::{Invalidations, PageTable, PageTableConfig, TlbMaintenance};

use common::{PAGE, TRIES, glue, root, skip, until_agree};

const STREAM: StreamId = StreamId(0x14e8);

struct NoTlb;
impl TlbMaintenance for NoTlb {
    fn invalidate_now(&mut self, _: &Invalidations) -> smmu_driver::Result<()> {
        Ok(())
    }
}

fn record(iova: u64, access: AccessKind) -> FaultRecord {
    FaultRecord {
        smmu: SmmuId {
            flavour: SmmuFlavour::V2,
            instance: 0,
        },
        stream: STREAM,
        iova: Iova::new(iova),
        access,
        kind: FaultKind::Translation,
        level: Some(3),
        stall: None,
        syndrome: RawSyndrome::default(),
    }
}

#[test]
fn regions_follow_registrations_and_streams() {
    let (glue, _rx) = glue();
    let m = Mapping::anonymous(8 * PAGE, Protection::ReadWrite).unwrap();
    let id = glue.register(m.addr(), 4 * PAGE, Access::Read).unwrap();
    let r = SmmuResolver::new(glue.resolver(), STREAM);
    let base = m.addr().as_u64();

    let region = r
        .region(STREAM, Iova::new(base + PAGE + 12))
        .expect("inside");
    assert_eq!(
        (region.start, region.len, region.writable),
        (Iova::new(base), 4 * PAGE, false)
    );
    assert_eq!(
        r.region(STREAM, Iova::new(base + 4 * PAGE)),
        None,
        "past the registered part"
    );
    assert_eq!(
        r.region(StreamId(1), Iova::new(base)),
        None,
        "another stream"
    );
    // An untouched anonymous page is a zero-fill: minor.
    assert!(matches!(
        r.estimate(STREAM, Iova::new(base), AccessKind::Read),
        ResolveEstimate::Minor { .. }
    ));
    glue.deregister(id).unwrap();
    assert_eq!(r.region(STREAM, Iova::new(base)), None, "deregistered");
}

#[test]
fn handler_maps_the_real_frame() {
    let (glue, _rx) = glue();
    // Page 2, and a fresh page after it for each retry.
    let m = Mapping::anonymous((2 + TRIES as u64) * PAGE, Protection::ReadWrite).unwrap();
    glue.register(m.addr(), m.len(), Access::Write).unwrap();
    let mut resolver = SmmuResolver::new(glue.resolver(), STREAM);
    let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
    let mut table = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut handler = FaultHandler::new(StandardPolicy::RetransmitOnly);
    let iova = m.addr().as_u64() + 2 * PAGE + 8;

    let outcome = handler.handle(
        &record(iova, AccessKind::Write),
        &StreamFaultConfig::NEVER_STALL,
        &mut resolver,
        &mut table,
        &mut NoTlb,
    );
    if !root() {
        // Without CAP_SYS_ADMIN the frame is hidden: the handler must abort, never map.
        skip("handler_maps_the_real_frame", "needs root to see frames");
        assert!(matches!(
            outcome.map(|o| o.decision),
            Ok(FaultDecision::Abort(_)) | Err(_)
        ));
        assert!(table.translate(Iova::new(iova)).unwrap().is_none());
        return;
    }
    // The leaf maps the frame pagemap shows afterwards. Compaction may move the page between
    // the two reads: a retry has the handler fault in the next, untouched page.
    let mut first = Some(outcome);
    until_agree("frame mapped by the SMMU", |attempt| {
        let page = m.addr().as_u64() + (2 + attempt as u64) * PAGE;
        let iova = page + 8;
        let outcome = first.take().unwrap_or_else(|| {
            handler.handle(
                &record(iova, AccessKind::Write),
                &StreamFaultConfig::NEVER_STALL,
                &mut resolver,
                &mut table,
                &mut NoTlb,
            )
        });
        assert_eq!(
            outcome.unwrap().decision,
            FaultDecision::TerminateAndRetransmit
        );
        let leaf = table.translate(Iova::new(iova)).unwrap().expect("mapped");
        let state = glue
            .page_states(
                hal::AlignedRange::new(hal::VirtAddr::new(page), PAGE, hal::PageSize::Size4K)
                    .unwrap(),
            )
            .unwrap();
        let frame = state[0].frame.expect("root sees the frame");
        let mapped = leaf.phys(Iova::new(iova));
        if mapped == frame.checked_add(8).unwrap() {
            Ok(())
        } else {
            Err(format!(
                "the SMMU maps {mapped:?}, the page Linux faulted in is at {frame:?}"
            ))
        }
    });

    // A write fault outside the registration is aborted and nothing is mapped.
    let outside = m.addr().as_u64() + m.len() + 4 * PAGE;
    let o = handler
        .handle(
            &record(outside, AccessKind::Write),
            &StreamFaultConfig::NEVER_STALL,
            &mut resolver,
            &mut table,
            &mut NoTlb,
        )
        .unwrap();
    assert!(matches!(o.decision, FaultDecision::Abort(_)));
    assert!(table.translate(Iova::new(outside)).unwrap().is_none());
}

#[test]
fn a_region_registered_for_device_reads_is_never_mapped_writable() {
    if !root() {
        skip(
            "a_region_registered_for_device_reads_is_never_mapped_writable",
            "frames need CAP_SYS_ADMIN",
        );
        return;
    }
    // Private writable memory: with stable frames a device read is faulted in for write,
    // which must not widen what the device may do.
    let (glue, _rx) = glue();
    let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
    glue.register(m.addr(), m.len(), Access::Read).unwrap();
    let mut resolver = SmmuResolver::new(glue.resolver(), STREAM);
    let iova = Iova::new(m.addr().as_u64());
    assert!(!resolver.region(STREAM, iova).unwrap().writable);
    let page = resolver.resolve(STREAM, iova, AccessKind::Read).unwrap();
    assert!(!page.attributes.permissions.writable);
}
