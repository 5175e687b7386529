//! A VMSAv8-64 stage-1 table walker (4 KiB granule) over "read a u64 at this physical
//! address": what an SMMU's table walk unit does for a context descriptor (SMMUv3) or a context
//! bank (SMMUv2) with `TG0` = 4 KiB.
//!
//! It shares no code with the table builder ([`crate::pagetable`]): it decodes descriptors
//! through a `bitfield` view of its own, so a builder bug shows up as a walker disagreement
//! in the property tests. The
//! simulator's MMU-500 model reuses it for its walks, so it reports faults the way the
//! architecture does:
//!
//! - [`walk`] finds the leaf or fails with a Translation fault (invalid descriptor, reserved
//!   encoding, input address outside the configured size), an Address size fault (a table or
//!   output address beyond the output size) or an External abort (the read failed). Levels
//!   are the level of the descriptor that faulted (Arm ARM DDI0487 D8.3, "Translation table
//!   descriptor formats").
//! - [`check_access`] applies the access flag and the permissions of the leaf and of the
//!   tables above it (APTable, UXNTable, PXNTable). The access flag is checked first, as the
//!   Arm ARM pseudocode does (the walk raises the Access flag fault, `CheckPermission` runs
//!   after it).
//!
//! Not modelled: 52-bit addresses, the Contiguous hint, hardware AF/dirty updates, PAN, WXN,
//! and stage 2.

use bitfield::bitfield;
use hal::{Iova, PageSize, PhysAddr};

use crate::fault::FaultKind;
use crate::pagetable::{Attributes, MairIndex, Permissions, Shareability};
use crate::{Result, SmmuError};

const ENTRIES_SHIFT: u32 = 9;

bitfield! {
    /// A stage-1 VMSAv8-64 descriptor as the walker reads it, 4 KiB granule, 48-bit
    /// addresses (Arm DDI0487 D8.3, "Translation table descriptor formats"). Declared apart
    /// from the builder's view on purpose, so the two check each other.
    #[derive(Clone, Copy)]
    struct Descriptor(u64);
    u64;
    /// Valid, bit 0 (DDI0487 D8.3).
    valid, _: 0;
    /// Bit 1 (DDI0487 D8.3): a table (levels 0-2) or page (level 3); 0 is a block.
    table_or_page, _: 1;
    /// AttrIndx, bits \[4:2\] of a block or page (DDI0487 D8.3).
    u8, attr_index, _: 4, 2;
    /// AP\[1\], bit 6 of a block or page (DDI0487 D8.3): unprivileged access.
    ap1, _: 6;
    /// AP\[2\], bit 7 of a block or page (DDI0487 D8.3): read-only.
    ap2, _: 7;
    /// SH, bits \[9:8\] of a block or page (DDI0487 D8.3).
    u8, sh, _: 9, 8;
    /// AF, bit 10 of a block or page (DDI0487 D8.3).
    af, _: 10;
    /// nG, bit 11 of a block or page (DDI0487 D8.3).
    ng, _: 11;
    /// Bits \[47:12\] (DDI0487 D8.3): the output address or the next-level table.
    address, _: 47, 12;
    /// PXN, bit 53 of a block or page (DDI0487 D8.3).
    pxn, _: 53;
    /// UXN, bit 54 of a block or page (DDI0487 D8.3).
    uxn, _: 54;
    /// PXNTable, bit 59 of a table descriptor (DDI0487 D8.3).
    pxn_table, _: 59;
    /// UXNTable, bit 60 of a table descriptor (DDI0487 D8.3).
    uxn_table, _: 60;
    /// APTable\[0\], bit 61 of a table descriptor (DDI0487 D8.3): no unprivileged access
    /// below.
    ap_table0, _: 61;
    /// APTable\[1\], bit 62 of a table descriptor (DDI0487 D8.3): no writes below.
    ap_table1, _: 62;
}

impl Descriptor {
    /// The address in bits \[47:12\], in place.
    fn address_bits(&self) -> u64 {
        self.address() << 12
    }
}

/// The input and output address sizes of a walk (`T0SZ` and `IPS`/`PASIZE` of the context).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WalkConfig {
    input_bits: u8,
    output_bits: u8,
}

