//! The identity map: translation tables and the register values that turn the MMU on.
//!
//! VMSAv8-64 stage 1, 4 KiB granule, 39-bit virtual addresses (T0SZ = 25), so the walk
//! starts at level 1 with 512 entries of 1 GiB (Arm ARM DDI 0487, D8.2 "Translation table
//! walks", D8.3 "Translation table descriptor formats"). VA = PA everywhere:
//!
//! - every 1 GiB of the 512 GiB input range below the CPU's physical address size is mapped
//!   as **Device-nGnRnE**, execute-never (MAIR attribute 0);
//! - the RAM regions (from the device tree, else the platform's boot RAM) are mapped as
//!   **Normal, inner/outer write-back read/write-allocate, inner shareable**, executable
//!   (MAIR attribute 1): 1 GiB blocks where a whole aligned GiB is RAM, 2 MiB blocks in a
//!   level-2 table otherwise. RAM bounds are rounded inward to 2 MiB.
//! - the platform's non-cacheable regions (a DMA pool for masters that do not snoop the CPU
//!   caches, e.g. the ZynqMP's SMMU table walks and zDMA; see [`crate::platform`]) are mapped
//!   inside RAM as **Normal, inner/outer non-cacheable**, execute-never (MAIR attribute 2),
//!   in 2 MiB blocks. They must be 2 MiB aligned: rounding would leave part of a DMA buffer
//!   cacheable.
//! - addresses at or above 2^39 (or the CPU's PA size, if smaller) are not mapped: an access
//!   there takes a translation fault.
//!
//! Everything is read/write at the current exception level; there is no EL0. The register
//! values are computed here (host-tested); `rt` writes them for EL1, EL2 or EL3. The
//! descriptors are written and read through a `bitfield` view ([`Descriptor`]).

use bitfield::bitfield;

use crate::error::{FirmwareError, Result};
use crate::platform::MemRegion;

/// Entries per table (4 KiB granule).
pub const ENTRIES: usize = 512;
/// Virtual address bits (TCR.T0SZ = 64 - 39 = 25).
pub const VA_BITS: u32 = 39;
/// Size of a level-1 block.
pub const L1_BLOCK: u64 = 1 << 30;
/// Size of a level-2 block.
pub const L2_BLOCK: u64 = 1 << 21;

/// The part of `region` the identity map makes Normal memory: its 2 MiB blocks, rounded
/// inward (`None` if no whole block fits).
pub fn normal_part(region: &MemRegion) -> Option<(u64, u64)> {
    let start = region.base.checked_next_multiple_of(L2_BLOCK)?;
    let end = region.end()? / L2_BLOCK * L2_BLOCK;
    (start < end).then_some((start, end))
}

/// Whether `[start, end)` lies inside the Normal part ([`normal_part`]) of one of `ram`.
pub fn inside_normal(ram: &[MemRegion], start: u64, end: u64) -> bool {
    ram.iter()
        .filter_map(normal_part)
        .any(|(lo, hi)| lo <= start && end <= hi)
}

/// MAIR attribute index of Device-nGnRnE.
pub const ATTR_DEVICE: u64 = 0;
/// MAIR attribute index of Normal write-back memory.
pub const ATTR_NORMAL: u64 = 1;
/// MAIR attribute index of Normal non-cacheable memory.
pub const ATTR_NORMAL_NC: u64 = 2;
/// MAIR_ELx (D19.2 MAIR_EL1): Attr0 = 0x00 Device-nGnRnE; Attr1 = 0xff Normal, inner and
/// outer write-back non-transient, read- and write-allocate; Attr2 = 0x44 Normal, inner and
/// outer non-cacheable (0b0100 in each half).
pub const MAIR: u64 = (0xff << (8 * ATTR_NORMAL)) | (0x44 << (8 * ATTR_NORMAL_NC));

/// SH for inner shareable (D8.3.1).
const SH_INNER: u64 = 0b11;
/// SH for outer shareable (D8.3.1).
const SH_OUTER: u64 = 0b10;

