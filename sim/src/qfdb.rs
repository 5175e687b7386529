//! QFDB topology and the fabric that carries frames between nodes.
//!
//! A QFDB holds four Zynq UltraScale+ MPSoCs joined by the intra-board (Tier-0) network;
//! QFDBs are connected into rings (the Track-1 mezzanine joins 4 QFDBs in a ring with
//! 2×16 Gb/s per edge and direction). Sources: the QFDB paper and INFN (docs/virtual-qfdb.md).
//!
//! Our modelling choices: within a QFDB every node reaches every other in one hop, and only the
//! nodes' injection and ejection ports are contended (a crossbar); between QFDBs a frame takes
//! the shorter way round the ring, each ring link direction being one more contended port and
//! one more hop. Data frames are cut through: each port on the path starts the frame no earlier
//! than the previous one did and no earlier than it is free. Control frames travel on their
//! own virtual channel and interleave at packet boundaries, so they wait at most one data
//! packet at each port and do not queue behind data (docs/dma-engine.md §5.1).

use crate::des::ModelTime;
use crate::link::{LinkParams, PACKET_OVERHEAD, PACKET_PAYLOAD, Port};
use crate::vqfdb::{SimError, VqResult as Result};

/// MPSoCs on one QFDB.
pub const NODES_PER_QFDB: usize = 4;
/// Most nodes a topology may have (ExaNet coordinates are 22 bits; we stop far earlier).
pub const MAX_NODES: usize = 64;

/// Which virtual channel a frame uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vc {
    /// Data blocks (VC 0).
    Data,
    /// Protocol messages (VC 1).
    Control,
}

/// `nodes` MPSoCs on `ceil(nodes / 4)` QFDBs joined in a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: usize,
}

impl Topology {
    /// A topology of `nodes` nodes (2..=64); nodes 0-3 are QFDB 0, 4-7 QFDB 1, and so on.
    pub fn new(nodes: usize) -> Result<Self> {
        if !(2..=MAX_NODES).contains(&nodes) {
            return Err(SimError::Config(format!(
                "--nodes must be 2..={MAX_NODES} (got {nodes})"
            )));
        }
        Ok(Self { nodes })
    }

    /// One QFDB: four nodes.
    pub fn one_qfdb() -> Self {
        Self {
            nodes: NODES_PER_QFDB,
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Number of QFDBs.
    pub fn qfdbs(&self) -> usize {
        self.nodes.div_ceil(NODES_PER_QFDB)
    }

    /// The QFDB of `node`.
    pub fn qfdb_of(&self, node: usize) -> usize {
        node / NODES_PER_QFDB
    }

    /// Ring links from `src`'s QFDB to `dst`'s, as (QFDB, clockwise) pairs naming the link
    /// leaving that QFDB in that direction.
    pub fn ring_path(&self, src: usize, dst: usize) -> Vec<(usize, bool)> {
        let q = self.qfdbs();
        let (a, b) = (self.qfdb_of(src), self.qfdb_of(dst));
        if a == b {
            return Vec::new();
        }
        let cw = (b + q - a) % q;
        let ccw = (a + q - b) % q;
        let (steps, clockwise) = if cw <= ccw { (cw, true) } else { (ccw, false) };
        let mut at = a;
        let mut path = Vec::with_capacity(steps);
        for _ in 0..steps {
            path.push((at, clockwise));
            at = if clockwise {
                (at + 1) % q
            } else {
                (at + q - 1) % q
            };
        }
        path
    }

    /// Hops from `src` to `dst`: one inside the QFDB plus one per ring link.
    pub fn hops(&self, src: usize, dst: usize) -> usize {
        1 + self.ring_path(src, dst).len()
    }
}

/// Per-port usage, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FabricStats {
    /// Data frames carried.
    pub data_frames: u64,
    /// Control frames carried.
    pub control_frames: u64,
    /// Bytes on the wire (all frames).
    pub wire_bytes: u64,
}

/// The ports of a topology and the rules for crossing them.
#[derive(Clone, Debug)]
pub struct Fabric {
    params: LinkParams,
    topology: Topology,
    inject: Vec<Port>,
    eject: Vec<Port>,
    /// Ring link leaving QFDB q clockwise at `2q`, counter-clockwise at `2q + 1`.
    ring: Vec<Port>,
    stats: FabricStats,
}

impl Fabric {
    /// Idle ports for `topology`.
    pub fn new(topology: Topology, params: LinkParams) -> Self {
        Self {
            params,
            topology,
            inject: vec![Port::default(); topology.nodes()],
            eject: vec![Port::default(); topology.nodes()],
            ring: vec![Port::default(); 2 * topology.qfdbs()],
            stats: FabricStats::default(),
        }
    }

