//! Scenario tests of the sender and receiver state machines (docs/protocol.md §5–§7).

use hal::{PageSize, PhysAddr, VirtAddr};
use protocol::wire::{Abort, Ack, BlockHeader, FaultInAck, Nack};
use protocol::{
    AbortReason, Access, Admission, BlockRange, BlockSend, Completion, CompletionStatus, Delivery,
    DeliveryStatus, Disposition, FaultReason, Generation, Ignored, Message, PageEntry,
    PageStateTable, ProtocolError, Receiver, ReceiverConfig, RequestStatus, Sender, SenderConfig,
    TransferDesc, TransferId, Transmit, WriteOutcome,
};

const BS: u32 = 1024;
const ACK_TIMEOUT: u64 = 100;
type Tx = Sender<4, 16>;
type Rx = Receiver<4, 16>;

fn config() -> SenderConfig {
    // Backoff 50 doubling to at most 800; source faults may take 6400.
    SenderConfig {
        max_attempts: 4,
        ..SenderConfig::new(BS, ACK_TIMEOUT)
    }
}

fn sender() -> Tx {
    Tx::new(config()).unwrap()
}

fn receiver() -> Rx {
    Rx::new(ReceiverConfig {
        block_size: BS,
        first_tid: TransferId(0),
    })
    .unwrap()
}

fn desc(tag: u64, blocks: u64) -> TransferDesc {
    TransferDesc {
        src: 0x1000_0000 + tag * 0x1_0000,
        dest: 0x2000_0000 + tag * 0x1_0000,
        len: blocks * u64::from(BS),
        key: 7,
        tag,
    }
}

/// Every block the sender wants to send at `now`; fails on abort notices.
fn blocks(tx: &mut Tx, now: u64) -> Vec<BlockSend> {
    let mut out = Vec::new();
    while let Some(t) = tx.poll_transmit(now) {
        match t {
            Transmit::Block(b) => out.push(b),
            Transmit::Abort(a) => panic!("unexpected abort notice {a:?}"),
        }
    }
    out
}

fn ids(sends: &[BlockSend]) -> Vec<(u32, u32, u16)> {
    sends
        .iter()
        .map(|s| (s.header.tid.0, s.header.block, s.header.attempt))
        .collect()
}

/// The receiver writes the block with `outcome` and returns its reply.
fn arrive(rx: &mut Rx, header: &BlockHeader, outcome: WriteOutcome) -> Message {
    assert_eq!(rx.admit(header).unwrap(), Admission::Write, "{header:?}");
    rx.written(header, outcome).unwrap().expect("a reply")
}

fn ok(rx: &mut Rx, header: &BlockHeader) -> Message {
    arrive(rx, header, WriteOutcome::Written)
}

fn fault(reason: FaultReason) -> WriteOutcome {
    WriteOutcome::Fault {
        reason,
        fatal: false,
    }
}

fn completions(tx: &mut Tx) -> Vec<Completion> {
    std::iter::from_fn(|| tx.poll_completion()).collect()
}

fn deliveries(rx: &mut Rx) -> Vec<Delivery> {
    std::iter::from_fn(|| rx.poll_delivery()).collect()
}

fn statuses(c: &[Completion]) -> Vec<(u32, CompletionStatus)> {
    c.iter().map(|c| (c.tid.0, c.status)).collect()
}

#[test]
fn nack_and_retransmit_of_a_middle_block_completes_in_order() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t0 = tx.submit(desc(10, 4)).unwrap();
    let t1 = tx.submit(desc(11, 4)).unwrap();
    assert_eq!((t0, t1), (TransferId(0), TransferId(1)));

    let sends = blocks(&mut tx, 0);
    let expected: Vec<_> = [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    .into_iter()
    .map(|(t, b)| (t, b, 1))
    .collect();
    assert_eq!(ids(&sends), expected);
    let b2 = sends[2];
    assert_eq!(b2.src, 0x1000_0000 + 10 * 0x1_0000 + 2 * 1024);
    assert_eq!(b2.header.dest, 0x2000_0000 + 10 * 0x1_0000 + 2 * 1024);
    assert_eq!(
        (
            b2.header.len,
            b2.header.block_count,
            b2.header.key,
            b2.header.oldest_open
        ),
        (1024, 4, 7, TransferId(0))
    );

    for send in &sends {
        let reply = if (send.header.tid, send.header.block) == (t0, 1) {
            arrive(&mut rx, &send.header, fault(FaultReason::NotPresent))
        } else {
            ok(&mut rx, &send.header)
        };
        assert_eq!(tx.handle(1, &reply).unwrap(), Disposition::Applied);
    }
    // Transfer 1 is complete at both ends, but must wait behind transfer 0.
    assert!(tx.poll_completion().is_none());
    assert!(rx.poll_delivery().is_none());
    assert!(
        blocks(&mut tx, 2).is_empty(),
        "block 1 waits for the resolution"
    );

    let resolved = rx
        .resolved(t0, BlockRange::single(1), Generation(9))
        .unwrap()
        .unwrap();
    assert_eq!(tx.on_resolved(&resolved).unwrap(), Disposition::Applied);
    let resend = blocks(&mut tx, 3);
    assert_eq!(
        ids(&resend),
        vec![(0, 1, 2)],
        "only the NACKed block is re-sent"
    );
    let reply = ok(&mut rx, &resend[0].header);
    assert_eq!(tx.handle(4, &reply).unwrap(), Disposition::Applied);

    let done = completions(&mut tx);
    assert_eq!(
        statuses(&done),
        vec![(0, CompletionStatus::Ok), (1, CompletionStatus::Ok)]
    );
    assert_eq!(
        (done[0].tag, done[0].retransmissions, done[0].faults),
        (10, 1, 1)
    );
    assert_eq!(
        (done[1].tag, done[1].retransmissions, done[1].faults),
        (11, 0, 0)
    );
    assert!(tx.poll_completion().is_none(), "exactly once");
    let got: Vec<_> = deliveries(&mut rx)
        .iter()
        .map(|d| (d.tid.0, d.status))
        .collect();
    assert_eq!(
        got,
        vec![(0, DeliveryStatus::Complete), (1, DeliveryStatus::Complete)]
    );
    assert_eq!(
        (
            tx.stats().blocks_sent,
            tx.stats().retransmissions,
            tx.stats().nacks
        ),
        (9, 1, 1)
    );
    assert_eq!(tx.open_transfers(), 0);
}

