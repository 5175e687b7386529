//! The SMMUv2 driver and the zDMA driver against the register-accurate models.

mod common;

use common::*;
use dma_engine::DmaError;
use dma_engine::zdma::{Completion, Transfer};
use hal::{Iova, PageSize};
use sim::mistakes::{Mistake, MistakeSwitch};
use sim::soc::Soc;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultDecision, FaultHandler, FaultKind, StallTag, StandardPolicy,
    StreamId,
};
use smmu_driver::v2::{DriverConfig, FaultModel, ResumeAction, UnmatchedStreams};

fn copy(src: u64, dst: u64, len: u32) -> Transfer {
    Transfer { src, dst, len }
}

#[test]
fn probe_reads_the_zynqmp_geometry_from_the_model() {
    let soc = Soc::zynqmp().unwrap();
    let smmu = smmu(&soc, ZYNQMP_SMMU);
    let caps = smmu.capabilities();
    assert_eq!(caps.context_banks, 16);
    assert_eq!(caps.stream_match_groups, 48);
    assert_eq!(caps.stream_id_bits, 15);
    assert_eq!(caps.window_bytes(), 0x2_0000);
    assert_eq!(caps.context_bank_offset(3), 0x1_3000);
    assert!(
        soc.lock().smmu.unknown_accesses().is_empty(),
        "every register the driver touched exists"
    );
}

#[test]
fn a_stall_asserts_the_interrupt_until_cfie_is_masked_and_resume_completes_the_copy() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let src = page_with(dram, 1, |i| (i * 13 + 5) as u8);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, DST, &dst, 1);
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0]);
    let mut ch = channel(&soc, 0);

    ch.start(&copy(SRC, DST, 4096)).unwrap();
    assert!(soc.lock().smmu.stall_pending(0));
    assert!(soc.lock().gdma[0].held_by_smmu());
    assert!(soc.smmu_interrupt(), "FSR.TF|SS with CFIE");

    let fault = smmu.take_context_fault(cb).unwrap().unwrap();
    let record = fault.record.unwrap();
    assert_eq!(record.stream, StreamId(0x14e8));
    assert_eq!(record.iova, Iova::new(SRC));
    assert_eq!(record.access, AccessKind::Read);
    assert_eq!(record.kind, FaultKind::Translation);
    assert_eq!(record.level, Some(3));
    assert_eq!(record.stall, Some(StallTag(0)));
    assert!(!fault.multi());
    // FSR cleared except SS; the line is low only because CFIE is masked.
    assert_eq!(soc.lock().smmu.fsr(0), Some(1 << 30));
    assert!(!soc.smmu_interrupt());
    assert_eq!(soc.lock().smmu.sctlr(0).unwrap() & (1 << 6), 0);

    table
        .map(
            Iova::new(SRC),
            src.bus_addr(),
            PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();
    smmu.resume(cb, ResumeAction::Retry).unwrap();
    assert_eq!(ch.wait(), Ok(Completion { bytes: 4096 }));
    assert_eq!(contents(&dst, 4096), contents(&src, 4096));
    assert!(!soc.smmu_interrupt());
    assert_ne!(soc.lock().smmu.sctlr(0).unwrap() & (1 << 6), 0, "CFIE back");
    assert_eq!(
        smmu.resume(cb, ResumeAction::Retry),
        Err(SmmuError::NoStallPending { context: 0 })
    );
}

