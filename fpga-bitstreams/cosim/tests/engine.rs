//! The RTL, Verilated, on its own: registers, a block and a message from one engine to the
//! other, commits, and the documented errors. Every check also runs on the Rust model, so the
//! two agree on each case.

use dma_engine::npe::desc::{EntryStatus, InlineMsg, RqKind, SqEntry, SqOp, WqEntry, WqOp};
use dma_engine::npe::regs::channel_offset;
use hal::PhysAddr;
use hal::regs::AccessWidth;
use npe_cosim::WriteOrder;
use npe_cosim::harness::{Completion, DST_AT, Node, SRC_AT};
use npe_cosim::rig::{ModelRig, Rig, RtlRig};

const PAGES: usize = 1024;

fn rigs() -> Vec<Box<dyn Rig>> {
    vec![
        Box::new(ModelRig::new(PAGES)),
        Box::new(RtlRig::new(PAGES, 20, 1)),
    ]
}

fn msg(seed: u8, len: usize) -> InlineMsg {
    let bytes: Vec<u8> = (0..len)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect();
    InlineMsg::new(&bytes).expect("16..=64 bytes")
}

fn block(src_va: u64, length: u32, dst_va: u64, cookie: u64) -> SqEntry {
    SqEntry {
        op: SqOp::SendBlock {
            src_va,
            length,
            dst_va,
        },
        signal: true,
        tid14: 0x155,
        peer: 1,
        dst_pdid: 9,
        cookie,
        msg: msg(cookie as u8, 56),
    }
}

fn fill(rig: &dyn Rig, node: usize, at: u64, len: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i * 13 + i / 251) as u8))
        .collect();
    rig.dram(node)
        .write_phys(PhysAddr::new(at), &data)
        .expect("in DRAM");
    data
}

#[test]
fn id_and_caps_read_through_the_register_seam() {
    let mut rtl = RtlRig::new(PAGES, 0, 3);
    let id = rtl.read(0, 0x000, AccessWidth::U32);
    assert_eq!(id, 0x4E50_4501);
    let caps = rtl.read(0, 0x004, AccessWidth::U32);
    assert_eq!(caps & 0xff, 4);
    assert_eq!((caps >> 12) & 0xf, 6);
    assert_eq!((caps >> 24) & 1, 1);
    rtl.write(0, 0x020, AccessWidth::U64, 0x1234_5678_9abc_deff);
    assert_eq!(rtl.read(0, 0x020, AccessWidth::U64), 0x1234_5678_9abc_de80);
    rtl.write(0, 0x1000 + 0x2c, AccessWidth::U32, 0xabcd_0003);
    assert_eq!(rtl.read(0, 0x102c, AccessWidth::U32), 0xabcd_0003);
}

