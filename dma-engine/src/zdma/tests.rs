//! Unit tests against a small fake channel. The register-accurate zDMA model, with its
//! memory traffic going through the MMU-500 model, is in the `sim` crate.

use std::collections::HashMap;
use std::sync::Arc;

use hal::PhysAddr;
use hal::barrier::Barrier;
use hal::delay::NoDelay;
use hal::dma::{DmaDirection, DmaMemory, HostDma};
use hal::journal::{self, Event};
use hal::model::{ModelBus, RecordingBus, RegisterModel};
use hal::regs::AccessWidth;

use super::*;

/// What the fake does when CTRL2.EN is written.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Copy physically and raise DMA_DONE | DST_DSCR_DONE.
    Copy,
    /// Raise this ISR bit after `bytes` bytes.
    Fail { bit: u32, bytes: u32 },
    /// Never finish (a transaction held by the SMMU), reporting this STATUS.STATE code
    /// meanwhile: [`SILICON_BUSY`] or [`QEMU_BUSY`].
    Hold { state: u32 },
}

/// STATUS.STATE of a running channel on silicon (Xilinx's `XZDMA_STS_BUSY_MASK`).
const SILICON_BUSY: u32 = 2;
/// STATUS.STATE of a running channel in QEMU's `xlnx-zdma` (its `ENABLED`).
const QEMU_BUSY: u32 = 1;

struct FakeChannel {
    mem: Arc<HostDma>,
    words: HashMap<usize, u32>,
    isr: u32,
    imr: u32,
    /// STATUS.STATE.
    state: u32,
    total: u32,
    behaviour: Behaviour,
}

impl FakeChannel {
    fn new(mem: Arc<HostDma>, behaviour: Behaviour) -> Self {
        FakeChannel {
            mem,
            words: HashMap::new(),
            isr: 0,
            imr: 0xfff,
            state: 0,
            // TOTAL_BYTE is not cleared by the driver's start: a left-over count must not matter.
            total: 100,
            behaviour,
        }
    }
    fn word(&self, offset: usize) -> u32 {
        self.words.get(&offset).copied().unwrap_or(0)
    }
    fn run(&mut self) {
        let src = u64::from(self.word(0x128)) | u64::from(self.word(0x12c)) << 32;
        let dst = u64::from(self.word(0x138)) | u64::from(self.word(0x13c)) << 32;
        let len = self.word(0x130) & 0x3fff_ffff;
        match self.behaviour {
            Behaviour::Copy => {
                let mut buf = vec![0u8; len as usize];
                self.mem.read_phys(PhysAddr::new(src), &mut buf).unwrap();
                self.mem.write_phys(PhysAddr::new(dst), &buf).unwrap();
                self.total += len;
                self.isr |= (1 << 10) | (1 << 2);
            }
            Behaviour::Fail { bit, bytes } => {
                self.total += bytes;
                self.isr |= bit;
                // Done with an error: not a running channel, in either encoding.
                self.state = 3;
            }
            Behaviour::Hold { state } => self.state = state,
        }
    }
}

impl RegisterModel for FakeChannel {
    fn size(&self) -> usize {
        0x1000
    }
    fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
        u64::from(match offset {
            0x100 => self.isr,
            0x104 => self.imr,
            0x11c => self.state,
            0x188 => self.total,
            _ => self.word(offset),
        })
    }
    fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
        let v = value as u32;
        match offset {
            0x100 => self.isr &= !v,
            0x108 => self.imr &= !v,
            0x10c => self.imr |= v,
            0x188 => self.total &= !v,
            0x200 if v & 1 == 1 => self.run(),
            _ => {
                self.words.insert(offset, v);
            }
        }
    }
}

fn setup(behaviour: Behaviour) -> (Arc<HostDma>, ModelBus<FakeChannel>) {
    let mem = Arc::new(HostDma::new(PhysAddr::new(0x1_0000_0000), 16).unwrap());
    let bus = ModelBus::new(FakeChannel::new(mem.clone(), behaviour));
    (mem, bus)
}