#[test]
fn resume_before_fsr_clear_hangs_the_master_until_a_correct_resume() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let switch = MistakeSwitch::default();
    let mut smmu = mistaken_smmu(&soc, ZYNQMP_SMMU, &switch);
    switch.set(Mistake::ResumeBeforeFsrClear, true);
    let mut table = table(dram);
    let src = page_with(dram, 1, |i| (i * 7) as u8);
    let dst = page_with(dram, 1, |_| 0xee);
    map(&mut table, DST, &dst, 1);
    map(&mut table, SRC, &src, 0);
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0]);
    let mut ch = channel(&soc, 0);
    ch.start(&copy(SRC, DST, 4096)).unwrap();
    smmu.take_context_fault(cb).unwrap().unwrap();
    table
        .map(
            Iova::new(SRC),
            src.bus_addr(),
            PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();
    assert_eq!(
        smmu.resume(cb, ResumeAction::Retry),
        Err(SmmuError::StallNotReleased { context: 0 })
    );
    {
        let m = soc.lock();
        assert_eq!(m.smmu.stats().resumes_ignored, 1);
        assert!(m.smmu.stall_pending(0));
        assert!(m.gdma[0].held_by_smmu(), "the transaction is still held");
    }
    // The master hangs: a bounded wait turns it into a typed error.
    assert!(matches!(ch.wait(), Err(DmaError::Timeout { bytes: 0, .. })));
    assert_eq!(contents(&dst, 16), vec![0xee; 16]);
    // STATUS still says busy (silicon's code 2), so the channel cannot be reprogrammed.
    assert_eq!(ch.init(), Err(DmaError::Busy));

    assert_eq!(switch.reordered_fsr(), 1);
    switch.set(Mistake::ResumeBeforeFsrClear, false);
    smmu.resume(cb, ResumeAction::Retry).unwrap();
    assert_eq!(ch.wait(), Ok(Completion { bytes: 4096 }));
    assert_eq!(contents(&dst, 4096), contents(&src, 4096));
}

#[test]
fn a_fault_of_another_master_during_a_stall_does_not_block_the_resume() {
    // HUPCF: while channel 0 is stalled, channel 1 (same context) faults too. Not recorded,
    // it sets FSR.MULTI, and MMU-500 ignores RESUME until FSR holds nothing but SS.
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let src = page_with(dram, 1, |i| (i * 3 + 1) as u8);
    let dst = page_with(dram, 2, |_| 0);
    map(&mut table, DST, &dst, 2);
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0, GDMA1]);
    let (mut ch0, mut ch1) = (channel(&soc, 0), channel(&soc, 1));
    ch0.start(&copy(SRC, DST, 4096)).unwrap();
    let first = smmu.take_context_fault(cb).unwrap().unwrap();
    assert_eq!(first.record.unwrap().stream, StreamId(u32::from(GDMA0)));
    ch1.start(&copy(SRC, DST + 4096, 4096)).unwrap();
    assert_eq!(
        soc.lock().smmu.fsr(0),
        Some(1 << 31 | 1 << 30),
        "MULTI | SS"
    );
    table
        .map(
            Iova::new(SRC),
            src.bus_addr(),
            PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();
    smmu.resume(cb, ResumeAction::Retry).unwrap();
    assert_eq!(smmu.stats().multi, 1);
    assert_eq!(soc.lock().smmu.stats().resumes_ignored, 0);
    assert_eq!(ch0.wait(), Ok(Completion { bytes: 4096 }));
    assert_eq!(ch1.wait(), Ok(Completion { bytes: 4096 }));
    let copied = contents(&dst, 8192);
    assert_eq!(&copied[..4096], &contents(&src, 4096)[..]);
    assert_eq!(&copied[4096..], &contents(&src, 4096)[..]);
}

