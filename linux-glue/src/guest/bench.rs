//! The guest benchmark of `linux-glue-kmod-test --bench`: the kernel backend (nprdma.ko) next to
//! the user-space backend and the kernel's own CPU touch, one run, printed as
//! `NPRDMA-BENCH: <line>` with the goals of docs/linux-glue.md beside the figures. Nothing is
//! asserted: a figure that misses its goal is printed as such.

use std::time::Instant;

use linux_glue::kmod::{ModuleClient, RealModule};
use linux_glue::mapping::{Advice, Mapping, Protection};
use linux_glue::pagemap::PagemapEntry;
use linux_glue::{Access, Glue, GlueConfig};

const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn say(line: &str) {
    println!("NPRDMA-BENCH: {line}");
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() * 99 / 100).copied().unwrap_or(f64::NAN)
}

/// A fresh mapping of `pages` untouched 4 KiB pages with THP off (each first touch is one
/// 4 KiB minor fault).
fn fresh(pages: u64) -> Result<Mapping, String> {
    let m = Mapping::anonymous(pages * PAGE, Protection::ReadWrite).map_err(|e| e.to_string())?;
    m.advise(0, pages * PAGE, Advice::NoHugePage)
        .map_err(|e| e.to_string())?;
    Ok(m)
}

/// `field` of /proc/self/status or /proc/meminfo in KiB.
fn kib(file: &str, field: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("{file} has no {field}"))
}

/// Minor-fault resolution: module `IOC_RESOLVE`, user-space `Resolver::resolve`, CPU store.
fn minor(client: &ModuleClient<RealModule>, n: u64) -> Result<(), String> {
    let m = fresh(n)?;
    let reg = client
        .register(m.addr(), n * PAGE, Access::Write)
        .map_err(|e| e.to_string())?;
    let mut kmod = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        client
            .resolve(&reg, m.at(i * PAGE), Access::Write, false)
            .map_err(|e| e.to_string())?;
        kmod.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The same pages again, now present: the ioctl round trip and one page-table walk, no
    // fault (what the module adds around the fault itself).
    let mut present = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        client
            .resolve(&reg, m.at(i * PAGE), Access::Write, false)
            .map_err(|e| e.to_string())?;
        present.push(t.elapsed().as_secs_f64() * 1e6);
    }
    client.unregister(reg).map_err(|e| e.to_string())?;

    let u = fresh(n)?;
    let (glue, _rx) = Glue::new(GlueConfig::default()).map_err(|e| e.to_string())?;
    glue.register(u.addr(), n * PAGE, Access::Write)
        .map_err(|e| e.to_string())?;
    let resolver = glue.resolver();
    let mut user = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        resolver
            .resolve(u.at(i * PAGE), Access::Write)
            .map_err(|e| e.to_string())?;
        user.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(glue);

    let c = fresh(n)?;
    let mut cpu = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        c.write_u64(i * PAGE, i + 1).map_err(|e| e.to_string())?;
        cpu.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (k50, k99) = (p50(&mut kmod), p99(&mut kmod));
    let (u50, u99) = (p50(&mut user), p99(&mut user));
    let (c50, c99) = (p50(&mut cpu), p99(&mut cpu));
    let (q50, q99) = (p50(&mut present), p99(&mut present));
    say(&format!(
        "minor fault, {n} first touches of 4 KiB pages (us p50/p99): module resolve {k50:.2}/{k99:.2} | user-space resolve {u50:.2}/{u99:.2} | CPU store {c50:.2}/{c99:.2} | module resolve of the same pages present (ioctl and walk, no fault) {q50:.2}/{q99:.2}; goal: module p50 <= 3 us ({})",
        if k50 <= 3.0 { "met" } else { "missed" }
    ));
    Ok(())
}

/// Registrations timed per case: the first (cold: under TCG it also pays the translation of
/// the code it runs for the first time) and the median of all.
const REG_SAMPLES: usize = 5;

