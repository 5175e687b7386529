//! Stage-1 translation tables for one SMMU context (VMSAv8-64, 4 KiB granule, 48-bit IOVAs,
//! levels 0-3), as an SMMUv3 context descriptor (`CD.TTB0`, `T0SZ` = 16, `TG0` = 4 KiB) or an
//! SMMUv2 context bank (`TTBR0`, `TCR.T0SZ` = 16, `TG0` = 4 KiB) points at them.
//!
//! [`PageTable`] maps 4 KiB pages and 2 MiB blocks, unmaps and re-permissions any 4 KiB-aligned
//! range (splitting blocks as needed) and translates. Table memory comes from
//! [`hal::dma::DmaMemory`] because the SMMU walks it by physical address.
//!
//! # What each operation reports
//!
//! Every mutating operation returns the [`Invalidations`] the SMMU's TLBs need, and nothing
//! more:
//!
//! - a new entry written over an invalid one needs none: entries that would raise a
//!   Translation, Address size or Access flag fault are never cached in a TLB (Arm ARM DDI0487
//!   D8.16, rule R_XCLRD), and SMMUs cache "valid translations only" (SMMUv3 IHI0070 §3.21.1).
//!   QEMU 7.2 matches this: it does not cache failed translations (`smmuv3_translate`);
//! - a valid leaf that becomes invalid or changes permissions is reported as a leaf
//!   invalidation at its level. An AF = 0 leaf counts as valid here: with access-flag faults
//!   disabled (CD.AFFD, SCTLR.AFFD) or ignored (QEMU 7.2's `smmu_ptw_64`) it translates and
//!   may be cached;
//! - a table descriptor that is replaced is invalidated with `leaf_only = false`, so walk
//!   caches drop it, before the table page is freed.
//!
//! Breaking a live entry and re-making it (below) needs the invalidation *in the middle*, so
//! those operations take a [`TlbMaintenance`] and call it synchronously; what they invalidate
//! there is not repeated in the returned list.
//!
//! # Break-before-make
//!
//! Changing the size of a live translation (splitting a 2 MiB block into pages, or replacing
//! a table with a block) needs break-before-make (Arm ARM "Using break-before-make when
//! updating translation table entries"; IHI0070 §3.21.1.1). Without it a TLB could hold the old
//! block and a new page for the same IOVA at once: a TLB conflict (SMMUv3 `F_TLB_CONFLICT`) or
//! a CONSTRAINED UNPREDICTABLE mix of both. Splitting the block at level-2 entry `E` for the
//! 2 MiB at `B` goes:
//!
//! 1. Allocate a zeroed level-3 table `T` (unreachable, so no walker can see it yet) and write
//!    all 512 entries with their *final* values: the block's pages with the block's
//!    attributes, except the pages the operation changes (invalid for unmap, new permissions
//!    for protect).
//! 2. Break: one 64-bit store of 0 to `E`, then `DmaMemory::sync_for_device` (`dsb st`; on
//!    a non-coherent walker also a cache clean) so the walker sees `T`'s contents and `E`
//!    invalid.
//! 3. Invalidate: [`TlbMaintenance::invalidate_now`] with `{B, 2 MiB, level 2, leaf}` (plus
//!    anything still pending from this operation), which returns only once the SMMU confirms
//!    completion (`CMD_SYNC` / `TLBSYNC`). After that no TLB entry for the block exists and
//!    no walk that read the old `E` is still in flight (IHI0070 §3.21.1 completion rules).
//! 4. Make: one 64-bit store of the table descriptor for `T` to `E`, then
//!    `sync_for_device`.
//! 5. Nothing more to report for `[B, B + 2 MiB)`: `E` was invalid from step 2 to step 4, so
//!    nothing from the old block can be cached, and `T`'s entries are new.
//!
//! Filling `T` before the break keeps the window in which DMA to the rest of the block
//! faults down to the TLBI and its sync. A transaction that faults in that window finds a
//! valid mapping once the fault handler looks, and is resumed or retransmitted like any
//! spurious fault (see [`crate::fault`]). SMMUv3.2's BBML levels could avoid the window;
//! neither QEMU's nor the MMU-500's rules require it, so this is the sequence used for both.
//!
//! Replacing an all-invalid level-3 table by a 2 MiB block follows the same steps with
//! `{B, 2 MiB, level 2, leaf_only = false}` in step 3, and the old table is freed after step
//! 4. Tables are otherwise kept when they empty (as Linux's io-pgtable-arm does for partial
//! unmaps), so unmapping never needs a walk-cache invalidation.
//!
//! # Stores and barriers
//!
//! Every descriptor is written with one naturally aligned 64-bit volatile store
//! ([`hal::dma::DmaRegion::write_u64`]), so the walker never sees half a descriptor (IHI0070
//! §3.21.1 inherits the Armv8-A single-copy atomicity of descriptor reads). Before a new
//! table becomes reachable, before each break-before-make invalidation and at the end of
//! every operation, the touched table memory is published with
//! `DmaMemory::sync_for_device`, which is at least a `dsb st` (hal barrier notes: a DSB ST
//! also covers a non-coherent observer). The caller's TLB invalidation comes after that.
//!
//! # Why not the `aarch64-paging` crate
//!
//! See `docs/smmu-driver.md` ("Translation tables"): in short, its `Translation` trait
//! cannot fail an allocation (we must not panic when DMA memory runs out), its TLB
//! maintenance is the CPU's (`tlbi vae1is`, static and per CPU regime) and is not
//! reported, its live updates refuse to split blocks instead of doing break-before-make
//! with an external invalidation, and it never says which IOVAs changed. It is used in the
//! tests as an independent builder to check our walker.

