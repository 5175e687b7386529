//! Leaf attributes of a stage-1 mapping, as plain values.
//!
//! These are the *meaning* of the attribute bits (Arm ARM DDI0487, "Stage 1 VMSAv8-64 Block and
//! Page descriptor fields"). The builder encodes them
//! and the walker decodes them, each with its own code, so the two check each other.

use crate::{Result, SmmuError};

/// An index into the context's MAIR (eight 8-bit memory attribute fields), descriptor
/// bits 4:2 (AttrIndx).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MairIndex(u8);

impl MairIndex {
    /// Index 0 of [`STANDARD_MAIR`]: Normal, inner/outer Non-cacheable (0x44).
    pub const NORMAL_NON_CACHEABLE: MairIndex = MairIndex(0);
    /// Index 1 of [`STANDARD_MAIR`]: Normal, inner/outer Write-Back, read/write-allocate (0xff).
    pub const NORMAL_WRITE_BACK: MairIndex = MairIndex(1);
    /// Index 2 of [`STANDARD_MAIR`]: Device-nGnRE (0x04).
    pub const DEVICE_NGNRE: MairIndex = MairIndex(2);

    /// A MAIR index; fails unless `index` is 0..=7.
    pub const fn new(index: u8) -> Result<MairIndex> {
        if index < 8 {
            Ok(MairIndex(index))
        } else {
            Err(SmmuError::InvalidMairIndex { index })
        }
    }

    /// The index (0..=7).
    pub const fn get(self) -> u8 {
        self.0
    }
}

/// The MAIR value the [`MairIndex`] constants refer to: the layout Linux's io-pgtable-arm uses
/// for SMMU stage-1 contexts (index 0 = 0x44, 1 = 0xff, 2 = 0x04). Program it into
/// CD dword 3 (SMMUv3) or the context bank's MAIR0/MAIR1 (SMMUv2).
pub const STANDARD_MAIR: u64 = 0x0000_0000_0004_ff44;

/// Shareability, descriptor bits 9:8 (SH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shareability {
    /// 0b00.
    NonShareable,
    /// 0b10.
    OuterShareable,
    /// 0b11.
    InnerShareable,
}

/// The attributes that may change on a live mapping without break-before-make: access
/// permissions, execute-never and the access flag. Changing them needs only a TLB
/// invalidation (SMMUv3 IHI0070 §3.21.1.1 lists what needs break-before-make: memory type,
/// cacheability, output address, block size, global-ness; permissions are not on the list).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Permissions {
    /// Writes allowed (AP\[2\] = 0). Reads are always allowed on a valid stage-1 entry.
    pub writable: bool,
    /// Unprivileged accesses allowed (AP\[1\] = 1). SMMU transactions carry a privileged/
    /// unprivileged attribute (SMMUv3 PnU, SMMUv2 FSYNR0.PNU); Linux sets AP\[1\] on every SMMU
    /// stage-1 leaf so both kinds pass. With AP\[1\] = 0 unprivileged transactions fault.
    pub unprivileged: bool,
    /// Execute-never for both privilege levels (UXN and PXN). DMA masters rarely fetch
    /// instructions, so this is the usual setting.
    pub execute_never: bool,
    /// Access flag (AF). With AF = 0, an SMMU that checks AF (SMMUv3 CD.AFFD = 0, no HTTU;
    /// SMMUv2 SCTLR.AFFD = 0) raises an Access flag fault; QEMU 7.2 ignores AF.
    pub accessed: bool,
}

impl Permissions {
    /// Read-write for privileged and unprivileged DMA, never executable, accessed.
    pub const READ_WRITE: Permissions = Permissions {
        writable: true,
        unprivileged: true,
        execute_never: true,
        accessed: true,
    };
    /// Read-only for privileged and unprivileged DMA, never executable, accessed.
    pub const READ_ONLY: Permissions = Permissions {
        writable: false,
        unprivileged: true,
        execute_never: true,
        accessed: true,
    };
}

/// All attributes of a leaf (page or block) mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// Memory type, through the context's MAIR.
    pub mair_index: MairIndex,
    /// Shareability.
    pub shareability: Shareability,
    /// Not global (nG): the TLB entry is tagged with the context's ASID. SMMU contexts have an
    /// ASID each, so Linux sets nG on every stage-1 leaf; keep it set unless you know better.
    pub not_global: bool,
    /// Permissions and access flag.
    pub permissions: Permissions,
}

impl Attributes {
    /// Normal write-back memory, inner shareable, non-global, with `permissions`: what DMA
    /// buffers in DRAM use (Linux io-pgtable's defaults for a coherent SMMU).
    pub const fn normal(permissions: Permissions) -> Attributes {
        Attributes {
            mair_index: MairIndex::NORMAL_WRITE_BACK,
            shareability: Shareability::InnerShareable,
            not_global: true,
            permissions,
        }
    }

    /// Whether going from `self` to `new` on a live entry needs break-before-make (the memory
    /// type, shareability or global-ness changes; IHI0070 §3.21.1.1).
    pub fn needs_break_before_make(&self, new: &Attributes) -> bool {
        self.mair_index != new.mair_index
            || self.shareability != new.shareability
            || self.not_global != new.not_global
    }
}