/// Registers and unregisters `[m, m + len)` [`REG_SAMPLES`] times: (first, median) of the
/// registrations and the median of the unregistrations, in seconds.
fn time_registrations(
    client: &ModuleClient<RealModule>,
    m: &Mapping,
    len: u64,
) -> Result<(f64, f64, f64), String> {
    let (mut reg, mut unreg) = (Vec::new(), Vec::new());
    for _ in 0..REG_SAMPLES {
        let t = Instant::now();
        let r = client
            .register(m.addr(), len, Access::Write)
            .map_err(|e| e.to_string())?;
        reg.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        client.unregister(r).map_err(|e| e.to_string())?;
        unreg.push(t.elapsed().as_secs_f64());
    }
    let first = reg[0];
    Ok((first, p50(&mut reg), p50(&mut unreg)))
}

/// Registration of a large untouched region and of a smaller one in use, vs mlock (of
/// `scale` untouched, scaled to the large size, and of the same memory in use).
fn registration(
    client: &ModuleClient<RealModule>,
    big: u64,
    used: u64,
    scale: u64,
) -> Result<(), String> {
    let m = fresh(big / PAGE)?;
    let (first_big, reg_big, unreg_big) = time_registrations(client, &m, big)?;
    drop(m);

    let u = fresh(used / PAGE)?;
    u.advise(0, used, Advice::PopulateWrite)
        .map_err(|e| e.to_string())?;
    let (first_used, reg_used, unreg_used) = time_registrations(client, &u, used)?;
    // mlock of the same memory, in use (it walks and locks every present page).
    let t = Instant::now();
    mlock(&u, used)?;
    let mlock_used = t.elapsed().as_secs_f64();
    drop(u);

    // mlock of `scale` untouched (it faults in and locks every page), scaled to `big`: the
    // guest cannot hold `big`.
    let l = fresh(scale / PAGE)?;
    let t = Instant::now();
    mlock(&l, scale)?;
    let mlock_fresh = t.elapsed().as_secs_f64();
    drop(l);
    let mlock_big = mlock_fresh * (big as f64 / scale as f64);
    let r_big = mlock_big / reg_big;
    let r_used = mlock_used / reg_used;
    let verdict = |r: f64| if r >= 1000.0 { "met" } else { "missed" };
    say(&format!(
        "registration: module, {} GiB untouched {:.1} us (median of {REG_SAMPLES}; first {:.1} us; unregister {:.1} us) vs mlock {:.1} ms (measured on {} MiB untouched, {:.1} ms, scaled by size: the guest cannot hold {} GiB) = {:.0}x; goal >= 1000x ({})",
        big / GIB,
        reg_big * 1e6,
        first_big * 1e6,
        unreg_big * 1e6,
        mlock_big * 1e3,
        scale / MIB,
        mlock_fresh * 1e3,
        big / GIB,
        r_big,
        verdict(r_big)
    ));
    say(&format!(
        "registration: module, {} MiB in use {:.1} us (median of {REG_SAMPLES}; first {:.1} us = {:.0}x; unregister {:.1} us) vs mlock of the same {} MiB in use {:.1} ms = {:.0}x; goal >= 1000x ({})",
        used / MIB,
        reg_used * 1e6,
        first_used * 1e6,
        mlock_used / first_used,
        unreg_used * 1e6,
        used / MIB,
        mlock_used * 1e3,
        r_used,
        verdict(r_used)
    ));
    Ok(())
}

