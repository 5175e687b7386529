//! The EL1 virtual timer as a backstop for `wfi`: a wait for a device's interrupt that must not
//! hang when the interrupt never comes.
//!
//! Registers from the Arm ARM (DDI0487, D11.2.4 and the `CNTV_CTL_EL0`/`CNTV_TVAL_EL0`
//! descriptions): writing TVAL sets the compare value to the virtual count plus TVAL (a signed
//! 32-bit value); CTL bit 0 ENABLE, bit 1 IMASK, bit 2 ISTATUS. The timer's interrupt is level
//! sensitive: it stays asserted while the condition holds, so the timer is disabled after each
//! wait, which drops the line. At EL2 (HCR_EL2.E2H = 0, the only EL2 the runtime supports) these
//! registers still name the EL1 virtual timer.

/// INTID of the EL1 virtual timer: PPI 11, as QEMU `virt` wires it (`hw/arm/virt.c`
/// `ARCH_TIMER_VIRT_IRQ`) and Arm's Base System Architecture recommends.
pub const VIRTUAL_TIMER_INTID: u32 = 27;

/// The longest single wait TVAL can express: its positive range.
pub const MAX_TICKS: u64 = i32::MAX as u64;

/// Executes `wfi` with the virtual timer armed `ticks` counter ticks ahead (at most
/// [`MAX_TICKS`]), so it returns on the first interrupt or when the timer fires, whichever is
/// first; the timer is off again afterwards. The timer's PPI must be enabled in the GIC
/// ([`crate::gic::enable_ppi`]) and the CPU interface on ([`crate::gic::enable_cpu_interface`]).
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub fn wait_for_interrupt_at_most(ticks: u64) {
    use hal::barrier;
    use hal::sysreg::fields::CNTV_CTL_EL0;
    use hal::sysreg::{self, SysReg};
    let ticks = ticks.clamp(1, MAX_TICKS);
    // SAFETY: these writes only program this core's virtual timer; no memory is touched.
    // The `isb` makes the enabled timer take effect before the `wfi`.
    unsafe {
        sysreg::write(SysReg::CntvTvalEl0, ticks);
        sysreg::write(SysReg::CntvCtlEl0, CNTV_CTL_EL0::ENABLE::SET.value);
    }
    barrier::isb();
    barrier::dsb_sy();
    sysreg::wait_for_interrupt();
    // SAFETY: as above; disabling the timer drops its level-sensitive line.
    unsafe { sysreg::write(SysReg::CntvCtlEl0, 0) };
    barrier::isb();
}
