//! `nprdma`: the virtual QFDB on the command line, and the server path's doctor.
//!
//! - `nprdma demo` runs all-to-all RDMA writes of unpinned buffers under memory pressure on one
//!   QFDB with every strategy (pin-all, pre-fault, stall-only, retransmit-only, hybrid), prints
//!   a table, and writes JSON and plots (latency CDF, throughput vs fault rate; SVG and PNG).
//! - `nprdma sim` runs one configuration with every knob exposed.
//! - `nprdma doctor` reports what `libnprdma.so` (docs/connectx.md) does in this environment
//!   and in running processes that preload it.
//!
//! In `demo` and `sim`, every transferred byte is checked against a checksum of what was sent;
//! a run whose data does not verify, or that loses or duplicates a transfer, makes the command
//! fail with a non-zero exit status. Times printed are **model time** (simulated), except the
//! one line that says "wall time", which is the host's.

mod demo;
mod doctor;
mod knobs;
mod output;
mod plot;
mod soak;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sim::SimError;

/// Unpinned-memory RDMA: the virtual QFDB (model time; docs/virtual-qfdb.md) and the
/// server-path library's doctor.
#[derive(Parser, Debug)]
#[command(name = "nprdma", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the default workload under every strategy; print a table, write JSON and plots.
    Demo(DemoArgs),
    /// Run one configuration of the virtual QFDB.
    Sim(Box<SimArgs>),
    /// A long run that must lose nothing: a million transfers (by default) on one QFDB and on
    /// two QFDBs in a ring, with page-outs, link errors and queue pressure; every byte checked.
    Soak(SoakArgs),
    /// Report what the server-path library (libnprdma.so) does: mode, budget, pinned vs
    /// registered bytes, and why it steps aside.
    Doctor(DoctorArgs),
}

/// Options of `nprdma doctor`.
#[derive(clap::Args, Debug)]
struct DoctorArgs {
    /// Remove the status files that processes which have exited left behind.
    #[arg(long)]
    clean: bool,
}

/// Options of `nprdma demo`.
#[derive(clap::Args, Debug)]
struct DemoArgs {
    /// Where to write demo.json and the plots.
    #[arg(long, default_value = "target/nprdma-demo")]
    out: PathBuf,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Transfers per run of the main table and the latency tables.
    #[arg(long, default_value_t = sim::vqfdb::scenarios::DEMO_TRANSFERS)]
    transfers: u64,
    /// Transfers per run of the fault-rate sweep and the scenarios.
    #[arg(long, default_value_t = sim::vqfdb::scenarios::DEMO_TRANSFERS)]
    sweep_transfers: u64,
    /// Worker threads (default: the host's cores).
    #[arg(long)]
    jobs: Option<usize>,
}