#[test]
fn duplicate_nack_and_stale_nack_change_nothing() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t = tx.submit(desc(1, 2)).unwrap();
    let sends = blocks(&mut tx, 0);
    let nack = arrive(&mut rx, &sends[0].header, fault(FaultReason::Permission));
    let Message::Nack(n) = nack else {
        panic!("expected a NACK, got {nack:?}")
    };
    assert_eq!(
        (n.tid, n.blocks, n.attempt, n.reason, n.fatal),
        (t, BlockRange::single(0), 1, FaultReason::Permission, false)
    );
    let ack = ok(&mut rx, &sends[1].header);
    tx.handle(0, &ack).unwrap();

    assert_eq!(tx.on_nack(0, &n).unwrap(), Disposition::Applied);
    assert_eq!(
        tx.on_nack(10, &n).unwrap(),
        Disposition::Ignored(Ignored::Duplicate)
    );
    assert_eq!((tx.stats().nacks, tx.stats().duplicate_nacks), (1, 1));
    // The duplicate did not restart the backoff: the re-send is due at 0 + 50.
    assert_eq!(tx.next_deadline(), Some(50));
    assert!(blocks(&mut tx, 49).is_empty());
    let resend = blocks(&mut tx, 50);
    assert_eq!(ids(&resend), vec![(0, 0, 2)]);
    // The attempt-1 NACK arriving again now refers to an old attempt.
    assert_eq!(
        tx.on_nack(51, &n).unwrap(),
        Disposition::Ignored(Ignored::Stale)
    );
    // A NACK for an attempt never sent is refused.
    let future = Nack { attempt: 3, ..n };
    assert_eq!(
        tx.on_nack(51, &future).unwrap(),
        Disposition::Ignored(Ignored::BadAttempt)
    );

    // The receiver sees the re-send twice (duplicated by the network): one write.
    let ack = ok(&mut rx, &resend[0].header);
    assert_eq!(
        rx.admit(&resend[0].header).unwrap(),
        Admission::Duplicate(Ack {
            tid: t,
            blocks: BlockRange::single(0),
            attempt: 2
        })
    );
    assert_eq!(tx.handle(52, &ack).unwrap(), Disposition::Applied);
    // The transfer is complete now, so the duplicate ACK finds it finished.
    assert_eq!(
        tx.handle(52, &ack).unwrap(),
        Disposition::Ignored(Ignored::TransferFinished)
    );
    assert_eq!(
        statuses(&completions(&mut tx)),
        vec![(0, CompletionStatus::Ok)]
    );
    assert_eq!(rx.stats().duplicates_dropped, 1);
    assert_eq!(rx.stats().blocks_written, 2);
}

#[test]
fn nack_for_unknown_or_finished_transfer() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t = tx.submit(desc(1, 1)).unwrap();
    let stray = Nack {
        tid: TransferId(5),
        blocks: BlockRange::single(0),
        attempt: 1,
        reason: FaultReason::NotPresent,
        fatal: true,
    };
    assert_eq!(
        tx.on_nack(0, &stray).unwrap(),
        Disposition::Ignored(Ignored::UnknownTransfer)
    );
    assert_eq!(tx.stats().unknown_transfer_messages, 1);
    // A block range beyond the transfer is a protocol violation.
    let wide = Nack {
        tid: t,
        blocks: BlockRange::new(0, 2).unwrap(),
        ..stray
    };
    assert_eq!(
        tx.on_nack(0, &wide),
        Err(ProtocolError::BlockOutOfRange {
            tid: 0,
            block: 1,
            count: 1
        })
    );

    let sends = blocks(&mut tx, 0);
    let ack = ok(&mut rx, &sends[0].header);
    tx.handle(1, &ack).unwrap();
    assert_eq!(
        statuses(&completions(&mut tx)),
        vec![(0, CompletionStatus::Ok)]
    );
    // Unaffected by the stray NACK, and now finished.
    let late = Nack { tid: t, ..stray };
    assert_eq!(
        tx.on_nack(2, &late).unwrap(),
        Disposition::Ignored(Ignored::TransferFinished)
    );
    assert_eq!(
        tx.handle(2, &ack).unwrap(),
        Disposition::Ignored(Ignored::TransferFinished)
    );
    assert_eq!(tx.stats().finished_transfer_messages, 2);

    // Local calls about transfers that never existed are errors.
    assert_eq!(
        tx.cancel(TransferId(9)),
        Err(ProtocolError::UnknownTransfer { tid: 9 })
    );
    let unknown = BlockHeader {
        tid: TransferId(3),
        ..sends[0].header
    };
    assert_eq!(
        rx.written(&unknown, WriteOutcome::Written),
        Err(ProtocolError::UnknownTransfer { tid: 3 })
    );
}

