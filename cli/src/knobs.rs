//! Turning command-line strings into a simulator configuration, with one-line errors.

use sim::des::ModelTime;
use sim::vqfdb::{MemoryLimit, SimConfig, SimError, SmmuModel, Strategy, Workload};

use crate::{CliError, SimArgs};

/// Parses "16KiB", "4MiB", "1GiB", "512B" or a plain number of bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = number.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses "50%" (of the footprint) or a size.
pub fn parse_limit(text: &str) -> Option<MemoryLimit> {
    let t = text.trim();
    if let Some(pct) = t.strip_suffix('%') {
        let v: f64 = pct.trim().parse().ok()?;
        return (v > 0.0 && v.is_finite()).then_some(MemoryLimit::Fraction(v / 100.0));
    }
    parse_size(t).filter(|&b| b > 0).map(MemoryLimit::Bytes)
}

fn bad(msg: String) -> CliError {
    CliError::Sim(SimError::Config(msg))
}

/// The configuration `nprdma sim` asks for.
pub fn sim_config(args: &SimArgs) -> Result<SimConfig, CliError> {
    let strategy = Strategy::from_name(&args.strategy).ok_or_else(|| {
        bad(format!(
            "--strategy must be one of pin-all, pre-fault, stall-only, retransmit-only, hybrid, hybrid-fixed (got {:?})",
            args.strategy
        ))
    })?;
    let workload = Workload::from_name(&args.workload).ok_or_else(|| {
        bad(format!(
            "--workload must be one of all-to-all, ring, incast (got {:?})",
            args.workload
        ))
    })?;
    let memory_limit = parse_limit(&args.memory_limit).ok_or_else(|| {
        bad(format!(
            "--memory-limit must be a share like 50% or a size like 4MiB (got {:?})",
            args.memory_limit
        ))
    })?;
    let size = parse_size(&args.size)
        .and_then(|s| u32::try_from(s).ok())
        .ok_or_else(|| {
            bad(format!(
                "--size must be a size like 16KiB (got {:?})",
                args.size
            ))
        })?;
    let smmu = match args.smmu.as_str() {
        "mmu500" => SmmuModel::Mmu500,
        "walker" => SmmuModel::Walker,
        other => {
            return Err(bad(format!(
                "--smmu must be mmu500 or walker (got {other:?})"
            )));
        }
    };
    let defaults = SimConfig::default();
    let positive = |name: &str, v: Option<f64>| -> Result<Option<f64>, CliError> {
        match v {
            Some(x) if !(x > 0.0 && x.is_finite()) => {
                Err(bad(format!("--{name} must be positive (got {x})")))
            }
            other => Ok(other),
        }
    };
    let mut link = defaults.link;
    if let Some(us) = positive("hop-latency-us", args.hop_latency_us)? {
        link.hop_latency = ModelTime::from_us(us);
    }
    if let Some(g) = positive("link-gbps", args.link_gbps)? {
        link.bandwidth_bps = (g * 1e9) as u64;
    }
    let mut swap = defaults.swap;
    if let Some(us) = positive("swap-latency-us", args.swap_latency_us)? {
        swap.latency = ModelTime::from_us(us);
    }
    if let Some(g) = positive("swap-gbytes", args.swap_gbytes)? {
        swap.bandwidth_bps = (g * 8e9) as u64;
    }
    let offered_load_gbps = positive("offered-load", args.offered_load)?;
    Ok(SimConfig {
        offered_load_gbps,
        link,
        swap,
        smmu,
        nodes: args.nodes,
        workload,
        strategy,
        fault_rate: args.fault_rate,
        memory_limit,
        seed: args.seed,
        transfers: args.transfers,
        transfer_size: size,
        depth: args.depth,
        slots: args.slots,
        ..SimConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_limits_parse() {
        assert_eq!(parse_size("16KiB"), Some(16 * 1024));
        assert_eq!(parse_size("4MiB"), Some(4 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("3 parsecs"), None);
        assert_eq!(parse_limit("50%"), Some(MemoryLimit::Fraction(0.5)));
        assert_eq!(parse_limit("1MiB"), Some(MemoryLimit::Bytes(1 << 20)));
        assert_eq!(parse_limit("0%"), None);
        assert_eq!(parse_limit("-5%"), None);
    }
}
