//! The portable part of the `zynqmp-smmu-faults` program: its report lines and its verdict.
//!
//! The program runs `boards::zynqmp::scenario::run` on the ZynqMP's MMU-500 and GDMA channels
//! 0 and 1 (stream IDs 0x14E8/0x14E9) through MMIO; the same scenario runs against the `sim`
//! models on the host (`sim/tests/scenarios.rs`). This module turns its result into console
//! lines and the one verdict line, and is tested on the host.
//!
//! PASS needs all of:
//! - the translation self-check ran and saw its fault: a transfer from an IOVA no table maps
//!   raised a context fault in the bank GDMA 0's stream is routed to, so the GDMA's traffic
//!   is translated, not bypassed (a bypass is `BoardError::NotTranslated`, code 17; on the
//!   ZynqMP it is what programming the SMMU from Secure state gave, docs/mmu500.md §7a);
//! - the scenario returned a report (a transfer whose data differs from its source byte for
//!   byte is an error, `BoardError::DataMismatch`, so every counted transfer was exact);
//! - every configured phase ran, in order, and passes `PhaseReport::check` (the invariants
//!   that hold on any correct SMMU and DMA: minor faults resumed, major ones retransmitted,
//!   a stream that must not stall never resumed, outside-region faults aborted, ...);
//! - at least one SMMU fault was taken and at least one transfer completed.
//!
//! Otherwise FAIL, with `BoardError::code()` when the scenario returned an error.

use core::fmt;

use boards::BoardError;
use boards::zynqmp::scenario::{
    EngineOutcome, PhaseReport, ScenarioConfig, ScenarioReport, TranslationCheck,
};

use crate::Verdict;

/// The report line of one phase with its counters. The target logs it through defmt
/// (`defmt::Format`); its [`fmt::Display`] is the same line as text, for host tests. Keep the
/// two wordings alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseLine(pub PhaseReport);

impl fmt::Display for PhaseLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.0.counters;
        write!(
            f,
            "phase {} transfers {} ({} bytes), faults {}, resumes {}, retransmissions {}, \
             aborts {}, MULTI {}, minor {}, major {}, evictions {}",
            self.0.phase.name(),
            c.transfers,
            c.bytes,
            c.faults,
            c.resumes,
            c.retransmissions,
            c.aborts,
            c.multi,
            c.minor,
            c.major,
            c.evictions
        )
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for PhaseLine {
    fn format(&self, f: defmt::Formatter<'_>) {
        let c = &self.0.counters;
        defmt::write!(
            f,
            "phase {=str} transfers {=u32} ({=u64} bytes), faults {=u32}, resumes {=u32}, \
             retransmissions {=u32}, aborts {=u32}, MULTI {=u32}, minor {=u32}, major {=u32}, \
             evictions {=u32}",
            self.0.phase.name(),
            c.transfers,
            c.bytes,
            c.faults,
            c.resumes,
            c.retransmissions,
            c.aborts,
            c.multi,
            c.minor,
            c.major,
            c.evictions
        )
    }
}

/// The report line of the translation self-check: the fault the unmapped transfer raised and
/// how the engine ended it. Logged through defmt on the target, [`fmt::Display`] for host
/// tests, with the same wording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TranslationLine(pub TranslationCheck);

impl TranslationLine {
    /// What the engine did, in words.
    pub fn engine(&self) -> &'static str {
        match self.0.engine {
            EngineOutcome::BusError(dma_engine::DmaError::AxiRead { .. }) => {
                "reported an AXI read error"
            }
            EngineOutcome::BusError(dma_engine::DmaError::AxiWrite { .. }) => {
                "reported an AXI write error"
            }
            EngineOutcome::BusError(_) => "reported an error",
            EngineOutcome::Done => "said done (it reports no error responses)",
        }
    }
}

impl fmt::Display for TranslationLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.0;
        write!(
            f,
            "translation check: stream {:#x} routed to context bank {}: unmapped IOVA {:#x} \
             faulted (FSR {:#x}, FAR {:#x}); the engine {}",
            t.stream.0,
            t.context,
            t.iova,
            t.fsr,
            t.far,
            self.engine()
        )
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for TranslationLine {
    fn format(&self, f: defmt::Formatter<'_>) {
        let t = &self.0;
        defmt::write!(
            f,
            "translation check: stream {=u32:#x} routed to context bank {=u16}: unmapped IOVA \
             {=u64:#x} faulted (FSR {=u32:#x}, FAR {=u64:#x}); the engine {=str}",
            t.stream.0,
            t.context,
            t.iova,
            t.fsr,
            t.far,
            self.engine()
        )
    }
}

/// The translation self-check's line, if the check ran.
pub fn translation_line(report: &ScenarioReport) -> Option<TranslationLine> {
    report.translation.map(TranslationLine)
}

/// One line per phase, in the order they ran.
pub fn report_lines(report: &ScenarioReport) -> impl Iterator<Item = PhaseLine> + '_ {
    report.phases.iter().copied().map(PhaseLine)
}

