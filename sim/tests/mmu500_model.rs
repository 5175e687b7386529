//! The MMU-500 model on its own, programmed with raw register writes (values from IHI0062,
//! Linux arm-smmu.h and UG1087, not from the driver), and driven by the zDMA model.

mod common;

use common::*;
use hal::model::RegisterModel;
use hal::regs::{AccessWidth, RegisterBus};
use sim::bus::AxiResponse;
use sim::mmu500::{Mmu500, Mmu500Config};
use sim::soc::{Soc, Window};

const CB0: usize = 0x1_0000;
const GR1: usize = 0x1000;
const FSR: usize = CB0 + 0x58;
const RESUME: usize = CB0 + 0x8;
const TF: u64 = 1 << 1;
const SS: u64 = 1 << 30;
const MULTI: u64 = 1 << 31;
/// FSR.FORMAT = 0b10 (AArch64), shown with a recorded fault.
const FORMAT: u64 = 0b10 << 9;

fn w32(bus: &Window, offset: usize, value: u64) {
    bus.write(offset, AccessWidth::U32, value);
}
fn r32(bus: &Window, offset: usize) -> u64 {
    bus.read(offset, AccessWidth::U32)
}

/// Context bank 0: AArch64 stage 1 over `root`, 48-bit, with `sctlr`; SMR0/S2CR0 route
/// `stream`/`mask` to it; sCR0 enables the SMMU with GFRE|GFIE and unmatched streams faulting.
fn program(bus: &Window, root: u64, sctlr: u64, stream: u64, mask: u64) {
    w32(bus, GR1 + 0x800, 1); // CBA2R0.VA64
    w32(bus, GR1, 1 << 16); // CBAR0.TYPE = stage 1, stage 2 bypass
    w32(bus, CB0 + 0x10, 5); // TCR2.PASIZE = 48 bits
    w32(bus, CB0 + 0x30, 16); // TCR.T0SZ = 16, TG0 = 4 KiB
    bus.write(CB0 + 0x20, AccessWidth::U64, root); // TTBR0, ASID 0
    w32(bus, CB0, sctlr);
    w32(bus, 0xc00, 0); // S2CR0: translate via CB0
    w32(bus, 0x800, 1 << 31 | mask << 16 | stream); // SMR0
    w32(bus, 0x0, 1 << 1 | 1 << 2 | 1 << 10); // sCR0: GFRE, GFIE, USFCFG
}

/// Starts GDMA channel `n` copying `len` bytes with raw register writes.
fn zdma_start(soc: &Soc, n: usize, src: u64, dst: u64, len: u64) {
    let ch = soc.gdma_window(n).unwrap();
    w32(&ch, 0x128, src & 0xffff_ffff);
    w32(&ch, 0x12c, src >> 32);
    w32(&ch, 0x130, len);
    w32(&ch, 0x138, dst & 0xffff_ffff);
    w32(&ch, 0x13c, dst >> 32);
    w32(&ch, 0x140, len);
    w32(&ch, 0x200, 1);
}

const M: u64 = 1;
const CFRE: u64 = 1 << 5;
const CFIE: u64 = 1 << 6;
const CFCFG: u64 = 1 << 7;
const HUPCF: u64 = 1 << 8;