impl WalkConfig {
    /// 48-bit IOVAs and 48-bit output addresses: `T0SZ` = 16, four levels (0-3).
    pub const SMMU_48: WalkConfig = WalkConfig {
        input_bits: 48,
        output_bits: 48,
    };

    /// A configuration with `input_bits` (25..=48, i.e. `T0SZ` 16..=39, the range QEMU and the
    /// Arm ARM accept for a 4 KiB granule without TTST) and `output_bits` (32..=48).
    pub const fn new(input_bits: u8, output_bits: u8) -> Result<WalkConfig> {
        if input_bits < 25 || input_bits > 48 {
            return Err(SmmuError::InvalidConfig {
                what: "walk input size must be 25..=48 bits",
            });
        }
        if output_bits < 32 || output_bits > 48 {
            return Err(SmmuError::InvalidConfig {
                what: "walk output size must be 32..=48 bits",
            });
        }
        Ok(WalkConfig {
            input_bits,
            output_bits,
        })
    }

    /// From a context's `T0SZ` field.
    pub const fn from_t0sz(t0sz: u8, output_bits: u8) -> Result<WalkConfig> {
        if t0sz > 64 {
            return Err(SmmuError::InvalidConfig {
                what: "T0SZ must be 16..=39",
            });
        }
        Self::new(64 - t0sz, output_bits)
    }

    /// Input address size in bits.
    pub const fn input_bits(&self) -> u8 {
        self.input_bits
    }

    /// Output address size in bits.
    pub const fn output_bits(&self) -> u8 {
        self.output_bits
    }

    /// The level the walk starts at: each level resolves 9 bits above the 12-bit page offset.
    pub const fn start_level(&self) -> u8 {
        let levels = (self.input_bits - 12).div_ceil(9);
        4 - levels
    }

    const fn fits_output(&self, addr: u64) -> bool {
        addr >> self.output_bits == 0
    }
}

/// Restrictions inherited from the table descriptors on the way down (hierarchical
/// attributes; each is sticky once set at any level).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TableRestrictions {
    /// APTable\[1\] (bit 62): no writes below.
    pub no_write: bool,
    /// APTable\[0\] (bit 61): no unprivileged access below.
    pub no_unprivileged: bool,
    /// UXNTable (bit 60).
    pub unprivileged_execute_never: bool,
    /// PXNTable (bit 59).
    pub privileged_execute_never: bool,
}

impl TableRestrictions {
    fn add(&mut self, table_descriptor: u64) {
        let d = Descriptor(table_descriptor);
        self.no_write |= d.ap_table1();
        self.no_unprivileged |= d.ap_table0();
        self.unprivileged_execute_never |= d.uxn_table();
        self.privileged_execute_never |= d.pxn_table();
    }
}

/// The leaf a walk ended at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Leaf {
    /// Level of the leaf: 3 for a page, 2 for a 2 MiB block, 1 for a 1 GiB block.
    pub level: u8,
    /// The raw descriptor.
    pub descriptor: u64,
    /// The first IOVA the leaf translates.
    pub base: Iova,
    /// The output address of `base`.
    pub output: PhysAddr,
    /// Size of the leaf.
    pub size: PageSize,
    /// Restrictions from the table descriptors above.
    pub restrictions: TableRestrictions,
}

impl Leaf {
    /// The physical address `iova` translates to (`iova` must lie in the leaf; otherwise the
    /// leaf's offset arithmetic wraps within the leaf).
    pub fn phys(&self, iova: Iova) -> PhysAddr {
        PhysAddr::new(self.output.as_u64() | iova.page_offset(self.size))
    }

    fn fields(&self) -> Descriptor {
        Descriptor(self.descriptor)
    }

    /// AP\[2\] clear.
    pub fn writable(&self) -> bool {
        !self.fields().ap2()
    }

    /// AP\[1\] set.
    pub fn unprivileged(&self) -> bool {
        self.fields().ap1()
    }

    /// AF set.
    pub fn accessed(&self) -> bool {
        self.fields().af()
    }

    /// UXN.
    pub fn unprivileged_execute_never(&self) -> bool {
        self.fields().uxn()
    }

    /// PXN.
    pub fn privileged_execute_never(&self) -> bool {
        self.fields().pxn()
    }

