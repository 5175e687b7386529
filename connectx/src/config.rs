//! Configuration from the environment, read once per process.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `NPRDMA` | `on`, or `off` for pass-through (the library steps aside completely) | `on` |
//! | `NPRDMA_MODE` | how registrations are served: `auto`, `odp`, `windows` or `off` ([`RegMode`]); a bad value is logged and `auto` used | `auto` |
//! | `NPRDMA_PIN_BUDGET` | bytes the library may keep pinned (`K`/`M`/`G` suffixes) | 64 MiB, lowered to `RLIMIT_MEMLOCK` when that is smaller and the process lacks `CAP_IPC_LOCK` |
//! | `NPRDMA_WINDOW` | size of a registration window, a power of two ≥ 4 KiB | 1 MiB |
//! | `NPRDMA_REMOTE_TIMEOUT_MS` | how long a requester waits for a peer's directory | 5000 |
//! | `NPRDMA_LOG` | `0` silences the library's stderr log | `1` |
//! | `NPRDMA_STATUS_DIR` | where the per-process status file lives | `/dev/shm/nprdma-<uid>` |

use std::path::PathBuf;

use crate::error::{ConnectxError, Result};

/// Default pinned-memory budget.
pub const DEFAULT_BUDGET: u64 = 64 << 20;
/// Default window size.
pub const DEFAULT_WINDOW: u64 = 1 << 20;
/// Smallest window: one page.
pub const MIN_WINDOW: u64 = 4096;

/// Whether the library does anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Registrations are virtual; windows are pinned on demand under the budget.
    Unpinned,
    /// `NPRDMA=off`: every call goes straight to libibverbs.
    Off,
}

/// How the library serves an application's registrations (`NPRDMA_MODE`; docs/connectx.md
/// §9a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegMode {
    /// On-demand paging where the device reports it for what the MR needs *and* the
    /// library's one-time self-test on that device passed; windows otherwise.
    Auto,
    /// On-demand paging wherever the device reports it; the self-test still runs, and a
    /// failure is logged loudly and falls back to windows.
    Odp,
    /// Always windows (directories and pinned windows under the budget).
    Windows,
    /// Everything passes through, as `NPRDMA=off`.
    Off,
}

impl RegMode {
    /// Parses `NPRDMA_MODE`'s value (surrounding blanks and case ignored).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(RegMode::Auto),
            "odp" => Ok(RegMode::Odp),
            "windows" => Ok(RegMode::Windows),
            "off" => Ok(RegMode::Off),
            _ => Err(ConnectxError::Config {
                name: "NPRDMA_MODE",
                value: value.to_string(),
                why: "use auto, odp, windows or off",
            }),
        }
    }

    /// The setting's name, as it is written.
    pub fn as_str(self) -> &'static str {
        match self {
            RegMode::Auto => "auto",
            RegMode::Odp => "odp",
            RegMode::Windows => "windows",
            RegMode::Off => "off",
        }
    }
}

/// The library's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Active mode.
    pub mode: Mode,
    /// How registrations are served (`NPRDMA_MODE`); [`RegMode::Off`] comes with
    /// [`Mode::Off`].
    pub reg_mode: RegMode,
    /// `NPRDMA_MODE`'s value when it did not parse (the default was used): the library logs
    /// it and records it for doctor, and the application runs on.
    pub reg_mode_error: Option<ConnectxError>,
    /// Pinned-memory budget in bytes.
    pub budget: u64,
    /// Where the budget came from (for the log and doctor).
    pub budget_source: &'static str,
    /// Window size in bytes (power of two).
    pub window: u64,
    /// Remote directory deadline.
    pub remote_timeout_ms: u64,
    /// Whether to log to stderr.
    pub log: bool,
    /// Status directory.
    pub status_dir: PathBuf,
}

