//! The process's mappings (VMAs): enumeration without touching any page.
//!
//! Two sources, both O(VMAs in the range):
//! - the `PROCMAP_QUERY` ioctl on /proc/self/maps (Linux 6.11+, include/uapi/linux/fs.h
//!   `struct procmap_query`), which looks a VMA up by address;
//! - the text of /proc/self/maps (proc(5)), read only up to the end of the range.
//!
//! Properties the maps line does not carry (VmFlags such as `hg`/`nh`/`lo`/`io`/`pf`,
//! `THPeligible`, `KernelPageSize`) come from /proc/self/smaps, also read only up to the end
//! of the range. Producing an smaps entry makes the kernel walk that VMA's page tables to sum
//! RSS, so its cost grows with the *populated* page tables of the VMAs listed before the range
//! end, not with the size of the range; [`crate::GlueConfig::read_smaps`] turns it off.

use std::fs::File;
use std::io::{BufRead, BufReader};

use hal::{PageSize, VirtAddr};

use crate::sys::{self, IOC_READ, IOC_WRITE, ioc};
use crate::{GlueError, Result};

/// What backs a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory (including `[heap]`, `[stack]` and `[anon:name]`).
    Anonymous,
    /// Shared anonymous memory, memfd or SysV shm (shmem/tmpfs).
    Shmem,
    /// A regular file.
    File,
    /// A special mapping (vDSO, vvar, vsyscall, uprobes) or a PFNMAP/IO mapping.
    Special,
}

/// One VMA and its properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaInfo {
    /// First address.
    pub start: VirtAddr,
    /// One past the last address.
    pub end: VirtAddr,
    /// PROT_READ.
    pub readable: bool,
    /// PROT_WRITE.
    pub writable: bool,
    /// PROT_EXEC.
    pub executable: bool,
    /// MAP_SHARED.
    pub shared: bool,
    /// Offset into the file in bytes (0 for anonymous memory), as `/proc/self/maps` and
    /// `PROCMAP_QUERY` give it.
    pub offset: u64,
    /// Inode of the backing file (0 for anonymous memory).
    pub inode: u64,
    /// The path or pseudo-name (`[heap]`, `/dev/zero (deleted)`, ...), if any.
    pub name: Option<String>,
    /// What backs it.
    pub backing: Backing,
    /// The page size the kernel uses for it (`KernelPageSize`; 4 KiB unless hugetlbfs).
    pub page_size: PageSize,
    /// `THPeligible` from smaps: whether transparent huge pages may back it. `None` if smaps
    /// was not read.
    pub thp_eligible: Option<bool>,
    /// The two-letter VmFlags from smaps (`rd wr mr mw me ac hg ...`). `None` if smaps was not
    /// read.
    pub vm_flags: Option<Vec<[u8; 2]>>,
}

impl VmaInfo {
    /// Whether the VmFlags contain `flag` (e.g. `b"hg"`). `None` if they are unknown.
    pub fn has_flag(&self, flag: &[u8; 2]) -> Option<bool> {
        self.vm_flags.as_ref().map(|f| f.iter().any(|x| x == flag))
    }

    /// Whether the VMA is locked (`mlock`, VmFlags `lo`).
    pub fn locked(&self) -> Option<bool> {
        self.has_flag(b"lo")
    }

    /// Whether hugetlb pages back it (its page size is above 4 KiB: a hugetlbfs file or
    /// `MAP_HUGETLB` memory, which /proc/self/maps shows as a file, `/anon_hugepage`).
    /// Userfaultfd can watch it like anonymous memory.
    pub fn hugetlb(&self) -> bool {
        self.page_size != PageSize::Size4K
    }
}

fn classify(inode: u64, name: Option<&str>) -> Backing {
    match name {
        Some(n) if n.starts_with('[') => {
            if n == "[heap]" || n.starts_with("[stack") || n.starts_with("[anon:") {
                Backing::Anonymous
            } else if n.starts_with("[anon_shmem:") {
                Backing::Shmem
            } else {
                Backing::Special
            }
        }
        Some(n)
            if n.starts_with("/dev/zero")
                || n.starts_with("/SYSV")
                || n.starts_with("/memfd:")
                || n.starts_with("/dev/shm/") =>
        {
            Backing::Shmem
        }
        Some(_) if inode != 0 => Backing::File,
        Some(_) => Backing::Special,
        None if inode != 0 => Backing::File,
        None => Backing::Anonymous,
    }
}