#[test]
fn blocks_and_messages_cross_and_commit_on_both() {
    for mut rig in rigs() {
        let r = rig.as_mut();
        let mut a = Node::setup(r, 0, 3);
        let mut b = Node::setup(r, 1, 9);
        let cases: [(u64, u32, u64); 4] = [
            (0, 4096, 0),
            (5, 1000, 0x1003),
            (17, 4096, 0x2fff),
            (4090, 33, 0x5000),
        ];
        let mut sent = Vec::new();
        for (i, (so, len, dofs)) in cases.iter().enumerate() {
            let src = SRC_AT + 0x2000 * i as u64 + so;
            sent.push((fill(r, 0, src, *len as usize, i as u8 + 1), DST_AT + dofs));
            a.post(
                r,
                0,
                i % 2,
                &block(src, *len, DST_AT + dofs, 100 + i as u64),
            );
        }
        a.post(
            r,
            0,
            3,
            &SqEntry {
                op: SqOp::SendMsg,
                signal: true,
                tid14: 7,
                peer: 1,
                dst_pdid: 2,
                cookie: 55,
                msg: msg(9, 24),
            },
        );
        a.ring_all(r, 0);
        r.settle();
        let mut cqs = Vec::new();
        a.drain_cq(r, 0, &mut cqs);
        assert_eq!(cqs.len(), 5, "{}: {cqs:?}", r.name());
        assert!(
            cqs.iter().all(|c| c.entry.status == EntryStatus::Ok),
            "{}: {cqs:?}",
            r.name()
        );
        let arrivals = b.drain_rq(r, 1);
        assert_eq!(arrivals.len(), 5, "{}", r.name());
        let mut blocks = 0;
        for (slot, a) in &arrivals {
            assert_eq!(a.entry.src, 0);
            match a.block_len {
                Some(len) => {
                    let (i, (_, want_len, dofs)) = cases
                        .iter()
                        .enumerate()
                        .find(|(i, _)| a.entry.msg == msg(100 + *i as u8, 56))
                        .expect("a block we sent");
                    assert_eq!(len, *want_len);
                    assert_eq!(a.entry.pdid, 9);
                    b.post_wq(
                        r,
                        1,
                        &WqEntry {
                            op: WqOp::Commit {
                                pdid: 9,
                                length: len,
                                dst_va: DST_AT + dofs,
                            },
                            slot: *slot,
                            cookie: 1000 + i as u64,
                        },
                    );
                    blocks += 1;
                }
                None => {
                    assert_eq!(a.entry.msg, msg(9, 24));
                    assert_eq!(a.entry.tid14, 7);
                    assert_eq!(a.entry.kind, RqKind::Msg);
                }
            }
        }
        assert_eq!(blocks, 4);
        b.ring_wq(r, 1);
        r.settle();
        let wcq = b.drain_wcq(r, 1);
        assert_eq!(wcq.len(), 4, "{}", r.name());
        assert!(
            wcq.iter().all(|w| w.status == EntryStatus::Ok),
            "{}: {wcq:?}",
            r.name()
        );
        for (data, at) in &sent {
            let mut got = vec![0u8; data.len()];
            r.dram(1)
                .read_phys(PhysAddr::new(*at), &mut got)
                .expect("in DRAM");
            assert!(got == *data, "{}: bytes at {at:#x} differ", r.name());
        }
        let _ = Completion::clone;
    }
}

/// AXI's write address and write data channels are independent (Arm IHI 0022 A3.3.1): a
/// slave may hold AWREADY until it sees WVALID, and the engine's writes (RQ entry, CQ entry,
/// committed bytes, WCQ entry) must still complete, whichever order the slave takes.
#[test]
fn writes_complete_whichever_of_address_and_data_the_slave_takes_first() {
    for order in [
        WriteOrder::DataFirst,
        WriteOrder::AddressFirst,
        WriteOrder::Independent,
    ] {
        let mut rig = RtlRig::new(PAGES, 20, 11);
        rig.system().set_write_order(order);
        let r: &mut dyn Rig = &mut rig;
        let mut a = Node::setup(r, 0, 3);
        let mut b = Node::setup(r, 1, 9);
        let data = fill(r, 0, SRC_AT + 3, 1000, 5);
        a.post(r, 0, 0, &block(SRC_AT + 3, 1000, DST_AT + 0x11, 77));
        a.ring_all(r, 0);
        r.settle();
        let mut cqs = Vec::new();
        a.drain_cq(r, 0, &mut cqs);
        assert_eq!(cqs.len(), 1, "{order:?}: {cqs:?}");
        assert_eq!(cqs[0].entry.status, EntryStatus::Ok, "{order:?}");
        let arrivals = b.drain_rq(r, 1);
        assert_eq!(arrivals.len(), 1, "{order:?}");
        b.post_wq(
            r,
            1,
            &WqEntry {
                op: WqOp::Commit {
                    pdid: 9,
                    length: 1000,
                    dst_va: DST_AT + 0x11,
                },
                slot: arrivals[0].0,
                cookie: 5,
            },
        );
        b.ring_wq(r, 1);
        r.settle();
        let wcq = b.drain_wcq(r, 1);
        assert_eq!(wcq.len(), 1, "{order:?}");
        assert_eq!(wcq[0].status, EntryStatus::Ok, "{order:?}");
        let mut got = vec![0u8; data.len()];
        r.dram(1)
            .read_phys(PhysAddr::new(DST_AT + 0x11), &mut got)
            .expect("in DRAM");
        assert!(got == data, "{order:?}: committed bytes differ");
    }
}

