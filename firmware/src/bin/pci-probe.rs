//! `pci-probe`: finds the PCIe host bridge of QEMU `virt` (from the device tree, else the
//! documented high ECAM), enumerates it, assigns the `edu` device's BAR0 in the 32-bit MMIO
//! window, enables memory decoding and bus mastering, and checks edu's identification and
//! liveness registers through BAR0. PASS names the device, its BAR and what was checked.
//!
//! Run it with `cargo xtask qemu pci-probe`.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use core::ptr::NonNull;

    use firmware::edu::{self, EduReport};
    use firmware::pci::{self, Ecam, MmioAllocator, PciHost};
    use firmware::platform::virt;
    use firmware::{Boot, FirmwareError, Result, Verdict};
    use hal::regs::MmioBus;

    firmware::program!("pci-probe", virt::PLATFORM, run);

    fn run(boot: &Boot) -> Verdict {
        match probe(boot) {
            Ok(report) => Verdict::pass(format_args!("{report}")),
            Err(e) => Verdict::fail(format_args!("pci-probe: {e}")),
        }
    }

    /// The host bridge from the device tree, else `virt`'s documented defaults.
    fn host_bridge(boot: &Boot) -> Result<(PciHost, &'static str)> {
        if let Some(fdt) = &boot.dtb
            && let Some(host) = pci::host_from_fdt(fdt)?
        {
            return Ok((host, "device tree pci-host-ecam-generic node"));
        }
        Ok((
            PciHost::virt_default(),
            "fallback: virt's documented high ECAM, no device-tree node",
        ))
    }

    /// An MMIO bus over `[base, base + size)` after checking it is mapped as Device memory.
    fn device_window(boot: &Boot, base: u64, size: u64) -> Result<MmioBus> {
        boot.check_device_window(base, size)?;
        let not_device = FirmwareError::NotDeviceMemory { base, size };
        let ptr = NonNull::new(base as *mut u8).ok_or(not_device)?;
        let len = usize::try_from(size).map_err(|_| not_device)?;
        // SAFETY: the window is in the identity map as Device memory, clear of RAM (checked
        // above), so no Rust object lives there; it is a device's register space (ECAM or a
        // BAR this program just assigned).
        Ok(unsafe { MmioBus::new(ptr, len) })
    }

    fn probe(boot: &Boot) -> Result<EduReport> {
        let (host, source) = host_bridge(boot)?;
        defmt::info!(
            "PCIe ECAM {=u64:#x}+{=u64:#x}, buses {=u8:02x}-{=u8:02x} ({=str})",
            host.ecam.base,
            host.ecam.size,
            host.first_bus,
            host.last_bus,
            source
        );
        let window = host.mmio32.ok_or(FirmwareError::PciNoMemoryWindow)?;
        defmt::info!(
            "32-bit MMIO window: CPU {=u64:#x} = PCI {=u64:#x}, {=u64:#x} bytes",
            window.cpu_base,
            window.pci_base,
            window.size
        );
        let ecam_bus = device_window(boot, host.ecam.base, host.ecam.size)?;
        let ecam = Ecam::new(&ecam_bus, host.first_bus, host.last_bus)?;
        let mut allocator = MmioAllocator::new(window);
        let report = edu::probe(
            &ecam,
            &mut allocator,
            &mut firmware::logger::info,
            |base, size| device_window(boot, base, size),
        )?;
        defmt::info!(
            "edu at {} (requester ID {=u16:#06x}): vendor {=u16:04x} device {=u16:04x} class \
             {=u8:02x}{=u8:02x}{=u8:02x}",
            report.function.bdf,
            report.function.bdf.requester_id(),
            report.function.vendor_id,
            report.function.device_id,
            report.function.class,
            report.function.subclass,
            report.function.prog_if
        );
        defmt::info!(
            "edu BAR0 {=u64:#x}, size {=u64:#x}; identification {=u32:#010x}; liveness {=usize} \
             patterns ok",
            report.bar0.at.cpu,
            report.bar0.bar.size,
            report.identification,
            report.liveness_checks
        );
        Ok(report)
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "pci-probe runs on aarch64 bare metal: use `cargo xtask qemu pci-probe` \
         (build: `cargo xtask firmware pci-probe`)"
    );
    std::process::exit(2);
}
