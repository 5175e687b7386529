//! An in-process stand-in for the kernel module, for testing the user-space half.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hal::VirtAddr;

use super::{
    HeapBlock, ModuleBackend, RECORD_WORDS, RING_CONSUMER, RING_DROPPED, RING_HEADER_WORDS,
    RING_PRODUCER, SharedMemory, TABLE_GENERATION, TABLE_HEADER_WORDS,
};
use crate::abi::{
    self, ABI_VERSION, AbiStruct, FaultInArgs, InvalidationRecord, PageStateEntry, RegisterArgs,
    ResolveArgs, RingSetupArgs, UnregisterArgs, VersionArgs,
};
use crate::sys::{self, PAGE, PAGE_SHIFT};
use crate::{GlueError, Result};

/// The frame the fake gives page 0 (see [`FakeModule`]'s resolve).
pub const FAKE_PFN_BASE: u64 = 0x10_0000;

/// One region as the fake module sees it.
#[derive(Debug)]
struct FakeRegion {
    start: u64,
    pages: u64,
    access: u32,
    table: Arc<HeapBlock>,
}

#[derive(Debug, Default)]
struct FakeState {
    next_id: u64,
    next_offset: u64,
    regions: BTreeMap<u64, FakeRegion>,
    blocks: HashMap<u64, Arc<HeapBlock>>,
    ring: Option<(Arc<HeapBlock>, u32)>,
    seq: u64,
    huge: Vec<(u64, u64)>,
    swapped: Vec<(u64, u64)>,
}

/// An in-process stand-in for the kernel module, for testing the user-space half.
///
/// Memory is modelled, not real: pages become present when faulted in through the ABI and
/// absent when the test calls [`FakeModule::invalidate`] (the MMU-notifier path). Pages inside
/// [`FakeModule::back_with_huge_pages`] fault in as 2 MiB blocks; pages passed to
/// [`FakeModule::swap_out`] cost a major fault on their next fault-in.
#[derive(Debug)]
pub struct FakeModule {
    version: u32,
    state: Mutex<FakeState>,
}

impl Default for FakeModule {
    fn default() -> Self {
        Self::new()
    }
}

fn header_word(version: u32, size: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&version.to_ne_bytes());
    b[4..].copy_from_slice(&(size as u32).to_ne_bytes());
    u64::from_ne_bytes(b)
}

impl FakeModule {
    /// A fake speaking [`ABI_VERSION`].
    pub fn new() -> Self {
        Self::with_version(ABI_VERSION)
    }