#[test]
fn identification_registers_are_the_zynqmps() {
    let mut m = Mmu500::new(Mmu500Config::zynqmp()).unwrap();
    assert_eq!(m.size(), 0x2_0000);
    // UG1087 SMMU_SIDR1 reset value.
    assert_eq!(m.read(0x24, AccessWidth::U32), 0x3000_0f10);
    let idr0 = m.read(0x20, AccessWidth::U32);
    assert_eq!(idr0 & 0xff, 48, "NUMSMRG");
    assert_eq!((idr0 >> 9) & 0xf, 15, "NUMSIDB");
    assert_eq!(idr0 >> 27 & 0xf, 0b1111, "S1TS S2TS NTS SMS");
    // UG1087 reset values of a context bank: SCTLR 0x100, ACTLR 0x3; S2CR faults.
    assert_eq!(m.read(CB0, AccessWidth::U32), 0x100);
    assert_eq!(m.read(CB0 + 4, AccessWidth::U32), 0x3);
    assert_eq!(m.read(0xc00, AccessWidth::U32), 0x2_0000);
    // Non-word accesses are ignored (and recorded).
    m.write(0x0, AccessWidth::U8, 0xff);
    assert_eq!(m.read(0x0, AccessWidth::U32), 1, "still CLIENTPD only");
    assert_eq!(m.unknown_accesses(), &[(0x0, true)]);
    assert!(
        Mmu500::new(Mmu500Config {
            context_banks: 0,
            ..Mmu500Config::zynqmp()
        })
        .is_err()
    );
}

#[test]
fn actlr_writes_take_effect_only_after_cache_lock_is_cleared() {
    let mut m = Mmu500::new(Mmu500Config::zynqmp()).unwrap();
    // r2p1: CACHE_LOCK set after reset; an ACTLR write is ignored while it is.
    assert_ne!(m.read(0x10, AccessWidth::U32) & 1 << 26, 0);
    m.write(CB0 + 4, AccessWidth::U32, 0x1);
    assert_eq!(m.read(CB0 + 4, AccessWidth::U32), 0x3);
    m.write(0x10, AccessWidth::U32, 0);
    m.write(CB0 + 4, AccessWidth::U32, 0x1);
    assert_eq!(m.read(CB0 + 4, AccessWidth::U32), 0x1);
}

#[test]
fn the_driver_reset_turns_the_prefetcher_off_in_every_bank() {
    let soc = Soc::zynqmp().unwrap();
    let _smmu = smmu(&soc, ZYNQMP_SMMU);
    let bus = soc.smmu_window().unwrap();
    assert_eq!(
        bus.read(0x10, AccessWidth::U32) & 1 << 26,
        0,
        "CACHE_LOCK clear"
    );
    for bank in 0..16 {
        let actlr = bus.read(CB0 + bank * 0x1000 + 4, AccessWidth::U32);
        assert_eq!(actlr & 0x2, 0, "ACTLR.CPRE of bank {bank} is still set");
    }
}

#[test]
fn a_driver_told_the_smmu_is_generic_leaves_sacr_and_actlr_alone() {
    use hal::journal::{self, Event};
    use smmu_driver::v2::{DriverConfig, Implementation, SmmuV2};
    let soc = Soc::zynqmp().unwrap();
    let bus = hal::model::RecordingBus::new("smmu", soc.smmu_window().unwrap());
    let config = DriverConfig {
        implementation: Implementation::Generic,
        ..DriverConfig::DEFAULT
    };
    let mut smmu = SmmuV2::probe(&bus, hal::delay::NoDelay::default(), config).unwrap();
    journal::start();
    smmu.reset().unwrap();
    let writes: Vec<usize> = journal::stop()
        .into_iter()
        .filter_map(|e| match e {
            Event::Write { offset, .. } => Some(offset),
            _ => None,
        })
        .collect();
    assert!(writes.contains(&0x000), "sCR0 written: the reset ran");
    assert!(!writes.contains(&0x010), "sACR written");
    assert!(
        !writes.iter().any(|&o| o >= 0x1_0000 && o % 0x1000 == 0x004),
        "ACTLR written"
    );
    // The model's IMPLEMENTATION DEFINED registers keep their reset values.
    let window = soc.smmu_window().unwrap();
    assert_ne!(
        window.read(0x10, AccessWidth::U32) & 1 << 26,
        0,
        "CACHE_LOCK"
    );
    for bank in 0..16 {
        assert_eq!(window.read(CB0 + bank * 0x1000 + 4, AccessWidth::U32), 0x3);
    }
    assert!(soc.lock().smmu.unknown_accesses().is_empty());
}

