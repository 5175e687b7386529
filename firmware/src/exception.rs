//! Decoding what the exception vectors report: which vector was taken and what the
//! Exception Syndrome Register says.
//!
//! Encodings from the Arm ARM (DDI 0487): the vector table layout in D1.3.1 ("Exception
//! vectors": four groups of four 0x80-byte entries), ESR_ELx in D19.2 (EC in bits 31:26,
//! IL in bit 25, ISS in 24:0), and the data/instruction abort ISS (DFSC/IFSC in bits 5:0,
//! WnR 6, S1PTW 7, FnV 10).

use core::fmt;

/// Where an exception came from, by the vector group it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The current EL while running on SP_EL0 (how programs run in this runtime).
    CurrentElSp0,
    /// The current EL while running on SP_ELx (an exception inside an exception handler).
    CurrentElSpx,
    /// A lower EL in AArch64.
    LowerElAarch64,
    /// A lower EL in AArch32.
    LowerElAarch32,
}

/// The kind of exception, by the vector entry within a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Synchronous (aborts, traps, SVC/HVC/SMC, BRK, undefined instructions).
    Synchronous,
    /// IRQ.
    Irq,
    /// FIQ.
    Fiq,
    /// SError (asynchronous external abort).
    SError,
}

/// The vector entry taken: index 0-15 in the table, as the entry stubs pass it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vector {
    /// Vector group.
    pub source: Source,
    /// Entry within the group.
    pub kind: Kind,
}

impl Vector {
    /// Decodes a vector index (0-15); other values are `None`.
    pub const fn from_index(index: u64) -> Option<Self> {
        let source = match index / 4 {
            0 => Source::CurrentElSp0,
            1 => Source::CurrentElSpx,
            2 => Source::LowerElAarch64,
            3 => Source::LowerElAarch32,
            _ => return None,
        };
        let kind = match index % 4 {
            0 => Kind::Synchronous,
            1 => Kind::Irq,
            2 => Kind::Fiq,
            _ => Kind::SError,
        };
        Some(Self { source, kind })
    }

    /// Whether ESR/FAR describe this exception (they do for synchronous ones and SError).
    pub const fn has_syndrome(&self) -> bool {
        matches!(self.kind, Kind::Synchronous | Kind::SError)
    }
}

impl fmt::Display for Vector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Synchronous => "synchronous exception",
            Kind::Irq => "IRQ",
            Kind::Fiq => "FIQ",
            Kind::SError => "SError",
        };
        let source = match self.source {
            Source::CurrentElSp0 => "current EL, SP_EL0",
            Source::CurrentElSpx => "current EL, SP_ELx (inside a handler)",
            Source::LowerElAarch64 => "lower EL, AArch64",
            Source::LowerElAarch32 => "lower EL, AArch32",
        };
        write!(f, "{kind} from {source}")
    }
}

/// The name of an exception class (ESR_ELx.EC).
pub const fn class_name(ec: u8) -> &'static str {
    match ec {
        0x00 => "unknown reason (undefined instruction)",
        0x01 => "trapped WFI/WFE",
        0x03 | 0x04 | 0x05 | 0x06 | 0x0c => "trapped AArch32 coprocessor access",
        0x07 => "trapped SIMD/FP/SVE access",
        0x0a => "trapped LD64B/ST64B",
        0x0d => "branch target exception",
        0x0e => "illegal execution state",
        0x11 => "SVC from AArch32",
        0x12 => "HVC from AArch32",
        0x13 => "SMC from AArch32",
        0x15 => "SVC",
        0x16 => "HVC",
        0x17 => "SMC",
        0x18 => "trapped MSR/MRS/system instruction",
        0x19 => "trapped SVE access",
        0x1c => "pointer authentication failure",
        0x20 => "instruction abort from a lower EL",
        0x21 => "instruction abort from the same EL",
        0x22 => "PC alignment fault",
        0x24 => "data abort from a lower EL",
        0x25 => "data abort from the same EL",
        0x26 => "SP alignment fault",
        0x28 | 0x2c => "floating-point exception",
        0x2f => "SError",
        0x30 | 0x31 => "breakpoint",
        0x32 | 0x33 => "software step",
        0x34 | 0x35 => "watchpoint",
        0x38 => "BKPT (AArch32)",
        0x3c => "BRK",
        _ => "reserved exception class",
    }
}

/// The kind of an abort, from its fault status code (DFSC/IFSC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultStatus {
    /// Address size fault at a lookup level.
    AddressSize(u8),
    /// Translation fault (no valid descriptor) at a lookup level.
    Translation(u8),
    /// Access flag fault at a lookup level.
    AccessFlag(u8),
    /// Permission fault at a lookup level.
    Permission(u8),
    /// Synchronous external abort, not on a table walk (e.g. nothing decodes the address).
    ExternalAbort,
    /// Synchronous external abort on a table walk at a lookup level.
    ExternalAbortOnWalk(u8),
    /// Alignment fault.
    Alignment,
    /// TLB conflict abort.
    TlbConflict,
    /// Another (rare or implementation defined) code.
    Other(u8),
}