bitfield! {
    /// A descriptor of the identity map (Arm DDI 0487 D8.3.1 block and page descriptors,
    /// D8.3.2 table descriptors; 4 KiB granule, 48-bit output addresses): the fields the
    /// map writes.
    #[derive(Clone, Copy)]
    struct Descriptor(u64);
    u64;
    /// Valid, bit 0 (D8.3).
    valid, set_valid: 0;
    /// Bit 1 (D8.3): at levels 0-2, 1 is a table descriptor and 0 a block; a level-3 page
    /// has it set.
    table, set_table: 1;
    /// AttrIndx, bits \[4:2\] (D8.3.1): the MAIR attribute ([`ATTR_DEVICE`],
    /// [`ATTR_NORMAL`], [`ATTR_NORMAL_NC`]).
    attr_index, set_attr_index: 4, 2;
    /// AP\[1\], bit 6 (D8.3.1): EL0 access in the EL1&0 regime; RES1 in the one-range
    /// EL2/EL3 regimes (D8.4.1.2.1). AP\[2\] (bit 7) stays 0: read/write.
    _, set_ap1: 6;
    /// SH, bits \[9:8\] (D8.3.1): shareability.
    _, set_sh: 9, 8;
    /// AF, bit 10 (D8.3.1): the access flag.
    _, set_af: 10;
    /// Bits \[47:12\] (D8.3): the output address of a block or page, or the next-level
    /// table's address.
    address, set_address: 47, 12;
    /// PXN, bit 53 (D8.3.1): privileged execute-never in the EL1&0 regime; RES0 at EL2/EL3.
    _, set_pxn: 53;
    /// UXN, bit 54 (D8.3.1): unprivileged execute-never in the EL1&0 regime; XN, the only
    /// execute-never bit, at EL2/EL3.
    _, set_uxn_xn: 54;
}

/// A translation table: 512 descriptors, aligned to its size as the walk requires.
#[derive(Clone, Debug, PartialEq, Eq)]
#[repr(C, align(4096))]
pub struct Table(pub [u64; ENTRIES]);

impl Table {
    /// A table of invalid descriptors.
    pub const EMPTY: Table = Table([0; ENTRIES]);
}

/// The memory type of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device-nGnRnE, execute-never.
    Device,
    /// Normal write-back cacheable, inner shareable.
    Normal,
    /// Normal non-cacheable, execute-never: memory a non-coherent DMA master shares with the
    /// CPU. Marked outer shareable, which is how the architecture treats Normal
    /// non-cacheable memory whatever the SH field says (Arm ARM DDI 0487, B2 "Memory types
    /// and attributes", Normal memory shareability).
    NormalNonCacheable,
}

impl MemoryKind {
    /// The kind a block or page descriptor encodes (by its AttrIndx, as [`MAIR`] defines
    /// them).
    fn of_descriptor(desc: u64) -> Self {
        match Descriptor(desc).attr_index() {
            ATTR_NORMAL => MemoryKind::Normal,
            ATTR_NORMAL_NC => MemoryKind::NormalNonCacheable,
            _ => MemoryKind::Device,
        }
    }
}

/// The translation regime, i.e. the exception level whose MMU is configured. It decides the
/// descriptor permission bits and the TCR layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// EL1&0 (two VA ranges; TTBR1 is disabled).
    El1,
    /// EL2 without VHE (one VA range).
    El2,
    /// EL3 (one VA range).
    El3,
}

impl Regime {
    /// The regime for the current exception level; EL0 has none of its own.
    pub fn for_el(el: u8) -> Result<Self> {
        match el {
            1 => Ok(Regime::El1),
            2 => Ok(Regime::El2),
            3 => Ok(Regime::El3),
            _ => Err(FirmwareError::UnsupportedExceptionLevel { el }),
        }
    }

    /// The exception level whose registers (SCTLR_ELx, TCR_ELx, ...) configure the regime.
    pub const fn el(self) -> hal::sysreg::El {
        match self {
            Regime::El1 => hal::sysreg::El::El1,
            Regime::El2 => hal::sysreg::El::El2,
            Regime::El3 => hal::sysreg::El::El3,
        }
    }
}

/// A level-1 or level-2 block descriptor for output address `pa`.
pub fn block_descriptor(pa: u64, kind: MemoryKind, regime: Regime) -> u64 {
    let mut d = Descriptor(0);
    d.set_address(pa >> 12);
    d.set_valid(true);
    d.set_af(true);
    // AP[2:1]: AP[2] = 0 is read/write. In the EL1&0 regime AP[1] = 0 keeps EL0 out; in
    // the one-range EL2/EL3 regimes AP[1] is RES1 (D8.4.1.2.1).
    d.set_ap1(regime != Regime::El1);
    // Shareability does not apply to Device memory.
    let (attr, sh, execute_never) = match kind {
        MemoryKind::Normal => (ATTR_NORMAL, SH_INNER, false),
        MemoryKind::Device => (ATTR_DEVICE, 0, true),
        MemoryKind::NormalNonCacheable => (ATTR_NORMAL_NC, SH_OUTER, true),
    };
    d.set_attr_index(attr);
    d.set_sh(sh);
    // Execute-never: EL1&0 has PXN and UXN; EL2/EL3 have one XN at bit 54 (bit 53 is RES0
    // there).
    d.set_uxn_xn(execute_never);
    d.set_pxn(execute_never && regime == Regime::El1);
    d.0
}

