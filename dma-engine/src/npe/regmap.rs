//! The register map of docs/dma-engine.md §3 as data, and its hash: the one definition a
//! bitstream's manifest (crate `fpga-bitstreams`) and this driver share.
//!
//! `ID` (§3.1) holds only the magic and an 8-bit spec version, so a design cannot report its
//! register map itself. The chain is therefore: the engine reports `ID.VERSION`; the
//! bitstream's manifest records the version it was built for and [`REGMAP_HASH`] of the map it
//! implements; the driver, at probe time, reads `ID` and accepts the design only if the
//! engine's version, the manifest's version and the manifest's hash all equal its own
//! ([`check_design`]). A register added, moved, renamed or given another access type without
//! a new spec version changes the hash and is refused, instead of being driven blindly.
//!
//! The hash covers what software depends on: the window layout (size, channel base, stride,
//! channel count limit) and every register's offset, width, access type and name. A test
//! compares [`GLOBAL`] and [`CHANNEL`] with the tables of docs/dma-engine.md §3, so the data,
//! the spec and the hash cannot drift apart. Field layouts inside registers are part of the
//! spec version: changing one is a new `ID.VERSION`.

use hal::regs::RegisterBus;
use tock_registers::interfaces::Readable;

use super::regs::{
    CHANNEL_BASE, CHANNEL_STRIDE, ID, MAGIC, MAX_CHANNELS, NpeGlobal, VERSION, WINDOW_SIZE,
};
use crate::{DmaError, Result};

/// How software may access a register (the "access" column of §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read-only.
    Ro,
    /// Read-write.
    Rw,
    /// Write-one-to-clear.
    W1c,
    /// Write-only.
    Wo,
}

impl Access {
    /// The spelling of §3's tables.
    pub const fn as_str(self) -> &'static str {
        match self {
            Access::Ro => "RO",
            Access::Rw => "RW",
            Access::W1c => "W1C",
            Access::Wo => "WO",
        }
    }
}

/// One register of the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterDesc {
    /// Byte offset in its block (the window for [`GLOBAL`], a channel block for [`CHANNEL`]).
    pub offset: u16,
    /// Name as §3 spells it.
    pub name: &'static str,
    /// Access type.
    pub access: Access,
    /// Width in bits: 32 or 64.
    pub bits: u8,
}

const fn reg(offset: u16, name: &'static str, access: Access, bits: u8) -> RegisterDesc {
    RegisterDesc {
        offset,
        name,
        access,
        bits,
    }
}

/// The global registers (§3.1), in offset order.
pub const GLOBAL: &[RegisterDesc] = &[
    reg(0x000, "ID", Access::Ro, 32),
    reg(0x004, "CAPS", Access::Ro, 32),
    reg(0x008, "NODE", Access::Rw, 32),
    reg(0x00c, "CTRL", Access::Rw, 32),
    reg(0x010, "IRQ_STATUS", Access::Ro, 32),
    reg(0x014, "GEVENT", Access::W1c, 32),
    reg(0x020, "RQ_BASE", Access::Rw, 64),
    reg(0x028, "RQ_CFG", Access::Rw, 32),
    reg(0x02c, "RQ_HEAD", Access::Rw, 32),
    reg(0x030, "RQ_TAIL", Access::Ro, 32),
    reg(0x038, "WQ_BASE", Access::Rw, 64),
    reg(0x040, "WQ_CFG", Access::Rw, 32),
    reg(0x044, "WQ_TAIL", Access::Rw, 32),
    reg(0x048, "WQ_HEAD", Access::Ro, 32),
    reg(0x050, "WCQ_BASE", Access::Rw, 64),
    reg(0x058, "WCQ_CFG", Access::Rw, 32),
    reg(0x05c, "WCQ_HEAD", Access::Rw, 32),
    reg(0x060, "WCQ_TAIL", Access::Ro, 32),
    reg(0x064, "RX_STATUS", Access::Ro, 32),
    reg(0x068, "TX_BLOCKS", Access::Ro, 32),
    reg(0x06c, "RX_BLOCKS", Access::Ro, 32),
];

/// One channel's registers (§3.2), offsets from the channel's base, in offset order.
pub const CHANNEL: &[RegisterDesc] = &[
    reg(0x00, "SQ_BASE", Access::Rw, 64),
    reg(0x08, "SQ_CFG", Access::Rw, 32),
    reg(0x0c, "SQ_TAIL", Access::Rw, 32),
    reg(0x10, "SQ_HEAD", Access::Ro, 32),
    reg(0x18, "CQ_BASE", Access::Rw, 64),
    reg(0x20, "CQ_CFG", Access::Rw, 32),
    reg(0x24, "CQ_HEAD", Access::Rw, 32),
    reg(0x28, "CQ_TAIL", Access::Ro, 32),
    reg(0x2c, "CH_CTRL", Access::Rw, 32),
    reg(0x30, "CH_STATUS", Access::Ro, 32),
    reg(0x34, "CH_IRQ", Access::W1c, 32),
    reg(0x38, "FAULT_ADDR", Access::Ro, 64),
    reg(0x40, "FAULT_INFO", Access::Ro, 32),
    reg(0x44, "FAULT_SYNDROME", Access::Ro, 32),
    reg(0x48, "RESUME", Access::Wo, 32),
];

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