    /// The MAIR index (AttrIndx).
    pub fn mair_index(&self) -> MairIndex {
        // Three bits: always 0..=7.
        MairIndex::new(self.fields().attr_index()).unwrap_or(MairIndex::NORMAL_NON_CACHEABLE)
    }

    /// SH, or `None` for the reserved encoding 0b01.
    pub fn shareability(&self) -> Option<Shareability> {
        match self.fields().sh() {
            0b00 => Some(Shareability::NonShareable),
            0b10 => Some(Shareability::OuterShareable),
            0b11 => Some(Shareability::InnerShareable),
            _ => None,
        }
    }

    /// nG.
    pub fn not_global(&self) -> bool {
        self.fields().ng()
    }

    /// The leaf's attributes, or `None` if SH holds the reserved value. `execute_never` is
    /// reported only when both UXN and PXN are set (how the builder writes it).
    pub fn attributes(&self) -> Option<Attributes> {
        Some(Attributes {
            mair_index: self.mair_index(),
            shareability: self.shareability()?,
            not_global: self.not_global(),
            permissions: Permissions {
                writable: self.writable(),
                unprivileged: self.unprivileged(),
                execute_never: self.unprivileged_execute_never() && self.privileged_execute_never(),
                accessed: self.accessed(),
            },
        })
    }
}

/// Why a walk or an access check failed, with the level of the descriptor involved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WalkFault {
    /// Invalid descriptor, reserved encoding, or input address out of range.
    Translation {
        /// Level of the faulting lookup.
        level: u8,
    },
    /// A table or output address beyond the output address size.
    AddressSize {
        /// Level of the descriptor holding the address.
        level: u8,
    },
    /// The leaf has AF = 0 and access-flag faults are enabled.
    AccessFlag {
        /// Level of the leaf.
        level: u8,
    },
    /// The access is not permitted by the leaf or the tables above it.
    Permission {
        /// Level of the leaf.
        level: u8,
    },
    /// Reading a descriptor failed (a bus error on the walk).
    External {
        /// Level of the descriptor being read.
        level: u8,
        /// Its physical address.
        descriptor: PhysAddr,
    },
}

impl WalkFault {
    /// The level reported with the fault.
    pub fn level(&self) -> u8 {
        match *self {
            WalkFault::Translation { level }
            | WalkFault::AddressSize { level }
            | WalkFault::AccessFlag { level }
            | WalkFault::Permission { level }
            | WalkFault::External { level, .. } => level,
        }
    }

    /// The fault kind an SMMU reports for it.
    pub fn kind(&self) -> FaultKind {
        match self {
            WalkFault::Translation { .. } => FaultKind::Translation,
            WalkFault::AddressSize { .. } => FaultKind::AddressSize,
            WalkFault::AccessFlag { .. } => FaultKind::AccessFlag,
            WalkFault::Permission { .. } => FaultKind::Permission,
            WalkFault::External { .. } => FaultKind::External,
        }
    }
}

/// Walks the tables rooted at `root` (`TTBR0` / `CD.TTB0`) for `iova`, reading descriptors
/// with `read` (little-endian u64 at a physical address; any error counts as an external
/// abort).
pub fn walk<E>(
    root: PhysAddr,
    iova: Iova,
    config: &WalkConfig,
    mut read: impl FnMut(PhysAddr) -> core::result::Result<u64, E>,
) -> core::result::Result<Leaf, WalkFault> {
    let start = config.start_level();
    if iova.as_u64() >> config.input_bits != 0 {
        return Err(WalkFault::Translation { level: start });
    }
    // The root is aligned as a table descriptor's address is: bits [47:12].
    let root_addr = Descriptor(root.as_u64()).address_bits();
    if !config.fits_output(root.as_u64()) {
        return Err(WalkFault::AddressSize { level: start });
    }
    let mut table = root_addr;
    let mut restrictions = TableRestrictions::default();
    for level in start..=3 {
        let shift = 12 + ENTRIES_SHIFT * u32::from(3 - level);
        let index = (iova.as_u64() >> shift) & ((1 << ENTRIES_SHIFT) - 1);
        let at = PhysAddr::new(table + index * 8);
        let raw = read(at).map_err(|_| WalkFault::External {
            level,
            descriptor: at,
        })?;
        let descriptor = Descriptor(raw);
        if !descriptor.valid() {
            return Err(WalkFault::Translation { level });
        }
        let table_or_page = descriptor.table_or_page();
        if level < 3 && table_or_page {
            let next = descriptor.address_bits();
            if !config.fits_output(next) {
                return Err(WalkFault::AddressSize { level });
            }
            restrictions.add(raw);
            table = next;
            continue;
        }
        let size = match (level, table_or_page) {
            (3, true) => PageSize::Size4K,
            (2, false) => PageSize::Size2M,
            (1, false) => PageSize::Size1G,
            // Level-3 0b01 is reserved; level-0 blocks need 52-bit descriptors (DS = 1).
            _ => return Err(WalkFault::Translation { level }),
        };
        let output = descriptor.address_bits() & !(size.bytes() - 1);
        if !config.fits_output(output) {
            return Err(WalkFault::AddressSize { level });
        }
        return Ok(Leaf {
            level,
            descriptor: raw,
            base: iova.align_down(size),
            output: PhysAddr::new(output),
            size,
            restrictions,
        });
    }
    // The loop always returns at level 3.
    Err(WalkFault::Translation { level: 3 })
}

