//! The NPE driver against a register-level stub of the engine (no data movement): probe,
//! configuration checks, back-pressure, and the descriptors it writes, checked against the
//! layout of docs/dma-engine.md. End-to-end behaviour with the engine model is tested in
//! `sim/tests/npe_protocol.rs`.

use dma_engine::npe::desc::{SQ_ENTRY, SqEntry, SqOp};
use dma_engine::npe::{ChannelConfig, DmaError, FaultClass, Npe, NpeConfig, NpeHost, PeerConfig};
use hal::PhysAddr;
use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::model::{ModelBus, RegisterModel};
use hal::regs::AccessWidth;
use protocol::wire::Message;
use protocol::{Access, Envelope, FaultReason, Generation, TransferDesc, TransferId};

/// Answers ID and CAPS, remembers every write, and records doorbells and barriers in order.
#[derive(Default)]
struct Stub {
    id: u32,
    regs: std::collections::HashMap<usize, u64>,
    events: Vec<String>,
}

impl RegisterModel for Stub {
    fn size(&self) -> usize {
        0x1_0000
    }
    fn read(&mut self, offset: usize, _w: AccessWidth) -> u64 {
        match offset {
            0x000 => u64::from(self.id),
            // 16 channels, 4 KiB blocks, 64 slots, SQ/CQ up to 2^6, RQ/WQ/WCQ up to 2^8.
            0x004 => 16 | 6 << 12 | 6 << 16 | 8 << 20 | 1 << 24,
            _ => self.regs.get(&offset).copied().unwrap_or(0),
        }
    }
    fn write(&mut self, offset: usize, _w: AccessWidth, value: u64) {
        // CTRL.SOFT_RESET clears itself (§3.1); this stub's reset takes no time.
        let value = if offset == 0x00c { value & !2 } else { value };
        self.regs.insert(offset, value);
        if offset >= 0x1000 && offset % 0x100 == 0x0c {
            self.events
                .push(format!("sq_tail {} = {value}", (offset - 0x1000) / 0x100));
        }
    }
    fn barrier(&mut self, kind: Barrier) {
        self.events.push(format!("{kind:?}"));
    }
}

struct Host;

impl NpeHost for Host {
    fn classify(&mut self, _: u16, _: u64, _: Access) -> FaultClass {
        FaultClass::Present
    }
    fn request_resolution(&mut self, _: u16, _: u64, _: Access) {}
    fn snapshot(&self, _: u16) -> Generation {
        Generation(0)
    }
    fn check(&self, _: u16, _: u64, _: u64, _: Generation) -> Result<(), FaultReason> {
        Ok(())
    }
}

/// The data channel both tests open: to peer 3, PDID 1, the peer's key 7.
const CHANNEL: ChannelConfig = ChannelConfig {
    peer: 3,
    pdid: 1,
    peer_key: 7,
    session: 0xabc,
};

type Driver<'a> = Npe<&'a ModelBus<Stub>, 16, 4, 8, 32>;

fn stub(id: u32) -> ModelBus<Stub> {
    ModelBus::new(Stub {
        id,
        ..Stub::default()
    })
}

fn dram() -> HostDma {
    HostDma::new(PhysAddr::new(0x8000_0000), 256).unwrap()
}

#[test]
fn probe_checks_identity_and_configuration() {
    let dma = dram();
    let (wrong, v2, good) = (stub(0x1234_5601), stub(0x4E50_4502), stub(0x4E50_4501));
    let probe = |bus, cfg| Driver::new(bus, &dma, cfg).map(|_| ());
    assert_eq!(
        probe(&wrong, NpeConfig::new(0, 15)),
        Err(DmaError::NotAnNpe { id: 0x1234_5601 })
    );
    assert_eq!(
        probe(&v2, NpeConfig::new(0, 15)),
        Err(DmaError::UnsupportedVersion { found: 2 })
    );
    let too_big = NpeConfig {
        sq_log2: 7,
        ..NpeConfig::new(0, 15)
    };
    assert!(matches!(
        probe(&good, too_big),
        Err(DmaError::Capacity { .. })
    ));
    let bad_batch = NpeConfig {
        sq_batch: 17,
        ..NpeConfig::new(0, 15)
    };
    assert!(matches!(
        probe(&good, bad_batch),
        Err(DmaError::InvalidConfig { .. })
    ));
    assert_eq!(probe(&good, NpeConfig::new(0, 15)), Ok(()));
}

