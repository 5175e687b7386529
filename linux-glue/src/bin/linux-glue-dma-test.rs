//! linux-glue-dma-test: the IOMMU half of nprdma.ko (ABI 3) against a real device, QEMU's
//! `edu` behind an SMMUv3 (`cargo xtask kernel-test --arch arm64` runs it as root in the arm64
//! guest with the module loaded and edu bound to it).
//!
//! ```text
//! linux-glue-dma-test                     the checks, one line each
//! linux-glue-dma-test --soak N [--mib M]  N transfers (both directions) into an M MiB
//!                                         unpinned buffer (default 256), every byte verified
//! ```
//! Lines are `NPRDMA-KMOD: PASS|FAIL|SKIP <name>: <detail>`, then `NPRDMA-KMOD: TOTAL <p>
//! passed, <f> failed, <s> skipped`; the exit status is 1 if a check failed. The soak expects
//! to run under memory pressure (the guest puts it in a cgroup whose `memory.max` is below the
//! buffer, with swap on zram) and prints the numbers it saw.

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("linux-glue-dma-test runs on Linux only");
}

#[cfg(target_os = "linux")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<u64> {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1)?.parse().ok()
    };
    let code = match value("--soak") {
        Some(n) => dt::soak(n, value("--mib").unwrap_or(256)),
        None => dt::run(),
    };
    std::process::exit(code);
}

#[cfg(target_os = "linux")]
#[path = "../guest/checks.rs"]
mod guest_checks;

#[cfg(target_os = "linux")]
mod dt {
    use super::guest_checks::{Check, Report, ensure, errno, errno_name, glue};
    use std::os::fd::RawFd;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use hal::{AlignedRange, PageSize, VirtAddr};
    use linux_glue::abi::{self, AbiHeader, AbiStruct, DmaArgs, DmaAttachArgs, RegisterArgs};
    use linux_glue::kmod::{
        DmaDirection, DmaOutcome, ModuleBackend, ModuleClient, ModuleRegion, RealModule,
    };
    use linux_glue::{Access, GlueError};

    const PAGE: usize = 4096;
    const STATS: &str = "/sys/class/misc/nprdma-glue/stats";
    /// Sends of one transfer before [`ModuleClient::dma_resend`] gives up.
    const MAX_SENDS: u32 = 16;

    type Client = ModuleClient<Arc<RealModule>>;