const fn fnv_bytes(mut h: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u32;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

const fn fnv_u32(h: u32, v: u32) -> u32 {
    fnv_bytes(h, &v.to_le_bytes())
}

const fn fnv_table(mut h: u32, table: &[RegisterDesc]) -> u32 {
    h = fnv_u32(h, table.len() as u32);
    let mut i = 0;
    while i < table.len() {
        let r = &table[i];
        h = fnv_u32(h, r.offset as u32);
        h = fnv_u32(h, r.bits as u32);
        h = fnv_bytes(h, r.access.as_str().as_bytes());
        h = fnv_bytes(h, r.name.as_bytes());
        // A separator, so that ("AB", "C") and ("A", "BC") differ.
        h = fnv_bytes(h, &[0]);
        i += 1;
    }
    h
}

/// FNV-1a (32 bit, as Fowler, Noll and Vo define it) over the layout and both tables, in a
/// fixed order: window size, channel base, stride, channel limit (each as a little-endian
/// `u32`), then per table its length and per register offset, width, access and name.
/// Not a cryptographic hash: it detects accidental drift, not a forger.
pub const fn regmap_hash(global: &[RegisterDesc], channel: &[RegisterDesc]) -> u32 {
    let mut h = FNV_OFFSET;
    h = fnv_u32(h, WINDOW_SIZE as u32);
    h = fnv_u32(h, CHANNEL_BASE as u32);
    h = fnv_u32(h, CHANNEL_STRIDE as u32);
    h = fnv_u32(h, MAX_CHANNELS as u32);
    h = fnv_table(h, global);
    fnv_table(h, channel)
}

/// The hash of this driver's register map.
pub const REGMAP_HASH: u32 = regmap_hash(GLOBAL, CHANNEL);

/// What a bitstream says it implements (its manifest's `npe_version` and `regmap_hash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DesignId {
    /// The NPE spec version (`ID.VERSION`) the design was built for.
    pub version: u32,
    /// [`REGMAP_HASH`] of the map the design implements.
    pub regmap_hash: u32,
}

/// The design this driver implements.
pub const DRIVER_DESIGN: DesignId = DesignId {
    version: VERSION,
    regmap_hash: REGMAP_HASH,
};

/// The probe-time check: `id` is the value read from the engine's `ID` register and
/// `design` what the loaded bitstream's manifest declares. The engine must be an NPE, and
/// its version, the manifest's version and the manifest's register-map hash must equal the
/// driver's.
pub fn check_design(id: u32, design: DesignId) -> Result<()> {
    let id = tock_registers::LocalRegisterCopy::<u32, ID::Register>::new(id);
    if id.read(ID::MAGIC) != MAGIC {
        return Err(DmaError::NotAnNpe { id: id.get() });
    }
    let engine = id.read(ID::VERSION);
    if engine != VERSION {
        return Err(DmaError::UnsupportedVersion { found: engine });
    }
    if design != DRIVER_DESIGN {
        return Err(DmaError::DesignMismatch {
            engine_version: engine,
            manifest_version: design.version,
            manifest_hash: design.regmap_hash,
            driver_hash: REGMAP_HASH,
        });
    }
    Ok(())
}

/// Probes the engine behind `bus` (its register window at offset 0) for `design`: reads
/// `ID` and applies [`check_design`], as `Npe::new` does with `NpeConfig::design`; for a
/// caller that wants to look before it resets and programs the engine.
pub fn probe_design<B: RegisterBus>(bus: &B, design: DesignId) -> Result<()> {
    let global = NpeGlobal::new(bus, 0)?;
    check_design(global.id().get(), design)
}

#[cfg(test)]
mod tests {
    use hal::model::{ModelBus, RegisterModel};
    use hal::regs::AccessWidth;

    use super::*;

    /// An engine window whose `ID` reads `id` and everything else 0.
    struct IdOnly {
        id: u32,
    }

