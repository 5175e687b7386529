//! The cost-based policy's idea of a resolution is the one the fault service schedules: one
//! definition (`CostModel::minor_service`, `major_service`) for the set-up question
//! (`stall_pays`), each fault's decision and the model's own timing.

use super::*;
use crate::vqfdb::scenarios;
use smmu_driver::fault::{AccessKind, FaultEstimate};

/// Node 0's first destination page that is resident after set-up, and the world.
fn world_with_page(cfg: &SimConfig) -> (World<'static>, u64) {
    let mut w = World::build(cfg, Box::new(|_, _| {})).unwrap();
    w.setup().unwrap();
    let p = w.nodes[0].in_pairs[0];
    let base = w.pairs[p].dst_base;
    let va = (0..cfg.slots as u64 * w.slot_bytes() / PAGE)
        .map(|i| base + i * PAGE)
        .find(|&va| w.nodes[0].mm.mem.is_resident(va))
        .unwrap();
    (w, va)
}

/// Feeds a write fault on `va` at `now` to node 0's fault service; returns when it is
/// resolved.
fn resolve_at(w: &mut World<'_>, va: u64, now: ModelTime) -> ModelTime {
    let node = &mut w.nodes[0];
    let record = FaultService::record_for(node.mm.write_stream, va, Access::Write);
    let costs = w.cfg.costs;
    let actions = node
        .faults
        .on_record(now, &record, &mut node.mm, &costs)
        .unwrap();
    actions
        .iter()
        .find_map(|a| match a {
            FaultAction::Resolve(at, _) => Some(*at),
            _ => None,
        })
        .unwrap()
}

#[test]
fn the_policy_expects_the_resolution_the_model_takes() {
    for sc in scenarios::SCENARIOS {
        let cfg = (sc.config)(Strategy::Hybrid, 100, 1);
        for major in [false, true] {
            let (mut w, va) = world_with_page(&cfg);
            let now = ModelTime::from_ns(1_000_000);
            w.nodes[0].mm.mem.set_now(now).unwrap();
            // Taken away just now (still in memory: minor) or long ago (in swap: major).
            let when = if major { ModelTime::ZERO } else { now };
            w.nodes[0].mm.deactivate_at(va, when).unwrap();
            let expect_major = w.nodes[0].mm.mem.fault_cost(va) == Some(FaultCost::Major);
            assert_eq!(expect_major, major, "{}", sc.name);
            let estimate = if major {
                FaultEstimate::Major
            } else {
                w.nodes[0].mm.mem.estimate_minor()
            };
            let done = resolve_at(&mut w, va, now);
            let policy = w.nodes[0].faults.handler.policy().cost().unwrap();
            // An idle fault CPU: the decision's expectation is the model's resolution time.
            assert_eq!(
                policy.expected_resolve_ns(&estimate),
                Some(done.since(now).as_ns()),
                "{} major {major}",
                sc.name
            );
            if !major {
                // And the set-up question asked the same of the same comparison.
                let c = policy.costs(AccessKind::Read);
                assert_eq!(
                    w.nodes[0].stalling[0],
                    c.stall_ns(done.since(now).as_ns()) <= c.resend_ns(),
                    "{}",
                    sc.name
                );
            }
        }
    }
}

#[test]
fn a_busy_fault_cpu_adds_its_backlog_and_nothing_else() {
    let cfg = (scenarios::SCENARIOS[0].config)(Strategy::Hybrid, 100, 1);
    let (mut w, va) = world_with_page(&cfg);
    let now = ModelTime::from_ns(1_000_000);
    w.nodes[0].mm.mem.set_now(now).unwrap();
    w.nodes[0].mm.deactivate_at(va, now).unwrap();
    w.nodes[0].faults.cpu_free_at = now.after(ModelTime::from_ns(3_000));
    let done = resolve_at(&mut w, va, now);
    let policy = w.nodes[0].faults.handler.policy().cost().unwrap();
    let estimate = w.nodes[0].mm.mem.estimate_minor();
    assert_eq!(
        policy.expected_resolve_ns(&estimate),
        Some(done.since(now).as_ns())
    );
    assert_eq!(
        done.since(now),
        ModelTime::from_ns(3_000).after(cfg.costs.minor_service())
    );
}
