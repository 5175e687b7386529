//! `nprdma soak`: a long run that must lose nothing.
//!
//! Two configurations run side by side, each with `--transfers` transfers: one QFDB (four
//! nodes, all-to-all) and two QFDBs in a ring (eight nodes), both with the hybrid policy,
//! background reclaim taking pages away (`--fault-rate`), the full transfer window in flight
//! per pair (the receive slots run out, so the engines hold arriving traffic at their ingress:
//! queue-overflow pressure that must turn into back-pressure, never loss), and link errors
//! injected on the wire through the frame hook: packets dropped, and packets corrupted. A
//! corrupted data packet fails the ExaNet footer CRC at the receiving engine, which drops the
//! block (`GEVENT.CRC_DROP`); a corrupted protocol message fails the message's own CRC-32C in
//! the driver. Either way the protocol's time-outs and re-sends must repair it. Every byte is
//! verified, and a transfer completed or delivered twice or out of order fails the run.
//!
//! Prints throughput in transfers per second of host (wall) time and the simulator's peak
//! resident memory (`VmHWM` in `/proc/self/status`); targets are printed, never asserted.

use std::time::Instant;

use indicatif::MultiProgress;
use serde_json::json;
use sim::des::SplitMix64;
use sim::npe::Frame;
use sim::vqfdb::{MemoryLimit, RunReport, SimConfig, Strategy, Workload};

use crate::{CliError, SoakArgs, knobs, output};

/// Link errors one soak run injected.
#[derive(Clone, Copy, Debug, Default)]
struct Injected {
    frames: u64,
    dropped: u64,
    corrupted_blocks: u64,
    corrupted_messages: u64,
}

fn config(args: &SoakArgs, nodes: usize, workload: Workload, size: u32) -> SimConfig {
    SimConfig {
        nodes,
        workload,
        strategy: Strategy::Hybrid,
        fault_rate: args.fault_rate,
        // Every slot may be in flight or waiting to be posted again, so every page is in the
        // working set: the limit is the footprint, and background reclaim (the fault rate)
        // does the paging out, to swap after the write-back age.
        memory_limit: MemoryLimit::Fraction(1.0),
        seed: args.seed,
        transfers: args.transfers,
        transfer_size: size,
        depth: 8,
        slots: 16,
        overpost: true,
        keep_samples: false,
        ..SimConfig::default()
    }
}

/// One soak run with link errors injected at the configured rates.
fn soak_one(
    cfg: &SimConfig,
    args: &SoakArgs,
    bar: &indicatif::ProgressBar,
) -> (Result<RunReport, sim::SimError>, Injected) {
    let mut injected = Injected::default();
    let mut rng = SplitMix64::derive(cfg.seed ^ 0x50A6, cfg.nodes as u64);
    let (drop, corrupt) = (args.drop_rate, args.corrupt_rate);
    let mut hook = |mut frame: Frame| -> Vec<Frame> {
        injected.frames += 1;
        let x = rng.next_f64();
        if x < drop {
            injected.dropped += 1;
            return Vec::new();
        }
        if x < drop + corrupt {
            let at = rng.next_u64();
            if let Some(payload) = frame.payload.as_mut().filter(|p| !p.is_empty()) {
                let i = (at % payload.len() as u64) as usize;
                if let Some(b) = payload.get_mut(i) {
                    *b ^= 1 << (at >> 61);
                }
                // The footer CRC no longer matches what was sent.
                frame.crc_error = true;
                injected.corrupted_blocks += 1;
            } else {
                let mut bytes = frame.msg.as_bytes().to_vec();
                if !bytes.is_empty() {
                    let i = (at % bytes.len() as u64) as usize;
                    if let Some(b) = bytes.get_mut(i) {
                        *b ^= 1 << (at >> 61);
                    }
                }
                if let Ok(msg) = sim::npe::InlineMsg::new(&bytes) {
                    frame.msg = msg;
                }
                injected.corrupted_messages += 1;
            }
        }
        vec![frame]
    };
    let result = sim::vqfdb::run_with_hook(
        cfg,
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
        &mut hook,
    );
    bar.finish_and_clear();
    (result, injected)
}