    impl RegisterModel for IdOnly {
        fn size(&self) -> usize {
            WINDOW_SIZE
        }
        fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
            if offset == 0 { u64::from(self.id) } else { 0 }
        }
        fn write(&mut self, _offset: usize, _width: AccessWidth, _value: u64) {}
    }

    #[test]
    fn probing_reads_id_through_the_bus() {
        let ok = ModelBus::new(IdOnly {
            id: MAGIC << 8 | VERSION,
        });
        assert_eq!(probe_design(&ok, DRIVER_DESIGN), Ok(()));
        let old = ModelBus::new(IdOnly { id: MAGIC << 8 | 7 });
        assert_eq!(
            probe_design(&old, DRIVER_DESIGN),
            Err(DmaError::UnsupportedVersion { found: 7 })
        );
    }

    /// The rows of the §3.x table that starts after `heading`: (offset, name, access, bits).
    fn spec_rows(heading: &str) -> Vec<(u16, String, String, u8)> {
        let doc = include_str!("../../../docs/dma-engine.md");
        let start = doc.find(heading).expect("heading in docs/dma-engine.md");
        let mut rows = Vec::new();
        let mut in_table = false;
        for line in doc[start..].lines().skip(1) {
            if let Some(body) = line.strip_prefix('|') {
                in_table = true;
                let cols: Vec<&str> = body.split('|').map(str::trim).collect();
                let Some(off) = cols[0].strip_prefix("0x") else {
                    continue; // header and separator rows
                };
                let offset = u16::from_str_radix(off, 16).expect("hex offset");
                let name = cols[1].trim_matches('`').to_string();
                let mut access = cols[2].split_whitespace();
                let kind = access.next().expect("access").to_string();
                let bits = if access.next() == Some("64") { 64 } else { 32 };
                rows.push((offset, name, kind, bits));
            } else if in_table {
                break;
            }
        }
        rows
    }

    fn ours(table: &[RegisterDesc]) -> Vec<(u16, String, String, u8)> {
        table
            .iter()
            .map(|r| {
                (
                    r.offset,
                    r.name.to_string(),
                    r.access.as_str().to_string(),
                    r.bits,
                )
            })
            .collect()
    }

    #[test]
    fn the_tables_are_the_spec_tables() {
        assert_eq!(ours(GLOBAL), spec_rows("### 3.1 Global registers"));
        assert_eq!(ours(CHANNEL), spec_rows("### 3.2 Channel registers"));
    }

    #[test]
    fn registers_do_not_overlap_and_fit_their_blocks() {
        for (table, limit) in [(GLOBAL, CHANNEL_BASE), (CHANNEL, CHANNEL_STRIDE)] {
            for pair in table.windows(2) {
                let end = pair[0].offset + u16::from(pair[0].bits / 8);
                assert!(end <= pair[1].offset, "{pair:?}");
            }
            let last = table[table.len() - 1];
            assert!(usize::from(last.offset) + usize::from(last.bits / 8) <= limit);
            assert!(table.iter().all(|r| r.offset % u16::from(r.bits / 8) == 0));
        }
        const { assert!(CHANNEL_BASE + MAX_CHANNELS * CHANNEL_STRIDE <= WINDOW_SIZE) };
    }

    #[test]
    fn any_change_to_the_map_changes_the_hash() {
        let mut global = GLOBAL.to_vec();
        global[3].offset += 4;
        assert_ne!(regmap_hash(&global, CHANNEL), REGMAP_HASH);
        let mut channel = CHANNEL.to_vec();
        channel[10].access = Access::Rw;
        assert_ne!(regmap_hash(GLOBAL, &channel), REGMAP_HASH);
        channel = CHANNEL.to_vec();
        channel.pop();
        assert_ne!(regmap_hash(GLOBAL, &channel), REGMAP_HASH);
        let mut renamed = GLOBAL.to_vec();
        renamed[0].name = "IDX";
        assert_ne!(regmap_hash(&renamed, CHANNEL), REGMAP_HASH);
        // A copy of the same map, in other memory, hashes the same.
        let (g, c) = (GLOBAL.to_vec(), CHANNEL.to_vec());
        assert_eq!(regmap_hash(&g, &c), REGMAP_HASH);
    }

    #[test]
    fn the_probe_check_needs_engine_manifest_and_driver_to_agree() {
        let id = MAGIC << 8 | VERSION;
        assert_eq!(check_design(id, DRIVER_DESIGN), Ok(()));
        assert_eq!(
            check_design(0xdead_0001, DRIVER_DESIGN),
            Err(DmaError::NotAnNpe { id: 0xdead_0001 })
        );
        assert_eq!(
            check_design(MAGIC << 8 | 2, DRIVER_DESIGN),
            Err(DmaError::UnsupportedVersion { found: 2 })
        );
        let other = DesignId {
            version: VERSION,
            regmap_hash: REGMAP_HASH ^ 1,
        };
        assert_eq!(
            check_design(id, other),
            Err(DmaError::DesignMismatch {
                engine_version: VERSION,
                manifest_version: VERSION,
                manifest_hash: REGMAP_HASH ^ 1,
                driver_hash: REGMAP_HASH,
            })
        );
        let newer = DesignId {
            version: VERSION + 1,
            regmap_hash: REGMAP_HASH,
        };
        assert!(matches!(
            check_design(id, newer),
            Err(DmaError::DesignMismatch { .. })
        ));
    }
}