impl FaultStatus {
    /// Decodes the 6-bit fault status code.
    pub const fn from_code(code: u8) -> Self {
        let level = code & 0b11;
        match code & 0x3f {
            0x00..=0x03 => FaultStatus::AddressSize(level),
            0x04..=0x07 => FaultStatus::Translation(level),
            0x08..=0x0b => FaultStatus::AccessFlag(level),
            0x0c..=0x0f => FaultStatus::Permission(level),
            0x10 => FaultStatus::ExternalAbort,
            0x14..=0x17 => FaultStatus::ExternalAbortOnWalk(level),
            0x21 => FaultStatus::Alignment,
            0x30 => FaultStatus::TlbConflict,
            other => FaultStatus::Other(other),
        }
    }
}

impl fmt::Display for FaultStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FaultStatus::AddressSize(l) => write!(f, "address size fault, level {l}"),
            FaultStatus::Translation(l) => write!(f, "translation fault, level {l}"),
            FaultStatus::AccessFlag(l) => write!(f, "access flag fault, level {l}"),
            FaultStatus::Permission(l) => write!(f, "permission fault, level {l}"),
            FaultStatus::ExternalAbort => f.write_str("synchronous external abort"),
            FaultStatus::ExternalAbortOnWalk(l) => {
                write!(f, "synchronous external abort on table walk, level {l}")
            }
            FaultStatus::Alignment => f.write_str("alignment fault"),
            FaultStatus::TlbConflict => f.write_str("TLB conflict abort"),
            FaultStatus::Other(code) => write!(f, "fault status {code:#04x}"),
        }
    }
}

/// An ESR_ELx value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Syndrome(pub u64);

impl Syndrome {
    /// Exception class, bits 31:26.
    pub const fn class(&self) -> u8 {
        ((self.0 >> 26) & 0x3f) as u8
    }

    /// Instruction length bit (1: 32-bit instruction).
    pub const fn il(&self) -> bool {
        (self.0 >> 25) & 1 == 1
    }

    /// Instruction-specific syndrome, bits 24:0.
    pub const fn iss(&self) -> u32 {
        (self.0 & 0x01ff_ffff) as u32
    }

    /// Whether this is an instruction or data abort (whose ISS has a fault status code).
    pub const fn is_abort(&self) -> bool {
        matches!(self.class(), 0x20 | 0x21 | 0x24 | 0x25)
    }

    /// The fault status of an abort.
    pub const fn fault_status(&self) -> Option<FaultStatus> {
        if self.is_abort() {
            Some(FaultStatus::from_code((self.iss() & 0x3f) as u8))
        } else {
            None
        }
    }

    /// For a data abort: whether the access was a write (WnR).
    pub const fn is_write(&self) -> Option<bool> {
        match self.class() {
            0x24 | 0x25 => Some((self.iss() >> 6) & 1 == 1),
            _ => None,
        }
    }

    /// Whether FAR holds an address for this exception (Arm ARM, FAR_ELx): for instruction and
    /// data aborts with FnV clear, PC alignment faults and watchpoints; UNKNOWN otherwise.
    pub const fn far_valid(&self) -> bool {
        match self.class() {
            0x20 | 0x21 | 0x24 | 0x25 => (self.iss() >> 10) & 1 == 0,
            0x22 | 0x34 | 0x35 => true,
            _ => false,
        }
    }