#[test]
fn fsr_is_w1c_ss_clears_only_by_resume_and_resume_waits_for_a_clear_fsr() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut table = table(dram);
    let src = page_with(dram, 1, |i| i as u8 ^ 0x5a);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, DST, &dst, 1);
    let bus = soc.smmu_window().unwrap();
    program(
        &bus,
        table.root().as_u64(),
        M | CFRE | CFIE | CFCFG | HUPCF,
        0x14e8,
        0,
    );
    zdma_start(&soc, 0, SRC, DST, 4096);

    assert_eq!(r32(&bus, FSR), TF | SS | FORMAT);
    assert_eq!(bus.read(CB0 + 0x60, AccessWidth::U64), SRC, "FAR");
    assert_eq!(r32(&bus, CB0 + 0x68) & 3, 3, "FSYNR0.PLVL: level 3");
    assert_eq!(r32(&bus, CB0 + 0x68) & (1 << 4), 0, "a read");
    assert_eq!(r32(&bus, GR1 + 0x400), 0x14e8, "CBFRSYNRA0");
    assert!(soc.smmu_interrupt());

    w32(&bus, FSR, 0);
    assert_eq!(r32(&bus, FSR), TF | SS | FORMAT, "writing 0 clears nothing");
    w32(&bus, FSR, SS);
    assert_eq!(r32(&bus, FSR), TF | SS | FORMAT, "SS is not W1C");
    w32(&bus, RESUME, 0);
    assert_eq!(
        r32(&bus, FSR),
        TF | SS | FORMAT,
        "RESUME ignored: TF still set"
    );
    assert_eq!(soc.lock().smmu.stats().resumes_ignored, 1);
    assert!(soc.lock().gdma[0].held_by_smmu());

    table
        .map(
            hal::Iova::new(SRC),
            src.bus_addr(),
            hal::PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();
    w32(&bus, FSR, TF);
    assert_eq!(r32(&bus, FSR), SS);
    assert!(
        soc.smmu_interrupt(),
        "SS alone keeps the interrupt asserted"
    );
    w32(&bus, CB0, M | CFRE | CFCFG | HUPCF);
    assert!(!soc.smmu_interrupt(), "until CFIE is masked");
    w32(&bus, RESUME, 0);
    assert_eq!(r32(&bus, FSR), 0);
    assert!(
        !soc.lock().gdma[0].busy(),
        "the retried copy finished within the RESUME write"
    );
    assert_eq!(contents(&dst, 4096), contents(&src, 4096));
    assert_eq!(
        r32(&soc.gdma_window(0).unwrap(), 0x100) & (1 << 10),
        1 << 10,
        "DMA_DONE"
    );
}

#[test]
fn a_second_fault_sets_multi_and_keeps_the_first_syndrome() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut table = table(dram);
    let dst = page_with(dram, 2, |_| 0);
    map(&mut table, DST, &dst, 2);
    let bus = soc.smmu_window().unwrap();
    // Terminate model, HUPCF: both channels fault on their own unmapped source.
    program(
        &bus,
        table.root().as_u64(),
        M | CFRE | CFIE | HUPCF,
        0x14e8,
        0x1,
    );
    zdma_start(&soc, 0, SRC, DST, 64);
    zdma_start(&soc, 1, SRC + 0x2000, DST + 0x1000, 64);
    assert_eq!(r32(&bus, FSR), TF | MULTI | FORMAT);
    assert_eq!(
        bus.read(CB0 + 0x60, AccessWidth::U64),
        SRC,
        "first fault's FAR"
    );
    assert_eq!(r32(&bus, GR1 + 0x400), 0x14e8, "first fault's stream");
    assert_eq!(
        r32(&bus, CB0 + 0x68) & (1 << 11),
        1 << 11,
        "FSYNR0.AFR: abort returned"
    );
    let m = soc.lock();
    assert_eq!(m.gdma[0].isr() & (1 << 8), 1 << 8, "AXI_RD_DATA");
    assert_eq!(m.gdma[1].isr() & (1 << 8), 1 << 8);
    assert_eq!(
        (m.smmu.stats().context_faults, m.smmu.stats().multi),
        (2, 1)
    );
}

