//! The stream table: attaching and detaching streams, STE and CD installation and
//! retirement (IHI0070 §5).

use super::*;

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> Smmuv3<'a, B, M, D> {
    /// Makes `stream` translate through the stage-1 context `context`.
    pub fn attach(&mut self, stream: StreamId, context: &ContextConfig) -> Result<()> {
        let log2 = self.config.stream_table_log2;
        if u64::from(stream.0) >> log2 != 0 {
            return Err(SmmuError::StreamIdOutOfRange {
                id: stream.0,
                bits: log2,
            });
        }
        self.caps.check_stall(context.stall_on_fault)?;
        if context.stall_on_fault && !context.stall_tolerant {
            return Err(SmmuError::StallOnIntolerantStream { stream: stream.0 });
        }
        if context.asid > self.caps.max_asid() {
            return Err(SmmuError::InvalidConfig {
                what: "ASID beyond 8 bits on an SMMU without IDR0.ASID16",
            });
        }
        if self.streams.iter().flatten().any(|a| a.stream == stream) {
            return Err(SmmuError::InvalidConfig {
                what: "stream already attached: detach it first",
            });
        }
        let translation = (
            context.ttb0,
            context.input_bits,
            context.output_bits.min(self.caps.output_bits),
            context.mair,
        );
        // TLB entries are tagged by ASID, not by stream (IHI 0070 §5.4, CD.ASID): two
        // contexts with one ASID and different tables would use each other's translations.
        if self
            .streams
            .iter()
            .flatten()
            .any(|a| a.asid == context.asid && a.translation != translation)
        {
            return Err(SmmuError::InvalidConfig {
                what: "ASID in use by a stream with another page table",
            });
        }
        let Some(slot) = self.streams.iter().position(Option::is_none) else {
            return Err(SmmuError::ResourceExhausted {
                what: "attached SMMUv3 streams",
                capacity: MAX_STREAMS as u32,
            });
        };
        let cd_config = CdConfig {
            asid: context.asid,
            ttb0: context.ttb0,
            input_bits: context.input_bits,
            output_bits: context.output_bits.min(self.caps.output_bits),
            mair: context.mair,
            stall: context.stall_on_fault,
            record: true,
            abort: true,
            coherent: self.caps.coherent,
        };
        let descriptor = ContextDescriptor::stage1(&cd_config)?;
        let cd = AlignedDma::new(
            &self.dma,
            STRUCT_BYTES,
            STRUCT_BYTES,
            DmaDirection::ToDevice,
        )?;
        if let Err(e) = self.install(stream, &cd, &descriptor, context) {
            // The STE may already point at the CD (the last invalidation or sync failed): it
            // must abort again, and the SMMU must have dropped what it cached of it, before
            // the CD's memory can be reused.
            let retired = self
                .retire_ste(stream)
                .and_then(|()| self.invalidate_asid(context.asid));
            if retired.is_ok() {
                let _ = cd.free(&self.dma);
            } else if let Some(s) = self.streams.get_mut(slot) {
                // Not confirmed: the SMMU may still fetch the CD. Keep it, with the stream
                // recorded, so that `detach` retries and `shutdown` frees it with the SMMU off.
                *s = Some(Attached {
                    stream,
                    asid: context.asid,
                    translation,
                    cd,
                    stalls: context.stall_on_fault,
                    fault: context.fault_config(),
                });
            }
            return Err(e);
        }
        if let Some(s) = self.streams.get_mut(slot) {
            *s = Some(Attached {
                stream,
                asid: context.asid,
                translation,
                cd,
                stalls: context.stall_on_fault,
                fault: context.fault_config(),
            });
        }
        Ok(())
    }

    /// Writes an aborting STE for `stream` and waits until the SMMU has dropped its cached
    /// copy of the old one (CFGI_STE, then CMD_SYNC).
    pub(super) fn retire_ste(&mut self, stream: StreamId) -> Result<()> {
        self.write_ste(stream.0, &StreamTableEntry::abort(), 0..8)?;
        self.dma.sync_for_device(self.strtab.region());
        self.push(Command::CfgiSte { stream, leaf: true }.encode())?;
        self.sync()
    }

    pub(super) fn install(
        &mut self,
        stream: StreamId,
        cd: &AlignedDma,
        descriptor: &ContextDescriptor,
        context: &ContextConfig,
    ) -> Result<()> {
        // The CD is not reachable yet: dwords 1-7, then dword 0 (V) last anyway.
        for i in (1..8).chain(0..1) {
            cd.write_u64(i * 8, descriptor.0.get(i).copied().unwrap_or(0))?;
        }
        self.dma.sync_for_device(cd.region());
        let ste = StreamTableEntry::stage1(
            cd.bus(),
            self.caps.s1stalld_for(context.stall_tolerant),
            self.caps.coherent,
        )?;
        // §3.21.3: dwords 1-7 while dword 0 still says "abort", invalidate, then dword 0.
        self.write_ste(stream.0, &ste, 1..8)?;
        self.dma.sync_for_device(self.strtab.region());
        self.push(Command::CfgiSte { stream, leaf: true }.encode())?;
        self.sync()?;
        self.write_ste(stream.0, &ste, 0..1)?;
        self.dma.sync_for_device(self.strtab.region());
        self.push(Command::CfgiSte { stream, leaf: true }.encode())?;
        self.sync()
    }

    /// Makes `stream` abort again, drops its cached configuration and TLB entries, and frees
    /// its CD.
    ///
    /// A stream whose [`attach`](Self::attach) failed without confirming that its STE aborts
    /// again is still recorded as attached; detaching it retries that.
    pub fn detach(&mut self, stream: StreamId) -> Result<()> {
        let slot = self
            .streams
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.stream == stream))
            .ok_or(SmmuError::StreamNotAttached { stream: stream.0 })?;
        self.retire_ste(stream)?;
        let stalls = self
            .streams
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|a| a.stalls);
        if stalls && self.caps.has_resume() {
            // Transactions already stalled are not ended by the STE change: every stall must
            // be answered (IHI0070 §4.7.2, CMD_STALL_TERM after the STE change, CFGI and
            // SYNC), before the CD they stalled under is freed.
            self.push(Command::StallTerm { stream }.encode())?;
            self.publish();
            self.sync()?;
        }
        let attached = self.streams.get_mut(slot).and_then(Option::take);
        if let Some(attached) = attached {
            self.invalidate_asid(attached.asid)?;
            attached.cd.free(&self.dma)?;
        }
        Ok(())
    }
}