fn hex(field: &str, what: &'static str) -> Result<u64> {
    u64::from_str_radix(field, 16).map_err(|_| GlueError::Malformed {
        what,
        detail: format!("bad hex field {field:?}"),
    })
}

/// Parses one line of /proc/self/maps (proc(5): `start-end perms offset dev inode [path]`).
pub fn parse_maps_line(line: &str) -> Result<VmaInfo> {
    const WHAT: &str = "maps line";
    let bad = |d: &str| GlueError::Malformed {
        what: WHAT,
        detail: format!("{d}: {line:?}"),
    };
    let mut rest = line;
    let mut field = || -> Result<&str> {
        let t = rest.trim_start();
        let end = t.find(char::is_whitespace).unwrap_or(t.len());
        let (f, r) = t.split_at(end);
        rest = r;
        if f.is_empty() {
            Err(bad("missing field"))
        } else {
            Ok(f)
        }
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let _dev = field()?;
    let inode = field()?;
    let name = rest.trim();
    let (s, e) = range
        .split_once('-')
        .ok_or_else(|| bad("range without '-'"))?;
    let start = hex(s, WHAT)?;
    let end = hex(e, WHAT)?;
    if end <= start || start % sys::PAGE != 0 || end % sys::PAGE != 0 {
        return Err(bad("range not page aligned or empty"));
    }
    let p = perms.as_bytes();
    if p.len() != 4 {
        return Err(bad("perms not 4 characters"));
    }
    let inode: u64 = inode.parse().map_err(|_| bad("bad inode"))?;
    let name = if name.is_empty() {
        None
    } else {
        Some(name.to_string())
    };
    let backing = classify(inode, name.as_deref());
    Ok(VmaInfo {
        start: VirtAddr::new(start),
        end: VirtAddr::new(end),
        readable: p[0] == b'r',
        writable: p[1] == b'w',
        executable: p[2] == b'x',
        shared: p[3] == b's',
        offset: hex(offset, WHAT)?,
        inode,
        name,
        backing,
        page_size: PageSize::Size4K,
        thp_eligible: None,
        vm_flags: None,
    })
}

/// Whether an smaps line is a VMA header (its first field is `hex-hex`).
fn is_header(line: &str) -> bool {
    let first = line.split_whitespace().next().unwrap_or("");
    match first.split_once('-') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// Applies one smaps attribute line (`Key: value`) to `vma`.
fn apply_smaps_line(vma: &mut VmaInfo, line: &str) {
    if let Some(v) = line.strip_prefix("THPeligible:") {
        vma.thp_eligible = Some(v.trim() == "1");
    } else if let Some(v) = line.strip_prefix("VmFlags:") {
        let flags = v
            .split_whitespace()
            .filter_map(|f| {
                let b = f.as_bytes();
                (b.len() == 2).then(|| [b[0], b[1]])
            })
            .collect::<Vec<_>>();
        if flags.iter().any(|f| f == b"io" || f == b"pf") {
            vma.backing = Backing::Special;
        }
        vma.vm_flags = Some(flags);
    } else if let Some(v) = line.strip_prefix("KernelPageSize:") {
        let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(4);
        if let Some(ps) = PageSize::from_bytes(kb * 1024) {
            vma.page_size = ps;
        }
    }
}

/// Parses smaps text covering `[start, end)` into VMAs with their smaps properties.
pub fn parse_smaps(reader: impl BufRead, start: u64, end: u64) -> Result<Vec<VmaInfo>> {
    let mut out: Vec<VmaInfo> = Vec::new();
    let mut current: Option<VmaInfo> = None;
    for line in reader.lines() {
        let line = line.map_err(|e| GlueError::Malformed {
            what: "smaps",
            detail: e.to_string(),
        })?;
        if is_header(&line) {
            if let Some(v) = current.take() {
                out.push(v);
            }
            let v = parse_maps_line(&line)?;
            if v.start.as_u64() >= end {
                break;
            }
            if v.end.as_u64() > start {
                current = Some(v);
            }
        } else if let Some(v) = current.as_mut() {
            apply_smaps_line(v, &line);
        }
    }
    if let Some(v) = current.take() {
        out.push(v);
    }
    Ok(out)
}

/// Clips each VMA to `[start, end)`.
///
/// Do this before [`apply_smaps`]: the parts outside the range belong to neighbours that other
/// threads may map or unmap at any moment, while the range itself is the caller's.
pub fn clip(vmas: &mut [VmaInfo], start: u64, end: u64) {
    for v in vmas.iter_mut() {
        v.start = VirtAddr::new(v.start.as_u64().max(start));
        v.end = VirtAddr::new(v.end.as_u64().min(end));
    }
}

/// Copies the smaps-only properties (THP eligibility, VmFlags, page size, special mappings) from
/// a separate smaps read onto clipped VMAs.
///
/// Matches by containment of the clipped start: a neighbour mapped or unmapped between the two
/// reads may have merged into (or split from) a VMA, moving its unclipped start either way.
pub fn apply_smaps(vmas: &mut [VmaInfo], smaps: &[VmaInfo]) {
    for v in vmas.iter_mut() {
        if let Some(s) = smaps.iter().find(|s| s.start <= v.start && v.start < s.end) {
            v.thp_eligible = s.thp_eligible;
            v.vm_flags = s.vm_flags.clone();
            v.page_size = s.page_size;
            if s.backing == Backing::Special {
                v.backing = Backing::Special;
            }
        }
    }
}

/// Reads /proc/self/maps up to `end` and returns the VMAs overlapping `[start, end)`.
pub fn maps_in_range(start: u64, end: u64) -> Result<Vec<VmaInfo>> {
    let f = File::open("/proc/self/maps").map_err(|e| GlueError::Unavailable {
        feature: "/proc/self/maps",
        why: e.to_string(),
    })?;
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line.map_err(|e| GlueError::Malformed {
            what: "maps",
            detail: e.to_string(),
        })?;
        let v = parse_maps_line(&line)?;
        if v.start.as_u64() >= end {
            break;
        }
        if v.end.as_u64() > start {
            out.push(v);
        }
    }
    Ok(out)
}

/// Reads /proc/self/smaps up to `end` and returns the VMAs overlapping `[start, end)`.
pub fn smaps_in_range(start: u64, end: u64) -> Result<Vec<VmaInfo>> {
    let f = File::open("/proc/self/smaps").map_err(|e| GlueError::Unavailable {
        feature: "/proc/self/smaps",
        why: e.to_string(),
    })?;
    parse_smaps(BufReader::new(f), start, end)
}

/// `struct procmap_query` (include/uapi/linux/fs.h, Linux 6.11+).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}
const _: () = assert!(size_of::<ProcmapQuery>() == 104);

const PROCMAP_QUERY_VMA_READABLE: u64 = 0x01;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;
const PROCMAP_QUERY_VMA_EXECUTABLE: u64 = 0x04;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;
/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
pub(crate) const PROCMAP_QUERY: u32 =
    ioc(IOC_READ | IOC_WRITE, b'f', 17, size_of::<ProcmapQuery>());

/// Looks up the VMA covering `addr`, or the next one above it, with PROCMAP_QUERY on an open
/// /proc/self/maps. `Ok(None)`: no VMA at or above `addr`. `Err(errno)`: the ioctl failed
/// (ENOTTY on kernels before 6.11).
pub(crate) fn procmap_query(maps: &File, addr: u64) -> Result<Option<VmaInfo>, i32> {
    let mut name = vec![0u8; 4096];
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
        query_addr: addr,
        vma_name_size: name.len() as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: PROCMAP_QUERY takes a `ProcmapQuery`; the only buffer it writes through is
    // `name`, live and `vma_name_size` bytes long for the call (the build-ID buffer is absent).
    match unsafe { sys::ioctl_ptr(maps, PROCMAP_QUERY, &mut q) } {
        Ok(_) => {}
        Err(e) if e == libc::ENOENT => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = (q.vma_name_size as usize).min(name.len());
    // The kernel writes a NUL-terminated string and counts the NUL in vma_name_size.
    let text = &name[..len];
    let text = text.split(|&c| c == 0).next().unwrap_or(&[]);
    let vma_name = if text.is_empty() {
        None
    } else {
        Some(String::from_utf8_lossy(text).into_owned())
    };
    let backing = classify(q.inode, vma_name.as_deref());
    Ok(Some(VmaInfo {
        start: VirtAddr::new(q.vma_start),
        end: VirtAddr::new(q.vma_end),
        readable: q.vma_flags & PROCMAP_QUERY_VMA_READABLE != 0,
        writable: q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE != 0,
        executable: q.vma_flags & PROCMAP_QUERY_VMA_EXECUTABLE != 0,
        shared: q.vma_flags & PROCMAP_QUERY_VMA_SHARED != 0,
        offset: q.vma_offset,
        inode: q.inode,
        name: vma_name,
        backing,
        page_size: PageSize::from_bytes(q.vma_page_size).unwrap_or(PageSize::Size4K),
        thp_eligible: None,
        vm_flags: None,
    }))
}

/// The VMAs overlapping `[start, end)` via PROCMAP_QUERY: one ioctl per VMA.
pub(crate) fn query_in_range(maps: &File, start: u64, end: u64) -> Result<Vec<VmaInfo>, i32> {
    let mut out = Vec::new();
    let mut cur = start;
    while cur < end {
        match procmap_query(maps, cur)? {
            Some(v) if v.start.as_u64() < end => {
                cur = v.end.as_u64();
                out.push(v);
            }
            _ => break,
        }
    }
    Ok(out)
}

/// Transparent huge page mode from /sys/kernel/mm/transparent_hugepage/enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpMode {
    /// THP for every eligible anonymous VMA.
    Always,
    /// THP only where MADV_HUGEPAGE was given.
    Madvise,
    /// THP off.
    Never,
    /// The file is missing or unreadable.
    Unknown,
}

/// Reads the system THP mode.
pub fn thp_mode() -> ThpMode {
    match std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") {
        Ok(s) if s.contains("[always]") => ThpMode::Always,
        Ok(s) if s.contains("[madvise]") => ThpMode::Madvise,
        Ok(s) if s.contains("[never]") => ThpMode::Never,
        _ => ThpMode::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_properties_survive_a_neighbour_merging_or_splitting_between_reads() {
        let vma = |a: u64, b: u64| {
            let mut v = parse_maps_line(&format!("{a:x}-{b:x} rw-p 00000000 00:00 0")).unwrap();
            v.vm_flags = None;
            v
        };
        let with_flags = |mut v: VmaInfo, flags: &[&[u8; 2]]| {
            v.vm_flags = Some(flags.iter().map(|f| **f).collect());
            v.thp_eligible = Some(true);
            v
        };
        let (start, end) = (0x10_0000, 0x10_6000);
        // The first read saw the range's first VMA merged with a neighbour below it; the
        // neighbour was unmapped before smaps was read, so smaps starts at the range.
        let mut vmas = vec![vma(0xf_e000, 0x10_2000), vma(0x10_2000, 0x10_6000)];
        let smaps = vec![
            with_flags(vma(0x10_0000, 0x10_2000), &[b"rd", b"wr"]),
            with_flags(vma(0x10_2000, 0x10_8000), &[b"rd", b"wr", b"nh"]),
        ];
        clip(&mut vmas, start, end);
        apply_smaps(&mut vmas, &smaps);
        assert_eq!(vmas[0].start.as_u64(), start);
        assert_eq!(vmas[0].has_flag(b"nh"), Some(false));
        assert_eq!(vmas[1].end.as_u64(), end);
        assert_eq!(vmas[1].has_flag(b"nh"), Some(true));
        assert_eq!(vmas[1].thp_eligible, Some(true));

        // The reverse: a neighbour merged in between the reads, so smaps starts lower.
        let mut vmas = vec![vma(0x10_0000, 0x10_6000)];
        let smaps = vec![with_flags(vma(0xf_0000, 0x10_6000), &[b"hg"])];
        clip(&mut vmas, start, end);
        apply_smaps(&mut vmas, &smaps);
        assert_eq!(vmas[0].has_flag(b"hg"), Some(true));
    }

    #[test]
    fn maps_lines_parse_per_proc5() {
        let v = parse_maps_line("7f2c1c000000-7f2c1c021000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(v.start.as_u64(), 0x7f2c_1c00_0000);
        assert_eq!(v.end.as_u64(), 0x7f2c_1c02_1000);
        assert!(v.readable && v.writable && !v.executable && !v.shared);
        assert_eq!(v.backing, Backing::Anonymous);
        assert_eq!(v.name, None);

        let v = parse_maps_line(
            "55d0c0a00000-55d0c0a21000 r-xp 00002000 fe:01 1234567   /usr/bin/my prog",
        )
        .unwrap();
        assert_eq!(v.backing, Backing::File);
        assert_eq!(v.offset, 0x2000);
        assert_eq!(v.inode, 1_234_567);
        assert_eq!(v.name.as_deref(), Some("/usr/bin/my prog"));
        assert!(v.executable && !v.writable);

        let v = parse_maps_line("7ffd1000-7ffd3000 r-xp 00000000 00:00 0   [vdso]").unwrap();
        assert_eq!(v.backing, Backing::Special);
        let v = parse_maps_line(
            "7f0000000000-7f0000100000 rw-s 00000000 00:01 77   /dev/zero (deleted)",
        )
        .unwrap();
        assert_eq!(v.backing, Backing::Shmem);
        assert!(v.shared);
        let v = parse_maps_line("01000000-01021000 rw-p 00000000 00:00 0   [heap]").unwrap();
        assert_eq!(v.backing, Backing::Anonymous);
    }

    #[test]
    fn malformed_maps_lines_are_typed_errors() {
        for bad in [
            "",
            "zz-10 rw-p 0 00:00 0",
            "1000-2000 rw-p",
            "2000-1000 rw-p 0 00:00 0",
            "1001-2000 rw-p 0 00:00 0",
            "1000-2000 rw 0 00:00 0",
            "1000-2000 rw-p 0 00:00 x",
        ] {
            assert!(
                matches!(parse_maps_line(bad), Err(GlueError::Malformed { .. })),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn smaps_blocks_carry_thp_and_vmflags() {
        let text = "\
1000-3000 rw-p 00000000 00:00 0
Size:                  8 kB
KernelPageSize:        4 kB
THPeligible:    0
VmFlags: rd wr mr mw me ac nh
400000-800000 rw-p 00000000 00:00 0
Size:               4096 kB
THPeligible:    1
VmFlags: rd wr mr mw me ac hg
900000-a00000 rw-s 00000000 00:05 99  /dev/mem
VmFlags: rd wr sh mr mw me ms io pf
b00000-c00000 rw-p 00000000 00:00 0
THPeligible:    1
";
        let v = parse_smaps(text.as_bytes(), 0x2000, 0xa00000).unwrap();
        assert_eq!(v.len(), 3, "the block starting at 0xb00000 is past the end");
        assert_eq!(v[0].thp_eligible, Some(false));
        assert_eq!(v[0].has_flag(b"nh"), Some(true));
        assert_eq!(v[1].thp_eligible, Some(true));
        assert_eq!(v[1].has_flag(b"hg"), Some(true));
        assert_eq!(v[1].locked(), Some(false));
        assert_eq!(v[2].backing, Backing::Special, "io/pf mappings are special");
    }

    #[test]
    fn procmap_query_number() {
        // _IOWR('f', 17, 104 bytes) = 3<<30 | 104<<16 | 0x66<<8 | 17.
        assert_eq!(PROCMAP_QUERY, 0xC068_6611);
    }
}