fn mlock(m: &Mapping, len: u64) -> Result<(), String> {
    // SAFETY: mlock/munlock of a live mapping this function borrows; no memory is accessed.
    let rc = unsafe { libc::mlock(m.addr().as_u64() as *const libc::c_void, len as usize) };
    if rc != 0 {
        return Err(format!("mlock: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    unsafe { libc::munlock(m.addr().as_u64() as *const libc::c_void, len as usize) };
    Ok(())
}

/// Resident memory after registering `big` with the module and touching `touch` of it.
fn resident(client: &ModuleClient<RealModule>, big: u64, touch: u64) -> Result<(), String> {
    let rss0 = kib("/proc/self/status", "VmRSS")?;
    let vm0 = kib("/proc/meminfo", "VmallocUsed")?;
    let tables0 = table_pages()?;
    let m = fresh(big / PAGE)?;
    let reg = client
        .register(m.addr(), big, Access::Write)
        .map_err(|e| e.to_string())?;
    let rep = client
        .fault_in(
            &reg,
            hal::AlignedRange::new(m.addr(), touch, hal::PageSize::Size4K)
                .map_err(|e| e.to_string())?,
            Access::Write,
        )
        .map_err(|e| e.to_string())?;
    let rss1 = kib("/proc/self/status", "VmRSS")?;
    let vm1 = kib("/proc/meminfo", "VmallocUsed")?;
    let tables1 = table_pages()?;
    client.unregister(reg).map_err(|e| e.to_string())?;
    let grew = (rss1.saturating_sub(rss0)) as f64 / 1024.0;
    let vmalloc = (vm1.saturating_sub(vm0)) as f64 / 1024.0;
    let table = (tables1.saturating_sub(tables0) * PAGE) as f64 / MIB as f64;
    let dense = (big / PAGE * 8) as f64 / MIB as f64;
    let touched = touch as f64 / MIB as f64;
    let goal = touched * 1.05;
    // The table's pages count once: in the module's table_pages and, where user space maps
    // them, in RSS as well; the sum below may count them twice (an upper bound).
    let total = grew + table + vmalloc;
    say(&format!(
        "resident: {} GiB registered with the module, {touched:.0} MiB touched ({} pages faulted in): process RSS +{grew:.1} MiB, module page-state table {table:.2} MiB (sparse; a dense one would be {dense:.0} MiB), module vmalloc +{vmalloc:.1} MiB; sum {total:.1} MiB; goal <= 1.05 x touched = {goal:.0} MiB, scaled from 1.05 GiB per 1 GiB ({})",
        big / GIB,
        rep.pages_mapped,
        if total <= goal { "met" } else { "missed" }
    ));
    Ok(())
}

/// The first active swap device of /proc/swaps, if any.
fn swap_device() -> Option<String> {
    let text = std::fs::read_to_string("/proc/swaps").ok()?;
    text.lines()
        .nth(1)?
        .split_whitespace()
        .next()
        .map(str::to_string)
}

/// 64 bits of an xorshift sequence: page contents zram cannot store as a repeated word.
fn noise(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Swap-in: `n` pages paged out with MADV_PAGEOUT, each brought back by a module resolve (a
/// major fault), against an O_DIRECT 4 KiB read of the same swap slots on the swap device.
fn swap_in(client: &ModuleClient<RealModule>, n: u64) -> Result<(), String> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};

    let Some(dev) = swap_device() else {
        say("swap-in: not measured: no swap device in this guest");
        return Ok(());
    };
    let m = fresh(n)?;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for off in (0..n * PAGE).step_by(8) {
        m.write_u64(off, noise(&mut x)).map_err(|e| e.to_string())?;
    }
    let reg = client
        .register(m.addr(), n * PAGE, Access::Write)
        .map_err(|e| e.to_string())?;
    m.advise(0, n * PAGE, Advice::PageOut)
        .map_err(|e| e.to_string())?;
    // Where each page went: pagemap's swap offset (bits 5-54 of a swap entry).
    let pagemap = std::fs::File::open("/proc/self/pagemap").map_err(|e| e.to_string())?;
    let mut slots = Vec::new();
    for i in 0..n {
        let mut b = [0u8; 8];
        pagemap
            .read_exact_at(&mut b, m.at(i * PAGE).as_u64() / PAGE * 8)
            .map_err(|e| format!("pagemap: {e}"))?;
        if let Some(slot) = PagemapEntry(u64::from_ne_bytes(b)).swap_offset() {
            slots.push((i, slot));
        }
    }
    if slots.len() < (n / 2) as usize {
        say(&format!(
            "swap-in: not measured: MADV_PAGEOUT put only {} of {n} pages on {dev}",
            slots.len()
        ));
        return client.unregister(reg).map_err(|e| e.to_string());
    }
    // The device: the same slots read directly (O_DIRECT: no page cache), into a page-aligned
    // buffer.
    let disk = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&dev)
        .map_err(|e| format!("{dev}: {e}"))?;
    let buf = Mapping::anonymous(PAGE, Protection::ReadWrite).map_err(|e| e.to_string())?;
    // SAFETY: the 4 KiB buffer is a private anonymous mapping `buf` owns for this function;
    // nothing else refers to it while this slice lives.
    let page = unsafe { std::slice::from_raw_parts_mut(buf.addr().as_u64() as *mut u8, 4096) };
    let mut device = Vec::new();
    for &(_, slot) in &slots {
        let t = Instant::now();
        disk.read_exact_at(page, slot * PAGE)
            .map_err(|e| format!("{dev}: {e}"))?;
        device.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The module: each page back by a resolve (do_swap_page reads the slot).
    let (mut module, mut majors) = (Vec::new(), 0);
    for &(i, _) in &slots {
        let t = Instant::now();
        let r = client
            .resolve(&reg, m.at(i * PAGE), Access::Read, false)
            .map_err(|e| e.to_string())?;
        module.push(t.elapsed().as_secs_f64() * 1e6);
        if r.kind == Some(linux_glue::FaultKind::Major) {
            majors += 1;
        }
    }
    client.unregister(reg).map_err(|e| e.to_string())?;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut bad = 0;
    for off in (0..n * PAGE).step_by(8) {
        if m.read_u64(off).map_err(|e| e.to_string())? != noise(&mut x) {
            bad += 1;
        }
    }
    // The kernel's own swap-in: the same pages paged out again, each read back by a CPU load.
    m.advise(0, n * PAGE, Advice::PageOut)
        .map_err(|e| e.to_string())?;
    let mut cpu = Vec::new();
    for &(i, _) in &slots {
        let t = Instant::now();
        m.read_u64(i * PAGE).map_err(|e| e.to_string())?;
        cpu.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (m50, m99) = (p50(&mut module), p99(&mut module));
    let (d50, d99) = (p50(&mut device), p99(&mut device));
    let (c50, c99) = (p50(&mut cpu), p99(&mut cpu));
    say(&format!(
        "swap-in, {} of {n} pages paged out to {dev} (MADV_PAGEOUT, page-cluster 0) (us p50/p99): module resolve {m50:.2}/{m99:.2} ({majors} major faults) | O_DIRECT 4 KiB read of the same slots on {dev} {d50:.2}/{d99:.2} | CPU load of the pages paged out again {c50:.2}/{c99:.2}; module - device p50 = {:.2} us; data {}; goal: module p50 <= device p50 + 5 us ({})",
        slots.len(),
        m50 - d50,
        if bad == 0 {
            "intact".to_string()
        } else {
            format!("{bad} words WRONG")
        },
        if m50 <= d50 + 5.0 { "met" } else { "missed" }
    ));
    Ok(())
}

/// Pages of page-state tables the module holds now (its sysfs stats).
fn table_pages() -> Result<u64, String> {
    const STATS: &str = "/sys/class/misc/nprdma-glue/stats";
    let text = std::fs::read_to_string(STATS).map_err(|e| format!("{STATS}: {e}"))?;
    text.split_whitespace()
        .skip_while(|w| *w != "table_pages")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{STATS}: no table_pages in `{}`", text.trim()))
}

/// Runs the benchmarks; `quick` for CI. Returns the exit status (1 if one could not run).
pub fn run(quick: bool) -> i32 {
    let client = match RealModule::open().and_then(ModuleClient::connect) {
        Ok(c) => c,
        Err(e) => {
            say(&format!("cannot run: {e}"));
            return 1;
        }
    };
    let started = Instant::now();
    let n = if quick { 1000 } else { 10_000 };
    let mut status = 0;
    let results = [
        ("minor fault", minor(&client, n)),
        (
            "registration",
            registration(&client, 16 * GIB, GIB, 64 * MIB),
        ),
        ("resident", resident(&client, 16 * GIB, 256 * MIB)),
        ("swap-in", swap_in(&client, if quick { 256 } else { 4096 })),
    ];
    for (name, r) in results {
        if let Err(e) = r {
            say(&format!("{name}: could not run: {e}"));
            status = 1;
        }
    }
    say(&format!(
        "took {:.1} s (guest time)",
        started.elapsed().as_secs_f64()
    ));
    status
}
