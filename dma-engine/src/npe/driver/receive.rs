//! The receive side: incoming blocks and messages, commits to the write queue and their
//! completions.

use super::*;

impl<B: RegisterBus, const CH: usize, const PEERS: usize, const T: usize, const NB: usize>
    Npe<B, CH, PEERS, T, NB>
{
    /// Arrived messages and staged blocks.
    pub(super) fn drain_rq<H: NpeHost + ?Sized>(
        &mut self,
        now: u64,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        let start = self.rq.index;
        let mut buf = [0u8; RQ_ENTRY];
        // Entries taken are acknowledged (RQ_HEAD) even when handling one fails: otherwise
        // the engine, its RQ full, would wait for room the driver never gives.
        let result = loop {
            match self.rq.read_new(self.rq.index, &mut buf) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
            // Room for the reply this entry may cause, and for its WQ entry.
            let wq_room = self.wq.free() > 0 || {
                match NpeGlobal::new(&self.bus, 0) {
                    Ok(global) => self.wq.seen_head = global.wq_head().get(),
                    Err(e) => break Err(e.into()),
                }
                self.wq.free() > 0
            };
            if self.outgoing.len() + 2 > CONTROL_QUEUE || !wq_room || !self.commits_free() {
                self.stats.back_pressure += 1;
                break Ok(());
            }
            let entry = RqEntry::decode(&buf);
            self.rq.index = self.rq.index.wrapping_add(1);
            report.rq_entries += 1;
            let handled = match entry {
                Ok(entry) => self.receive(now, host, &entry),
                Err(_) => {
                    // An entry the engine should never write: handled below like one whose
                    // handling failed (counted, and its slot freed if it names one).
                    self.stats.malformed += 1;
                    Err(DmaError::BadEntry {
                        what: "receive entry",
                    })
                }
            };
            if let Err(e) = handled {
                if !is_entry_error(&e) {
                    break Err(e);
                }
                // One bad entry must not stop the others, nor lose a receive slot for good.
                self.stats.engine_errors += 1;
                if let Some(slot) = RqEntry::block_slot(&buf)
                    && let Err(e) = self.post_write(slot, WqOp::Release, 0)
                {
                    break Err(e);
                }
            }
        };
        if self.rq.index != start {
            NpeGlobal::new(&self.bus, 0)?.rq_head().set(self.rq.index);
        }
        result
    }

    pub(super) fn receive<H: NpeHost + ?Sized>(
        &mut self,
        now: u64,
        host: &mut H,
        entry: &RqEntry,
    ) -> Result<()> {
        let decoded = Envelope::decode(entry.msg.as_bytes());
        match entry.kind {
            RqKind::Msg => {
                let Ok((envelope, used)) = decoded else {
                    self.stats.malformed += 1;
                    return Ok(());
                };
                if used != entry.msg.len() {
                    self.stats.malformed += 1;
                    return Ok(());
                }
                self.on_message(now, entry.src, envelope)
            }
            RqKind::Block { slot, length } => {
                let header = match decoded {
                    Ok((
                        Envelope {
                            session,
                            message: Message::Block(header),
                        },
                        used,
                    )) if used == entry.msg.len() && header.len == length => {
                        Some((session, header))
                    }
                    _ => None,
                };
                let Some((session, header)) = header else {
                    self.stats.malformed += 1;
                    return self.post_write(slot, WqOp::Release, 0);
                };
                self.on_block(host, entry.src, session, slot, header)
            }
        }
    }

    pub(super) fn on_message(&mut self, now: u64, src: u32, envelope: Envelope) -> Result<()> {
        let message = envelope.message;
        match message {
            Message::Ack(_)
            | Message::Nack(_)
            | Message::Resolved(_)
            | Message::FaultInAck(_)
            | Message::AbortAck(_) => {
                let Some(ch) = self
                    .channels
                    .iter_mut()
                    .flatten()
                    .find(|c| c.cfg.peer == src && c.cfg.session == envelope.session)
                else {
                    self.stats.unknown_connection += 1;
                    return Ok(());
                };
                match ch.sender.handle(now, &message) {
                    Ok(Disposition::Applied) => {}
                    Ok(Disposition::Ignored(Ignored::UnknownTransfer)) => {
                        self.stats.unknown_transfer += 1
                    }
                    Ok(Disposition::Ignored(Ignored::Duplicate)) => self.stats.duplicates += 1,
                    Ok(Disposition::Ignored(_)) => {}
                    Err(_) => self.stats.protocol_violations += 1,
                }
            }
            Message::Abort(abort) => {
                let Some(rx) = self
                    .peers
                    .iter_mut()
                    .flatten()
                    .find(|p| p.cfg.peer == src && p.cfg.session == envelope.session)
                else {
                    self.stats.unknown_connection += 1;
                    return Ok(());
                };
                let cfg = rx.cfg;
                if let Some(ack) = rx.receiver.on_abort(&abort) {
                    self.queue_message(cfg.peer, cfg.session, Message::AbortAck(ack));
                }
            }
            Message::Block(_) => self.stats.malformed += 1,
            _ => self.stats.unsupported += 1,
        }
        Ok(())
    }

    pub(super) fn on_block<H: NpeHost + ?Sized>(
        &mut self,
        host: &mut H,
        src: u32,
        session: u32,
        slot: u8,
        header: BlockHeader,
    ) -> Result<()> {
        let found = self.peers.iter().position(|p| {
            p.as_ref()
                .is_some_and(|p| p.cfg.peer == src && p.cfg.session == session)
        });
        let Some(peer_index) = found else {
            self.stats.unknown_connection += 1;
            return self.post_write(slot, WqOp::Release, 0);
        };
        let peer = peer_index as u8;
        let rx = self.peer_mut(peer)?;
        let cfg = rx.cfg;
        let admission = rx.receiver.admit(&header);
        match admission {
            Ok(Admission::Write) => {
                if header.key != u32::from(cfg.pdid)
                    || !within_va(header.dest, u64::from(header.len))
                {
                    // A key this receiver does not own, or an address the engine cannot
                    // reach (COMMIT carries 49 bits): refuse for good, write nothing.
                    let reply = rx.receiver.written(
                        &header,
                        WriteOutcome::Fault {
                            reason: FaultReason::OutOfRegion,
                            fatal: true,
                        },
                    )?;
                    if let Some(reply) = reply {
                        self.queue_message(cfg.peer, cfg.session, reply);
                        self.stats.nacks_sent += 1;
                    }
                    return self.post_write(slot, WqOp::Release, 0);
                }
                let snapshot = host.snapshot(cfg.pdid);
                let Some(cookie) = self.alloc_commit(SlotShadow {
                    peer,
                    header,
                    snapshot,
                }) else {
                    // Cannot happen: `drain_rq` checked for a free record first.
                    self.stats.engine_errors += 1;
                    return self.post_write(slot, WqOp::Release, 0);
                };
                self.post_write(
                    slot,
                    WqOp::Commit {
                        pdid: cfg.pdid,
                        length: header.len,
                        dst_va: header.dest,
                    },
                    cookie,
                )
            }
            Ok(Admission::Duplicate(ack)) | Ok(Admission::Retired(ack)) => {
                self.queue_message(cfg.peer, cfg.session, Message::Ack(ack));
                self.post_write(slot, WqOp::Release, 0)
            }
            Ok(Admission::Aborted) | Ok(Admission::OutOfWindow) | Ok(Admission::InFlight) => {
                self.post_write(slot, WqOp::Release, 0)
            }
            Err(_) => {
                self.stats.protocol_violations += 1;
                self.post_write(slot, WqOp::Release, 0)
            }
        }
    }

    pub(super) fn alloc_commit(&mut self, shadow: SlotShadow) -> Option<u64> {
        for step in 0..MAX_COMMITS {
            let index = (self.next_commit + step) % MAX_COMMITS;
            if let Some(entry) = self.commits.get_mut(index)
                && entry.is_none()
            {
                *entry = Some(shadow);
                self.next_commit = (index + 1) % MAX_COMMITS;
                return Some(index as u64);
            }
        }
        None
    }

    pub(super) fn commits_free(&self) -> bool {
        self.commits.iter().any(Option::is_none)
    }

    pub(super) fn post_write(&mut self, slot: u8, op: WqOp, cookie: u64) -> Result<()> {
        if op == WqOp::Release {
            self.stats.releases += 1;
        }
        let entry = WqEntry { op, slot, cookie };
        self.wq.write(self.wq.index, &entry.encode())?;
        self.wq.index = self.wq.index.wrapping_add(1);
        self.wq_dirty = true;
        Ok(())
    }

    /// Results of commits.
    pub(super) fn drain_wcq<H: NpeHost + ?Sized>(
        &mut self,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        let start = self.wcq.index;
        let mut buf = [0u8; WCQ_ENTRY];
        // As in `drain_rq`: WCQ_HEAD covers every entry taken, whatever happened to it.
        let result = loop {
            match self.wcq.read_new(self.wcq.index, &mut buf) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
            if self.outgoing.len() + 2 > CONTROL_QUEUE || self.waiters.is_full() {
                self.stats.back_pressure += 1;
                break Ok(());
            }
            self.wcq.index = self.wcq.index.wrapping_add(1);
            report.wcq_entries += 1;
            let entry = WcqEntry::decode(&buf).unwrap_or_else(|_| {
                // An entry the engine should never write. Its COOKIE (word 1) still names
                // the commit: finish that commit as refused, so the block is NACKed and
                // re-sent instead of staying "being written" for ever.
                self.stats.engine_errors += 1;
                WcqEntry {
                    phase: true,
                    status: EntryStatus::BadDescriptor,
                    slot: buf[2],
                    bytes: 0,
                    cookie: buf
                        .get(8..16)
                        .and_then(|b| b.try_into().ok())
                        .map_or(u64::MAX, u64::from_le_bytes),
                    fault_addr: 0,
                    axi_resp: 0,
                }
            });
            if let Err(e) = self.write_done(host, &entry) {
                if !is_entry_error(&e) {
                    break Err(e);
                }
                self.stats.engine_errors += 1;
            }
        };
        if self.wcq.index != start {
            NpeGlobal::new(&self.bus, 0)?.wcq_head().set(self.wcq.index);
        }
        result
    }

    pub(super) fn write_done<H: NpeHost + ?Sized>(
        &mut self,
        host: &mut H,
        entry: &WcqEntry,
    ) -> Result<()> {
        let Some(shadow) = usize::try_from(entry.cookie)
            .ok()
            .and_then(|c| self.commits.get_mut(c))
            .and_then(Option::take)
        else {
            self.stats.engine_errors += 1;
            return Ok(());
        };
        let header = shadow.header;
        let rx = self.peer_mut(shadow.peer)?;
        let cfg = rx.cfg;
        let mut wait_for: Option<u64> = None;
        let mut resolved_now = false;
        let outcome = match entry.status {
            EntryStatus::Ok => match host.check(
                cfg.pdid,
                header.dest,
                u64::from(header.len),
                shadow.snapshot,
            ) {
                Ok(()) => {
                    self.stats.commits += 1;
                    WriteOutcome::Written
                }
                Err(reason) => {
                    self.stats.page_changed += 1;
                    // Which page changed is not known; the block's first page is asked for,
                    // and the backoff covers the rest.
                    match host.classify(cfg.pdid, header.dest, Access::Write) {
                        FaultClass::Denied(r) => WriteOutcome::Fault {
                            reason: r,
                            fatal: true,
                        },
                        FaultClass::Present => {
                            resolved_now = true;
                            WriteOutcome::Fault {
                                reason,
                                fatal: false,
                            }
                        }
                        FaultClass::Resolvable => {
                            wait_for = Some(header.dest);
                            WriteOutcome::Fault {
                                reason,
                                fatal: false,
                            }
                        }
                    }
                }
            },
            EntryStatus::DstFault => {
                self.stats.dest_faults += 1;
                match host.classify(cfg.pdid, entry.fault_addr, Access::Write) {
                    FaultClass::Denied(reason) => WriteOutcome::Fault {
                        reason,
                        fatal: true,
                    },
                    FaultClass::Present => {
                        resolved_now = true;
                        WriteOutcome::Fault {
                            reason: FaultReason::NotPresent,
                            fatal: false,
                        }
                    }
                    FaultClass::Resolvable => {
                        wait_for = Some(entry.fault_addr);
                        WriteOutcome::Fault {
                            reason: FaultReason::NotPresent,
                            fatal: false,
                        }
                    }
                }
            }
            _ => {
                // BAD_DESCRIPTOR: our own commit was refused. The block is not written; NACK
                // it so the sender re-sends.
                self.stats.engine_errors += 1;
                resolved_now = true;
                WriteOutcome::Fault {
                    reason: FaultReason::NotPresent,
                    fatal: false,
                }
            }
        };
        let rx = self.peer_mut(shadow.peer)?;
        let reply = rx.receiver.written(&header, outcome)?;
        if let Some(reply) = reply {
            if matches!(reply, Message::Nack(_)) {
                self.stats.nacks_sent += 1;
            }
            self.queue_message(cfg.peer, cfg.session, reply);
        }
        if matches!(outcome, WriteOutcome::Fault { fatal: false, .. }) {
            if resolved_now {
                let generation = host.snapshot(cfg.pdid);
                self.resolve_dest(shadow.peer, header.tid, header.block, generation)?;
            } else if let Some(va) = wait_for {
                let waiter = Waiter {
                    pdid: cfg.pdid,
                    page: va & !(PAGE - 1),
                    kind: WaiterKind::Dest {
                        peer: shadow.peer,
                        tid: header.tid,
                        block: header.block,
                    },
                    resolved: None,
                    unresolvable: None,
                };
                if !self.waiters.iter().any(|w| w.kind == waiter.kind) {
                    // Room was checked before taking the entry.
                    let _ = self.waiters.push(waiter);
                }
                host.request_resolution(cfg.pdid, va, Access::Write);
            }
        }
        Ok(())
    }
}