impl Config {
    /// Reads the configuration through `get` (the process environment in the library, a map
    /// in tests). `memlock` is `RLIMIT_MEMLOCK`'s soft limit, `None` when unlimited.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        memlock: Option<u64>,
        uid: u32,
    ) -> Result<Self> {
        let (reg_mode, reg_mode_error) = Self::reg_mode_from(&get);
        let mode = match get("NPRDMA").as_deref().map(str::trim) {
            None | Some("") | Some("on") | Some("1") if reg_mode == RegMode::Off => Mode::Off,
            None | Some("") | Some("on") | Some("1") => Mode::Unpinned,
            Some("off") | Some("0") => Mode::Off,
            Some(other) => {
                return Err(ConnectxError::Config {
                    name: "NPRDMA",
                    value: other.to_string(),
                    why: "use on or off",
                });
            }
        };
        let (budget, budget_source) = match get("NPRDMA_PIN_BUDGET") {
            Some(v) => (parse_size("NPRDMA_PIN_BUDGET", &v)?, "NPRDMA_PIN_BUDGET"),
            None => match memlock {
                Some(limit) if limit < DEFAULT_BUDGET => (limit, "RLIMIT_MEMLOCK"),
                _ => (DEFAULT_BUDGET, "default"),
            },
        };
        if budget < 4 * MIN_WINDOW {
            return Err(ConnectxError::Config {
                name: "NPRDMA_PIN_BUDGET",
                value: budget.to_string(),
                why: "must be at least 16 KiB",
            });
        }
        let window = match get("NPRDMA_WINDOW") {
            Some(v) => parse_size("NPRDMA_WINDOW", &v)?,
            None => DEFAULT_WINDOW,
        };
        if !window.is_power_of_two() || window < MIN_WINDOW {
            return Err(ConnectxError::Config {
                name: "NPRDMA_WINDOW",
                value: window.to_string(),
                why: "must be a power of two of at least 4096",
            });
        }
        // A window larger than a quarter of the budget would leave no room to evict into.
        let window = window.min(prev_power_of_two(budget / 4)).max(MIN_WINDOW);
        let remote_timeout_ms = match get("NPRDMA_REMOTE_TIMEOUT_MS") {
            Some(v) => v.trim().parse::<u64>().map_err(|_| ConnectxError::Config {
                name: "NPRDMA_REMOTE_TIMEOUT_MS",
                value: v.clone(),
                why: "a whole number of milliseconds",
            })?,
            None => 5000,
        };
        let (log, status_dir) = Self::log_and_status_dir(&get, uid);
        let reg_mode = if mode == Mode::Off {
            RegMode::Off
        } else {
            reg_mode
        };
        Ok(Self {
            mode,
            reg_mode,
            reg_mode_error,
            budget,
            budget_source,
            window,
            remote_timeout_ms,
            log,
            status_dir,
        })
    }

    /// `NPRDMA_MODE`: never fails; a bad value gives the default, [`RegMode::Auto`], and the
    /// error to log.
    fn reg_mode_from(get: &impl Fn(&str) -> Option<String>) -> (RegMode, Option<ConnectxError>) {
        match get("NPRDMA_MODE") {
            None => (RegMode::Auto, None),
            Some(v) if v.trim().is_empty() => (RegMode::Auto, None),
            Some(v) => match RegMode::parse(&v) {
                Ok(m) => (m, None),
                Err(e) => (RegMode::Auto, Some(e)),
            },
        }
    }

    /// `NPRDMA_LOG` and `NPRDMA_STATUS_DIR`: they never fail to parse.
    fn log_and_status_dir(get: &impl Fn(&str) -> Option<String>, uid: u32) -> (bool, PathBuf) {
        let log = !matches!(get("NPRDMA_LOG").as_deref().map(str::trim), Some("0"));
        let status_dir = get("NPRDMA_STATUS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| default_status_dir(uid));
        (log, status_dir)
    }

    /// The configuration after another variable failed to parse: pass-through (the library
    /// steps aside), but still logging and publishing its status where the user asked, so
    /// that `nprdma doctor` shows the process and why it stepped aside.
    pub fn pass_through_from_lookup(get: impl Fn(&str) -> Option<String>, uid: u32) -> Self {
        let (log, status_dir) = Self::log_and_status_dir(&get, uid);
        Self {
            mode: Mode::Off,
            reg_mode: RegMode::Off,
            reg_mode_error: None,
            budget: DEFAULT_BUDGET,
            budget_source: "not used (pass-through: a setting did not parse)",
            window: DEFAULT_WINDOW,
            remote_timeout_ms: 5000,
            log,
            status_dir,
        }
    }

    /// The process's configuration: environment, the memlock limit the kernel enforces on
    /// it ([`enforced_memlock`]) and uid.
    pub fn from_env() -> Result<Self> {
        let cap_eff = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| effective_caps(&s));
        Self::from_lookup(
            |k| std::env::var(k).ok(),
            enforced_memlock(cap_eff, memlock_limit()),
            current_uid(),
        )
    }

    /// [`pass_through_from_lookup`](Self::pass_through_from_lookup) on the environment.
    pub fn pass_through_from_env() -> Self {
        Self::pass_through_from_lookup(|k| std::env::var(k).ok(), current_uid())
    }

    /// A configuration for tests: unpinned, windows always (`NPRDMA_MODE=windows`: the
    /// tests of the window machinery must not be served by on-demand paging), the given
    /// budget and window, log off.
    pub fn for_tests(budget: u64, window: u64) -> Self {
        Self {
            mode: Mode::Unpinned,
            reg_mode: RegMode::Windows,
            reg_mode_error: None,
            budget,
            budget_source: "test",
            window,
            remote_timeout_ms: 5000,
            log: false,
            status_dir: std::env::temp_dir().join("nprdma-test-status"),
        }
    }
}

