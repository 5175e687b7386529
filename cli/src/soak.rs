//! `nprdma soak`: a long run that must lose nothing.
//!
//! Three configurations run side by side (`sim::vqfdb::soak`): one QFDB (four nodes,
//! all-to-all) and two QFDBs in a ring (eight nodes) with `--transfers` transfers each, and an
//! incast with an eighth as many 32 KiB transfers whose receiver runs out of receive slots
//! (`RX_HELD`), all with the hybrid policy, background reclaim taking pages away
//! (`--fault-rate`), the application posting past the driver's window (`QueueFull`
//! back-pressure), and link errors injected on the wire: packets dropped, and packets
//! corrupted. A corrupted data packet fails the ExaNet footer CRC at the receiving engine,
//! which drops the block (`GEVENT.CRC_DROP`); a corrupted protocol message fails the message's
//! own CRC-32C in the driver. Either way the protocol's time-outs and re-sends must repair it.
//! Every byte is verified, every completion and delivery matched against the transfers
//! posted; the lost, duplicated, reordered and corrupted transfers the checks count are
//! printed, and any of them fails the run.
//!
//! Prints throughput in transfers per second of host (wall) time and the simulator's peak
//! resident memory (`VmHWM` in `/proc/self/status`); targets are printed, never asserted.

use std::time::Instant;

use indicatif::MultiProgress;
use serde_json::json;
use sim::vqfdb::soak::{self, Injected, LinkErrors};

use crate::{CliError, SoakArgs, knobs, output};

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
    let errors = LinkErrors {
        drop: args.drop_rate,
        corrupt: args.corrupt_rate,
        undetected: 0.0,
    };
    let runs = soak::configurations(args.transfers, size, args.fault_rate, args.seed);
    println!(
        "nprdma soak: {} transfers of {} bytes on each of {} configurations ({} of {} bytes on \
         the incast), hybrid policy, {:.2}% faulting pages, {:.3}% of frames dropped and \
         {:.3}% corrupted on the wire",
        args.transfers,
        size,
        runs.len() - 1,
        runs[2].cfg.transfers,
        runs[2].cfg.transfer_size,
        args.fault_rate * 100.0,
        args.drop_rate * 100.0,
        args.corrupt_rate * 100.0
    );
    let wall = Instant::now();
    let multi = MultiProgress::new();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = runs
            .iter()
            .map(|run| {
                let bar = output::multi_bar(&multi, run.label, run.cfg.transfers);
                let errors = &errors;
                s.spawn(move || {
                    let started = Instant::now();
                    let (r, injected) = soak::run(&run.cfg, errors, &mut |done, total| {
                        bar.set_length(total);
                        bar.set_position(done);
                    });
                    bar.finish_and_clear();
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
    for (run, (result, injected, secs)) in runs.iter().zip(results) {
        println!();
        println!("{}:", run.label);
        println!(
            "  injected: {} frames dropped, {} data packets and {} protocol messages corrupted, of {} frames",
            injected.dropped,
            injected.corrupted_blocks,
            injected.corrupted_messages,
            injected.frames
        );
        let counts = match &result {
            Ok(r) => Some(r.integrity),
            Err(sim::SimError::Integrity(i)) => Some(*i),
            Err(_) => None,
        };
        if let Some(i) = counts {
            println!(
                "  checked: {} transfers; lost {}, duplicated {}, reordered {}, corrupted {} (counted at every completion and delivery, every byte compared)",
                run.cfg.transfers, i.lost, i.duplicated, i.reordered, i.corrupted
            );
        }
        match result {
            Ok(r) => {
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
                j["label"] = json!(run.label);
                j["wall_time_s"] = json!(secs);
                j["transfers_per_host_second"] = json!(r.transfers as f64 / secs.max(1e-9));
                j["injected"] = json!({"frames": injected.frames, "dropped": injected.dropped,
                    "corrupted_data_packets": injected.corrupted_blocks,
                    "corrupted_messages": injected.corrupted_messages});
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
    let total: u64 = runs.iter().map(|r| r.cfg.transfers).sum();
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
