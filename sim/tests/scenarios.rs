//! The fault scenario of `boards` run against the simulated ZynqMP: every phase with its
//! exact counts on the model, the whole scenario as firmware runs it, and the two driver
//! mistakes the model must catch.
//!
//! Expected counts are worked out from the phase's layout (which pages are absent, resident
//! or mapped, which pages a transfer touches) and the policy (StandardPolicy::Hybrid: a
//! stalled minor fault within budget is resumed, anything else is terminated and the transfer
//! retransmitted from its start).

use boards::BoardError;
use boards::zynqmp::scenario::{Counters, Machine, Phase, Rig, ScenarioConfig, pattern_byte, run};
use hal::delay::NoDelay;
use hal::dma::HostDma;
use hal::model::RecordingBus;
use sim::mistakes::{Mistake, MistakeSwitch, MistakenBus};
use sim::soc::{Soc, Window};
use smmu_driver::SmmuError;

const BASE: u64 = ScenarioConfig::DEFAULT.iova_base;

fn machine(soc: &Soc) -> Machine<'_, Window, Window, HostDma, NoDelay> {
    machine_with_smmu(soc, soc.smmu_window().unwrap())
}

/// The ZynqMP machine with the SMMU reached through `smmu` (a wrapper over its window).
fn machine_with_smmu<S>(soc: &Soc, smmu: S) -> Machine<'_, S, Window, HostDma, NoDelay> {
    Machine::zynqmp(
        smmu,
        soc.gdma_window(0).unwrap(),
        soc.gdma_window(1).unwrap(),
        &**soc.dram(),
        NoDelay::default(),
    )
}

/// The ZynqMP machine with an SMMU window that makes the mistakes `switch` turns on.
fn mistaken_machine<'s>(
    soc: &'s Soc,
    switch: &MistakeSwitch,
) -> Machine<'s, MistakenBus<Window>, Window, HostDma, NoDelay> {
    machine_with_smmu(
        soc,
        MistakenBus::new(soc.smmu_window().unwrap(), 0x1_0000, 0x1000, switch.clone()),
    )
}

fn config(phases: &'static [Phase]) -> ScenarioConfig {
    ScenarioConfig {
        phases,
        ..ScenarioConfig::DEFAULT
    }
}

fn run_phase(phase: Phase) -> (Counters, Soc) {
    let soc = Soc::zynqmp().unwrap();
    let report = {
        let mut rig = Rig::new(machine(&soc), &config(&[])).unwrap();
        rig.run_phase(phase).unwrap()
    };
    assert_eq!(report.phase, phase);
    (report.counters, soc)
}

#[test]
fn minor_faults_are_resolved_by_stall_and_resume() {
    let (c, soc) = run_phase(Phase::MinorStallResume);
    // Transfer 1 reads 3 pages from offset 0x80: source pages 0-3, each resident but
    // unmapped: four minor faults, each resumed. Transfer 2 stays within pages 0-2.
    assert_eq!(
        c,
        Counters {
            transfers: 2,
            bytes: 3 * 4096 + 2 * 4096 + 0x20,
            faults: 4,
            stalls: 4,
            resumes: 4,
            minor: 4,
            ..Counters::default()
        }
    );
    let m = soc.lock();
    let s = m.smmu.stats();
    assert_eq!((s.stalls, s.resumes_accepted), (4, 4));
    assert_eq!((s.resumes_ignored, s.terminated, s.multi), (0, 0, 0));
    assert_eq!(m.gdma[0].stats().stalled_bursts, 4);
    assert_eq!(m.gdma[0].stats().retried_bursts, 4);
    assert_eq!(m.gdma[0].stats().failed, 0);
    assert!(!m.smmu.interrupt_line(), "nothing left pending");
}