#[test]
fn fault_on_both_ends_of_one_transfer() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t = tx.submit(desc(3, 4)).unwrap();
    let sends = blocks(&mut tx, 0);
    assert_eq!(sends.len(), 4);
    // Block 0: the engine cannot read the source (not emitted). Block 2: the destination
    // faults. Blocks 1 and 3 land.
    assert_eq!(
        tx.source_fault(1, t, 0, 1, FaultReason::NotPresent)
            .unwrap(),
        Disposition::Applied
    );
    assert_eq!(
        tx.source_fault(1, t, 0, 1, FaultReason::NotPresent)
            .unwrap(),
        Disposition::Ignored(Ignored::Duplicate)
    );
    let nack = arrive(&mut rx, &sends[2].header, fault(FaultReason::NotPresent));
    tx.handle(1, &nack).unwrap();
    for i in [1, 3] {
        let ack = ok(&mut rx, &sends[i].header);
        tx.handle(1, &ack).unwrap();
    }
    assert!(
        blocks(&mut tx, 2).is_empty(),
        "both faulting blocks are parked"
    );

    assert_eq!(
        tx.source_resolved(t, BlockRange::single(0)).unwrap(),
        Disposition::Applied
    );
    let resend = blocks(&mut tx, 3);
    assert_eq!(ids(&resend), vec![(0, 0, 2)]);
    let ack = ok(&mut rx, &resend[0].header);
    tx.handle(4, &ack).unwrap();
    assert!(tx.poll_completion().is_none(), "block 2 is still missing");

    let resolved = rx
        .resolved(t, BlockRange::single(2), Generation(1))
        .unwrap()
        .unwrap();
    tx.on_resolved(&resolved).unwrap();
    let resend = blocks(&mut tx, 5);
    assert_eq!(ids(&resend), vec![(0, 2, 2)]);
    let ack = ok(&mut rx, &resend[0].header);
    tx.handle(6, &ack).unwrap();

    let done = completions(&mut tx);
    assert_eq!(statuses(&done), vec![(0, CompletionStatus::Ok)]);
    assert_eq!((done[0].retransmissions, done[0].faults), (2, 2));
    assert_eq!(deliveries(&mut rx).len(), 1);
    assert_eq!(tx.stats().source_faults, 1);
}

#[test]
fn one_block_faulting_at_the_source_then_at_the_destination() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t = tx.submit(desc(4, 2)).unwrap();
    let sends = blocks(&mut tx, 0);
    let ack = ok(&mut rx, &sends[0].header);
    tx.handle(0, &ack).unwrap();
    tx.source_fault(0, t, 1, 1, FaultReason::NotPresent)
        .unwrap();
    tx.source_resolved(t, BlockRange::single(1)).unwrap();
    let second = blocks(&mut tx, 1);
    assert_eq!(ids(&second), vec![(0, 1, 2)]);
    let nack = arrive(&mut rx, &second[0].header, fault(FaultReason::NotPresent));
    tx.handle(1, &nack).unwrap();
    let resolved = rx
        .resolved(t, BlockRange::single(1), Generation(3))
        .unwrap()
        .unwrap();
    tx.on_resolved(&resolved).unwrap();
    let third = blocks(&mut tx, 2);
    assert_eq!(ids(&third), vec![(0, 1, 3)]);
    let ack = ok(&mut rx, &third[0].header);
    tx.handle(2, &ack).unwrap();
    assert_eq!(
        statuses(&completions(&mut tx)),
        vec![(0, CompletionStatus::Ok)]
    );
}

