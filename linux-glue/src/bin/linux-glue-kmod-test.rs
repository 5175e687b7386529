//! linux-glue-kmod-test: the kernel backend (`RealModule` + `ModuleClient`) against the real
//! module, nprdma.ko (linux-glue/kernel). `cargo xtask kernel-test` runs it as root in a Debian
//! guest with the module loaded; it also runs on any machine where the module is loaded.
//!
//! ```text
//! linux-glue-kmod-test [--rmmod]
//! linux-glue-kmod-test --bench [--quick]
//!   --rmmod   also check that delete_module refuses while a file is open and succeeds after
//!             (needs CAP_SYS_MODULE; leaves the module unloaded)
//!   --bench   instead of the checks, the benchmark of src/guest/bench.rs (`NPRDMA-BENCH:`
//!             lines, goals beside the figures, nothing asserted); --quick: fewer samples
//! ```
//! One line per check, `NPRDMA-KMOD: PASS|FAIL|SKIP <name>: <detail>`, then
//! `NPRDMA-KMOD: TOTAL <passed> passed, <failed> failed, <skipped> skipped`; the exit status is
//! 1 if any check failed. Frames are compared with /proc/self/pagemap, which shows them only
//! to CAP_SYS_ADMIN: run it as root.

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("linux-glue-kmod-test runs on Linux only");
}

#[cfg(target_os = "linux")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--bench") {
        let quick = args.iter().any(|a| a == "--quick");
        std::process::exit(guest_bench::run(quick));
    }
    let rmmod = args.iter().any(|a| a == "--rmmod");
    std::process::exit(kt::run(rmmod));
}

#[cfg(target_os = "linux")]
#[path = "../guest/bench.rs"]
mod guest_bench;

#[cfg(target_os = "linux")]
#[path = "../guest/checks.rs"]
mod guest_checks;

#[cfg(target_os = "linux")]
mod kt {
    use super::guest_checks::{Check, Report, ensure, errno, errno_name, glue};
    use std::fs::File;
    use std::os::fd::{AsRawFd, RawFd};
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use hal::{AlignedRange, PageSize, VirtAddr};
    use linux_glue::abi::{self, AbiHeader, AbiStruct, InvalidationRecord};
    use linux_glue::kmod::{ModuleBackend, ModuleClient, ModuleRegion, RealModule};
    use linux_glue::mapping::{Advice, Mapping, Protection};
    use linux_glue::pagemap::PagemapEntry;
    use linux_glue::{Access, FaultKind, GlueError};

    const PAGE: u64 = 4096;
    const HUGE: u64 = 2 << 20;
    const MODULE_NAME: &str = "nprdma";
    const STATS: &str = "/sys/class/misc/nprdma-glue/stats";

    type Client = ModuleClient<Arc<RealModule>>;

    fn range(start: u64, len: u64) -> Result<AlignedRange<VirtAddr>, String> {
        AlignedRange::new(VirtAddr::new(start), len, PageSize::Size4K).map_err(|e| e.to_string())
    }

