//! Builder-side descriptor encoding (VMSAv8-64, 4 KiB granule, 48-bit output addresses).
//!
//! Field positions: Arm ARM DDI0487 "Translation table descriptor formats" (D8.3 in M.a).
//! The walker ([`crate::walk`]) decodes with its own code.

use hal::PhysAddr;

use super::attrs::{Attributes, Permissions, Shareability};

/// Bit 0: valid.
pub(crate) const VALID: u64 = 1 << 0;
/// Bit 1: table (levels 0-2) or page (level 3); 0 = block at levels 1-2.
pub(crate) const TABLE_OR_PAGE: u64 = 1 << 1;
/// Output address / next-level table address, bits [47:12].
pub(crate) const ADDR_MASK: u64 = 0x0000_ffff_ffff_f000;

const ATTR_INDEX_SHIFT: u32 = 2;
const AP1_UNPRIVILEGED: u64 = 1 << 6;
const AP2_READ_ONLY: u64 = 1 << 7;
const SH_SHIFT: u32 = 8;
const AF: u64 = 1 << 10;
const NOT_GLOBAL: u64 = 1 << 11;
const PXN: u64 = 1 << 53;
const UXN: u64 = 1 << 54;

/// The bits [`Permissions`] covers, so they can be replaced in place.
const PERMISSION_BITS: u64 = AP1_UNPRIVILEGED | AP2_READ_ONLY | AF | PXN | UXN;

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
    if raw & VALID == 0 {
        return Entry::Invalid;
    }
    let table_or_page = raw & TABLE_OR_PAGE != 0;
    match (level, table_or_page) {
        (0..=2, true) => Entry::Table(PhysAddr::new(raw & ADDR_MASK)),
        (2, false) | (3, true) => Entry::Leaf(raw),
        _ => Entry::Reserved,
    }
}

/// A table descriptor pointing at `table` (APTable/XNTable/PXNTable left 0: no hierarchical
/// restriction).
pub(crate) fn table(table: PhysAddr) -> u64 {
    (table.as_u64() & ADDR_MASK) | TABLE_OR_PAGE | VALID
}

fn permission_bits(p: &Permissions) -> u64 {
    let mut bits = 0;
    if p.unprivileged {
        bits |= AP1_UNPRIVILEGED;
    }
    if !p.writable {
        bits |= AP2_READ_ONLY;
    }
    if p.accessed {
        bits |= AF;
    }
    if p.execute_never {
        bits |= PXN | UXN;
    }
    bits
}

/// A leaf descriptor: a page at level 3, a block at level 2. `out` must be aligned to the
/// entry's size (the caller checks).
pub(crate) fn leaf(out: PhysAddr, attrs: &Attributes, level: u8) -> u64 {
    let sh = match attrs.shareability {
        Shareability::NonShareable => 0b00,
        Shareability::OuterShareable => 0b10,
        Shareability::InnerShareable => 0b11,
    };
    let mut raw = (out.as_u64() & ADDR_MASK)
        | VALID
        | (u64::from(attrs.mair_index.get()) << ATTR_INDEX_SHIFT)
        | (sh << SH_SHIFT)
        | permission_bits(&attrs.permissions);
    if attrs.not_global {
        raw |= NOT_GLOBAL;
    }
    if level == 3 {
        raw |= TABLE_OR_PAGE;
    }
    raw
}

/// `leaf` with its permission bits replaced by `p`.
pub(crate) fn with_permissions(leaf: u64, p: &Permissions) -> u64 {
    (leaf & !PERMISSION_BITS) | permission_bits(p)
}

/// The level-3 page descriptor for page `index` (0..512) of the level-2 block `block`: same
/// attributes, output address advanced by `index` pages.
pub(crate) fn page_of_block(block: u64, index: u64) -> u64 {
    let base = block & ADDR_MASK & !0x1f_ffff;
    (block & !ADDR_MASK) | TABLE_OR_PAGE | (base + (index << 12))
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