    fn os_errno(e: &GlueError) -> Option<i32> {
        match e {
            GlueError::Os { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    fn vmstat(name: &str) -> u64 {
        std::fs::read_to_string("/proc/vmstat")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn pins() -> (u64, u64) {
        (
            vmstat("nr_foll_pin_acquired"),
            vmstat("nr_foll_pin_released"),
        )
    }

    /// The module's counter `name` from its sysfs stats line.
    fn stat(name: &str) -> u64 {
        let text = std::fs::read_to_string(STATS).unwrap_or_default();
        let w: Vec<&str> = text.split_whitespace().collect();
        w.iter()
            .position(|x| *x == name)
            .and_then(|i| w.get(i + 1)?.parse().ok())
            .unwrap_or(0)
    }

    /// An anonymous private mapping, accessed only through copies (the device writes it while
    /// no reference to it exists on this side).
    struct Buf {
        ptr: *mut u8,
        len: usize,
    }

    impl Buf {
        fn new(len: usize) -> Result<Self, String> {
            // SAFETY: a fresh anonymous mapping; no existing memory is affected.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(format!("mmap {len}: {}", errno_name(errno())));
            }
            Ok(Self { ptr: p.cast(), len })
        }

        fn addr(&self) -> u64 {
            self.ptr as u64
        }

        fn at(&self, off: usize) -> VirtAddr {
            VirtAddr::new(self.addr() + off as u64)
        }

        fn write(&self, off: usize, data: &[u8]) {
            assert!(off + data.len() <= self.len);
            // SAFETY: in bounds (asserted) of a live read-write mapping; no Rust reference
            // to the mapping exists.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
        }

        fn read(&self, off: usize, len: usize) -> Vec<u8> {
            assert!(off + len <= self.len);
            let mut v = vec![0u8; len];
            // SAFETY: as in `write`.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), len) }
            v
        }

        fn advise(&self, off: usize, len: usize, advice: libc::c_int) -> Result<(), String> {
            // SAFETY: a page-aligned range inside our own mapping.
            let rc = unsafe { libc::madvise(self.ptr.add(off).cast(), len, advice) };
            ensure(rc == 0, || {
                format!("madvise {advice}: {}", errno_name(errno()))
            })
        }

        fn unmap_part(&self, off: usize, len: usize) -> Result<(), String> {
            // SAFETY: a page-aligned range of our own mapping; nothing refers to it.
            let rc = unsafe { libc::munmap(self.ptr.add(off).cast(), len) };
            ensure(rc == 0, || format!("munmap: {}", errno_name(errno())))
        }

        /// Maps fresh anonymous memory over `[off, off + len)` again (MAP_FIXED).
        fn remap_part(&self, off: usize, len: usize) -> Result<(), String> {
            // SAFETY: MAP_FIXED over a range of our own mapping that was unmapped before.
            let p = unsafe {
                libc::mmap(
                    self.ptr.add(off).cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            ensure(p != libc::MAP_FAILED, || {
                format!("mmap MAP_FIXED: {}", errno_name(errno()))
            })
        }
    }

    impl Drop for Buf {
        fn drop(&mut self) {
            // SAFETY: our own mapping, unmapped once.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    // SAFETY: the mapping is process memory; every access is a copy through raw pointers.
    unsafe impl Send for Buf {}
    // SAFETY: as above.
    unsafe impl Sync for Buf {}

    /// Deterministic bytes for (seed, index): xorshift64*.
    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect()
    }

    fn region(c: &Client, b: &Buf, access: Access) -> Result<ModuleRegion, String> {
        glue(
            "register",
            c.register(VirtAddr::new(b.addr()), b.len as u64, access),
        )
    }

    fn pages(start: u64, len: u64) -> AlignedRange<VirtAddr> {
        AlignedRange::new(VirtAddr::new(start), len, PageSize::Size4K).expect("aligned range")
    }

    /// A hot page through which the device's buffer is loaded and read back.
    struct Hot {
        buf: Buf,
        region: ModuleRegion,
    }

    impl Hot {
        fn new(c: &Client) -> Result<Self, String> {
            let buf = Buf::new(PAGE)?;
            let region = region(c, &buf, Access::Write)?;
            Ok(Self { buf, region })
        }

        /// The device's buffer := `data` (CPU write, then a clean transfer to the device).
        fn load(&self, c: &Client, data: &[u8]) -> Result<u32, String> {
            self.buf.write(0, data);
            let (_, resent) = glue(
                "load the device",
                c.dma_resend(
                    &self.region,
                    self.buf.at(0),
                    data.len() as u32,
                    DmaDirection::ToDevice,
                    0,
                    MAX_SENDS,
                ),
            )?;
            Ok(resent)
        }

        /// The device's buffer, read back through a clean transfer from the device.
        fn unload(&self, c: &Client, len: usize) -> Result<Vec<u8>, String> {
            glue(
                "read the device back",
                c.dma_resend(
                    &self.region,
                    self.buf.at(0),
                    len as u32,
                    DmaDirection::FromDevice,
                    0,
                    MAX_SENDS,
                ),
            )?;
            Ok(self.buf.read(0, len))
        }
    }

    fn attach(c: &Client) -> Check {
        ensure(c.features() & abi::FEATURE_DMA != 0, || {
            format!("features {:#x} lack FEATURE_DMA", c.features())
        })?;
        let d = glue("IOC_DMA_ATTACH", c.dma_attach())?;
        ensure(d.pgsize_bitmap & 0x1000 != 0, || {
            format!("domain page sizes {:#x} lack 4 KiB", d.pgsize_bitmap)
        })?;
        ensure(d.aperture_end >= (1 << 47) - 1, || {
            format!(
                "aperture ends at {:#x}: user addresses (up to 2^48) are no IOVAs",
                d.aperture_end
            )
        })?;
        let again = c.dma_attach().err().as_ref().and_then(os_errno);
        ensure(again == Some(libc::EALREADY), || {
            format!("a second attach: {again:?}, want EALREADY")
        })?;
        let other = glue("open", RealModule::open())?;
        let other = glue("handshake", ModuleClient::connect(Arc::new(other)))?;
        let busy = other.dma_attach().err().as_ref().and_then(os_errno);
        ensure(busy == Some(libc::EBUSY), || {
            format!("attach from another file: {busy:?}, want EBUSY")
        })?;
        Ok(format!(
            "module ABI {}, edu at {:04x}:{:02x}:{:02x}.{} in an unmanaged domain (page sizes {:#x}, aperture end {:#x}); again: EALREADY; from another file: EBUSY",
            abi::ABI_VERSION,
            d.pci_address >> 16,
            (d.pci_address >> 8) & 0xff,
            (d.pci_address >> 3) & 0x1f,
            d.pci_address & 7,
            d.pgsize_bitmap,
            d.aperture_end
        ))
    }

    fn round_trip(c: &Client, hot: &Hot) -> Check {
        let pins0 = pins();
        let src = Buf::new(4 * PAGE)?;
        let dst = Buf::new(4 * PAGE)?;
        let data = pattern(1, 4 * PAGE);
        src.write(0, &data);
        let rs = region(c, &src, Access::Read)?;
        let rd = region(c, &dst, Access::Write)?;
        let absent = (0..4).all(|i| rd.entry(dst.at(i * PAGE)).is_some_and(|e| !e.present()));
        ensure(absent, || {
            "the untouched buffer's table is not all absent".into()
        })?;
        // The first transfer into the untouched buffer: the module faults its pages in.
        let f = glue(
            "fault-in",
            c.fault_in(&rd, pages(dst.addr(), 4 * PAGE as u64), Access::Write),
        )?;
        let mut elapsed = Vec::new();
        let mut resent = 0;
        for (off, len) in [(0, PAGE), (100, 1000), (PAGE - 300, 600), (2 * PAGE, PAGE)] {
            let (o1, r1) = glue(
                "to the device",
                c.dma_resend(
                    &rs,
                    src.at(off),
                    len as u32,
                    DmaDirection::ToDevice,
                    0,
                    MAX_SENDS,
                ),
            )?;
            let (o2, r2) = glue(
                "from the device",
                c.dma_resend(
                    &rd,
                    dst.at(off),
                    len as u32,
                    DmaDirection::FromDevice,
                    0,
                    MAX_SENDS,
                ),
            )?;
            resent += r1 + r2;
            ensure(dst.read(off, len) == data[off..off + len], || {
                format!("bytes [{off}, +{len}) differ after the round trip")
            })?;
            ensure(o1.pages == o2.pages, || "page counts differ".into())?;
            elapsed.push(o2.elapsed_ns / 1_000_000);
        }
        let _ = hot;
        glue("unregister", c.unregister(rs))?;
        glue("unregister", c.unregister(rd))?;
        let pins1 = pins();
        ensure(pins1 == pins0, || {
            format!("nr_foll_pin_acquired/released moved: {pins0:?} -> {pins1:?}")
        })?;
        Ok(format!(
            "4 round trips (4 KiB, 1000 B unaligned, 600 B across a page boundary, 4 KiB) from a CPU-written buffer through edu into an untouched one: bytes equal; the module faulted in {} pages ({} minor faults), {} re-sends; each transfer {:?} ms (edu's 100 ms of virtual time); nr_foll_pin_acquired/released unchanged ({}/{})",
            f.pages_mapped, f.minor_faults, resent, elapsed, pins1.0, pins1.1
        ))
    }

    fn scratch_dontneed(c: &Client, hot: &Hot) -> Check {
        let b = Buf::new(2 * PAGE)?;
        let r = region(c, &b, Access::Write)?;
        let p1 = pattern(11, PAGE);
        let p2 = pattern(12, PAGE);
        hot.load(c, &p1)?;
        glue(
            "first transfer",
            c.dma_resend(
                &r,
                b.at(0),
                PAGE as u32,
                DmaDirection::FromDevice,
                0,
                MAX_SENDS,
            ),
        )?;
        ensure(b.read(0, PAGE) == p1, || {
            "first transfer: wrong bytes".into()
        })?;
        let scratched0 = stat("scratched");
        b.advise(0, PAGE, libc::MADV_DONTNEED)?;
        let v_dontneed = r.entry(b.at(0)).map(|e| (e.present(), e.version()));
        hot.load(c, &p2)?;
        // As a sender that did not check the table would: the page is absent.
        let o: DmaOutcome = glue(
            "transfer after DONTNEED",
            c.dma(&r, b.at(0), PAGE as u32, DmaDirection::FromDevice, 0),
        )?;
        ensure(o.stale && o.present_before & 1 == 0, || {
            format!("outcome {o:?}: not stale, or the page was present")
        })?;
        let cpu = b.read(0, PAGE);
        ensure(cpu.iter().all(|x| *x == 0), || {
            "the device's write reached the page the CPU now maps".into()
        })?;
        let (_, resent) = glue(
            "re-send",
            c.dma_resend(
                &r,
                b.at(0),
                PAGE as u32,
                DmaDirection::FromDevice,
                0,
                MAX_SENDS,
            ),
        )?;
        ensure(b.read(0, PAGE) == p2, || {
            "after the re-send: wrong bytes".into()
        })?;
        // The other direction: the device reads the scratch page, which still holds p2.
        b.advise(0, PAGE, libc::MADV_DONTNEED)?;
        let o2 = glue(
            "read after DONTNEED",
            c.dma(&r, b.at(0), PAGE as u32, DmaDirection::ToDevice, 0),
        )?;
        let seen = hot.unload(c, PAGE)?;
        ensure(o2.stale && seen == p2, || {
            format!(
                "outcome {o2:?}; the device read {} (want the scratch page's p2)",
                if seen.iter().all(|x| *x == 0) {
                    "zeros"
                } else {
                    "other bytes"
                }
            )
        })?;
        glue(
            "re-send",
            c.dma_resend(
                &r,
                b.at(0),
                PAGE as u32,
                DmaDirection::ToDevice,
                0,
                MAX_SENDS,
            ),
        )?;
        let seen = hot.unload(c, PAGE)?;
        ensure(seen.iter().all(|x| *x == 0), || {
            "after the re-send the device did not read the zeroed page".into()
        })?;
        glue("unregister", c.unregister(r))?;
        Ok(format!(
            "DONTNEED (entry then {v_dontneed:?}): the next transfer to memory was stale (present_before 0, versions {:?} -> {:?}), its bytes went to the scratch page (the CPU reads zeros), re-sent after fault-in ({resent} more re-sends): bytes right; a transfer from the DONTNEEDed page read the scratch page (it held the earlier write), stale, re-sent: zeros as the CPU sees; pages pointed at scratch: +{}",
            o.version_before[0],
            o.version_after[0],
            stat("scratched") - scratched0
        ))
    }

    fn scratch_munmap(c: &Client, hot: &Hot) -> Check {
        let b = Buf::new(2 * PAGE)?;
        let r = region(c, &b, Access::Write)?;
        let (off, len) = (PAGE / 2, PAGE);
        let p3 = pattern(13, PAGE);
        let p4 = pattern(14, PAGE);
        hot.load(c, &p3)?;
        glue(
            "first transfer",
            c.dma_resend(
                &r,
                b.at(off),
                len as u32,
                DmaDirection::FromDevice,
                0,
                MAX_SENDS,
            ),
        )?;
        ensure(b.read(off, len) == p3, || {
            "first transfer: wrong bytes".into()
        })?;
        b.unmap_part(PAGE, PAGE)?;
        hot.load(c, &p4)?;
        let o = glue(
            "transfer over the unmapped page",
            c.dma(&r, b.at(off), len as u32, DmaDirection::FromDevice, 0),
        )?;
        ensure(o.stale && o.pages == 2 && o.present_before == 0b01, || {
            format!("outcome {o:?}: want stale, 2 pages, only page 0 present")
        })?;
        let gone = c
            .dma_resend(
                &r,
                b.at(off),
                len as u32,
                DmaDirection::FromDevice,
                0,
                MAX_SENDS,
            )
            .err();
        ensure(gone.as_ref().is_some_and(|e| e.code() == 10), || {
            format!("re-send over the hole: {gone:?}, want region gone (10)")
        })?;
        b.remap_part(PAGE, PAGE)?;
        let (_, resent) = glue(
            "re-send after the range is mapped again",
            c.dma_resend(
                &r,
                b.at(off),
                len as u32,
                DmaDirection::FromDevice,
                0,
                MAX_SENDS,
            ),
        )?;
        ensure(b.read(off, len) == p4, || {
            "after the re-send: wrong bytes".into()
        })?;
        glue("unregister", c.unregister(r))?;
        Ok(format!(
            "munmap of page 1 under a 4 KiB transfer across pages 0-1: stale (present_before {:#b}, page 1 versions {} -> {}), re-send refused while unmapped ({}), after MAP_FIXED over it: re-sent ({resent} more), bytes right",
            o.present_before,
            o.version_before[1],
            o.version_after[1],
            gone.map(|e| e.to_string()).unwrap_or_default()
        ))
    }

    fn version_race(c: &Arc<Client>, hot: &Hot) -> Check {
        let b = Arc::new(Buf::new(PAGE)?);
        let r = region(c, &b, Access::Write)?;
        let p5 = pattern(15, PAGE);
        hot.load(c, &pattern(16, PAGE))?;
        glue(
            "fault-in",
            c.fault_in(&r, pages(b.addr(), PAGE as u64), Access::Write),
        )?;
        hot.load(c, &p5)?;
        // edu moves the bytes 100 ms (virtual) after the start; the DONTNEED comes at 30 ms.
        let b2 = Arc::clone(&b);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b2.advise(0, PAGE, libc::MADV_DONTNEED)
        });
        let o = glue(
            "transfer racing a DONTNEED",
            c.dma(&r, b.at(0), PAGE as u32, DmaDirection::FromDevice, 0),
        )?;
        t.join().map_err(|_| "the DONTNEED thread panicked")??;
        ensure(
            o.present_before & 1 == 1 && o.stale && o.version_after[0] != o.version_before[0],
            || format!("outcome {o:?}: want present at the start, then a new version"),
        )?;
        let lost = b.read(0, PAGE).iter().all(|x| *x == 0);
        let (_, resent) = glue(
            "re-send",
            c.dma_resend(
                &r,
                b.at(0),
                PAGE as u32,
                DmaDirection::FromDevice,
                0,
                MAX_SENDS,
            ),
        )?;
        ensure(b.read(0, PAGE) == p5, || {
            "after the re-send: wrong bytes".into()
        })?;
        glue("unregister", c.unregister(r))?;
        Ok(format!(
            "a DONTNEED 30 ms into a transfer (page present at its start, version {} -> {} at its completion): stale; the bytes {} the page; re-sent ({resent} more): right",
            o.version_before[0],
            o.version_after[0],
            if lost { "had missed" } else { "had reached" }
        ))
    }

    fn dma_raw(dev: &RealModule, a: &mut DmaArgs) -> Result<(), i32> {
        a.hdr = AbiHeader::for_struct::<DmaArgs>();
        dev.ioctl(abi::IOC_DMA, a.as_bytes_mut())
    }

    fn bad_input(c: &Client, dev: &RealModule, report: &mut Report) -> Result<(), String> {
        let b = Buf::new(2 * PAGE)?;
        let r = region(c, &b, Access::Write)?;
        let ro = Buf::new(PAGE)?;
        let rr = region(c, &ro, Access::Read)?;
        let base = DmaArgs {
            region_id: r.id,
            addr: b.addr(),
            len: 64,
            direction: abi::DMA_FROM_DEVICE,
            ..Default::default()
        };
        let mut case = |name: &str, mut a: DmaArgs, want: Result<u32, i32>| {
            let got = dma_raw(dev, &mut a).map(|()| a.status);
            let r = match (got, want) {
                (g, w) if g == w => Ok(match g {
                    Ok(st) => format!("status {st}"),
                    Err(e) => errno_name(e),
                }),
                (g, w) => Err(format!("got {g:?}, want {w:?}")),
            };
            report.line(&format!("dma-bad-input/{name}"), r);
        };
        case(
            "unregistered-range",
            DmaArgs {
                addr: b.addr() + 2 * PAGE as u64 - 32,
                ..base
            },
            Ok(9),
        );
        case(
            "unknown-region",
            DmaArgs {
                region_id: 999_999,
                ..base
            },
            Ok(8),
        );
        case("zero-length", DmaArgs { len: 0, ..base }, Ok(21));
        case(
            "longer-than-the-device",
            DmaArgs { len: 4097, ..base },
            Ok(21),
        );
        case(
            "past-the-device-buffer",
            DmaArgs {
                dev_offset: 4000,
                len: 200,
                ..base
            },
            Ok(21),
        );
        case(
            "bad-direction",
            DmaArgs {
                direction: 3,
                ..base
            },
            Ok(21),
        );
        case("flags", DmaArgs { flags: 1, ..base }, Ok(21));
        case(
            "write-to-a-read-region",
            DmaArgs {
                region_id: rr.id,
                addr: ro.addr(),
                ..base
            },
            Ok(5),
        );
        // A page present for reads only (the shared zero page) is never a device write target.
        glue(
            "read fault-in",
            c.fault_in(&r, pages(b.addr(), PAGE as u64), Access::Read),
        )?;
        case("write-to-a-read-only-page", base, Ok(5));
        let mut old = DmaArgs { ..base };
        old.hdr = AbiHeader {
            abi_version: 2,
            struct_size: 80,
        };
        let got = dev.ioctl(abi::IOC_DMA, old.as_bytes_mut());
        report.line(
            "dma-bad-input/abi-2-caller",
            if got == Err(libc::EPROTO) {
                Ok("EPROTO".into())
            } else {
                Err(format!("got {got:?}, want EPROTO"))
            },
        );
        // Not attached: a file of its own.
        let other = glue("open", RealModule::open())?;
        let oc = glue("handshake", ModuleClient::connect(Arc::new(other)))?;
        let ob = Buf::new(PAGE)?;
        let or = region(&oc, &ob, Access::Write)?;
        let e = oc
            .dma(&or, ob.at(0), 64, DmaDirection::FromDevice, 0)
            .err()
            .as_ref()
            .and_then(os_errno);
        report.line(
            "dma-bad-input/not-attached",
            if e == Some(libc::ENOTCONN) {
                Ok("ENOTCONN".into())
            } else {
                Err(format!("got {e:?}, want ENOTCONN"))
            },
        );
        glue("unregister", c.unregister(r))?;
        glue("unregister", c.unregister(rr))?;
        Ok(())
    }

    fn raw_ioctl<T: AbiStruct>(fd: RawFd, cmd: u32, a: &mut T) -> Result<(), i32> {
        let bytes = a.as_bytes_mut();
        // SAFETY: `bytes` is exactly the struct the command's size encodes, live and writable.
        let rc = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, bytes.as_mut_ptr()) };
        if rc < 0 { Err(errno()) } else { Ok(()) }
    }

    fn open_raw() -> Result<RawFd, String> {
        let path = c"/dev/nprdma-glue";
        // SAFETY: a NUL-terminated path; the descriptor is closed by the caller.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        ensure(fd >= 0, || format!("open: {}", errno_name(errno())))?;
        Ok(fd)
    }

    /// Attach and register `b` on a raw descriptor; returns the region id.
    fn raw_setup(fd: RawFd, b: &Buf) -> Result<u64, String> {
        let mut at = DmaAttachArgs {
            hdr: AbiHeader::for_struct::<DmaAttachArgs>(),
            ..Default::default()
        };
        raw_ioctl(fd, abi::IOC_DMA_ATTACH, &mut at)
            .map_err(|e| format!("attach: {}", errno_name(e)))?;
        let mut reg = RegisterArgs {
            hdr: AbiHeader::for_struct::<RegisterArgs>(),
            addr: b.addr(),
            len: b.len as u64,
            access: abi::ACCESS_WRITE,
            ..Default::default()
        };
        raw_ioctl(fd, abi::IOC_REGISTER, &mut reg)
            .map_err(|e| format!("register: {}", errno_name(e)))?;
        ensure(reg.status == 0, || {
            format!("register: status {}", reg.status)
        })?;
        Ok(reg.region_id)
    }

    /// A transfer is in flight when its file is closed: it completes, then the file goes.
    fn close_in_flight() -> Check {
        let fd = open_raw()?;
        let b = Arc::new(Buf::new(PAGE)?);
        let id = raw_setup(fd, &b)?;
        b.write(0, &[7u8; 64]);
        let t = std::thread::spawn(move || {
            let mut a = DmaArgs {
                hdr: AbiHeader::for_struct::<DmaArgs>(),
                region_id: id,
                addr: b.addr(),
                len: 64,
                direction: abi::DMA_TO_DEVICE,
                ..Default::default()
            };
            raw_ioctl(fd, abi::IOC_DMA, &mut a).map(|()| a)
        });
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: our own descriptor; the thread's ioctl holds the file, not the number.
        let rc = unsafe { libc::close(fd) };
        let r = t.join().map_err(|_| "the DMA thread panicked")?;
        ensure(rc == 0, || format!("close: {}", errno_name(errno())))?;
        let a = r.map_err(|e| format!("the in-flight transfer: {}", errno_name(e)))?;
        // The file is gone now: the device is free for the next owner.
        let fd2 = open_raw()?;
        let b2 = Buf::new(PAGE)?;
        let ok = raw_setup(fd2, &b2);
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd2) };
        ok?;
        Ok(format!(
            "close() returned while the transfer ran; the transfer then completed (status {}, stale {}), the file was released, and another file attached the device",
            a.status, a.stale
        ))
    }