#[test]
fn service_context_resumes_a_minor_fault_and_terminates_a_major_one() {
    use boards::zynqmp::scenario::{Fill, Pager};
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let mut pager = Pager::new(dram, 4, 1_000, boards::pager::Store::Dma).unwrap();
    pager
        .add_region(StreamId(0x14e8), Iova::new(SRC), 2, true, Fill::Pattern(3))
        .unwrap();
    pager
        .add_region(StreamId(0x14e8), Iova::new(DST), 1, true, Fill::Byte(0))
        .unwrap();
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0]);
    {
        let mut tlb = smmu.tlb(cb).unwrap();
        pager.map_now(Iova::new(DST), &mut table, &mut tlb).unwrap();
    }
    pager.make_resident(Iova::new(SRC)).unwrap();
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let mut ch = channel(&soc, 0);

    // Minor: resumed, the copy completes without the master noticing.
    ch.start(&copy(SRC, DST, 4096)).unwrap();
    let s = smmu
        .service_context(cb, &mut handler, &mut pager, &mut table)
        .unwrap()
        .unwrap();
    assert_eq!(s.decision, Some(FaultDecision::Resume));
    assert_eq!(s.mapped.map(|p| p.cost), Some(FaultCost::Minor));
    assert_eq!(ch.wait(), Ok(Completion { bytes: 4096 }));
    assert!(
        smmu.service_context(cb, &mut handler, &mut pager, &mut table)
            .unwrap()
            .is_none()
    );

    // Major (page 2 is only in the store): terminated, the master sees an AXI read error, the
    // page is mapped for the retransmission.
    ch.start(&copy(SRC + 4096, DST, 4096)).unwrap();
    let s = smmu
        .service_context(cb, &mut handler, &mut pager, &mut table)
        .unwrap()
        .unwrap();
    assert_eq!(s.decision, Some(FaultDecision::TerminateAndRetransmit));
    assert_eq!(s.mapped.map(|p| p.cost), Some(FaultCost::Major));
    assert_eq!(ch.wait(), Err(DmaError::AxiRead { bytes: 0 }));
    assert_eq!(
        ch.transfer(&copy(SRC + 4096, DST, 4096)),
        Ok(Completion { bytes: 4096 })
    );
    assert_eq!(
        pager
            .first_difference(Iova::new(SRC + 4096), Iova::new(DST), 4096)
            .unwrap(),
        None
    );
    assert_eq!(smmu.stats().resumed, 1);
    assert_eq!(smmu.stats().terminated, 1);
}

#[test]
fn with_hupcf_clear_a_terminate_context_fails_everything_until_fsr_is_cleared() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let good = page_with(dram, 1, |i| i as u8);
    let out = page_with(dram, 2, |_| 0);
    // Channel 1's buffers are mapped; channel 0's source is not.
    map(&mut table, SRC + 0x1000, &good, 1);
    map(&mut table, DST, &out, 2);
    let cb = context(
        &mut smmu,
        &table,
        FaultModel::Terminate,
        false,
        &[GDMA0, GDMA1],
    );
    let (mut ch0, mut ch1) = (channel(&soc, 0), channel(&soc, 1));

    assert_eq!(
        ch0.transfer(&copy(SRC, DST, 64)),
        Err(DmaError::AxiRead { bytes: 0 })
    );
    // A fault is outstanding (FSR.TF) and HUPCF = 0: the mapped copy is terminated too.
    let mapped = copy(SRC + 0x1000, DST + 0x1000, 4096);
    assert_eq!(ch1.transfer(&mapped), Err(DmaError::AxiRead { bytes: 0 }));
    assert_eq!(
        soc.lock().smmu.stats().context_faults,
        1,
        "not a fault of its own"
    );
    // Clearing FSR lets it through.
    let fault = smmu.take_context_fault(cb).unwrap().unwrap();
    assert_eq!(fault.record.unwrap().stream, StreamId(0x14e8));
    assert_eq!(ch1.transfer(&mapped), Ok(Completion { bytes: 4096 }));
    let mut copied = vec![0; 4096];
    out.read_bytes(4096, &mut copied).unwrap();
    assert_eq!(copied, contents(&good, 4096));
}

#[test]
fn unmatched_streams_fault_or_bypass_as_configured() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let src = page_with(dram, 1, |i| (i % 251) as u8);
    let dst = page_with(dram, 1, |_| 0);
    let (s, d) = (phys(&src).as_u64(), phys(&dst).as_u64());

    let mut faulting = smmu(&soc, ZYNQMP_SMMU);
    let mut ch2 = channel(&soc, 2);
    assert_eq!(
        ch2.transfer(&copy(s, d, 128)),
        Err(DmaError::AxiRead { bytes: 0 })
    );
    let g = faulting.take_global_fault().unwrap().unwrap();
    assert!(g.unidentified_stream());
    assert_eq!(g.stream(), StreamId(0x14ea));
    assert_eq!(g.gfar, s);
    assert!(faulting.take_global_fault().unwrap().is_none(), "cleared");

    let bypass = DriverConfig {
        unmatched: UnmatchedStreams::Bypass,
        ..ZYNQMP_SMMU
    };
    let mut bypassing = smmu(&soc, bypass);
    assert_eq!(
        ch2.transfer(&copy(s, d, 128)),
        Ok(Completion { bytes: 128 })
    );
    assert_eq!(contents(&dst, 128), contents(&src, 128));
    assert!(bypassing.take_global_fault().unwrap().is_none());
}