#[test]
fn terminating_a_stall_without_cfre_completes_silently_with_zeros() {
    // Why the driver always sets CFRE: without it the master never learns.
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let mut table = table(dram);
    let dst = page_with(dram, 1, |_| 0xff);
    map(&mut table, DST, &dst, 1);
    let bus = soc.smmu_window().unwrap();
    program(&bus, table.root().as_u64(), M | CFCFG | HUPCF, 0x14e8, 0);
    zdma_start(&soc, 0, SRC, DST, 256);
    w32(&bus, FSR, r32(&bus, FSR));
    w32(&bus, RESUME, 1); // TnR = terminate
    let isr = r32(&soc.gdma_window(0).unwrap(), 0x100);
    assert_eq!(isr & (1 << 10), 1 << 10, "DMA_DONE, no error");
    assert_eq!(isr & (3 << 8), 0);
    assert_eq!(contents(&dst, 256), vec![0; 256], "zeros were written");
}

#[test]
fn stream_matching_honours_masks_conflicts_and_the_unmatched_policy() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let table = table(dram);
    let src = page_with(dram, 1, |i| i as u8);
    let dst = page_with(dram, 1, |_| 0);
    let (s, d) = (src.bus_addr().as_u64(), dst.bus_addr().as_u64());
    let bus = soc.smmu_window().unwrap();
    // SMR0 = 0x14e8/0x7 translates (nothing mapped: a context fault); SMR1 bypasses 0x14ea
    // too (conflict).
    program(&bus, table.root().as_u64(), M | CFRE | HUPCF, 0x14e8, 0x7);
    zdma_start(&soc, 5, s, d, 64);
    assert_eq!(r32(&bus, FSR), TF | FORMAT, "GDMA5 (0x14ed) matched SMR0");
    assert_eq!(r32(&bus, GR1 + 0x400), 0x14ed);
    w32(&bus, FSR, TF);

    w32(&bus, 0xc04, 1 << 16); // S2CR1 bypass
    w32(&bus, 0x804, 1 << 31 | 0x14ea); // SMR1
    zdma_start(&soc, 2, s, d, 64);
    assert_eq!(r32(&bus, 0x48), 1 << 2, "sGFSR.SMCF");
    assert_eq!(r32(&bus, 0x54), 0x14ea, "sGFSYNR1");
    w32(&bus, 0x48, 1 << 2);
    assert_eq!(r32(&bus, 0x48), 0);

    // ADMA channel 0 (0x868) matches nothing: USF with USFCFG, bypass without.
    let adma = soc.window(sim::soc::Device::Adma(0)).unwrap();
    let start = |ch: &Window| {
        w32(ch, 0x128, s & 0xffff_ffff);
        w32(ch, 0x12c, s >> 32);
        w32(ch, 0x130, 64);
        w32(ch, 0x138, d & 0xffff_ffff);
        w32(ch, 0x13c, d >> 32);
        w32(ch, 0x200, 1);
    };
    start(&adma);
    assert_eq!(r32(&bus, 0x48), 1 << 1, "sGFSR.USF");
    assert_eq!(r32(&bus, 0x54), 0x868);
    assert_eq!(r32(&adma, 0x100) & (1 << 8), 1 << 8);
    w32(&bus, 0x48, 1 << 1);
    w32(&bus, 0x0, 1 << 1 | 1 << 2); // USFCFG = 0
    w32(&adma, 0x100, 0xfff);
    start(&adma);
    assert_eq!(r32(&adma, 0x100) & (1 << 10), 1 << 10, "bypassed and done");
    assert_eq!(contents(&dst, 64), contents(&src, 64));
    assert_eq!(r32(&bus, 0x48), 0);
}