/// The default status directory for `uid`.
pub fn default_status_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/nprdma-{uid}"))
}

/// The real uid of this process.
pub fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `CAP_IPC_LOCK`'s bit (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// The memlock limit the kernel applies to registrations: `ib_umem_get`
/// (drivers/infiniband/core/umem.c) fails a pin beyond `RLIMIT_MEMLOCK` only without
/// `CAP_IPC_LOCK`, so a process that has it (root, usually) pins without a limit, and the
/// budget follows plain verbs: `None`, no limit. `cap_eff` is the effective capability set
/// (`None` when unknown: the rlimit is kept, the safe side).
pub fn enforced_memlock(cap_eff: Option<u64>, rlimit: Option<u64>) -> Option<u64> {
    match cap_eff {
        Some(caps) if caps & (1 << CAP_IPC_LOCK) != 0 => None,
        _ => rlimit,
    }
}

/// The effective capability set from the text of `/proc/<pid>/status` (its `CapEff:` line,
/// hexadecimal; proc(5)).
pub fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(lim.rlim_cur)
    }
}

fn prev_power_of_two(x: u64) -> u64 {
    if x == 0 {
        0
    } else {
        1 << (63 - x.leading_zeros())
    }
}

/// Parses `123`, `64K`, `16M`, `1G` (binary multiples).
pub fn parse_size(name: &'static str, value: &str) -> Result<u64> {
    let v = value.trim();
    let bad = || ConnectxError::Config {
        name,
        value: value.to_string(),
        why: "a size in bytes, optionally with K, M or G",
    };
    let (digits, shift) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 10),
        Some((i, 'm' | 'M')) => (&v[..i], 20),
        Some((i, 'g' | 'G')) => (&v[..i], 30),
        Some(_) => (v, 0),
        None => return Err(bad()),
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)], memlock: Option<u64>) -> Result<Config> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned(), memlock, 1000)
    }

    #[test]
    fn defaults_and_memlock_cap() {
        let c = cfg(&[], None).unwrap();
        assert_eq!(c.mode, Mode::Unpinned);
        assert_eq!(c.budget, 64 << 20);
        assert_eq!(c.window, 1 << 20);
        assert_eq!(c.status_dir, PathBuf::from("/dev/shm/nprdma-1000"));
        // Debian's default RLIMIT_MEMLOCK is 8 MiB: the budget follows it.
        let c = cfg(&[], Some(8 << 20)).unwrap();
        assert_eq!((c.budget, c.budget_source), (8 << 20, "RLIMIT_MEMLOCK"));
        // An explicit budget wins.
        let c = cfg(&[("NPRDMA_PIN_BUDGET", "16M")], Some(8 << 20)).unwrap();
        assert_eq!(c.budget, 16 << 20);
    }

    #[test]
    fn cap_ipc_lock_lifts_the_memlock_cap_as_it_does_for_plain_verbs() {
        // Root in a stock Debian guest: 8 MiB RLIMIT_MEMLOCK, full capabilities.
        let root = effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n");
        assert_eq!(root, Some(0x1ff_ffff_ffff));
        assert_eq!(enforced_memlock(root, Some(8 << 20)), None);
        let c = cfg(&[], enforced_memlock(root, Some(8 << 20))).unwrap();
        assert_eq!((c.budget, c.budget_source), (DEFAULT_BUDGET, "default"));
        // A user without CAP_IPC_LOCK keeps the rlimit, as ib_umem_get enforces it.
        let user = effective_caps("CapEff:\t0000000000000000\n");
        assert_eq!(enforced_memlock(user, Some(8 << 20)), Some(8 << 20));
        // Only CAP_IPC_LOCK counts; unknown capabilities keep the rlimit.
        assert_eq!(enforced_memlock(Some(1 << 14), Some(1 << 20)), None);
        assert_eq!(
            enforced_memlock(Some(!(1 << 14)), Some(1 << 20)),
            Some(1 << 20)
        );
        assert_eq!(enforced_memlock(None, Some(1 << 20)), Some(1 << 20));
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
    }

    #[test]
    fn after_a_bad_setting_the_pass_through_config_keeps_the_log_and_status_settings() {
        let env = [
            ("NPRDMA_PIN_BUDGET", "lots"),
            ("NPRDMA_LOG", "0"),
            ("NPRDMA_STATUS_DIR", "/run/user/7/nprdma"),
        ];
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        assert!(Config::from_lookup(get, None, 7).is_err());
        let c = Config::pass_through_from_lookup(get, 7);
        assert_eq!(c.mode, Mode::Off);
        assert!(!c.log);
        assert_eq!(c.status_dir, PathBuf::from("/run/user/7/nprdma"));
        assert_ne!(c.budget_source, "test");
    }

    #[test]
    fn off_and_bad_values() {
        assert_eq!(cfg(&[("NPRDMA", "off")], None).unwrap().mode, Mode::Off);
        assert_eq!(cfg(&[("NPRDMA", "bogus")], None).unwrap_err().code(), 1);
        assert!(cfg(&[("NPRDMA_WINDOW", "5000")], None).is_err());
        assert!(cfg(&[("NPRDMA_PIN_BUDGET", "1K")], None).is_err());
        assert!(cfg(&[("NPRDMA_PIN_BUDGET", "x")], None).is_err());
        assert!(cfg(&[("NPRDMA_PIN_BUDGET", "99999999999G")], None).is_err());
    }

    #[test]
    fn the_registration_mode_defaults_to_auto_and_a_bad_value_never_fails() {
        let c = cfg(&[], None).unwrap();
        assert_eq!(
            (c.reg_mode, c.reg_mode_error.clone()),
            (RegMode::Auto, None)
        );
        for (v, m) in [
            ("auto", RegMode::Auto),
            (" ODP ", RegMode::Odp),
            ("windows", RegMode::Windows),
            ("", RegMode::Auto),
        ] {
            let c = cfg(&[("NPRDMA_MODE", v)], None).unwrap();
            assert_eq!(c.reg_mode, m, "{v:?}");
            assert_eq!(c.mode, Mode::Unpinned);
        }
        // `off` is NPRDMA=off.
        let c = cfg(&[("NPRDMA_MODE", "off")], None).unwrap();
        assert_eq!((c.mode, c.reg_mode), (Mode::Off, RegMode::Off));
        let c = cfg(&[("NPRDMA", "off"), ("NPRDMA_MODE", "odp")], None).unwrap();
        assert_eq!((c.mode, c.reg_mode), (Mode::Off, RegMode::Off));
        // A bad value: the default, and a typed error to log; the configuration still loads.
        let c = cfg(&[("NPRDMA_MODE", "fast")], None).unwrap();
        assert_eq!((c.mode, c.reg_mode), (Mode::Unpinned, RegMode::Auto));
        let e = c.reg_mode_error.unwrap();
        assert_eq!(e.code(), 1);
        assert!(e.to_string().contains("NPRDMA_MODE"), "{e}");
        assert!(RegMode::parse("pinned").is_err());
        assert_eq!(RegMode::parse("Windows").unwrap().as_str(), "windows");
    }

    #[test]
    fn window_is_capped_to_a_quarter_of_the_budget() {
        let c = cfg(
            &[("NPRDMA_PIN_BUDGET", "1M"), ("NPRDMA_WINDOW", "1M")],
            None,
        )
        .unwrap();
        assert_eq!(c.window, 256 << 10);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("X", "4096").unwrap(), 4096);
        assert_eq!(parse_size("X", "64k").unwrap(), 65536);
        assert_eq!(parse_size("X", " 2G ").unwrap(), 2 << 30);
        assert!(parse_size("X", "").is_err());
        assert!(parse_size("X", "M").is_err());
    }
}