#[test]
fn retry_limit_aborts_with_a_typed_reason() {
    let cfg = SenderConfig {
        max_attempts: 3,
        ..config()
    };
    let mut tx = Tx::new(cfg).unwrap();
    let mut rx = receiver();
    let t = tx.submit(desc(5, 2)).unwrap();
    let sends = blocks(&mut tx, 0);
    let ack = ok(&mut rx, &sends[1].header);
    tx.handle(0, &ack).unwrap();
    // Block 0 and every re-send of it are lost.
    assert_eq!(ids(&blocks(&mut tx, 100)), vec![(0, 0, 2)]);
    assert_eq!(ids(&blocks(&mut tx, 200)), vec![(0, 0, 3)]);
    assert_eq!(tx.stats().timeouts, 2);
    let reason = AbortReason::RetriesExhausted { block: 0 };
    assert_eq!(
        tx.poll_transmit(300),
        Some(Transmit::Abort(Abort {
            tid: t,
            oldest_open: TransferId(1),
            reason
        }))
    );
    assert_eq!(tx.poll_transmit(300), None);
    let done = completions(&mut tx);
    assert_eq!(
        statuses(&done),
        vec![(0, CompletionStatus::Aborted(reason))]
    );
    assert!(tx.poll_completion().is_none());

    let abort_ack = rx
        .on_abort(&Abort {
            tid: t,
            oldest_open: TransferId(1),
            reason,
        })
        .unwrap();
    assert_eq!(tx.on_abort_ack(&abort_ack), Disposition::Applied);
    assert_eq!(tx.open_transfers(), 0);
    let got: Vec<_> = deliveries(&mut rx)
        .iter()
        .map(|d| (d.tid, d.status))
        .collect();
    assert_eq!(got, vec![(t, DeliveryStatus::Aborted(Some(reason)))]);
    // Late traffic of the aborted transfer changes nothing on either side.
    let late_ack = Ack {
        tid: t,
        blocks: BlockRange::single(0),
        attempt: 1,
    };
    assert_eq!(
        tx.on_ack(&late_ack).unwrap(),
        Disposition::Ignored(Ignored::TransferFinished)
    );
    assert_eq!(
        rx.admit(&sends[0].header).unwrap(),
        Admission::Retired(late_ack)
    );
}

#[test]
fn abort_notice_repeats_until_acknowledged_then_gives_up() {
    let mut tx = sender();
    let t = tx.submit(desc(6, 1)).unwrap();
    assert_eq!(tx.cancel(t).unwrap(), Disposition::Applied);
    assert_eq!(
        tx.cancel(t).unwrap(),
        Disposition::Ignored(Ignored::TransferFinished)
    );
    assert_eq!(
        statuses(&completions(&mut tx)),
        vec![(0, CompletionStatus::Aborted(AbortReason::Cancelled))]
    );
    let mut notices = 0;
    for now in (0..1000).step_by(50) {
        while let Some(Transmit::Abort(a)) = tx.poll_transmit(now) {
            assert_eq!((a.tid, a.reason), (t, AbortReason::Cancelled));
            notices += 1;
        }
    }
    assert_eq!(notices, 4, "max_attempts notices, one per ACK timeout");
    assert_eq!(tx.stats().abort_notices_given_up, 1);
    assert_eq!(tx.open_transfers(), 0);
    assert_eq!(tx.next_deadline(), None);
}

#[test]
fn lost_abort_notice_is_recovered_through_oldest_open() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t0 = tx.submit(desc(1, 1)).unwrap();
    tx.cancel(t0).unwrap();
    let t1 = tx.submit(desc(2, 1)).unwrap();
    // The abort notice for t0 is lost; only t1's block arrives.
    let Some(Transmit::Abort(_)) = tx.poll_transmit(0) else {
        panic!("abort notice first")
    };
    let sends = blocks(&mut tx, 0);
    assert_eq!(sends[0].header.oldest_open, t1);
    let ack = ok(&mut rx, &sends[0].header);
    tx.handle(1, &ack).unwrap();
    let got: Vec<_> = deliveries(&mut rx)
        .iter()
        .map(|d| (d.tid, d.status))
        .collect();
    assert_eq!(
        got,
        vec![
            (t0, DeliveryStatus::Aborted(None)),
            (t1, DeliveryStatus::Complete)
        ]
    );
}

#[test]
fn an_abort_notice_after_oldest_open_closed_its_transfer_still_gives_the_reason() {
    let (mut tx, mut rx) = (sender(), receiver());
    let t0 = tx.submit(desc(1, 1)).unwrap();
    tx.cancel(t0).unwrap();
    let t1 = tx.submit(desc(2, 1)).unwrap();
    let Some(Transmit::Abort(notice)) = tx.poll_transmit(0) else {
        panic!("abort notice first")
    };
    // t1's block overtakes the notice and closes t0 without a reason (t1 is still being
    // written, so nothing is delivered yet); then the notice arrives.
    let sends = blocks(&mut tx, 0);
    assert_eq!(sends[0].header.oldest_open, t1);
    assert_eq!(rx.admit(&sends[0].header), Ok(Admission::Write));
    assert!(rx.on_abort(&notice).is_some());
    let first = rx.poll_delivery().unwrap();
    assert_eq!(
        (first.tid, first.status),
        (t0, DeliveryStatus::Aborted(Some(AbortReason::Cancelled)))
    );
}