#[test]
fn major_faults_are_terminated_and_retransmitted() {
    let (c, soc) = run_phase(Phase::MajorRetransmit);
    // Two absent source pages and two absent destination pages, faulting in the order the
    // channel touches them (src 0, dst 0, src 1, dst 1): each is terminated at once (a major
    // fault never holds the stall), paged in, and the transfer restarted.
    assert_eq!(
        c,
        Counters {
            transfers: 1,
            bytes: 8192,
            faults: 4,
            stalls: 4,
            retransmissions: 4,
            major: 4,
            ..Counters::default()
        }
    );
    let m = soc.lock();
    assert_eq!(m.smmu.stats().stalls, 4);
    assert_eq!(
        m.smmu.stats().resumes_accepted,
        4,
        "every RESUME was TnR = terminate"
    );
    assert_eq!(m.smmu.stats().terminated, 4);
    let ch = m.gdma[0].stats();
    assert_eq!((ch.started, ch.failed, ch.completed), (5, 4, 1));
}

#[test]
fn a_terminate_only_context_retransmits_even_minor_faults() {
    let (c, soc) = run_phase(Phase::TerminateOnly);
    assert_eq!(
        c,
        Counters {
            transfers: 1,
            bytes: 8192,
            faults: 2,
            retransmissions: 2,
            minor: 2,
            ..Counters::default()
        }
    );
    let s = *soc.lock().smmu.stats();
    assert_eq!(s.stalls, 0, "a terminate context never stalls");
    assert_eq!(s.terminated, 2);
}

#[test]
fn two_faults_at_once_on_a_stalling_context_set_multi_and_both_complete() {
    let (c, soc) = run_phase(Phase::MultiStall);
    // Channel 0 stalls; channel 1 faults while FSR is non-zero: MULTI, held behind the stall.
    // MULTI says a syndrome was lost while both were in flight, so both attempts are suspect
    // (to be sent again whatever they report): channel 0's stall is terminated rather than
    // resumed, which re-presents channel 1's held access; it faults again, is recorded, and
    // is terminated too. Both attempts end with an AXI error; their pages are made present
    // through the fault path and both are sent again and complete.
    assert_eq!(
        c,
        Counters {
            transfers: 2,
            bytes: 8192,
            faults: 2,
            stalls: 2,
            doomed_stalls: 2,
            retransmissions: 2,
            suspect_resends: 2,
            multi: 1,
            prefaulted: 2,
            minor: 2,
            ..Counters::default()
        }
    );
    let s = *soc.lock().smmu.stats();
    assert_eq!((s.multi, s.held, s.stalls), (1, 1, 2));
}

#[test]
fn a_fault_lost_to_multi_on_a_terminating_context_is_still_retransmitted() {
    let (c, soc) = run_phase(Phase::MultiTerminate);
    // Channel 0's fault is recorded, channel 1's only sets MULTI: both attempts are suspect,
    // so channel 0's record is not serviced (its attempt is resent anyway). Both channels see
    // AXI errors; each one's pages are made present through the fault path (one page each,
    // minor), then both are sent again.
    assert_eq!(
        c,
        Counters {
            transfers: 2,
            bytes: 8192,
            faults: 1,
            retransmissions: 2,
            suspect_resends: 2,
            multi: 1,
            prefaulted: 2,
            minor: 2,
            ..Counters::default()
        }
    );
    assert_eq!(soc.lock().smmu.stats().multi, 1);
}

#[test]
fn faults_outside_every_region_are_aborted_and_never_mapped() {
    let (c, soc) = run_phase(Phase::OutsideRegion);
    assert_eq!(
        c,
        Counters {
            faults: 2,
            stalls: 2,
            aborts: 2,
            ..Counters::default()
        }
    );
    // Both were stalled and terminated at once.
    let m = soc.lock();
    assert_eq!((m.smmu.stats().stalls, m.smmu.stats().terminated), (2, 2));
    assert_eq!(m.gdma[0].stats().failed, 2);
    // No translation for the outside IOVA was ever cached.
    let outside = BASE + 0x80_0000;
    assert!(
        m.smmu
            .tlb()
            .entries()
            .iter()
            .all(|e| e.leaf.base.as_u64() != outside)
    );
}

#[test]
fn an_evicted_page_faults_again_instead_of_reading_its_old_frame() {
    let (c, soc) = run_phase(Phase::Eviction);
    assert_eq!(
        c,
        Counters {
            transfers: 2,
            bytes: 8192,
            faults: 1,
            stalls: 1,
            retransmissions: 1,
            major: 1,
            evictions: 1,
            ..Counters::default()
        }
    );
    assert!(soc.lock().smmu.stats().tlb_invalidated >= 1);
}

