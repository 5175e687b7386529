//! The soak's configurations and its link-error injector, shared by `nprdma soak` and the
//! tests that check what it shows.
//!
//! Three configurations, all with the hybrid policy, background reclaim at the fault rate and
//! the application posting past the driver's window ([`SimConfig::overpost`]: queue-overflow
//! pressure that must turn into back-pressure, never loss): one QFDB (four nodes,
//! all-to-all) and two QFDBs in a ring (eight nodes) with the soak's transfer size, and an
//! incast onto one node with 32 KiB transfers, where the three senders keep more blocks in
//! flight (3 x 8 x 8) than the receiver has receive slots (64), which free only as its write
//! engine writes them out: the receive ingress fills and holds arriving traffic
//! (`GEVENT.RX_HELD`), which
//! must turn into back-pressure into the network, never loss. (With 4 KiB transfers at most
//! 3 x 8 blocks are in flight, fewer than the slots.) It runs an eighth as many transfers as
//! the others (as many blocks as 4 KiB ones).
//!
//! Link errors go in through the frame seam ([`super::Seams::frames`]): a frame is dropped,
//! or corrupted with the footer CRC failing (`Frame::crc_error`: the receiving engine drops
//! the block, `GEVENT.CRC_DROP`; a protocol message fails its own CRC-32C in the driver),
//! or, for tests of the last line of defence, corrupted so that the CRC still matches (a
//! collision no check before the application's byte check can see).

use super::{MemoryLimit, RunReport, Seams, SimConfig, Strategy, VqResult, Workload};
use crate::des::SplitMix64;
use crate::npe::{Frame, InlineMsg};

/// Probabilities, per frame, of each kind of link error.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkErrors {
    /// Dropped on the wire.
    pub drop: f64,
    /// Corrupted, and the CRC sees it.
    pub corrupt: f64,
    /// A data packet corrupted so that its CRC still matches (tests only: real links make
    /// this vanishingly rare, which is exactly why the byte check is there).
    pub undetected: f64,
}

/// What one run injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    /// Frames sent.
    pub frames: u64,
    /// Dropped.
    pub dropped: u64,
    /// Data packets corrupted, CRC failing.
    pub corrupted_blocks: u64,
    /// Protocol messages corrupted (their CRC-32C fails).
    pub corrupted_messages: u64,
    /// Data packets corrupted with the CRC matching.
    pub undetected_blocks: u64,
}

/// One soak configuration: its label and its run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// What it is.
    pub label: &'static str,
    /// The run.
    pub cfg: SimConfig,
}

fn config(
    nodes: usize,
    workload: Workload,
    size: u32,
    transfers: u64,
    fault_rate: f64,
    seed: u64,
) -> SimConfig {
    SimConfig {
        nodes,
        workload,
        strategy: Strategy::Hybrid,
        fault_rate,
        // Every slot may be in flight or waiting to be posted again, so every page is in the
        // working set: the limit is the footprint, and background reclaim (the fault rate)
        // does the paging out, to swap after the write-back age.
        memory_limit: MemoryLimit::Fraction(1.0),
        seed,
        transfers,
        transfer_size: size,
        depth: 8,
        slots: 16,
        overpost: true,
        keep_samples: false,
        ..SimConfig::default()
    }
}

/// The incast configuration's transfer size.
pub const INCAST_SIZE: u32 = 32 * 1024;

/// The soak's configurations for `transfers` transfers of `size` bytes (the incast one: an
/// eighth as many, of [`INCAST_SIZE`]).
pub fn configurations(transfers: u64, size: u32, fault_rate: f64, seed: u64) -> [SoakConfig; 3] {
    [
        SoakConfig {
            label: "one QFDB, 4 nodes all-to-all",
            cfg: config(4, Workload::AllToAll, size, transfers, fault_rate, seed),
        },
        SoakConfig {
            label: "two QFDBs, 8 nodes in a ring",
            cfg: config(8, Workload::Ring, size, transfers, fault_rate, seed),
        },
        SoakConfig {
            label: "incast, 3 nodes into 1, 32 KiB",
            cfg: config(
                4,
                Workload::Incast,
                INCAST_SIZE,
                transfers.div_ceil(8),
                fault_rate,
                seed,
            ),
        },
    ]
}

/// Flips one bit of `bytes` chosen by `at`.
fn flip(bytes: &mut [u8], at: u64) {
    if bytes.is_empty() {
        return;
    }
    let i = (at % bytes.len() as u64) as usize;
    if let Some(b) = bytes.get_mut(i) {
        *b ^= 1 << (at >> 61);
    }
}

/// Applies `errors` to one frame (random choices from `rng`); returns what goes on the wire.
pub fn inject(
    frame: Frame,
    errors: &LinkErrors,
    rng: &mut SplitMix64,
    injected: &mut Injected,
) -> Vec<Frame> {
    let mut frame = frame;
    injected.frames += 1;
    let x = rng.next_f64();
    if x < errors.drop {
        injected.dropped += 1;
        return Vec::new();
    }
    let data = frame.payload.as_ref().is_some_and(|p| !p.is_empty());
    if x < errors.drop + errors.corrupt {
        let at = rng.next_u64();
        if data {
            if let Some(payload) = frame.payload.as_mut() {
                flip(payload, at);
            }
            // The footer CRC no longer matches what was sent.
            frame.crc_error = true;
            injected.corrupted_blocks += 1;
        } else {
            let mut bytes = frame.msg.as_bytes().to_vec();
            flip(&mut bytes, at);
            if let Ok(msg) = InlineMsg::new(&bytes) {
                frame.msg = msg;
            }
            injected.corrupted_messages += 1;
        }
    } else if data && x < errors.drop + errors.corrupt + errors.undetected {
        let at = rng.next_u64();
        if let Some(payload) = frame.payload.as_mut() {
            flip(payload, at);
        }
        injected.undetected_blocks += 1;
    }
    vec![frame]
}

/// Runs one soak configuration with `errors` injected (the choices seeded from the run's
/// seed and node count, so a run is reproduced by its seed).
pub fn run(
    cfg: &SimConfig,
    errors: &LinkErrors,
    progress: &mut dyn FnMut(u64, u64),
) -> (VqResult<RunReport>, Injected) {
    let mut injected = Injected::default();
    let mut rng = SplitMix64::derive(cfg.seed ^ 0x50A6, cfg.nodes as u64);
    let result = {
        let seams = Seams {
            frames: Some(Box::new(|frame| {
                inject(frame, errors, &mut rng, &mut injected)
            })),
            ..Seams::default()
        };
        super::run_with_seams(cfg, progress, seams)
    };
    (result, injected)
}
