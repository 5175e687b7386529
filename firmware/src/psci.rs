//! PSCI, the Arm Power State Coordination Interface (Arm DEN 0022), reached through the SMC
//! Calling Convention (Arm DEN 0028): function ID in w0, `hvc #0` or `smc #0`, result in x0.

/// SYSTEM_OFF, SMC32 fast call (DEN 0022, function ID table). On QEMU `virt` it ends the
/// emulator with exit status 0.
pub const SYSTEM_OFF: u32 = 0x8400_0008;
/// PSCI_VERSION.
pub const PSCI_VERSION: u32 = 0x8400_0000;

/// Calls PSCI function `function` with arguments `args` through `conduit`; returns x0.
/// SMCCC lets the callee change x0-x17, so all of them are declared clobbered.
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub fn call(conduit: crate::platform::Conduit, function: u32, args: [u64; 3]) -> u64 {
    let mut x0 = u64::from(function);
    match conduit {
        // SAFETY: a PSCI call only changes the registers declared here (SMCCC); the
        // firmware behind it does not touch this program's memory.
        crate::platform::Conduit::Hvc => unsafe {
            core::arch::asm!(
                "hvc #0",
                inout("x0") x0,
                inout("x1") args[0] => _,
                inout("x2") args[1] => _,
                inout("x3") args[2] => _,
                out("x4") _, out("x5") _, out("x6") _, out("x7") _,
                out("x8") _, out("x9") _, out("x10") _, out("x11") _,
                out("x12") _, out("x13") _, out("x14") _, out("x15") _,
                out("x16") _, out("x17") _,
                options(nostack),
            )
        },
        // SAFETY: as above.
        crate::platform::Conduit::Smc => unsafe {
            core::arch::asm!(
                "smc #0",
                inout("x0") x0,
                inout("x1") args[0] => _,
                inout("x2") args[1] => _,
                inout("x3") args[2] => _,
                out("x4") _, out("x5") _, out("x6") _, out("x7") _,
                out("x8") _, out("x9") _, out("x10") _, out("x11") _,
                out("x12") _, out("x13") _, out("x14") _, out("x15") _,
                out("x16") _, out("x17") _,
                options(nostack),
            )
        },
    }
    x0
}