/// The peak resident memory of this process in KiB (`VmHWM`), if the kernel reports it.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The soak.
pub fn run(args: &SoakArgs) -> Result<(), CliError> {
    let size = knobs::parse_size(&args.size)
        .and_then(|s| u32::try_from(s).ok())
        .ok_or_else(|| {
            CliError::Sim(sim::SimError::Config(format!(
                "--size must be a size like 4KiB (got {:?})",
                args.size
            )))
        })?;
    for (name, p) in [
        ("--drop-rate", args.drop_rate),
        ("--corrupt-rate", args.corrupt_rate),
    ] {
        if !(0.0..0.5).contains(&p) {
            return Err(CliError::Sim(sim::SimError::Config(format!(
                "{name} must be in [0, 0.5) (got {p})"
            ))));
        }
    }
    let runs = [
        (
            "one QFDB, 4 nodes all-to-all",
            config(args, 4, Workload::AllToAll, size),
        ),
        (
            "two QFDBs, 8 nodes in a ring",
            config(args, 8, Workload::Ring, size),
        ),
    ];
    println!(
        "nprdma soak: {} transfers of {} bytes on each of {} configurations, hybrid policy, \
         {:.2}% faulting pages, {:.3}% of frames dropped and {:.3}% corrupted on the wire",
        args.transfers,
        size,
        runs.len(),
        args.fault_rate * 100.0,
        args.drop_rate * 100.0,
        args.corrupt_rate * 100.0
    );
    let wall = Instant::now();
    let multi = MultiProgress::new();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = runs
            .iter()
            .map(|(label, cfg)| {
                let bar = output::multi_bar(&multi, label, cfg.transfers);
                s.spawn(move || {
                    let started = Instant::now();
                    let (r, injected) = soak_one(cfg, args, &bar);
                    (r, injected, started.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    (
                        Err(sim::SimError::Internal("a soak run panicked".into())),
                        Injected::default(),
                        0.0,
                    )
                })
            })
            .collect()
    });
    let wall_s = wall.elapsed().as_secs_f64();
    let mut json_runs = Vec::new();
    let mut failure = None;
    for ((label, cfg), (result, injected, secs)) in runs.iter().zip(results) {
        println!();
        println!("{label}:");
        println!(
            "  injected: {} frames dropped, {} data packets and {} protocol messages corrupted, of {} frames",
            injected.dropped,
            injected.corrupted_blocks,
            injected.corrupted_messages,
            injected.frames
        );
        match result {
            Ok(r) => {
                let lost = cfg.transfers - r.transfers;
                println!(
                    "  completions: {} of {} transfers verified byte for byte; lost {lost}, duplicated 0, reordered 0 (each checked at every completion and delivery: one would have failed the run)",
                    r.transfers, cfg.transfers
                );
                println!(
                    "  pressure: engines held arriving traffic {} times (RX_HELD, back-pressure into the network), the driver refused {} posts (QueueFull, each posted again); {} frames dropped by the engines' CRC check",
                    r.rx_held, r.back_pressure, r.crc_drops
                );
                println!(
                    "  repaired by the protocol: {} blocks re-sent, {} duplicate or stale messages dropped by the drivers; {} engine faults ({} minor, {} major)",
                    r.retransmissions,
                    r.dropped_messages,
                    r.minor_faults + r.major_faults,
                    r.minor_faults,
                    r.major_faults
                );
                println!(
                    "  latency (model µs from the intended issue time): p50 {:.1}, p99 {:.1}, p99.9 {:.1}; {}",
                    r.latency.p50,
                    r.latency.p99,
                    r.latency.p999,
                    output::decisions(&r)
                );
                println!(
                    "  host: {:.1} s, {:.0} transfers per second of host time",
                    secs,
                    r.transfers as f64 / secs.max(1e-9)
                );
                let mut j = output::report_json(&r);
                j["label"] = json!(label);
                j["wall_time_s"] = json!(secs);
                j["transfers_per_host_second"] = json!(r.transfers as f64 / secs.max(1e-9));
                j["injected"] = json!({"frames": injected.frames, "dropped": injected.dropped,
                    "corrupted_data_packets": injected.corrupted_blocks,
                    "corrupted_messages": injected.corrupted_messages});
                j["lost"] = json!(lost);
                j["duplicated"] = json!(0);
                j["reordered"] = json!(0);
                json_runs.push(j);
            }
            Err(e) => {
                println!("  FAILED: {e}");
                failure.get_or_insert(e);
            }
        }
    }
    let peak = peak_rss_kib();
    println!();
    let total: u64 = runs.iter().map(|(_, c)| c.transfers).sum();
    println!(
        "wall time: {wall_s:.1} s (host) for {total} transfers, {:.0} transfers per second of host time (target: 10^6 transfers per configuration in under 2 minutes)",
        total as f64 / wall_s.max(1e-9)
    );
    match peak {
        Some(kib) => println!(
            "peak resident memory of the simulator: {:.1} MiB (VmHWM; it does not grow with the number of transfers)",
            kib as f64 / 1024.0
        ),
        None => println!("peak resident memory: not reported by this kernel"),
    }
    if let Some(path) = &args.json {
        let value = json!({
            "time_unit": "model µs (simulated time) unless a key says wall or host",
            "wall_time_s": wall_s,
            "peak_resident_kib": peak,
            "runs": json_runs,
        });
        output::write_json(path, &value)?;
        println!("wrote {}", path.display());
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