/// A table descriptor pointing at the next-level table at `table_pa`.
pub fn table_descriptor(table_pa: u64) -> u64 {
    let mut d = Descriptor(0);
    d.set_address(table_pa >> 12);
    d.set_table(true);
    d.set_valid(true);
    d.0
}

/// What a descriptor found while splitting is: `Some(true)` a table, `Some(false)` a block,
/// `None` invalid.
fn table_or_block(desc: u64) -> Option<bool> {
    let d = Descriptor(desc);
    d.valid().then_some(d.table())
}

/// Physical address bits for ID_AA64MMFR0_EL1.PARange (D19.2 ID_AA64MMFR0_EL1), or `None`
/// for a reserved encoding.
pub const fn pa_bits_from_parange(parange: u64) -> Option<u32> {
    match parange {
        0 => Some(32),
        1 => Some(36),
        2 => Some(40),
        3 => Some(42),
        4 => Some(44),
        5 => Some(48),
        6 => Some(52),
        _ => None,
    }
}

/// The TCR_ELx.IPS / PS encoding for the output size. 52-bit output needs the 64 KiB
/// granule or FEAT_LPA2, so with this 4 KiB map it is capped at 48 bits.
pub const fn ps_encoding(pa_bits: u32) -> u64 {
    match pa_bits {
        0..=32 => 0,
        33..=36 => 1,
        37..=40 => 2,
        41..=42 => 3,
        43..=44 => 4,
        _ => 5,
    }
}

/// TCR_ELx for the identity map (D19.2 TCR_EL1 / TCR_EL2 / TCR_EL3): T0SZ = 25, table walks
/// inner/outer write-back write-allocate and inner shareable (the tables live in normal RAM),
/// 4 KiB granule, output size from `pa_bits`. In EL1 the TTBR1 half is disabled (EPD1).
pub const fn tcr(regime: Regime, pa_bits: u32) -> u64 {
    let t0sz = (64 - VA_BITS) as u64;
    let walk = (0b01 << 8) | (0b01 << 10) | (0b11 << 12); // IRGN0, ORGN0, SH0; TG0 = 0 (4K)
    let ps = ps_encoding(pa_bits);
    match regime {
        // EPD1 (23) = 1, TG1 (31:30) = 0b10 (4 KiB, a valid value even though unused),
        // IPS at 34:32.
        Regime::El1 => t0sz | walk | (1 << 23) | (0b10 << 30) | (ps << 32),
        // PS at 18:16; bits 31 and 23 are RES1.
        Regime::El2 | Regime::El3 => t0sz | walk | (ps << 16) | (1 << 31) | (1 << 23),
    }
}

/// SCTLR_ELx bits the runtime sets: M (MMU), C (data cache), I (instruction cache)
/// (D19.2 SCTLR_EL1 / EL2 / EL3).
pub const SCTLR_SET: u64 = (1 << 0) | (1 << 2) | (1 << 12);
/// SCTLR_ELx bits the runtime clears: A (alignment check, so unaligned normal-memory accesses
/// behave as on a normal system) and WXN.
pub const SCTLR_CLEAR: u64 = (1 << 1) | (1 << 19);

/// How the identity map was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSummary {
    /// Tables used (the level-1 table plus level-2 tables).
    pub tables: usize,
    /// Top of the mapped range: `2^min(39, pa_bits)`.
    pub mapped_limit: u64,
}