/// GEVENT.RX_HELD means arriving traffic waited because no receive slot or RQ entry was free
/// (docs/dma-engine.md §3), not that a frame waited for its RQ entry to be written: a few
/// blocks with slots to spare leave GEVENT clear; more blocks than slots, none released,
/// raise it, on both.
#[test]
fn rx_held_only_when_no_receive_slot_is_free_on_both() {
    for mut rig in rigs() {
        let r = rig.as_mut();
        let mut a = Node::setup(r, 0, 3);
        let mut b = Node::setup(r, 1, 9);
        let slots = (1u64 << ((r.read(1, 0x004, AccessWidth::U32) >> 12) & 0xf)) as usize;
        fill(r, 0, SRC_AT, 4096, 1);
        let mut cookie = 0;
        let mut send = |r: &mut dyn Rig, a: &mut Node, n: usize| {
            for i in 0..n {
                cookie += 1;
                a.post(
                    r,
                    0,
                    i % 2,
                    &block(SRC_AT + 16 * (i as u64 % 200), 16, DST_AT, cookie),
                );
            }
            a.ring_all(r, 0);
            r.settle();
            let mut cqs = Vec::new();
            a.drain_cq(r, 0, &mut cqs);
            cqs.len()
        };
        assert_eq!(send(r, &mut a, 3), 3, "{}", r.name());
        assert_eq!(b.drain_rq(r, 1).len(), 3, "{}", r.name());
        assert_eq!(
            r.read(1, 0x014, AccessWidth::U32),
            0,
            "{}: 3 blocks, {} slots: nothing held",
            r.name(),
            slots
        );
        // Slots: 3 taken; the rest plus 4 more than fit, in SQ-sized batches.
        let mut want = slots + 1;
        while want > 0 {
            let n = want.min(100);
            send(r, &mut a, n);
            want -= n;
        }
        assert_eq!(
            r.read(1, 0x014, AccessWidth::U32) & 0x8,
            0x8,
            "{}: {} slots all taken: RX_HELD",
            r.name(),
            slots
        );
    }
}

/// One flipped bit anywhere a packet's checks cover (docs/npe-rtl.md "Link framing": the
/// CRC covers the header, the payload and the footer's fields) loses the frame with
/// CRC_DROP; no arrival is ever made of a corrupted frame. RTL only: the model's frames
/// carry no bits. Each case is a 4 KiB block (17 packets); after each the same block is
/// sent clean and arrives whole.
#[test]
fn any_corrupted_header_or_footer_bit_is_a_crc_drop_never_a_wrong_arrival() {
    use std::sync::{Arc, Mutex};
    // (packet, footer?, word, bit, what)
    let cases: [(u32, bool, usize, u32, &str); 10] = [
        (0, false, 0, 3, "header destination"),
        (0, false, 0, 45, "header payload flits"),
        (16, false, 0, 50, "header payload bytes (last packet)"),
        (0, false, 1, 2, "header DST_VA"),
        (0, true, 0, 37, "footer LAST (first packet)"),
        (1, true, 0, 36, "footer FIRST (second packet)"),
        (0, true, 0, 15, "footer source"),
        (0, true, 0, 2, "footer TID"),
        (3, true, 0, 38, "footer packet index"),
        (5, true, 1, 40, "footer reserved bits"),
    ];
    let mut rtl = RtlRig::new(PAGES, 20, 5);
    // The armed case, and the data packets counted since it was armed.
    type Armed = (Option<(u32, bool, usize, u32)>, u32);
    let armed: Arc<Mutex<Armed>> = Arc::new(Mutex::new((None, 0)));
    let hook_armed = armed.clone();
    let mut flit_no = 0u32;
    rtl.system().set_link_hook(Box::new(move |_dst, vc, flit| {
        if vc != 0 {
            return;
        }
        let mut a = hook_armed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, footer, word, bit)) = a.0
            && p == a.1
            && (if footer { flit.last } else { flit_no == 0 })
        {
            flit.data[word] ^= 1 << bit;
            a.0 = None;
        }
        flit_no += 1;
        if flit.last {
            flit_no = 0;
            a.1 += 1;
        }
    }));
    let r: &mut dyn Rig = &mut rtl;
    let mut a = Node::setup(r, 0, 3);
    let mut b = Node::setup(r, 1, 9);
    fill(r, 0, SRC_AT, 4096, 7);
    for (i, (p, footer, word, bit, what)) in cases.iter().enumerate() {
        for corrupt in [true, false] {
            if corrupt {
                // Packets are counted from this frame's first.
                *armed.lock().unwrap_or_else(|e| e.into_inner()) =
                    (Some((*p, *footer, *word, *bit)), 0);
            }
            a.post(r, 0, 0, &block(SRC_AT, 4096, DST_AT, i as u64));
            a.ring_all(r, 0);
            r.settle();
            let mut cqs = Vec::new();
            a.drain_cq(r, 0, &mut cqs);
            assert_eq!(cqs.len(), 1, "{what}");
            let arrivals = b.drain_rq(r, 1);
            let gevent = r.read(1, 0x014, AccessWidth::U32);
            r.write(1, 0x014, AccessWidth::U32, gevent);
            if corrupt {
                assert!(
                    armed.lock().unwrap_or_else(|e| e.into_inner()).0.is_none(),
                    "{what}: the bit was flipped"
                );
                assert_eq!(arrivals.len(), 0, "{what}: a corrupted frame arrived");
                assert_eq!(gevent, 0x4, "{what}: CRC_DROP");
            } else {
                assert_eq!(arrivals.len(), 1, "{what}: the clean re-send");
                assert_eq!(arrivals[0].1.block_len, Some(4096), "{what}");
                assert_eq!(gevent, 0, "{what}");
                b.post_wq(
                    r,
                    1,
                    &WqEntry {
                        op: WqOp::Release,
                        slot: arrivals[0].0,
                        cookie: i as u64,
                    },
                );
                b.ring_wq(r, 1);
                r.settle();
                b.drain_wcq(r, 1);
            }
        }
    }
}