    /// The link parameters.
    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Counters.
    pub fn stats(&self) -> &FabricStats {
        &self.stats
    }

    /// When `node`'s injection port can start a data frame.
    pub fn inject_free_at(&self, node: usize) -> ModelTime {
        self.inject.get(node).map_or(ModelTime::ZERO, |p| p.free_at)
    }

    /// Sends a frame of `wire_bytes` from `src` at `now`; returns when its last byte
    /// arrives at `dst`.
    pub fn send(
        &mut self,
        now: ModelTime,
        src: usize,
        dst: usize,
        wire_bytes: u64,
        vc: Vc,
    ) -> Result<ModelTime> {
        let n = self.topology.nodes();
        if src >= n || dst >= n || src == dst {
            return Err(SimError::Internal(format!(
                "no route from node {src} to {dst}"
            )));
        }
        let ser = self.params.serialization(wire_bytes);
        let hops = self.topology.hops(src, dst) as u64;
        let latency = ModelTime(self.params.hop_latency.0.saturating_mul(hops));
        self.stats.wire_bytes += wire_bytes;
        match vc {
            Vc::Control => {
                self.stats.control_frames += 1;
                // At most one data packet ahead of it per port (interleaving at packet
                // boundaries); not counted as occupying the ports.
                let packet = self.params.serialization(PACKET_PAYLOAD + PACKET_OVERHEAD);
                let waits = ModelTime(packet.0.saturating_mul(hops + 1));
                Ok(now.after(ser).after(waits).after(latency))
            }
            Vc::Data => {
                self.stats.data_frames += 1;
                let path = self.topology.ring_path(src, dst);
                let mut start = now;
                if let Some(p) = self.inject.get_mut(src) {
                    start = p.reserve(start, ser, wire_bytes);
                }
                for (q, clockwise) in path {
                    if let Some(p) = self.ring.get_mut(2 * q + usize::from(!clockwise)) {
                        start = p.reserve(start, ser, wire_bytes);
                    }
                }
                if let Some(p) = self.eject.get_mut(dst) {
                    start = p.reserve(start, ser, wire_bytes);
                }
                Ok(start.after(ser).after(latency))
            }
        }
    }

    /// Busy time of `node`'s injection port.
    pub fn inject_busy(&self, node: usize) -> ModelTime {
        self.inject.get(node).map_or(ModelTime::ZERO, |p| p.busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_qfdb_is_one_hop_everywhere() {
        let t = Topology::one_qfdb();
        assert_eq!(t.qfdbs(), 1);
        for a in 0..4 {
            for b in 0..4 {
                if a != b {
                    assert_eq!(t.hops(a, b), 1);
                }
            }
        }
    }

    #[test]
    fn rings_take_the_shorter_way() {
        let t = Topology::new(16).unwrap(); // 4 QFDBs
        assert_eq!(t.ring_path(0, 4), vec![(0, true)]);
        assert_eq!(t.ring_path(0, 12), vec![(0, false)]);
        assert_eq!(t.ring_path(1, 9), vec![(0, true), (1, true)]);
        assert_eq!(t.hops(1, 9), 3);
        assert!(Topology::new(1).is_err());
    }

    #[test]
    fn data_frames_queue_and_arrive_after_serialisation_and_latency() {
        let mut f = Fabric::new(Topology::one_qfdb(), LinkParams::default());
        let bytes = 4704; // 1.176 µs at 32 Gb/s
        let a = f.send(ModelTime::ZERO, 0, 1, bytes, Vc::Data).unwrap();
        assert_eq!(a, ModelTime::from_ns(1_176 + 1_100));
        // A second frame from the same node waits for the injection port.
        let b = f.send(ModelTime::ZERO, 0, 2, bytes, Vc::Data).unwrap();
        assert_eq!(b, ModelTime::from_ns(2 * 1_176 + 1_100));
        // Another node sending to node 1 waits for node 1's ejection port.
        let c = f.send(ModelTime::ZERO, 3, 1, bytes, Vc::Data).unwrap();
        assert_eq!(c, ModelTime::from_ns(2 * 1_176 + 1_100));
        // Control frames do not queue behind data.
        let d = f.send(ModelTime::ZERO, 0, 1, 96, Vc::Control).unwrap();
        assert!(d < ModelTime::from_ns(1_500), "{d}");
        assert!(f.send(ModelTime::ZERO, 0, 0, 1, Vc::Data).is_err());
    }
}
