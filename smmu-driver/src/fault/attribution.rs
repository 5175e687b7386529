//! Which in-flight transfer a fault belongs to, and what to do when that cannot be told.
//!
//! A fault record names a stream and an address, but real SMMUs do not always say which:
//!
//! - an SMMUv2 context bank records one fault; a second one while FSR is non-zero only sets
//!   FSR.MULTI, and its stream and address are lost (IHI 0062 SMMU_CBn_FSR.MULTI);
//! - implementations and models may leave the syndrome registers empty (SMMU_CBn_FAR,
//!   SMMU_CBn_FSYNR0, SMMU_CBFRSYNRAn read as zero), so a fault shows only as a fault bit in
//!   the context bank's FSR;
//! - a DMA master may complete a transfer whose access was terminated without reporting a
//!   bus error (QEMU's `hw/dma/xlnx-zdma.c` ignores the result of its memory accesses).
//!
//! So a record is attributed to a transfer only when both its stream and its address point at
//! exactly one access in flight: the stream is that access's stream and the address lies inside the
//! access's range. Anything else (no record, an unknown stream, an address no access in
//! flight covers, or FSR.MULTI) is attributed to the context bank as a whole: **every
//! transfer in flight on the bank's streams is then suspect**. A suspect transfer is never
//! reported complete, even if its engine says it is: its pages are resolved through the fault
//! path ([`FaultHandler::resolve_range`](super::FaultHandler::resolve_range)) and it is sent
//! again. Only a record that *is* attributed can fail its transfer (for example with
//! [`SmmuError::OutsideRegisteredRegion`](crate::SmmuError::OutsideRegisteredRegion)); an
//! unattributed address outside every region says nothing about any transfer.

use hal::Iova;

use super::{FaultRecord, StreamId};

/// One range a transfer in flight may access: its source or its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InFlightAccess {
    /// The stream the DMA master issues the access with.
    pub stream: StreamId,
    /// First byte.
    pub start: Iova,
    /// Length in bytes.
    pub len: u64,
}

impl InFlightAccess {
    /// Whether `iova` lies in the range.
    pub fn covers(&self, iova: Iova) -> bool {
        iova.as_u64()
            .checked_sub(self.start.as_u64())
            .is_some_and(|offset| offset < self.len)
    }
}

/// Why a fault could not be attributed to one access in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unattributed {
    /// The bank reported a fault but no record (FSR.MULTI alone, or a fault bit the driver
    /// could not decode into a record).
    NoRecord,
    /// The record's stream is not the stream of any access in flight (a syndrome register
    /// that reads as zero, or a stream the caller did not start anything on).
    UnknownStream(StreamId),
    /// The stream is known but no access in flight on it covers the address (an empty FAR).
    AddressOutsideInFlight {
        /// The recorded stream.
        stream: StreamId,
        /// The recorded address.
        iova: Iova,
    },
    /// More than one access in flight on the stream covers the address (two transfers over
    /// the same buffer, or channels sharing a stream): the record cannot say whose it is.
    Ambiguous {
        /// The recorded stream.
        stream: StreamId,
        /// The recorded address.
        iova: Iova,
    },
}

/// The outcome of [`attribute`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attribution {
    /// The record belongs to `accesses[index]`.
    Access(usize),
    /// The record belongs to the context bank only: every access in flight is suspect.
    Bank(Unattributed),
}

/// Attributes a fault (its decoded record, if any) to one of `accesses`, by stream and
/// address together (see the module docs). FSR.MULTI is the caller's to add: it makes every
/// access in flight suspect even when the record itself is attributed.
pub fn attribute(record: Option<&FaultRecord>, accesses: &[InFlightAccess]) -> Attribution {
    let Some(record) = record else {
        return Attribution::Bank(Unattributed::NoRecord);
    };
    let mut stream_known = false;
    let mut owner = None;
    for (index, access) in accesses.iter().enumerate() {
        if access.stream != record.stream {
            continue;
        }
        stream_known = true;
        if access.covers(record.iova) {
            if owner.is_some() {
                return Attribution::Bank(Unattributed::Ambiguous {
                    stream: record.stream,
                    iova: record.iova,
                });
            }
            owner = Some(index);
        }
    }
    if let Some(index) = owner {
        return Attribution::Access(index);
    }
    Attribution::Bank(if stream_known {
        Unattributed::AddressOutsideInFlight {
            stream: record.stream,
            iova: record.iova,
        }
    } else {
        Unattributed::UnknownStream(record.stream)
    })
}
