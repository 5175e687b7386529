//! The self-check before the phases: one deliberately unmapped transfer on channel 0 must
//! raise a context fault in the bank its stream is routed to, proof that the stream's
//! traffic is translated by the configuration the driver wrote, not bypassed.

use super::*;

/// Bytes the check's transfer moves (one burst's worth; any access faults).
const CHECK_LEN: u32 = 64;

impl<'m, S, Z, M, D> Rig<'m, S, Z, M, D>
where
    S: RegisterBus,
    Z: RegisterBus,
    M: DmaMemory,
    D: DelayNs + Clone,
{
    /// Routes channel 0's stream to a fresh terminate-mode context bank whose page table maps
    /// nothing, starts a copy from [`ScenarioConfig::iova_base`] to 1 MiB above it and
    /// requires the bank's FSR to record a fault for it: a stream the SMMU bypasses (on the
    /// ZynqMP: an SMMU programmed through the Secure view, whose Non-secure NSCR0 still has
    /// CLIENTPD set) reaches the IOVA window as a physical address instead, a hole of the
    /// address map, and the bank records nothing ([`BoardError::NotTranslated`]). The channel
    /// may end with an AXI error (the terminated access; silicon) or done (an engine that
    /// does not report error responses); any other outcome is an error. The bank, its stream
    /// match and the table are released afterwards, also on an error.
    pub fn check_translated(&mut self) -> Result<TranslationCheck> {
        let output_bits = self.smmu.capabilities().output_bits.min(48);
        let table = PageTable::new(
            self.dma,
            PageTableConfig {
                output_bits,
                chunk_pages: 1,
                max_chunks: 1,
            },
        )?;
        let context = ContextConfig::new(table.root(), &table.walk_config(), FaultModel::Terminate);
        let cb = self.smmu.alloc_context(&context)?;
        let stream = self.streams[0];
        let entry = match self.smmu.attach(
            StreamMatch::exact(stream.0 as u16),
            StreamRoute::Translate(cb),
            StreamFaultConfig::NEVER_STALL,
        ) {
            Ok(entry) => Some(entry),
            Err(e) => {
                let _ = self.smmu.free_context(cb);
                return Err(e.into());
            }
        };
        let iova = self.config.iova_base;
        let body = self.unmapped_transfer(cb, stream, iova);
        let mut teardown: Result<()> = self.quiesce_channels(cb);
        if let Some(e) = entry
            && let Err(err) = self.smmu.detach(e)
        {
            teardown = Err(err.into());
        }
        if let Err(err) = self.smmu.free_context(cb) {
            teardown = Err(err.into());
        }
        let check = body?;
        teardown?;
        Ok(check)
    }

    fn unmapped_transfer(
        &mut self,
        cb: ContextBank,
        stream: StreamId,
        iova: u64,
    ) -> Result<TranslationCheck> {
        self.channels[0].start(&Transfer {
            src: iova,
            dst: iova + 0x10_0000,
            len: CHECK_LEN,
        })?;
        let engine = match self.channels[0].wait() {
            Ok(_) => EngineOutcome::Done,
            Err(error) if error.is_retransmittable() => EngineOutcome::BusError(error),
            Err(error) => return Err(error.into()),
        };
        match self.smmu.take_context_fault(cb)? {
            Some(fault) if fault.fsr & FSR_FAULT_BITS != 0 => Ok(TranslationCheck {
                stream,
                context: cb.index(),
                iova,
                fsr: fault.fsr,
                far: fault.far,
                engine,
            }),
            _ => {
                let global = self.smmu.take_global_fault()?.map_or(0, |g| g.gfsr);
                Err(BoardError::NotTranslated {
                    stream: stream.0,
                    iova,
                    gfsr: global,
                })
            }
        }
    }
}
