//! The portable part of the `zynqmp-smmu-faults` program: its report lines and its verdict.
//!
//! The program runs `boards::zynqmp::scenario::run` on the ZynqMP's MMU-500 and GDMA channels
//! 0 and 1 (stream IDs 0x14E8/0x14E9) through MMIO; the same scenario runs against the `sim`
//! models on the host (`sim/tests/scenarios.rs`). This module turns its result into console
//! lines and the one verdict line, and is tested on the host.
//!
//! PASS needs all of:
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
use boards::zynqmp::scenario::{PhaseReport, ScenarioConfig, ScenarioReport};

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
        "{} phases: {} transfers exact ({} bytes), {} faults, {} resumes, {} retransmissions, \
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
    use boards::zynqmp::scenario::{Counters, Phase, PhaseReport};
    use smmu_driver::SmmuError;

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
                resumes: 2,
                retransmissions: 2,
                suspect_resends: 2,
                multi: 1,
                ..c
            },
            Phase::MultiTerminate => Counters {
                transfers: 2,
                faults: 1,
                retransmissions: 2,
                suspect_resends: 1,
                multi: 1,
                prefaulted: 1,
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

    fn report(phases: &[Phase]) -> ScenarioReport {
        let mut r = ScenarioReport::default();
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
        // 2+1+1+2+2+0+2 transfers, 4+4+2+2+1+2+1 faults, 4+2 resumes, 4+2+2+2+1
        // retransmissions, 2 aborts, 2 MULTI.
        assert_eq!(
            text(&v),
            (
                Outcome::Pass,
                "7 phases: 10 transfers exact (111 bytes), 16 faults, 6 resumes, 11 \
                 retransmissions, 2 aborts, 2 MULTI"
                    .into()
            )
        );
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