    /// For an abort: whether it happened on the stage-1 table walk for stage 2 (S1PTW).
    pub const fn on_stage1_walk(&self) -> bool {
        self.is_abort() && (self.iss() >> 7) & 1 == 1
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (EC {:#04x})", class_name(self.class()), self.class())?;
        if let Some(status) = self.fault_status() {
            write!(f, ": {status}")?;
        }
        if let Some(write) = self.is_write() {
            f.write_str(if write { ", write" } else { ", read" })?;
        }
        if self.is_abort() && !self.far_valid() {
            f.write_str(", FAR not valid")?;
        }
        Ok(())
    }
}

/// Why a survivable read (`rt::probe_read32`) returned no data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeFault {
    /// The load took a synchronous data abort (an external abort from a bus error response,
    /// a translation or alignment fault).
    Abort {
        /// ESR of the abort.
        esr: u64,
        /// FAR of the abort (valid unless the syndrome says otherwise).
        far: u64,
    },
    /// The load returned, but an SError interrupt (an asynchronous external abort) was
    /// pending right after it (ISR_EL1.A).
    SErrorPending,
}

impl fmt::Display for ProbeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProbeFault::Abort { esr, far } => {
                let syndrome = Syndrome(esr);
                match syndrome.fault_status() {
                    Some(status) => write!(f, "{status}")?,
                    None => write!(f, "{}", class_name(syndrome.class()))?,
                }
                write!(f, ", ESR {esr:#x}")?;
                if syndrome.far_valid() {
                    write!(f, ", FAR {far:#x}")?;
                }
                Ok(())
            }
            ProbeFault::SErrorPending => f.write_str("SError pending after the read"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_indices_follow_the_table_layout() {
        let v = Vector::from_index(0).unwrap();
        assert_eq!(
            (v.source, v.kind),
            (Source::CurrentElSp0, Kind::Synchronous)
        );
        let v = Vector::from_index(5).unwrap(); // offset 0x280: current EL SPx, IRQ
        assert_eq!((v.source, v.kind), (Source::CurrentElSpx, Kind::Irq));
        let v = Vector::from_index(15).unwrap(); // offset 0x780: lower EL AArch32, SError
        assert_eq!((v.source, v.kind), (Source::LowerElAarch32, Kind::SError));
        assert!(Vector::from_index(16).is_none());
        assert!(!Vector::from_index(1).unwrap().has_syndrome());
        assert_eq!(
            Vector::from_index(0).unwrap().to_string(),
            "synchronous exception from current EL, SP_EL0"
        );
    }

    #[test]
    fn data_abort_syndromes_decode() {
        // EC 0x25 (bits 31:26 = 100101), IL = 1, DFSC = 0b000100 (translation, level 0):
        // 0x9600_0004.
        let s = Syndrome(0x9600_0004);
        assert_eq!(s.class(), 0x25);
        assert!(s.il());
        assert_eq!(s.fault_status(), Some(FaultStatus::Translation(0)));
        assert_eq!(s.is_write(), Some(false));
        assert!(s.far_valid());
        assert_eq!(
            s.to_string(),
            "data abort from the same EL (EC 0x25): translation fault, level 0, read"
        );
        // Write (WnR bit 6) with a synchronous external abort (DFSC 0x10) and FnV (bit 10).
        let s = Syndrome(0x9600_0450);
        assert_eq!(s.fault_status(), Some(FaultStatus::ExternalAbort));
        assert_eq!(s.is_write(), Some(true));
        assert!(!s.far_valid());
        assert!(
            s.to_string()
                .ends_with("synchronous external abort, write, FAR not valid")
        );
        // Neither an undefined instruction (EC 0x00) nor a BRK (EC 0x3c) sets FAR.
        assert!(!Syndrome(0x0200_0000).far_valid());
        assert!(!Syndrome(0xf200_0000).far_valid());
        // A PC alignment fault (EC 0x22) does.
        assert!(Syndrome(0x8a00_0000).far_valid());
        // Permission fault at level 3 on the walk for stage 2 (S1PTW, bit 7).
        let s = Syndrome(0x9200_008f);
        assert_eq!(s.class(), 0x24);
        assert_eq!(s.fault_status(), Some(FaultStatus::Permission(3)));
        assert!(s.on_stage1_walk());
        assert_eq!(
            Syndrome(0x9600_0021).fault_status(),
            Some(FaultStatus::Alignment)
        );
        assert_eq!(
            Syndrome(0x9600_0015).fault_status(),
            Some(FaultStatus::ExternalAbortOnWalk(1))
        );
    }

    #[test]
    fn probe_faults_name_the_fault_and_the_address() {
        // Synchronous external abort (DFSC 0x10) on a read of 0xfd800000.
        let f = ProbeFault::Abort {
            esr: 0x9600_0010,
            far: 0xfd80_0000,
        };
        assert_eq!(
            f.to_string(),
            "synchronous external abort, ESR 0x96000010, FAR 0xfd800000"
        );
        // FnV set: the FAR is not shown.
        let f = ProbeFault::Abort {
            esr: 0x9600_0410,
            far: 0,
        };
        assert_eq!(f.to_string(), "synchronous external abort, ESR 0x96000410");
        assert_eq!(
            ProbeFault::SErrorPending.to_string(),
            "SError pending after the read"
        );
    }

    #[test]
    fn other_classes_decode() {
        // Instruction abort, same EL, access flag level 2: EC 0x21 -> 0x8600_000a.
        let s = Syndrome(0x8600_000a);
        assert_eq!(s.fault_status(), Some(FaultStatus::AccessFlag(2)));
        assert_eq!(s.is_write(), None);
        // BRK #0x2a: EC 0x3c, ISS = comment.
        let s = Syndrome(0xf200_002a);
        assert_eq!(class_name(s.class()), "BRK");
        assert_eq!(s.iss(), 0x2a);
        assert_eq!(s.fault_status(), None);
        assert_eq!(s.to_string(), "BRK (EC 0x3c)");
        // Trapped FP access: EC 0x07 with IL: 0x1e00_0000.
        assert_eq!(
            class_name(Syndrome(0x1e00_0000).class()),
            "trapped SIMD/FP/SVE access"
        );
        assert_eq!(class_name(0x3f), "reserved exception class");
        assert_eq!(FaultStatus::from_code(0x35), FaultStatus::Other(0x35));
    }
}