/// Fills `tables` with the identity map: `tables[0]` becomes the level-1 table (the TTBR0
/// value is its address), further tables are level-2 tables as needed. `table_pa` gives the
/// physical address of a table (its address in the identity map; on the host, whatever the
/// test's walker uses). `normal` lists the RAM regions; `non_cacheable` lists parts of RAM to
/// map Normal non-cacheable instead (each 2 MiB aligned in base and size, and inside one RAM
/// region); everything else below `2^min(39, pa_bits)` is Device memory.
pub fn build_identity_map(
    tables: &mut [Table],
    table_pa: impl Fn(&Table) -> u64,
    normal: &[MemRegion],
    non_cacheable: &[MemRegion],
    pa_bits: u32,
    regime: Regime,
) -> Result<MapSummary> {
    let available = tables.len();
    let (l1, l2s) = tables
        .split_first_mut()
        .ok_or(FirmwareError::PageTablesExhausted { available })?;
    let mapped_limit = 1u64 << VA_BITS.min(pa_bits);
    for (i, entry) in l1.0.iter_mut().enumerate() {
        let base = i as u64 * L1_BLOCK;
        *entry = if base < mapped_limit {
            block_descriptor(base, MemoryKind::Device, regime)
        } else {
            0
        };
    }

    let mut map = Blocks {
        l1,
        l2s,
        l2_of_gib: [None; ENTRIES],
        used: 0,
        available,
        table_pa,
        regime,
    };
    for region in normal {
        let not_mappable = FirmwareError::RegionNotMappable {
            base: region.base,
            size: region.size,
        };
        let (start, end) = normal_part(region)
            .filter(|&(_, end)| end <= mapped_limit)
            .ok_or(not_mappable)?;
        map.map(start, end, MemoryKind::Normal, not_mappable)?;
    }
    for region in non_cacheable {
        let not_mappable = FirmwareError::RegionNotMappable {
            base: region.base,
            size: region.size,
        };
        let end = region.end().ok_or(not_mappable)?;
        let aligned = region.base.is_multiple_of(L2_BLOCK) && region.size.is_multiple_of(L2_BLOCK);
        let in_ram = normal
            .iter()
            .any(|r| r.contains_range(region.base, region.size));
        if !aligned || region.size == 0 || end > mapped_limit || !in_ram {
            return Err(not_mappable);
        }
        map.map(
            region.base,
            end,
            MemoryKind::NormalNonCacheable,
            not_mappable,
        )?;
    }
    Ok(MapSummary {
        tables: 1 + map.used,
        mapped_limit,
    })
}

/// Makes the 4 KiB pages at `guards` invalid in a map [`build_identity_map`] made, so that
/// any access there takes a translation fault: a stack that overflows stops at its guard
/// page, with the fault reported, instead of running into the memory below. The 1 GiB or
/// 2 MiB block holding a guard is split into a table of smaller blocks or pages with the
/// same attributes, using the tables after the `summary.tables` already in use. Call it
/// before the MMU is on (no break-before-make is needed then). Returns the new summary.
pub fn unmap_guard_pages(
    tables: &mut [Table],
    table_pa: impl Fn(&Table) -> u64,
    summary: MapSummary,
    guards: &[u64],
) -> Result<MapSummary> {
    let available = tables.len();
    let mut used = summary.tables;
    // The table a table descriptor points at, by its physical address.
    let find = |tables: &[Table], desc: u64| {
        tables
            .iter()
            .position(|t| table_pa(t) == Descriptor(desc).address() << 12)
    };
    // Splits the block in `tables[table].0[entry]` (covering `block_bytes` from its output
    // address) into a new table of `block_bytes / 512` pieces; returns the new table.
    let mut split = |tables: &mut [Table], table: usize, entry: usize, piece: u64, page: bool| {
        let index = used;
        let desc = tables
            .get(table)
            .and_then(|t| t.0.get(entry))
            .copied()
            .ok_or(FirmwareError::PageTablesExhausted { available })?;
        let block = Descriptor(desc);
        let base = (block.address() << 12) & !(piece * ENTRIES as u64 - 1);
        let new = tables
            .get_mut(index)
            .ok_or(FirmwareError::PageTablesExhausted { available })?;
        for (k, e) in new.0.iter_mut().enumerate() {
            // The block's bits, with its piece's address; a level-3 page descriptor has
            // bit 1 set, a level-2 block has it clear.
            let mut d = block;
            d.set_table(page);
            d.set_address((base + k as u64 * piece) >> 12);
            *e = d.0;
        }
        let pa = table_pa(new);
        if let Some(e) = tables.get_mut(table).and_then(|t| t.0.get_mut(entry)) {
            *e = table_descriptor(pa);
        }
        used += 1;
        Ok::<usize, FirmwareError>(index)
    };
    for &guard in guards {
        let fail = FirmwareError::RegionNotMappable {
            base: guard,
            size: 4096,
        };
        if !guard.is_multiple_of(4096) || guard >= summary.mapped_limit {
            return Err(fail);
        }
        let gib = (guard / L1_BLOCK) as usize;
        let l1 = tables
            .first()
            .and_then(|t| t.0.get(gib))
            .copied()
            .ok_or(fail)?;
        let l2 = match table_or_block(l1) {
            Some(true) => find(tables, l1).ok_or(fail)?,
            Some(false) => split(tables, 0, gib, L2_BLOCK, false)?,
            None => return Err(fail),
        };
        let j = ((guard % L1_BLOCK) / L2_BLOCK) as usize;
        let l2e = tables
            .get(l2)
            .and_then(|t| t.0.get(j))
            .copied()
            .ok_or(fail)?;
        let l3 = match table_or_block(l2e) {
            Some(true) => find(tables, l2e).ok_or(fail)?,
            Some(false) => split(tables, l2, j, 4096, true)?,
            None => return Err(fail),
        };
        let k = ((guard % L2_BLOCK) / 4096) as usize;
        if let Some(e) = tables.get_mut(l3).and_then(|t| t.0.get_mut(k)) {
            *e = 0;
        }
    }
    Ok(MapSummary {
        tables: used,
        ..summary
    })
}

