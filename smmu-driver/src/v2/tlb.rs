//! TLB maintenance of one context bank: [`TlbMaintenance`] with TLBIVA/TLBIVAL + TLBSYNC.

use hal::Iova;
use hal::barrier::Barrier;
use hal::delay::DelayNs;
use hal::regs::RegisterBus;
use tock_registers::interfaces::Writeable;

use super::{ContextBank, SmmuV2};
use crate::Result;
use crate::pagetable::{Invalidations, TlbMaintenance};

/// The TLBIVA/TLBIVAL value for an AArch64 context: `VA >> 12` in bits 43:0 and the ASID in
/// bits 63:48 (Linux `arm_smmu_tlb_inv_range_s1`; IHI0062 `SMMU_CBn_TLBIVA`).
pub fn tlbiva_value(iova: Iova, asid: u16) -> u64 {
    ((iova.as_u64() >> 12) & ((1 << 44) - 1)) | u64::from(asid) << 48
}

/// The TLB maintenance of one context bank, borrowed from the driver.
///
/// [`invalidate_now`](TlbMaintenance::invalidate_now) writes one TLBIVAL per changed leaf
/// (TLBIVA when a table descriptor changed, so walk caches drop it too), or one TLBIASID if
/// the list overflowed or is longer than `DriverConfig::max_tlbi_per_sync`, then TLBSYNC,
/// and polls TLBSTATUS.SACTIVE until the sync completes or times out.
pub struct ContextTlb<'a, B, D> {
    smmu: &'a mut SmmuV2<B, D>,
    context: ContextBank,
}

impl<'a, B: RegisterBus, D: DelayNs> ContextTlb<'a, B, D> {
    pub(super) fn new(smmu: &'a mut SmmuV2<B, D>, context: ContextBank) -> Self {
        ContextTlb { smmu, context }
    }

    /// The context bank.
    pub fn context(&self) -> ContextBank {
        self.context
    }
}

impl<B: RegisterBus, D: DelayNs> TlbMaintenance for ContextTlb<'_, B, D> {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> Result<()> {
        if invalidations.is_empty() {
            return Ok(());
        }
        let asid = self.smmu.context(self.context)?.asid;
        let entries = invalidations
            .iter()
            .fold(0u64, |n, run| n.saturating_add(run.count));
        let by_asid =
            invalidations.overflowed() || entries > u64::from(self.smmu.config.max_tlbi_per_sync);
        {
            let regs = self.smmu.bank_regs(self.context.index())?;
            // The table writes were published by the page table (sync_for_device); keep the
            // TLBIs after them on the way to the SMMU too.
            regs.barrier(Barrier::DsbSt);
            if by_asid {
                regs.tlbiasid().set(u32::from(asid));
            } else {
                for run in invalidations.iter() {
                    for address in run.addresses() {
                        let value = tlbiva_value(address, asid);
                        if run.leaf_only {
                            regs.tlbival().set(value);
                        } else {
                            regs.tlbiva().set(value);
                        }
                    }
                }
            }
        }
        if by_asid {
            self.smmu.stats.tlbi_asid += 1;
        } else {
            self.smmu.stats.tlbi_va += entries;
        }
        self.smmu.sync_context(self.context)
    }
}