#[test]
fn a_changed_mapping_is_used_only_after_tlbiva_and_tlbsync() {
    use smmu_driver::pagetable::TlbMaintenance;
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let old = page_with(dram, 1, |_| 0x11);
    let new = page_with(dram, 1, |_| 0x22);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, SRC, &old, 1);
    map(&mut table, DST, &dst, 1);
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0]);
    let mut ch = channel(&soc, 0);
    let read = copy(SRC, DST, 64);
    ch.transfer(&read).unwrap();
    assert_eq!(contents(&dst, 64), vec![0x11; 64]);

    // Remap SRC to the new frame without telling the SMMU.
    let invalidations = table.unmap(Iova::new(SRC), 4096, &mut NoTlb).unwrap();
    assert_eq!(invalidations.len(), 1);
    table
        .map(
            Iova::new(SRC),
            new.bus_addr(),
            PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();
    ch.transfer(&read).unwrap();
    assert_eq!(contents(&dst, 64), vec![0x11; 64], "stale TLB entry used");

    // A TLBIVAL written by hand without TLBSYNC changes nothing yet.
    let asid = smmu.context_asid(cb).unwrap();
    let value = smmu_driver::v2::tlbiva_value(Iova::new(SRC), asid);
    hal::regs::RegisterBus::write(smmu.bus(), 0x1_0620, hal::regs::AccessWidth::U64, value);
    ch.transfer(&read).unwrap();
    assert_eq!(contents(&dst, 64), vec![0x11; 64], "not synced yet");

    // The driver's invalidation (TLBIVAL + TLBSYNC + TLBSTATUS polls) takes effect.
    smmu.tlb(cb)
        .unwrap()
        .invalidate_now(&invalidations)
        .unwrap();
    ch.transfer(&read).unwrap();
    assert_eq!(contents(&dst, 64), vec![0x22; 64]);
    assert_eq!(smmu.stats().tlbi_va, 1);
}

#[test]
fn freeing_a_context_terminates_its_stalled_transaction() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, DST, &dst, 1);
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[]);
    let entry = smmu
        .attach(
            smmu_driver::v2::StreamMatch::exact(GDMA0),
            smmu_driver::v2::StreamRoute::Translate(cb),
            smmu_driver::fault::StreamFaultConfig::stall_tolerant(1),
        )
        .unwrap();
    let mut ch = channel(&soc, 0);
    ch.start(&copy(SRC, DST, 4096)).unwrap();
    smmu.take_context_fault(cb).unwrap().unwrap();
    assert!(smmu.stall_pending(cb).unwrap());
    smmu.detach(entry).unwrap();
    smmu.free_context(cb).unwrap();
    assert_eq!(ch.wait(), Err(DmaError::AxiRead { bytes: 0 }));
    assert!(!soc.lock().smmu.stall_pending(0));
    assert_eq!(soc.lock().smmu.sctlr(0), Some(0), "bank disabled");
}

/// Context banks over two tables that map SRC to different pages, with the ASIDs asked for;
/// GDMA channel n is attached to bank n. Returns each bank's ASID (or the refusal) and the
/// pages SRC and DST map to in each table.
#[allow(clippy::type_complexity)]
fn two_contexts(
    soc: &Soc,
    smmu: &mut common::Smmu,
    asids: [Option<u16>; 2],
) -> Vec<(
    Result<u16, SmmuError>,
    hal::dma::DmaRegion,
    hal::dma::DmaRegion,
)> {
    let dram = &**soc.dram();
    asids
        .iter()
        .enumerate()
        .map(|(n, &asid)| {
            let mut table = table(dram);
            let src = page_with(dram, 1, |_| 0xa0 + n as u8);
            let dst = page_with(dram, 1, |_| 0);
            map(&mut table, SRC, &src, 1);
            map(&mut table, DST, &dst, 1);
            let mut config = smmu_driver::v2::ContextConfig::new(
                table.root(),
                &table.walk_config(),
                FaultModel::Terminate,
            );
            config.asid = asid;
            let cb = smmu.alloc_context(&config);
            if let Ok(cb) = cb {
                smmu.attach(
                    smmu_driver::v2::StreamMatch::exact(GDMA0 + n as u16),
                    smmu_driver::v2::StreamRoute::Translate(cb),
                    smmu_driver::fault::StreamFaultConfig::stall_tolerant(20_000),
                )
                .unwrap();
            }
            // The tables stay in DRAM for the test's life.
            std::mem::forget(table);
            (cb.and_then(|cb| smmu.context_asid(cb)), src, dst)
        })
        .collect()
}

