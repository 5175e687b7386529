//! The engine model's register map (docs/dma-engine.md §3): reads, writes, doorbells.

use super::*;

impl NpeModel {
    pub(super) fn channel_of(offset: usize) -> Option<(usize, usize)> {
        let rel = offset.checked_sub(CHANNEL_BASE)?;
        Some((rel / CHANNEL_STRIDE, rel % CHANNEL_STRIDE))
    }

    /// A producer-index write: refused (BAD_DOORBELL) if it would pass the consumer by more
    /// than the ring size.
    pub(super) fn doorbell(
        ring: &mut RingRegs,
        value: u32,
        gevent: &mut u32,
        stats: &mut EngineStats,
    ) {
        if value.wrapping_sub(ring.head) > ring.size() {
            *gevent |= GEVENT_BAD_DOORBELL;
            stats.bad_doorbells += 1;
        } else {
            ring.tail = value;
        }
    }

    /// A consumer-index write: refused if it would pass the producer.
    pub(super) fn consume(
        ring: &mut RingRegs,
        value: u32,
        gevent: &mut u32,
        stats: &mut EngineStats,
    ) {
        if value.wrapping_sub(ring.head) > ring.used() {
            *gevent |= GEVENT_BAD_DOORBELL;
            stats.bad_doorbells += 1;
        } else {
            ring.head = value;
        }
    }
}

fn low32(v: u64) -> u32 {
    v as u32
}

/// Largest log2 ring sizes the engine implements (CAPS, §3.1): SQ and CQ, then RQ, WQ and
/// WCQ. A larger value reads back as the largest.
const MAX_CHANNEL_RING_LOG2: u8 = 6;
const MAX_ENGINE_RING_LOG2: u8 = 8;

fn ring_log2(v: u64, max: u8) -> u8 {
    ((v & 0x1f) as u8).min(max)
}

impl RegisterModel for NpeModel {
    fn size(&self) -> usize {
        WINDOW_SIZE
    }

    fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
        if let Some((n, reg)) = Self::channel_of(offset) {
            let Some(c) = self.channels.get(n) else {
                return 0;
            };
            return match reg {
                0x00 => c.sq.base,
                0x08 => u64::from(c.sq.log2),
                0x0c => u64::from(c.sq.tail),
                0x10 => u64::from(c.sq.head),
                0x18 => c.cq.base,
                0x20 => u64::from(c.cq.log2),
                0x24 => u64::from(c.cq.head),
                0x28 => u64::from(c.cq.tail),
                0x2c => {
                    u64::from(u32::from(c.en) | u32::from(c.irq_en) << 1 | u32::from(c.pdid) << 16)
                }
                0x30 => {
                    let pending = c.sq.used().min(0xffff);
                    u64::from(c.state().code() | u32::from(c.last_error) << 8 | pending << 16)
                }
                0x34 => u64::from(c.irq),
                0x38 => c.fault_addr,
                0x40 => u64::from(c.fault_index),
                0x44 if c.fault_valid => u64::from(c.fault_resp) | 1 << 3,
                0x44 => 0,
                _ => 0,
            };
        }
        let caps = u32::from(self.params.channels)
            | u32::from(self.params.rx_slots_log2) << 12
            | u32::from(MAX_CHANNEL_RING_LOG2) << 16
            | u32::from(MAX_ENGINE_RING_LOG2) << 20
            | 1 << 24;
        match offset {
            0x000 => u64::from(MAGIC << 8 | VERSION),
            0x004 => u64::from(caps),
            0x008 => u64::from(self.node_reg),
            0x00c => u64::from(u32::from(self.enabled) | u32::from(self.irq_enabled) << 2),
            0x010 => u64::from(self.irq_status()),
            0x014 => u64::from(self.gevent),
            0x020 => self.rq.base,
            0x028 => u64::from(self.rq.log2),
            0x02c => u64::from(self.rq.head),
            0x030 => u64::from(self.rq.tail),
            0x038 => self.wq.base,
            0x040 => u64::from(self.wq.log2),
            0x044 => u64::from(self.wq.tail),
            0x048 => u64::from(self.wq.head),
            0x050 => self.wcq.base,
            0x058 => u64::from(self.wcq.log2),
            0x05c => u64::from(self.wcq.head),
            0x060 => u64::from(self.wcq.tail),
            0x064 => {
                let held = self.held().min(0xffff) as u32;
                u64::from(self.free_slots.len() as u32 | held << 16)
            }
            0x068 => u64::from(self.tx_count),
            0x06c => u64::from(self.rx_count),
            _ => 0,
        }
    }

    fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
        let v = low32(value);
        // Descriptors must be published (dsb st) before a doorbell. Any other register write
        // between the barrier and the doorbell makes the barrier stale for this check.
        // A second doorbell of the same ring after one barrier publishes descriptors written
        // after that barrier: unordered too. (One barrier may cover doorbells of several
        // rings, as the driver rings them together.)
        let doorbell_bit = match Self::channel_of(offset) {
            Some((n, 0x0c)) if n < 32 => Some(1u64 << n),
            _ if offset == 0x044 => Some(WQ_DOORBELL_BIT),
            _ => None,
        };
        if let Some(bit) = doorbell_bit {
            if !self.barrier_seen || self.rung_since_barrier & bit != 0 {
                self.stats.unordered_doorbells += 1;
            }
            self.rung_since_barrier |= bit;
        } else {
            self.barrier_seen = false;
        }
        if let Some((n, reg)) = Self::channel_of(offset) {
            let (gevent, stats) = (&mut self.gevent, &mut self.stats);
            let Some(c) = self.channels.get_mut(n) else {
                return;
            };
            match reg {
                0x00 => c.sq.set_base(value, ALIGN_128),
                0x08 => c.sq.log2 = ring_log2(value, MAX_CHANNEL_RING_LOG2),
                0x0c => Self::doorbell(&mut c.sq, v, gevent, stats),
                0x18 => c.cq.set_base(value, ALIGN_32),
                0x20 => c.cq.log2 = ring_log2(value, MAX_CHANNEL_RING_LOG2),
                0x24 => Self::consume(&mut c.cq, v, gevent, stats),
                0x2c => {
                    c.en = v & 1 != 0;
                    c.irq_en = v & 2 != 0;
                    c.pdid = (v >> 16) as u16;
                }
                0x34 => c.irq &= !(v & 7),
                0x48 => {
                    let in_fault_wait = matches!(
                        c.job,
                        Some(Job {
                            phase: JobPhase::FaultWait,
                            ..
                        })
                    );
                    let retry = v & 1 != 0;
                    let skip = v & 2 != 0;
                    if in_fault_wait && retry != skip {
                        c.resume = Some(retry);
                    }
                }
                _ => {}
            }
            return;
        }
        match offset {
            0x008 => self.node_reg = v & 0x803f_ffff,
            0x00c => {
                if v & 2 != 0 {
                    self.soft_reset();
                } else {
                    self.enabled = v & 1 != 0;
                    self.irq_enabled = v & 4 != 0;
                }
            }
            0x014 => self.gevent &= !(v & GEVENT_ALL),
            0x020 => self.rq.set_base(value, ALIGN_128),
            0x028 => self.rq.log2 = ring_log2(value, MAX_ENGINE_RING_LOG2),
            0x02c => Self::consume(&mut self.rq, v, &mut self.gevent, &mut self.stats),
            0x038 => self.wq.set_base(value, ALIGN_32),
            0x040 => self.wq.log2 = ring_log2(value, MAX_ENGINE_RING_LOG2),
            0x044 => Self::doorbell(&mut self.wq, v, &mut self.gevent, &mut self.stats),
            0x050 => self.wcq.set_base(value, ALIGN_32),
            0x058 => self.wcq.log2 = ring_log2(value, MAX_ENGINE_RING_LOG2),
            0x05c => Self::consume(&mut self.wcq, v, &mut self.gevent, &mut self.stats),
            _ => {}
        }
    }

    fn barrier(&mut self, kind: hal::barrier::Barrier) {
        use hal::barrier::Barrier;
        if matches!(kind, Barrier::DsbSt | Barrier::DsbSy) {
            self.barrier_seen = true;
            self.rung_since_barrier = 0;
        }
    }
}
