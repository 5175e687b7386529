//! Stalls and the fault path: CMD_RESUME and the one fault service over this driver's
//! `FaultControl`.

use super::*;

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> Smmuv3<'a, B, M, D> {
    /// Answers a stalled transaction (CMD_RESUME; §4.7.1). Refused on a terminate-only SMMU,
    /// where the command would be a CERROR_ILL.
    pub fn resume(&mut self, stream: StreamId, stag: StallTag, action: ResumeAction) -> Result<()> {
        if !self.caps.has_resume() {
            return Err(SmmuError::Unsupported {
                what: "CMD_RESUME (IDR0.STALL_MODEL = terminate only)",
            });
        }
        self.push(
            Command::Resume {
                stream,
                stag: (stag.0 & 0xffff) as u16,
                action,
            }
            .encode(),
        )?;
        self.publish();
        // RESUME completes when consumed (§4.7.3 table): wait for that, and for errors.
        self.wait_until_consumed()?;
        match self.command_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Services one fault record with the shared fault service ([`FaultHandler::service`]):
    /// decide with the stream's declared configuration ([`ContextConfig::fault_config`]);
    /// terminate a stalled transaction that will not be resumed; make the page present
    /// (resolver + table); issue and sync its invalidations; resume a stalled transaction the
    /// policy resumes. The returned decision says what the master must do:
    /// `TerminateAndRetransmit` means "issue the transfer again", `Abort` means "fail it"
    /// (the error says why).
    pub fn service_fault<P, R, T>(
        &mut self,
        record: &FaultRecord,
        handler: &mut FaultHandler<P>,
        resolver: &mut R,
        table: &mut PageTable<T>,
    ) -> Result<FaultOutcome>
    where
        P: FaultPolicy,
        R: FaultResolver + ?Sized,
        T: Deref<Target: DmaMemory>,
    {
        handler.service(self, record, resolver, table)
    }
}

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> FaultControl
    for Smmuv3<'a, B, M, D>
{
    type Tlb<'s>
        = AsidTlb<'s, 'a, B, M, D>
    where
        Self: 's;

    fn answer_stall(&mut self, record: &FaultRecord, retry: bool) -> Result<()> {
        let stag = record.stall.ok_or(SmmuError::InvalidConfig {
            what: "a stall answer for a record without a stall tag",
        })?;
        let action = if retry {
            ResumeAction::Retry
        } else {
            ResumeAction::Abort
        };
        self.resume(record.stream, stag, action)
    }

    fn stream_config(&self, stream: StreamId) -> StreamFaultConfig {
        self.stream_fault_config(stream)
    }

    fn context_tlb(&mut self, record: &FaultRecord) -> Result<AsidTlb<'_, 'a, B, M, D>> {
        let asid = self.asid_of(record.stream)?;
        Ok(self.tlb(asid))
    }
}

impl<B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> FaultSource
    for Smmuv3<'_, B, M, D>
{
    fn take_fault(&mut self) -> Result<Option<TakenFault>> {
        self.next_fault()
    }
}
