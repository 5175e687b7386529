//! Event records (IHI0070 §7.3; QEMU 7.2's `smmuv3_record_event` for what QEMU writes).
//!
//! Every record is 32 bytes (four little-endian dwords). Common fields ([`EventDword0`]):
//! EventID dword 0 \[7:0\], SSV bit 11, SubstreamID \[31:12\], StreamID \[63:32\].
//! Translation-related faults (F_TRANSLATION 0x10, F_ADDR_SIZE 0x11, F_ACCESS 0x12,
//! F_PERMISSION 0x13) and F_WALK_EABT (0x0b) add [`FaultDword1`]: STAG dword 1 \[15:0\],
//! Stall bit 31, PnU 33, InD 34, RnW 35 (1 = read), S2 39, CLASS \[41:40\]; and InputAddr
//! in dword 2. Field positions cross-checked against Linux `EVTQ_*` in arm-smmu-v3.h and
//! QEMU 7.2 `smmuv3-internal.h` (`EVT_SET_*`).
//!
//! F_TLB_CONFLICT (0x20, §7.3.17) has a layout of its own ([`TlbConflictDword1`],
//! [`TlbConflictDword3`]): PnU, InD, RnW and S2 where the translation faults have them,
//! InputAddr in dword 2 and the IPA in dword 3 \[55:12\] (valid only with S2), but no
//! Stall, STAG or CLASS: only the four translation-related faults have a Stall field, any
//! other event terminates its transaction with an abort (§7.3.21). Dword 1 \[31:0\] holds
//! an IMPLEMENTATION DEFINED Reason instead, which must not be read as a stall (a stall the
//! driver would then answer with CMD_RESUME). Linux `arm-smmu-v3.c`
//! (`arm_smmu_decode_event`) reads STAG/Stall and the address only for the translation
//! faults too. [`tlb_conflict`] decodes the rest of such a record.
//!
//! The dword views are `bitfield` views; whole-dword fields (InputAddr) are plain `u64`s.
//! Decoding never panics: a record with an EventID the architecture does not define (and
//! outside the IMPLEMENTATION DEFINED 0xE0-0xEF block) is [`SmmuError::UnknownEvent`]; a
//! record whose fields contradict the SMMU's capabilities is [`SmmuError::MalformedEvent`].

use bitfield::bitfield;
use hal::Iova;

use super::caps::Capabilities;
use crate::fault::{
    AccessKind, FaultKind, FaultRecord, RawSyndrome, SmmuFlavour, SmmuId, StallTag, StreamId,
};
use crate::{Result, SmmuError};

bitfield! {
    /// Dword 0 of every event record (IHI0070 §7.3).
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct EventDword0(pub u64);
    impl Debug;
    /// EventID, bits \[7:0\] (IHI0070 §7.3): which event ([`id`]).
    pub u8, event_id, set_event_id: 7, 0;
    /// SSV, bit 11 (IHI0070 §7.3): SubstreamID is valid.
    pub ssv, set_ssv: 11;
    /// SubstreamID, bits \[31:12\] (IHI0070 §7.3), valid with SSV.
    pub u32, substream_id, set_substream_id: 31, 12;
    /// StreamID, bits \[63:32\] (IHI0070 §7.3): the stream of the transaction or
    /// configuration the record is about.
    pub u32, stream_id, set_stream_id: 63, 32;
}

bitfield! {
    /// Dword 1 of the translation-related faults F_TRANSLATION, F_ADDR_SIZE, F_ACCESS and
    /// F_PERMISSION (IHI0070 §7.3), which F_WALK_EABT's is read as here. Dword 2 is
    /// InputAddr, the whole dword.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct FaultDword1(pub u64);
    impl Debug;
    /// STAG, bits \[15:0\] (IHI0070 §7.3): the tag CMD_RESUME names, valid with Stall.
    pub u16, stag, set_stag: 15, 0;
    /// Stall, bit 31 (IHI0070 §7.3): the transaction is stalled and waits for CMD_RESUME.
    pub stall, set_stall: 31;
    /// PnU, bit 33 (IHI0070 §7.3): a privileged (1) or unprivileged (0) transaction.
    pub pnu, set_pnu: 33;
    /// InD, bit 34 (IHI0070 §7.3): an instruction fetch (1) or a data access (0).
    pub ind, set_ind: 34;
    /// RnW, bit 35 (IHI0070 §7.3): a read (1) or a write (0).
    pub rnw, set_rnw: 35;
    /// S2, bit 39 (IHI0070 §7.3): the fault is from stage 2.
    pub s2, set_s2: 39;
    /// CLASS, bits \[41:40\] (IHI0070 §7.3): what was being accessed (0b00 CD fetch, 0b01
    /// translation table walk, 0b10 the input address; 0b11 is reserved).
    pub u8, class, set_class: 41, 40;
}