#[test]
fn a_simple_mode_copy_is_programmed_and_acknowledged_as_documented() {
    let (mem, model) = setup(Behaviour::Copy);
    let src = mem.allocate(1, DmaDirection::ToDevice).unwrap();
    let dst = mem.allocate(1, DmaDirection::FromDevice).unwrap();
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    src.write_bytes(0, &data).unwrap();

    let bus = RecordingBus::new("zdma", &model);
    let mut ch = ZdmaChannel::new(&bus, NoDelay::default(), ZdmaConfig::DEFAULT).unwrap();
    ch.init().unwrap();
    journal::start();
    let done = ch
        .transfer(&Transfer {
            src: src.bus_addr().as_u64(),
            dst: dst.bus_addr().as_u64() + 8,
            len: 300,
        })
        .unwrap();
    let events = journal::stop();
    assert_eq!(done.bytes, 300);
    let mut out = vec![0u8; 300];
    dst.read_bytes(8, &mut out).unwrap();
    assert_eq!(out, data);

    let writes: Vec<(usize, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Write { offset, value, .. } => Some((*offset, *value)),
            _ => None,
        })
        .collect();
    // Source: address 0x1_0000_0000 split low/high, size, control 0; destination with INTR;
    // CTRL2.EN; then the acknowledgement of exactly DMA_DONE | DST_DSCR_DONE.
    assert_eq!(
        writes,
        vec![
            (0x128, 0),
            (0x12c, 1),
            (0x130, 300),
            (0x134, 0),
            (0x138, 0x1008),
            (0x13c, 1),
            (0x140, 300),
            (0x144, 0x4),
            (0x200, 1),
            (0x100, 0x404),
        ]
    );
    let barrier = events
        .iter()
        .position(|e| *e == Event::Barrier(Barrier::DsbSt))
        .unwrap();
    let enable = events
        .iter()
        .position(|e| matches!(e, Event::Write { offset: 0x200, .. }))
        .unwrap();
    assert!(barrier < enable, "store barrier before CTRL2.EN");
    assert_eq!(model.lock().isr, 0);
}

#[test]
fn init_masks_interrupts_and_selects_simple_mode() {
    let (_mem, model) = setup(Behaviour::Copy);
    model.lock().isr = 0x8;
    let mut ch = ZdmaChannel::new(&model, NoDelay::default(), ZdmaConfig::DEFAULT).unwrap();
    ch.init().unwrap();
    let m = model.lock();
    assert_eq!(m.imr, 0xfff);
    assert_eq!(m.isr, 0, "stale status cleared");
    assert_eq!(m.word(0x110), 0, "CTRL0: POINT_TYPE = 0, MODE = 0");
    drop(m);
    ch.set_interrupts(true).unwrap();
    assert_eq!(model.lock().imr, 0xfff & !0x7c1);
    assert!(!ch.interrupt_pending().unwrap());
}

#[test]
fn init_writes_the_axi_cache_attributes_of_the_coherency_asked_for() {
    // DATA_ATTR starts at its UG1087 reset value 0x0483_D20F: ARBURST 1 [27:26], ARCACHE
    // 0b0010 [25:22], ARQOS 0 [21:18], ARLEN 0xF [17:14], AWBURST 1 [13:12], AWCACHE 0b0010
    // [11:8], AWQOS 0 [7:4], AWLEN 0xF [3:0].
    const RESET: u32 = 0x0483_d20f;
    let writes = |coherent: bool, before: (u32, u32)| {
        let (_mem, model) = setup(Behaviour::Copy);
        model.lock().words.insert(0x120, before.0);
        model.lock().words.insert(0x124, before.1);
        let bus = RecordingBus::new("zdma", &model);
        let config = ZdmaConfig {
            coherent,
            ..ZdmaConfig::DEFAULT
        };
        let mut ch = ZdmaChannel::new(&bus, NoDelay::default(), config).unwrap();
        journal::start();
        ch.init().unwrap();
        let written: Vec<(usize, u64)> = journal::stop()
            .into_iter()
            .filter_map(|e| match e {
                Event::Write { offset, value, .. } if offset == 0x120 || offset == 0x124 => {
                    Some((offset, value))
                }
                _ => None,
            })
            .collect();
        written
    };
    // Coherent (Linux `zynqmp_dma_init` with `dma-coherent`): ARCACHE = AWCACHE = 0xF, burst
    // and QoS fields kept -> 0x07C3_DF0F; DSCR_ATTR = AXCOHRNT [8] | AXCACHE 0xF [7:4] = 0x1F0.
    assert_eq!(
        writes(true, (RESET, 0)),
        vec![(0x120, 0x07c3_df0f), (0x124, 0x1f0)]
    );
    // Not coherent, after an owner that left the channel coherent: back to the reset
    // attributes (AxCACHE 0b0010, descriptors 0), ARLEN/AWLEN and the rest kept.
    assert_eq!(
        writes(false, (0x07c3_df0f, 0x1f0)),
        vec![(0x120, u64::from(RESET)), (0x124, 0)]
    );
}

