//! The driver's probe against the RTL: each `Npe::new` reads its engine's `ID` register
//! (MAGIC and VERSION, docs/dma-engine.md §3.1) from the Verilated NPE and checks it, with
//! the register-map hash, against what the bitstream's manifest declares
//! (`fpga_bitstreams::manifest`, docs/fpga-bitstreams.md).

use std::sync::{Arc, Mutex};

use dma_engine::DmaError;
use dma_engine::npe::regmap::{DRIVER_DESIGN, REGMAP_HASH, probe_design};
use dma_engine::npe::regs::{MAGIC, VERSION};
use fpga_bitstreams::manifest::Manifest;
use hal::PhysAddr;
use hal::dma::HostDma;
use hal::regs::{AccessWidth, RegisterBus};
use npe_cosim::CosimError;
use npe_cosim::board::{Board, DRAM_PAGES, FaultModes};
use npe_cosim::node_smmu::NodeSmmu;
use npe_cosim::rig::{STREAM_BASE, WINDOWS};
use npe_cosim::{CosimBus, System};
use sim::axi::AxiTranslate;
use smmu_driver::v2::FaultModel;

fn dram() -> Arc<HostDma> {
    Arc::new(HostDma::new(PhysAddr::new(0), DRAM_PAGES).expect("host memory"))
}

const MODES: FaultModes = FaultModes {
    read: FaultModel::Terminate,
    write: FaultModel::Terminate,
};

/// The manifest `cargo xtask image zcu102` writes for this driver's design, as text and back.
fn zcu102_manifest() -> Manifest {
    let m = Manifest::new(&boards::zynqmp::pl::ZCU102_PL, "npe_top");
    Manifest::parse(&m.to_text()).expect("a manifest reads back")
}

#[test]
fn both_drivers_probe_the_rtl_with_the_manifests_design() {
    let dram = dram();
    let m = zcu102_manifest();
    assert_eq!(m.design_id(), DRIVER_DESIGN);
    let board = Board::with_design(&dram, MODES, 0, 1, m.design_id()).expect("probe passes");
    for engine in 0..2 {
        assert!(board.driver(engine).is_ok());
    }
}

#[test]
fn a_manifest_with_another_register_map_is_refused_at_probe() {
    let dram = dram();
    let mut m = zcu102_manifest();
    m.regmap_hash ^= 1;
    match Board::with_design(&dram, MODES, 0, 1, m.design_id()) {
        Err(CosimError::Dma(e)) => assert_eq!(
            e,
            DmaError::DesignMismatch {
                engine_version: VERSION,
                manifest_version: VERSION,
                manifest_hash: REGMAP_HASH ^ 1,
                driver_hash: REGMAP_HASH,
            }
        ),
        Err(e) => panic!("expected DesignMismatch, got {e}"),
        Ok(_) => panic!("a driver accepted a foreign register map"),
    }
    let mut newer = zcu102_manifest();
    newer.npe_version = VERSION + 1;
    assert!(matches!(
        Board::with_design(&dram, MODES, 0, 1, newer.design_id()),
        Err(CosimError::Dma(DmaError::DesignMismatch {
            manifest_version, ..
        })) if manifest_version == VERSION + 1
    ));
}

#[test]
fn probe_design_reads_the_rtl_id_register() {
    let dram = Arc::new(HostDma::new(PhysAddr::new(0), 1024).expect("host memory"));
    let smmu = NodeSmmu::new(&dram, STREAM_BASE, &WINDOWS).expect("the node's MMU-500");
    let ports: Vec<Box<dyn AxiTranslate + Send>> = vec![Box::new(smmu.port())];
    let sys = Arc::new(Mutex::new(System::new(vec![dram], ports, STREAM_BASE, 5)));
    let bus = CosimBus::new(sys, 0);
    assert_eq!(
        bus.read(0, AccessWidth::U32),
        u64::from(MAGIC << 8 | VERSION),
        "the RTL's ID register"
    );
    assert_eq!(probe_design(&bus, zcu102_manifest().design_id()), Ok(()));
    let mut other = zcu102_manifest();
    other.regmap_hash = 0;
    assert!(matches!(
        probe_design(&bus, other.design_id()),
        Err(DmaError::DesignMismatch { .. })
    ));
}