#[test]
fn an_asid_that_another_context_has_is_refused() {
    let soc = Soc::zynqmp().unwrap();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let banks = two_contexts(&soc, &mut smmu, [Some(5), Some(5)]);
    assert_eq!(banks[0].0, Ok(5));
    let refusal = banks[1].0.unwrap_err();
    assert_eq!(refusal, SmmuError::AsidInUse { asid: 5, index: 0 });
    assert_eq!(refusal.code(), 30);
}

#[test]
fn a_default_asid_taken_by_an_explicit_one_moves_and_the_banks_keep_their_translations() {
    let soc = Soc::zynqmp().unwrap();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    // Bank 0 asks for ASID 1, bank 1's default.
    let banks = two_contexts(&soc, &mut smmu, [Some(1), None]);
    assert_eq!(banks[0].0, Ok(1));
    assert_eq!(banks[1].0, Ok(2));
    for (n, (_, src, dst)) in banks.iter().enumerate() {
        let mut ch = channel(&soc, n);
        ch.start(&copy(SRC, DST, 64)).unwrap();
        assert_eq!(ch.wait(), Ok(Completion { bytes: 64 }));
        assert_eq!(contents(dst, 64), contents(src, 64), "bank {n}'s own pages");
    }
}

#[test]
fn reset_terminates_stalls_a_previous_owner_left() {
    // A previous boot stage (or a driver that crashed) left two stalls: bank 0 with its
    // record never taken (FSR = TF | SS), bank 1 with the record taken and CFIE masked
    // (FSR = SS) and, with HUPCF, a second channel held behind it (MULTI).
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let dst = page_with(dram, 3, |_| 0x5a);
    {
        let mut previous = smmu(&soc, ZYNQMP_SMMU);
        let mut table = table(dram);
        map(&mut table, DST, &dst, 3);
        let untaken = context(&mut previous, &table, FaultModel::Stall, true, &[GDMA0]);
        let taken = context(
            &mut previous,
            &table,
            FaultModel::Stall,
            true,
            &[GDMA1, GDMA0 + 2],
        );
        assert_eq!((untaken.index(), taken.index()), (0, 1));
        channel(&soc, 0).start(&copy(SRC, DST, 4096)).unwrap();
        channel(&soc, 1)
            .start(&copy(SRC, DST + 4096, 4096))
            .unwrap();
        previous.take_context_fault(taken).unwrap().unwrap();
        channel(&soc, 2)
            .start(&copy(SRC, DST + 8192, 4096))
            .unwrap();
        std::mem::forget(table);
    }
    {
        let m = soc.lock();
        assert_eq!(
            m.smmu.fsr(0).unwrap() & (1 << 30 | 1 << 1),
            1 << 30 | 1 << 1
        );
        assert_eq!(m.smmu.fsr(1), Some(1 << 31 | 1 << 30), "SS | MULTI");
        assert!(m.smmu.stall_pending(0) && m.smmu.stall_pending(1));
        assert_eq!(m.smmu.held(1), 1);
    }

    // A new driver takes over: its reset terminates both stalls (and lets the held
    // transaction retry, which now faults without stalling and is terminated too).
    let smmu = smmu(&soc, ZYNQMP_SMMU);
    {
        let m = soc.lock();
        for bank in 0..16 {
            assert!(!m.smmu.stall_pending(bank), "bank {bank} still stalled");
            assert_eq!(m.smmu.held(bank), 0, "bank {bank} still holds transactions");
            assert_eq!(m.smmu.fsr(bank), Some(0), "bank {bank}");
            assert_eq!(m.smmu.sctlr(bank), Some(0), "bank {bank} disabled");
        }
        assert_eq!(m.smmu.stats().resumes_ignored, 0);
        for n in 0..3 {
            assert!(!m.gdma[n].held_by_smmu(), "channel {n} still held");
        }
    }
    assert_eq!(smmu.stats().terminated, 2);
    // The masters saw aborts (CFRE was still set when RESUME terminated them), not silence.
    for n in 0..3 {
        let mut ch = dma_engine::zdma::ZdmaChannel::new(
            soc.gdma_window(n).unwrap(),
            hal::delay::NoDelay::default(),
            dma_engine::zdma::ZdmaConfig::DEFAULT,
        )
        .unwrap();
        assert_eq!(
            hal::regs::RegisterBus::read(ch.bus(), 0x100, hal::regs::AccessWidth::U32) & (1 << 8),
            1 << 8,
            "channel {n}: ISR.AXI_RD_DATA"
        );
        assert_eq!(ch.init(), Ok(()), "channel {n} is not busy any more");
    }
    assert_eq!(contents(&dst, 3 * 4096), vec![0x5a; 3 * 4096]);
}

