//! The command queue: pushing, publishing and waiting for commands, CMD_SYNC, command
//! errors and GERROR (IHI0070 §4, §6.3.18, §7.5).

use super::*;

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> Smmuv3<'a, B, M, D> {
    /// Writes one raw command into the queue (publishing and waiting if it is full).
    pub(super) fn push(&mut self, raw: [u64; 2]) -> Result<()> {
        if self.cmdq_ring.is_full(self.cmdq_prod, self.cmdq_cons) {
            self.publish();
            self.wait_for_space()?;
        }
        let at = self.cmdq_ring.index(self.cmdq_prod) as usize * CMD_BYTES;
        self.cmdq.write_u64(at, raw[0])?;
        self.cmdq.write_u64(at + 8, raw[1])?;
        self.cmdq_prod = self.cmdq_ring.next(self.cmdq_prod);
        self.stats.commands += 1;
        Ok(())
    }

    /// Makes the written commands visible (cache maintenance where needed, then a store
    /// barrier on the register bus, which a model can check), then rings CMDQ_PROD.
    pub(super) fn publish(&mut self) {
        self.dma.sync_for_device(self.cmdq.region());
        self.regs.barrier(Barrier::DsbSt);
        self.regs.cmdq_prod().set(self.cmdq_prod);
    }

    pub(super) fn read_cmdq_cons(&mut self) -> u32 {
        let cons = self.regs.cmdq_cons().get();
        self.cmdq_cons = cons & self.cmdq_ring.mask();
        cons
    }

    pub(super) fn cmdq_error_active(&self) -> bool {
        (self.regs.gerror().get() ^ self.gerrorn) & GERROR::CMDQ_ERR::SET.value != 0
    }

    pub(super) fn wait_for_space(&mut self) -> Result<()> {
        let mut waited = 0u64;
        loop {
            self.read_cmdq_cons();
            if !self.cmdq_ring.is_full(self.cmdq_prod, self.cmdq_cons) {
                return Ok(());
            }
            if self.cmdq_error_active() {
                self.handle_global_errors()?;
                continue;
            }
            if waited >= self.config.sync_timeout_us {
                return Err(SmmuError::CommandQueueFull { waited_us: waited });
            }
            self.delay.delay_us(self.config.poll_interval_us.max(1));
            waited += u64::from(self.config.poll_interval_us.max(1));
        }
    }

    /// Waits until the SMMU consumed every published command, recovering from command errors
    /// on the way.
    pub(super) fn wait_until_consumed(&mut self) -> Result<()> {
        let mut waited = 0u64;
        loop {
            let cons = self.read_cmdq_cons();
            if self.cmdq_ring.is_empty(self.cmdq_prod, cons) {
                return Ok(());
            }
            // A command error stops consumption until it is acknowledged (§7.1).
            if self.cmdq_error_active() {
                self.handle_global_errors()?;
                continue;
            }
            if waited >= self.config.sync_timeout_us {
                return Err(SmmuError::CommandSyncTimeout { waited_us: waited });
            }
            self.delay.delay_us(self.config.poll_interval_us.max(1));
            waited += u64::from(self.config.poll_interval_us.max(1));
        }
    }

    /// Queues `commands` and rings the doorbell, without waiting.
    pub fn submit(&mut self, commands: &[Command]) -> Result<()> {
        for c in commands {
            self.push(c.encode())?;
        }
        self.publish();
        Ok(())
    }

    /// Queues one raw, unvalidated command and rings the doorbell: for diagnostics (e.g.
    /// proving that a rejected command is recovered from). Follow it with [`sync`](Self::sync).
    pub fn submit_raw(&mut self, raw: [u64; 2]) -> Result<()> {
        self.push(raw)?;
        self.publish();
        Ok(())
    }

    /// Appends a CMD_SYNC and waits until it was consumed: every earlier command has taken
    /// effect, and event records of transactions terminated before it are visible (§4.7.3).
    /// If the SMMU rejected a command since the last sync, the queue is recovered and that
    /// command's [`SmmuError::CommandRejected`] is returned.
    pub fn sync(&mut self) -> Result<()> {
        self.push(
            Command::Sync {
                signal: SyncSignal::None,
            }
            .encode(),
        )?;
        self.publish();
        self.stats.syncs += 1;
        self.wait_until_consumed()?;
        match self.command_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Replaces the command the SMMU stopped at with a CMD_SYNC (§7.1: commands at CONS are
    /// re-fetched when the error is acknowledged) and returns what it was.
    pub(super) fn skip_bad_command(&mut self) -> Result<SmmuError> {
        let cons = self.read_cmdq_cons();
        let reason = ((cons >> 24) & 0x7f) as u8;
        let index = self.cmdq_ring.index(cons);
        let at = index as usize * CMD_BYTES;
        let opcode = cmd::CmdHeader(self.cmdq.read_u64(at)?).opcode();
        let sync = Command::Sync {
            signal: SyncSignal::None,
        }
        .encode();
        self.cmdq.write_u64(at, sync[0])?;
        self.cmdq.write_u64(at + 8, sync[1])?;
        self.dma.sync_for_device(self.cmdq.region());
        self.stats.cmdq_errors += 1;
        Ok(SmmuError::CommandRejected {
            reason,
            opcode,
            index,
        })
    }

    /// Handles and acknowledges every active global error (GERROR != GERRORN, §7.5):
    /// CMDQ_ERR by skipping the bad command (the next [`sync`](Self::sync) reports it);
    /// EVENTQ_ABT_ERR by noting that records were lost (the next
    /// [`drain_events`](Self::drain_events) reports it); others are counted.
    pub fn handle_global_errors(&mut self) -> Result<GlobalErrors> {
        let active = (self.regs.gerror().get() ^ self.gerrorn) & GERROR_KNOWN;
        let mut report = GlobalErrors {
            active,
            ..GlobalErrors::default()
        };
        if active == 0 {
            return Ok(report);
        }
        if active & GERROR::CMDQ_ERR::SET.value != 0 {
            let rejected = self.skip_bad_command()?;
            report.command = Some(rejected);
            self.command_error.get_or_insert(rejected);
        }
        if active & GERROR::EVENTQ_ABT_ERR::SET.value != 0 {
            report.events_lost = true;
            self.events_lost = true;
            self.stats.overflows += 1;
        }
        if active & !(GERROR::CMDQ_ERR::SET.value | GERROR::EVENTQ_ABT_ERR::SET.value) != 0 {
            self.stats.other_global_errors += 1;
        }
        // Toggle exactly the active bits (§6.3.20: never toggle an inactive one). For
        // CMDQ_ERR this restarts command consumption.
        self.gerrorn ^= active;
        self.regs.gerrorn().set(self.gerrorn);
        Ok(report)
    }
}
