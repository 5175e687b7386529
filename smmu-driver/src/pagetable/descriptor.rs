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
