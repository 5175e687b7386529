//! The differential test: one seeded workload, run on the Rust model (`sim::npe::NpeModel`)
//! and on the RTL (Verilated, under AXI back-pressure), each node's engine behind an MMU-500
//! of its own (`npe_cosim::node_smmu`: sim's model programmed by the SMMUv2 driver, real
//! stage-1 tables in the node's DRAM). Faults are pages taken out of a table or
//! write-protected there; whether one terminates or stalls is the context bank's: source
//! reads of channels 0 and 1 and commits with PDID bit 4 clear go through terminating banks,
//! channels 2 and 3 and commits with bit 4 set through stalling ones. Stalls are answered by
//! the fault service (`FaultHandler::service_pending`: page mapped, access resumed);
//! terminated accesses by the test, which maps the page the engine reports and resumes the
//! channel (RETRY) or re-sends the block. Besides faults: malformed descriptors and write entries, unreachable peers
//! (no route, this node's own coordinate), doorbells past a ring's size and corrupted link
//! packets (a block and a message). Both runs must report the same events: every completion
//! in SQ order per channel, every parked channel (FAULT_WAIT with its address, index and
//! syndrome), every arrival (its slot aside) in arrival order per stream (source node,
//! channel, virtual channel), every commit result in WQ order, every `GEVENT`, the engines'
//! counts of blocks sent and received (`TX_BLOCKS`, `RX_BLOCKS`: re-sends included) after
//! every round (so the re-sends each injected fault caused), and the same bytes in memory.
//! On a divergence the first differing event, or the first differing byte's address, is
//! printed.
//!
//! Timing is not compared (the model is not cycle-accurate): the test looks at the engines
//! only once they are quiet with no access held by a stall, and lists what happened between
//! two such points in a fixed order of queues and channels, so the order between channels
//! and streams, which timing decides, is not compared; the order within each is.
//!
//! `NPE_DIFF_TRANSFERS` sets the workload's size (2,000 completed descriptors by default;
//! `NPE_DIFF_TRANSFERS=10000 cargo test -p npe-cosim --test differential -- --nocapture` is
//! the 10^4).
// The two nodes are indexed by number throughout (node n, its rings, its SMMU).
#![allow(clippy::needless_range_loop, clippy::type_complexity)]

use std::collections::BTreeMap;

use dma_engine::npe::desc::{EntryStatus, InlineMsg, RqKind, SqEntry, SqOp, WqEntry, WqOp};
use dma_engine::npe::regs::channel_offset;
use hal::PhysAddr;
use hal::regs::AccessWidth;
use npe_cosim::harness::{CH_LOG2, Completion, DST_AT, DST_SPAN, ENG_LOG2, Node, SRC_AT, SRC_SPAN};
use npe_cosim::node_smmu::{NodeSmmu, STALL_PDID};
use npe_cosim::rig::{CHANNELS, ModelRig, Rig, RtlRig};

const PAGES: usize = 1024;
const W32: AccessWidth = AccessWidth::U32;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn mix(a: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 32
}

/// A block to (re-)send: its identity travels in the message bytes.
#[derive(Clone, Copy, Debug)]
struct Job {
    src_node: usize,
    channel: usize,
    seq: u32,
    src_va: u64,
    len: u32,
    dst_va: u64,
}

fn tag_msg(job: &Job, post: u32, len: usize) -> InlineMsg {
    let mut b = vec![0u8; len];
    b[14..18].copy_from_slice(&post.to_le_bytes());
    b[0] = job.src_node as u8;
    b[1] = job.channel as u8;
    b[2..6].copy_from_slice(&job.seq.to_le_bytes());
    b[6..14].copy_from_slice(&job.dst_va.to_le_bytes());
    for (i, x) in b.iter_mut().enumerate().skip(18) {
        *x = (job.seq as u8).wrapping_add(i as u8);
    }
    InlineMsg::new(&b).expect("16..=64 bytes")
}

fn ident(msg: &InlineMsg) -> (usize, usize, u32, u64) {
    let b = msg.as_bytes();
    (
        usize::from(b[0]),
        usize::from(b[1]),
        u32::from_le_bytes(b[2..6].try_into().unwrap_or([0; 4])),
        u64::from_le_bytes(b[6..14].try_into().unwrap_or([0; 8])),
    )
}

/// The per-(node, channel) posting number a message carries: SQ order.
fn post_no(msg: &InlineMsg) -> u32 {
    u32::from_le_bytes(msg.as_bytes()[14..18].try_into().unwrap_or([0; 4]))
}