    /// A process killed in the middle of a transfer: the ioctl ends, the module waits for the
    /// device before it unmaps anything, the device is free afterwards.
    fn kill_in_flight() -> Check {
        let stats0 = (stat("contexts"), stat("dmas"));
        // SAFETY: fork in a single-threaded process (every earlier thread was joined); the
        // child only runs this function's code and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = (|| -> Result<(), String> {
                let fd = open_raw()?;
                let b = Buf::new(PAGE)?;
                let id = raw_setup(fd, &b)?;
                let mut a = DmaArgs {
                    hdr: AbiHeader::for_struct::<DmaArgs>(),
                    region_id: id,
                    addr: b.addr(),
                    len: PAGE as u32,
                    direction: abi::DMA_FROM_DEVICE,
                    ..Default::default()
                };
                // Fault the page in for write first, so the transfer is a clean one.
                let mut f = abi::FaultInArgs {
                    hdr: AbiHeader::for_struct::<abi::FaultInArgs>(),
                    region_id: id,
                    addr: b.addr(),
                    len: PAGE as u64,
                    access: abi::ACCESS_WRITE,
                    ..Default::default()
                };
                let _ = raw_ioctl(fd, abi::IOC_FAULT_IN, &mut f);
                let _ = raw_ioctl(fd, abi::IOC_DMA, &mut a);
                Ok(())
            })();
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(i32::from(code.is_err())) };
        }
        ensure(pid > 0, || format!("fork: {}", errno_name(errno())))?;
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: our child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: waits for our child.
        let w = unsafe { libc::waitpid(pid, &mut status, 0) };
        ensure(w == pid && libc::WIFSIGNALED(status), || {
            format!("the child was not killed (status {status:#x})")
        })?;
        let t = Instant::now();
        let fd = open_raw()?;
        let b = Buf::new(PAGE)?;
        let ok = raw_setup(fd, &b);
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        ok?;
        let stats1 = (stat("contexts"), stat("dmas"));
        ensure(stats1.0 == stats0.0, || {
            format!(
                "contexts {} -> {}: the killed file leaked",
                stats0.0, stats1.0
            )
        })?;
        Ok(format!(
            "SIGKILL 50 ms into the child's transfer: the child died, its file was released after the device finished, the device attached again ({} ms later), contexts back to {}",
            t.elapsed().as_millis(),
            stats1.0
        ))
    }

    /// The checks, in an order that leaves the device free for the next one.
    pub fn run() -> i32 {
        let mut report = Report::default();
        let pins0 = pins();
        let setup = || -> Result<(Arc<RealModule>, Arc<Client>), String> {
            let dev = Arc::new(glue("open", RealModule::open())?);
            let c = glue("handshake", ModuleClient::connect(Arc::clone(&dev)))?;
            Ok((dev, Arc::new(c)))
        };
        let (dev, c) = match setup() {
            Ok(x) => x,
            Err(e) => {
                report.line("dma-setup", Err(e));
                return report.finish();
            }
        };
        let attached = attach(&c);
        let ok = attached.is_ok();
        report.line("dma-attach", attached);
        if !ok {
            return report.finish();
        }
        match Hot::new(&c) {
            Ok(hot) => {
                report.line("dma-round-trip-unpinned", round_trip(&c, &hot));
                report.line("dma-scratch-dontneed", scratch_dontneed(&c, &hot));
                report.line("dma-scratch-munmap", scratch_munmap(&c, &hot));
                report.line("dma-version-race", version_race(&c, &hot));
                if let Err(e) = bad_input(&c, &dev, &mut report) {
                    report.line("dma-bad-input", Err(e));
                }
            }
            Err(e) => report.line("dma-hot-page", Err(e)),
        }
        let stats = format!(
            "dmas {} stale {} scratched {} iommu_errors {}",
            stat("dmas"),
            stat("stale"),
            stat("scratched"),
            stat("iommu_errors")
        );
        drop(c);
        drop(dev);
        report.line("dma-close-in-flight", close_in_flight());
        report.line("dma-kill-in-flight", kill_in_flight());
        let pins1 = pins();
        report.line(
            "dma-unpinned",
            if pins1 == pins0 && stat("iommu_errors") == 0 {
                Ok(format!(
                    "nr_foll_pin_acquired/released unchanged over every transfer ({}/{}); module: {stats}",
                    pins1.0, pins1.1
                ))
            } else {
                Err(format!(
                    "pins {pins0:?} -> {pins1:?}, iommu_errors {}",
                    stat("iommu_errors")
                ))
            },
        );
        report.finish()
    }

    /// The bytes of a page last written by `writer` (cheap: the soak writes 256 MiB of them).
    fn page_bytes(writer: u64) -> Vec<u8> {
        let k = writer.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..PAGE as u64 / 8)
            .flat_map(|i| (k ^ i.wrapping_mul(0x0100_0000_01B3)).to_ne_bytes())
            .collect()
    }

    /// The swap soak: `n` transfers over a `mib` MiB unpinned buffer under memory pressure.
    /// /proc/stat's aggregate `cpu` line in seconds: user, nice, system, idle, iowait, irq,
    /// softirq (proc(5); USER_HZ = 100).
    fn cpu_times() -> Vec<f64> {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| {
                let l = t.lines().find(|l| l.starts_with("cpu "))?.to_string();
                Some(
                    l.split_whitespace()
                        .skip(1)
                        .take(7)
                        .filter_map(|v| v.parse::<f64>().ok())
                        .map(|v| v / 100.0)
                        .collect(),
                )
            })
            .unwrap_or_default()
    }

    /// Interrupts taken so far by all CPUs, per /proc/interrupts line whose name holds
    /// `what` (e.g. `arch_timer`: the guest's timer wakeups).
    fn interrupts(what: &str) -> u64 {
        std::fs::read_to_string("/proc/interrupts")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(what))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .map_while(|v| v.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }

    /// CPU seconds of the calling thread (getrusage RUSAGE_THREAD, user + system).
    fn thread_cpu_secs() -> f64 {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: a writable rusage buffer; RUSAGE_THREAD is valid on Linux.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) } != 0 {
            return f64::NAN;
        }
        // SAFETY: getrusage succeeded and initialised it (it was zeroed too).
        let u = unsafe { u.assume_init() };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(u.ru_utime) + tv(u.ru_stime)
    }

    /// CPU seconds of the kswapd threads (proc(5) /proc/PID/stat utime + stime, in ticks).
    fn kswapd_secs() -> f64 {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return f64::NAN;
        };
        dir.flatten()
            .filter(|e| {
                std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("kswapd"))
            })
            .filter_map(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                // Fields after the ")" that ends the command name: state is field 3, utime 14.
                let rest = stat.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
            })
            .sum()
    }

    pub fn soak(n: u64, mib: u64) -> i32 {
        let mut report = Report::default();
        let r = soak_inner(n, mib);
        report.line("swap-soak", r);
        report.finish()
    }

    fn soak_inner(n: u64, mib: u64) -> Check {
        let pins0 = pins();
        let (maj0, swpin0, swpout0) = (vmstat("pgmajfault"), vmstat("pswpin"), vmstat("pswpout"));
        let dev = Arc::new(glue("open", RealModule::open())?);
        let c = glue("handshake", ModuleClient::connect(Arc::clone(&dev)))?;
        glue("attach", c.dma_attach())?;
        let hot = Hot::new(&c)?;
        let len = (mib as usize) << 20;
        let big = Buf::new(len)?;
        let r = region(&c, &big, Access::Write)?;
        let npages = len / PAGE;
        // The CPU writes every page first: the working set is the whole buffer, above the
        // cgroup's memory.max, so reclaim swaps pages out from here on.
        let mut writer: Vec<u64> = (0..npages as u64).map(|p| (1 << 40) + p).collect();
        for (i, w) in writer.iter().enumerate() {
            big.write(i * PAGE, &page_bytes(*w));
        }
        let mut x: u64 = 0x243F_6A88_85A3_08D3;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut to_mem, mut from_mem, mut resent, mut corrupted, mut lost) = (0u64, 0, 0, 0, 0);
        // Paging underneath the transfers: a thread pushes a 16-page run out to swap once per
        // transfer, half the time the run under the transfer in flight, else a random one.
        // Paced by transfers, not by time: under -icount every edu DMA takes 100 ms of guest
        // time, and a pager on a 5 ms timer did 20 pageouts (zram compression, emulated) per
        // DMA, which set the soak's wall time (docs/linux-glue.md, "The swap soak's speed").
        let big = Arc::new(big);
        let (tick, ticks) = std::sync::mpsc::sync_channel::<usize>(1);
        let pager = {
            let big = Arc::clone(&big);
            std::thread::spawn(move || {
                let mut y: u64 = 0x1319_8A2E_0370_7344;
                let mut outs = 0u64;
                while let Ok(current) = ticks.recv() {
                    y ^= y << 13;
                    y ^= y >> 7;
                    y ^= y << 17;
                    let first = if y.is_multiple_of(2) {
                        current
                    } else {
                        (y >> 8) as usize % npages
                    };
                    let first = first.min(npages - 16);
                    if big
                        .advise(first * PAGE, 16 * PAGE, libc::MADV_PAGEOUT)
                        .is_ok()
                    {
                        outs += 1;
                    }
                }
                (outs, thread_cpu_secs())
            })
        };
        let started = Instant::now();
        let cpu0 = cpu_times();
        let kswapd0 = kswapd_secs();
        let (timer0, edu0) = (interrupts("arch_timer"), interrupts("nprdma-edu"));
        let main_cpu0 = thread_cpu_secs();
        let mut done = 0u64;
        while done < n {
            let page = (next() % npages as u64) as usize;
            // The pager's turn for this transfer (skipped while it is still on the last one).
            let _ = tick.try_send(page);
            if next().is_multiple_of(2) {
                // Device -> memory: load a fresh pattern, write it to the page.
                let id = done + 1;
                match hot.load(&c, &page_bytes(id)) {
                    Ok(s) => resent += u64::from(s),
                    Err(_) => lost += 1,
                }
                match c.dma_resend(
                    &r,
                    big.at(page * PAGE),
                    PAGE as u32,
                    DmaDirection::FromDevice,
                    0,
                    MAX_SENDS,
                ) {
                    Ok((_, s)) => {
                        resent += u64::from(s);
                        writer[page] = id;
                    }
                    Err(_) => lost += 1,
                }
                to_mem += 1;
            } else {
                // Memory -> device, read back through the hot page and compared.
                match c.dma_resend(
                    &r,
                    big.at(page * PAGE),
                    PAGE as u32,
                    DmaDirection::ToDevice,
                    0,
                    MAX_SENDS,
                ) {
                    Ok((_, s)) => resent += u64::from(s),
                    Err(_) => lost += 1,
                }
                match hot.unload(&c, PAGE) {
                    Ok(seen) if seen == page_bytes(writer[page]) => {}
                    Ok(_) => corrupted += 1,
                    Err(_) => lost += 1,
                }
                from_mem += 1;
            }
            done += 2;
        }
        drop(tick);
        let (pageouts, pager_cpu) = pager.join().unwrap_or((0, f64::NAN));
        let cpu1 = cpu_times();
        let kswapd1 = kswapd_secs();
        let (timer1, edu1) = (interrupts("arch_timer"), interrupts("nprdma-edu"));
        let loop_cpu = thread_cpu_secs() - main_cpu0;
        // Every byte of the buffer, through the CPU (pages swap in as it reads).
        let mut bad_pages = 0u64;
        for (i, w) in writer.iter().enumerate() {
            if big.read(i * PAGE, PAGE) != page_bytes(*w) {
                bad_pages += 1;
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let main_cpu = thread_cpu_secs() - main_cpu0;
        let pins1 = pins();
        // Where the guest's time went (under -icount, busy guest time is executed
        // instructions, which is what costs host time; idle time is skipped).
        let d =
            |i: usize| cpu1.get(i).copied().unwrap_or(0.0) - cpu0.get(i).copied().unwrap_or(0.0);
        let busy: f64 = [0, 1, 2, 4, 5, 6].iter().map(|&i| d(i)).sum();
        println!(
            "NPRDMA-KMOD: INFO soak profile: {secs:.1} s guest time, both vCPUs busy {busy:.1} s (user {:.1}, system {:.1}, irq {:.1}, softirq {:.1}, iowait {:.1}, idle {:.1}); soak main thread {main_cpu:.1} s CPU ({loop_cpu:.1} s in the transfer loop, {:.1} s in the final check), pager thread {pager_cpu:.1} s, kswapd {:.1} s; interrupts: timer {}, edu {}",
            d(0) + d(1),
            d(2),
            d(5),
            d(6),
            d(4),
            d(3),
            main_cpu - loop_cpu,
            kswapd1 - kswapd0,
            timer1 - timer0,
            edu1 - edu0
        );
        let summary = format!(
            "{done} transfers ({to_mem} pages device->memory, {from_mem} memory->device, each with its load or read-back transfer) over a {mib} MiB unpinned buffer written by the CPU first, in {secs:.1} s of guest time: {lost} lost, {corrupted} corrupted in read-backs, {bad_pages} of {npages} pages wrong at the final CPU check; {resent} re-sent after a stale completion; {pageouts} MADV_PAGEOUTs of 16 pages from another thread; major faults +{}, pswpin +{}, pswpout +{}; module stale {} scratched {}; nr_foll_pin_acquired/released {}/{} -> {}/{}",
            vmstat("pgmajfault") - maj0,
            vmstat("pswpin") - swpin0,
            vmstat("pswpout") - swpout0,
            stat("stale"),
            stat("scratched"),
            pins0.0,
            pins0.1,
            pins1.0,
            pins1.1
        );
        ensure(
            lost == 0 && corrupted == 0 && bad_pages == 0 && pins1 == pins0,
            || summary.clone(),
        )?;
        ensure(vmstat("pswpout") > swpout0, || {
            format!("no page went to swap: no pressure ({summary})")
        })?;
        Ok(summary)
    }
}