#[test]
fn axi_errors_become_retransmittable_errors_with_the_bytes_done() {
    for (bit, expected) in [
        (1 << 8, DmaError::AxiRead { bytes: 256 }),
        (1 << 9, DmaError::AxiWrite { bytes: 256 }),
        (1 << 6, DmaError::DescriptorRead { isr: 1 << 6 }),
        (1 << 0, DmaError::InvalidRegisterAccess),
    ] {
        let (_mem, model) = setup(Behaviour::Fail { bit, bytes: 256 });
        let mut ch = ZdmaChannel::new(&model, NoDelay::default(), ZdmaConfig::DEFAULT).unwrap();
        ch.init().unwrap();
        let t = Transfer {
            src: 0x1_0000_0000,
            dst: 0x1_0000_1000,
            len: 4096,
        };
        assert_eq!(ch.transfer(&t), Err(expected));
        assert_eq!(
            expected.is_retransmittable(),
            bit == 1 << 8 || bit == 1 << 9
        );
        assert_eq!(model.lock().isr, 0, "error bit acknowledged");
        assert!(!ch.is_running());
        // The channel can be started again (retransmission).
        assert!(ch.start(&t).is_ok());
    }
}

#[test]
fn a_held_transfer_times_out_and_a_busy_channel_refuses_a_second_start() {
    // Silicon and QEMU encode a running channel differently; the driver must see both.
    for state in [SILICON_BUSY, QEMU_BUSY] {
        let (_mem, model) = setup(Behaviour::Hold { state });
        let config = ZdmaConfig {
            timeout_us: 50,
            ..ZdmaConfig::DEFAULT
        };
        let mut ch = ZdmaChannel::new(&model, NoDelay::default(), config).unwrap();
        ch.init().unwrap();
        let t = Transfer {
            src: 0x1000,
            dst: 0x2000,
            len: 64,
        };
        ch.start(&t).unwrap();
        assert_eq!(ch.poll(), Ok(ChannelStatus::Busy));
        assert_eq!(ch.start(&t), Err(DmaError::Busy));
        assert_eq!(
            ch.wait(),
            Err(DmaError::Timeout {
                waited_us: 50,
                bytes: 0
            })
        );
        assert_eq!(
            ch.init(),
            Err(DmaError::Busy),
            "hardware still busy (STATE {state})"
        );
    }
}

#[test]
fn bad_transfers_are_refused_before_touching_the_hardware() {
    let (_mem, model) = setup(Behaviour::Copy);
    let mut ch = ZdmaChannel::new(&model, NoDelay::default(), ZdmaConfig::DEFAULT).unwrap();
    let bad = [
        Transfer {
            src: 0,
            dst: 0,
            len: 0,
        },
        Transfer {
            src: 0,
            dst: 0,
            len: 1 << 30,
        },
        Transfer {
            src: (1 << 49) - 16,
            dst: 0,
            len: 32,
        },
        Transfer {
            src: 0,
            dst: u64::MAX,
            len: 1,
        },
    ];
    for t in bad {
        assert!(matches!(
            ch.start(&t),
            Err(DmaError::InvalidTransfer { .. })
        ));
    }
    assert!(model.lock().words.is_empty(), "nothing written");
    assert_eq!(ch.poll(), Ok(ChannelStatus::Idle));
    assert!(matches!(ch.wait(), Err(DmaError::InvalidTransfer { .. })));
}