/// The verdict for the scenario's result under `config` (see the module docs).
pub fn verdict(config: &ScenarioConfig, result: &Result<ScenarioReport, BoardError>) -> Verdict {
    let report = match result {
        Ok(report) => report,
        Err(e) => return Verdict::fail(format_args!("BoardError code {}: {e}", e.code())),
    };
    if report.translation.is_none() {
        return Verdict::fail(format_args!("the translation self-check did not run"));
    }
    let ran = report.phases.iter().map(|p| p.phase);
    if report.phases.len() != config.phases.len() || !ran.eq(config.phases.iter().copied()) {
        return Verdict::fail(format_args!(
            "{} of {} phases reported",
            report.phases.len(),
            config.phases.len()
        ));
    }
    for p in &report.phases {
        if let Err(e) = p.check() {
            return Verdict::fail(format_args!("BoardError code {}: {e}", e.code()));
        }
    }
    let t = report.total();
    if t.faults == 0 || t.transfers == 0 {
        return Verdict::fail(format_args!(
            "the fault path was not exercised: {} faults, {} transfers",
            t.faults, t.transfers
        ));
    }
    Verdict::pass(format_args!(
        "GDMA translated; {} phases: {} transfers exact ({} bytes), {} faults, {} resumes, {} retransmissions, \
         {} aborts, {} MULTI",
        report.phases.len(),
        t.transfers,
        t.bytes,
        t.faults,
        t.resumes,
        t.retransmissions,
        t.aborts,
        t.multi
    ))
}

#[cfg(test)]
mod tests {
    use boards::zynqmp::scenario::{Counters, Phase};
    use dma_engine::DmaError;
    use smmu_driver::SmmuError;
    use smmu_driver::fault::StreamId;

    use super::*;
    use crate::verdict::Outcome;

    /// The counts the MMU-500 model produces for each phase (docs/mmu500.md §5, asserted
    /// against the model in `sim/tests/scenarios.rs`); bytes are made up, only summed.
    fn model_counts(phase: Phase) -> Counters {
        let c = Counters::default();
        match phase {
            Phase::MinorStallResume => Counters {
                transfers: 2,
                bytes: 100,
                faults: 4,
                stalls: 4,
                resumes: 4,
                minor: 4,
                ..c
            },
            Phase::MajorRetransmit => Counters {
                transfers: 1,
                bytes: 10,
                faults: 4,
                stalls: 4,
                retransmissions: 4,
                major: 4,
                ..c
            },
            Phase::TerminateOnly => Counters {
                transfers: 1,
                bytes: 1,
                faults: 2,
                retransmissions: 2,
                ..c
            },
            Phase::MultiStall => Counters {
                transfers: 2,
                faults: 2,
                stalls: 2,
                doomed_stalls: 2,
                retransmissions: 2,
                suspect_resends: 2,
                multi: 1,
                prefaulted: 2,
                ..c
            },
            Phase::MultiTerminate => Counters {
                transfers: 2,
                faults: 1,
                retransmissions: 2,
                suspect_resends: 2,
                multi: 1,
                prefaulted: 2,
                ..c
            },
            Phase::OutsideRegion => Counters {
                faults: 2,
                stalls: 2,
                aborts: 2,
                ..c
            },
            Phase::Eviction => Counters {
                transfers: 2,
                faults: 1,
                stalls: 1,
                retransmissions: 1,
                evictions: 1,
                ..c
            },
        }
    }

    /// The model's translation check (`sim/tests/scenarios.rs`): GDMA 0's read of the
    /// unmapped IOVA faulted with FSR.TF and the channel reported the terminated read.
    const CHECK: TranslationCheck = TranslationCheck {
        stream: StreamId(0x14e8),
        context: 0,
        iova: 0x2_0000_0000,
        fsr: 0x202,
        far: 0x2_0000_0000,
        engine: EngineOutcome::BusError(DmaError::AxiRead { bytes: 0 }),
    };

    fn report(phases: &[Phase]) -> ScenarioReport {
        let mut r = ScenarioReport {
            translation: Some(CHECK),
            ..ScenarioReport::default()
        };
        for &phase in phases {
            r.phases
                .push(PhaseReport {
                    phase,
                    counters: model_counts(phase),
                })
                .unwrap();
        }
        r
    }

    fn text(v: &Verdict) -> (Outcome, String) {
        (v.outcome, v.message.to_string())
    }

    #[test]
    fn the_model_run_passes_with_its_totals() {
        let config = ScenarioConfig::DEFAULT;
        let v = verdict(&config, &Ok(report(&Phase::ALL)));
        // 2+1+1+2+2+0+2 transfers, 4+4+2+2+1+2+1 faults, 4 resumes, 4+2+2+2+1
        // retransmissions, 2 aborts, 2 MULTI.
        assert_eq!(
            text(&v),
            (
                Outcome::Pass,
                "GDMA translated; 7 phases: 10 transfers exact (111 bytes), 16 faults, 4 \
                 resumes, 11 retransmissions, 2 aborts, 2 MULTI"
                    .into()
            )
        );
    }

