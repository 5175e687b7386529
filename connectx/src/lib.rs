//! `libnprdma.so`: an LD_PRELOAD library over rdma-core (libibverbs) that lets unmodified
//! verbs applications register memory without pinning it.
//!
//! The application's registrations become *virtual regions*: the library pins and registers
//! only small windows of them, on demand, while the NIC may touch them, under a budget
//! (`NPRDMA_PIN_BUDGET`). Work requests are translated to window keys (split where they cross
//! windows), completions are rewritten so that the application sees exactly what plain verbs
//! would show, and peers reach unpinned memory through a per-region directory that the
//! application's rkey names. The design, its guarantees and its limits are in
//! docs/connectx.md.
//!
//! - [`hooks`]: the exported libibverbs symbols (the cdylib's interface).
//! - [`interpose`]: the same entry points as functions of an [`Engine`] (for tests).
//! - [`doctor`]: what `nprdma doctor` prints, for this and other processes.
//! - `fake`: an in-process fake provider for the host tests and benches, compiled only for
//!   them (feature `fake`, which connectx's dev-dependency on itself turns on).
//! - [`window`], [`translate`], [`completion`], [`directory`]: the pure logic (window cache and
//!   budget, WR planning, completion rules, directory layout and leases).
//! - `odp`, `odp_selftest`: the ODP mode (registrations with on-demand paging where the
//!   device does it correctly, checked by a one-time self-test per device); `fake_odp`: its
//!   part of the fake provider.
//! - `sq_room`, `fallback`, `transport`: the rule "never break a program that works without
//!   the library" (waiting for send-queue room, pinning as plain verbs would, UC pass-through).
//! - [`sys`]: the rdma-core ABI, layout-checked against the installed headers.
//! - `engine`: the runtime: the [`Engine`], the per-object records and every path between a
//!   verbs call and the provider, one concern per file. The files' imports form no cycle
//!   (docs/connectx.md §2, "The code: one-way modules", lists them by layer).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

pub mod completion;
pub mod config;
pub(crate) mod cq_ex;
mod cq_room;
pub mod ctl;
pub mod directory;
mod engine;
pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
#[cfg(any(test, feature = "fake"))]
pub mod fake_odp;
mod fallback;
pub mod fasthash;
mod fork;
pub mod hooks;
pub mod interpose;
mod lease_link;
pub mod log;
mod odp;
mod odp_choice;
mod odp_selftest;
mod ops;
pub mod real;
mod registry;
mod remote;
mod spin;
mod sq_room;
pub mod status;
pub mod status_file;
pub mod status_modes;
pub mod sys;
pub mod translate;
mod transport;
pub mod window;

pub use config::{Config, Mode, RegMode};
pub use engine::Engine;
pub use error::{ConnectxError, Result};

/// `nprdma doctor`'s data.
pub mod doctor {
    use crate::config::{Config, Mode};
    pub use crate::status::{Report, ReportMode, Skipped, Survey, read_file, scan, survey};

    /// The report of this process: the live counters if the library is active here (this
    /// process runs with libnprdma.so preloaded and has made a verbs call), otherwise what the
    /// environment would give a process started now, with zero counters.
    pub fn current() -> Report {
        if let Some(eng) = crate::hooks::active() {
            return eng.status().page().report();
        }
        let (cfg, why) = match Config::from_env() {
            Ok(c) => (c, None),
            Err(e) => {
                let mut c =
                    Config::for_tests(crate::config::DEFAULT_BUDGET, crate::config::DEFAULT_WINDOW);
                c.mode = Mode::Off;
                (c, Some(format!("{e}: the library would step aside")))
            }
        };
        let page = crate::status::PageStore::heap(&cfg);
        if cfg.mode == Mode::Off {
            page.page().add_reason(
                why.as_deref()
                    .unwrap_or("NPRDMA=off: every call passes through to libibverbs"),
            );
        }
        if let Some(e) = &cfg.reg_mode_error {
            page.page()
                .add_reason(&format!("{e}; the library would use the default, auto"));
        }
        page.page().add_reason(
            "libnprdma.so is not active in this process (not preloaded, or no verbs call yet)",
        );
        page.page().report()
    }

    /// The status files of every other process that runs (or ran) with the library, in
    /// `dir` (`None`: `$NPRDMA_STATUS_DIR`, else `/dev/shm/nprdma-<uid>`), and the files that
    /// could not be read.
    pub fn others(dir: Option<&std::path::Path>) -> Survey {
        let env_dir = std::env::var_os("NPRDMA_STATUS_DIR").map(std::path::PathBuf::from);
        let me = std::process::id();
        let mut found = survey(dir.or(env_dir.as_deref()));
        found.reports.retain(|(_, r)| r.pid != me || !r.alive);
        found
    }
}
