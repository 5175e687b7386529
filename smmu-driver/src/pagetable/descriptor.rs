//! Builder-side descriptor encoding (VMSAv8-64, 4 KiB granule, 48-bit output addresses).
//!
//! Field positions: Arm ARM DDI0487 "Translation table descriptor formats" (D8.3 in M.a),
//! declared once as a `bitfield` view ([`Descriptor`]) that the builder writes through.
//! The walker ([`crate::walk`]) decodes with its own declaration, so the two still check
//! each other.

use bitfield::bitfield;
use hal::PhysAddr;

use super::attrs::{Attributes, Permissions, Shareability};

bitfield! {
    /// A stage-1 VMSAv8-64 descriptor, 4 KiB granule, 48-bit addresses: the fields the
    /// builder writes (Arm DDI0487 D8.3, "Translation table descriptor formats"; the
    /// attributes are the stage-1 block and page descriptor fields). Table descriptors use
    /// only Valid, the table bit and the address (APTable, XNTable, PXNTable stay 0).
    #[derive(Clone, Copy)]
    struct Descriptor(u64);
    u64;
    /// Valid, bit 0 (DDI0487 D8.3).
    valid, set_valid: 0;
    /// Bit 1 (DDI0487 D8.3): 1 is a table descriptor at levels 0-2 and a page at level 3;
    /// 0 is a block at levels 1-2 (and reserved at level 3).
    table_or_page, set_table_or_page: 1;
    /// AttrIndx, bits \[4:2\] (DDI0487 D8.3): the MAIR field giving the memory type.
    u8, _, set_attr_index: 4, 2;
    /// AP\[1\], bit 6 (DDI0487 D8.3): unprivileged accesses allowed.
    _, set_ap1: 6;
    /// AP\[2\], bit 7 (DDI0487 D8.3): read-only.
    _, set_ap2: 7;
    /// SH, bits \[9:8\] (DDI0487 D8.3): shareability (0b00 non-, 0b10 outer, 0b11 inner).
    u8, _, set_sh: 9, 8;
    /// AF, bit 10 (DDI0487 D8.3): the access flag.
    _, set_af: 10;
    /// nG, bit 11 (DDI0487 D8.3): not global, TLB entries are tagged with the ASID.
    _, set_ng: 11;
    /// Bits \[47:12\] (DDI0487 D8.3): the output address of a block or page, or the
    /// next-level table's address.
    address, set_address: 47, 12;
    /// PXN, bit 53 (DDI0487 D8.3): privileged execute-never.
    _, set_pxn: 53;
    /// UXN, bit 54 (DDI0487 D8.3): unprivileged execute-never.
    _, set_uxn: 54;
}

/// What a descriptor at some level is, as the builder sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Bit 0 clear.
    Invalid,
    /// A table descriptor (levels 0-2) pointing at the next-level table.
    Table(PhysAddr),
    /// A block (level 2) or page (level 3) descriptor.
    Leaf(u64),
    /// An encoding the builder never writes (level-0/1 block, level-3 0b01).
    Reserved,
}

/// Classifies `raw` found at `level`.
pub(crate) fn classify(raw: u64, level: u8) -> Entry {
    let d = Descriptor(raw);
    if !d.valid() {
        return Entry::Invalid;
    }
    match (level, d.table_or_page()) {
        (0..=2, true) => Entry::Table(PhysAddr::new(d.address() << 12)),
        (2, false) | (3, true) => Entry::Leaf(raw),
        _ => Entry::Reserved,
    }
}

/// A table descriptor pointing at `table` (APTable/XNTable/PXNTable left 0: no hierarchical
/// restriction).
pub(crate) fn table(table: PhysAddr) -> u64 {
    let mut d = Descriptor(0);
    d.set_address(table.as_u64() >> 12);
    d.set_table_or_page(true);
    d.set_valid(true);
    d.0
}

/// Writes the fields [`Permissions`] covers: AP\[2:1\], AF, PXN and UXN.
fn set_permissions(d: &mut Descriptor, p: &Permissions) {
    d.set_ap1(p.unprivileged);
    d.set_ap2(!p.writable);
    d.set_af(p.accessed);
    d.set_pxn(p.execute_never);
    d.set_uxn(p.execute_never);
}

/// A leaf descriptor: a page at level 3, a block at level 2. `out` must be aligned to the
/// entry's size (the caller checks).
pub(crate) fn leaf(out: PhysAddr, attrs: &Attributes, level: u8) -> u64 {
    let mut d = Descriptor(0);
    d.set_valid(true);
    d.set_table_or_page(level == 3);
    d.set_attr_index(attrs.mair_index.get());
    d.set_sh(match attrs.shareability {
        Shareability::NonShareable => 0b00,
        Shareability::OuterShareable => 0b10,
        Shareability::InnerShareable => 0b11,
    });
    set_permissions(&mut d, &attrs.permissions);
    d.set_ng(attrs.not_global);
    d.set_address(out.as_u64() >> 12);
    d.0
}

/// `leaf` with its permission bits replaced by `p`.
pub(crate) fn with_permissions(leaf: u64, p: &Permissions) -> u64 {
    let mut d = Descriptor(leaf);
    set_permissions(&mut d, p);
    d.0
}

