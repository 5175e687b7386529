//! linux-glue benchmark: registration without pinning vs pinning vs pre-faulting, RSS after a
//! partial touch, and fault-resolution latency (minor anonymous, minor page cache, major from a
//! swap file it creates and always removes), printed as tables next to NP-RDMA's numbers.
//!
//! ```text
//! cargo run --release -p linux-glue --bin linux-glue-bench -- [options]
//!   --size SIZE        region for the registration comparison (default 1G; 16G for the goal)
//!   --touch SIZE       how much of it to touch for the RSS check (default min(size, 1G))
//!   --samples N        fault samples per minor case (default 4000)
//!   --major-pages N    pages evicted to swap and faulted back (default 4000)
//!   --swap-dir DIR     where the swap file goes (default: the temporary directory)
//!   --skip-pin         skip mlock and MADV_POPULATE_WRITE of the whole region
//!   --skip-swap        skip the major-fault case
//! ```
//! Numbers are printed, never asserted. Other users share the machine: run the full 16 GiB
//! once, not in a loop.

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("linux-glue-bench runs on Linux only");
}

#[cfg(target_os = "linux")]
fn main() {
    if let Err(e) = bench::run() {
        eprintln!("linux-glue-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(target_os = "linux")]
mod bench {
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    use hal::{AlignedRange, PageSize, VirtAddr};
    use linux_glue::mapping::{Advice, Mapping, Protection};
    use linux_glue::swap::{self, SwapLab};
    use linux_glue::{Access, FaultKind, Glue, GlueConfig, GlueError, Invalidate, Resolver};
    use std::sync::mpsc::Receiver;

    const PAGE: u64 = 4096;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    /// NP-RDMA headline numbers (arXiv:2310.11062, abstract).
    const NP_MINOR: &str = "3.5-5.7";
    const NP_MAJOR: &str = "60";

    struct Options {
        size: u64,
        touch: u64,
        samples: u64,
        major_pages: u64,
        swap_dir: PathBuf,
        skip_pin: bool,
        skip_swap: bool,
    }

    fn parse_size(s: &str) -> Result<u64, String> {
        let s = s.trim();
        let (num, mult) = match s.chars().last() {
            Some('G' | 'g') => (&s[..s.len() - 1], GIB),
            Some('M' | 'm') => (&s[..s.len() - 1], MIB),
            Some('K' | 'k') => (&s[..s.len() - 1], 1024),
            _ => (s, 1),
        };
        let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("size {s:?} overflows"))
    }

    fn options() -> Result<Options, String> {
        let mut o = Options {
            size: GIB,
            touch: 0,
            samples: 4000,
            major_pages: 4000,
            swap_dir: std::env::temp_dir(),
            skip_pin: false,
            skip_swap: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--size" => o.size = parse_size(&val()?)?,
                "--touch" => o.touch = parse_size(&val()?)?,
                "--samples" => o.samples = val()?.parse().map_err(|_| "bad --samples")?,
                "--major-pages" => {
                    o.major_pages = val()?.parse().map_err(|_| "bad --major-pages")?
                }
                "--swap-dir" => o.swap_dir = PathBuf::from(val()?),
                "--skip-pin" => o.skip_pin = true,
                "--skip-swap" => o.skip_swap = true,
                "-h" | "--help" => {
                    println!("see the doc comment of src/bin/linux-glue-bench.rs for options");
                    std::process::exit(0);
                }
                other => return Err(format!("unknown option {other}")),
            }
        }
        o.size = o.size.next_multiple_of(2 * MIB).max(2 * MIB);
        if o.touch == 0 {
            o.touch = o.size.min(GIB);
        }
        o.touch = o.touch.min(o.size).next_multiple_of(PAGE);
        Ok(o)
    }

    fn human(bytes: u64) -> String {
        if bytes >= GIB && bytes.is_multiple_of(GIB) {
            format!("{} GiB", bytes / GIB)
        } else if bytes >= GIB {
            format!("{:.2} GiB", bytes as f64 / GIB as f64)
        } else {
            format!("{:.1} MiB", bytes as f64 / MIB as f64)
        }
    }

    fn rss() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }

    fn us(d: Duration) -> f64 {
        d.as_secs_f64() * 1e6
    }

    fn fmt_time(d: Duration) -> String {
        let s = d.as_secs_f64();
        if s >= 1.0 {
            format!("{s:.2} s")
        } else if s >= 1e-3 {
            format!("{:.2} ms", s * 1e3)
        } else {
            format!("{:.1} us", s * 1e6)
        }
    }

    struct Dist {
        n: usize,
        p50: f64,
        p99: f64,
        mean: f64,
    }

    fn dist(mut v: Vec<f64>) -> Option<Dist> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let at = |p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
        Some(Dist {
            n: v.len(),
            p50: at(50),
            p99: at(99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }

    fn row(name: &str, d: Option<Dist>, np: &str, note: &str) {
        match d {
            Some(d) => println!(
                "  {name:<44} {:>7} {:>9.2} {:>9.2} {:>9.2}   {np:>8}  {note}",
                d.n, d.p50, d.p99, d.mean
            ),
            None => println!(
                "  {name:<44} {:>7} {:>9} {:>9} {:>9}   {np:>8}  {note}",
                0, "-", "-", "-"
            ),
        }
    }

    fn range(start: VirtAddr, len: u64) -> Result<AlignedRange<VirtAddr>, GlueError> {
        Ok(AlignedRange::new(start, len, PageSize::Size4K)?)
    }

    /// Resolves each page, returning (latency us, kind) per call.
    fn resolve_all(
        r: &Resolver,
        pages: impl Iterator<Item = VirtAddr>,
        access: Access,
    ) -> Result<Vec<(f64, FaultKind)>, GlueError> {
        let mut out = Vec::new();
        for p in pages {
            let t = Instant::now();
            let res = r.resolve(p, access)?;
            out.push((us(t.elapsed()), res.kind));
        }
        Ok(out)
    }

    fn of_kind(v: &[(f64, FaultKind)], k: FaultKind) -> Vec<f64> {
        v.iter()
            .filter(|(_, kind)| *kind == k)
            .map(|(t, _)| *t)
            .collect()
    }

    pub fn run() -> Result<(), String> {
        let o = options()?;
        let (glue, events) = Glue::new(GlueConfig::default()).map_err(|e| e.to_string())?;
        let caps = glue.capabilities();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        println!(
            "linux-glue-bench: kernel {}, {} CPUs",
            kernel.trim(),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("  {caps:?}");
        println!(
            "  vm.page-cluster {}, swappiness {}",
            std::fs::read_to_string("/proc/sys/vm/page-cluster")
                .unwrap_or_default()
                .trim(),
            std::fs::read_to_string("/proc/sys/vm/swappiness")
                .unwrap_or_default()
                .trim()
        );

        registration(&glue, &o).map_err(|e| format!("registration: {e}"))?;
        faults(&glue, &o).map_err(|e| format!("fault resolution: {e}"))?;
        invalidations(&glue, &events, &o).map_err(|e| format!("invalidations: {e}"))?;
        Ok(())
    }

    fn registration(glue: &Glue, o: &Options) -> Result<(), GlueError> {
        println!(
            "\n== Registration of {} (4 KiB pages; THP not requested) ==",
            human(o.size)
        );
        let m = Mapping::anonymous(o.size, Protection::ReadWrite)?;
        let t = Instant::now();
        let id = glue.register(m.addr(), m.len(), Access::Write)?;
        let unpinned = t.elapsed();
        let t = Instant::now();
        glue.deregister(id)?;
        let dereg = t.elapsed();
        let (lean, _rx) = Glue::new(GlueConfig {
            read_smaps: false,
            ..Default::default()
        })?;
        let t = Instant::now();
        let lean_id = lean.register(m.addr(), m.len(), Access::Write)?;
        let no_smaps = t.elapsed();
        lean.deregister(lean_id)?;
        drop(lean);
        let id = glue.register(m.addr(), m.len(), Access::Write)?;
        let vmas = glue.region(id)?.vmas.len();

        let rss0 = rss();
        let t = Instant::now();
        let rep = glue.fault_in(range(m.addr(), o.touch)?, Access::Write)?;
        let touch_time = t.elapsed();
        let rss1 = rss();
        let touched_rss = rss1.saturating_sub(rss0);
        let t = Instant::now();
        let states = glue.page_states(range(m.addr(), o.touch)?)?;
        let query = t.elapsed();
        let present = states.iter().filter(|s| s.present).count();
        drop(states);
        let t = Instant::now();
        let lost = glue.scan_for_reclaim()?.len();
        let scan = t.elapsed();
        glue.deregister(id)?;
        drop(m);

        let mut pinned = None;
        let mut populated = None;
        if !o.skip_pin {
            let m = Mapping::anonymous(o.size, Protection::ReadWrite)?;
            let t = Instant::now();
            // SAFETY: locks memory this function owns.
            let rc =
                unsafe { libc::mlock(m.addr().as_u64() as *const libc::c_void, m.len() as usize) };
            let d = t.elapsed();
            if rc == 0 {
                pinned = Some(d);
                // SAFETY: as above.
                unsafe {
                    libc::munlock(m.addr().as_u64() as *const libc::c_void, m.len() as usize)
                };
            } else {
                println!("  mlock failed: errno {}", std::io::Error::last_os_error());
            }
            drop(m);
            let m = Mapping::anonymous(o.size, Protection::ReadWrite)?;
            let t = Instant::now();
            m.advise(0, m.len(), Advice::PopulateWrite)?;
            populated = Some(t.elapsed());
            drop(m);
        }

        println!("  {:<44} {:>12} {:>14}", "method", "time", "vs unpinned");
        println!(
            "  {:<44} {:>12} {:>14}",
            format!("register, unpinned ({vmas} VMA)"),
            fmt_time(unpinned),
            "1x"
        );
        println!(
            "  {:<44} {:>12} {:>14}",
            "register, unpinned, without reading smaps",
            fmt_time(no_smaps),
            ""
        );
        println!("  {:<44} {:>12} {:>14}", "deregister", fmt_time(dereg), "");
        let ratio = |d: Duration| format!("{:.0}x", d.as_secs_f64() / unpinned.as_secs_f64());
        match pinned {
            Some(d) => println!(
                "  {:<44} {:>12} {:>14}",
                "pin: mlock",
                fmt_time(d),
                ratio(d)
            ),
            None => println!("  {:<44} {:>12}", "pin: mlock", "skipped"),
        }
        match populated {
            Some(d) => println!(
                "  {:<44} {:>12} {:>14}",
                "pre-fault: MADV_POPULATE_WRITE",
                fmt_time(d),
                ratio(d)
            ),
            None => println!(
                "  {:<44} {:>12}",
                "pre-fault: MADV_POPULATE_WRITE", "skipped"
            ),
        }
        if let Some(d) = pinned {
            let x = d.as_secs_f64() / unpinned.as_secs_f64();
            println!(
                "  goal: unpinned >= 1000x faster than pinning: {:.0}x -> {}",
                x,
                if x >= 1000.0 { "met" } else { "NOT met" }
            );
        }
        println!(
            "  touch-ahead of {} of the unpinned region: {} ({} minor faults); RSS grew by {} (goal <= 1.05 GiB per GiB touched: {})",
            human(o.touch),
            fmt_time(touch_time),
            rep.minor_faults,
            human(touched_rss),
            if touched_rss as f64 <= 1.05 * o.touch as f64 {
                "met"
            } else {
                "NOT met"
            }
        );
        println!(
            "  (RSS includes the tracked-page table: 8 bytes per touched page = {})",
            human(o.touch / PAGE * 8)
        );
        println!(
            "  page_states over the touched {}: {} ({present} present); reclaim scan of the tracked pages: {} ({lost} invalidations)",
            human(o.touch),
            fmt_time(query),
            fmt_time(scan)
        );
        Ok(())
    }

    fn faults(glue: &Glue, o: &Options) -> Result<(), GlueError> {
        let r = glue.resolver();
        let n = o.samples.max(1);
        println!("\n== Fault resolution through Resolver::resolve (us per call) ==");
        println!(
            "  {:<44} {:>7} {:>9} {:>9} {:>9}   {:>8}  note",
            "case", "n", "p50", "p99", "mean", "NP-RDMA"
        );

        // Minor: first touch of anonymous memory, 4 KiB pages.
        let m = Mapping::anonymous(n * PAGE, Protection::ReadWrite)?;
        m.advise(0, m.len(), Advice::NoHugePage)?;
        let id = glue.register(m.addr(), m.len(), Access::Write)?;
        let v = resolve_all(&r, (0..n).map(|i| m.at(i * PAGE)), Access::Write)?;
        row(
            "minor, anonymous first touch (4 KiB)",
            dist(of_kind(&v, FaultKind::Minor)),
            NP_MINOR,
            "zero-fill",
        );
        // The same pages again: the no-fault path.
        let v = resolve_all(&r, (0..n).map(|i| m.at(i * PAGE)), Access::Write)?;
        row(
            "no fault: resolve, page already present",
            dist(of_kind(&v, FaultKind::AlreadyPresent)),
            "0.1-2",
            "populate + pagemap system calls",
        );
        let mut lat = Vec::new();
        let mut hits = 0;
        for i in 0..n {
            let t = Instant::now();
            hits += u64::from(r.lookup(m.at(i * PAGE)).is_some());
            lat.push(us(t.elapsed()));
        }
        row(
            "no fault: lookup in the tracked table",
            dist(lat),
            "0.1-2",
            &format!("{hits}/{n} hits; no system call"),
        );
        glue.deregister(id)?;
        drop(m);

        // Minor: first touch of THP-eligible anonymous memory (one fault maps 2 MiB).
        let blocks = (n / 64).clamp(8, 64);
        let m = Mapping::anonymous_aligned(blocks * 2 * MIB, 2 * MIB, Protection::ReadWrite)?;
        m.advise(0, m.len(), Advice::HugePage)?;
        let id = glue.register(m.addr(), m.len(), Access::Write)?;
        let mut huge = 0;
        let mut lat = Vec::new();
        for b in 0..blocks {
            let t = Instant::now();
            let res = r.resolve(m.at(b * 2 * MIB), Access::Write)?;
            lat.push(us(t.elapsed()));
            huge += u64::from(res.huge);
        }
        row(
            "minor, anonymous first touch (THP, 2 MiB)",
            dist(lat),
            NP_MINOR,
            &format!("{huge}/{blocks} huge; zeroes 2 MiB"),
        );
        glue.deregister(id)?;
        drop(m);

        // Minor: shmem page cache hit. The userfaultfd WP registration turns fault-around off
        // for shmem (uffd_disable_fault_around), so each call faults exactly one page.
        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned by the File below.
        let fd = unsafe { libc::memfd_create(c"linux-glue-bench".as_ptr(), libc::MFD_CLOEXEC) };
        if fd >= 0 {
            // SAFETY: a fresh fd owned by nobody else.
            let memfd = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            use std::io::Write;
            let mut w = &memfd;
            let chunk = vec![0x33u8; MIB as usize];
            let mut left = n * PAGE;
            while left > 0 {
                let k = left.min(MIB) as usize;
                w.write_all(&chunk[..k]).map_err(|e| GlueError::Os {
                    op: "write memfd",
                    errno: e.raw_os_error().unwrap_or(0),
                })?;
                left -= k as u64;
            }
            let m = Mapping::file(&memfd, n * PAGE, Protection::ReadWrite, true)?;
            let id = glue.register(m.addr(), m.len(), Access::Read)?;
            let monitored = !glue.region(id)?.monitored.is_empty();
            let v = resolve_all(&r, (0..n).map(|i| m.at(i * PAGE)), Access::Read)?;
            let minors = of_kind(&v, FaultKind::Minor);
            let note = format!(
                "{} faults; uffd-registered (no fault-around): {monitored}",
                minors.len()
            );
            row(
                "minor, page cache hit (shmem/memfd)",
                dist(minors),
                NP_MINOR,
                &note,
            );
            glue.deregister(id)?;
        }

        // Minor: page cache hit.
        let path =
            std::env::temp_dir().join(format!("linux-glue-bench-{}.dat", std::process::id()));
        let data = vec![0x5au8; (n * PAGE) as usize];
        std::fs::write(&path, &data).map_err(|e| GlueError::Os {
            op: "write bench file",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let f = std::fs::File::open(&path).map_err(|e| GlueError::Os {
            op: "open bench file",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let _ = std::fs::remove_file(&path);
        let m = Mapping::file(&f, n * PAGE, Protection::Read, true)?;
        let id = glue.register(m.addr(), m.len(), Access::Read)?;
        let v = resolve_all(&r, (0..n).map(|i| m.at(i * PAGE)), Access::Read)?;
        let around = of_kind(&v, FaultKind::AlreadyPresent).len();
        row(
            "minor, page cache hit (ext4 file, shared)",
            dist(of_kind(&v, FaultKind::Minor)),
            NP_MINOR,
            &format!("{around} of {n} calls found the page mapped by fault-around"),
        );
        // Major: page cache miss (file read; MADV_RANDOM disables read-ahead).
        m.advise(0, m.len(), Advice::DontNeed)?;
        m.advise(0, m.len(), Advice::Random)?;
        // SAFETY: fsync/fadvise on a file this function owns.
        unsafe {
            libc::fsync(f.as_raw_fd());
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        let v = resolve_all(&r, (0..n).map(|i| m.at(i * PAGE)), Access::Read)?;
        let majors = of_kind(&v, FaultKind::Major).len();
        row(
            "major, page cache miss (file read, virtio disk)",
            dist(of_kind(&v, FaultKind::Major)),
            NP_MAJOR,
            &format!("{majors} of {n} calls read the disk"),
        );
        glue.deregister(id)?;
        drop(m);

        if o.skip_swap {
            row(
                "major, swap-in from the swap device",
                None,
                NP_MAJOR,
                "skipped (--skip-swap)",
            );
            return Ok(());
        }
        major_swap(glue, &r, o)
    }

    fn major_swap(glue: &Glue, r: &Resolver, o: &Options) -> Result<(), GlueError> {
        let pages = o.major_pages.max(16);
        let swap_bytes = (pages * PAGE * 2).max(64 * MIB);
        let lab = match SwapLab::open(&o.swap_dir, swap_bytes, Some(0)) {
            Ok(l) => l,
            Err(e) => {
                row(
                    "major, swap-in from the swap device",
                    None,
                    NP_MAJOR,
                    &format!("skipped: {e}"),
                );
                return Ok(());
            }
        };
        let m = Mapping::anonymous(pages * PAGE, Protection::ReadWrite)?;
        m.advise(0, m.len(), Advice::NoHugePage)?;
        m.stamp_pages(0xbe7c)?;
        let id = glue.register(m.addr(), m.len(), Access::Write)?;
        let ev = swap::evict(m.range()?)?;
        let in0 = swap::vmstat("pswpin")?;
        let maj0 = swap::vmstat("pgmajfault")?;
        let v = resolve_all(r, (0..pages).map(|i| m.at(i * PAGE)), Access::Write)?;
        let pswpin = swap::vmstat("pswpin")? - in0;
        let pgmaj = swap::vmstat("pgmajfault")? - maj0;
        let majors = of_kind(&v, FaultKind::Major).len();
        let intact = (0..pages).all(|i| m.read_u64(i * PAGE).ok() == Some(0xbe7c ^ i));
        row(
            "major, swap-in from the swap device",
            dist(of_kind(&v, FaultKind::Major)),
            NP_MAJOR,
            &format!("page-cluster 0; {majors} majors, pswpin +{pswpin}, pgmajfault +{pgmaj}"),
        );
        row(
            "minor, swap-cache hit",
            dist(of_kind(&v, FaultKind::Minor)),
            NP_MINOR,
            &format!("{} pages were still in the swap cache", ev.in_swap_cache),
        );
        println!(
            "\n  swap file {} ({}), evicted {} pages in {} rounds: {} on the device, {} in swap cache, {} present; data intact: {}",
            lab.swap().path().display(),
            human(swap_bytes),
            pages,
            ev.rounds,
            ev.on_device,
            ev.in_swap_cache,
            ev.present,
            intact
        );
        if pswpin == 0 {
            println!(
                "  NOTE: pswpin did not rise: what was measured are swap-cache hits, not device reads"
            );
        }
        glue.deregister(id)?;
        drop(m);
        let file = lab.swap().path().to_path_buf();
        drop(lab);
        println!(
            "  after cleanup: swap listed {}, file exists {}, vm.page-cluster {}",
            swap::listed(&file),
            file.exists(),
            std::fs::read_to_string("/proc/sys/vm/page-cluster")
                .unwrap_or_default()
                .trim()
        );
        Ok(())
    }

    fn invalidations(
        glue: &Glue,
        events: &Receiver<Invalidate>,
        o: &Options,
    ) -> Result<(), GlueError> {
        let n = o.samples.clamp(1, 2000);
        println!("\n== Invalidation events (us per call) ==");
        println!(
            "  {:<44} {:>7} {:>9} {:>9} {:>9}",
            "case", "n", "p50", "p99", "mean"
        );
        let plain = Mapping::anonymous(n * PAGE, Protection::ReadWrite)?;
        let watched = Mapping::anonymous(n * PAGE, Protection::ReadWrite)?;
        for m in [&plain, &watched] {
            m.advise(0, m.len(), Advice::NoHugePage)?;
            m.stamp_pages(1)?;
        }
        let id = glue.register(watched.addr(), watched.len(), Access::Write)?;
        while events.try_recv().is_ok() {}
        let mut unreg = Vec::new();
        for i in 0..n {
            let t = Instant::now();
            plain.advise(i * PAGE, PAGE, Advice::DontNeed)?;
            unreg.push(us(t.elapsed()));
        }
        let mut reg = Vec::new();
        let mut delivered = Vec::new();
        for i in 0..n {
            let t = Instant::now();
            watched.advise(i * PAGE, PAGE, Advice::DontNeed)?;
            reg.push(us(t.elapsed()));
            if events.recv_timeout(Duration::from_secs(5)).is_ok() {
                delivered.push(us(t.elapsed()));
            }
        }
        let line = |name: &str, d: Option<Dist>, note: &str| match d {
            Some(d) => println!(
                "  {name:<44} {:>7} {:>9.2} {:>9.2} {:>9.2}  {note}",
                d.n, d.p50, d.p99, d.mean
            ),
            None => println!("  {name:<44} {:>7}", 0),
        };
        line("madvise(DONTNEED) 1 page, unregistered", dist(unreg), "");
        line(
            "madvise(DONTNEED) 1 page, registered",
            dist(reg),
            "the caller waits until the monitor read the event",
        );
        line(
            "from DONTNEED to Invalidate received",
            dist(delivered),
            "monitor thread -> channel",
        );
        glue.deregister(id)?;
        Ok(())
    }
}
