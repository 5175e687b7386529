//! The ODP mode's decisions (docs/connectx.md §9a), over plain data: what an MR's access
//! needs of the device's RC ODP capabilities, and the choice per device from its capabilities
//! and the self-test's outcome under `NPRDMA_MODE`. The runtime that asks the device and
//! registers is crate::odp.

use std::sync::Arc;

use crate::config::RegMode;
use crate::fasthash::FastMap;
use crate::status_modes::SelfTest;
use crate::sys::*;

/// What the self-test found (crate::odp_selftest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte arrived as sent.
    Passed,
    /// The data path is wrong (bytes, an error completion, a timeout).
    Failed(String),
    /// The test could not be set up (no active port, a refused object): nothing is known.
    NotRun(String),
}

/// What the library decided for one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceChoice {
    /// The device's name.
    pub name: String,
    /// Its ODP capabilities (all zero when it reports none).
    pub caps: ibv_odp_caps,
    /// The self-test's result.
    pub test: SelfTest,
    /// Whether MRs whose needs the capabilities cover are registered with ODP.
    pub odp: bool,
    /// Why, in a sentence.
    pub why: String,
}

/// A device's entry.
pub(crate) enum Entry {
    /// A thread of process `pid` is deciding.
    Deciding {
        /// That process.
        pid: u32,
    },
    /// Decided.
    Done(Arc<DeviceChoice>),
}

/// The per-device choices of one engine, and its ODP-mode MRs. Kept in the engine's state
/// (under its lock, which `fork()` handlers hold across a fork), never locked during a test.
#[derive(Default)]
pub(crate) struct Devices {
    /// By the device's `ibv_device` pointer.
    pub by_device: FastMap<usize, Entry>,
    /// ODP-mode MRs and their lengths.
    pub mrs: FastMap<usize, u64>,
}

/// The RC ODP capabilities an MR with `access` needs: every operation that may touch it.
/// Any MR may be the source of a SEND or an RDMA WRITE; local write adds RECV (and SRQ
/// receives), a READ's response and, on a device with atomics, an atomic's result; remote
/// rights add the remote operations.
pub(crate) fn needed_rc_caps(access: u32, atomics: bool) -> u32 {
    let mut need = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE;
    if access & IBV_ACCESS_LOCAL_WRITE != 0 {
        need |= IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV | IBV_ODP_SUPPORT_READ;
        if atomics {
            need |= IBV_ODP_SUPPORT_ATOMIC;
        }
    }
    if access & IBV_ACCESS_REMOTE_READ != 0 {
        need |= IBV_ODP_SUPPORT_READ;
    }
    if access & IBV_ACCESS_REMOTE_ATOMIC != 0 {
        need |= IBV_ODP_SUPPORT_ATOMIC;
    }
    need
}

/// The operations the self-test moves data with.
pub(crate) const TEST_NEEDS: u32 = IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;

