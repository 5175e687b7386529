//! The soak's checks count what they catch (`sim::vqfdb::soak`, `nprdma soak`): a duplicated
//! or reordered completion or delivery, put in through the seams between the drivers and the
//! application, is counted as such (the application's own checks, not driver state, see it);
//! a data packet corrupted so that its CRC still matches is caught by the byte check and
//! counted; and the incast configuration fills the receiver's ingress (RX_HELD) without
//! losing anything.

use protocol::{Completion, Delivery};
use sim::Integrity;
use sim::vqfdb::soak::{self, LinkErrors};
use sim::vqfdb::{Seams, SimConfig, SimError, run_with_seams};

/// The soak's one-QFDB configuration, small.
fn small(transfers: u64, fault_rate: f64) -> SimConfig {
    let [one_qfdb, ..] = soak::configurations(transfers, 4096, fault_rate, 1);
    one_qfdb.cfg
}

fn counts(result: Result<sim::vqfdb::RunReport, SimError>) -> Integrity {
    match result {
        Err(SimError::Integrity(i)) => i,
        other => panic!("expected an integrity failure, got {other:?}"),
    }
}

#[test]
fn a_duplicated_completion_and_delivery_are_counted() {
    let cfg = small(400, 0.01);
    let mut done = false;
    let seams = Seams {
        completions: Some(Box::new(|p: usize, c: Completion| {
            if p == 3 && c.tid.0 == 7 {
                vec![c, c]
            } else {
                vec![c]
            }
        })),
        deliveries: Some(Box::new(|p: usize, d: Delivery| {
            if p == 5 && d.tid.0 == 20 && !done {
                done = true;
                vec![d, d]
            } else {
                vec![d]
            }
        })),
        ..Seams::default()
    };
    let i = counts(run_with_seams(&cfg, &mut |_, _| {}, seams));
    assert_eq!(
        i,
        Integrity {
            duplicated: 2,
            ..Integrity::default()
        }
    );
}

#[test]
fn a_reordered_completion_and_delivery_are_counted_once_each() {
    let cfg = small(400, 0.01);
    // Hold transfer 4 of pair 2 back and hand it over after transfer 5 (a swap: one
    // completion late); the same for the deliveries of transfer 9 of pair 6.
    let mut held_c = None;
    let mut held_d = None;
    let seams = Seams {
        completions: Some(Box::new(move |p: usize, c: Completion| {
            match (p, c.tid.0) {
                (2, 4) => {
                    held_c = Some(c);
                    Vec::new()
                }
                (2, 5) => std::iter::once(c).chain(held_c.take()).collect(),
                _ => vec![c],
            }
        })),
        deliveries: Some(Box::new(move |p: usize, d: Delivery| match (p, d.tid.0) {
            (6, 9) => {
                held_d = Some(d);
                Vec::new()
            }
            (6, 10) => std::iter::once(d).chain(held_d.take()).collect(),
            _ => vec![d],
        })),
        ..Seams::default()
    };
    let i = counts(run_with_seams(&cfg, &mut |_, _| {}, seams));
    assert_eq!(
        i,
        Integrity {
            reordered: 2,
            ..Integrity::default()
        }
    );
}

#[test]
fn a_lost_completion_is_counted() {
    let cfg = small(200, 0.0);
    let seams = Seams {
        completions: Some(Box::new(|p: usize, c: Completion| {
            if p == 1 && c.tid.0 == 3 {
                Vec::new()
            } else {
                vec![c]
            }
        })),
        ..Seams::default()
    };
    let i = counts(run_with_seams(&cfg, &mut |_, _| {}, seams));
    assert_eq!(i.lost, 1, "{i}");
    assert_eq!((i.duplicated, i.reordered, i.corrupted), (0, 0, 0));
}

#[test]
fn corruption_the_crc_cannot_see_is_caught_by_the_byte_check() {
    // No faults and no other link errors: nothing is re-sent, so every corrupted block stays
    // in the destination buffer and the transfer it belongs to is counted.
    let cfg = small(400, 0.0);
    let errors = LinkErrors {
        undetected: 0.01,
        ..LinkErrors::default()
    };
    let (result, injected) = soak::run(&cfg, &errors, &mut |_, _| {});
    assert!(injected.undetected_blocks > 0);
    let i = counts(result);
    assert_eq!(
        i,
        Integrity {
            corrupted: injected.undetected_blocks,
            ..Integrity::default()
        }
    );
}

#[test]
fn the_incast_fills_the_receive_ingress_and_loses_nothing() {
    let [_, _, incast] = soak::configurations(16_000, 4096, 0.01, 1);
    let errors = LinkErrors {
        drop: 0.0005,
        corrupt: 0.0005,
        undetected: 0.0,
    };
    let (result, _) = soak::run(&incast.cfg, &errors, &mut |_, _| {});
    let r = result.unwrap();
    assert!(r.rx_held > 0, "RX_HELD never reached");
    assert_eq!(r.transfers, incast.cfg.transfers);
    assert!(r.integrity.is_clean());
}
