//! Whole runs of the virtual QFDB: determinism, every strategy delivering every byte, the
//! properties each strategy is defined by, larger rings, and clear configuration errors.

use sim::vqfdb::{MemoryLimit, SimConfig, SimError, Strategy, Workload, run, run_with_hook};

fn small(strategy: Strategy, seed: u64) -> SimConfig {
    SimConfig {
        nodes: 4,
        strategy,
        fault_rate: 0.05,
        memory_limit: MemoryLimit::Fraction(0.25),
        seed,
        transfers: 96,
        transfer_size: 16 * 1024,
        depth: 2,
        slots: 8,
        ..SimConfig::default()
    }
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    let a = run(&small(Strategy::Hybrid, 3), &mut |_, _| {}).unwrap();
    let b = run(&small(Strategy::Hybrid, 3), &mut |_, _| {}).unwrap();
    assert_eq!(a, b);
    let c = run(&small(Strategy::Hybrid, 4), &mut |_, _| {}).unwrap();
    assert_ne!(
        (a.duration, a.minor_faults, a.major_faults, a.events),
        (c.duration, c.minor_faults, c.major_faults, c.events)
    );
}

#[test]
fn every_strategy_moves_every_byte_and_behaves_as_defined() {
    for strategy in Strategy::ALL.into_iter().chain([Strategy::HybridFixed]) {
        let cfg = small(strategy, 11);
        let r = run(&cfg, &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", strategy.name()));
        assert_eq!(r.transfers, 96, "{}", strategy.name());
        assert_eq!(r.bytes, 96 * 16 * 1024, "{}", strategy.name());
        let faults = r.minor_faults + r.major_faults;
        match strategy {
            Strategy::PinAll => {
                assert_eq!(faults, 0);
                assert_eq!(
                    r.resident_peak, r.footprint,
                    "pinning keeps everything resident"
                );
                assert!(r.setup.0 > 0, "pinning takes time before the first post");
            }
            Strategy::RetransmitOnly => {
                assert!(faults > 0);
                assert_eq!(r.stalls, 0, "terminate-mode contexts never stall");
                assert!(r.retransmissions > 0);
            }
            Strategy::StallOnly => {
                assert!(r.stalls > 0);
                assert_eq!(r.terminations, 0, "every stalled fault is resumed");
                assert_eq!(r.source_faults, 0, "no source read is ever terminated");
            }
            Strategy::Hybrid => {
                // On one QFDB with two transfers in flight per pair, no stall pays: a re-sent
                // block costs a few µs, a stall of a minor fault holds the transfers behind
                // it for longer, so both streams are on terminate-mode contexts.
                assert_eq!(r.stalls, 0);
                assert!(r.retransmissions > 0);
                assert_eq!(r.terminations, faults);
            }
            Strategy::HybridFixed => {
                assert!(r.resumed > 0, "minor source faults are stalled and resumed");
                assert!(
                    r.terminations > 0,
                    "destination and major faults are terminated"
                );
            }
            Strategy::PreFault => {
                assert!(
                    r.cpu_faults > 0,
                    "the CPU takes the source faults before posting"
                );
            }
        }
        if strategy != Strategy::PinAll {
            // The limit bounds frames (resident and inactive) per node, so resident memory
            // over all nodes stays under the nodes' limits added up.
            assert!(
                r.resident_peak <= r.memory_limit_total,
                "{}: {} > {}",
                strategy.name(),
                r.resident_peak,
                r.memory_limit_total
            );
        }
    }
}

#[test]
fn two_qfdbs_in_a_ring_work() {
    let cfg = SimConfig {
        nodes: 8,
        workload: Workload::Ring,
        transfers: 64,
        ..small(Strategy::Hybrid, 5)
    };
    let r = run(&cfg, &mut |_, _| {}).unwrap();
    assert_eq!(r.transfers, 64);
    let incast = SimConfig {
        workload: Workload::Incast,
        ..cfg
    };
    assert_eq!(run(&incast, &mut |_, _| {}).unwrap().transfers, 64);
}

#[test]
fn bad_knobs_are_one_line_errors() {
    // Valid knobs whose buffers would need 60 GiB of host memory: refused up front.
    let huge = SimConfig {
        nodes: 16,
        slots: 1024,
        transfer_size: 128 * 1024,
        transfers: 10,
        ..SimConfig::default()
    };
    let e = run(&huge, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, SimError::Config(_)), "{e}");
    assert!(e.to_string().contains("of host memory"), "{e}");
    let one_node = SimConfig {
        nodes: 1,
        ..SimConfig::default()
    };
    let e = run(&one_node, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, SimError::Config(_)));
    assert_eq!(e.to_string(), "--nodes must be 2..=64 (got 1)");
    let big = SimConfig {
        transfer_size: 1 << 20,
        ..SimConfig::default()
    };
    assert!(matches!(
        run(&big, &mut |_, _| {}),
        Err(SimError::Config(_))
    ));
    // Slot counts that would overflow the buffer size, or be cut to 32 bits, are refused.
    for slots in [1025, 1 << 32, 1 << 60] {
        let many = SimConfig {
            slots,
            ..SimConfig::default()
        };
        let e = run(&many, &mut |_, _| {}).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--slots must be at most 1024 (got {slots})")
        );
    }
    let crowd = SimConfig {
        nodes: 20,
        ..SimConfig::default()
    };
    let e = run(&crowd, &mut |_, _| {}).unwrap_err();
    assert!(!e.to_string().contains('\n'));
    // Default: 4 nodes all-to-all = 6 buffers per node, depth 4, 64 KiB transfers: an
    // in-flight working set of 6 * 4 * 64 KiB = 1536 KiB. 1% of the footprint is far below it
    // and is refused up front (it used to end in an internal error mid-run).
    let starved = SimConfig {
        memory_limit: MemoryLimit::Fraction(0.01),
        ..SimConfig::default()
    };
    let e = run(&starved, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, SimError::Config(_)), "{e}");
    assert!(
        e.to_string().contains("in-flight working set of 1536 KiB"),
        "{e}"
    );
    let enough = SimConfig {
        memory_limit: MemoryLimit::Bytes(1536 * 1024),
        transfers: 64,
        ..SimConfig::default()
    };
    assert_eq!(run(&enough, &mut |_, _| {}).unwrap().transfers, 64);
}