    /// A fake speaking `version` (to test the mismatch path).
    pub fn with_version(version: u32) -> Self {
        Self {
            version,
            state: Mutex::new(FakeState {
                next_offset: 0x10000,
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes faults in `[start, start + len)` map whole 2 MiB blocks (a THP-backed range).
    pub fn back_with_huge_pages(&self, start: VirtAddr, len: u64) {
        self.lock()
            .huge
            .push((start.as_u64(), start.as_u64().saturating_add(len)));
    }

    /// Models reclaim to swap: invalidates the pages (cause SWAPPED_OUT) and makes their next
    /// fault-in a major fault.
    pub fn swap_out(&self, start: VirtAddr, len: u64) -> usize {
        self.lock()
            .swapped
            .push((start.as_u64(), start.as_u64().saturating_add(len)));
        self.invalidate(start, len, abi::cause::SWAPPED_OUT, 0)
    }

    /// The MMU-notifier path: for every registered region overlapping the range, clears the
    /// present bits and bumps the versions of the pages, bumps the generation and publishes one
    /// ring record (or counts it as dropped when the ring is full). Returns records published.
    pub fn invalidate(&self, start: VirtAddr, len: u64, cause: u32, new_start: u64) -> usize {
        let mut st = self.lock();
        let (s, e) = (start.as_u64(), start.as_u64().saturating_add(len));
        let mut records = Vec::new();
        for (&id, r) in &st.regions {
            let (rs, re) = (r.start, r.start + r.pages * PAGE);
            let (cs, ce) = (s.max(rs), e.min(re));
            if cs >= ce {
                continue;
            }
            for i in (cs - rs) >> PAGE_SHIFT..(ce - rs) >> PAGE_SHIFT {
                let w = &r.table.0[TABLE_HEADER_WORDS + i as usize];
                let old = PageStateEntry(w.load(Ordering::Relaxed));
                w.store(
                    PageStateEntry::new(false, false, false, old.version().wrapping_add(1)).0,
                    Ordering::Release,
                );
            }
            r.table.0[TABLE_GENERATION].fetch_add(1, Ordering::AcqRel);
            records.push(InvalidationRecord {
                region_id: id,
                start: cs,
                len: ce - cs,
                cause,
                new_start: if cause == abi::cause::REMAPPED {
                    new_start.wrapping_add(cs - s)
                } else {
                    0
                },
                ..Default::default()
            });
        }
        let mut published = 0;
        if let Some((ring, entries)) = st.ring.clone() {
            for mut rec in records {
                let producer = ring.0[RING_PRODUCER].load(Ordering::Relaxed);
                let consumer = ring.0[RING_CONSUMER].load(Ordering::Acquire);
                if producer.wrapping_sub(consumer) >= entries as u64 {
                    ring.0[RING_DROPPED].fetch_add(1, Ordering::AcqRel);
                    continue;
                }
                rec.seq = st.seq;
                st.seq += 1;
                let base = RING_HEADER_WORDS + (producer % entries as u64) as usize * RECORD_WORDS;
                for (i, chunk) in rec.as_bytes_mut().chunks_exact(8).enumerate() {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(chunk);
                    ring.0[base + i].store(u64::from_ne_bytes(w), Ordering::Relaxed);
                }
                ring.0[RING_PRODUCER].store(producer + 1, Ordering::Release);
                published += 1;
            }
        }
        published
    }

    fn alloc_offset(st: &mut FakeState, block: Arc<HeapBlock>) -> u64 {
        let off = st.next_offset;
        let bytes = (block.0.len() as u64 * 8).next_multiple_of(PAGE);
        st.next_offset += bytes.max(PAGE);
        st.blocks.insert(off, block);
        off
    }

    /// Checks the header and size of an argument and decodes it. `Err(errno)` as the module would.
    fn decode<T: AbiStruct>(&self, arg: &[u8], check_version: bool) -> Result<T, i32> {
        let hdr = T::header(arg).ok_or(libc::EINVAL)?;
        if arg.len() != size_of::<T>() || hdr.struct_size as usize != size_of::<T>() {
            return Err(libc::EINVAL);
        }
        if check_version && hdr.abi_version != self.version {
            return Err(libc::EPROTO);
        }
        T::from_bytes(arg).ok_or(libc::EINVAL)
    }

    fn encode<T: AbiStruct>(mut v: T, arg: &mut [u8]) {
        arg.copy_from_slice(v.as_bytes_mut());
    }

    fn do_register(&self, a: &mut RegisterArgs) {
        let mut st = self.lock();
        let (start, len) = (a.addr, a.len);
        a.status = if len == 0 {
            3
        } else if start % PAGE != 0 || len % PAGE != 0 {
            1
        } else if start.checked_add(len).is_none() {
            2
        } else if a.access != abi::ACCESS_READ && a.access != abi::ACCESS_WRITE {
            21
        } else if let Some((&id, _)) = st
            .regions
            .iter()
            .find(|(_, r)| start < r.start + r.pages * PAGE && r.start < start + len)
        {
            a.region_id = id;
            7
        } else {
            0
        };
        if a.status != 0 {
            return;
        }
        let pages = len / PAGE;
        let table = HeapBlock::new(TABLE_HEADER_WORDS + pages as usize);
        st.next_id += 1;
        let id = st.next_id;
        table.0[0].store(
            header_word(self.version, size_of::<abi::TableHeader>()),
            Ordering::Relaxed,
        );
        table.0[1].store(id, Ordering::Relaxed);
        table.0[2].store(pages, Ordering::Relaxed);
        let off = Self::alloc_offset(&mut st, Arc::clone(&table));
        st.regions.insert(
            id,
            FakeRegion {
                start,
                pages,
                access: a.access,
                table,
            },
        );
        a.region_id = id;
        a.table_offset = off;
        a.table_entries = pages;
    }

    /// The status of a fault-in or resolve of `[addr, addr + len)` in region `r`.
    fn range_status(r: &FakeRegion, addr: u64, len: u64, access: u32, flags: u32) -> u32 {
        let (rs, re) = (r.start, r.start + r.pages * PAGE);
        match addr.checked_add(len) {
            _ if len == 0 => 3,
            _ if !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) => 1,
            None => 2,
            _ if (access != abi::ACCESS_READ && access != abi::ACCESS_WRITE)
                || flags & !abi::FAULT_IN_QUERY_ONLY != 0 =>
            {
                21
            }
            Some(e) if addr < rs || e > re => 9,
            _ if access == abi::ACCESS_WRITE && r.access == abi::ACCESS_READ => 5,
            _ => 0,
        }
    }

    /// Faults in page `p` of region `r` (if it is absent, or not writable for a write):
    /// minor, or major when it was swapped out. Returns what happened and the page's entry.
    fn fault_page(
        r: &FakeRegion,
        swapped: &mut Vec<(u64, u64)>,
        huge: &[(u64, u64)],
        p: u64,
        write: bool,
        query: bool,
    ) -> (u32, PageStateEntry) {
        let (rs, re) = (r.start, r.start + r.pages * PAGE);
        let i = ((p - rs) >> PAGE_SHIFT) as usize;
        let w = &r.table.0[TABLE_HEADER_WORDS + i];
        let old = PageStateEntry(w.load(Ordering::Relaxed));
        if old.present() && (!write || old.writable()) {
            return (abi::kind::PRESENT, old);
        }
        if query {
            return (abi::kind::ABSENT, old);
        }
        let block = p & !(sys::HUGE_2M - 1);
        let in_huge = block >= rs
            && block + sys::HUGE_2M <= re
            && huge
                .iter()
                .any(|&(s, e)| s <= block && block + sys::HUGE_2M <= e);
        let kind = if let Some(pos) = swapped.iter().position(|&(s, e)| s <= p && p < e) {
            let (s, e) = swapped[pos];
            // Only this page comes back; the rest of the range stays swapped.
            swapped.remove(pos);
            if s < p {
                swapped.push((s, p));
            }
            if p + PAGE < e {
                swapped.push((p + PAGE, e));
            }
            abi::kind::MAJOR
        } else {
            abi::kind::MINOR
        };
        let new = PageStateEntry::new(
            true,
            write || old.writable(),
            in_huge,
            old.version().wrapping_add(1),
        );
        w.store(new.0, Ordering::Release);
        (kind, new)
    }

    fn do_fault_in(&self, a: &mut FaultInArgs) {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(r) = st.regions.get(&a.region_id) else {
            a.status = 8;
            return;
        };
        a.status = Self::range_status(r, a.addr, a.len, a.access, a.flags);
        if a.status != 0 {
            return;
        }
        let write = a.access == abi::ACCESS_WRITE;
        let query = a.flags & abi::FAULT_IN_QUERY_ONLY != 0;
        let (mut minor, mut major, mut mapped) = (0u32, 0u32, 0u64);
        let mut blocks = std::collections::BTreeSet::new();
        let mut p = a.addr;
        while p < a.addr + a.len {
            let (kind, entry) = Self::fault_page(r, &mut st.swapped, &st.huge, p, write, query);
            match kind {
                abi::kind::MINOR => minor += 1,
                abi::kind::MAJOR => major += 1,
                _ => {}
            }
            if entry.huge() {
                blocks.insert(p & !(sys::HUGE_2M - 1));
            }
            if entry.present() {
                mapped += 1;
            }
            p += PAGE;
        }
        a.pages_mapped = mapped;
        a.minor_faults = minor;
        a.major_faults = major;
        a.huge_blocks = blocks.len() as u32;
    }

    /// Frames are modelled: page `p` is frame `FAKE_PFN_BASE + p / 4 KiB`, so a 2 MiB block's
    /// frames are contiguous and 2 MiB aligned, as a THP's are.
    fn do_resolve(&self, a: &mut ResolveArgs) {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(r) = st.regions.get(&a.region_id) else {
            a.status = 8;
            return;
        };
        a.status = Self::range_status(r, a.addr, PAGE, a.access, a.flags);
        if a.status != 0 {
            return;
        }
        let write = a.access == abi::ACCESS_WRITE;
        let query = a.flags & abi::FAULT_IN_QUERY_ONLY != 0;
        let (kind, entry) = Self::fault_page(r, &mut st.swapped, &st.huge, a.addr, write, query);
        a.kind = kind;
        a.version = entry.version();
        if kind == abi::kind::ABSENT {
            return;
        }
        let (start, order) = if entry.huge() {
            (a.addr & !(sys::HUGE_2M - 1), 9)
        } else {
            (a.addr, 0)
        };
        a.mapping_start = start;
        a.order = order;
        a.pfn = FAKE_PFN_BASE + (start >> PAGE_SHIFT);
    }

    fn do_ring_setup(&self, a: &mut RingSetupArgs) {
        let mut st = self.lock();
        if !a.entries.is_power_of_two() || a.entries > 1 << 16 {
            a.status = 21;
            return;
        }
        let words = RING_HEADER_WORDS + a.entries as usize * RECORD_WORDS;
        let ring = HeapBlock::new(words);
        ring.0[0].store(
            header_word(self.version, size_of::<abi::RingHeader>()),
            Ordering::Relaxed,
        );
        ring.0[1].store(
            header_word(a.entries, size_of::<InvalidationRecord>()),
            Ordering::Relaxed,
        );
        a.ring_offset = Self::alloc_offset(&mut st, Arc::clone(&ring));
        a.ring_bytes = (words * 8) as u64;
        st.ring = Some((ring, a.entries));
    }
}

impl ModuleBackend for FakeModule {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        match cmd {
            abi::IOC_VERSION => {
                let mut v: VersionArgs = self.decode(arg, false)?;
                v.module_version = self.version;
                v.features =
                    abi::FEATURE_HUGE | abi::FEATURE_RING | abi::FEATURE_RESOLVE | abi::FEATURE_DMA;
                Self::encode(v, arg);
            }
            abi::IOC_REGISTER => {
                let mut a: RegisterArgs = self.decode(arg, true)?;
                self.do_register(&mut a);
                Self::encode(a, arg);
            }
            abi::IOC_UNREGISTER => {
                let mut a: UnregisterArgs = self.decode(arg, true)?;
                let mut st = self.lock();
                match st.regions.remove(&a.region_id) {
                    Some(r) => st.blocks.retain(|_, b| !Arc::ptr_eq(b, &r.table)),
                    None => a.status = 8,
                }
                drop(st);
                Self::encode(a, arg);
            }
            abi::IOC_FAULT_IN => {
                let mut a: FaultInArgs = self.decode(arg, true)?;
                self.do_fault_in(&mut a);
                Self::encode(a, arg);
            }
            abi::IOC_RESOLVE => {
                let mut a: ResolveArgs = self.decode(arg, true)?;
                self.do_resolve(&mut a);
                Self::encode(a, arg);
            }
            abi::IOC_RING_SETUP => {
                let mut a: RingSetupArgs = self.decode(arg, true)?;
                self.do_ring_setup(&mut a);
                Self::encode(a, arg);
            }
            // The fake has the ioctls but no device behind them, as the module on a machine
            // without one: ENODEV after the usual checks.
            abi::IOC_DMA_ATTACH => {
                let _: abi::DmaAttachArgs = self.decode(arg, true)?;
                return Err(libc::ENODEV);
            }
            abi::IOC_DMA => {
                let _: abi::DmaArgs = self.decode(arg, true)?;
                return Err(libc::ENODEV);
            }
            _ => return Err(libc::ENOTTY),
        }
        Ok(())
    }

    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        let st = self.lock();
        let block = st.blocks.get(&offset).ok_or(GlueError::InvalidArgument {
            what: "unknown mmap offset",
        })?;
        if len > block.0.len() as u64 * 8 {
            return Err(GlueError::InvalidArgument {
                what: "mmap length beyond the module object",
            });
        }
        Ok(SharedMemory::heap(Arc::clone(block)))
    }
}