impl FaultDword1 {
    /// CLASS 0b10 (IN): the fault was on the transaction's input address (IHI0070 §7.3).
    pub const CLASS_IN: u8 = 0b10;
    /// CLASS 0b11: reserved.
    pub const CLASS_RESERVED: u8 = 0b11;
}

bitfield! {
    /// Dword 1 of F_TLB_CONFLICT (IHI0070 §7.3.17): no Stall, STAG or CLASS. Dword 2 is
    /// InputAddr, the whole dword.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct TlbConflictDword1(pub u64);
    impl Debug;
    /// Reason, bits \[31:0\] (IHI0070 §7.3.17): IMPLEMENTATION DEFINED, specific to the
    /// TLB geometry of the implementation.
    pub u32, reason, set_reason: 31, 0;
    /// PnU, bit 33 (IHI0070 §7.3.17): a privileged transaction.
    pub pnu, set_pnu: 33;
    /// InD, bit 34 (IHI0070 §7.3.17): an instruction fetch.
    pub ind, set_ind: 34;
    /// RnW, bit 35 (IHI0070 §7.3.17): a read (1) or a write (0).
    pub rnw, set_rnw: 35;
    /// S2, bit 39 (IHI0070 §7.3.17): the conflict was in a stage-2 TLB entry.
    pub s2, set_s2: 39;
}

bitfield! {
    /// Dword 3 of F_TLB_CONFLICT (IHI0070 §7.3.17).
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct TlbConflictDword3(pub u64);
    impl Debug;
    /// IPA, bits \[55:12\] (IHI0070 §7.3.17): bits \[55:12\] of the IPA, valid only
    /// with S2.
    pub u64, ipa, set_ipa: 55, 12;
}

/// Size of an event record in bytes.
pub const EVENT_BYTES: usize = 32;

/// Event IDs (IHI0070 §7.3.2 onwards).
pub mod id {
    /// Unsupported upstream transaction.
    pub const F_UUT: u8 = 0x01;
    /// StreamID out of range of the stream table.
    pub const C_BAD_STREAMID: u8 = 0x02;
    /// External abort fetching an STE.
    pub const F_STE_FETCH: u8 = 0x03;
    /// Invalid or ILLEGAL STE.
    pub const C_BAD_STE: u8 = 0x04;
    /// ATS translation request on a stream that may not use ATS.
    pub const F_BAD_ATS_TREQ: u8 = 0x05;
    /// Non-substream traffic on a stream whose STE disables it.
    pub const F_STREAM_DISABLED: u8 = 0x06;
    /// Translation forbidden (e.g. ATS with SMMUEN = 0).
    pub const F_TRANSL_FORBIDDEN: u8 = 0x07;
    /// SubstreamID out of range.
    pub const C_BAD_SUBSTREAMID: u8 = 0x08;
    /// External abort fetching a CD.
    pub const F_CD_FETCH: u8 = 0x09;
    /// Invalid or ILLEGAL CD.
    pub const C_BAD_CD: u8 = 0x0a;
    /// External abort on a table walk.
    pub const F_WALK_EABT: u8 = 0x0b;
    /// Translation fault.
    pub const F_TRANSLATION: u8 = 0x10;
    /// Address size fault.
    pub const F_ADDR_SIZE: u8 = 0x11;
    /// Access flag fault.
    pub const F_ACCESS: u8 = 0x12;
    /// Permission fault.
    pub const F_PERMISSION: u8 = 0x13;
    /// TLB conflict.
    pub const F_TLB_CONFLICT: u8 = 0x20;
    /// Configuration cache conflict.
    pub const F_CFG_CONFLICT: u8 = 0x21;
    /// PRI page request (through the event queue).
    pub const E_PAGE_REQUEST: u8 = 0x24;
    /// External abort fetching a VMS.
    pub const F_VMS_FETCH: u8 = 0x25;
}