#[test]
fn a_limit_above_the_footprint_reserves_nothing_more() {
    // 64 GiB per node is "no pressure", not memory to set aside (it used to be allocated as
    // simulated DRAM: 1 GiB took seconds and gigabytes, 64 GiB failed as exhausted memory).
    // It runs exactly as a limit of the whole footprint does.
    let with = |memory_limit| SimConfig {
        memory_limit,
        transfers: 64,
        ..SimConfig::default()
    };
    let whole = run(&with(MemoryLimit::Fraction(1.0)), &mut |_, _| {}).unwrap();
    assert_eq!(whole.memory_limit_total, whole.footprint);
    for limit in [MemoryLimit::Bytes(64 << 30), MemoryLimit::Fraction(1e300)] {
        let r = run(&with(limit), &mut |_, _| {}).unwrap();
        assert_eq!(r, whole);
    }
}

#[test]
fn an_asymmetric_workload_reports_its_largest_and_total_limits() {
    // Incast: node 0 receives from the three others, so its footprint (and its share of a
    // percentage limit) is three times theirs.
    let incast = SimConfig {
        workload: Workload::Incast,
        transfers: 96,
        ..SimConfig::default()
    };
    let r = run(&incast, &mut |_, _| {}).unwrap();
    assert_eq!(r.memory_limit_total, r.footprint / 2);
    assert_eq!(r.memory_limit * 2, r.memory_limit_total);
    assert!(r.resident_peak <= r.memory_limit_total);
}

#[test]
fn corrupted_data_fails_the_run_loudly() {
    // The protocol has no payload checksum of its own (the ExaNet footer CRC is the link's
    // job), so a byte flipped on the wire lands in memory; the run's check must catch it.
    let mut seen = 0;
    let mut flip = |mut frame: sim::npe::Frame| {
        if let Some(payload) = frame.payload.as_mut() {
            seen += 1;
            if seen == 10 {
                payload[100] ^= 1;
            }
        }
        vec![frame]
    };
    let e = run_with_hook(&small(Strategy::Hybrid, 1), &mut |_, _| {}, &mut flip).unwrap_err();
    let SimError::Integrity(counts) = e else {
        panic!("{e}")
    };
    // The one corrupted transfer is counted; nothing else went wrong.
    assert_eq!(
        counts,
        sim::Integrity {
            corrupted: 1,
            ..Default::default()
        }
    );
    assert!(
        e.to_string().starts_with(
            "TRANSFER INTEGRITY FAILED: 0 lost, 0 duplicated, 0 reordered, 1 corrupted"
        )
    );
    // Dropping frames is repaired by the protocol (time-outs and re-sends): nothing is lost.
    let mut n = 0;
    let mut drop_some = |frame: sim::npe::Frame| {
        n += 1;
        if n % 50 == 0 { Vec::new() } else { vec![frame] }
    };
    let r = run_with_hook(&small(Strategy::Hybrid, 1), &mut |_, _| {}, &mut drop_some).unwrap();
    assert_eq!(r.transfers, 96);
    assert!(r.retransmissions > 0);
    // A flipped byte the link's CRC catches (the footer CRC fails): the receiving engine
    // drops the block, the protocol re-sends it, and every byte arrives intact.
    let mut m = 0;
    let mut corrupt_some = |mut frame: sim::npe::Frame| {
        m += 1;
        if m % 40 == 0
            && let Some(payload) = frame.payload.as_mut()
        {
            payload[7] ^= 0x80;
            frame.crc_error = true;
        }
        vec![frame]
    };
    let r = run_with_hook(
        &small(Strategy::Hybrid, 1),
        &mut |_, _| {},
        &mut corrupt_some,
    )
    .unwrap();
    assert_eq!(r.transfers, 96);
    assert!(r.retransmissions > 0);
}

#[test]
fn set_up_swap_writes_do_not_delay_the_run() {
    // Many slots: set-up writes most of the footprint to swap before time starts. That I/O
    // must not occupy the swap device during the run, or every early major fault waits
    // behind it (before the fix, stall-only's worst latency was the set-up queue, and this
    // configuration aborted transfers for want of their source pages).
    let cfg = SimConfig {
        strategy: Strategy::Hybrid,
        slots: 256,
        transfer_size: 64 * 1024,
        transfers: 300,
        ..SimConfig::default()
    };
    let r = run(&cfg, &mut |_, _| {}).unwrap();
    assert_eq!(r.transfers, 300);
    assert!(
        r.swap_outs < 1000,
        "set-up's writes are not counted: {}",
        r.swap_outs
    );
}
