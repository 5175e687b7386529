//! `smmuv3-faults`: QEMU's `edu` device copies data by DMA through the SMMUv3 into a 4 MiB
//! IOVA window of which only part is mapped; every faulting transfer is found through the
//! event queue, its pages are brought in by a pager, and it is retransmitted. Three
//! scenarios (see `firmware::smmuv3_faults`): 1200 random transfers with evictions between
//! them; the same with an 8-entry event queue that overflows; and a probe showing that an
//! eviction without TLB invalidation is caught by the final data check. PASS needs exact data
//! in the first two, faults > 0, at least 1000 transfers, the overflow recovered from, the
//! command-queue error recovered from, and the stale TLB detected.
//!
//! edu's DMA takes 100 ms of QEMU virtual time; the program waits with `wfi` for edu's INTx
//! (through the GICv3), with the virtual timer armed 10 ms ahead so that a lost interrupt
//! cannot hang it (a DMA not done after 2 s is lost), and `cargo xtask qemu` runs QEMU with
//! `-icount shift=0,sleep=off`, so idle virtual time is skipped instead of waited for.
//!
//! Run it with `cargo xtask qemu smmuv3-faults`.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use core::ptr::NonNull;

    use firmware::edu::{self, EduRegs};
    use firmware::pci::{self, Ecam, MmioAllocator, PciHost};
    use firmware::platform::{MemRegion, virt};
    use firmware::smmuv3_faults::{
        self, Buffers, CounterWait, EduDma, Hardware, Report, Scenario, StaleTlbReport,
        WINDOW_BYTES,
    };
    use firmware::{Boot, FirmwareError, Result, Verdict};
    use firmware::{gic, timer};
    use hal::delay::CounterDelay;
    use hal::dma::{DmaDirection, DmaMemory, DmaRegion, PoolDma};
    use hal::regs::MmioBus;
    use hal::{HalError, PhysAddr};
    use smmu_driver::fault::StreamId;
    use smmu_driver::v3::regs::offset::FRAME_SIZE;
    use smmu_driver::v3::{Smmuv3, StallModel};
    use tock_registers::interfaces::Readable;

    firmware::program!("smmuv3-faults", virt::PLATFORM, run);

    /// SMMUv3 of QEMU `virt` (`hw/arm/virt.c` `base_memmap`), used when the device tree has none.
    const VIRT_SMMU: u64 = 0x0905_0000;
    /// DMA pool: `POOL_WORDS * 64` pages (32 MiB) above the image.
    const POOL_WORDS: usize = 128;
    const POOL_PAGES: usize = POOL_WORDS * 64;

    unsafe extern "C" {
        /// End of the image (linker script `link/virt.ld`); only its address is used.
        static __image_end: u8;
    }

    struct Outcome {
        main: Report,
        tiny: Report,
        stale: StaleTlbReport,
    }

    fn run(boot: &Boot) -> Verdict {
        match run_all(boot) {
            Ok(o) => {
                let main_ok = o.main.exact()
                    && o.main.faults > 0
                    && o.main.transfers >= 1000
                    && o.main.cmdq_recoveries == 1;
                let tiny_ok = o.tiny.exact() && o.tiny.overflow_recoveries > 0;
                if main_ok && tiny_ok && o.stale.detected() {
                    Verdict::pass(format_args!(
                        "{} transfers exact, {} faults, {} retransmissions, {} events, {} \
                         overflow recoveries; stale TLB caught ({} pages)",
                        o.main.transfers + o.tiny.transfers,
                        o.main.faults + o.tiny.faults,
                        o.main.retransmissions + o.tiny.retransmissions,
                        o.main.events + o.tiny.events,
                        o.tiny.overflow_recoveries + o.main.overflow_recoveries,
                        o.stale.stale_mismatched_pages
                    ))
                } else {
                    Verdict::fail(format_args!(
                        "checks failed: main ok {main_ok}, tiny-eventq ok {tiny_ok}, stale TLB \
                         detected {}",
                        o.stale.detected()
                    ))
                }
            }
            Err(e) => Verdict::fail(format_args!("smmuv3-faults: {e}")),
        }
    }

    /// An MMIO bus over `[base, base + size)` after checking it is mapped as Device memory.
    fn device_window(boot: &Boot, base: u64, size: u64) -> Result<MmioBus> {
        boot.check_device_window(base, size)?;
        let not_device = FirmwareError::NotDeviceMemory { base, size };
        let ptr = NonNull::new(base as *mut u8).ok_or(not_device)?;
        let len = usize::try_from(size).map_err(|_| not_device)?;
        // SAFETY: the window is in the identity map as Device memory, clear of RAM (checked
        // above), so no Rust object lives there; it is a device's register space.
        Ok(unsafe { MmioBus::new(ptr, len) })
    }

    /// `reg` entry `index` of the first node compatible with `compatible`, else `fallback`.
    fn dt_reg(boot: &Boot, compatible: &str, index: usize, fallback: MemRegion) -> MemRegion {
        boot.dtb
            .as_ref()
            .and_then(|fdt| fdt.find_compatible(compatible).ok().flatten())
            .and_then(|node| node.reg().ok()?.nth(index)?.ok())
            .unwrap_or(fallback)
    }

    fn pci_host(boot: &Boot) -> Result<PciHost> {
        if let Some(fdt) = &boot.dtb
            && let Some(host) = pci::host_from_fdt(fdt)?
        {
            return Ok(host);
        }
        Ok(PciHost::virt_default())
    }

    /// The DMA pool: RAM after the image, 64 KiB aligned, in the image's RAM region, mapped
    /// Normal and clear of the device tree ([`Boot::check_free_ram`]).
    fn pool_region(boot: &Boot) -> Result<(u64, usize)> {
        let image_end = core::ptr::addr_of!(__image_end) as u64;
        let base = image_end.next_multiple_of(0x1_0000);
        let bytes = (POOL_PAGES * 4096) as u64;
        if boot.check_free_ram(base, bytes).is_err() {
            return Err(FirmwareError::BadScenario {
                what: "no free RAM for the 32 MiB DMA pool after the image (run with -m 256M)",
            });
        }
        Ok((base, POOL_PAGES))
    }

    /// A CPU-only buffer carved from the pool, borrowed from its region for as long as it is
    /// used (so no second slice of the same memory can exist).
    fn buffer(region: &mut DmaRegion) -> &mut [u8] {
        // SAFETY: the region was allocated from the pool and is exclusively borrowed for the
        // slice's lifetime, so nothing else reaches this memory meanwhile; it is never mapped
        // for a device (only the pager's frames are), so plain slice access cannot race a DMA.
        // It is normal write-back memory in the identity map.
        unsafe { core::slice::from_raw_parts_mut(region.cpu_ptr().as_ptr(), region.len()) }
    }

    fn run_all(boot: &Boot) -> Result<Outcome> {
        let host = pci_host(boot)?;
        let window = host.mmio32.ok_or(FirmwareError::PciNoMemoryWindow)?;
        let ecam_bus = device_window(boot, host.ecam.base, host.ecam.size)?;
        let ecam = Ecam::new(&ecam_bus, host.first_bus, host.last_bus)?;
        let mut allocator = MmioAllocator::new(window);
        let report = edu::probe(
            &ecam,
            &mut allocator,
            &mut firmware::logger::info,
            |base, size| device_window(boot, base, size),
        )?;
        let bdf = report.function.bdf;
        let stream = StreamId(u32::from(bdf.requester_id()));
        let pin = ecam.header(bdf)?.interrupt_pin().get();
        defmt::info!(
            "edu at {}: StreamID {=u32:#x}, INTx pin {=u8}",
            bdf,
            stream.0,
            pin
        );

        // The edu interrupt wakes `wfi`; see the crate docs of firmware::gic.
        let gicd = dt_reg(
            boot,
            "arm,gic-v3",
            0,
            MemRegion::new(gic::VIRT_GICD, gic::GICD_SIZE as u64),
        );
        let gicr_region = dt_reg(
            boot,
            "arm,gic-v3",
            1,
            MemRegion::new(gic::VIRT_GICR, gic::GICR_SIZE as u64),
        );
        let intid = gic::virt_pci_intx(ecam.first_bus(), bdf.bus(), bdf.device(), pin)?;
        let gicd_bus = device_window(boot, gicd.base, gic::GICD_SIZE as u64)?;
        // This CPU's redistributor: found in the region by its affinity.
        let region_bus = device_window(boot, gicr_region.base, gicr_region.size)?;
        let affinity = gic::current_affinity();
        let offset = gic::find_redistributor(&region_bus, affinity)?;
        let gicr = MemRegion::new(gicr_region.base + offset as u64, gic::GICR_SIZE as u64);
        let gicr_bus = device_window(boot, gicr.base, gicr.size)?;
        gic::route_spi(&gicd_bus, &gicr_bus, intid, true, affinity)?;
        // The virtual timer ends a `wfi` whose interrupt never comes (a lost DMA).
        gic::enable_ppi(&gicr_bus, timer::VIRTUAL_TIMER_INTID)?;
        gic::enable_cpu_interface(boot.el)?;
        defmt::info!(
            "GICv3 {=u64:#x}/{=u64:#x}: INTID {=u32} -> this CPU (wfi wake-up), virtual timer \
             INTID {=u32} as backstop",
            gicd.base,
            gicr.base,
            intid,
            timer::VIRTUAL_TIMER_INTID
        );

        let smmu_reg = dt_reg(
            boot,
            "arm,smmu-v3",
            0,
            MemRegion::new(VIRT_SMMU, FRAME_SIZE as u64),
        );
        let smmu_bus = device_window(boot, smmu_reg.base, FRAME_SIZE as u64)?;
        let caps = Smmuv3::<MmioBus, &PoolDma<POOL_WORDS>, CounterDelay>::probe(&smmu_bus)?;
        // StallModel (smmu-driver's v3::caps) has no defmt::Format of its own.
        let stall_model = match caps.stall_model {
            StallModel::StallAndTerminate => "StallAndTerminate",
            StallModel::TerminateOnly => "TerminateOnly",
            StallModel::StallForced => "StallForced",
        };
        defmt::info!(
            "SMMUv3 at {=u64:#x}: v3.{=u8}, stall model {=str}, abort-only {=bool}, {=u8}-bit \
             StreamIDs, OAS {=u8} bits, RIL {=bool}, cmdq 2^{=u8}, eventq 2^{=u8}",
            smmu_reg.base,
            caps.minor_version,
            stall_model,
            caps.abort_only,
            caps.sid_bits,
            caps.output_bits,
            caps.range_invalidation,
            caps.cmdq_log2_max,
            caps.eventq_log2_max
        );

        let (pool_base, pages) = pool_region(boot)?;
        let cpu = NonNull::new(pool_base as *mut u8)
            .ok_or(FirmwareError::BadScenario { what: "null pool" })?;
        // SAFETY: [pool_base, +32 MiB) is RAM past the image end (checked in pool_region),
        // identity mapped as normal write-back memory, used by nothing else; QEMU's SMMUv3
        // and PCI devices are cache coherent with the CPU, so bus = physical address works.
        let pool = unsafe { PoolDma::<POOL_WORDS>::new(cpu, PhysAddr::new(pool_base), pages) }?;
        defmt::info!(
            "DMA pool {=u64:#x}..{=u64:#x}",
            pool_base,
            pool_base + (pages * 4096) as u64
        );
        let window_pages = WINDOW_BYTES / 4096;
        let mut backing_region = pool.allocate(window_pages, DmaDirection::Bidirectional)?;
        let mut reference_region = pool.allocate(window_pages, DmaDirection::Bidirectional)?;

        let edu_bus = device_window(boot, report.bar0.at.cpu, report.bar0.bar.size)?;
        let mut wait = CounterWait::new(
            CounterDelay::new().frequency(),
            hal::sysreg::counter,
            timer::wait_for_interrupt_at_most,
        );
        let mut hw = Hardware {
            smmu: &smmu_bus,
            edu: EduDma::new(EduRegs::new(&edu_bus, 0)?),
            stream,
            dma: &pool,
            delay: CounterDelay::new(),
            wait: &mut wait,
        };
        let mut bufs = Buffers {
            backing: buffer(&mut backing_region),
            reference: buffer(&mut reference_region),
        };
        let log = &mut firmware::logger::info;

        defmt::info!(
            "scenario 1: {=u32} copies over a 4 MiB window",
            Scenario::MAIN.copies
        );
        let main = smmuv3_faults::run_scenario(&mut hw, &mut bufs, &Scenario::MAIN, log)?;
        defmt::info!("  {}", main);
        defmt::info!(
            "scenario 2: {=u32} copies with a 2^{=u8}-entry event queue",
            Scenario::TINY_EVENT_QUEUE.copies,
            Scenario::TINY_EVENT_QUEUE.eventq_log2
        );
        let tiny =
            smmuv3_faults::run_scenario(&mut hw, &mut bufs, &Scenario::TINY_EVENT_QUEUE, log)?;
        defmt::info!("  {}", tiny);
        defmt::info!("scenario 3: evicting a page without TLB invalidation");
        let stale = smmuv3_faults::run_stale_tlb_probe(&mut hw, &mut bufs)?;
        defmt::info!("  {}", stale);
        defmt::info!(
            "  stale TLB {=str}",
            if stale.detected() {
                "detected by the final data check"
            } else {
                "NOT detected"
            }
        );
        drop(bufs);
        pool.free(backing_region).map_err(HalError::from)?;
        pool.free(reference_region).map_err(HalError::from)?;
        Ok(Outcome { main, tiny, stale })
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "smmuv3-faults runs on aarch64 bare metal: use `cargo xtask qemu smmuv3-faults` \
         (build: `cargo xtask firmware smmuv3-faults`)"
    );
    std::process::exit(2);
}
