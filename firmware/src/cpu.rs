//! Core set-up the runtime does before it turns on the caches and the MMU: the SMPEN bit of
//! CPUECTLR_EL1.
//!
//! Cortex-A53 TRM (DDI 0500), CPUECTLR_EL1: bit 6, SMPEN, "enables the processor to receive
//! instruction cache and TLB maintenance operations broadcast from other processors in the
//! cluster"; it resets to 0 and must be set before the caches and the MMU are enabled or any
//! cache or TLB maintenance is done. Cortex-A57 (TRM DDI 0488, CPUECTLR_EL1) has it at the
//! same bit. The register sits at the implementation-defined encoding `S3_1_C15_C2_1`
//! (`hal::sysreg::cpuectlr`); other cores may have something else there, so the runtime
//! touches it only on a core it knows by MIDR_EL1.
//!
//! Only at EL3 is the register always writable: at EL2 and EL1 a write traps unless
//! ACTLR_EL3.CPUECTLR (and ACTLR_EL2.CPUECTLR) allow it, and whatever runs above (ATF on a
//! board, QEMU's firmware-less `virt` at EL1) owns the bit there. So the runtime sets it at
//! EL3 (the ZynqMP program after the FSBL) and leaves it alone elsewhere. QEMU implements the
//! register as constant 0 (writes ignored), which this code reports as such.

use core::fmt;

use hal::barrier::{self, Barrier};

/// CPUECTLR_EL1.SMPEN.
pub const SMPEN: u64 = 1 << 6;

/// A core whose CPUECTLR_EL1 has SMPEN at bit 6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    /// Cortex-A53 (MIDR part number 0xD03), the ZynqMP's APU.
    CortexA53,
    /// Cortex-A57 (0xD07), QEMU `virt`'s CPU here.
    CortexA57,
}

impl Core {
    /// The core `midr` (MIDR_EL1) names, if it is one of these: implementer 0x41 (Arm) in
    /// bits 31:24 and the part number in bits 15:4 (Arm ARM D19.2, MIDR_EL1; the TRMs'
    /// MIDR_EL1 reset values).
    pub const fn from_midr(midr: u64) -> Option<Core> {
        let implementer = (midr >> 24) & 0xff;
        let part = (midr >> 4) & 0xfff;
        match (implementer, part) {
            (0x41, 0xd03) => Some(Core::CortexA53),
            (0x41, 0xd07) => Some(Core::CortexA57),
            _ => None,
        }
    }

    /// The core's name.
    pub const fn name(self) -> &'static str {
        match self {
            Core::CortexA53 => "Cortex-A53",
            Core::CortexA57 => "Cortex-A57",
        }
    }
}

/// What [`enable_smp`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmpEnable {
    /// SMPEN written; `after` is what the register read back (QEMU: 0, its register is a
    /// constant).
    Set {
        /// The core.
        core: Core,
        /// CPUECTLR_EL1 before the write.
        before: u64,
        /// CPUECTLR_EL1 read back after the write.
        after: u64,
    },
    /// SMPEN was already set (by an earlier boot stage); nothing written.
    AlreadySet {
        /// The core.
        core: Core,
    },
    /// Not at EL3: left to the firmware above.
    NotAtEl3 {
        /// The core.
        core: Core,
        /// The current EL.
        el: u8,
    },
    /// A core this runtime does not know: the encoding is not touched.
    UnknownCore {
        /// MIDR_EL1.
        midr: u64,
    },
}

impl fmt::Display for SmpEnable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SmpEnable::Set {
                core,
                before,
                after,
            } => {
                write!(
                    f,
                    "{}: CPUECTLR_EL1.SMPEN set ({before:#x} -> {after:#x})",
                    core.name()
                )?;
                if after & SMPEN == 0 {
                    f.write_str(", reads back clear (a model with a constant register)")?;
                }
                Ok(())
            }
            SmpEnable::AlreadySet { core } => {
                write!(f, "{}: CPUECTLR_EL1.SMPEN already set", core.name())
            }
            SmpEnable::NotAtEl3 { core, el } => write!(
                f,
                "{}: CPUECTLR_EL1.SMPEN left to the firmware above EL{el}",
                core.name()
            ),
            SmpEnable::UnknownCore { midr } => {
                write!(
                    f,
                    "MIDR_EL1 {midr:#x}: no known CPUECTLR_EL1, SMPEN not set"
                )
            }
        }
    }
}