#[test]
fn tlb_sync_reports_active_for_the_configured_reads() {
    let soc = Soc::zynqmp().unwrap();
    let bus = soc.smmu_window().unwrap();
    w32(&bus, CB0 + 0x7f0, 0);
    let reads: Vec<u64> = (0..4).map(|_| r32(&bus, CB0 + 0x7f4)).collect();
    assert_eq!(reads, [1, 1, 0, 0]);
    w32(&bus, 0x70, 0);
    let reads: Vec<u64> = (0..3).map(|_| r32(&bus, 0x74)).collect();
    assert_eq!(reads, [1, 1, 0]);
    // A 32-bit write to the 64-bit TLBIVA is not an AArch64 invalidation: recorded, ignored.
    w32(&bus, CB0 + 0x600, 0x1234);
    assert_eq!(soc.lock().smmu.unknown_accesses(), &[(CB0 + 0x600, true)]);
    assert_eq!(soc.lock().smmu.stats().tlbi_ops, 0);
}

#[test]
fn an_access_outside_dram_is_a_decode_error() {
    use sim::bus::{Access, AccessResult, MasterPort};
    let soc = Soc::zynqmp().unwrap();
    let mut guard = soc.lock();
    let memory = guard.memory().clone();
    let mut port = sim::soc::SmmuPort::new(&mut guard.smmu, &memory);
    let access = Access {
        stream: 0x14e8,
        address: 0x10,
        len: 8,
        write: false,
        privileged: false,
        instruction: false,
    };
    let mut buf = [0u8; 8];
    // CLIENTPD after reset: bypass to PA 0x10, which is not DRAM.
    assert_eq!(
        port.read(&access, &mut buf),
        AccessResult::Err(AxiResponse::DecErr)
    );
}

/// A context whose page at SRC maps `old` (cached by one copy), then is remapped to `new`.
fn remapped_after_one_copy(
    soc: &Soc,
    tlbi_before_the_pte: bool,
) -> (Window, Vec<u8>, hal::dma::DmaRegion) {
    let dram = &**soc.dram();
    let mut table = table(dram);
    let old = page_with(dram, 1, |_| 0x11);
    let new = page_with(dram, 1, |_| 0x22);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, SRC, &old, 1);
    map(&mut table, DST, &dst, 1);
    let bus = soc.smmu_window().unwrap();
    program(&bus, table.root().as_u64(), M | CFRE | HUPCF, 0x14e8, 0);
    if tlbi_before_the_pte {
        // The invalidation is written before the table changes (the wrong order), and the
        // copy below refills the TLB from the old entry after it.
        bus.write(CB0 + 0x600, AccessWidth::U64, SRC >> 12);
    }
    zdma_start(soc, 0, SRC, DST, 64);
    assert_eq!(contents(&dst, 64), vec![0x11; 64]);
    table.unmap(hal::Iova::new(SRC), 4096, &mut NoTlb).unwrap();
    table
        .map(
            hal::Iova::new(SRC),
            new.bus_addr(),
            hal::PageSize::Size4K,
            &rw(),
            &mut NoTlb,
        )
        .unwrap();
    (bus, contents(&new, 64), dst)
}

#[test]
fn an_invalidation_does_not_cover_entries_cached_after_it_was_written() {
    let soc = Soc::zynqmp().unwrap();
    let (bus, _, dst) = remapped_after_one_copy(&soc, true);
    w32(&bus, CB0 + 0x7f0, 0); // TLBSYNC
    while r32(&bus, CB0 + 0x7f4) & 1 != 0 {} // TLBSTATUS
    zdma_start(&soc, 0, SRC, DST, 64);
    assert_eq!(
        contents(&dst, 64),
        vec![0x11; 64],
        "the entry refilled after the TLBI survives it"
    );
}

#[test]
fn an_invalidation_takes_effect_only_once_its_sync_is_seen_complete() {
    let soc = Soc::zynqmp().unwrap();
    let (bus, new, dst) = remapped_after_one_copy(&soc, false);
    bus.write(CB0 + 0x600, AccessWidth::U64, SRC >> 12); // TLBIVA
    w32(&bus, CB0 + 0x7f0, 0); // TLBSYNC, never polled
    zdma_start(&soc, 0, SRC, DST, 64);
    assert_eq!(
        contents(&dst, 64),
        vec![0x11; 64],
        "not complete yet: the old entry"
    );
    while r32(&bus, CB0 + 0x7f4) & 1 != 0 {}
    zdma_start(&soc, 0, SRC, DST, 64);
    assert_eq!(contents(&dst, 64), new, "complete: the new mapping");
}