mod attrs;
mod descriptor;
mod invalidate;

use core::ops::Deref;

use hal::dma::{DMA_PAGE, DmaDirection, DmaMemory, DmaRegion};
use hal::{HalError, Iova, PageSize, PhysAddr};

pub use attrs::{Attributes, MairIndex, Permissions, STANDARD_MAIR, Shareability};
pub use invalidate::{Invalidations, MAX_INVALIDATION_RUNS, TlbInvalidation, TlbMaintenance};

use crate::walk::{self, Leaf, WalkConfig, WalkFault};
use crate::{Result, SmmuError};
use descriptor::Entry;

/// Input address size of the tables (T0SZ = 16).
pub const INPUT_BITS: u8 = 48;

/// Most table-memory chunks one table may allocate.
pub const MAX_CHUNKS: usize = 32;

const ENTRIES: u64 = 512;
const TABLE_BYTES: usize = DMA_PAGE;
const BLOCK: u64 = 1 << 21;

/// How a [`PageTable`] gets its memory and what addresses it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageTableConfig {
    /// Output address size (32..=48): frames at or above `1 << output_bits` are refused,
    /// since the SMMU would raise an Address size fault for them (QEMU 7.2 reports 44 bits,
    /// `SMMU_IDR5_OAS` in its `hw/arm/smmuv3-internal.h`; the ZynqMP MMU-500 48).
    pub output_bits: u8,
    /// Table pages per chunk of DMA memory (1..=64). Tables are carved from chunks so the
    /// table can find a table's CPU mapping from its physical address.
    pub chunk_pages: usize,
    /// Most chunks (1..=[`MAX_CHUNKS`]); `chunk_pages * max_chunks` bounds the table count.
    pub max_chunks: usize,
}

impl Default for PageTableConfig {
    fn default() -> Self {
        Self {
            output_bits: 48,
            chunk_pages: 16,
            max_chunks: MAX_CHUNKS,
        }
    }
}

struct Chunk {
    region: DmaRegion,
    /// Bit n set: table page n of the chunk is in use.
    used: u64,
}