#[test]
fn transfers_finished_beyond_a_full_window_are_closed_once_it_moves_on() {
    // The receiver's window holds 4 transfers. 0..=3 are open here, 4 never arrived, and
    // the sender has finished all five (their ABORT notices lost). A header of transfer 5
    // says so, but 5 is beyond the window: dropped, and nothing repeats what it said.
    let mut rx = receiver();
    for tid in 0..4 {
        let h = BlockHeader {
            tid: TransferId(tid),
            block: 0,
            block_count: 2,
            attempt: 1,
            oldest_open: TransferId(0),
            len: BS,
            key: 1,
            dest: 0x1000,
        };
        assert_eq!(rx.admit(&h), Ok(Admission::Write));
        rx.written(&h, WriteOutcome::Written).unwrap();
    }
    let next = BlockHeader {
        tid: TransferId(5),
        block: 0,
        block_count: 1,
        attempt: 1,
        oldest_open: TransferId(5),
        len: BS,
        key: 1,
        dest: 0x1000,
    };
    assert_eq!(rx.admit(&next), Ok(Admission::OutOfWindow));
    let got: Vec<_> = deliveries(&mut rx)
        .iter()
        .map(|d| (d.tid.0, d.status))
        .collect();
    let expected: Vec<_> = (0..5)
        .map(|tid| (tid, DeliveryStatus::Aborted(None)))
        .collect();
    assert_eq!(got, expected, "transfer 4 is closed too");
    // A header claiming its own transfer is finished is refused.
    let bogus = BlockHeader {
        tid: TransferId(6),
        oldest_open: TransferId(9),
        ..next
    };
    assert_eq!(
        rx.admit(&bogus),
        Err(ProtocolError::InconsistentTransfer { tid: 6 })
    );
}

#[test]
fn version_bump_during_a_transfer_is_detected() {
    // The destination: one 4 KiB page holding the transfer's four 1 KiB blocks.
    let dest = 0x2000_0000 + 8 * 0x1_0000;
    let mut pages =
        PageStateTable::new(VirtAddr::new(dest), 4096, vec![PageEntry::ABSENT; 1]).unwrap();
    pages
        .mark_present(
            VirtAddr::new(dest),
            PageSize::Size4K,
            PhysAddr::new(0x7000),
            true,
        )
        .unwrap();
    let (mut tx, mut rx) = (sender(), receiver());
    let t = tx.submit(desc(8, 4)).unwrap();
    let sends = blocks(&mut tx, 0);

    // Writes the block the way the engine glue does: snapshot, write, verify.
    let write = |rx: &mut Rx,
                 pages: &mut PageStateTable<Vec<PageEntry>>,
                 h: &BlockHeader,
                 reclaim: bool| {
        assert_eq!(rx.admit(h).unwrap(), Admission::Write);
        let snapshot = pages.generation();
        if reclaim {
            // Swapped out and faulted back in while the block was being written.
            pages.invalidate(VirtAddr::new(dest), 4096).unwrap();
            pages
                .mark_present(
                    VirtAddr::new(dest),
                    PageSize::Size4K,
                    PhysAddr::new(0x9000),
                    true,
                )
                .unwrap();
        }
        let outcome = match pages.check(
            VirtAddr::new(h.dest),
            u64::from(h.len),
            Access::Write,
            snapshot,
        ) {
            Ok(()) => WriteOutcome::Written,
            Err(f) => fault(f.reason),
        };
        rx.written(h, outcome).unwrap().unwrap()
    };
    for (i, send) in sends.iter().enumerate() {
        let reply = write(&mut rx, &mut pages, &send.header, i == 2);
        if i == 2 {
            let Message::Nack(n) = reply else {
                panic!("the change must be caught, got {reply:?}")
            };
            assert_eq!(
                (n.blocks, n.reason),
                (BlockRange::single(2), FaultReason::PageChanged)
            );
        }
        tx.handle(1, &reply).unwrap();
    }
    assert!(tx.poll_completion().is_none());
    let resolved = rx
        .resolved(t, BlockRange::single(2), pages.generation())
        .unwrap()
        .unwrap();
    assert_eq!(resolved.generation, Generation(3));
    tx.on_resolved(&resolved).unwrap();
    let resend = blocks(&mut tx, 2);
    assert_eq!(ids(&resend), vec![(0, 2, 2)]);
    let reply = write(&mut rx, &mut pages, &resend[0].header, false);
    assert!(matches!(reply, Message::Ack(_)));
    tx.handle(3, &reply).unwrap();
    assert_eq!(
        statuses(&completions(&mut tx)),
        vec![(0, CompletionStatus::Ok)]
    );
}

#[test]
fn backoff_resends_without_a_resolved_notice_and_doubles() {
    let (mut tx, mut rx) = (sender(), receiver());
    tx.submit(desc(1, 1)).unwrap();
    let first = blocks(&mut tx, 0);
    let nack = arrive(&mut rx, &first[0].header, fault(FaultReason::NotPresent));
    tx.handle(10, &nack).unwrap();
    assert_eq!(tx.next_deadline(), Some(60));
    let second = blocks(&mut tx, 60);
    assert_eq!(ids(&second), vec![(0, 0, 2)]);
    let nack = arrive(&mut rx, &second[0].header, fault(FaultReason::NotPresent));
    tx.handle(70, &nack).unwrap();
    // The cached deadline may be early (the ACK timeout of attempt 2), never late.
    assert!(tx.next_deadline().unwrap() <= 170);
    assert!(blocks(&mut tx, 169).is_empty());
    assert_eq!(tx.next_deadline(), Some(170), "second backoff is 2 x 50");
    assert_eq!(ids(&blocks(&mut tx, 170)), vec![(0, 0, 3)]);
}