/// What a transaction wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AccessRequest {
    /// A write (else a read).
    pub write: bool,
    /// Privileged, as the transaction's privilege attribute says (SMMUv3 event PnU,
    /// SMMUv2 FSYNR0.PNU).
    pub privileged: bool,
    /// An instruction fetch (InD).
    pub instruction: bool,
}

impl AccessRequest {
    /// A privileged data read.
    pub const READ: AccessRequest = AccessRequest {
        write: false,
        privileged: true,
        instruction: false,
    };
    /// A privileged data write.
    pub const WRITE: AccessRequest = AccessRequest {
        write: true,
        privileged: true,
        instruction: false,
    };
}

/// Checks `request` against `leaf`: the access flag (only if `access_flag_faults`, i.e. the
/// context does not disable them and the SMMU does not manage AF in hardware), then
/// write/unprivileged/execute permissions including the table restrictions.
pub fn check_access(
    leaf: &Leaf,
    request: &AccessRequest,
    access_flag_faults: bool,
) -> core::result::Result<(), WalkFault> {
    let level = leaf.level;
    if access_flag_faults && !leaf.accessed() {
        return Err(WalkFault::AccessFlag { level });
    }
    let r = &leaf.restrictions;
    let denied = (request.write && (!leaf.writable() || r.no_write))
        || (!request.privileged && (!leaf.unprivileged() || r.no_unprivileged))
        || (request.instruction
            && if request.privileged {
                leaf.privileged_execute_never() || r.privileged_execute_never
            } else {
                leaf.unprivileged_execute_never() || r.unprivileged_execute_never
            });
    if denied {
        Err(WalkFault::Permission { level })
    } else {
        Ok(())
    }
}

/// [`walk`] then [`check_access`]: the full stage-1 translation of one access.
pub fn translate<E>(
    root: PhysAddr,
    iova: Iova,
    request: &AccessRequest,
    access_flag_faults: bool,
    config: &WalkConfig,
    read: impl FnMut(PhysAddr) -> core::result::Result<u64, E>,
) -> core::result::Result<PhysAddr, WalkFault> {
    let leaf = walk(root, iova, config, read)?;
    check_access(&leaf, request, access_flag_faults)?;
    Ok(leaf.phys(iova))
}

#[cfg(test)]
mod tests {
    use hal::dma::HostDma;

    use super::*;

    const BASE: u64 = 0x4000_0000;
    const ROOT: u64 = BASE;
    const L1: u64 = BASE + 0x1000;
    const L2: u64 = BASE + 0x2000;
    const L3: u64 = BASE + 0x3000;
    const TABLE: u64 = 0b11;
    // Page: valid+page, AF, AP[1], SH inner, AttrIndx 1.
    const PAGE_BITS: u64 = 0b11 | 0x400 | 0x40 | 0x300 | 0x4;

    /// Hand-built tables for IOVA 0x0000_0080_4020_3000 = L0[1], L1[1], L2[2], L3[3].
    fn memory() -> HostDma {
        let dma = HostDma::new(PhysAddr::new(BASE), 8).unwrap();
        let w = |at: u64, v: u64| dma.write_phys_u64(PhysAddr::new(at), v).unwrap();
        w(ROOT + 8, L1 | TABLE);
        w(L1 + 8, L2 | TABLE);
        w(L2 + 2 * 8, L3 | TABLE);
        w(L3 + 3 * 8, 0x1_2345_6000 | PAGE_BITS);
        dma
    }