#[test]
fn a_64_bit_access_is_taken_only_by_the_64_bit_registers() {
    let mut m = Mmu500::new(Mmu500Config::zynqmp()).unwrap();
    // SCTLR (and the ACTLR above it), SMR0/SMR1, FSR/FSRRESTORE: 32-bit registers.
    m.write(CB0, AccessWidth::U64, 0x161);
    m.write(0x800, AccessWidth::U64, 0x8000_14e8_8000_14e9);
    let _ = m.read(FSR, AccessWidth::U64);
    assert_eq!(m.unknown_accesses().len(), 3);
    assert_eq!(m.read(CB0, AccessWidth::U32), 0x100, "SCTLR unchanged");
    // TTBR0 is a 64-bit register.
    m.write(CB0 + 0x20, AccessWidth::U64, 0x1234_5000);
    assert_eq!(m.read(CB0 + 0x20, AccessWidth::U64), 0x1234_5000);
    assert_eq!(m.unknown_accesses().len(), 3);
}

/// Bank `n` over its own table, with `vmid` (CBAR.VMID, 8-bit VMIDs) and `asid` (TTBR0, 16-bit
/// ASIDs), translating GDMA channel `n`'s stream; returns the page SRC maps to, filled with
/// `fill`, and the page DST maps to. sCR0 is left to the caller.
fn program_bank(
    soc: &Soc,
    n: usize,
    vmid: u64,
    asid: u64,
    fill: u8,
) -> (hal::dma::DmaRegion, hal::dma::DmaRegion) {
    let dram = &**soc.dram();
    let mut table = table(dram);
    let src = page_with(dram, 1, |_| fill);
    let dst = page_with(dram, 1, |_| 0);
    map(&mut table, SRC, &src, 1);
    map(&mut table, DST, &dst, 1);
    let bus = soc.smmu_window().unwrap();
    let cb = CB0 + n * 0x1000;
    w32(&bus, GR1 + 0x800 + 4 * n, 1); // CBA2R.VA64
    w32(&bus, GR1 + 4 * n, 1 << 16 | vmid); // CBAR: stage 1, stage 2 bypass, VMID
    w32(&bus, cb + 0x10, 1 << 4 | 5); // TCR2: AS (16-bit ASIDs), PASIZE = 48 bits
    w32(&bus, cb + 0x30, 16); // TCR.T0SZ = 16, TG0 = 4 KiB
    bus.write(
        cb + 0x20,
        AccessWidth::U64,
        asid << 48 | table.root().as_u64(),
    );
    w32(&bus, cb, M | CFRE | HUPCF);
    w32(&bus, 0xc00 + 4 * n, n as u64); // S2CR: translate via bank n
    w32(&bus, 0x800 + 4 * n, 1 << 31 | (0x14e8 + n as u64)); // SMR: GDMA channel n
    // The tables are not needed after this: the test keeps the pages, DRAM keeps the tables.
    std::mem::forget(table);
    (src, dst)
}

fn two_banks(
    soc: &Soc,
    (vmid0, asid0): (u64, u64),
    (vmid1, asid1): (u64, u64),
) -> [(hal::dma::DmaRegion, hal::dma::DmaRegion); 2] {
    let banks = [
        program_bank(soc, 0, vmid0, asid0, 0xa0),
        program_bank(soc, 1, vmid1, asid1, 0xb1),
    ];
    w32(&soc.smmu_window().unwrap(), 0x0, 1 << 1 | 1 << 2 | 1 << 10); // sCR0
    banks
}