#[test]
fn ack_of_an_older_attempt_completes_the_block() {
    let (mut tx, mut rx) = (sender(), receiver());
    tx.submit(desc(1, 1)).unwrap();
    let first = blocks(&mut tx, 0);
    // The ACK is slow; the block times out and is re-sent; then the first ACK arrives.
    assert_eq!(ids(&blocks(&mut tx, 100)), vec![(0, 0, 2)]);
    let ack = ok(&mut rx, &first[0].header);
    assert_eq!(tx.handle(101, &ack).unwrap(), Disposition::Applied);
    assert_eq!(
        statuses(&completions(&mut tx)),
        vec![(0, CompletionStatus::Ok)]
    );
}

#[test]
fn source_fault_timeout_and_fatal_faults_abort() {
    let mut tx = sender();
    let t0 = tx.submit(desc(1, 1)).unwrap();
    let t1 = tx.submit(desc(2, 1)).unwrap();
    let t2 = tx.submit(desc(3, 2)).unwrap();
    let sends = blocks(&mut tx, 0);
    assert_eq!(sends.len(), 4);
    tx.source_fault(0, t0, 0, 1, FaultReason::NotPresent)
        .unwrap();
    tx.source_fault(0, t1, 0, 1, FaultReason::Permission)
        .unwrap();
    // Misuse: a source fault for an attempt never handed to the engine.
    assert_eq!(
        tx.source_fault(0, t2, 0, 2, FaultReason::NotPresent),
        Err(ProtocolError::InvalidBlockState { tid: 2, block: 0 })
    );
    let fatal = Nack {
        tid: t2,
        blocks: BlockRange::single(1),
        attempt: 1,
        reason: FaultReason::OutOfRegion,
        fatal: true,
    };
    tx.on_nack(0, &fatal).unwrap();
    let mut notices = Vec::new();
    while let Some(Transmit::Abort(a)) = tx.poll_transmit(6400) {
        notices.push((a.tid, a.reason));
    }
    let expected = vec![
        (t0, AbortReason::SourceFaultTimeout { block: 0 }),
        (
            t1,
            AbortReason::SourceFault {
                block: 0,
                reason: FaultReason::Permission,
            },
        ),
        (
            t2,
            AbortReason::RemoteRejected {
                block: 1,
                reason: FaultReason::OutOfRegion,
            },
        ),
    ];
    assert_eq!(notices, expected);
    let done: Vec<_> = completions(&mut tx)
        .iter()
        .map(|c| (c.tid, c.status))
        .collect();
    let expected: Vec<_> = expected
        .into_iter()
        .map(|(t, r)| (t, CompletionStatus::Aborted(r)))
        .collect();
    assert_eq!(done, expected);
}

#[test]
fn a_source_page_the_fault_service_cannot_resolve_aborts_with_its_reason() {
    let mut tx = sender();
    let t0 = tx.submit(desc(1, 2)).unwrap();
    let _ = blocks(&mut tx, 0);
    // Only a block that waits for its source page can be failed this way.
    assert_eq!(
        tx.source_unresolvable(t0, 1, FaultReason::Permission),
        Ok(Disposition::Ignored(Ignored::Stale))
    );
    tx.source_fault(0, t0, 0, 1, FaultReason::NotPresent)
        .unwrap();
    assert_eq!(
        tx.source_unresolvable(t0, 0, FaultReason::Permission),
        Ok(Disposition::Applied)
    );
    let Some(Transmit::Abort(notice)) = tx.poll_transmit(1) else {
        panic!("an ABORT notice is due");
    };
    let reason = AbortReason::SourceFault {
        block: 0,
        reason: FaultReason::Permission,
    };
    assert_eq!((notice.tid, notice.reason), (t0, reason));
    let done: Vec<_> = completions(&mut tx).iter().map(|c| c.status).collect();
    assert_eq!(done, [CompletionStatus::Aborted(reason)]);
}

#[test]
fn window_and_capacity_back_pressure() {
    let mut tx = Tx::new(SenderConfig {
        window: 2,
        ..config()
    })
    .unwrap();
    assert_eq!(tx.config().window, 2);
    tx.submit(desc(1, 1)).unwrap();
    tx.submit(desc(2, 1)).unwrap();
    assert_eq!(
        tx.submit(desc(3, 1)),
        Err(ProtocolError::WindowFull { open: 2 })
    );
    assert_eq!(
        tx.submit(desc(3, 17)),
        Err(ProtocolError::TooManyBlocks {
            blocks: 17,
            max: 16
        })
    );
    assert_eq!(
        tx.submit(TransferDesc {
            len: 0,
            ..desc(3, 1)
        }),
        Err(ProtocolError::EmptyTransfer)
    );
    let mut rx = receiver();
    for send in blocks(&mut tx, 0) {
        let ack = ok(&mut rx, &send.header);
        tx.handle(0, &ack).unwrap();
    }
    // Room again only once the completions are taken.
    assert!(matches!(
        tx.submit(desc(3, 1)),
        Err(ProtocolError::WindowFull { .. })
    ));
    assert_eq!(completions(&mut tx).len(), 2);
    assert_eq!(tx.submit(desc(3, 1)), Ok(TransferId(2)));
    // The window is clamped to the capacity.
    let big = Tx::new(SenderConfig {
        window: 1000,
        ..config()
    })
    .unwrap();
    assert_eq!(big.config().window, 4);
    assert_eq!(
        Tx::new(SenderConfig {
            max_attempts: 0,
            ..config()
        })
        .err(),
        Some(ProtocolError::InvalidConfig {
            field: "max_attempts"
        })
    );
}