/// The level-3 page descriptor for page `index` (0..512) of the level-2 block `block`: same
/// attributes, output address advanced by `index` pages.
pub(crate) fn page_of_block(block: u64, index: u64) -> u64 {
    let mut d = Descriptor(block);
    // The block's 2 MiB-aligned output address, in pages: address bits [20:12] cleared.
    let base = d.address() & !0x1ff;
    d.set_address(base + index);
    d.set_table_or_page(true);
    d.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagetable::attrs::MairIndex;

    // Every expected value is worked out from the VMSAv8-64 stage-1 descriptor formats (Arm
    // DDI0487 D8.3): valid bit 0, table/page bit 1, AttrIndx [4:2], AP[1] bit 6, AP[2] bit 7,
    // SH [9:8], AF bit 10, nG bit 11, output / next-level address [47:12], PXN bit 53, UXN
    // bit 54.

    fn attrs(
        mair: u8,
        shareability: Shareability,
        not_global: bool,
        permissions: Permissions,
    ) -> Attributes {
        Attributes {
            mair_index: MairIndex::new(mair).unwrap(),
            shareability,
            not_global,
            permissions,
        }
    }

    const NOTHING: Permissions = Permissions {
        writable: false,
        unprivileged: false,
        execute_never: false,
        accessed: false,
    };

    #[test]
    fn table_descriptors() {
        // Address [47:12] | table 0b10 | valid.
        assert_eq!(
            table(PhysAddr::new(0x0000_ffff_ffff_f000)),
            0x0000_ffff_ffff_f003
        );
        // Bits outside [47:12] of the address are dropped.
        assert_eq!(table(PhysAddr::new(0xffff_0000_0000_1fff)), 0x1003);
    }

    #[test]
    fn leaf_descriptors() {
        // Page, AttrIndx 7 (0x1c), non-shareable, global, read-only (AP[2] 0x80), privileged
        // only, executable, AF clear: 0x1c | 0x80 | 0b11.
        let a = attrs(7, Shareability::NonShareable, false, NOTHING);
        assert_eq!(leaf(PhysAddr::new(0x4000_1000), &a, 3), 0x4000_109f);
        // Level-2 block (bit 1 clear) at the top of a 48-bit output: AttrIndx 2 (0x8), outer
        // shareable (0b10 at 9:8 -> 0x200), nG (0x800), AP[1] (0x40), AF (0x400), PXN and
        // UXN (0x0060 << 48).
        let a = attrs(
            2,
            Shareability::OuterShareable,
            true,
            Permissions::READ_WRITE,
        );
        assert_eq!(
            leaf(PhysAddr::new(0x0000_ffff_ffe0_0000), &a, 2),
            0x0060_ffff_ffe0_0e49
        );
        // Inner shareable (0x300), write-back (AttrIndx 1 = 0x4); the address loses the bits
        // outside [47:12].
        let a = attrs(
            1,
            Shareability::InnerShareable,
            true,
            Permissions::READ_ONLY,
        );
        assert_eq!(
            leaf(PhysAddr::new(0xffff_0000_4000_2fff), &a, 3),
            0x0060_0000_4000_2fc7
        );
    }

    #[test]
    fn permissions_are_replaced_in_place() {
        // A read-write page with the Contiguous bit (52) and a software bit (55) set: only
        // AP[2:1], AF, PXN and UXN change.
        let rw = 0x00f0_0000_4000_1f47;
        assert_eq!(
            with_permissions(rw, &Permissions::READ_ONLY),
            0x00f0_0000_4000_1fc7
        );
        assert_eq!(
            with_permissions(
                rw,
                &Permissions {
                    writable: true,
                    ..NOTHING
                }
            ),
            0x0090_0000_4000_1b07
        );
        assert_eq!(
            with_permissions(0x0090_0000_4000_1b07, &Permissions::READ_WRITE),
            rw
        );
    }

    #[test]
    fn pages_of_a_block() {
        // The block's attributes with bit 1 set, output address advanced by whole pages
        // from the block's 2 MiB-aligned base (address bits [20:12] of the block ignored).
        let block = 0x0060_0000_8020_0f45;
        assert_eq!(page_of_block(block, 0), 0x0060_0000_8020_0f47);
        assert_eq!(page_of_block(block, 511), 0x0060_0000_803f_ff47);
        assert_eq!(
            page_of_block(0x0060_0000_8020_5f45, 1),
            0x0060_0000_8020_1f47
        );
    }

    #[test]
    fn classification() {
        for level in 0..=3 {
            assert_eq!(classify(0, level), Entry::Invalid);
            assert_eq!(classify(0x0060_0000_8020_0f46, level), Entry::Invalid);
        }
        for level in 0..=2 {
            // The next-level address is [47:12]; attribute and upper bits are not part of it.
            assert_eq!(
                classify(0xfff0_1234_5678_9fff, level),
                Entry::Table(PhysAddr::new(0x1234_5678_9000))
            );
        }
        assert_eq!(classify(0x8020_0f45, 2), Entry::Leaf(0x8020_0f45));
        assert_eq!(classify(0x4000_1f47, 3), Entry::Leaf(0x4000_1f47));
        // Level-0/1 blocks and level-3 0b01 are never written by the builder.
        assert_eq!(classify(0x4000_0f45, 0), Entry::Reserved);
        assert_eq!(classify(0x4000_0f45, 1), Entry::Reserved);
        assert_eq!(classify(0x4000_1f45, 3), Entry::Reserved);
    }
}