/// One context's stage-1 translation tables in DMA memory.
///
/// `M` is how the table holds its allocator: `&HostDma`, `Arc<HostDma>`, `&'static
/// PoolDma<N>`, ...
///
/// Dropping the table frees its memory: detach it from the SMMU (and invalidate its ASID)
/// first.
pub struct PageTable<M: Deref<Target: DmaMemory>> {
    dma: M,
    config: PageTableConfig,
    chunks: [Option<Chunk>; MAX_CHUNKS],
    /// Bit n set: chunk n was written since the last publish.
    dirty: u64,
    tables: usize,
    root: PhysAddr,
}

impl<M: Deref<Target: DmaMemory>> core::fmt::Debug for PageTable<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PageTable")
            .field("root", &self.root)
            .field("tables", &self.tables)
            .finish()
    }
}

/// Where a lookup down to level 2 ended.
enum Level2 {
    /// The level-2 table covering the address.
    Table(PhysAddr),
    /// Nothing is mapped up to (not including) this IOVA.
    Missing { next: u64 },
}

/// What [`PageTable::unmap`] or [`PageTable::protect`] does to each leaf in its range.
#[derive(Clone, Copy)]
enum Change {
    Unmap,
    Protect(Permissions),
}

impl Change {
    /// The new value of leaf descriptor `leaf` (0 = invalid).
    fn apply(&self, leaf: u64) -> u64 {
        match self {
            Change::Unmap => 0,
            Change::Protect(p) => descriptor::with_permissions(leaf, p),
        }
    }
}

fn index(iova: u64, level: u8) -> u64 {
    (iova >> (12 + 9 * u32::from(3 - level))) & (ENTRIES - 1)
}

impl<M: Deref<Target: DmaMemory>> PageTable<M> {
    /// An empty table (a zeroed level-0 table) with memory from `dma`.
    pub fn new(dma: M, config: PageTableConfig) -> Result<Self> {
        if !(32..=48).contains(&config.output_bits) {
            return Err(SmmuError::InvalidConfig {
                what: "output_bits must be 32..=48",
            });
        }
        if !(1..=64).contains(&config.chunk_pages) {
            return Err(SmmuError::InvalidConfig {
                what: "chunk_pages must be 1..=64",
            });
        }
        if !(1..=MAX_CHUNKS).contains(&config.max_chunks) {
            return Err(SmmuError::InvalidConfig {
                what: "max_chunks must be 1..=MAX_CHUNKS",
            });
        }
        let mut table = Self {
            dma,
            config,
            chunks: [const { None }; MAX_CHUNKS],
            dirty: 0,
            tables: 0,
            root: PhysAddr::ZERO,
        };
        table.root = table.alloc_table()?;
        table.publish();
        Ok(table)
    }

    /// Physical address of the level-0 table: `CD.TTB0` (SMMUv3) or `TTBR0` (SMMUv2).
    pub fn root(&self) -> PhysAddr {
        self.root
    }

    /// The walk configuration the SMMU must use for this table.
    pub fn walk_config(&self) -> WalkConfig {
        WalkConfig::new(INPUT_BITS, self.config.output_bits).unwrap_or(WalkConfig::SMMU_48)
    }

    /// Number of table pages in use (the root included).
    pub fn tables_in_use(&self) -> usize {
        self.tables
    }

    /// The leaf translating `iova`, read back from table memory with the walker, or `None`
    /// if `iova` is not mapped.
    pub fn translate(&self, iova: Iova) -> Result<Option<Leaf>> {
        let config = self.walk_config();
        match walk::walk(self.root, iova, &config, |pa| self.read_phys(pa)) {
            Ok(leaf) => Ok(Some(leaf)),
            Err(WalkFault::Translation { .. }) => Ok(None),
            Err(WalkFault::External { descriptor, .. }) => Err(SmmuError::CorruptTable {
                at: descriptor,
                descriptor: 0,
            }),
            Err(_) => Err(SmmuError::CorruptTable {
                at: self.root,
                descriptor: iova.as_u64(),
            }),
        }
    }