/// A decoded event record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A fault of a transaction at an address: translation-related faults, walk aborts and
    /// TLB conflicts, in the shared fault-path form.
    Fault(FaultRecord),
    /// A configuration or stream-level event (C_BAD_*, F_*_FETCH, F_UUT, ...): nothing a
    /// mapping can fix.
    Configuration {
        /// EventID.
        id: u8,
        /// The stream it concerns.
        stream: StreamId,
        /// The raw record.
        raw: RawSyndrome,
    },
    /// An IMPLEMENTATION DEFINED event (0xE0-0xEF).
    ImplementationDefined {
        /// EventID.
        id: u8,
        /// The raw record.
        raw: RawSyndrome,
    },
}

impl Event {
    /// The EventID.
    pub fn id(&self) -> u8 {
        match self {
            Event::Fault(r) => EventDword0(r.syndrome.0[0]).event_id(),
            Event::Configuration { id, .. } | Event::ImplementationDefined { id, .. } => *id,
        }
    }
}

/// Decodes one record read from the queue. `caps` gives the limits a well-formed record must
/// respect; `instance` names the SMMU in the [`FaultRecord`].
pub fn decode(raw: [u64; 4], caps: &Capabilities, instance: u8) -> Result<Event> {
    let [dw0, dw1, input_addr, _] = raw;
    let dw0 = EventDword0(dw0);
    let event = dw0.event_id();
    let stream = StreamId(dw0.stream_id());
    let syndrome = RawSyndrome(raw);
    let malformed = |reason: &'static str| SmmuError::MalformedEvent { id: event, reason };

    let fault_kind = match event {
        id::F_TRANSLATION => Some(FaultKind::Translation),
        id::F_ADDR_SIZE => Some(FaultKind::AddressSize),
        id::F_ACCESS => Some(FaultKind::AccessFlag),
        id::F_PERMISSION => Some(FaultKind::Permission),
        id::F_WALK_EABT => Some(FaultKind::External),
        // Decoded below with its own layout.
        id::F_TLB_CONFLICT => Some(FaultKind::Unknown),
        id::F_UUT
        | id::C_BAD_STREAMID
        | id::F_STE_FETCH
        | id::C_BAD_STE
        | id::F_BAD_ATS_TREQ
        | id::F_STREAM_DISABLED
        | id::F_TRANSL_FORBIDDEN
        | id::C_BAD_SUBSTREAMID
        | id::F_CD_FETCH
        | id::C_BAD_CD
        | id::F_CFG_CONFLICT
        | id::E_PAGE_REQUEST
        | id::F_VMS_FETCH => None,
        0xe0..=0xef => {
            return Ok(Event::ImplementationDefined {
                id: event,
                raw: syndrome,
            });
        }
        _ => return Err(SmmuError::UnknownEvent { id: event }),
    };

    // A stalled transaction must be answered whatever else is wrong with its record: a fault
    // record (other than F_TLB_CONFLICT, which has no Stall) with Stall set on an SMMU that
    // can stall is rejected with what CMD_RESUME needs, from the first check on.
    let stalled_tag = (fault_kind.is_some() && event != id::F_TLB_CONFLICT)
        .then_some(FaultDword1(dw1))
        .filter(|d| d.stall() && caps.can_stall())
        .map(|d| d.stag());
    let early_reject = |reason: &'static str| match stalled_tag {
        Some(stag) => SmmuError::MalformedStalledEvent {
            id: event,
            reason,
            stream: stream.0,
            stag,
        },
        None => malformed(reason),
    };
    // C_BAD_STREAMID reports a StreamID beyond the table by definition; every other record
    // names a stream the SMMU could have looked up.
    if event != id::C_BAD_STREAMID
        && caps.sid_bits < 32
        && u64::from(stream.0) >> caps.sid_bits != 0
    {
        return Err(early_reject("StreamID beyond IDR1.SIDSIZE"));
    }
    if dw0.ssv() && caps.ssid_bits == 0 {
        return Err(early_reject("SSV set on an SMMU without substreams"));
    }

    let Some(kind) = fault_kind else {
        return Ok(Event::Configuration {
            id: event,
            stream,
            raw: syndrome,
        });
    };
    let smmu = SmmuId {
        flavour: SmmuFlavour::V3,
        instance,
    };
    let access_of = |rnw: bool| {
        if rnw {
            AccessKind::Read
        } else {
            AccessKind::Write
        }
    };

    if event == id::F_TLB_CONFLICT {
        // No Stall, STAG or CLASS: dword 1 [31:0] is the Reason. The transaction was
        // terminated with an abort; nothing waits for a CMD_RESUME.
        let dw1 = TlbConflictDword1(dw1);
        if dw1.s2() && !caps.stage2 {
            return Err(malformed("stage-2 fault on an SMMU without stage 2"));
        }
        return Ok(Event::Fault(FaultRecord {
            smmu,
            stream,
            iova: Iova::new(input_addr),
            access: access_of(dw1.rnw()),
            kind,
            level: None,
            stall: None,
            syndrome,
        }));
    }

    let dw1 = FaultDword1(dw1);
    let stall = dw1.stall();
    if stall && !caps.can_stall() {
        return Err(malformed("Stall set on a terminate-only SMMU"));
    }
    // A stalled transaction must be answered whatever else is wrong with its record, so
    // from here on a rejection keeps what CMD_RESUME needs.
    let reject = |reason: &'static str| {
        if stall {
            SmmuError::MalformedStalledEvent {
                id: event,
                reason,
                stream: stream.0,
                stag: dw1.stag(),
            }
        } else {
            malformed(reason)
        }
    };
    if dw1.s2() && !caps.stage2 {
        return Err(reject("stage-2 fault on an SMMU without stage 2"));
    }
    if dw1.class() == FaultDword1::CLASS_RESERVED {
        return Err(reject("reserved CLASS"));
    }
    Ok(Event::Fault(FaultRecord {
        smmu,
        stream,
        iova: Iova::new(input_addr),
        access: access_of(dw1.rnw()),
        kind,
        level: None,
        stall: stall.then_some(StallTag(u32::from(dw1.stag()))),
        syndrome,
    }))
}