#[derive(Default)]
struct Outcome {
    events: Vec<String>,
    /// Breaches of the per-stream arrival order (each run on its own).
    violations: Vec<String>,
    /// Re-sends the test made (printed; the engines' own counts, TX_BLOCKS and RX_BLOCKS
    /// after every round, are among the events compared).
    resends: u64,
    transfers: u64,
    /// Each node's destination window at the end.
    mem: [Vec<u8>; 2],
}

/// Makes an encoded descriptor malformed in one of the ways §4.1 names (BAD_DESCRIPTOR).
fn malform(raw: &mut [u8; 128], how: u64) {
    let word = |raw: &[u8; 128], w: usize| {
        u64::from_le_bytes(raw[w * 8..w * 8 + 8].try_into().unwrap_or([0; 8]))
    };
    let put = |raw: &mut [u8; 128], w: usize, v: u64| {
        raw[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
    };
    match how {
        // A reserved word.
        0 => raw[6 * 8 + 3] = 0x40,
        // An unknown opcode.
        1 => raw[0] = 9,
        // LENGTH 0, or past the block size.
        2 => put(raw, 0, word(raw, 0) & 0xffff_ffff),
        3 => put(raw, 0, word(raw, 0) & 0xffff_ffff | 4097 << 32),
        // MSG_LEN past 64.
        4 => put(raw, 2, word(raw, 2) & !(0xff << 38) | 65 << 38),
        // A byte after the message (or, for a 64-byte message, in reserved word 5).
        _ => {
            let msg_len = (word(raw, 2) >> 38 & 0xff) as usize;
            raw[if msg_len < 64 { 64 + msg_len } else { 5 * 8 }] = 1;
        }
    }
}

/// The domain (0 terminating, 1 stalling) of a channel's source reads (`Node::setup`).
fn read_domain(channel: usize) -> usize {
    usize::from(channel >= 2)
}

/// Answers every held access through the fault service (its page mapped, the access
/// resumed) until the engines are quiet with nothing held. From then on what each channel
/// and the write engine do depends only on the tables, not on how far the RTL (one burst at
/// a time) got behind a stall.
fn resolve_stalls(rig: &mut dyn Rig) {
    for _ in 0..1000 {
        let mut answered = 0;
        for s in 0..2 {
            answered += rig.smmu(s).service_stalls().expect("fault service");
        }
        if answered == 0 && !(0..2).any(|s| rig.smmu_ref(s).busy()) {
            return;
        }
        rig.settle();
    }
    panic!("{}: stalls keep coming", rig.name());
}

/// A block (`vc` 0) or a message (`vc` 1) from node `s` whose first packet is corrupted on
/// the link: the receiver drops the frame whole (CRC_DROP); the re-send arrives. Runs with
/// nothing else in flight, so "the next packet" is this frame's on both rigs.
fn corrupted_packet(
    rig: &mut dyn Rig,
    nodes: &mut [Node; 2],
    out: &mut Outcome,
    s: usize,
    vc: usize,
    k: u32,
) {
    let d = 1 - s;
    // Its own stream identity (source 0x10 + s), so the arrival order check keeps apart.
    let job = Job {
        src_node: 0x10 | s,
        channel: 1,
        seq: k,
        src_va: SRC_AT + 0x123 + u64::from(k % 64) * 0x1000,
        len: 3000,
        dst_va: DST_AT + 0x40,
    };
    for attempt in 0..2 {
        if attempt == 0 {
            rig.link_corrupt_next(vc);
            out.resends += 1;
        }
        let entry = SqEntry {
            op: SqOp::SendBlock {
                src_va: job.src_va,
                length: job.len,
                dst_va: job.dst_va,
            },
            signal: true,
            tid14: 1,
            peer: d as u32,
            dst_pdid: if s == 0 { 9 } else { 3 },
            cookie: u64::from(k) << 1 | attempt,
            msg: tag_msg(&job, 2 * k + attempt as u32, 40),
        };
        let entry = if vc == 1 {
            SqEntry {
                op: SqOp::SendMsg,
                ..entry
            }
        } else {
            entry
        };
        nodes[s].post(rig, s, job.channel, &entry);
        nodes[s].ring_all(rig, s);
        rig.settle();
        let mut cq = Vec::new();
        nodes[s].drain_cq(rig, s, &mut cq);
        let arrivals = nodes[d].drain_rq(rig, d);
        let gevent = rig.read(d, 0x014, W32);
        rig.write(d, 0x014, W32, gevent);
        out.events.push(format!(
            "crc n{s} vc{vc} attempt{attempt} cq{:?} rq{:?} gevent{:#x}",
            cq.iter()
                .map(|c| (c.channel, c.entry.status, c.entry.bytes))
                .collect::<Vec<_>>(),
            arrivals
                .iter()
                .map(|(_, a)| (a.block_len, a.entry.msg.len()))
                .collect::<Vec<_>>(),
            gevent
        ));
        out.transfers += cq.len() as u64;
        let mut released = false;
        for (slot, a) in arrivals {
            if a.block_len.is_some() {
                nodes[d].post_wq(
                    rig,
                    d,
                    &WqEntry {
                        op: WqOp::Release,
                        slot,
                        cookie: 0,
                    },
                );
                released = true;
            }
        }
        if released {
            nodes[d].ring_wq(rig, d);
            rig.settle();
        }
    }
}

fn run(rig: &mut dyn Rig, seed: u64, transfers: u64) -> Outcome {
    let mut rng = Rng(seed | 1);
    let mut out = Outcome::default();
    let mut nodes = [Node::setup(rig, 0, 3), Node::setup(rig, 1, 9)];
    // Seeded source bytes.
    for n in 0..2usize {
        let data: Vec<u8> = (0..SRC_SPAN)
            .map(|i| (mix(i ^ ((n as u64) << 40)) & 0xff) as u8)
            .collect();
        rig.dram(n)
            .write_phys(PhysAddr::new(SRC_AT), &data)
            .expect("in DRAM");
    }
    let mut seq = 0u32;
    let mut resend: Vec<Job> = Vec::new();
    let mut all_jobs: BTreeMap<u32, Job> = BTreeMap::new();
    let mut posts = [[0u32; CHANNELS as usize]; 2];
    let mut last: BTreeMap<(usize, usize, bool), u32> = BTreeMap::new();
    let mut round = 0u32;
    while out.transfers < transfers {
        let mut cookies: BTreeMap<u64, Job> = BTreeMap::new();
        let mut expect_blocks: Vec<Job> = Vec::new();
        for s in 0..2 {
            let mut jobs: Vec<Job> = resend.iter().copied().filter(|j| j.src_node == s).collect();
            let fresh = 6 + rng.below(10);
            for _ in 0..fresh {
                let len = if rng.chance(60) {
                    1 + rng.below(256)
                } else {
                    1 + rng.below(4096)
                } as u32;
                seq += 1;
                jobs.push(Job {
                    src_node: s,
                    channel: rng.below(u64::from(CHANNELS)) as usize,
                    seq,
                    src_va: SRC_AT + rng.below(SRC_SPAN - 4096),
                    len,
                    dst_va: DST_AT + rng.below(DST_SPAN - 4096),
                });
            }
            // SQ order within a channel is sequence order, so arrivals can be checked by it.
            jobs.sort_by_key(|j| j.seq);
            for job in &jobs {
                all_jobs.insert(job.seq, *job);
                let cookie = u64::from(job.seq) << 8 | round as u64 & 0xff;
                let kind = rng.below(100);
                let entry = SqEntry {
                    op: SqOp::SendBlock {
                        src_va: job.src_va,
                        length: job.len,
                        dst_va: job.dst_va,
                    },
                    signal: rng.chance(70),
                    tid14: (job.seq & 0x3fff) as u16,
                    peer: 1 - s as u32,
                    dst_pdid: if s == 0 { 9 } else { 3 },
                    cookie,
                    msg: {
                        posts[s][job.channel] += 1;
                        tag_msg(job, posts[s][job.channel], 18 + rng.below(47) as usize)
                    },
                };
                let r = rig as &mut dyn Rig;
                if kind < 4 {
                    let mut raw = entry.encode();
                    malform(&mut raw, rng.below(6));
                    nodes[s].post_raw(r, s, job.channel, &raw);
                } else if kind < 7 {
                    // No route to coordinate 5, or this node's own coordinate.
                    let peer = if rng.chance(50) { 5 } else { s as u32 };
                    nodes[s].post(r, s, job.channel, &SqEntry { peer, ..entry });
                } else if kind < 17 {
                    nodes[s].post(
                        r,
                        s,
                        job.channel,
                        &SqEntry {
                            op: SqOp::SendMsg,
                            ..entry
                        },
                    );
                } else if kind < 20 {
                    nodes[s].post(
                        r,
                        s,
                        job.channel,
                        &SqEntry {
                            op: SqOp::Nop,
                            msg: InlineMsg::EMPTY,
                            ..entry
                        },
                    );
                } else {
                    if rng.chance(6) {
                        // Its last page taken from the table of the channel's domain: the
                        // read is terminated (channels 0, 1) or stalled (2, 3).
                        r.smmu(s)
                            .unmap(
                                read_domain(job.channel),
                                job.src_va + u64::from(job.len) - 1,
                            )
                            .expect("unmap");
                    }
                    nodes[s].post(r, s, job.channel, &entry);
                    cookies.insert(cookie, *job);
                }
            }
        }
        resend.clear();
        // Now and then a doorbell past the ring's size: ignored, GEVENT.BAD_DOORBELL.
        if rng.chance(10) {
            let (s, ch) = (
                rng.below(2) as usize,
                rng.below(u64::from(CHANNELS)) as usize,
            );
            let c = channel_offset(ch);
            let head = rig.read(s, c + 0x10, W32);
            rig.write(s, c + 0x0c, W32, (head + (1 << CH_LOG2) + 1) & 0xffff_ffff);
        }
        for s in 0..2 {
            nodes[s].ring_all(rig, s);
        }
        rig.settle();
        // Faults: stalls are answered first (retry, the page is back), until nothing is held;
        // then a parked channel is resumed, RETRY after the page is back or SKIP, decided by
        // its SQ index.
        for _ in 0..64 {
            resolve_stalls(rig);
            let mut any = false;
            for s in 0..2 {
                for ch in 0..CHANNELS as usize {
                    let c = channel_offset(ch);
                    if rig.read(s, c + 0x30, W32) & 7 != 2 {
                        continue;
                    }
                    any = true;
                    let va = rig.read(s, c + 0x38, AccessWidth::U64);
                    let index = rig.read(s, c + 0x40, W32);
                    let syndrome = rig.read(s, c + 0x44, W32);
                    out.events.push(format!(
                        "fault n{s} ch{ch} idx{index} va{va:#x} syn{syndrome:#x}"
                    ));
                    if mix(index ^ (ch as u64) << 20 ^ (s as u64) << 30).is_multiple_of(2) {
                        rig.smmu(s).restore(read_domain(ch), va).expect("map");
                        rig.write(s, c + 0x48, W32, 1);
                        out.resends += 1;
                    } else {
                        rig.write(s, c + 0x48, W32, 2);
                    }
                }
            }
            if !any {
                break;
            }
            rig.settle();
        }
        for s in 0..2 {
            rig.smmu(s).restore_all().expect("map");
        }
        // Completions, per channel in SQ order.
        let mut cqs: Vec<Vec<Completion>> = vec![Vec::new(), Vec::new()];
        for s in 0..2 {
            nodes[s].drain_cq(rig, s, &mut cqs[s]);
            for c in &cqs[s] {
                let e = &c.entry;
                out.events.push(format!(
                    "cq n{s} ch{} idx{} {:?} bytes{} cookie{:#x} fault{:#x}",
                    c.channel, e.sq_index, e.status, e.bytes, e.cookie, e.fault_addr
                ));
                if let Some(job) = cookies.get(&e.cookie)
                    && e.status == EntryStatus::Ok
                {
                    expect_blocks.push(*job);
                }
                out.transfers += 1;
            }
        }
        // Arrivals, sorted by identity (order between channels is timing); per (source,
        // channel) they must come in sequence.
        for d in 0..2 {
            let arrivals = nodes[d].drain_rq(rig, d);
            let mut sorted: Vec<(u8, (usize, usize, u32, u64), npe_cosim::harness::Arrival)> =
                Vec::new();
            for (slot, a) in arrivals {
                let id = ident(&a.entry.msg);
                let key = (id.0, id.1, a.block_len.is_some());
                let post = post_no(&a.entry.msg);
                if let Some(prev) = last.insert(key, post)
                    && prev >= post
                {
                    out.violations.push(format!(
                        "arrivals of {key:?} at n{d} out of order: post {prev} then {post}"
                    ));
                }
                sorted.push((slot, id, a));
            }
            // Grouped by stream (source node, channel, virtual channel); the order between
            // streams is timing, the order within one is kept (a stable sort) and compared.
            sorted.sort_by_key(|(_, id, a)| (id.0, id.1, a.block_len.is_some()));
            let mut posted = 0;
            for (slot, id, a) in &sorted {
                let kind = match a.entry.kind {
                    RqKind::Msg => "msg".to_string(),
                    RqKind::Block { length, .. } => format!("block{length}"),
                };
                out.events.push(format!(
                    "rq n{d} from{} ch{} seq{} {kind} pdid{} tid{} msg{}",
                    a.entry.src,
                    id.1,
                    id.2,
                    a.entry.pdid,
                    a.entry.tid14,
                    a.entry.msg.len()
                ));
                let Some(len) = a.block_len else { continue };
                let choice = rng.below(100);
                let cookie = u64::from(id.2);
                let r = rig as &mut dyn Rig;
                if choice < 3 {
                    let mut raw = [0u8; 32];
                    raw[0] = 1;
                    raw[1] = *slot;
                    raw[4] = 16;
                    raw[16..24].copy_from_slice(&cookie.to_le_bytes());
                    raw[24] = 1;
                    nodes[d].post_wq_raw(r, d, &raw);
                    resend.extend(all_jobs.get(&id.2).copied());
                } else if choice < 8 {
                    nodes[d].post_wq(
                        r,
                        d,
                        &WqEntry {
                            op: WqOp::Release,
                            slot: *slot,
                            cookie,
                        },
                    );
                    resend.extend(all_jobs.get(&id.2).copied());
                } else {
                    // The commit's domain: the terminating one for faults 8..13, the stalling
                    // one for 13..18, else either; its last page unmapped or write-protected.
                    let domain = if choice < 13 {
                        0
                    } else if choice < 18 {
                        1
                    } else {
                        usize::from(choice % 2 == 1)
                    };
                    if choice < 18 {
                        let at = id.3 + u64::from(len) - 1;
                        let smmu = r.smmu(d);
                        if choice.is_multiple_of(2) {
                            smmu.unmap(domain, at).expect("unmap");
                        } else {
                            smmu.write_protect(domain, at).expect("protect");
                        }
                    }
                    let pdid = if domain == 1 {
                        a.entry.pdid | STALL_PDID
                    } else {
                        a.entry.pdid & !STALL_PDID
                    };
                    nodes[d].post_wq(
                        r,
                        d,
                        &WqEntry {
                            op: WqOp::Commit {
                                pdid,
                                length: len,
                                dst_va: id.3,
                            },
                            slot: *slot,
                            cookie,
                        },
                    );
                }
                posted += 1;
            }
            if rng.chance(10) {
                let head = rig.read(d, 0x048, W32);
                rig.write(d, 0x044, W32, (head + (1 << ENG_LOG2) + 1) & 0xffff_ffff);
            }
            if posted > 0 {
                nodes[d].ring_wq(rig, d);
            }
        }
        rig.settle();
        resolve_stalls(rig);
        for d in 0..2 {
            for w in nodes[d].drain_wcq(rig, d) {
                out.events.push(format!(
                    "wcq n{d} {:?} bytes{} cookie{} fault{:#x} resp{}",
                    w.status, w.bytes, w.cookie, w.fault_addr, w.axi_resp
                ));
                if w.status == EntryStatus::DstFault {
                    // The protocol would NACK and re-send the block.
                    if let Some(job) = expect_blocks.iter().find(|j| u64::from(j.seq) == w.cookie) {
                        resend.push(*job);
                        out.resends += 1;
                    }
                }
            }
            rig.smmu(d).restore_all().expect("map");
            let gevent = rig.read(d, 0x014, W32);
            out.events.push(format!("gevent n{d} {gevent:#x}"));
            // The engine's own counts of blocks sent and received (re-sends included).
            out.events.push(format!(
                "blocks n{d} tx{} rx{}",
                rig.read(d, 0x068, W32),
                rig.read(d, 0x06c, W32)
            ));
            rig.write(d, 0x014, W32, gevent);
        }
        // Every 16th round, a corrupted packet: data and control, from either node.
        if round % 16 == 15 {
            let k = round / 16;
            corrupted_packet(
                rig,
                &mut nodes,
                &mut out,
                (k / 2 % 2) as usize,
                (k % 2) as usize,
                k,
            );
        }
        round += 1;
    }
    for d in 0..2 {
        let mut mem = vec![0u8; DST_SPAN as usize];
        rig.dram(d)
            .read_phys(PhysAddr::new(DST_AT), &mut mem)
            .expect("in DRAM");
        out.mem[d] = mem;
    }
    out
}

/// What the MMU-500s of a rig answered on the data ports: (terminated reads, terminated
/// writes, stalled reads, stalled writes), and stalled accesses the fault service resumed,
/// both nodes summed.
fn smmu_counts(rig: &dyn Rig) -> [u64; 5] {
    let mut c = [0; 5];
    for n in 0..2 {
        let smmu: &NodeSmmu = rig.smmu_ref(n);
        let p = *smmu.counts();
        c[0] += p.terminated_reads;
        c[1] += p.terminated_writes;
        c[2] += p.stalled_reads;
        c[3] += p.stalled_writes;
        c[4] += smmu.stall_counts().resumed;
    }
    c
}

/// The workload's size: `NPE_DIFF_TRANSFERS` descriptors completed (at least; a round is
/// finished), 2,000 by default. `NPE_DIFF_TRANSFERS=10000` is the size.
fn target() -> u64 {
    std::env::var("NPE_DIFF_TRANSFERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

#[test]
fn model_and_rtl_agree_on_a_seeded_workload_with_faults() {
    let transfers = target();
    let seed = 0x5eed_1234;
    let started = std::time::Instant::now();
    let mut model = ModelRig::new(PAGES);
    let a = run(&mut model, seed, transfers);
    let model_time = started.elapsed();
    let mut rtl = RtlRig::new(PAGES, 15, seed);
    let b = run(&mut rtl, seed, transfers);
    let cycles = rtl.system().cycles();
    let (ma, mb) = (smmu_counts(&model), smmu_counts(&rtl));
    println!(
        "differential: {} transfers, {} events, {} re-sends; model {:.2} s, RTL {:.2} s ({} clocks)",
        a.transfers,
        a.events.len(),
        a.resends,
        model_time.as_secs_f64(),
        (started.elapsed() - model_time).as_secs_f64(),
        cycles
    );
    let count = |what: &str| a.events.iter().filter(|e| e.contains(what)).count();
    println!(
        "differential: completions SRC_FAULT {}, DST_FAULT {}, BAD_DESCRIPTOR {}, LINK_ERROR {}; \
         corrupted frames {}; SMMU (model / RTL): terminated reads {} / {}, writes {} / {}, \
         stalled reads {} / {}, writes {} / {}; stalls resumed by the fault service {} / {}",
        count("SrcFault"),
        count("DstFault"),
        count("BadDescriptor"),
        count("LinkError"),
        count("attempt0"),
        ma[0],
        mb[0],
        ma[1],
        mb[1],
        ma[2],
        mb[2],
        ma[3],
        mb[3],
        ma[4],
        mb[4]
    );
    if let Some(i) =
        (0..a.events.len().max(b.events.len())).find(|&i| a.events.get(i) != b.events.get(i))
    {
        panic!(
            "first differing event (#{i}):\n  model: {:?}\n  rtl:   {:?}",
            a.events.get(i),
            b.events.get(i)
        );
    }
    assert_eq!(a.violations, Vec::<String>::new(), "model: arrival order");
    assert_eq!(b.violations, Vec::<String>::new(), "rtl: arrival order");
    for d in 0..2 {
        if let Some(i) = (0..a.mem[d].len()).find(|&i| a.mem[d].get(i) != b.mem[d].get(i)) {
            panic!(
                "node {d}: destination bytes differ first at {:#x}: model {:#04x}, rtl {:#04x}",
                DST_AT + i as u64,
                a.mem[d][i],
                b.mem[d].get(i).copied().unwrap_or(0)
            );
        }
    }
    // The workload reached every path it is meant to.
    for what in ["SrcFault", "DstFault", "BadDescriptor", "LinkError"] {
        assert!(count(what) > 0, "no {what} completion");
    }
    assert!(
        a.events
            .iter()
            .any(|e| e.contains("attempt0") && e.contains("vc0") && e.ends_with("0x4"))
            && a.events
                .iter()
                .any(|e| e.contains("attempt0") && e.contains("vc1") && e.ends_with("0x4")),
        "a corrupted block and a corrupted message were dropped (CRC_DROP)"
    );
    let gevents = |bit: u64| {
        a.events
            .iter()
            .filter_map(|e| e.strip_prefix("gevent ")?.rsplit_once(" 0x"))
            .filter(|(_, v)| u64::from_str_radix(v, 16).is_ok_and(|v| v & bit != 0))
            .count()
    };
    assert!(gevents(1) > 0, "a bad doorbell (BAD_DOORBELL)");
    assert!(gevents(2) > 0, "an unreachable peer (LINK_ERROR)");
    for (rig, c) in [("model", ma), ("rtl", mb)] {
        assert!(
            c.iter().all(|&n| n > 0),
            "{rig}: terminated and stalled reads and writes: {c:?}"
        );
    }
}