#[test]
fn last_block_is_short() {
    let mut tx = sender();
    tx.submit(TransferDesc {
        len: 2 * u64::from(BS) + 10,
        ..desc(1, 1)
    })
    .unwrap();
    let sends = blocks(&mut tx, 0);
    let lens: Vec<_> = sends
        .iter()
        .map(|s| (s.header.len, s.header.block_count))
        .collect();
    assert_eq!(lens, vec![(1024, 3), (1024, 3), (10, 3)]);
    let mut rx = receiver();
    for s in &sends {
        ok(&mut rx, &s.header);
    }
    assert_eq!(deliveries(&mut rx)[0].block_count, 3);
}

#[test]
fn server_path_remote_fault_and_fault_in() {
    let mut tx = sender();
    let t = tx.submit(desc(2, 3)).unwrap();
    let sends = blocks(&mut tx, 0);
    // A one-sided check of the destination's page state failed for blocks 1..=2.
    let request = tx
        .remote_fault(
            5,
            t,
            BlockRange::new(1, 2).unwrap(),
            1,
            FaultReason::NotPresent,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        (request.tid, request.blocks, request.access),
        (t, BlockRange::new(1, 2).unwrap(), Access::Write)
    );
    assert_eq!((request.addr, request.len), (sends[1].header.dest, 2048));
    assert!(blocks(&mut tx, 6).is_empty());
    let answer = FaultInAck {
        req_seq: request.req_seq,
        tid: t,
        blocks: request.blocks,
        status: RequestStatus::Ok,
        generation: Generation(4),
    };
    assert_eq!(
        tx.handle(7, &Message::FaultInAck(answer)).unwrap(),
        Disposition::Applied
    );
    assert_eq!(ids(&blocks(&mut tx, 8)), vec![(0, 1, 2), (0, 2, 2)]);

    // A failed fault-in aborts.
    let request = tx
        .remote_fault(9, t, BlockRange::single(2), 2, FaultReason::NotPresent)
        .unwrap()
        .unwrap();
    assert_eq!(request.req_seq, 1);
    let failed = FaultInAck {
        status: RequestStatus::Failed(FaultReason::Permission),
        ..answer
    };
    tx.on_fault_in_ack(&failed).unwrap();
    let done = completions(&mut tx);
    assert_eq!(
        statuses(&done),
        vec![(
            0,
            CompletionStatus::Aborted(AbortReason::RemoteRejected {
                block: 1,
                reason: FaultReason::Permission
            })
        )]
    );
}

#[test]
fn a_late_failed_fault_in_answer_for_blocks_acknowledged_since_changes_nothing() {
    let mut tx = sender();
    let t = tx.submit(desc(1, 2)).unwrap();
    let _ = blocks(&mut tx, 0);
    let request = tx
        .remote_fault(1, t, BlockRange::single(0), 1, FaultReason::NotPresent)
        .unwrap()
        .unwrap();
    // No answer in time: the backoff re-sends block 0, and that copy is acknowledged.
    let again = blocks(&mut tx, 1_000);
    assert!(
        again
            .iter()
            .any(|b| (b.header.block, b.header.attempt) == (0, 2))
    );
    tx.on_ack(&Ack {
        tid: t,
        blocks: BlockRange::single(0),
        attempt: 2,
    })
    .unwrap();
    let late = FaultInAck {
        req_seq: request.req_seq,
        tid: t,
        blocks: BlockRange::single(0),
        status: RequestStatus::Failed(FaultReason::NotPresent),
        generation: Generation(9),
    };
    assert_eq!(
        tx.on_fault_in_ack(&late),
        Ok(Disposition::Ignored(Ignored::Stale))
    );
    assert!(
        completions(&mut tx).is_empty(),
        "the transfer is not aborted"
    );
}

#[test]
fn receiver_rejects_protocol_violations() {
    let mut rx = receiver();
    let header = BlockHeader {
        tid: TransferId(0),
        block: 0,
        block_count: 2,
        attempt: 1,
        oldest_open: TransferId(0),
        len: BS,
        key: 0,
        dest: 0,
    };
    assert_eq!(rx.admit(&header).unwrap(), Admission::Write);
    assert_eq!(
        rx.admit(&BlockHeader {
            block_count: 3,
            ..header
        }),
        Err(ProtocolError::InconsistentTransfer { tid: 0 })
    );
    assert_eq!(
        rx.admit(&BlockHeader {
            block_count: 17,
            ..header
        }),
        Err(ProtocolError::TooManyBlocks {
            blocks: 17,
            max: 16
        })
    );
    assert_eq!(
        rx.admit(&BlockHeader { len: 100, ..header }),
        Err(ProtocolError::BadBlockLength {
            tid: 0,
            block: 0,
            len: 100
        })
    );
    assert_eq!(
        rx.admit(&BlockHeader {
            block: 1,
            len: BS + 1,
            ..header
        }),
        Err(ProtocolError::BadBlockLength {
            tid: 0,
            block: 1,
            len: BS + 1
        })
    );
    // Beyond the window of 4 transfers: dropped, not an error.
    assert_eq!(
        rx.admit(&BlockHeader {
            tid: TransferId(4),
            ..header
        }),
        Ok(Admission::OutOfWindow)
    );
    // A fatal write fault; and an unresolvable one.
    let nack = rx
        .written(
            &header,
            WriteOutcome::Fault {
                reason: FaultReason::OutOfRegion,
                fatal: false,
            },
        )
        .unwrap();
    assert!(matches!(
        nack,
        Some(Message::Nack(Nack { fatal: true, .. }))
    ));
    let nack = rx
        .unresolvable(
            TransferId(0),
            BlockRange::single(0),
            FaultReason::NotPresent,
        )
        .unwrap()
        .unwrap();
    assert!(nack.fatal);
}