    /// ioctl with a buffer of at least the size `cmd` encodes; `Err(errno)`.
    fn raw_ioctl(fd: RawFd, cmd: u32, buf: &mut [u8]) -> Result<(), i32> {
        if buf.len() < ((cmd >> 16) & 0x3fff) as usize {
            return Err(libc::EINVAL);
        }
        // SAFETY: the kernel reads and writes at most the size `cmd` encodes, and `buf` is at
        // least that long (checked) and live and writable for the call.
        let rc = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, buf.as_mut_ptr()) };
        if rc < 0 { Err(errno()) } else { Ok(()) }
    }

    fn vmstat(name: &str) -> Result<u64, String> {
        let text = std::fs::read_to_string("/proc/vmstat").map_err(|e| e.to_string())?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .ok_or_else(|| format!("/proc/vmstat has no {name}"))
    }

    fn pins() -> Result<(u64, u64), String> {
        Ok((
            vmstat("nr_foll_pin_acquired")?,
            vmstat("nr_foll_pin_released")?,
        ))
    }

    /// (contexts, regions, teardowns) from the module's sysfs attribute.
    fn stats() -> Result<(u64, u64, u64), String> {
        let text = std::fs::read_to_string(STATS).map_err(|e| format!("{STATS}: {e}"))?;
        let w: Vec<&str> = text.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            w.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{STATS}: `{}`", text.trim()))
        };
        Ok((num(1)?, num(3)?, num(5)?))
    }

    /// The module's count of fault passes retried after a colliding invalidation.
    fn retries() -> Result<u64, String> {
        let text = std::fs::read_to_string(STATS).map_err(|e| format!("{STATS}: {e}"))?;
        text.split_whitespace()
            .skip_while(|w| *w != "retries")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{STATS}: no retries in `{}`", text.trim()))
    }

    /// Waits up to 5 s for `cond` on the module's stats.
    fn wait_stats(cond: impl Fn((u64, u64, u64)) -> bool) -> Result<(u64, u64, u64), String> {
        let start = Instant::now();
        loop {
            let s = stats()?;
            if cond(s) || start.elapsed() > Duration::from_secs(5) {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    struct Env {
        dev: Arc<RealModule>,
        client: Client,
        pagemap: File,
        /// The main test buffer and its region.
        buf: Mapping,
        region: Option<ModuleRegion>,
        pins0: (u64, u64),
        stats0: (u64, u64, u64),
    }

    const BUF_PAGES: u64 = 64;

    impl Env {
        fn pm(&self, addr: u64) -> Result<PagemapEntry, String> {
            let mut b = [0u8; 8];
            self.pagemap
                .read_exact_at(&mut b, (addr / PAGE) * 8)
                .map_err(|e| format!("pagemap: {e}"))?;
            Ok(PagemapEntry(u64::from_ne_bytes(b)))
        }

        fn region(&self) -> Result<&ModuleRegion, String> {
            self.region
                .as_ref()
                .ok_or_else(|| "the main region was not registered".to_string())
        }

        fn page(&self, i: u64) -> u64 {
            self.buf.addr().as_u64() + i * PAGE
        }

        /// Every record the ring holds now.
        fn drain(&mut self) -> Result<Vec<InvalidationRecord>, String> {
            let mut out = Vec::new();
            glue(
                "poll_invalidations",
                self.client.poll_invalidations(&mut out),
            )?;
            Ok(out)
        }
    }

    fn covers(r: &InvalidationRecord, start: u64, len: u64) -> bool {
        r.start <= start && start + len <= r.start + r.len
    }

    fn cause_name(c: u32) -> &'static str {
        match c {
            abi::cause::UNMAPPED => "UNMAPPED",
            abi::cause::CLEARED => "CLEARED",
            abi::cause::PROTECTION => "PROTECTION",
            abi::cause::RELEASED => "RELEASED",
            abi::cause::FRAME_CHANGED => "FRAME_CHANGED",
            _ => "other",
        }
    }

    fn setup() -> Result<Env, String> {
        // The stats before this process opens anything (a missing module says so first).
        drop(glue("open", RealModule::open())?);
        let stats0 = stats()?;
        let dev = Arc::new(glue("open", RealModule::open())?);
        let mut client = glue("version handshake", ModuleClient::connect(Arc::clone(&dev)))?;
        glue("ring setup", client.setup_ring(1024))?;
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| format!("pagemap: {e}"))?;
        let buf = glue(
            "mmap",
            Mapping::anonymous(BUF_PAGES * PAGE, Protection::ReadWrite),
        )?;
        Ok(Env {
            dev,
            client,
            pagemap,
            buf,
            region: None,
            pins0: pins()?,
            stats0,
        })
    }

    fn handshake(env: &Env) -> Check {
        let f = env.client.features();
        let all = abi::FEATURE_HUGE | abi::FEATURE_RING | abi::FEATURE_RESOLVE;
        ensure(f & all == all, || format!("features {f:#x}, want {all:#x}"))?;
        // IOC_VERSION answers whatever version the caller speaks.
        let mut v = abi::VersionArgs {
            hdr: AbiHeader {
                abi_version: 1,
                struct_size: 16,
            },
            ..Default::default()
        };
        raw_ioctl(env.dev.as_raw_fd(), abi::IOC_VERSION, v.as_bytes_mut())
            .map_err(|e| format!("IOC_VERSION from an ABI 1 caller: {}", errno_name(e)))?;
        ensure(v.module_version == abi::ABI_VERSION, || {
            format!("module says ABI {}", v.module_version)
        })?;
        Ok(format!(
            "module ABI {}, features {f:#x}; an ABI 1 caller is told {}",
            abi::ABI_VERSION,
            v.module_version
        ))
    }

    /// Without a DMA device bound (the x86_64 guest has none) the DMA ioctls exist and answer
    /// ENODEV; where one is bound, linux-glue-dma-test covers them.
    fn dma_without_device(env: &Env) -> Check {
        let bound = std::fs::read_dir("/sys/bus/pci/drivers/nprdma-edu")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().contains(':'))
            })
            .unwrap_or(false);
        if bound {
            return Ok("SKIP an edu is bound here (linux-glue-dma-test tests it)".into());
        }
        let f = env.client.features();
        ensure(f & abi::FEATURE_DMA != 0, || {
            format!("features {f:#x} lack FEATURE_DMA")
        })?;
        match env.client.dma_attach() {
            Err(GlueError::Os { errno, .. }) if errno == libc::ENODEV => {
                Ok("no edu bound: IOC_DMA_ATTACH says ENODEV".into())
            }
            other => Err(format!("IOC_DMA_ATTACH without a device: {other:?}")),
        }
    }

    fn register_untouched(env: &mut Env) -> Check {
        let (acq0, rel0) = pins()?;
        let region = glue(
            "register",
            env.client
                .register(env.buf.addr(), BUF_PAGES * PAGE, Access::Write),
        )?;
        let (acq1, rel1) = pins()?;
        for i in 0..BUF_PAGES {
            let p = env.page(i);
            ensure(!env.pm(p)?.present(), || {
                format!("page {i} became present by registering")
            })?;
            let e = region
                .entry(VirtAddr::new(p))
                .ok_or_else(|| format!("no table entry for page {i}"))?;
            ensure(!e.present(), || format!("table says page {i} is present"))?;
        }
        ensure(acq1 == acq0 && rel1 == rel0, || {
            format!("pins moved: acquired {acq0}->{acq1}, released {rel0}->{rel1}")
        })?;
        let s = stats()?;
        ensure(s.1 == env.stats0.1 + 1, || format!("stats {s:?}"))?;
        let id = region.id;
        env.region = Some(region);
        Ok(format!(
            "region {id} of {BUF_PAGES} pages: no page present (pagemap), table all absent, nr_foll_pin_acquired/released unchanged ({acq1}/{rel1})"
        ))
    }

    fn resolve_read(env: &mut Env) -> Check {
        let region = env.region()?;
        let p = env.page(0);
        let r = glue(
            "resolve",
            env.client
                .resolve(region, VirtAddr::new(p), Access::Read, false),
        )?;
        let pm = env.pm(p)?;
        ensure(pm.present() && pm.pfn() == Some(r.pfn), || {
            format!("module pfn {:#x}, pagemap {:?}", r.pfn, pm.pfn())
        })?;
        ensure(r.kind == Some(FaultKind::Minor), || {
            format!("kind {:?}, want Minor", r.kind)
        })?;
        ensure(r.size == PageSize::Size4K, || format!("size {:?}", r.size))?;
        let e = region.entry(VirtAddr::new(p)).ok_or("no entry")?;
        ensure(e.present() && e.version() == r.version, || {
            format!("entry {e:?}, resolve version {}", r.version)
        })?;
        Ok(format!(
            "minor fault, pfn {:#x} = pagemap's, entry present (writable {}) version {}",
            r.pfn,
            e.writable(),
            e.version()
        ))
    }

    fn resolve_write(env: &mut Env) -> Check {
        let region = env.region()?;
        let p = env.page(1);
        let r = glue(
            "resolve",
            env.client
                .resolve(region, VirtAddr::new(p), Access::Write, false),
        )?;
        let pm = env.pm(p)?;
        ensure(pm.present() && pm.pfn() == Some(r.pfn), || {
            format!("module pfn {:#x}, pagemap {:?}", r.pfn, pm.pfn())
        })?;
        ensure(r.kind == Some(FaultKind::Minor), || {
            format!("kind {:?}", r.kind)
        })?;
        let e = region.entry(VirtAddr::new(p)).ok_or("no entry")?;
        ensure(e.present() && e.writable(), || format!("entry {e:?}"))?;
        let again = glue(
            "resolve again",
            env.client
                .resolve(region, VirtAddr::new(p), Access::Write, false),
        )?;
        ensure(
            again.kind == Some(FaultKind::AlreadyPresent)
                && again.pfn == r.pfn
                && again.version == r.version,
            || format!("second resolve {again:?}, first {r:?}"),
        )?;
        // A CPU store to a page mapped writable changes nothing the device sees.
        glue("store", env.buf.write_u64(PAGE, 0x5eed))?;
        let recs = env.drain()?;
        ensure(!recs.iter().any(|x| covers(x, p, PAGE)), || {
            format!("a CPU store invalidated the page: {recs:?}")
        })?;
        Ok(format!(
            "minor fault, pfn {:#x} = pagemap's, entry present+writable; again: no fault, same pfn and version; a CPU store invalidates nothing",
            r.pfn
        ))
    }

    fn copy_on_write(env: &mut Env) -> Check {
        let region = env.region()?;
        let p = env.page(0);
        let before = region.entry(VirtAddr::new(p)).ok_or("no entry")?;
        let old_pfn = env.pm(p)?.pfn().ok_or("page 0 not present")?;
        // Page 0 was resolved for read: the shared zero page. The CPU's first store replaces
        // the frame (copy-on-write), which only an MMU notifier reports.
        glue("store", env.buf.write_u64(0, 0xc0de))?;
        let recs = env.drain()?;
        let rec = recs
            .iter()
            .find(|x| covers(x, p, PAGE))
            .ok_or_else(|| format!("no record for the COW: {recs:?}"))?;
        let region = env.region()?;
        let after = region.entry(VirtAddr::new(p)).ok_or("no entry")?;
        ensure(
            !after.present() && after.version() > before.version(),
            || format!("entry {before:?} -> {after:?}"),
        )?;
        let r = glue(
            "resolve after COW",
            env.client
                .resolve(region, VirtAddr::new(p), Access::Write, false),
        )?;
        let new_pfn = env.pm(p)?.pfn();
        ensure(new_pfn == Some(r.pfn) && r.pfn != old_pfn, || {
            format!(
                "old pfn {old_pfn:#x}, module {:#x}, pagemap {new_pfn:?}",
                r.pfn
            )
        })?;
        Ok(format!(
            "CPU store to the read-resolved page: record {} [{:#x}+{:#x}], version {}->{}, frame {old_pfn:#x}->{:#x} (pagemap agrees)",
            cause_name(rec.cause),
            rec.start,
            rec.len,
            before.version(),
            after.version(),
            r.pfn
        ))
    }

    fn fault_in(env: &mut Env) -> Check {
        let region = env.region()?;
        let rg = range(env.page(8), 32 * PAGE)?;
        let rep = glue("fault_in", env.client.fault_in(region, rg, Access::Write))?;
        ensure(
            rep.pages_mapped == 32 && rep.minor_faults == 32 && rep.major_faults == 0,
            || format!("{rep:?}"),
        )?;
        for i in 8..40 {
            let pm = env.pm(env.page(i))?;
            let e = region.entry(VirtAddr::new(env.page(i))).ok_or("no entry")?;
            ensure(pm.present() && e.present() && e.writable(), || {
                format!("page {i}: pagemap present {}, entry {e:?}", pm.present())
            })?;
        }
        let snap = glue(
            "ensure_present",
            env.client.ensure_present(region, rg, Access::Write),
        )?;
        ensure(region.still_valid(&snap), || {
            "fresh snapshot invalid".into()
        })?;
        Ok(format!(
            "32 pages: {} mapped, {} minor, {} major faults; pagemap and table agree; snapshot valid",
            rep.pages_mapped, rep.minor_faults, rep.major_faults
        ))
    }

    fn query_only(env: &mut Env) -> Check {
        let region = env.region()?;
        let p = env.page(50);
        let r = glue(
            "resolve (query)",
            env.client
                .resolve(region, VirtAddr::new(p), Access::Read, true),
        )?;
        ensure(r.kind.is_none(), || format!("{r:?}"))?;
        ensure(!env.pm(p)?.present(), || "the query faulted".into())?;
        Ok("an untouched page: reported absent, still not present".into())
    }

    /// The records for `[start, start + len)` after `op`, and checks that the pages' versions
    /// moved and the generation too.
    fn invalidated_by(
        env: &mut Env,
        first: u64,
        pages: u64,
        op: impl FnOnce(&Env) -> Result<(), String>,
    ) -> Result<(Vec<InvalidationRecord>, u32, u32), String> {
        let start = env.page(first);
        let region = env.region()?;
        let gen0 = region.generation();
        let v0: Vec<u32> = (first..first + pages)
            .map(|i| {
                region
                    .entry(VirtAddr::new(env.page(i)))
                    .map_or(0, |e| e.version())
            })
            .collect();
        op(env)?;
        let recs: Vec<InvalidationRecord> = env
            .drain()?
            .into_iter()
            .filter(|r| r.start < start + pages * PAGE && start < r.start + r.len)
            .collect();
        let region = env.region()?;
        ensure(region.generation() > gen0, || "generation unchanged".into())?;
        for (k, i) in (first..first + pages).enumerate() {
            let e = region.entry(VirtAddr::new(env.page(i))).ok_or("no entry")?;
            ensure(!e.present() && e.version() > v0[k], || {
                format!("page {i}: entry {e:?}, version before {}", v0[k])
            })?;
        }
        let v1 = region
            .entry(VirtAddr::new(start))
            .map_or(0, |e| e.version());
        Ok((recs, v0[0], v1))
    }

    fn describe(recs: &[InvalidationRecord]) -> String {
        recs.iter()
            .map(|r| format!("{} [{:#x}+{:#x}]", cause_name(r.cause), r.start, r.len))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn dontneed(env: &mut Env) -> Check {
        let region = env.region()?;
        let rg = range(env.page(8), 4 * PAGE)?;
        let snap = glue(
            "snapshot",
            env.client.ensure_present(region, rg, Access::Write),
        )?;
        let (recs, v0, v1) = invalidated_by(env, 8, 4, |env| {
            glue(
                "madvise",
                env.buf.advise(8 * PAGE, 4 * PAGE, Advice::DontNeed),
            )
        })?;
        let start = env.page(8);
        ensure(
            recs.iter()
                .any(|r| r.cause == abi::cause::CLEARED && covers(r, start, 4 * PAGE)),
            || format!("records {recs:?}"),
        )?;
        ensure(!env.region()?.still_valid(&snap), || {
            "the snapshot still validates".into()
        })?;
        Ok(format!(
            "records {}; versions {v0}->{v1}; the snapshot taken before no longer validates",
            describe(&recs)
        ))
    }

    fn mprotect(env: &mut Env) -> Check {
        let (recs, v0, v1) = invalidated_by(env, 20, 4, |env| {
            // SAFETY: pages 20..24 of the buffer this test owns; no Rust reference points into
            // it, and later accesses are reads or go through the module.
            let rc = unsafe {
                libc::mprotect(
                    env.page(20) as *mut libc::c_void,
                    (4 * PAGE) as usize,
                    libc::PROT_READ,
                )
            };
            ensure(rc == 0, || format!("mprotect: {}", errno_name(errno())))
        })?;
        let start = env.page(20);
        ensure(
            recs.iter()
                .any(|r| r.cause == abi::cause::PROTECTION && covers(r, start, 4 * PAGE)),
            || format!("records {recs:?}"),
        )?;
        let region = env.region()?;
        let w = env
            .client
            .resolve(region, VirtAddr::new(start), Access::Write, false);
        ensure(w == Err(GlueError::NotWritable { addr: start }), || {
            format!("resolve for write of a read-only page: {w:?}")
        })?;
        let r = glue(
            "resolve for read",
            env.client
                .resolve(region, VirtAddr::new(start), Access::Read, false),
        )?;
        let e = region.entry(VirtAddr::new(start)).ok_or("no entry")?;
        ensure(e.present() && !e.writable(), || format!("entry {e:?}"))?;
        ensure(env.pm(start)?.pfn() == Some(r.pfn), || "pfn differs".into())?;
        Ok(format!(
            "records {}; versions {v0}->{v1}; resolve for write now says not writable (5), for read maps it read-only",
            describe(&recs)
        ))
    }

    fn munmap(env: &mut Env) -> Check {
        let (recs, v0, v1) = invalidated_by(env, 44, 4, |env| {
            glue("munmap", env.buf.unmap_part(44 * PAGE, 4 * PAGE))
        })?;
        let start = env.page(44);
        ensure(
            recs.iter()
                .any(|r| r.cause == abi::cause::UNMAPPED && covers(r, start, 4 * PAGE)),
            || format!("records {recs:?}"),
        )?;
        let region = env.region()?;
        let r = env
            .client
            .resolve(region, VirtAddr::new(start), Access::Read, false);
        ensure(matches!(r, Err(GlueError::RegionGone { .. })), || {
            format!("resolve of the hole: {r:?}")
        })?;
        let f = env
            .client
            .fault_in(region, range(env.page(42), 4 * PAGE)?, Access::Read);
        ensure(matches!(f, Err(GlueError::RegionGone { .. })), || {
            format!("fault_in over the hole: {f:?}")
        })?;
        Ok(format!(
            "records {}; versions {v0}->{v1}; resolve and fault-in there: region gone (10)",
            describe(&recs)
        ))
    }

    fn thp(env: &mut Env) -> Check {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if mode.is_empty() || mode.contains("[never]") {
            return Ok(format!("SKIP THP is off here ({})", mode.trim()));
        }
        let m = glue(
            "mmap",
            Mapping::anonymous_aligned(HUGE, HUGE, Protection::ReadWrite),
        )?;
        glue("madvise", m.advise(0, HUGE, Advice::HugePage))?;
        let region = glue(
            "register",
            env.client.register(m.addr(), HUGE, Access::Write),
        )?;
        let base = m.addr().as_u64();
        let at = base + 5 * PAGE;
        let r = glue(
            "resolve",
            env.client
                .resolve(&region, VirtAddr::new(at), Access::Write, false),
        )?;
        ensure(r.size == PageSize::Size2M, || {
            format!("a 4 KiB mapping ({r:?}); THP mode {}", mode.trim())
        })?;
        ensure(
            r.mapping.start().as_u64() == base && r.pfn % 512 == 0,
            || format!("{r:?}"),
        )?;
        let pm = env.pm(at)?.pfn();
        ensure(pm == Some(r.pfn + 5), || {
            format!("pagemap {pm:?}, block pfn {:#x}", r.pfn)
        })?;
        let all = (0..512).all(|i| {
            region
                .entry(VirtAddr::new(base + i * PAGE))
                .is_some_and(|e| e.present() && e.huge())
        });
        ensure(all, || "not all 512 entries present+huge".into())?;
        let rep = glue(
            "fault_in",
            env.client
                .fault_in(&region, range(base, HUGE)?, Access::Write),
        )?;
        ensure(rep.huge_blocks == 1 && rep.pages_mapped == 512, || {
            format!("{rep:?}")
        })?;
        // Dropping one 4 KiB page splits the PMD: the whole block is invalidated.
        glue("madvise", m.advise(100 * PAGE, PAGE, Advice::DontNeed))?;
        let recs = env.drain()?;
        ensure(
            region
                .entry(VirtAddr::new(base))
                .is_some_and(|e| !e.present()),
            || format!("page 0 of the block still present after the split; records {recs:?}"),
        )?;
        glue("unregister", env.client.unregister(region))?;
        Ok(format!(
            "2 MiB block, pfn {:#x} (aligned; pagemap of page 5 = +5), 512 entries huge, fault-in: 1 block; a 4 KiB DONTNEED inside invalidates the whole block ({})",
            r.pfn,
            describe(&recs)
        ))
    }

    fn ring_overflow() -> Check {
        let dev = Arc::new(glue("open", RealModule::open())?);
        let mut c = glue("connect", ModuleClient::connect(dev))?;
        glue("ring", c.setup_ring(4))?;
        let m = glue("mmap", Mapping::anonymous(16 * PAGE, Protection::ReadWrite))?;
        let _region = glue("register", c.register(m.addr(), 16 * PAGE, Access::Write))?;
        for i in 0..8 {
            glue("madvise", m.advise(i * PAGE, PAGE, Advice::DontNeed))?;
        }
        let mut out = Vec::new();
        let r = c.poll_invalidations(&mut out);
        ensure(r == Err(GlueError::RingOverrun { lost: 4 }), || {
            format!("{r:?} with {} records", out.len())
        })?;
        let starts: Vec<u64> = out
            .iter()
            .map(|x| (x.start - m.addr().as_u64()) / PAGE)
            .collect();
        ensure(starts == [0, 1, 2, 3], || {
            format!("kept records for pages {starts:?}: the first four must stay")
        })?;
        let seqs: Vec<u64> = out.iter().map(|x| x.seq).collect();
        glue("madvise", m.advise(9 * PAGE, PAGE, Advice::DontNeed))?;
        out.clear();
        let n = glue("poll after the overrun", c.poll_invalidations(&mut out))?;
        ensure(n == 1 && out[0].seq == 4, || format!("{out:?}"))?;
        Ok(format!(
            "ring of 4, 8 invalidations: 4 records (seq {seqs:?}, never overwritten) + RingOverrun {{ lost: 4 }}; the next one is seq 4"
        ))
    }

    /// Resolutions racing with `madvise(DONTNEED)` of the same pages from another thread: the
    /// module's read_begin/read_retry loop must never hand out a frame the invalidation took
    /// away. A context of its own without a ring (its records are not wanted).
    fn race() -> Check {
        const PAGES: u64 = 16;
        let dev = Arc::new(glue("open", RealModule::open())?);
        let c = glue("connect", ModuleClient::connect(dev))?;
        let m = glue(
            "mmap",
            Mapping::anonymous(PAGES * PAGE, Protection::ReadWrite),
        )?;
        let region = glue(
            "register",
            c.register(m.addr(), PAGES * PAGE, Access::Write),
        )?;
        let retries0 = retries()?;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_millis(1500);
        let (resolved, contended, zaps) = std::thread::scope(|s| {
            let zapper = s.spawn(|| {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if m.advise(0, PAGES * PAGE, Advice::DontNeed).is_err() {
                        break;
                    }
                    n += 1;
                }
                n
            });
            let mut result = Ok((0u64, 0u64));
            let mut i = 0u64;
            while Instant::now() < deadline {
                let at = VirtAddr::new(m.addr().as_u64() + (i % PAGES) * PAGE);
                match c.resolve(&region, at, Access::Write, false) {
                    Ok(_) => result = result.map(|(ok, busy)| (ok + 1, busy)),
                    Err(GlueError::Contended { .. }) => {
                        result = result.map(|(ok, busy)| (ok, busy + 1))
                    }
                    Err(e) => {
                        result = Err(format!("resolve {i}: {e}"));
                        break;
                    }
                }
                i += 1;
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let zaps = zapper.join().unwrap_or(0);
            result.map(|(ok, busy)| (ok, busy, zaps))
        })?;
        ensure(resolved > 0 && zaps > 0, || {
            format!("{resolved} resolutions, {zaps} DONTNEEDs: no race happened")
        })?;
        let retried = retries()? - retries0;
        // Quiet again: every page resolves to the frame the CPU maps, and the table agrees.
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| format!("pagemap: {e}"))?;
        for i in 0..PAGES {
            let at = m.addr().as_u64() + i * PAGE;
            let r = glue(
                "resolve",
                c.resolve(&region, VirtAddr::new(at), Access::Write, false),
            )?;
            let mut b = [0u8; 8];
            pagemap
                .read_exact_at(&mut b, (at / PAGE) * 8)
                .map_err(|e| format!("pagemap: {e}"))?;
            let pm = PagemapEntry(u64::from_ne_bytes(b));
            let e = region.entry(VirtAddr::new(at)).ok_or("no entry")?;
            ensure(
                pm.pfn() == Some(r.pfn) && e.present() && e.version() == r.version,
                || {
                    format!(
                        "page {i}: module {r:?}, pagemap {:?}, entry {e:?}",
                        pm.pfn()
                    )
                },
            )?;
        }
        Ok(format!(
            "1.5 s of resolves against DONTNEEDs of the same 16 pages from another thread: {resolved} resolved, {contended} contended, {zaps} DONTNEEDs, {retried} fault passes retried after a colliding invalidation; afterwards every frame = pagemap's"
        ))
    }

    fn bad_input(env: &Env, report: &mut Report) -> Result<(), String> {
        let fd = env.dev.as_raw_fd();
        let c = &env.client;
        let region = env.region()?;
        let mut case = |name: &str, r: Check| report.line(&format!("bad-input/{name}"), r);
        let errno_case = |cmd: u32, bytes: &mut [u8], want: i32| -> Check {
            match raw_ioctl(fd, cmd, bytes) {
                Err(e) if e == want => Ok(errno_name(e)),
                other => Err(format!(
                    "got {}, want {}",
                    errno_name(other.err().unwrap_or(0)),
                    errno_name(want)
                )),
            }
        };
        let good = |addr: u64, len: u64| abi::RegisterArgs {
            hdr: AbiHeader::for_struct::<abi::RegisterArgs>(),
            addr,
            len,
            access: abi::ACCESS_WRITE,
            ..Default::default()
        };
        let base = env.page(0);
        let mut a = good(base, PAGE);
        a.hdr.abi_version = 1;
        case(
            "wrong-abi-version",
            errno_case(abi::IOC_REGISTER, a.as_bytes_mut(), libc::EPROTO),
        );
        let mut a = good(base, PAGE);
        a.hdr.struct_size = 56;
        case(
            "wrong-struct-size",
            errno_case(abi::IOC_REGISTER, a.as_bytes_mut(), libc::EINVAL),
        );
        let mut big = [0u8; 72];
        big[..8].copy_from_slice(AbiHeader::for_struct::<abi::RegisterArgs>().as_bytes_mut());
        let cmd72 = (abi::IOC_REGISTER & !(0x3fff << 16)) | (72 << 16);
        case(
            "wrong-size-in-request",
            errno_case(cmd72, &mut big, libc::EINVAL),
        );
        let mut v = abi::VersionArgs::default();
        let unknown = (abi::IOC_VERSION & !0xff) | 0x3f;
        case(
            "unknown-request",
            errno_case(unknown, v.as_bytes_mut(), libc::ENOTTY),
        );
        let status = |r: linux_glue::Result<ModuleRegion>, code: u32| -> Check {
            match r {
                Err(e) if e.code() == code => Ok(format!("status {code}: {e}")),
                Err(e) => Err(format!("status {} ({e}), want {code}", e.code())),
                Ok(r) => Err(format!("registered as region {}", r.id)),
            }
        };
        case(
            "misaligned-addr",
            status(c.register(VirtAddr::new(base + 8), PAGE, Access::Read), 1),
        );
        // ModuleClient refuses a misaligned length itself; the module's own answer:
        let mut a = good(base, PAGE + 8);
        let r = raw_ioctl(fd, abi::IOC_REGISTER, a.as_bytes_mut());
        case(
            "misaligned-len",
            match (r, a.status) {
                (Ok(()), 1) => Ok("status 1".into()),
                other => Err(format!("{other:?}")),
            },
        );
        let mut a = good(u64::MAX - PAGE + 1, 2 * PAGE);
        let r = raw_ioctl(fd, abi::IOC_REGISTER, a.as_bytes_mut());
        case(
            "overflowing-range",
            match (r, a.status) {
                (Ok(()), 2) => Ok("status 2".into()),
                other => Err(format!("{other:?}")),
            },
        );
        let mut a = good(base, 0);
        let r = raw_ioctl(fd, abi::IOC_REGISTER, a.as_bytes_mut());
        case(
            "empty-range",
            match (r, a.status) {
                (Ok(()), 3) => Ok("status 3".into()),
                other => Err(format!("{other:?}")),
            },
        );
        // A second context, without regions: new mappings may land in the main region's
        // munmapped hole, where the main context would answer "already registered" first.
        let other = Arc::new(glue("open", RealModule::open())?);
        let oc = glue("connect", ModuleClient::connect(Arc::clone(&other)))?;
        let holey = glue("mmap", Mapping::anonymous(3 * PAGE, Protection::ReadWrite))?;
        glue("munmap", holey.unmap_part(PAGE, PAGE))?;
        case(
            "unmapped-range",
            status(oc.register(holey.addr(), 3 * PAGE, Access::Read), 4),
        );
        let ro = glue("mmap", Mapping::anonymous(PAGE, Protection::Read))?;
        case(
            "write-to-read-only",
            status(oc.register(ro.addr(), PAGE, Access::Write), 5),
        );
        let none = glue("mmap", Mapping::anonymous(PAGE, Protection::None))?;
        case(
            "prot-none",
            status(oc.register(none.addr(), PAGE, Access::Read), 6),
        );
        let dup = c.register(VirtAddr::new(env.page(2)), PAGE, Access::Read);
        case(
            "double-registration",
            match dup {
                Err(GlueError::AlreadyRegistered { existing }) if existing == region.id => {
                    Ok(format!("status 7, existing region {existing}"))
                }
                other => Err(format!("{:?}", other.map(|r| r.id))),
            },
        );
        let mut u = abi::UnregisterArgs {
            hdr: AbiHeader::for_struct::<abi::UnregisterArgs>(),
            region_id: 999_999,
            ..Default::default()
        };
        let r = raw_ioctl(fd, abi::IOC_UNREGISTER, u.as_bytes_mut());
        case(
            "unknown-region",
            match (r, u.status) {
                (Ok(()), 8) => Ok("status 8 (unregister)".into()),
                other => Err(format!("{other:?}")),
            },
        );
        let mut f = abi::ResolveArgs {
            hdr: AbiHeader::for_struct::<abi::ResolveArgs>(),
            region_id: 999_999,
            addr: base,
            access: abi::ACCESS_READ,
            ..Default::default()
        };
        let r = raw_ioctl(fd, abi::IOC_RESOLVE, f.as_bytes_mut());
        case(
            "unknown-region-resolve",
            match (r, f.status) {
                (Ok(()), 8) => Ok("status 8 (resolve)".into()),
                other => Err(format!("{other:?}")),
            },
        );
        let outside = c.fault_in(region, range(base + BUF_PAGES * PAGE, PAGE)?, Access::Read);
        case(
            "outside-the-region",
            match outside {
                Err(e) if e.code() == 9 => Ok(format!("status 9: {e}")),
                other => Err(format!("{other:?}")),
            },
        );
        let mut a = good(env.page(60), PAGE);
        a.access = 3;
        let r = raw_ioctl(fd, abi::IOC_REGISTER, a.as_bytes_mut());
        case(
            "bad-access-value",
            match (r, a.status) {
                (Ok(()), 21) => Ok("status 21".into()),
                other => Err(format!("{other:?}")),
            },
        );
        let mut ring = abi::RingSetupArgs {
            hdr: AbiHeader::for_struct::<abi::RingSetupArgs>(),
            entries: 8,
            ..Default::default()
        };
        let r = raw_ioctl(fd, abi::IOC_RING_SETUP, ring.as_bytes_mut());
        case(
            "second-ring",
            match (r, ring.status) {
                (Ok(()), 21) => Ok("status 21".into()),
                other => Err(format!("{other:?}")),
            },
        );
        let mut ring = abi::RingSetupArgs {
            hdr: AbiHeader::for_struct::<abi::RingSetupArgs>(),
            entries: 3,
            ..Default::default()
        };
        let r = raw_ioctl(other.as_raw_fd(), abi::IOC_RING_SETUP, ring.as_bytes_mut());
        case(
            "ring-not-power-of-two",
            match (r, ring.status) {
                (Ok(()), 21) => Ok("status 21".into()),
                other => Err(format!("{other:?}")),
            },
        );
        case(
            "mmap-unknown-offset",
            match env.dev.map(0x7fff_0000_0000, PAGE) {
                Err(GlueError::Os { errno, .. }) if errno == libc::EINVAL => Ok("EINVAL".into()),
                other => Err(format!("{:?}", other.map(|m| m.len()))),
            },
        );
        let mut reg = good(env.page(60), PAGE);
        raw_ioctl(other.as_raw_fd(), abi::IOC_REGISTER, reg.as_bytes_mut()).map_err(errno_name)?;
        case(
            "table-mapped-writable",
            match other.map(reg.table_offset, PAGE) {
                Err(GlueError::Os { errno, .. }) if errno == libc::EACCES => {
                    Ok("EACCES (the table is read-only)".into())
                }
                r => Err(format!("{:?}", r.map(|m| m.len()))),
            },
        );
        Ok(())
    }

    /// A child of fork() shares the open file but not the mm: refused.
    fn other_mm(env: &mut Env) -> Check {
        let fd = env.dev.as_raw_fd();
        // SAFETY: this process is single-threaded; the child only issues system calls on memory
        // it owns (its copy of the stack) and leaves with _exit, running no destructors.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", errno_name(errno())));
        }
        if pid == 0 {
            let mut v = abi::VersionArgs {
                hdr: AbiHeader::for_struct::<abi::VersionArgs>(),
                ..Default::default()
            };
            let ioctl = raw_ioctl(fd, abi::IOC_VERSION, v.as_bytes_mut());
            // SAFETY: a new mapping of the device; the kernel picks the address.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    PAGE as usize,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0x1000,
                )
            };
            let mmap = if p == libc::MAP_FAILED { errno() } else { 0 };
            let code = match (ioctl, mmap) {
                (Err(libc::EBADF), libc::EBADF) => 0,
                (Err(libc::EBADF), _) => 2,
                _ => 1,
            };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let code = wait_child(pid)?;
        // fork write-protected the parent's anonymous pages (COW): those records are expected.
        let recs = env.drain()?;
        match code {
            0 => Ok(format!(
                "a forked child's ioctl and mmap on the inherited file: EBADF; fork's write-protection reached the parent's table ({} records)",
                recs.len()
            )),
            2 => Err("the child's ioctl got EBADF but its mmap did not".into()),
            c => Err(format!(
                "the child's ioctl was not refused with EBADF (code {c})"
            )),
        }
    }

    fn wait_child(pid: libc::pid_t) -> Result<i32, String> {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc != pid || !libc::WIFEXITED(status) {
            return Err(format!("child {pid}: waitpid {rc}, status {status:#x}"));
        }
        Ok(libc::WEXITSTATUS(status))
    }

    /// A file whose process's mm goes away while the file stays open elsewhere: the module
    /// tears the context's regions down on MMU_NOTIFY_RELEASE and refuses the file.
    fn mm_teardown() -> Check {
        let s0 = stats()?;
        // SAFETY: clone without CLONE_VM is fork with a shared descriptor table; this process
        // is single-threaded, and the child only runs the code below and leaves with _exit.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_FILES | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid < 0 {
            return Err(format!("clone: {}", errno_name(errno())));
        }
        if pid == 0 {
            let code = (|| -> Option<i32> {
                let dev = Arc::new(RealModule::open().ok()?);
                let c = ModuleClient::connect(Arc::clone(&dev)).ok()?;
                let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).ok()?;
                let r = c.register(m.addr(), 4 * PAGE, Access::Write).ok()?;
                c.resolve(&r, m.addr(), Access::Write, false).ok()?;
                // The descriptor stays open in the shared table; the mm goes with the child.
                let fd = dev.as_raw_fd();
                std::mem::forget((c, r, m, dev));
                Some(fd)
            })()
            .filter(|fd| (3..120).contains(fd))
            .unwrap_or(125);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let fd = wait_child(pid as libc::pid_t)?;
        ensure(fd != 125, || "the child could not register".into())?;
        let s1 = wait_stats(|s| s.2 > s0.2 && s.1 == s0.1)?;
        ensure(s1.2 == s0.2 + 1 && s1.1 == s0.1 && s1.0 == s0.0 + 1, || {
            format!("stats before {s0:?}, after the child's exit {s1:?}")
        })?;
        let mut v = abi::VersionArgs {
            hdr: AbiHeader::for_struct::<abi::VersionArgs>(),
            ..Default::default()
        };
        let r = raw_ioctl(fd, abi::IOC_VERSION, v.as_bytes_mut());
        ensure(r == Err(libc::EBADF), || {
            format!("ioctl on the orphaned file: {:?}", r.map_err(errno_name))
        })?;
        // SAFETY: the descriptor the child opened in our shared table; nothing else owns it.
        unsafe { libc::close(fd) };
        let s2 = wait_stats(|s| s.0 == s0.0)?;
        ensure(s2.0 == s0.0, || format!("contexts after close: {s2:?}"))?;
        Ok(format!(
            "child registered, exited with the file still open here: regions {}->{}, teardowns +1, the file refused here (EBADF), contexts back to {} after close",
            s0.1 + 1,
            s1.1,
            s2.0
        ))
    }

    fn close_teardown(env: Env) -> Check {
        let s0 = env.stats0;
        let before = stats()?;
        ensure(before.1 > s0.1, || {
            format!("no live region before close: {before:?}")
        })?;
        let Env {
            dev,
            client,
            region,
            buf,
            ..
        } = env;
        drop(region); // unmaps the table: a mapping holds the file
        drop(client);
        drop(dev);
        drop(buf);
        let after = wait_stats(|s| s.0 == s0.0 && s.1 == s0.1)?;
        ensure(after.0 == s0.0 && after.1 == s0.1, || {
            format!("before close {before:?}, after {after:?}, at start {s0:?}")
        })?;
        Ok(format!(
            "contexts {}->{}, regions {}->{}",
            before.0, after.0, before.1, after.1
        ))
    }

    /// With the module loaded, `auto` picks the kernel backend (the device opens and shakes
    /// hands), `user` forces user space without probing, and `kernel` at a node that does not
    /// exist is the typed error.
    fn backend_choice() -> Check {
        use linux_glue::backend::{BackendKind, BackendSetting, DeviceProbe, Reason, choose};
        let auto = glue(
            "auto",
            choose(BackendSetting::Auto, &DeviceProbe::default()),
        )?;
        ensure(auto.kind == BackendKind::Kernel, || {
            format!("auto chose {}: {}", auto.kind.as_str(), auto.reason)
        })?;
        ensure(matches!(auto.reason, Reason::DeviceUsable { .. }), || {
            format!("auto's reason: {}", auto.reason)
        })?;
        let client = auto
            .client
            .ok_or("auto chose the kernel without a client")?;
        let m = glue("map", Mapping::anonymous(4 * PAGE, Protection::ReadWrite))?;
        let reg = glue(
            "register through the chosen backend",
            client.register(m.addr(), 4 * PAGE, Access::Write),
        )?;
        let res = glue(
            "resolve",
            client.resolve(&reg, m.addr(), Access::Write, false),
        )?;
        let user = glue(
            "user",
            choose(BackendSetting::User, &DeviceProbe::default()),
        )?;
        ensure(user.kind == BackendKind::User, || {
            "user not honoured".into()
        })?;
        let missing = choose(
            BackendSetting::Kernel,
            &DeviceProbe::at("/dev/nprdma-absent"),
        );
        ensure(
            matches!(missing, Err(GlueError::KernelBackendUnavailable { .. })),
            || format!("forced kernel at a missing node: {missing:?}"),
        )?;
        Ok(format!(
            "auto: kernel ({}); a register + resolve through it: {:?} pfn {:#x}; user forced: \
             user; kernel forced at a missing node: KernelBackendUnavailable",
            auto.reason, res.kind, res.pfn
        ))
    }

    fn delete_module() -> Result<(), i32> {
        let name = std::ffi::CString::new(MODULE_NAME).map_err(|_| libc::EINVAL)?;
        // SAFETY: a NUL-terminated name that outlives the call.
        let rc = unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) };
        if rc < 0 { Err(errno()) } else { Ok(()) }
    }

    fn rmmod() -> Check {
        let dev = glue("open", RealModule::open())?;
        let refcnt = std::fs::read_to_string(format!("/sys/module/{MODULE_NAME}/refcnt"))
            .unwrap_or_default();
        let busy = delete_module();
        // kernel/module/main.c try_stop_module: -EWOULDBLOCK while references remain
        // (6.1); EBUSY in other paths of delete_module.
        ensure(matches!(busy, Err(libc::EAGAIN) | Err(libc::EBUSY)), || {
            format!(
                "delete_module with a file open: {:?}",
                busy.map_err(errno_name)
            )
        })?;
        ensure(refcnt.trim() == "1", || {
            format!("refcnt `{}`", refcnt.trim())
        })?;
        drop(dev);
        let gone = delete_module();
        ensure(gone.is_ok(), || {
            format!("delete_module after close: {:?}", gone.map_err(errno_name))
        })?;
        ensure(!std::path::Path::new(abi::DEVICE_NODE).exists(), || {
            "the device node survived the unload".into()
        })?;
        Ok(format!(
            "with a file open: refused ({}), refcnt 1; after close: unloaded, {} gone",
            errno_name(busy.err().unwrap_or(0)),
            abi::DEVICE_NODE
        ))
    }

    pub fn run(with_rmmod: bool) -> i32 {
        let mut report = Report::default();
        let mut env = match setup() {
            Ok(env) => env,
            Err(e) => {
                report.line("setup", Err(e));
                println!("NPRDMA-KMOD: TOTAL 0 passed, 1 failed, 0 skipped");
                return 1;
            }
        };
        report.line("handshake", handshake(&env));
        report.line("backend-choice", backend_choice());
        report.line("dma-without-device", dma_without_device(&env));
        report.line("register-untouched-unpinned", register_untouched(&mut env));
        report.line("resolve-read", resolve_read(&mut env));
        report.line("resolve-write", resolve_write(&mut env));
        report.line("copy-on-write", copy_on_write(&mut env));
        report.line("fault-in", fault_in(&mut env));
        report.line("query-only", query_only(&mut env));
        report.line("madv-dontneed", dontneed(&mut env));
        report.line("mprotect", mprotect(&mut env));
        report.line("munmap", munmap(&mut env));
        report.line("thp-2m", thp(&mut env));
        report.line("ring-overflow", ring_overflow());
        report.line("race-dontneed", race());
        if let Err(e) = bad_input(&env, &mut report) {
            report.line("bad-input", Err(e));
        }
        report.line("other-mm", other_mm(&mut env));
        report.line("mm-teardown", mm_teardown());
        let pins0 = env.pins0;
        report.line("close-teardown", close_teardown(env));
        report.line(
            "nothing-pinned",
            pins().and_then(|p| {
                ensure(p == pins0, || format!("pins {pins0:?} -> {p:?}"))?;
                Ok(format!(
                    "nr_foll_pin_acquired/released {}/{} over the whole run (unchanged)",
                    p.0, p.1
                ))
            }),
        );
        if with_rmmod {
            report.line("rmmod", rmmod());
        }
        report.finish()
    }
}