#[test]
fn bad_input_gives_the_documented_errors_on_both() {
    for mut rig in rigs() {
        let r = rig.as_mut();
        let mut a = Node::setup(r, 0, 3);
        let mut b = Node::setup(r, 1, 9);
        // A reserved bit, an unknown opcode, an unreachable peer.
        let mut bad = block(SRC_AT, 64, DST_AT, 1).encode();
        bad[5 * 8] = 1;
        a.post_raw(r, 0, 0, &bad);
        let mut op = block(SRC_AT, 64, DST_AT, 2).encode();
        op[0] = 9;
        a.post_raw(r, 0, 0, &op);
        a.post(
            r,
            0,
            0,
            &SqEntry {
                peer: 7,
                ..block(SRC_AT, 64, DST_AT, 3)
            },
        );
        a.ring_all(r, 0);
        r.settle();
        let mut cqs = Vec::new();
        a.drain_cq(r, 0, &mut cqs);
        let st: Vec<(EntryStatus, u64)> = cqs
            .iter()
            .map(|c| (c.entry.status, c.entry.cookie))
            .collect();
        assert_eq!(
            st,
            [
                (EntryStatus::BadDescriptor, 1),
                (EntryStatus::BadDescriptor, 2),
                (EntryStatus::LinkError, 3)
            ],
            "{}",
            r.name()
        );
        // A slot out of range, then a bad link CRC.
        b.post_wq(
            r,
            1,
            &WqEntry {
                op: WqOp::Commit {
                    pdid: 9,
                    length: 10,
                    dst_va: DST_AT,
                },
                slot: 200,
                cookie: 77,
            },
        );
        b.ring_wq(r, 1);
        r.settle();
        let wcq = b.drain_wcq(r, 1);
        assert_eq!(wcq.len(), 1, "{}", r.name());
        assert_eq!(
            (wcq[0].status, wcq[0].cookie),
            (EntryStatus::BadDescriptor, 77),
            "{}",
            r.name()
        );
        r.link_corrupt_next(0);
        fill(r, 0, SRC_AT, 4096, 5);
        a.post(r, 0, 1, &block(SRC_AT, 4096, DST_AT, 4));
        a.post(r, 0, 1, &block(SRC_AT, 100, DST_AT, 5));
        a.ring_all(r, 0);
        r.settle();
        let gevent = r.read(1, 0x014, AccessWidth::U32);
        assert_eq!(gevent & 4, 4, "{}: CRC_DROP", r.name());
        let arrivals = b.drain_rq(r, 1);
        assert_eq!(
            arrivals.len(),
            1,
            "{}: only the clean block arrives",
            r.name()
        );
        assert_eq!(arrivals[0].1.block_len, Some(100));
    }
}

