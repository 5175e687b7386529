//! The stream IDs the engine's data port carries, as the board description
//! (`boards::zynqmp::pl::ZCU102_PL`) defines them, as `sim`'s NPE model computes them, and as
//! the co-simulation rigs map them: one set of values (docs/fpga-bitstreams.md §1). This crate
//! depends on both `boards` and `sim`, so the comparison lives here.

use boards::zynqmp::pl::ZCU102_PL;
use npe_cosim::rig::STREAM_BASE;

#[test]
fn sim_model_rigs_and_board_agree_on_every_data_stream() {
    let board = ZCU102_PL.npes[0];
    assert_eq!(STREAM_BASE, board.stream_base().0);
    for node in 0..2 {
        let model = sim::npe::NpeModelParams::new(node, 2);
        assert_eq!(model.stream_base, STREAM_BASE, "node {node}");
        for pdid in 0..64u16 {
            for write in [false, true] {
                assert_eq!(
                    model.stream_of(pdid, write),
                    board.stream_of(pdid, write),
                    "node {node}, PDID {pdid}, write {write}"
                );
            }
        }
    }
    // The board's values are the ones docs/fpga-bitstreams.md §1 lists for HP0.
    assert_eq!(board.stream_of(0, false).0, 0xE80);
    assert_eq!(board.stream_of(0x1f, true).0, 0xEBF);
}
