//! The ExaNet link model: bandwidth, per-hop latency and packet framing.
//!
//! Defaults are the ExaNet figures of INFN's APEnet table, 32 Gb/s and 1.1 µs
//! (the INFN APE group's APEnet page, ExaNet row). Treating 1.1 µs as the latency of one
//! hop and 32 Gb/s as the rate of each link direction is our modelling choice. Framing follows
//! docs/dma-engine.md §5.1: 128-bit flits, at most 256 payload bytes per packet, one header
//! and one footer flit per packet, and a 64-byte header area at the start of each block.
//! All times are model time.

use crate::des::ModelTime;

/// Bytes per flit (128 bits, ExaNet).
pub const FLIT: u64 = 16;
/// Most payload bytes per packet (one 16-beat AXI burst of 128-bit beats).
pub const PACKET_PAYLOAD: u64 = 256;
/// Header plus footer flit of each packet.
pub const PACKET_OVERHEAD: u64 = 2 * FLIT;
/// The block header area at the start of a block's first packet.
pub const HEADER_AREA: u64 = 64;

/// Link parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkParams {
    /// Line rate of one link direction in bits per second.
    pub bandwidth_bps: u64,
    /// Latency of one hop (model time).
    pub hop_latency: ModelTime,
}

impl Default for LinkParams {
    /// 32 Gb/s and 1.1 µs per hop (ExaNet, INFN's APEnet table).
    fn default() -> Self {
        Self {
            bandwidth_bps: 32_000_000_000,
            hop_latency: ModelTime::from_ns(1_100),
        }
    }
}

impl LinkParams {
    /// Time `bytes` occupy one link direction.
    pub fn serialization(&self, bytes: u64) -> ModelTime {
        ModelTime::transfer(bytes, self.bandwidth_bps)
    }
}

/// Bytes on the wire for a block of `payload` bytes: the header area and the payload cut
/// into packets of at most 256 bytes, each with a header and a footer flit.
pub fn block_wire_bytes(payload: u64) -> u64 {
    let body = HEADER_AREA + payload.div_ceil(FLIT) * FLIT;
    body + body.div_ceil(PACKET_PAYLOAD) * PACKET_OVERHEAD
}

/// Bytes on the wire for a protocol message of `len` bytes (one packet).
pub fn message_wire_bytes(len: u64) -> u64 {
    len.div_ceil(FLIT) * FLIT + PACKET_OVERHEAD
}

/// One link direction (or an engine's injection/ejection port): a FIFO server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Port {
    /// When the port can start the next transmission.
    pub free_at: ModelTime,
    /// Total time it was busy.
    pub busy: ModelTime,
    /// Bytes it carried.
    pub bytes: u64,
}

impl Port {
    /// Occupies the port for `duration` from the earliest moment at or after `ready`;
    /// returns the start.
    pub fn reserve(&mut self, ready: ModelTime, duration: ModelTime, bytes: u64) -> ModelTime {
        let start = ready.max(self.free_at);
        self.free_at = start.after(duration);
        self.busy = self.busy.after(duration);
        self.bytes += bytes;
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_block_costs_seventeen_packets_of_framing() {
        // 64 B header area + 4096 B = 4160 B = 16.25 packets -> 17 packets of 32 B overhead.
        assert_eq!(block_wire_bytes(4096), 4160 + 17 * 32);
        // A 56-byte message is 4 flits plus header and footer flits.
        assert_eq!(message_wire_bytes(56), 64 + 32);
        let link = LinkParams::default();
        // 4704 B * 8 / 32e9 b/s = 1.176 µs.
        assert_eq!(link.serialization(4704), ModelTime(1_176_000));
    }

    #[test]
    fn a_port_serves_in_fifo_order() {
        let mut p = Port::default();
        let d = ModelTime::from_ns(100);
        assert_eq!(
            p.reserve(ModelTime::from_ns(10), d, 1),
            ModelTime::from_ns(10)
        );
        // Ready earlier than the port is free: waits.
        assert_eq!(
            p.reserve(ModelTime::from_ns(20), d, 1),
            ModelTime::from_ns(110)
        );
        assert_eq!(p.free_at, ModelTime::from_ns(210));
        assert_eq!(p.busy, ModelTime::from_ns(200));
    }
}
