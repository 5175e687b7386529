//! Registered regions: the IOVA ranges a stream may fault in.

use hal::Iova;

use super::StreamId;
use crate::{Result, SmmuError};

/// An IOVA range of one stream that the memory manager backs. Faults inside it may be
/// resolved; faults outside every region never are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegisteredRegion {
    /// The stream that may access it.
    pub stream: StreamId,
    /// First IOVA.
    pub start: Iova,
    /// Length in bytes (non-zero).
    pub len: u64,
    /// Whether the stream may write (else read-only).
    pub writable: bool,
}

impl RegisteredRegion {
    /// Whether `iova` lies in the region.
    pub fn contains(&self, iova: Iova) -> bool {
        iova.as_u64()
            .checked_sub(self.start.as_u64())
            .is_some_and(|off| off < self.len)
    }

    /// Whether `[start, start + len)` lies entirely in the region.
    pub fn contains_range(&self, start: Iova, len: u64) -> bool {
        let Some(off) = start.as_u64().checked_sub(self.start.as_u64()) else {
            return false;
        };
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    fn overlaps(&self, other: &RegisteredRegion) -> bool {
        let a_end = self.start.as_u64().saturating_add(self.len);
        let b_end = other.start.as_u64().saturating_add(other.len);
        self.stream == other.stream && self.start.as_u64() < b_end && other.start.as_u64() < a_end
    }
}

/// A fixed-capacity set of non-overlapping regions (per stream), for resolvers to embed.
#[derive(Clone, Debug)]
pub struct RegionSet<const N: usize> {
    regions: heapless::Vec<RegisteredRegion, N>,
}

impl<const N: usize> Default for RegionSet<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> RegionSet<N> {
    /// An empty set.
    pub const fn new() -> Self {
        Self {
            regions: heapless::Vec::new(),
        }
    }

    /// Adds a region; fails if it is empty, wraps, overlaps a region of the same stream, or
    /// the set is full.
    pub fn register(&mut self, region: RegisteredRegion) -> Result<()> {
        if region.len == 0 || region.start.as_u64().checked_add(region.len).is_none() {
            return Err(SmmuError::InvalidConfig {
                what: "region must be non-empty and must not wrap",
            });
        }
        if self.iter().any(|r| r.overlaps(&region)) {
            return Err(SmmuError::RegionOverlap {
                stream: region.stream.0,
                start: region.start,
                len: region.len,
            });
        }
        self.regions
            .push(region)
            .map_err(|_| SmmuError::RegionCapacity { capacity: N })
    }

    /// Removes the region of `stream` starting at `start`; returns it if it was there.
    pub fn unregister(&mut self, stream: StreamId, start: Iova) -> Option<RegisteredRegion> {
        let index = self
            .regions
            .iter()
            .position(|r| r.stream == stream && r.start == start)?;
        Some(self.regions.swap_remove(index))
    }

    /// The region of `stream` containing `iova`.
    pub fn find(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        self.iter()
            .find(|r| r.stream == stream && r.contains(iova))
            .copied()
    }

    /// Every region.
    pub fn iter(&self) -> impl Iterator<Item = &RegisteredRegion> + '_ {
        self.regions.iter()
    }
}