#[test]
fn the_whole_scenario_runs_as_firmware_runs_it() {
    let soc = Soc::zynqmp().unwrap();
    let report = run(machine(&soc), &ScenarioConfig::DEFAULT).unwrap();
    assert_eq!(report.phases.len(), Phase::ALL.len());
    let t = report.total();
    // Per phase, in Phase::ALL order: 2, 1, 1, 2, 2, 0 (both aborted), 2.
    assert_eq!(t.transfers, 10);
    assert_eq!(t.faults, 4 + 4 + 2 + 2 + 1 + 2 + 1);
    assert_eq!(t.resumes, 4);
    assert_eq!(t.retransmissions, 4 + 2 + 2 + 2 + 1);
    assert_eq!(t.aborts, 2);
    assert_eq!(t.multi, 2);
    // Every context bank was freed again; DMA memory went back too.
    assert_eq!(soc.dram().used_pages(), 0);
    assert!(!soc.smmu_interrupt());
}

#[test]
fn a_missing_tlbiva_after_unmap_is_caught_as_stale_data() {
    let soc = Soc::zynqmp().unwrap();
    let switch = MistakeSwitch::default();
    let mut rig = Rig::new(mistaken_machine(&soc, &switch), &config(&[])).unwrap();
    switch.set(Mistake::SkipTlbInvalidation, true);
    let err = rig.run_phase(Phase::Eviction).unwrap_err();
    // The second copy read page A through the stale TLB entry, i.e. from the frame that now
    // holds page B: the first byte is B's, not A's.
    let (a, b) = (BASE, BASE + 4096);
    assert_eq!(
        err,
        BoardError::DataMismatch {
            phase: Phase::Eviction,
            transfer: 2,
            offset: 0,
            expected: pattern_byte(a, 1),
            found: pattern_byte(b, 1),
        }
    );
    assert_ne!(pattern_byte(a, 1), pattern_byte(b, 1));
    // The eviction's TLBIVAL and the teardown's TLBIASID never reached the SMMU.
    assert_eq!(switch.dropped_tlbi(), 2);
    let m = soc.lock();
    assert_eq!(m.smmu.stats().context_faults, 0, "no fault: the TLB hit");
    // Only reset's TLBIALLH + TLBIALLNSNH (global, not a bank's) reached the model.
    assert_eq!(m.smmu.stats().tlbi_ops, 2);
}

#[test]
fn resume_before_the_fsr_is_cleared_is_ignored_and_caught_as_a_typed_error() {
    let soc = Soc::zynqmp().unwrap();
    let switch = MistakeSwitch::default();
    let mut rig = Rig::new(mistaken_machine(&soc, &switch), &config(&[])).unwrap();
    switch.set(Mistake::ResumeBeforeFsrClear, true);
    let err = rig.run_phase(Phase::MinorStallResume).unwrap_err();
    assert_eq!(
        err,
        BoardError::Smmu(SmmuError::StallNotReleased { context: 0 })
    );
    let m = soc.lock();
    // The model ignored the early RESUME; the teardown's terminate (FSR clear by then) was
    // accepted, so the channel ended with an error, not with data.
    assert_eq!(m.smmu.stats().resumes_ignored, 1);
    assert_eq!(m.smmu.stats().resumes_accepted, 1);
    assert_eq!(m.gdma[0].stats().completed, 0);
    assert_eq!(m.gdma[0].stats().failed, 1);
}