#[test]
fn banks_with_the_same_vmid_and_asid_share_tlb_entries() {
    let soc = Soc::zynqmp().unwrap();
    let [(_, dst0), (_, dst1)] = two_banks(&soc, (0, 7), (0, 7));
    zdma_start(&soc, 0, SRC, DST, 64);
    assert_eq!(contents(&dst0, 64), vec![0xa0; 64]);
    // Bank 1's walk would give its own page, but bank 0's entry has its tags. (DST too hits
    // bank 0's entry, so the copy lands in bank 0's destination page.)
    zdma_start(&soc, 1, SRC, DST, 64);
    assert_eq!(
        contents(&dst1, 64),
        vec![0; 64],
        "bank 1's own page was not used"
    );
    assert_eq!(contents(&dst0, 64), vec![0xa0; 64]);
    assert_eq!(soc.lock().smmu.tlb().len(), 2, "no walk of bank 1's table");
}

#[test]
fn banks_with_different_asids_or_vmids_do_not_share_entries() {
    for (bank1, what) in [((0, 8), "ASID"), ((3, 7), "VMID")] {
        let soc = Soc::zynqmp().unwrap();
        let [(_, dst0), (_, dst1)] = two_banks(&soc, (0, 7), bank1);
        zdma_start(&soc, 0, SRC, DST, 64);
        zdma_start(&soc, 1, SRC, DST, 64);
        assert_eq!(contents(&dst0, 64), vec![0xa0; 64], "another {what}");
        assert_eq!(contents(&dst1, 64), vec![0xb1; 64], "another {what}");
    }
}

/// Writes a context's TLBIALL and waits for its sync.
fn tlbiall_and_sync(bus: &Window, n: usize) {
    let cb = CB0 + n * 0x1000;
    w32(bus, cb + 0x618, 0);
    w32(bus, cb + 0x7f0, 0);
    while r32(bus, cb + 0x7f4) & 1 != 0 {}
}

#[test]
fn a_context_tlbiall_removes_every_entry_of_its_vmid() {
    let soc = Soc::zynqmp().unwrap();
    let bus = soc.smmu_window().unwrap();
    two_banks(&soc, (2, 7), (2, 8));
    zdma_start(&soc, 0, SRC, DST, 64);
    assert_eq!(soc.lock().smmu.tlb().len(), 2);
    // Bank 1 has another ASID, but the same VMID: its TLBIALL reaches bank 0's entries.
    tlbiall_and_sync(&bus, 1);
    assert_eq!(soc.lock().smmu.tlb().len(), 0);

    let soc = Soc::zynqmp().unwrap();
    let bus = soc.smmu_window().unwrap();
    two_banks(&soc, (2, 7), (3, 7));
    zdma_start(&soc, 0, SRC, DST, 64);
    tlbiall_and_sync(&bus, 1);
    assert_eq!(soc.lock().smmu.tlb().len(), 2, "another VMID keeps them");
}

#[test]
fn with_8_bit_asids_only_the_low_byte_tags_and_invalidates() {
    let soc = Soc::zynqmp().unwrap();
    let bus = soc.smmu_window().unwrap();
    let [(_, dst0), (_, dst1)] = two_banks(&soc, (0, 0x107), (0, 0x207));
    for n in 0..2 {
        // TCR2.AS clear: 8-bit ASIDs, and both banks' ASIDs read as 7.
        w32(&bus, CB0 + n * 0x1000 + 0x10, 5);
    }
    zdma_start(&soc, 0, SRC, DST, 64);
    zdma_start(&soc, 1, SRC, DST, 64);
    assert_eq!(contents(&dst0, 64), vec![0xa0; 64]);
    assert_eq!(contents(&dst1, 64), vec![0; 64], "ASID 0x207 is 7 too");
    // TLBIASID with 0x307 is TLBIASID 7.
    w32(&bus, CB0 + 0x610, 0x307);
    w32(&bus, CB0 + 0x7f0, 0);
    while r32(&bus, CB0 + 0x7f4) & 1 != 0 {}
    assert_eq!(soc.lock().smmu.tlb().len(), 0);
}