    const IOVA: u64 = (1 << 39) | (1 << 30) | (2 << 21) | (3 << 12);

    fn run(dma: &HostDma, iova: u64, config: &WalkConfig) -> core::result::Result<Leaf, WalkFault> {
        walk(PhysAddr::new(ROOT), Iova::new(iova), config, |pa| {
            dma.read_phys_u64(pa)
        })
    }

    fn set(dma: &HostDma, at: u64, v: u64) {
        dma.write_phys_u64(PhysAddr::new(at), v).unwrap();
    }

    #[test]
    fn walks_four_levels_to_a_page() {
        let dma = memory();
        let leaf = run(&dma, IOVA + 0xabc, &WalkConfig::SMMU_48).unwrap();
        assert_eq!(leaf.level, 3);
        assert_eq!(leaf.size, PageSize::Size4K);
        assert_eq!(leaf.base, Iova::new(IOVA));
        assert_eq!(
            leaf.phys(Iova::new(IOVA + 0xabc)),
            PhysAddr::new(0x1_2345_6abc)
        );
        assert_eq!(
            leaf.attributes(),
            Some(Attributes {
                mair_index: MairIndex::NORMAL_WRITE_BACK,
                shareability: Shareability::InnerShareable,
                not_global: false,
                permissions: Permissions {
                    writable: true,
                    unprivileged: true,
                    execute_never: false,
                    accessed: true,
                },
            })
        );
        // Neighbours are unmapped at the level where the walk stops.
        assert_eq!(
            run(&dma, IOVA + 0x1000, &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 3 })
        );
        assert_eq!(
            run(&dma, IOVA + (1 << 21), &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 2 })
        );
        assert_eq!(
            run(&dma, IOVA + (1 << 30), &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 1 })
        );
        assert_eq!(
            run(&dma, 0, &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 0 })
        );
        assert_eq!(
            run(&dma, 1 << 48, &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 0 })
        );
    }

    #[test]
    fn blocks_and_reserved_encodings() {
        let dma = memory();
        // A 2 MiB block at L2[5] and a 1 GiB block at L1[3].
        set(&dma, L2 + 5 * 8, 0x8_0020_0000 | 0x401);
        set(&dma, L1 + 3 * 8, 0x8_4000_0000 | 0x401);
        let b2 = (1 << 39) | (1 << 30) | (5 << 21);
        let leaf = run(&dma, b2 + 0x1_2345, &WalkConfig::SMMU_48).unwrap();
        assert_eq!((leaf.level, leaf.size), (2, PageSize::Size2M));
        assert_eq!(
            leaf.phys(Iova::new(b2 + 0x1_2345)),
            PhysAddr::new(0x8_0021_2345)
        );
        let b1 = (1 << 39) | (3 << 30);
        let leaf = run(&dma, b1 + 0x1234_5678, &WalkConfig::SMMU_48).unwrap();
        assert_eq!((leaf.level, leaf.size), (1, PageSize::Size1G));
        assert_eq!(
            leaf.phys(Iova::new(b1 + 0x1234_5678)),
            PhysAddr::new(0x8_5234_5678)
        );
        // Level 3 with bits[1:0] = 0b01 is reserved: a translation fault.
        set(&dma, L3 + 3 * 8, 0x1_2345_6000 | 0x401);
        assert_eq!(
            run(&dma, IOVA, &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 3 })
        );
        // So is a level-0 block with a 4 KiB granule and 48-bit descriptors.
        set(&dma, ROOT + 2 * 8, 0x401);
        assert_eq!(
            run(&dma, 2 << 39, &WalkConfig::SMMU_48),
            Err(WalkFault::Translation { level: 0 })
        );
        // SH = 0b01 is reserved: attributes cannot be decoded.
        set(&dma, L3 + 3 * 8, 0x1_2345_6000 | 0x503);
        assert_eq!(
            run(&dma, IOVA, &WalkConfig::SMMU_48).unwrap().attributes(),
            None
        );
    }

    #[test]
    fn address_size_and_external_faults() {
        let dma = memory();
        let oas40 = WalkConfig::new(48, 40).unwrap();
        set(&dma, L3 + 3 * 8, (1 << 40) | PAGE_BITS);
        assert_eq!(
            run(&dma, IOVA, &oas40),
            Err(WalkFault::AddressSize { level: 3 })
        );
        assert!(run(&dma, IOVA, &WalkConfig::SMMU_48).is_ok());
        set(&dma, L1 + 8, (1 << 41) | TABLE);
        assert_eq!(
            run(&dma, IOVA, &oas40),
            Err(WalkFault::AddressSize { level: 1 })
        );
        // A table outside memory: the read of the next level fails.
        assert_eq!(
            run(&dma, IOVA, &WalkConfig::SMMU_48),
            Err(WalkFault::External {
                level: 2,
                descriptor: PhysAddr::new((1 << 41) + 2 * 8)
            })
        );
        assert_eq!(
            WalkFault::External {
                level: 2,
                descriptor: PhysAddr::ZERO
            }
            .kind(),
            FaultKind::External
        );
    }

    #[test]
    fn start_level_follows_the_input_size() {
        let levels: Vec<u8> = [48, 40, 39, 31, 30, 25]
            .iter()
            .map(|&bits| WalkConfig::new(bits, 48).unwrap().start_level())
            .collect();
        assert_eq!(levels, [0, 0, 1, 1, 2, 2]);
        assert_eq!(WalkConfig::from_t0sz(16, 48), Ok(WalkConfig::SMMU_48));
        assert!(WalkConfig::new(49, 48).is_err());
        assert!(WalkConfig::new(48, 52).is_err());
        assert!(WalkConfig::from_t0sz(40, 48).is_err());
        // A 39-bit walk starts at level 1: the root is a level-1 table.
        let dma = memory();
        let va39 = WalkConfig::from_t0sz(25, 48).unwrap();
        set(&dma, ROOT + 8 * 8, L2 | TABLE);
        let leaf = walk(
            PhysAddr::new(ROOT),
            Iova::new((8 << 30) | (2 << 21) | (3 << 12)),
            &va39,
            |pa| dma.read_phys_u64(pa),
        )
        .unwrap();
        assert_eq!(leaf.output, PhysAddr::new(0x1_2345_6000));
        assert_eq!(
            walk(PhysAddr::new(ROOT), Iova::new(1 << 39), &va39, |pa| dma
                .read_phys_u64(pa)),
            Err(WalkFault::Translation { level: 1 })
        );
    }

    #[test]
    fn every_descriptor_field_decodes_from_its_own_bits() {
        // Each field alone (DDI0487 D8.3): the leaf accessors and the table restrictions see
        // exactly their bit, and the other attribute and upper bits leave them alone.
        let leaf = |descriptor: u64| Leaf {
            level: 3,
            descriptor,
            base: Iova::ZERO,
            output: PhysAddr::ZERO,
            size: PageSize::Size4K,
            restrictions: TableRestrictions::default(),
        };
        let bits = |l: &Leaf| {
            [
                !l.writable(),
                l.unprivileged(),
                l.accessed(),
                l.not_global(),
                l.privileged_execute_never(),
                l.unprivileged_execute_never(),
            ]
        };
        for (i, bit) in [7, 6, 10, 11, 53, 54].into_iter().enumerate() {
            let mut expected = [false; 6];
            expected[i] = true;
            assert_eq!(bits(&leaf(1 << bit)), expected, "bit {bit}");
            let others = !(1u64 << bit);
            let mut inverted = [true; 6];
            inverted[i] = false;
            assert_eq!(bits(&leaf(others)), inverted, "all but bit {bit}");
        }
        for index in 0..8u64 {
            assert_eq!(leaf(index << 2).mair_index().get(), index as u8);
            assert_eq!(
                leaf(!(0b111 << 2) | (index << 2)).mair_index().get(),
                index as u8
            );
        }
        for (sh, expected) in [
            (0b00, Some(Shareability::NonShareable)),
            (0b01, None),
            (0b10, Some(Shareability::OuterShareable)),
            (0b11, Some(Shareability::InnerShareable)),
        ] {
            assert_eq!(leaf(sh << 8).shareability(), expected);
            assert_eq!(leaf(!(0b11 << 8) | (sh << 8)).shareability(), expected);
        }
        // APTable[1] 62, APTable[0] 61, UXNTable 60, PXNTable 59.
        let restrictions = |descriptor: u64| {
            let mut r = TableRestrictions::default();
            r.add(descriptor);
            [
                r.no_write,
                r.no_unprivileged,
                r.unprivileged_execute_never,
                r.privileged_execute_never,
            ]
        };
        for (i, bit) in [62, 61, 60, 59].into_iter().enumerate() {
            let mut expected = [false; 4];
            expected[i] = true;
            assert_eq!(restrictions(1 << bit), expected, "bit {bit}");
            assert_eq!(
                restrictions(!(0b1111 << 59) | (1 << bit)),
                expected,
                "bit {bit} among the others"
            );
        }
        // The output address is bits [47:12]: a page with every other bit set still maps to
        // it, and a 2 MiB block drops address bits [20:12] as well.
        let dma = memory();
        set(&dma, L3 + 3 * 8, 0xffff_0001_2345_6fff);
        let page = run(&dma, IOVA, &WalkConfig::SMMU_48).unwrap();
        assert_eq!(page.output, PhysAddr::new(0x1_2345_6000));
        set(&dma, L2 + 5 * 8, 0xffff_0008_003f_fffd);
        let b2 = (1 << 39) | (1 << 30) | (5 << 21);
        let block = run(&dma, b2, &WalkConfig::SMMU_48).unwrap();
        assert_eq!(
            (block.size, block.output),
            (PageSize::Size2M, PhysAddr::new(0x8_0020_0000))
        );
    }

    #[test]
    fn access_checks_access_flag_first_then_permissions() {
        let dma = memory();
        let leaf_with = |bits: u64| {
            set(&dma, L3 + 3 * 8, 0x1_2345_6000 | bits);
            run(&dma, IOVA, &WalkConfig::SMMU_48).unwrap()
        };
        let user_read = AccessRequest {
            write: false,
            privileged: false,
            instruction: false,
        };
        let fetch = AccessRequest {
            write: false,
            privileged: true,
            instruction: true,
        };

        let rw = leaf_with(PAGE_BITS);
        assert_eq!(check_access(&rw, &AccessRequest::WRITE, true), Ok(()));
        assert_eq!(check_access(&rw, &user_read, true), Ok(()));
        assert_eq!(check_access(&rw, &fetch, true), Ok(()));

        let ro_no_af = leaf_with((PAGE_BITS & !0x400) | 0x80);
        assert_eq!(
            check_access(&ro_no_af, &AccessRequest::WRITE, true),
            Err(WalkFault::AccessFlag { level: 3 })
        );
        assert_eq!(
            check_access(&ro_no_af, &AccessRequest::WRITE, false),
            Err(WalkFault::Permission { level: 3 })
        );
        assert_eq!(check_access(&ro_no_af, &AccessRequest::READ, false), Ok(()));

        let privileged_only = leaf_with(PAGE_BITS & !0x40);
        assert_eq!(
            check_access(&privileged_only, &user_read, true),
            Err(WalkFault::Permission { level: 3 })
        );
        assert_eq!(
            check_access(&privileged_only, &AccessRequest::READ, true),
            Ok(())
        );

        let pxn = leaf_with(PAGE_BITS | (1 << 53));
        assert_eq!(
            check_access(&pxn, &fetch, true),
            Err(WalkFault::Permission { level: 3 })
        );
        assert_eq!(check_access(&pxn, &AccessRequest::READ, true), Ok(()));

        // APTable[1] on the level-1 table descriptor forbids writes below it.
        leaf_with(PAGE_BITS);
        set(&dma, L1 + 8, L2 | TABLE | (1 << 62));
        let below = run(&dma, IOVA, &WalkConfig::SMMU_48).unwrap();
        assert!(below.restrictions.no_write);
        assert_eq!(
            check_access(&below, &AccessRequest::WRITE, true),
            Err(WalkFault::Permission { level: 3 })
        );
        assert_eq!(
            translate(
                PhysAddr::new(ROOT),
                Iova::new(IOVA + 4),
                &AccessRequest::READ,
                true,
                &WalkConfig::SMMU_48,
                |pa| dma.read_phys_u64(pa)
            ),
            Ok(PhysAddr::new(0x1_2345_6004))
        );
    }
}
