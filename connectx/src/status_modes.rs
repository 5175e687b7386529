//! The status page's record of how registrations are served (docs/connectx.md §9a): the
//! mode chosen per device, with its ODP capabilities and self-test result, and the mode of
//! each live MR (up to [`MAX_MRS`]). Part of [`crate::status::StatusPage`]; every field is an
//! atomic, written by the library and read by `nprdma doctor`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Devices recorded.
pub const MAX_DEVICES: usize = 4;
/// Live MRs listed; further ones are only counted.
pub const MAX_MRS: usize = 32;
const NAME_WORDS: usize = 3;
const REASON_WORDS: usize = 16;

/// How one MR is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MrMode {
    /// Registered with `IBV_ACCESS_ON_DEMAND` by the library (ODP mode): nothing pinned,
    /// keys untranslated.
    Odp,
    /// A virtual region: a directory, windows pinned on demand under the budget.
    Windows,
    /// Registered whole and pinned as plain verbs would, because windows cannot serve it
    /// (a device without atomics, a PD with a UC QP, an IOVA range over the directory's).
    PinnedFallback,
    /// Passed through as the application asked (its own ODP, dmabuf, memory windows,
    /// zero-based, `NPRDMA=off`, a context the library does not manage).
    PassThrough,
}

impl MrMode {
    fn code(self) -> u64 {
        match self {
            MrMode::Odp => 1,
            MrMode::Windows => 2,
            MrMode::PinnedFallback => 3,
            MrMode::PassThrough => 4,
        }
    }

    fn from_code(c: u64) -> Option<Self> {
        match c {
            1 => Some(MrMode::Odp),
            2 => Some(MrMode::Windows),
            3 => Some(MrMode::PinnedFallback),
            4 => Some(MrMode::PassThrough),
            _ => None,
        }
    }

    /// The mode's name in doctor's output.
    pub fn as_str(self) -> &'static str {
        match self {
            MrMode::Odp => "odp",
            MrMode::Windows => "windows",
            MrMode::PinnedFallback => "pinned-fallback",
            MrMode::PassThrough => "pass-through",
        }
    }
}

/// The ODP self-test's result on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfTest {
    /// Not run (the device reports no ODP, or the test could not be set up: the reason says).
    NotRun,
    /// Every byte moved as sent.
    Passed,
    /// Wrong bytes, an error completion or a timeout (the reason says).
    Failed,
}

impl SelfTest {
    fn code(self) -> u32 {
        match self {
            SelfTest::NotRun => 1,
            SelfTest::Passed => 2,
            SelfTest::Failed => 3,
        }
    }

    fn from_code(c: u32) -> Self {
        match c {
            2 => SelfTest::Passed,
            3 => SelfTest::Failed,
            _ => SelfTest::NotRun,
        }
    }

    /// The result's name in doctor's output.
    pub fn as_str(self) -> &'static str {
        match self {
            SelfTest::NotRun => "not run",
            SelfTest::Passed => "passed",
            SelfTest::Failed => "failed",
        }
    }
}

/// One device's record.
#[repr(C)]
#[derive(Debug, Default)]
pub struct DeviceSlot {
    /// 0: free; else the library's key of the device (set last).
    key: AtomicU64,
    odp_general: AtomicU64,
    odp_rc: AtomicU32,
    /// 1: ODP for MRs whose needs the capabilities cover; 2: windows.
    odp: AtomicU32,
    test: AtomicU32,
    _pad: AtomicU32,
    name: [AtomicU64; NAME_WORDS],
    reason: [AtomicU64; REASON_WORDS],
}

/// One live MR's record.
#[repr(C)]
#[derive(Debug, Default)]
pub struct MrSlot {
    /// 0: free; else the MR's address in the process (claimed first).
    id: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    /// `mode << 32 | lkey`.
    mode_lkey: AtomicU64,
}

/// What the page says of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReport {
    /// The device's name (`ibv_get_device_name`).
    pub name: String,
    /// Whether its MRs are registered with on-demand paging (where their needs are covered).
    pub odp: bool,
    /// `odp_caps.general_caps` as `ibv_query_device_ex` reported it.
    pub odp_general_caps: u64,
    /// `odp_caps.per_transport_caps.rc_odp_caps`.
    pub odp_rc_caps: u32,
    /// The self-test's result.
    pub self_test: SelfTest,
    /// Why the mode was chosen (the self-test's finding among it).
    pub reason: String,
}

/// What the page says of a live MR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MrReport {
    /// The application's address.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The key the application sees.
    pub lkey: u32,
    /// How it is served.
    pub mode: MrMode,
}

fn store_text(words: &[AtomicU64], text: &str) {
    let cap = words.len() * 8 - 1;
    let mut n = text.len().min(cap);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    let mut bytes = vec![0u8; words.len() * 8];
    bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
    for (w, chunk) in words.iter().zip(bytes.chunks(8)) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        w.store(u64::from_le_bytes(word), Ordering::Relaxed);
    }
}