/// What an F_TLB_CONFLICT record (IHI0070 §7.3.17) says beyond its [`FaultRecord`]
/// (stream, InputAddr, RnW; never a stall).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbConflict {
    /// The IMPLEMENTATION DEFINED conflict reason (dword 1 \[31:0\]), specific to the TLB
    /// geometry of the implementation.
    pub reason: u32,
    /// S2: the conflict was in a stage-2 TLB entry.
    pub stage2: bool,
    /// The IPA (dword 3 \[55:12\]), valid only for a stage-2 conflict; `None` otherwise.
    pub ipa: Option<u64>,
    /// PnU: a privileged transaction.
    pub privileged: bool,
    /// InD: an instruction fetch (0 for writes).
    pub instruction: bool,
}

/// The F_TLB_CONFLICT fields of a record [`decode`] returned as a fault, from its raw
/// syndrome; `None` for any other record. A TLB conflict means overlapping TLB entries (a
/// missing break-before-make); no mapping fixes it, only an invalidation does.
pub fn tlb_conflict(record: &FaultRecord) -> Option<TlbConflict> {
    let [dw0, dw1, _, dw3] = record.syndrome.0;
    if record.smmu.flavour != SmmuFlavour::V3 || EventDword0(dw0).event_id() != id::F_TLB_CONFLICT {
        return None;
    }
    let dw1 = TlbConflictDword1(dw1);
    Some(TlbConflict {
        reason: dw1.reason(),
        stage2: dw1.s2(),
        ipa: dw1.s2().then_some(TlbConflictDword3(dw3).ipa() << 12),
        privileged: dw1.pnu(),
        instruction: dw1.ind(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v3::caps::IdRegisters;

    fn qemu() -> Capabilities {
        Capabilities::decode(IdRegisters::QEMU_7_2).unwrap()
    }

    fn stall_capable() -> Capabilities {
        Capabilities::decode(IdRegisters {
            idr0: IdRegisters::QEMU_7_2.idr0 & !(0b11 << 24),
            ..IdRegisters::QEMU_7_2
        })
        .unwrap()
    }

    #[test]
    fn qemu_translation_fault_record() {
        // What QEMU 7.2 wrote for a read fault of edu (SID 0x10) at 0x200004 (seen in our own
        // run): dw0 = 0x10 | SID << 32, dw1 = RnW << 35, dw2 = InputAddr, dw3 = 0.
        let raw = [0x10 | (0x10 << 32), 1 << 35, 0x20_0004, 0];
        let Event::Fault(r) = decode(raw, &qemu(), 0).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(r.stream, StreamId(0x10));
        assert_eq!(r.iova, Iova::new(0x20_0004));
        assert_eq!(r.access, AccessKind::Read);
        assert_eq!(r.kind, FaultKind::Translation);
        assert_eq!(r.stall, None);
        assert_eq!(r.level, None);
        assert_eq!(r.smmu.flavour, SmmuFlavour::V3);
        assert_eq!(r.syndrome, RawSyndrome(raw));

        // F_PERMISSION on a write (RnW = 0).
        let raw = [0x13 | (0x10 << 32), 0, 0x10_1008, 0];
        let Event::Fault(w) = decode(raw, &qemu(), 2).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(
            (w.kind, w.access, w.smmu.instance),
            (FaultKind::Permission, AccessKind::Write, 2)
        );
    }

    #[test]
    fn every_architected_fault_kind() {
        for (id, kind) in [
            (0x10, FaultKind::Translation),
            (0x11, FaultKind::AddressSize),
            (0x12, FaultKind::AccessFlag),
            (0x13, FaultKind::Permission),
            (0x0b, FaultKind::External),
            (0x20, FaultKind::Unknown),
        ] {
            let Event::Fault(r) = decode([id | (7 << 32), 1 << 35, 0x1000, 0], &qemu(), 0).unwrap()
            else {
                panic!("{id:#x} is a fault");
            };
            assert_eq!(r.kind, kind, "{id:#x}");
        }
        for id in [
            0x01u64, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x21, 0x24, 0x25,
        ] {
            let e = decode([id | (5 << 32), 0, 0, 0], &qemu(), 0).unwrap();
            assert_eq!(
                e,
                Event::Configuration {
                    id: id as u8,
                    stream: StreamId(5),
                    raw: RawSyndrome([id | (5 << 32), 0, 0, 0])
                }
            );
            assert_eq!(e.id(), id as u8);
        }
        assert!(matches!(
            decode([0xe3, 0, 0, 0], &qemu(), 0),
            Ok(Event::ImplementationDefined { id: 0xe3, .. })
        ));
    }

    #[test]
    fn a_tlb_conflict_is_decoded_with_its_own_layout() {
        // F_TLB_CONFLICT of a privileged read (PnU 33, RnW 35) by stream 0x10 at InputAddr
        // 0x4000_1234, stage 1, with an IMPLEMENTATION DEFINED Reason of 0x8000_0123 in
        // dword 1 [31:0]: bit 31 and the low half are where F_TRANSLATION has Stall and STAG,
        // and CLASS's bits hold 0b11 (not a CLASS here). Dword 3 (IPA) is UNKNOWN without S2.
        let dw1 = 0x8000_0123 | (1 << 33) | (1 << 35) | (0b11 << 40);
        let raw = [0x20 | (0x10 << 32), dw1, 0x4000_1234, 0xdead_b000];
        for caps in [qemu(), stall_capable()] {
            let Event::Fault(r) = decode(raw, &caps, 1).unwrap() else {
                panic!("not a fault");
            };
            assert_eq!(r.stall, None, "a TLB conflict never stalls");
            assert_eq!(
                (r.stream, r.iova, r.access, r.kind, r.level),
                (
                    StreamId(0x10),
                    Iova::new(0x4000_1234),
                    AccessKind::Read,
                    FaultKind::Unknown,
                    None
                )
            );
            assert_eq!(r.syndrome, RawSyndrome(raw));
            assert_eq!(
                tlb_conflict(&r),
                Some(TlbConflict {
                    reason: 0x8000_0123,
                    stage2: false,
                    ipa: None,
                    privileged: true,
                    instruction: false,
                })
            );
        }
        // A stage-2 conflict carries the IPA, on an SMMU with stage 2 only.
        let s2 = [
            0x20 | (0x10 << 32),
            1 << 39,
            0x4000_1234,
            0x0000_0008_7654_3000,
        ];
        assert_eq!(
            decode(s2, &qemu(), 0),
            Err(SmmuError::MalformedEvent {
                id: 0x20,
                reason: "stage-2 fault on an SMMU without stage 2"
            })
        );
        let with_s2 = Capabilities {
            stage2: true,
            ..qemu()
        };
        let Event::Fault(r) = decode(s2, &with_s2, 0).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(tlb_conflict(&r).unwrap().ipa, Some(0x8_7654_3000));
        // Other records are not TLB conflicts.
        let Event::Fault(t) = decode([0x10 | (0x10 << 32), 0, 0x1000, 0], &qemu(), 0).unwrap()
        else {
            panic!("not a fault");
        };
        assert_eq!(tlb_conflict(&t), None);
    }

    #[test]
    fn the_widest_fields_decode_exactly() {
        // An SMMU with 32-bit StreamIDs, substreams and stage 2, so no field is refused.
        let wide = Capabilities {
            sid_bits: 32,
            ssid_bits: 20,
            stage2: true,
            ..stall_capable()
        };
        // F_PERMISSION (0x13), SSV (bit 11), SubstreamID [31:12] all ones, StreamID
        // [63:32] all ones; dword 1: STAG [15:0] 0xffff, Stall 31, PnU 33, InD 34, RnW 35,
        // S2 39, CLASS [41:40] = 0b10; InputAddr all ones; dword 3 all ones.
        let dw1 = 0xffff | (1 << 31) | (0b111 << 33) | (1 << 39) | (0b10 << 40);
        let raw = [0xffff_ffff_ffff_f813, dw1, !0, !0];
        let Event::Fault(r) = decode(raw, &wide, 3).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(
            (r.stream, r.iova, r.access, r.kind, r.stall),
            (
                StreamId(0xffff_ffff),
                Iova::new(!0),
                AccessKind::Read,
                FaultKind::Permission,
                Some(StallTag(0xffff))
            )
        );
        assert_eq!((r.smmu.instance, r.syndrome), (3, RawSyndrome(raw)));
        assert_eq!(Event::Fault(r).id(), 0x13);
        assert_eq!(tlb_conflict(&r), None);
        // F_TLB_CONFLICT with every bit of dword 1 set: Reason [31:0] all ones, PnU, InD,
        // S2; the IPA is dword 3 [55:12] (0x00ff_ffff_ffff_f000 of all ones).
        let raw = [0xffff_ffff_0000_0020, !0, 0x1234, !0];
        let Event::Fault(r) = decode(raw, &wide, 0).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(
            (r.stream, r.access, r.stall),
            (StreamId(0xffff_ffff), AccessKind::Read, None)
        );
        assert_eq!(
            tlb_conflict(&r),
            Some(TlbConflict {
                reason: 0xffff_ffff,
                stage2: true,
                ipa: Some(0x00ff_ffff_ffff_f000),
                privileged: true,
                instruction: true,
            })
        );
    }

    #[test]
    fn a_fault_record_gives_the_access_the_tables_judge() {
        // RnW 35, PnU 33 and InD 34 of dword 1 become the walker's access request: a read
        // (RnW = 1), privileged, an instruction fetch; then an unprivileged data write.
        let raw = [0x13 | (0x10 << 32), 0b111 << 33, 0x1000, 0];
        let Event::Fault(r) = decode(raw, &qemu(), 0).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(
            r.access_request(),
            crate::walk::AccessRequest {
                write: false,
                privileged: true,
                instruction: true
            }
        );
        let Event::Fault(w) = decode([0x13 | (0x10 << 32), 0, 0x1000, 0], &qemu(), 0).unwrap()
        else {
            panic!("not a fault");
        };
        assert_eq!(
            w.access_request(),
            crate::walk::AccessRequest {
                write: true,
                privileged: false,
                instruction: false
            }
        );
    }

    #[test]
    fn stall_records_carry_the_stag() {
        // Stall (dw1 bit 31) with STAG 0xbeef in dw1[15:0].
        let raw = [0x10 | (0x4d0 << 32), (1 << 31) | 0xbeef, 0x8000_0000, 0];
        let Event::Fault(r) = decode(raw, &stall_capable(), 0).unwrap() else {
            panic!("not a fault");
        };
        assert_eq!(r.stall, Some(StallTag(0xbeef)));
        assert_eq!(r.access, AccessKind::Write);
    }

    #[test]
    fn unknown_and_malformed_records_are_typed_errors() {
        for id in [
            0x00u64, 0x0c, 0x0f, 0x14, 0x1f, 0x22, 0x26, 0x80, 0xdf, 0xf0, 0xff,
        ] {
            assert_eq!(
                decode([id, 0, 0, 0], &qemu(), 0),
                Err(SmmuError::UnknownEvent { id: id as u8 }),
                "{id:#x}"
            );
        }
        let cases: [([u64; 4], &str); 5] = [
            ([0x10 | (1 << 48), 0, 0, 0], "StreamID beyond IDR1.SIDSIZE"),
            (
                [0x10 | (1 << 11), 0, 0, 0],
                "SSV set on an SMMU without substreams",
            ),
            ([0x10, 1 << 31, 0, 0], "Stall set on a terminate-only SMMU"),
            (
                [0x10, 1 << 39, 0, 0],
                "stage-2 fault on an SMMU without stage 2",
            ),
            ([0x10, 0b11 << 40, 0, 0], "reserved CLASS"),
        ];
        for (raw, reason) in cases {
            assert_eq!(
                decode(raw, &qemu(), 0),
                Err(SmmuError::MalformedEvent { id: 0x10, reason }),
                "{reason}"
            );
        }
        // C_BAD_STREAMID may name any StreamID.
        assert!(decode([0x02 | (0xffff_ffff << 32), 0, 0, 0], &qemu(), 0).is_ok());
    }

    #[test]
    fn a_rejected_record_of_a_stalled_transaction_keeps_what_resume_needs() {
        let caps = stall_capable();
        let raw = [
            0x10 | (0x10 << 32),
            (1 << 31) | 0x55 | (0b11 << 40),
            0x1000,
            0,
        ];
        assert_eq!(
            decode(raw, &caps, 0),
            Err(SmmuError::MalformedStalledEvent {
                id: 0x10,
                reason: "reserved CLASS",
                stream: 0x10,
                stag: 0x55
            })
        );
        // Checks made before Stall is read keep it too: SSV on an SMMU without substreams,
        // and a StreamID beyond IDR1.SIDSIZE.
        assert_eq!(caps.ssid_bits, 0);
        let ssv = [
            0x10 | (1 << 11) | (0x10 << 32),
            (1 << 31) | 0xbeef,
            0x1000,
            0,
        ];
        assert_eq!(
            decode(ssv, &caps, 0),
            Err(SmmuError::MalformedStalledEvent {
                id: 0x10,
                reason: "SSV set on an SMMU without substreams",
                stream: 0x10,
                stag: 0xbeef
            })
        );
        let wide = [0x10 | (0xffff_ffff << 32), (1 << 31) | 0x77, 0x1000, 0];
        assert!(matches!(
            decode(wide, &caps, 0),
            Err(SmmuError::MalformedStalledEvent { stag: 0x77, .. })
        ));
        // Without Stall, the same records are plainly malformed.
        assert!(matches!(
            decode([ssv[0], 0xbeef, 0x1000, 0], &caps, 0),
            Err(SmmuError::MalformedEvent { .. })
        ));
    }
}