#[test]
fn source_faults_park_the_channel_and_resume_on_both() {
    for mut rig in rigs() {
        let r = rig.as_mut();
        let mut a = Node::setup(r, 0, 3);
        let _b = Node::setup(r, 1, 9);
        let src = SRC_AT + 0x10;
        fill(r, 0, src, 6000, 1);
        // Channel 1 reads through node 0's terminating domain (`Node::setup`).
        r.smmu(0).unmap(0, src + 4096).expect("unmap");
        a.post(r, 0, 1, &block(src, 4096, DST_AT, 1));
        a.post(r, 0, 1, &block(src, 4096, DST_AT, 2));
        a.ring_all(r, 0);
        r.settle();
        let c = channel_offset(1);
        assert_eq!(
            r.read(0, c + 0x30, AccessWidth::U32) & 7,
            2,
            "{}: FAULT_WAIT",
            r.name()
        );
        assert_eq!(
            r.read(0, c + 0x38, AccessWidth::U64),
            (src & !0xfff) + 4096,
            "{}",
            r.name()
        );
        assert_eq!(
            r.read(0, c + 0x44, AccessWidth::U32),
            0b1010,
            "{}: SLVERR, VALID",
            r.name()
        );
        // SKIP: SRC_FAULT; the second descriptor faults the same way; RETRY after the page
        // is back sends it.
        r.write(0, c + 0x48, AccessWidth::U32, 2);
        r.settle();
        r.smmu(0).restore(0, src + 4096).expect("map");
        r.write(0, c + 0x48, AccessWidth::U32, 1);
        r.settle();
        let mut cqs = Vec::new();
        a.drain_cq(r, 0, &mut cqs);
        let st: Vec<(EntryStatus, u64, u64)> = cqs
            .iter()
            .map(|c| (c.entry.status, c.entry.cookie, c.entry.fault_addr))
            .collect();
        assert_eq!(
            st,
            [
                (EntryStatus::SrcFault, 1, (src & !0xfff) + 4096),
                (EntryStatus::Ok, 2, 0)
            ],
            "{}",
            r.name()
        );
    }
}

#[test]
fn stalls_hold_and_terminated_writes_report_dst_fault_on_both() {
    for mut rig in rigs() {
        let r = rig.as_mut();
        let mut a = Node::setup(r, 0, 3);
        let mut b = Node::setup(r, 1, 9);
        fill(r, 0, SRC_AT, 4096, 3);
        // Channel 2 reads through node 0's stalling domain (`Node::setup`).
        r.smmu(0).unmap(1, SRC_AT).expect("unmap");
        a.post(r, 0, 2, &block(SRC_AT, 4096, DST_AT, 1));
        a.ring_all(r, 0);
        r.settle();
        let mut cqs = Vec::new();
        a.drain_cq(r, 0, &mut cqs);
        assert!(
            cqs.is_empty(),
            "{}: a stalled read holds its descriptor",
            r.name()
        );
        // The fault service maps the page and resumes the read.
        assert_eq!(r.smmu(0).service_stalls().expect("service"), 1);
        r.settle();
        a.drain_cq(r, 0, &mut cqs);
        assert_eq!(cqs.len(), 1, "{}: {cqs:?}", r.name());
        let arrivals = b.drain_rq(r, 1);
        assert_eq!(arrivals.len(), 1, "{}", r.name());
        // The commit's second page is terminated: DST_FAULT after the first page.
        r.smmu(1).unmap(0, DST_AT + 0x1000).expect("unmap");
        b.post_wq(
            r,
            1,
            &WqEntry {
                op: WqOp::Commit {
                    pdid: 9,
                    length: 4096,
                    dst_va: DST_AT + 0x800,
                },
                slot: arrivals[0].0,
                cookie: 5,
            },
        );
        b.ring_wq(r, 1);
        r.settle();
        let wcq = b.drain_wcq(r, 1);
        assert_eq!(wcq.len(), 1, "{}", r.name());
        let w = &wcq[0];
        assert_eq!(
            (w.status, w.bytes, w.fault_addr, w.axi_resp),
            (EntryStatus::DstFault, 0x800, DST_AT + 0x1000, 2),
            "{}",
            r.name()
        );
    }
}