fn load_text(words: &[AtomicU64]) -> String {
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for w in words {
        bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The device and MR records of a page.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Modes {
    devices: [DeviceSlot; MAX_DEVICES],
    mrs: [MrSlot; MAX_MRS],
    /// Live MRs not listed (the table was full when they were registered).
    unlisted: AtomicU64,
}

impl Modes {
    /// Records (or updates) the device `key` (non-zero). A fifth device is not recorded.
    #[allow(clippy::too_many_arguments)] // one record's fields, named
    pub fn set_device(
        &self,
        key: u64,
        name: &str,
        odp: bool,
        general: u64,
        rc: u32,
        test: SelfTest,
        reason: &str,
    ) {
        let slot = self
            .devices
            .iter()
            .find(|s| s.key.load(Ordering::Acquire) == key)
            .or_else(|| {
                self.devices.iter().find(|s| {
                    s.key
                        .compare_exchange(0, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                })
            });
        let Some(s) = slot else {
            return;
        };
        store_text(&s.name, name);
        store_text(&s.reason, reason);
        s.odp_general.store(general, Ordering::Relaxed);
        s.odp_rc.store(rc, Ordering::Relaxed);
        s.odp.store(if odp { 1 } else { 2 }, Ordering::Relaxed);
        s.test.store(test.code(), Ordering::Relaxed);
        s.key.store(key, Ordering::Release);
    }

    /// The recorded devices.
    pub fn devices(&self) -> Vec<DeviceReport> {
        self.devices
            .iter()
            .filter(|s| !matches!(s.key.load(Ordering::Acquire), 0 | u64::MAX))
            .map(|s| DeviceReport {
                name: load_text(&s.name),
                odp: s.odp.load(Ordering::Relaxed) == 1,
                odp_general_caps: s.odp_general.load(Ordering::Relaxed),
                odp_rc_caps: s.odp_rc.load(Ordering::Relaxed),
                self_test: SelfTest::from_code(s.test.load(Ordering::Relaxed)),
                reason: load_text(&s.reason),
            })
            .collect()
    }

    /// Lists the MR `id` (its address in the process, non-zero), or counts it as unlisted.
    pub fn add_mr(&self, id: usize, addr: u64, len: u64, lkey: u32, mode: MrMode) {
        let id = id as u64;
        for s in &self.mrs {
            if s.id
                .compare_exchange(0, id, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.addr.store(addr, Ordering::Relaxed);
                s.len.store(len, Ordering::Relaxed);
                s.mode_lkey
                    .store(mode.code() << 32 | u64::from(lkey), Ordering::Release);
                return;
            }
        }
        self.unlisted.fetch_add(1, Ordering::Relaxed);
    }

    /// Changes the mode of the listed MR `id`.
    pub fn set_mr_mode(&self, id: usize, mode: MrMode) {
        if let Some(s) = self
            .mrs
            .iter()
            .find(|s| s.id.load(Ordering::Acquire) == id as u64)
        {
            let lkey = s.mode_lkey.load(Ordering::Relaxed) & 0xffff_ffff;
            s.mode_lkey
                .store(mode.code() << 32 | lkey, Ordering::Release);
        }
    }

    /// Forgets the MR `id` (deregistered); one that was not listed leaves the unlisted
    /// count.
    pub fn remove_mr(&self, id: usize) {
        for s in &self.mrs {
            if s.id.load(Ordering::Acquire) == id as u64 {
                s.mode_lkey.store(0, Ordering::Relaxed);
                s.id.store(0, Ordering::Release);
                return;
            }
        }
        let _ = self
            .unlisted
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// The listed MRs, and how many more are live.
    pub fn mrs(&self) -> (Vec<MrReport>, u64) {
        let listed = self
            .mrs
            .iter()
            .filter(|s| s.id.load(Ordering::Acquire) != 0)
            .filter_map(|s| {
                let ml = s.mode_lkey.load(Ordering::Acquire);
                Some(MrReport {
                    addr: s.addr.load(Ordering::Relaxed),
                    len: s.len.load(Ordering::Relaxed),
                    lkey: ml as u32,
                    mode: MrMode::from_code(ml >> 32)?,
                })
            })
            .collect();
        (listed, self.unlisted.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_mrs_are_recorded_updated_and_forgotten() {
        let m = Modes::default();
        m.set_device(
            7,
            "rxe0",
            false,
            1,
            0x3f,
            SelfTest::Failed,
            "WRITE: bytes wrong",
        );
        m.set_device(7, "rxe0", false, 1, 0x3f, SelfTest::Failed, "again");
        assert_eq!(m.devices().len(), 1);
        assert_eq!(m.devices()[0].reason, "again");
        assert_eq!(m.devices()[0].self_test, SelfTest::Failed);
        for k in 8..20 {
            m.set_device(k, "x", true, 1, 1, SelfTest::Passed, "");
        }
        assert_eq!(m.devices().len(), MAX_DEVICES);
        let long = "n".repeat(100);
        m.set_device(7, &long, false, 0, 0, SelfTest::NotRun, &"r".repeat(500));
        assert_eq!(m.devices()[0].name.len(), NAME_WORDS * 8 - 1);
        assert_eq!(m.devices()[0].reason.len(), REASON_WORDS * 8 - 1);

        for i in 1..=(MAX_MRS + 2) {
            m.add_mr(i * 16, i as u64 * 4096, 4096, i as u32, MrMode::Windows);
        }
        let (listed, more) = m.mrs();
        assert_eq!((listed.len(), more), (MAX_MRS, 2));
        m.set_mr_mode(16, MrMode::PinnedFallback);
        m.remove_mr(32);
        let (listed, _) = m.mrs();
        assert_eq!(listed.len(), MAX_MRS - 1);
        assert!(listed.contains(&MrReport {
            addr: 4096,
            len: 4096,
            lkey: 1,
            mode: MrMode::PinnedFallback
        }));
        m.add_mr(99, 1, 2, 3, MrMode::Odp);
        assert!(
            m.mrs()
                .0
                .iter()
                .any(|r| r.mode == MrMode::Odp && r.lkey == 3)
        );
        // An MR registered while the table was full is forgotten from the count.
        m.remove_mr(12345);
        assert_eq!(m.mrs().1, 1);
    }
}