    /// Maps one page (`size` = 4 KiB) or block (2 MiB) at `iova` to `frame`.
    ///
    /// Fails with [`SmmuError::AlreadyMapped`] if any part is mapped: a live mapping is never
    /// replaced (unmap first). A 2 MiB block over a level-3 table whose entries are all
    /// invalid replaces the table with break-before-make, calling `tlb` once.
    ///
    /// Returns the invalidations still needed: always empty for a map, since it only fills
    /// invalid entries. The return type is shared with the other operations so callers can
    /// treat them alike.
    pub fn map(
        &mut self,
        iova: Iova,
        frame: PhysAddr,
        size: PageSize,
        attrs: &Attributes,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<Invalidations> {
        if size == PageSize::Size1G {
            return Err(SmmuError::UnsupportedPageSize {
                bytes: size.bytes(),
            });
        }
        check_aligned(iova.as_u64(), size)?;
        check_aligned(frame.as_u64(), size)?;
        check_input_range(iova, size.bytes())?;
        if frame
            .as_u64()
            .checked_add(size.bytes())
            .is_none_or(|end| end > 1 << self.config.output_bits)
        {
            return Err(SmmuError::OutputAddressOutOfRange {
                phys: frame,
                bits: self.config.output_bits,
            });
        }
        let va = iova.as_u64();
        let l2 = self.level2_table(va, true)?;
        let Level2::Table(l2) = l2 else {
            // `create` never reports a missing table.
            return Err(SmmuError::CorruptTable {
                at: self.root,
                descriptor: 0,
            });
        };
        let i2 = index(va, 2);
        let e2 = self.read_entry(l2, i2)?;
        let result = match (size, descriptor::classify(e2, 2)) {
            (PageSize::Size2M, Entry::Invalid) => {
                self.write_entry(l2, i2, descriptor::leaf(frame, attrs, 2))
            }
            (PageSize::Size2M, Entry::Table(l3)) => {
                self.replace_empty_table_by_block(l2, i2, l3, va, frame, attrs, tlb)
            }
            (_, Entry::Leaf(_)) => Err(SmmuError::AlreadyMapped { iova }),
            (PageSize::Size4K, Entry::Invalid) => {
                let l3 = self.alloc_table()?;
                self.write_entry(l3, index(va, 3), descriptor::leaf(frame, attrs, 3))?;
                self.link(l2, i2, l3)
            }
            (PageSize::Size4K, Entry::Table(l3)) => {
                let i3 = index(va, 3);
                match descriptor::classify(self.read_entry(l3, i3)?, 3) {
                    Entry::Invalid => self.write_entry(l3, i3, descriptor::leaf(frame, attrs, 3)),
                    Entry::Leaf(_) => Err(SmmuError::AlreadyMapped { iova }),
                    _ => Err(self.corrupt(l3, i3)),
                }
            }
            _ => Err(self.corrupt(l2, i2)),
        };
        self.publish();
        result.map(|()| Invalidations::new())
    }

    /// Unmaps every page and block in `[iova, iova + len)` (4 KiB aligned); unmapped parts are
    /// skipped. Blocks partly inside the range are split with break-before-make (`tlb` is
    /// called for each split).
    ///
    /// Returns the leaf invalidations for the entries that were valid and are now invalid.
    pub fn unmap(
        &mut self,
        iova: Iova,
        len: u64,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<Invalidations> {
        self.change_range(iova, len, Change::Unmap, tlb)
    }

    /// Sets the permissions (AP, XN, AF) of every mapped page and block in `[iova, iova +
    /// len)` (4 KiB aligned); unmapped parts are skipped, entries that already have these
    /// permissions are left alone. Permission changes need no break-before-make, but a block
    /// partly inside the range is split with it (`tlb` is called for each split).
    ///
    /// Returns the leaf invalidations for the entries whose permissions changed.
    pub fn protect(
        &mut self,
        iova: Iova,
        len: u64,
        permissions: Permissions,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<Invalidations> {
        self.change_range(iova, len, Change::Protect(permissions), tlb)
    }

    fn change_range(
        &mut self,
        iova: Iova,
        len: u64,
        change: Change,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<Invalidations> {
        check_aligned(iova.as_u64(), PageSize::Size4K)?;
        check_aligned(len, PageSize::Size4K)?;
        if len == 0 {
            return Ok(Invalidations::new());
        }
        check_input_range(iova, len)?;
        let start = iova.as_u64();
        let end = start + len;

        // Allocate the (at most two) tables for splits before changing anything, so running
        // out of memory leaves the tables untouched.
        let mut spare: [Option<PhysAddr>; 2] = [None, None];
        let first_chunk = start & !(BLOCK - 1);
        let last_chunk = (end - 1) & !(BLOCK - 1);
        let mut needed = usize::from(self.needs_split(first_chunk, start, end, change)?);
        if last_chunk != first_chunk {
            needed += usize::from(self.needs_split(last_chunk, start, end, change)?);
        }
        for slot in spare.iter_mut().take(needed) {
            match self.alloc_table() {
                Ok(t) => *slot = Some(t),
                Err(e) => {
                    for t in spare.iter_mut().filter_map(Option::take) {
                        self.free_table(t);
                    }
                    return Err(e);
                }
            }
        }

        let mut pending = Invalidations::new();
        let result = self.change_chunks(start, end, change, &mut spare, &mut pending, tlb);
        for t in spare.iter_mut().filter_map(Option::take) {
            self.free_table(t);
        }
        self.publish();
        result.map(|()| pending)
    }

    fn change_chunks(
        &mut self,
        start: u64,
        end: u64,
        change: Change,
        spare: &mut [Option<PhysAddr>; 2],
        pending: &mut Invalidations,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<()> {
        let mut chunk = start & !(BLOCK - 1);
        while chunk < end {
            let next_chunk = chunk + BLOCK;
            let l2 = match self.level2_table(chunk, false)? {
                Level2::Table(t) => t,
                Level2::Missing { next } => {
                    chunk = next;
                    continue;
                }
            };
            let sub_start = start.max(chunk);
            let sub_end = end.min(next_chunk);
            let i2 = index(chunk, 2);
            match descriptor::classify(self.read_entry(l2, i2)?, 2) {
                Entry::Invalid => {}
                Entry::Leaf(block) => {
                    let new_block = change.apply(block);
                    if new_block == block {
                        // Protect with the permissions the block already has.
                    } else if sub_start == chunk && sub_end == next_chunk {
                        self.write_entry(l2, i2, new_block)?;
                        pending.push(block_invalidation(chunk, true));
                    } else {
                        let table = spare.iter_mut().find_map(Option::take).ok_or(
                            // The pre-pass counted every split; running short means the
                            // tables changed under us.
                            SmmuError::CorruptTable {
                                at: l2,
                                descriptor: block,
                            },
                        )?;
                        self.split_block(
                            l2, i2, block, table, chunk, sub_start, sub_end, change, pending, tlb,
                        )?;
                    }
                }
                Entry::Table(l3) => {
                    let mut page = sub_start;
                    while page < sub_end {
                        let i3 = index(page, 3);
                        match descriptor::classify(self.read_entry(l3, i3)?, 3) {
                            Entry::Invalid => {}
                            Entry::Leaf(old) => {
                                let new = change.apply(old);
                                if new != old {
                                    self.write_entry(l3, i3, new)?;
                                    pending.push(TlbInvalidation {
                                        start: Iova::new(page),
                                        count: 1,
                                        granule: PageSize::Size4K,
                                        leaf_only: true,
                                    });
                                }
                            }
                            _ => return Err(self.corrupt(l3, i3)),
                        }
                        page += PageSize::Size4K.bytes();
                    }
                }
                Entry::Reserved => return Err(self.corrupt(l2, i2)),
            }
            chunk = next_chunk;
        }
        Ok(())
    }

    /// Whether applying `change` to `[start, end)` splits the block at `chunk`.
    fn needs_split(&self, chunk: u64, start: u64, end: u64, change: Change) -> Result<bool> {
        let covers_chunk = start <= chunk && end >= chunk + BLOCK;
        if covers_chunk {
            return Ok(false);
        }
        let Level2::Table(l2) = self.lookup_level2(chunk)? else {
            return Ok(false);
        };
        Ok(
            match descriptor::classify(self.read_entry(l2, index(chunk, 2))?, 2) {
                Entry::Leaf(block) => change.apply(block) != block,
                _ => false,
            },
        )
    }

    /// Splits the live block `block` at `l2[i2]` (covering `chunk`) into the spare table
    /// `table`, applying `change` to `[sub_start, sub_end)`: the sequence in the module docs.
    #[allow(clippy::too_many_arguments)]
    fn split_block(
        &mut self,
        l2: PhysAddr,
        i2: u64,
        block: u64,
        table: PhysAddr,
        chunk: u64,
        sub_start: u64,
        sub_end: u64,
        change: Change,
        pending: &mut Invalidations,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<()> {
        // 1. Final contents of the new table.
        for i in 0..ENTRIES {
            let page = chunk + (i << 12);
            let old = descriptor::page_of_block(block, i);
            let new = if (sub_start..sub_end).contains(&page) {
                change.apply(old)
            } else {
                old
            };
            self.write_entry(table, i, new)?;
        }
        // 2. Break, made visible together with the new table's contents.
        self.write_entry(l2, i2, 0)?;
        self.publish();
        // 3. Invalidate the block (and whatever is pending) and wait for completion.
        pending.push(block_invalidation(chunk, true));
        if let Err(e) = tlb.invalidate_now(pending) {
            // `E` stays invalid (translations fault, which is safe); `T` was never reachable.
            self.free_table(table);
            return Err(e);
        }
        pending.clear();
        // 4. Make.
        self.write_entry(l2, i2, descriptor::table(table))?;
        self.publish();
        Ok(())
    }

    /// Replaces the table `l3` at `l2[i2]` by a block, if every entry of `l3` is invalid.
    #[allow(clippy::too_many_arguments)]
    fn replace_empty_table_by_block(
        &mut self,
        l2: PhysAddr,
        i2: u64,
        l3: PhysAddr,
        chunk: u64,
        frame: PhysAddr,
        attrs: &Attributes,
        tlb: &mut impl TlbMaintenance,
    ) -> Result<()> {
        for i in 0..ENTRIES {
            match descriptor::classify(self.read_entry(l3, i)?, 3) {
                Entry::Invalid => {}
                Entry::Leaf(_) => {
                    return Err(SmmuError::AlreadyMapped {
                        iova: Iova::new(chunk + (i << 12)),
                    });
                }
                _ => return Err(self.corrupt(l3, i)),
            }
        }
        self.write_entry(l2, i2, 0)?;
        self.publish();
        // On failure the old table is leaked on purpose: a walk cache may still point at it.
        tlb.invalidate_now(&Invalidations::single(block_invalidation(chunk, false)))?;
        self.write_entry(l2, i2, descriptor::leaf(frame, attrs, 2))?;
        self.publish();
        // The walk caches no longer reference the table (step 3 completed), so it can go.
        self.free_table(l3);
        Ok(())
    }

    /// Finds the level-2 table for `iova` without creating anything.
    fn lookup_level2(&self, iova: u64) -> Result<Level2> {
        let mut table = self.root;
        for level in 0..2u8 {
            let i = index(iova, level);
            match descriptor::classify(self.read_entry(table, i)?, level) {
                Entry::Table(next) => table = next,
                Entry::Invalid => {
                    // An entry at `level` covers 4 KiB << 9 * (3 - level).
                    let span = 1u64 << (12 + 9 * u32::from(3 - level));
                    return Ok(Level2::Missing {
                        next: (iova & !(span - 1)).saturating_add(span),
                    });
                }
                _ => return Err(self.corrupt(table, i)),
            }
        }
        Ok(Level2::Table(table))
    }

    /// Finds the level-2 table for `iova`, creating levels 1 and 2 if `create`.
    fn level2_table(&mut self, iova: u64, create: bool) -> Result<Level2> {
        if !create {
            return self.lookup_level2(iova);
        }
        let mut table = self.root;
        for level in 0..2u8 {
            let i = index(iova, level);
            match descriptor::classify(self.read_entry(table, i)?, level) {
                Entry::Table(next) => table = next,
                Entry::Invalid => {
                    let next = self.alloc_table()?;
                    self.link(table, i, next)?;
                    table = next;
                }
                _ => return Err(self.corrupt(table, i)),
            }
        }
        Ok(Level2::Table(table))
    }

    /// Makes the filled table `child` reachable from `parent[i]` (which is invalid): publish
    /// its contents first so no walker can follow the link into stale memory.
    fn link(&mut self, parent: PhysAddr, i: u64, child: PhysAddr) -> Result<()> {
        self.publish();
        self.write_entry(parent, i, descriptor::table(child))
    }

    fn corrupt(&self, table: PhysAddr, i: u64) -> SmmuError {
        let at = PhysAddr::new(table.as_u64() + i * 8);
        SmmuError::CorruptTable {
            at,
            descriptor: self.read_entry(table, i).unwrap_or(0),
        }
    }

    /// The chunk holding table `table` and the table's offset in it.
    fn locate(&self, table: PhysAddr) -> Option<(usize, &DmaRegion, usize)> {
        self.chunks.iter().enumerate().find_map(|(n, c)| {
            let region = &c.as_ref()?.region;
            let off = table.offset_from(region.bus_addr()).ok()?;
            let off = usize::try_from(off).ok()?;
            (off < region.len() && off.is_multiple_of(TABLE_BYTES)).then_some((n, region, off))
        })
    }

    fn read_entry(&self, table: PhysAddr, i: u64) -> Result<u64> {
        let (_, region, off) = self.locate(table).ok_or(SmmuError::CorruptTable {
            at: table,
            descriptor: 0,
        })?;
        Ok(region.read_u64(off + (i as usize % ENTRIES as usize) * 8)?)
    }

    fn write_entry(&mut self, table: PhysAddr, i: u64, value: u64) -> Result<()> {
        let (n, region, off) = self.locate(table).ok_or(SmmuError::CorruptTable {
            at: table,
            descriptor: value,
        })?;
        region.write_u64(off + (i as usize % ENTRIES as usize) * 8, value)?;
        self.dirty |= 1 << n;
        Ok(())
    }

    /// Reads a descriptor by physical address (for the walker).
    fn read_phys(&self, pa: PhysAddr) -> Result<u64> {
        let table = PhysAddr::new(pa.as_u64() & !(TABLE_BYTES as u64 - 1));
        let (_, region, off) = self.locate(table).ok_or(SmmuError::CorruptTable {
            at: pa,
            descriptor: 0,
        })?;
        Ok(region.read_u64(off + pa.page_offset(PageSize::Size4K) as usize)?)
    }

    /// Makes every table write since the last call visible to the SMMU's walker.
    fn publish(&mut self) {
        for (n, chunk) in self.chunks.iter().enumerate() {
            if self.dirty & (1 << n) != 0
                && let Some(c) = chunk
            {
                self.dma.sync_for_device(&c.region);
            }
        }
        self.dirty = 0;
    }

    /// A zeroed, unreachable table page.
    fn alloc_table(&mut self) -> Result<PhysAddr> {
        let pages = self.config.chunk_pages;
        let full = if pages == 64 {
            u64::MAX
        } else {
            (1u64 << pages) - 1
        };
        let free_slot = self.chunks.iter().enumerate().find_map(|(n, c)| {
            c.as_ref()
                .filter(|c| c.used != full)
                .map(|c| (n, c.used.trailing_ones()))
        });
        let (n, page) = match free_slot {
            Some(slot) => slot,
            None => {
                let n = self
                    .chunks
                    .iter()
                    .take(self.config.max_chunks)
                    .position(Option::is_none)
                    .ok_or(SmmuError::TableMemoryExhausted {
                        tables: self.tables,
                    })?;
                let region = self.dma.allocate(pages, DmaDirection::ToDevice)?;
                let fits = region
                    .bus_addr()
                    .as_u64()
                    .checked_add(region.len() as u64)
                    .is_some_and(|end| end <= 1 << self.config.output_bits);
                if !fits {
                    let bus = region.bus_addr();
                    self.dma.free(region).map_err(HalError::from)?;
                    return Err(SmmuError::OutputAddressOutOfRange {
                        phys: bus,
                        bits: self.config.output_bits,
                    });
                }
                if let Some(slot) = self.chunks.get_mut(n) {
                    *slot = Some(Chunk { region, used: 0 });
                }
                (n, 0)
            }
        };
        let chunk = self.chunks.get_mut(n).and_then(Option::as_mut).ok_or(
            SmmuError::TableMemoryExhausted {
                tables: self.tables,
            },
        )?;
        chunk.used |= 1 << page;
        let off = page as usize * TABLE_BYTES;
        // Reused pages hold an old table: zero them (fresh chunks come zeroed, the stores are
        // cheap either way).
        for i in 0..ENTRIES as usize {
            chunk.region.write_u64(off + i * 8, 0)?;
        }
        let pa = PhysAddr::new(chunk.region.bus_addr().as_u64() + off as u64);
        self.dirty |= 1 << n;
        self.tables += 1;
        Ok(pa)
    }

    /// Returns a table page (which nothing references any more) to its chunk.
    fn free_table(&mut self, table: PhysAddr) {
        if let Some((n, _, off)) = self.locate(table)
            && let Some(Some(chunk)) = self.chunks.get_mut(n)
        {
            let bit = 1u64 << (off / TABLE_BYTES);
            if chunk.used & bit != 0 {
                chunk.used &= !bit;
                self.tables -= 1;
            }
        }
    }
}

impl<M: Deref<Target: DmaMemory>> Drop for PageTable<M> {
    fn drop(&mut self) {
        for chunk in self.chunks.iter_mut().filter_map(Option::take) {
            // Nothing to do about a failure here; the allocator keeps its own books.
            let _ = self.dma.free(chunk.region);
        }
    }
}

fn block_invalidation(chunk: u64, leaf_only: bool) -> TlbInvalidation {
    TlbInvalidation {
        start: Iova::new(chunk),
        count: 1,
        granule: PageSize::Size2M,
        leaf_only,
    }
}

fn check_aligned(value: u64, size: PageSize) -> Result<()> {
    if value & (size.bytes() - 1) == 0 {
        Ok(())
    } else {
        Err(SmmuError::Misaligned {
            value,
            align: size.bytes(),
        })
    }
}

fn check_input_range(iova: Iova, len: u64) -> Result<()> {
    match iova.as_u64().checked_add(len) {
        Some(end) if end <= 1 << INPUT_BITS => Ok(()),
        _ => Err(SmmuError::IovaOutOfRange {
            iova,
            len,
            bits: INPUT_BITS,
        }),
    }
}

#[cfg(test)]
mod tests;