#[test]
fn resume_is_refused_while_fsr_holds_a_record_nobody_took() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut smmu = smmu(&soc, ZYNQMP_SMMU);
    let mut table = table(dram);
    let src = page_with(dram, 1, |i| (i * 5 + 3) as u8);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, DST, &dst, 1);
    let cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0]);
    let mut ch = channel(&soc, 0);
    ch.start(&copy(SRC, DST, 4096)).unwrap();
    smmu.take_context_fault(cb).unwrap().unwrap();
    assert_eq!(soc.lock().smmu.fsr(0), Some(1 << 30), "SS only");
    // A fault record shows up while the stall is pending (put there through FSRRESTORE, as
    // an SMMU that recorded another transaction's fault would show it): FSR = TF | SS.
    hal::regs::RegisterBus::write(smmu.bus(), 0x1_005c, hal::regs::AccessWidth::U32, 1 << 1);
    table
        .map(
            Iova::new(SRC),
            src.bus_addr(),
            PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();

    // MMU-500 would ignore a RESUME now: the driver says so instead of calling the stall
    // released, and writes nothing.
    let refused = smmu.resume(cb, ResumeAction::Retry).unwrap_err();
    let SmmuError::ResumeIgnored { context: 0, fsr } = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        fsr & (1 << 30 | 1 << 1),
        1 << 30 | 1 << 1,
        "SS | TF as read"
    );
    assert_eq!(refused.code(), 31);
    assert!(
        smmu.stall_pending(cb).unwrap(),
        "still pending in the driver"
    );
    {
        let m = soc.lock();
        assert_eq!(m.smmu.stats().resumes_ignored, 0, "no RESUME written");
        assert!(m.smmu.stall_pending(0) && m.gdma[0].held_by_smmu());
        assert_eq!(m.smmu.sctlr(0).unwrap() & (1 << 6), 0, "CFIE still masked");
        assert_eq!(
            m.smmu.fsr(0).unwrap() & (1 << 1),
            1 << 1,
            "the record is kept"
        );
    }

    // The caller takes the record (FSR cleared with exactly its bits) and resumes again.
    let fault = smmu.take_context_fault(cb).unwrap().unwrap();
    assert!(fault.record.is_some() && fault.stalled());
    smmu.resume(cb, ResumeAction::Retry).unwrap();
    assert_eq!(ch.wait(), Ok(Completion { bytes: 4096 }));
    assert_eq!(contents(&dst, 4096), contents(&src, 4096));
    assert_ne!(soc.lock().smmu.sctlr(0).unwrap() & (1 << 6), 0, "CFIE back");
    assert_eq!(soc.lock().smmu.stats().resumes_ignored, 0);
}