/// Options of `nprdma soak`.
#[derive(clap::Args, Debug)]
struct SoakArgs {
    /// Transfers per configuration.
    #[arg(long, default_value_t = 1_000_000)]
    transfers: u64,
    /// Seed of every random choice (page-outs, link errors).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes per transfer.
    #[arg(long, default_value = "4KiB")]
    size: String,
    /// Probability that reclaim takes a page of a transfer away before the engine uses it.
    #[arg(long, default_value_t = 0.01)]
    fault_rate: f64,
    /// Probability that a frame is dropped on the wire.
    #[arg(long, default_value_t = 0.0005)]
    drop_rate: f64,
    /// Probability that a frame is corrupted on the wire.
    #[arg(long, default_value_t = 0.0005)]
    corrupt_rate: f64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Options of `nprdma sim`.
#[derive(clap::Args, Debug)]
struct SimArgs {
    /// Nodes: four per QFDB, QFDBs in a ring.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Workload: all-to-all, ring or incast.
    #[arg(long, default_value = "all-to-all")]
    workload: String,
    /// Strategy: pin-all, pre-fault, stall-only, retransmit-only or hybrid.
    #[arg(long, default_value = "hybrid")]
    strategy: String,
    /// Probability that reclaim takes a page of a transfer away before the engine uses it.
    #[arg(long, default_value_t = 0.01)]
    fault_rate: f64,
    /// Memory limit per node: a share of its buffer footprint ("50%") or a size ("4MiB"); at or
    /// above the footprint it puts no pressure on the node.
    #[arg(long, default_value = "50%")]
    memory_limit: String,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Transfers in total.
    #[arg(long, default_value_t = 10_000)]
    transfers: u64,
    /// Bytes per transfer ("16KiB", at most 128KiB).
    #[arg(long, default_value = "16KiB")]
    size: String,
    /// Transfers in flight per node pair.
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// Buffer slots per node pair and direction (at least --depth, at most 1024).
    #[arg(long, default_value_t = 16)]
    slots: usize,
    /// SMMU model: mmu500 (register-accurate, with the SMMUv2 driver) or walker (stand-in).
    #[arg(long, default_value = "mmu500")]
    smmu: String,
    /// Latency of one link hop in model µs (default 1.1, ExaNet; docs/virtual-qfdb.md).
    #[arg(long)]
    hop_latency_us: Option<f64>,
    /// Line rate of one link direction in Gb/s (default 32, ExaNet).
    #[arg(long)]
    link_gbps: Option<f64>,
    /// Latency of one swap-device request in model µs (default 50, our assumption).
    #[arg(long)]
    swap_latency_us: Option<f64>,
    /// Swap-device transfer rate in GB/s (default 2, our assumption).
    #[arg(long)]
    swap_gbytes: Option<f64>,
    /// Open loop: transfers arrive at this offered load (payload Gb/s over all pairs, model
    /// time); without it, the closed loop (each pair issues as soon as its window has room).
    #[arg(long)]
    offered_load: Option<f64>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Sim(args) => run_sim(&args),
        Command::Soak(args) => soak::run(&args),
        Command::Doctor(args) => {
            doctor::run(args.clean);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Why a command failed: one line for the user, and an exit status.
#[derive(Debug)]
enum CliError {
    /// A run of the simulator failed.
    Sim(SimError),
    /// Writing output failed.
    Output(String),
    /// The runs went through, but a claim the output makes does not hold (the hybrid policy
    /// lost, or a faulting median fell below the fault-free one).
    Claim(String),
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Sim(e) => write!(f, "{e}"),
            CliError::Output(e) => write!(f, "{e}"),
            CliError::Claim(e) => write!(f, "{e}"),
        }
    }
}

impl CliError {
    /// 2: bad arguments; 3: data did not verify; 4: a transfer was lost, duplicated or
    /// reordered; 5: a claim of the demo does not hold; 1: anything else.
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Sim(SimError::Config(_)) => 2,
            CliError::Sim(SimError::Verification(_)) => 3,
            CliError::Sim(SimError::Accounting(_)) => 4,
            CliError::Sim(SimError::Integrity(i)) if i.corrupted > 0 => 3,
            CliError::Sim(SimError::Integrity(_)) => 4,
            CliError::Claim(_) => 5,
            _ => 1,
        }
    }
}

impl From<SimError> for CliError {
    fn from(e: SimError) -> Self {
        CliError::Sim(e)
    }
}

fn run_sim(args: &SimArgs) -> Result<(), CliError> {
    let cfg = knobs::sim_config(args)?;
    let wall = std::time::Instant::now();
    let bar = output::progress_bar(
        &format!("{} (seed {})", cfg.strategy.name(), cfg.seed),
        cfg.transfers,
    );
    let report = sim::vqfdb::run(&cfg, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report?;
    let wall = wall.elapsed();
    println!("{}", output::table(&[&report], None));
    println!("{}", output::details(&report));
    print!("{}", output::latency_classes(&report));
    println!("{}", output::decisions(&report));
    println!(
        "verified: {} transfers, {} bytes, every byte checked; none lost, duplicated or reordered",
        report.transfers, report.bytes
    );
    println!(
        "wall time: {:.2} s (host, not model time)",
        wall.as_secs_f64()
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "time_unit": "model µs (simulated time) unless a key says wall",
            "wall_time_s": wall.as_secs_f64(),
            "report": output::report_json(&report),
        });
        output::write_json(path, &json)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_distinct_exit_codes() {
        let code = |e: SimError| CliError::Sim(e).exit_code();
        assert_eq!(code(SimError::Config("x".into())), 2);
        assert_eq!(code(SimError::Verification("x".into())), 3);
        assert_eq!(code(SimError::Accounting("x".into())), 4);
        assert_eq!(code(SimError::Internal("x".into())), 1);
        assert_eq!(CliError::Output("x".into()).exit_code(), 1);
        assert_eq!(CliError::Claim("x".into()).exit_code(), 5);
    }
}
