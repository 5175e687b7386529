//! IOMMU faults the module forwards through the ring (ABI 4, `abi::cause::DEVICE_FAULT`):
//! decoding a record and handing it to `smmu-driver`'s fault policy as a terminated fault.
//!
//! Under Linux the SMMU driver owns the fault interrupt. arm-smmu (SMMUv1/v2, e.g. the
//! MMU-500 of the ZynqMP) reports each context fault with `report_iommu_fault()`
//! (drivers/iommu/arm/arm-smmu/arm-smmu.c `arm_smmu_context_fault`) and its context banks
//! terminate faulting transactions rather than stall them, so the record arrives for an access
//! the device already saw aborted: a policy can only fault the page in and have the master
//! retransmit (or abort). `report_iommu_fault()` passes the address and read/write, not the
//! fault kind (FSR), so the record is handed on as a translation fault; a write to a read-only
//! region is still refused by the policy's region estimate (`abort_reason`).

use hal::Iova;
use smmu_driver::fault::{
    AccessKind, FaultKind, FaultRecord, RawSyndrome, SmmuFlavour, SmmuId, StreamId,
};

use crate::abi::{self, InvalidationRecord};

/// One IOMMU fault as the module forwarded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFault {
    /// The faulting IOVA: a virtual address of this process (IOVA = VA in the file's domain).
    pub iova: u64,
    /// Read or write.
    pub access: AccessKind,
    /// The device's PCI requester ID (bus << 8 | devfn, segment above), its stream.
    pub requester_id: u32,
}

impl DeviceFault {
    /// The fault a ring record carries, or `None` for an invalidation record.
    pub fn from_record(rec: &InvalidationRecord) -> Option<Self> {
        if rec.cause != abi::cause::DEVICE_FAULT {
            return None;
        }
        Some(Self {
            iova: rec.start,
            access: if rec.flags & abi::RECORD_DEVICE_WRITE != 0 {
                AccessKind::Write
            } else {
                AccessKind::Read
            },
            // The module writes a u32 there; anything wider is not a requester ID.
            requester_id: u32::try_from(rec.new_start).ok()?,
        })
    }

    /// The fault as `smmu-driver` records it, for its `FaultPolicy`: an SMMUv2 fault on stream
    /// = requester ID, not stalled (arm-smmu terminated it), kind `Translation` (the kind is
    /// not reported, see the module comment), lookup level unknown; the syndrome keeps the
    /// address and the write bit.
    pub fn to_fault_record(&self, instance: u8) -> FaultRecord {
        FaultRecord {
            smmu: SmmuId {
                flavour: SmmuFlavour::V2,
                instance,
            },
            stream: StreamId(self.requester_id),
            iova: Iova::new(self.iova),
            access: self.access,
            kind: FaultKind::Translation,
            level: None,
            stall: None,
            syndrome: RawSyndrome([
                self.iova,
                u64::from(self.access == AccessKind::Write),
                u64::from(self.requester_id),
                0,
            ]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(cause: u32, flags: u32, new_start: u64) -> InvalidationRecord {
        InvalidationRecord {
            seq: 3,
            region_id: 0,
            start: 0x7f00_1234_5678,
            len: 0,
            cause,
            flags,
            new_start,
        }
    }

    #[test]
    fn device_fault_records_decode_and_invalidations_do_not() {
        let w = DeviceFault::from_record(&rec(
            abi::cause::DEVICE_FAULT,
            abi::RECORD_DEVICE_WRITE,
            0x0108,
        ))
        .unwrap();
        assert_eq!(w.iova, 0x7f00_1234_5678);
        assert_eq!(w.access, AccessKind::Write);
        assert_eq!(w.requester_id, 0x0108);
        let r = DeviceFault::from_record(&rec(abi::cause::DEVICE_FAULT, 0, 8)).unwrap();
        assert_eq!(r.access, AccessKind::Read);
        assert_eq!(
            DeviceFault::from_record(&rec(abi::cause::CLEARED, abi::RECORD_DEVICE_WRITE, 0)),
            None
        );
        assert_eq!(
            DeviceFault::from_record(&rec(abi::cause::DEVICE_FAULT, 0, 1 << 40)),
            None,
            "a requester ID wider than 32 bits is malformed"
        );
    }

    #[test]
    fn the_fault_record_is_a_terminated_smmuv2_fault_on_the_requester_stream() {
        let f = DeviceFault {
            iova: 0x4000_1008,
            access: AccessKind::Write,
            requester_id: 0x10,
        };
        let r = f.to_fault_record(0);
        assert_eq!(r.smmu.flavour, SmmuFlavour::V2);
        assert_eq!(r.stream, StreamId(0x10));
        assert_eq!(r.iova, Iova::new(0x4000_1008));
        assert!(r.is_write());
        assert!(!r.is_stalled());
    }
}