#[test]
fn submit_applies_back_pressure_and_poll_writes_spec_descriptors() {
    let dma = dram();
    let bus = stub(0x4E50_4501);
    let mut npe = Driver::new(&bus, &dma, NpeConfig::new(2, 15)).unwrap();
    let channel = CHANNEL;
    npe.open_channel(&dma, 0, channel).unwrap();
    assert_eq!(
        npe.open_channel(&dma, 15, channel),
        Err(DmaError::ChannelInUse { channel: 15 }),
        "the control channel is reserved"
    );
    npe.open_peer(
        0,
        PeerConfig {
            peer: 3,
            session: 0xabc,
            pdid: 1,
        },
    )
    .unwrap();
    let desc = |i: u64| TransferDesc {
        src: 0x10_0000 + i * 0x4000,
        dest: 0x20_0000 + i * 0x4000,
        len: 0x4000,
        key: 7,
        tag: i,
    };
    for i in 0..8 {
        assert_eq!(npe.submit(0, desc(i)), Ok(TransferId(i as u32)));
    }
    let refused = npe.submit(0, desc(8));
    assert_eq!(
        refused,
        Err(DmaError::QueueFull {
            channel: 0,
            open: 8
        })
    );
    assert!(refused.unwrap_err().is_back_pressure());
    assert_eq!(npe.open_transfers(0), Ok(8));
    assert_eq!(
        npe.submit(3, desc(0)),
        Err(DmaError::NoSuchChannel { channel: 3 })
    );

    let report = npe.poll(1_000, &mut Host).unwrap();
    // The engine consumes nothing here, so the driver stops at its batch of 8 descriptors.
    assert_eq!(report.blocks_posted, 8);
    let model = bus.lock();
    let sq_base = model.regs[&0x1000];
    // A store barrier comes before the doorbell, which is the producer index 8.
    let last_barrier = model.events.iter().rposition(|e| e == "DsbSt").unwrap();
    let doorbell = model
        .events
        .iter()
        .position(|e| e == "sq_tail 0 = 8")
        .unwrap();
    assert!(last_barrier < doorbell, "{:?}", model.events);
    for i in 0..8u64 {
        let mut bytes = [0u8; SQ_ENTRY];
        dma.read_phys(PhysAddr::new(sq_base + i * SQ_ENTRY as u64), &mut bytes)
            .unwrap();
        let entry = SqEntry::decode(&bytes, 4096).unwrap();
        // Transfer 0 has 4 blocks, then transfer 1 begins.
        let (tid, block) = (i / 4, i % 4);
        assert_eq!(
            entry.op,
            SqOp::SendBlock {
                src_va: 0x10_0000 + tid * 0x4000 + block * 4096,
                length: 4096,
                dst_va: 0x20_0000 + tid * 0x4000 + block * 4096,
            }
        );
        assert_eq!(
            (entry.peer, entry.dst_pdid, entry.tid14),
            (3, 7, tid as u16)
        );
        // Only the descriptor that fills the batch asks for a completion.
        assert_eq!(entry.signal, i == 7);
        let (envelope, _) = Envelope::decode(entry.msg.as_bytes()).unwrap();
        assert_eq!(envelope.session, 0xabc);
        let Message::Block(header) = envelope.message else {
            panic!("not a block header");
        };
        assert_eq!((header.tid.0 as u64, header.block as u64), (tid, block));
        assert_eq!((header.block_count, header.attempt), (4, 1));
    }
}

#[test]
fn addresses_and_keys_the_descriptors_cannot_carry_are_refused() {
    let dma = dram();
    let bus = stub(0x4E50_4501);
    let mut npe = Driver::new(&bus, &dma, NpeConfig::new(2, 15)).unwrap();
    let channel = CHANNEL;
    // SEND_BLOCK's DST_PDID has 16 bits: a wider key would be cut and then refused by the
    // peer on every block.
    assert!(matches!(
        npe.open_channel(
            &dma,
            0,
            ChannelConfig {
                peer_key: 0x1_0007,
                ..channel
            }
        ),
        Err(DmaError::InvalidConfig { .. })
    ));
    npe.open_channel(&dma, 0, channel).unwrap();
    // Virtual addresses have 49 bits: an address above would be cut to another one.
    let desc = |src: u64, dest: u64| TransferDesc {
        src,
        dest,
        len: 0x2000,
        key: 7,
        tag: 0,
    };
    let top = 1u64 << 49;
    for (src, dest) in [
        (top, 0x20_0000),
        (0x10_0000, top | 0x20_0000),
        (top - 0x1000, 0x20_0000),
        (0x10_0000, u64::MAX - 0xfff),
    ] {
        assert!(
            matches!(
                npe.submit(0, desc(src, dest)),
                Err(DmaError::InvalidTransfer { .. })
            ),
            "{src:#x} -> {dest:#x}"
        );
    }
    assert_eq!(npe.open_transfers(0), Ok(0));
    assert_eq!(
        npe.submit(0, desc(top - 0x2000, top - 0x2000)),
        Ok(TransferId(0))
    );
}

#[test]
fn error_codes_are_stable() {
    assert_eq!(
        DmaError::QueueFull {
            channel: 0,
            open: 1
        }
        .code(),
        16
    );
    assert_eq!(DmaError::NotAnNpe { id: 0 }.code(), 10);
    assert_eq!(
        DmaError::AxiRead { bytes: 0 }.code(),
        4,
        "zDMA codes are unchanged"
    );
}