    #[test]
    fn no_pass_without_the_translation_check() {
        let config = ScenarioConfig::DEFAULT;
        let mut r = report(&Phase::ALL);
        r.translation = None;
        assert_eq!(
            text(&verdict(&config, &Ok(r))),
            (
                Outcome::Fail,
                "the translation self-check did not run".into()
            )
        );
        // A bypassed GDMA: the scenario's typed error, with its code.
        let bypassed = BoardError::NotTranslated {
            stream: 0x14e8,
            iova: 0x2_0000_0000,
            gfsr: 0,
        };
        let (outcome, msg) = text(&verdict(&config, &Err(bypassed)));
        assert_eq!(outcome, Outcome::Fail);
        assert!(
            msg.starts_with("BoardError code 17: stream 0x14e8: "),
            "{msg}"
        );
        assert!(msg.ends_with("its traffic is not translated"), "{msg}");
    }

    #[test]
    fn the_translation_line_names_the_fault_and_what_the_engine_did() {
        let line = translation_line(&report(&[])).unwrap();
        assert_eq!(
            line.to_string(),
            "translation check: stream 0x14e8 routed to context bank 0: unmapped IOVA \
             0x200000000 faulted (FSR 0x202, FAR 0x200000000); the engine reported an AXI read \
             error"
        );
        let done = TranslationLine(TranslationCheck {
            engine: EngineOutcome::Done,
            ..CHECK
        });
        assert!(
            done.to_string()
                .ends_with("the engine said done (it reports no error responses)")
        );
        assert_eq!(translation_line(&ScenarioReport::default()), None);
    }

    #[test]
    fn scenario_errors_fail_with_their_stable_code() {
        let config = ScenarioConfig::DEFAULT;
        let mismatch = BoardError::DataMismatch {
            phase: Phase::Eviction,
            transfer: 1,
            offset: 0x80,
            expected: 0x12,
            found: 0xa5,
        };
        let (outcome, msg) = text(&verdict(&config, &Err(mismatch)));
        assert_eq!(outcome, Outcome::Fail);
        assert!(msg.starts_with("BoardError code 5: "), "{msg}");
        assert!(msg.contains("byte 0x80 is 0xa5, expected 0x12"), "{msg}");

        let stall = BoardError::Smmu(SmmuError::StallNotReleased { context: 3 });
        let (outcome, msg) = text(&verdict(&config, &Err(stall)));
        assert_eq!(outcome, Outcome::Fail);
        assert_eq!(
            msg,
            "BoardError code 2: smmu: context bank 3: RESUME ignored, the transaction is still \
             stalled"
        );
    }

    #[test]
    fn a_missing_or_reordered_phase_fails() {
        let config = ScenarioConfig::DEFAULT;
        let v = verdict(&config, &Ok(report(&Phase::ALL[..6])));
        assert_eq!(text(&v), (Outcome::Fail, "6 of 7 phases reported".into()));
        let mut swapped = Phase::ALL;
        swapped.swap(0, 1);
        let v = verdict(&config, &Ok(report(&swapped)));
        assert_eq!(v.outcome, Outcome::Fail);
    }

    #[test]
    fn a_broken_phase_invariant_fails_even_if_the_scenario_returned() {
        let config = ScenarioConfig::DEFAULT;
        let mut r = report(&Phase::ALL);
        // A major fault that was resumed (held the stall): never allowed.
        r.phases[1].counters.resumes = 1;
        r.phases[1].counters.resumed_major = 1;
        let (outcome, msg) = text(&verdict(&config, &Ok(r)));
        assert_eq!(outcome, Outcome::Fail);
        assert!(msg.starts_with("BoardError code 14: "), "{msg}");
    }

    #[test]
    fn no_fault_means_no_pass() {
        // MultiStall's invariant holds without faults (both channels complete, nothing
        // retransmitted), so only the faults > 0 rule can catch a run that never faulted.
        static ONLY: [Phase; 1] = [Phase::MultiStall];
        let config = ScenarioConfig {
            phases: &ONLY,
            ..ScenarioConfig::DEFAULT
        };
        let mut r = report(&ONLY);
        r.phases[0].counters = Counters {
            transfers: 2,
            ..Counters::default()
        };
        r.phases[0].check().unwrap();
        let v = verdict(&config, &Ok(r));
        assert_eq!(
            text(&v),
            (
                Outcome::Fail,
                "the fault path was not exercised: 0 faults, 2 transfers".into()
            )
        );
    }

    #[test]
    fn report_lines_name_every_phase_and_counter() {
        let out: String = report_lines(&report(&Phase::ALL))
            .map(|line| format!("{line}\n"))
            .collect();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 7);
        assert!(
            lines[0].starts_with("phase minor-stall-resume "),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("transfers 2 (100 bytes), faults 4, resumes 4, retransmissions 0"),
            "{}",
            lines[0]
        );
        assert!(lines[5].contains("aborts 2"), "{}", lines[5]);
        assert!(lines[6].contains("evictions 1"), "{}", lines[6]);
    }
}