/// Names of RC capability bits.
pub(crate) fn cap_names(bits: u32) -> String {
    let names = [
        (IBV_ODP_SUPPORT_SEND, "SEND"),
        (IBV_ODP_SUPPORT_RECV, "RECV"),
        (IBV_ODP_SUPPORT_WRITE, "WRITE"),
        (IBV_ODP_SUPPORT_READ, "READ"),
        (IBV_ODP_SUPPORT_ATOMIC, "ATOMIC"),
        (IBV_ODP_SUPPORT_SRQ_RECV, "SRQ_RECV"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join("|")
    }
}

/// The decision for a device from its capabilities and (if it ran) the self-test.
pub(crate) fn decide(
    mode: RegMode,
    name: &str,
    caps: Option<ibv_odp_caps>,
    test: impl FnOnce() -> Outcome,
) -> DeviceChoice {
    let mut c = DeviceChoice {
        name: name.to_string(),
        caps: caps.unwrap_or_default(),
        test: SelfTest::NotRun,
        odp: false,
        why: String::new(),
    };
    let Some(caps) = caps else {
        c.why = "ibv_query_device_ex gave no ODP capabilities: windows".into();
        return c;
    };
    if caps.general_caps & IBV_ODP_SUPPORT == 0 {
        c.why =
            "no on-demand paging reported (odp_caps.general_caps lacks IBV_ODP_SUPPORT): windows"
                .into();
        return c;
    }
    let trust = mode == RegMode::Odp;
    if caps.rc_odp_caps & TEST_NEEDS != TEST_NEEDS {
        c.odp = trust;
        c.why = format!(
            "RC ODP capabilities {} lack WRITE or READ, so the self-test cannot run: {}",
            cap_names(caps.rc_odp_caps),
            if trust {
                "NPRDMA_MODE=odp trusts the capability bits"
            } else {
                "windows"
            }
        );
        return c;
    }
    match test() {
        Outcome::Passed => {
            c.test = SelfTest::Passed;
            c.odp = true;
            c.why = format!(
                "ODP self-test passed (RC ODP capabilities {}): on-demand paging",
                cap_names(caps.rc_odp_caps)
            );
        }
        Outcome::Failed(why) => {
            c.test = SelfTest::Failed;
            c.why = format!(
                "{}ODP self-test FAILED: {why}; the device reports RC ODP {}: windows",
                if trust { "NPRDMA_MODE=odp: " } else { "" },
                cap_names(caps.rc_odp_caps)
            );
        }
        Outcome::NotRun(why) => {
            c.odp = trust;
            c.why = format!(
                "ODP self-test could not run ({why}): {}",
                if trust {
                    "NPRDMA_MODE=odp trusts the capability bits"
                } else {
                    "windows"
                }
            );
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> ibv_odp_caps {
        ibv_odp_caps {
            general_caps: IBV_ODP_SUPPORT,
            rc_odp_caps: 0x3f,
            ..Default::default()
        }
    }

    #[test]
    fn the_choice_follows_the_table() {
        let pass = || Outcome::Passed;
        let fail = || Outcome::Failed("WRITE: 5 of 9 bytes wrong".into());
        let not_run = || Outcome::NotRun("no active port".into());
        let never = || -> Outcome { panic!("the self-test must not run here") };
        for mode in [RegMode::Auto, RegMode::Odp] {
            assert!(!decide(mode, "d", None, never).odp);
            assert!(!decide(mode, "d", Some(ibv_odp_caps::default()), never).odp);
            let c = decide(mode, "d", Some(full()), pass);
            assert_eq!((c.odp, c.test), (true, SelfTest::Passed));
            let c = decide(mode, "d", Some(full()), fail);
            assert_eq!((c.odp, c.test), (false, SelfTest::Failed));
            assert!(c.why.contains("5 of 9 bytes wrong"), "{}", c.why);
            assert_eq!(c.why.contains("NPRDMA_MODE=odp"), mode == RegMode::Odp);
            let c = decide(mode, "d", Some(full()), not_run);
            assert_eq!((c.odp, c.test), (mode == RegMode::Odp, SelfTest::NotRun));
            let no_read = ibv_odp_caps {
                rc_odp_caps: 0x3f & !IBV_ODP_SUPPORT_READ,
                ..full()
            };
            let c = decide(mode, "d", Some(no_read), never);
            assert_eq!(c.odp, mode == RegMode::Odp);
        }
    }

    #[test]
    fn an_mr_needs_every_operation_its_access_allows() {
        let send_write = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE;
        assert_eq!(needed_rc_caps(0, true), send_write);
        assert_eq!(
            needed_rc_caps(IBV_ACCESS_REMOTE_READ, true),
            send_write | IBV_ODP_SUPPORT_READ
        );
        let lw = needed_rc_caps(IBV_ACCESS_LOCAL_WRITE, false);
        assert_eq!(lw & IBV_ODP_SUPPORT_ATOMIC, 0);
        assert_ne!(lw & IBV_ODP_SUPPORT_RECV, 0);
        assert_ne!(
            needed_rc_caps(IBV_ACCESS_LOCAL_WRITE, true) & IBV_ODP_SUPPORT_ATOMIC,
            0
        );
        assert_ne!(
            needed_rc_caps(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC, false)
                & IBV_ODP_SUPPORT_ATOMIC,
            0
        );
        assert_eq!(cap_names(0), "none");
        assert_eq!(
            cap_names(IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ),
            "WRITE|READ"
        );
    }
}
