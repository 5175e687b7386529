//! What the guest test binaries share: the check results and their `NPRDMA-KMOD:` lines,
//! which `cargo xtask kernel-test` parses, and errno helpers. Included by each binary with
//! `#[path]` (they are binaries, not part of the library's API).

/// A check's result: its detail line (`"SKIP ..."` for a skipped check) or why it failed.
pub type Check = Result<String, String>;

/// Counts and prints the checks.
#[derive(Default)]
pub struct Report {
    pub passed: u32,
    pub failed: u32,
    pub skipped: u32,
}

impl Report {
    /// Prints `name`'s line and counts it.
    pub fn line(&mut self, name: &str, r: Check) {
        match r {
            Ok(detail) if detail.starts_with("SKIP ") => {
                self.skipped += 1;
                println!("NPRDMA-KMOD: SKIP {name}: {}", &detail[5..]);
            }
            Ok(detail) => {
                self.passed += 1;
                println!("NPRDMA-KMOD: PASS {name}: {detail}");
            }
            Err(why) => {
                self.failed += 1;
                println!("NPRDMA-KMOD: FAIL {name}: {why}");
            }
        }
    }

    /// Prints the TOTAL line; the exit status (1 if any check failed).
    pub fn finish(&self) -> i32 {
        println!(
            "NPRDMA-KMOD: TOTAL {} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        );
        i32::from(self.failed > 0)
    }
}

/// `Err(what())` unless `cond`.
pub fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(what()) }
}

/// A library result as a check's error, prefixed with `what`.
pub fn glue<T>(what: &str, r: linux_glue::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// An errno's name, for the errnos the module's ABI documents.
pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EINVAL => "EINVAL",
        libc::EPROTO => "EPROTO",
        libc::ENOTTY => "ENOTTY",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EAGAIN => "EAGAIN/EWOULDBLOCK",
        libc::EFAULT => "EFAULT",
        libc::ENODEV => "ENODEV",
        libc::ENOTCONN => "ENOTCONN",
        libc::EALREADY => "EALREADY",
        libc::EINTR => "EINTR",
        libc::ETIMEDOUT => "ETIMEDOUT",
        0 => "success",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}