#[test]
fn the_driver_clears_fsr_exactly_and_before_resume_with_cfie_masked_meanwhile() {
    let soc = Soc::zynqmp().unwrap();
    let smmu = RecordingBus::new("smmu", soc.smmu_window().unwrap());
    let machine = machine_with_smmu(&soc, smmu);
    let mut rig = Rig::new(machine, &config(&[])).unwrap();
    hal::journal::start();
    rig.run_phase(Phase::MinorStallResume).unwrap();
    let events = hal::journal::stop();
    // Context bank 0 is at 0x1_0000 (16 global pages of 4 KiB).
    let (sctlr, resume, fsr) = (0x1_0000, 0x1_0008, 0x1_0058);
    let accesses: Vec<(bool, usize, u64)> = events
        .iter()
        .filter_map(|e| match *e {
            hal::journal::Event::Read { offset, value, .. } => Some((false, offset, value)),
            hal::journal::Event::Write { offset, value, .. } => Some((true, offset, value)),
            _ => None,
        })
        .filter(|(_, o, _)| [sctlr, resume, fsr].contains(o))
        .collect();
    let resumes: Vec<usize> = (0..accesses.len())
        .filter(|&i| accesses[i] == (true, resume, 0))
        .collect();
    assert_eq!(resumes.len(), 4, "four retries");
    // SCTLR as programmed: M TRE AFE CFRE CFIE CFCFG HUPCF ASIDPNE = 0x11E7.
    let (programmed, masked) = (0x11e7u64, 0x11e7u64 & !(1 << 6));
    // FSR as recorded: SS, TF and FORMAT = 0b10 (AArch64).
    let recorded = 1u64 << 30 | 1 << 1 | 0b10 << 9;
    for &r in &resumes {
        // Before the RESUME: the FSR read with SS and TF, CFIE masked, then exactly that value
        // written back.
        let before = &accesses[..r];
        let read = before
            .iter()
            .rposition(|&(w, o, v)| !w && o == fsr && v == recorded)
            .expect("FSR read with SS|TF");
        let after_read = &before[read + 1..];
        assert!(
            after_read.contains(&(true, sctlr, masked)),
            "{after_read:x?}"
        );
        assert!(after_read.contains(&(true, fsr, recorded)));
        let mask_at = after_read.iter().position(|a| *a == (true, sctlr, masked));
        let clear_at = after_read.iter().position(|a| *a == (true, fsr, recorded));
        assert!(mask_at < clear_at, "CFIE masked before FSR is cleared");
        assert_eq!(
            after_read
                .iter()
                .filter(|&&(w, o, _)| w && o == sctlr)
                .count(),
            1,
            "no other SCTLR write while the stall is handled"
        );
        // After it: CFIE restored.
        assert_eq!(
            accesses[r + 1..].iter().find(|&&(w, o, _)| w && o == sctlr),
            Some(&(true, sctlr, programmed))
        );
    }
}

/// An SMMU window whose context banks never walk their tables (TCR.EPD0 forced on every
/// write of TCR), so every access faults again after each resolution.
struct NoWalks {
    inner: Window,
    resumes: std::cell::Cell<u64>,
}

impl hal::regs::RegisterBus for NoWalks {
    fn read(&self, offset: usize, width: hal::regs::AccessWidth) -> u64 {
        self.inner.read(offset, width)
    }

    fn write(&self, offset: usize, width: hal::regs::AccessWidth, mut value: u64) {
        // Context banks start at 0x1_0000; TCR at 0x030, RESUME at 0x008 within a bank.
        if offset >= 0x1_0000 {
            match offset & 0xfff {
                0x030 => value |= 1 << 7,
                0x008 => self.resumes.set(self.resumes.get() + 1),
                _ => {}
            }
        }
        self.inner.write(offset, width, value)
    }

    fn size(&self) -> usize {
        self.inner.size()
    }
}

#[test]
fn a_fault_that_keeps_coming_back_ends_in_a_fault_storm_error() {
    let soc = Soc::zynqmp().unwrap();
    let smmu = NoWalks {
        inner: soc.smmu_window().unwrap(),
        resumes: std::cell::Cell::new(0),
    };
    let machine = machine_with_smmu(&soc, smmu);
    let mut rig = Rig::new(machine, &config(&[])).unwrap();
    let err = rig.run_phase(Phase::MinorStallResume).unwrap_err();
    // Transfer 1 touches 4 source and 4 destination pages: 4 * 8 + 4 = 36 faults allowed;
    // the check runs after each servicing round (at most 64 faults).
    let BoardError::FaultStorm {
        phase: Phase::MinorStallResume,
        transfer: 1,
        faults,
    } = err
    else {
        panic!("{err:?}");
    };
    assert!((37..=64).contains(&faults), "{faults}");
    // Each fault was resumed once, then the teardown terminated the next stall: the channel
    // stopped instead of being resumed forever.
    assert_eq!(rig.smmu().bus().resumes.get(), u64::from(faults) + 1);
}