/// Sets CPUECTLR_EL1.SMPEN at `el` 3 on a known core (see the module docs); call it before
/// any cache or TLB maintenance and before the caches and the MMU are enabled. Ends with an
/// ISB, so the MMU set-up that follows sees the new value.
pub fn enable_smp(el: u8) -> SmpEnable {
    let midr = hal::sysreg::midr();
    let Some(core) = Core::from_midr(midr) else {
        return SmpEnable::UnknownCore { midr };
    };
    if el != 3 {
        return SmpEnable::NotAtEl3 { core, el };
    }
    // SAFETY: a Cortex-A53 or A57 (MIDR checked) implements CPUECTLR_EL1 at this encoding,
    // and EL3 may always read it.
    let before = unsafe { hal::sysreg::cpuectlr() };
    if before & SMPEN != 0 {
        return SmpEnable::AlreadySet { core };
    }
    // SAFETY: as above for the write at EL3; setting SMPEN before the caches and the MMU
    // are on is what both TRMs ask (the caller's contract), and no other bit changes.
    unsafe { hal::sysreg::set_cpuectlr(before | SMPEN) };
    barrier::issue(Barrier::Isb);
    // SAFETY: as for the first read.
    let after = unsafe { hal::sysreg::cpuectlr() };
    SmpEnable::Set {
        core,
        before,
        after,
    }
}

#[cfg(test)]
mod tests {
    use hal::sysreg::fake;

    use super::*;

    /// MIDR_EL1 reset values: Cortex-A53 r0p4 (the ZynqMP's, DDI 0500) and Cortex-A57 r1p3.
    const A53: u64 = 0x410f_d034;
    const A57: u64 = 0x411f_d073;

    #[test]
    fn cores_are_known_by_implementer_and_part_number() {
        assert_eq!(Core::from_midr(A53), Some(Core::CortexA53));
        assert_eq!(Core::from_midr(A57), Some(Core::CortexA57));
        // Cortex-A72 (0xD08), and a non-Arm implementer with the A53's part number.
        assert_eq!(Core::from_midr(0x410f_d083), None);
        assert_eq!(Core::from_midr(0x510f_d034), None);
        assert_eq!(Core::from_midr(0), None);
    }

    /// One test for every case, since the host fake's registers are process-wide.
    #[test]
    fn smpen_is_set_once_at_el3_on_a_known_core_and_nowhere_else() {
        let writes = fake::cpuectlr_writes();
        fake::set_midr(0x510f_d034);
        assert_eq!(enable_smp(3), SmpEnable::UnknownCore { midr: 0x510f_d034 });
        fake::set_midr(A57);
        assert_eq!(
            enable_smp(1),
            SmpEnable::NotAtEl3 {
                core: Core::CortexA57,
                el: 1
            }
        );
        assert_eq!(fake::cpuectlr_writes(), writes, "nothing written so far");

        fake::set_midr(A53);
        fake::set_cpuectlr(0x21); // other bits, kept as they are
        let writes = fake::cpuectlr_writes();
        let done = enable_smp(3);
        assert_eq!(
            done,
            SmpEnable::Set {
                core: Core::CortexA53,
                before: 0x21,
                after: 0x61
            }
        );
        assert_eq!(fake::cpuectlr(), 0x61);
        assert_eq!(fake::cpuectlr_writes(), writes + 1);
        assert_eq!(
            done.to_string(),
            "Cortex-A53: CPUECTLR_EL1.SMPEN set (0x21 -> 0x61)"
        );
        // A second call (or an FSBL that set it) writes nothing.
        assert_eq!(
            enable_smp(3),
            SmpEnable::AlreadySet {
                core: Core::CortexA53
            }
        );
        assert_eq!(fake::cpuectlr_writes(), writes + 1);
        fake::set_midr(0);
    }

    #[test]
    fn a_constant_register_is_reported() {
        let qemu = SmpEnable::Set {
            core: Core::CortexA53,
            before: 0,
            after: 0,
        };
        assert!(
            qemu.to_string()
                .ends_with("reads back clear (a model with a constant register)")
        );
    }
}