/// The tables being filled by [`build_identity_map`].
struct Blocks<'t, F> {
    l1: &'t mut Table,
    l2s: &'t mut [Table],
    /// Which level-2 table (index into `l2s`) covers which GiB.
    l2_of_gib: [Option<usize>; ENTRIES],
    used: usize,
    available: usize,
    table_pa: F,
    regime: Regime,
}

impl<F: Fn(&Table) -> u64> Blocks<'_, F> {
    /// Maps `[start, end)` (2 MiB aligned) as `kind`: a level-1 block for a whole aligned GiB
    /// not yet split, otherwise 2 MiB blocks in the GiB's level-2 table (made on first use).
    fn map(
        &mut self,
        start: u64,
        end: u64,
        kind: MemoryKind,
        not_mappable: FirmwareError,
    ) -> Result<()> {
        let regime = self.regime;
        let mut at = start;
        while at < end {
            let gib = (at / L1_BLOCK) as usize;
            let whole_gib = at.is_multiple_of(L1_BLOCK) && end - at >= L1_BLOCK;
            if whole_gib && self.l2_of_gib.get(gib).copied().flatten().is_none() {
                if let Some(entry) = self.l1.0.get_mut(gib) {
                    *entry = block_descriptor(at, kind, regime);
                }
                at += L1_BLOCK;
                continue;
            }
            let index = self.l2_table(gib, not_mappable)?;
            let table = self.l2s.get_mut(index).ok_or(not_mappable)?;
            let gib_end = (gib as u64 + 1) * L1_BLOCK;
            while at < end.min(gib_end) {
                let j = ((at % L1_BLOCK) / L2_BLOCK) as usize;
                if let Some(e) = table.0.get_mut(j) {
                    *e = block_descriptor(at, kind, regime);
                }
                at += L2_BLOCK;
            }
        }
        Ok(())
    }

    /// The level-2 table of `gib`, made on first use by splitting the GiB's level-1 block
    /// (device, or memory from an earlier region) into 512 blocks of the same kind.
    fn l2_table(&mut self, gib: usize, not_mappable: FirmwareError) -> Result<usize> {
        let slot = self.l2_of_gib.get_mut(gib).ok_or(not_mappable)?;
        if let Some(index) = *slot {
            return Ok(index);
        }
        let available = self.available;
        let table = self
            .l2s
            .get_mut(self.used)
            .ok_or(FirmwareError::PageTablesExhausted { available })?;
        let gib_base = gib as u64 * L1_BLOCK;
        let old = self.l1.0.get(gib).copied().unwrap_or(0);
        let kind = MemoryKind::of_descriptor(old);
        for (j, e) in table.0.iter_mut().enumerate() {
            *e = block_descriptor(gib_base + j as u64 * L2_BLOCK, kind, self.regime);
        }
        if let Some(entry) = self.l1.0.get_mut(gib) {
            *entry = table_descriptor((self.table_pa)(table));
        }
        *slot = Some(self.used);
        self.used += 1;
        Ok(self.used - 1)
    }
}

#[cfg(test)]
mod tests;
