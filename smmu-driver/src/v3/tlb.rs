//! TLB maintenance of a context (ASID): TLBI_NH_VA or range TLBIs, TLBI_NH_ASID, then
//! CMD_SYNC (IHI0070 §4.4).

use super::*;

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> Smmuv3<'a, B, M, D> {
    /// Issues the TLB invalidations `list` asks for, for `asid`, and waits for them.
    pub fn invalidate(&mut self, asid: u16, list: &Invalidations) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        let range = self.caps.range_invalidation;
        let needed: u64 = if list.overflowed() {
            u64::MAX
        } else {
            list.iter()
                .map(|run| {
                    if range && run.leaf_only {
                        cmd::range_command_count(run.len() >> 12)
                    } else {
                        run.count
                    }
                })
                .fold(0u64, u64::saturating_add)
        };
        let limit = MAX_TLBI_COMMANDS.min(u64::from(self.cmdq_ring.entries() / 2).max(1));
        if needed > limit {
            self.push(Command::TlbiNhAsid { asid }.encode())?;
            self.stats.tlbi_asid += 1;
        } else {
            for run in list.iter() {
                if range && run.leaf_only {
                    let mut pushed = 0u64;
                    cmd::range_commands(
                        asid,
                        run.start,
                        run.len() >> 12,
                        true,
                        run.level(),
                        |c| {
                            pushed += 1;
                            self.push(c.encode())
                        },
                    )?;
                    self.stats.tlbi_va += pushed;
                } else {
                    for address in run.addresses() {
                        self.push(
                            Command::TlbiNhVa {
                                asid,
                                address,
                                leaf: run.leaf_only,
                                range: None,
                            }
                            .encode(),
                        )?;
                        self.stats.tlbi_va += 1;
                    }
                }
            }
        }
        self.sync()
    }

    /// Invalidates every TLB entry of `asid` and waits.
    pub fn invalidate_asid(&mut self, asid: u16) -> Result<()> {
        self.push(Command::TlbiNhAsid { asid }.encode())?;
        self.stats.tlbi_asid += 1;
        self.sync()
    }

    /// The [`TlbMaintenance`] of the context with `asid`, for the page table and the fault
    /// handler.
    pub fn tlb(&mut self, asid: u16) -> AsidTlb<'_, 'a, B, M, D> {
        AsidTlb { smmu: self, asid }
    }
}

/// The TLB maintenance of one context (ASID) of an [`Smmuv3`]: CMD_TLBI_NH_VA (or range
/// TLBIs, or CMD_TLBI_NH_ASID on overflow), then CMD_SYNC.
pub struct AsidTlb<'s, 'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> {
    smmu: &'s mut Smmuv3<'a, B, M, D>,
    asid: u16,
}

impl<B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> AsidTlb<'_, '_, B, M, D> {
    /// The ASID.
    pub fn asid(&self) -> u16 {
        self.asid
    }
}

impl<B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> TlbMaintenance
    for AsidTlb<'_, '_, B, M, D>
{
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> Result<()> {
        self.smmu.invalidate(self.asid, invalidations)
    }
}
