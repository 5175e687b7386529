//! Tests of the pager.

use hal::dma::HostDma;
use smmu_driver::pagetable::{Invalidations, PageTableConfig};

use super::*;

/// The scenario's capacities.
type Pager<'m> = super::Pager<'m, 'static, HostDma, 32, 32>;
const MAX_PAGES: usize = 32;

fn pager(dma: &HostDma, frames: usize) -> Pager<'_> {
    Pager::new(dma, frames, 1_000, Store::Dma).unwrap()
}

struct NoTlb;
impl TlbMaintenance for NoTlb {
    fn invalidate_now(&mut self, _: &Invalidations) -> smmu_driver::Result<()> {
        Ok(())
    }
}

#[test]
fn a_refused_region_leaves_no_region_and_no_pages_behind() {
    let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
    let mut pager = pager(&dma, 4);
    let (a, b) = (StreamId(0x14e8), StreamId(0x14e9));
    pager
        .add_region(a, Iova::new(0x1000_1000), 1, false, Fill::Byte(1))
        .unwrap();
    // B's second page is A's page: refused before anything changed.
    assert!(
        pager
            .add_region(b, Iova::new(0x1000_0000), 2, true, Fill::Byte(2))
            .is_err()
    );
    assert_eq!(pager.region(b, Iova::new(0x1000_0000)), None);
    assert_eq!(pager.region(b, Iova::new(0x1000_1000)), None);
    assert!(pager.slot(Iova::new(0x1000_0000)).is_err());
    // A's page still holds A's data, and the slots are free for a good region.
    let mut byte = [0u8; 1];
    pager.read(Iova::new(0x1000_1000), &mut byte).unwrap();
    assert_eq!(byte, [1]);
    pager
        .add_region(
            b,
            Iova::new(0x2000_0000),
            MAX_PAGES - 1,
            true,
            Fill::Byte(3),
        )
        .unwrap();
}

#[test]
fn a_frame_index_past_the_frames_is_an_error() {
    let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
    let pager = pager(&dma, 4);
    assert!(pager.frame_addr(3).is_ok());
    assert_eq!(
        pager.frame_addr(4),
        Err(BoardError::NoSuchFrame {
            frame: 4,
            frames: 4
        })
    );
}

#[test]
fn a_resolved_page_counts_as_mapped_only_once_the_table_maps_it() {
    let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
    let mut table = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut pager = pager(&dma, 4);
    let stream = StreamId(0x14e8);
    let iova = Iova::new(0x1000_0000);
    pager
        .add_region(stream, iova, 1, true, Fill::Byte(7))
        .unwrap();
    // The fault handler resolves, then maps; here the mapping never happens (as when the
    // table runs out of memory), so the page is resident but not mapped.
    pager.resolve(stream, iova, AccessKind::Read).unwrap();
    assert_eq!(
        pager.residency(iova, &table).unwrap(),
        Residency::Resident {
            frame: 0,
            mapped: false
        }
    );
    // map_now must then really map it rather than trust a flag.
    pager.map_now(iova, &mut table, &mut NoTlb).unwrap();
    assert!(table.translate(iova).unwrap().is_some());
    assert_eq!(
        pager.residency(iova, &table).unwrap(),
        Residency::Resident {
            frame: 0,
            mapped: true
        }
    );
    pager.evict(iova, &mut table, &mut NoTlb).unwrap();
    assert!(table.translate(iova).unwrap().is_none());
    assert_eq!(pager.residency(iova, &table).unwrap(), Residency::Absent);
}

#[test]
fn a_region_of_absurd_size_is_refused_and_the_pager_keeps_working() {
    let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
    let mut pager = pager(&dma, 4);
    let stream = StreamId(0x14e8);
    pager
        .add_region(stream, Iova::new(0x1000_0000), 2, true, Fill::Byte(0x5a))
        .unwrap();
    // With two slots in use, 2 + usize::MAX pages must not overflow the capacity check.
    assert_eq!(
        pager.add_region(
            stream,
            Iova::new(0x2000_0000),
            usize::MAX,
            true,
            Fill::Byte(0)
        ),
        Err(BoardError::PagerExhausted { what: "page slots" })
    );
    let mut out = [0u8; 3];
    pager.read(Iova::new(0x1000_0fff), &mut out).unwrap();
    assert_eq!(out, [0x5a; 3]);
}