#[test]
fn a_phase_after_a_failed_phase_starts_clean() {
    let soc = Soc::zynqmp().unwrap();
    let switch = MistakeSwitch::default();
    let mut rig = Rig::new(mistaken_machine(&soc, &switch), &config(&[])).unwrap();
    switch.set(Mistake::ResumeBeforeFsrClear, true);
    assert!(rig.run_phase(Phase::MinorStallResume).is_err());
    switch.set(Mistake::ResumeBeforeFsrClear, false);
    // The failed phase's channel was brought to an end, so this one can start it.
    let report = rig.run_phase(Phase::MinorStallResume).unwrap();
    assert_eq!(report.counters.transfers, 2);
    let m = soc.lock();
    assert_eq!(m.smmu.stats().global_faults, 0);
}

#[test]
fn a_bypassed_copy_in_the_iova_window_is_a_decode_error_not_a_memory_access() {
    use dma_engine::DmaError;
    use dma_engine::zdma::{Transfer, ZdmaChannel, ZdmaConfig};
    // The SMMU bypasses everything after reset (sCR0.CLIENTPD): the window's addresses go to
    // the bus as they are, and nothing answers there.
    let soc = Soc::zynqmp().unwrap();
    let config = ZdmaConfig {
        timeout_us: 1_000,
        ..ZdmaConfig::DEFAULT
    };
    let mut ch = ZdmaChannel::new(soc.gdma_window(0).unwrap(), NoDelay::default(), config).unwrap();
    ch.init().unwrap();
    let err = ch
        .transfer(&Transfer {
            src: BASE,
            dst: BASE + 0x10_0000,
            len: 4096,
        })
        .unwrap_err();
    assert!(matches!(err, DmaError::AxiRead { .. }), "{err:?}");
    assert_eq!(BASE, boards::zynqmp::scenario::IOVA_HOLE.base);
    assert!(!boards::zynqmp::DDR_LOW.contains(BASE));
}

#[test]
fn the_translation_check_sees_an_unmapped_transfer_fault_in_its_bank() {
    use boards::zynqmp::scenario::EngineOutcome;
    use dma_engine::DmaError;
    let soc = Soc::zynqmp().unwrap();
    let report = run(machine(&soc), &config(&[])).unwrap();
    let check = report.translation.unwrap();
    assert_eq!(check.stream, boards::zynqmp::GDMA[0].stream);
    assert_eq!(check.iova, BASE);
    assert_ne!(check.fsr & 0x2, 0, "FSR.TF: {:#x}", check.fsr);
    assert_eq!(check.far, BASE);
    // The model's zDMA reports the terminated read, as silicon does.
    assert!(
        matches!(
            check.engine,
            EngineOutcome::BusError(DmaError::AxiRead { .. })
        ),
        "{:?}",
        check.engine
    );
    // The bank, its stream match and the table were released.
    assert_eq!(soc.dram().used_pages(), 0);
    assert!(!soc.smmu_interrupt());
    assert_eq!(soc.lock().smmu.stats().global_faults, 0);
}

#[test]
fn a_bypassed_smmu_fails_the_translation_check_with_a_typed_error() {
    use hal::regs::{AccessWidth, RegisterBus};
    // The ZynqMP program running at Secure EL3 programmed sCR0, while the Non-secure GDMA is
    // governed by NSCR0, still in its reset bypass (docs/mmu500.md §7a). The model has one
    // sCR0: setting CLIENTPD again after the driver's reset stands for that.
    let soc = Soc::zynqmp().unwrap();
    let smmu = soc.smmu_window().unwrap();
    let mut rig = Rig::new(machine(&soc), &config(&[])).unwrap();
    let scr0 = smmu.read(0, AccessWidth::U32);
    smmu.write(0, AccessWidth::U32, scr0 | 1);
    let err = rig.check_translated().unwrap_err();
    assert_eq!(
        err,
        BoardError::NotTranslated {
            stream: 0x14e8,
            iova: BASE,
            gfsr: 0
        }
    );
    assert_eq!(err.code(), 17);
    drop(rig);
    assert_eq!(soc.dram().used_pages(), 0, "released after the failure too");
}