#[test]
fn sender_and_receiver_can_be_built_in_statics() {
    // What a bare-metal driver does: no large stack temporaries.
    static TX: Result<Tx, ProtocolError> = Tx::new(SenderConfig::new(BS, ACK_TIMEOUT));
    static RX: Result<Rx, ProtocolError> = Rx::new(ReceiverConfig {
        block_size: BS,
        first_tid: TransferId(0),
    });
    let tx = TX.as_ref().unwrap();
    assert_eq!(
        (
            tx.config().window,
            tx.config().max_attempts,
            tx.config().backoff_initial
        ),
        (4, 8, 50)
    );
    assert_eq!(RX.as_ref().unwrap().window(), 4);
}

#[test]
fn current_attempt_for_transports_without_attempt_numbers() {
    let mut tx = sender();
    let t = tx.submit(desc(1, 2)).unwrap();
    assert_eq!(tx.current_attempt(t, 0), Some(0));
    blocks(&mut tx, 0);
    assert_eq!(tx.current_attempt(t, 1), Some(1));
    assert_eq!(
        ids(&blocks(&mut tx, ACK_TIMEOUT)),
        vec![(0, 0, 2), (0, 1, 2)]
    );
    assert_eq!(tx.current_attempt(t, 0), Some(2));
    // An ACK reported as attempt 1 completes the block whatever attempt landed.
    tx.on_ack(&Ack {
        tid: t,
        blocks: BlockRange::single(0),
        attempt: 1,
    })
    .unwrap();
    assert_eq!(tx.current_attempt(t, 0), None);
    assert_eq!(tx.current_attempt(t, 2), None);
    assert_eq!(tx.current_attempt(TransferId(8), 0), None);
}

#[test]
fn a_second_copy_is_not_written_while_the_first_is_in_flight_and_delivery_waits_for_it() {
    let mut tx = sender();
    let mut rx = receiver();
    tx.submit(desc(1, 2)).unwrap();
    let sends = blocks(&mut tx, 0);
    let (b0, b1) = (&sends[0].header, &sends[1].header);
    // Block 1 lands; block 0 is admitted, and a duplicated copy of it arrives before its
    // write has been reported.
    ok(&mut rx, b1);
    assert_eq!(rx.admit(b0).unwrap(), Admission::Write);
    assert_eq!(rx.admit(b0).unwrap(), Admission::InFlight);
    assert_eq!(rx.stats().in_flight_dropped, 1);
    assert_eq!(rx.poll_delivery(), None, "block 0 is not written yet");
    let reply = rx.written(b0, WriteOutcome::Written).unwrap();
    assert!(matches!(reply, Some(Message::Ack(_))), "{reply:?}");
    assert_eq!(
        rx.poll_delivery().map(|d| d.status),
        Some(DeliveryStatus::Complete)
    );
    // Once written, further copies are duplicates, never writes.
    assert!(matches!(rx.admit(b0).unwrap(), Admission::Retired(_)));

    // A transfer aborted while one of its writes is in flight is delivered only after that
    // write has been reported: until then the write may still land in its memory.
    tx.submit(desc(2, 2)).unwrap();
    let sends = blocks(&mut tx, 1);
    let h = &sends[0].header;
    assert_eq!(rx.admit(h).unwrap(), Admission::Write);
    let abort = Abort {
        tid: h.tid,
        reason: AbortReason::Cancelled,
        oldest_open: h.tid,
    };
    assert!(rx.on_abort(&abort).is_some());
    assert_eq!(rx.poll_delivery(), None, "a write is in flight");
    assert_eq!(rx.written(h, WriteOutcome::Written).unwrap(), None);
    assert!(matches!(
        rx.poll_delivery().map(|d| d.status),
        Some(DeliveryStatus::Aborted(_))
    ));

    // A faulted write ends the flight: the next copy is written again.
    tx.submit(desc(3, 1)).unwrap();
    let sends = blocks(&mut tx, 2);
    let h = &sends[0].header;
    assert_eq!(rx.admit(h).unwrap(), Admission::Write);
    assert!(matches!(
        rx.written(h, fault(FaultReason::NotPresent)).unwrap(),
        Some(Message::Nack(_))
    ));
    assert_eq!(rx.admit(h).unwrap(), Admission::Write);
}
