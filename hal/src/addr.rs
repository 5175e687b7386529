//! Address newtypes with checked arithmetic (after rust-vmm's `vm-memory`).
//!
//! Three address spaces meet in this project and must never be mixed up:
//! [`PhysAddr`] (what the memory system decodes), [`VirtAddr`] (what a CPU or process uses)
//! and [`Iova`] (what a DMA master emits before the SMMU translates it). Arithmetic is checked:
//! overflow and misalignment are typed errors, never wrap-around.

use core::fmt;

use crate::{HalError, Result};

/// Translation granule and block sizes of the VMSAv8-64 4 KiB granule (Arm ARM D8.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageSize {
    /// 4 KiB page (level-3 descriptor).
    Size4K,
    /// 2 MiB block (level-2 descriptor).
    Size2M,
    /// 1 GiB block (level-1 descriptor).
    Size1G,
}

impl PageSize {
    /// All sizes, smallest first.
    pub const ALL: [PageSize; 3] = [PageSize::Size4K, PageSize::Size2M, PageSize::Size1G];

    /// Size in bytes.
    pub const fn bytes(self) -> u64 {
        1 << self.shift()
    }

    /// log2 of the size.
    pub const fn shift(self) -> u32 {
        match self {
            PageSize::Size4K => 12,
            PageSize::Size2M => 21,
            PageSize::Size1G => 30,
        }
    }

    /// The page size of exactly `bytes` bytes, if there is one.
    pub const fn from_bytes(bytes: u64) -> Option<PageSize> {
        match bytes {
            0x1000 => Some(PageSize::Size4K),
            0x20_0000 => Some(PageSize::Size2M),
            0x4000_0000 => Some(PageSize::Size1G),
            _ => None,
        }
    }
}

/// Operations shared by the address newtypes.
pub trait Address: Copy + Ord + fmt::Debug {
    /// Wraps a raw value.
    fn from_raw(raw: u64) -> Self;
    /// The raw value.
    fn raw(self) -> u64;
}

macro_rules! address_type {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(u64);

        impl $name {
            /// The address zero.
            pub const ZERO: Self = Self(0);

            /// Wraps a raw address.
            pub const fn new(raw: u64) -> Self {
                Self(raw)
            }

            /// The raw address.
            pub const fn as_u64(self) -> u64 {
                self.0
            }

            /// `self + offset`, or an error on overflow.
            pub const fn checked_add(self, offset: u64) -> Result<Self> {
                match self.0.checked_add(offset) {
                    Some(v) => Ok(Self(v)),
                    None => Err(HalError::AddressOverflow { base: self.0, offset }),
                }
            }

            /// `self - offset`, or an error on underflow.
            pub const fn checked_sub(self, offset: u64) -> Result<Self> {
                match self.0.checked_sub(offset) {
                    Some(v) => Ok(Self(v)),
                    None => Err(HalError::AddressOverflow { base: self.0, offset: offset.wrapping_neg() }),
                }
            }

            /// Distance from `base` up to `self`, or an error if `self` lies below `base`.
            pub const fn offset_from(self, base: Self) -> Result<u64> {
                match self.0.checked_sub(base.0) {
                    Some(v) => Ok(v),
                    None => Err(HalError::AddressOverflow { base: base.0, offset: self.0.wrapping_sub(base.0) }),
                }
            }

            /// Whether the address is a multiple of `page`.
            pub const fn is_aligned(self, page: PageSize) -> bool {
                self.0 & (page.bytes() - 1) == 0
            }

            /// Fails with [`HalError::Misaligned`] unless the address is a multiple of `page`.
            pub const fn require_aligned(self, page: PageSize) -> Result<Self> {
                if self.is_aligned(page) {
                    Ok(self)
                } else {
                    Err(HalError::Misaligned { value: self.0, align: page.bytes() })
                }
            }

            /// Rounds down to a multiple of `page`.
            pub const fn align_down(self, page: PageSize) -> Self {
                Self(self.0 & !(page.bytes() - 1))
            }

            /// Rounds up to a multiple of `page`, or an error on overflow.
            pub const fn align_up(self, page: PageSize) -> Result<Self> {
                let mask = page.bytes() - 1;
                match self.0.checked_add(mask) {
                    Some(v) => Ok(Self(v & !mask)),
                    None => Err(HalError::AddressOverflow { base: self.0, offset: mask }),
                }
            }

            /// Offset of the address within its `page`.
            pub const fn page_offset(self, page: PageSize) -> u64 {
                self.0 & (page.bytes() - 1)
            }
        }

        impl Address for $name {
            fn from_raw(raw: u64) -> Self {
                Self(raw)
            }
            fn raw(self) -> u64 {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }

        #[cfg(feature = "defmt")]
        impl defmt::Format for $name {
            fn format(&self, f: defmt::Formatter) {
                defmt::write!(f, "{:#x}", self.0)
            }
        }
    };
}

address_type!(
    /// An address in the physical address space (what DRAM and MMIO decode).
    PhysAddr,
    "PhysAddr"
);
address_type!(
    /// A CPU (or process) virtual address.
    VirtAddr,
    "VirtAddr"
);
address_type!(
    /// An IO virtual address: what a DMA master emits and an SMMU translates.
    Iova,
    "Iova"
);

/// A non-empty range `[start, start + len)` whose start and length are multiples of a page
/// size, and whose end does not overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AlignedRange<A> {
    start: A,
    len: u64,
    page: PageSize,
}

impl<A: Address> AlignedRange<A> {
    /// Validates and builds a range.
    pub fn new(start: A, len: u64, page: PageSize) -> Result<Self> {
        let align = page.bytes();
        if len == 0 {
            return Err(HalError::EmptyRange);
        }
        if start.raw() & (align - 1) != 0 {
            return Err(HalError::Misaligned {
                value: start.raw(),
                align,
            });
        }
        if len & (align - 1) != 0 {
            return Err(HalError::Misaligned { value: len, align });
        }
        // The last byte must be addressable; `start + len` itself may be 2^64 only if we allowed
        // it, which we do not, so that `end()` is always representable.
        start
            .raw()
            .checked_add(len)
            .ok_or(HalError::AddressOverflow {
                base: start.raw(),
                offset: len,
            })?;
        Ok(Self { start, len, page })
    }

    /// The smallest aligned range that covers `[addr, addr + len)`.
    pub fn covering(addr: A, len: u64, page: PageSize) -> Result<Self> {
        if len == 0 {
            return Err(HalError::EmptyRange);
        }
        let mask = page.bytes() - 1;
        let end = addr
            .raw()
            .checked_add(len)
            .and_then(|e| e.checked_add(mask))
            .ok_or(HalError::AddressOverflow {
                base: addr.raw(),
                offset: len,
            })?
            & !mask;
        let start = addr.raw() & !mask;
        Self::new(A::from_raw(start), end - start, page)
    }

    /// First address.
    pub fn start(&self) -> A {
        self.start
    }

    /// One past the last address.
    pub fn end(&self) -> A {
        // Cannot overflow: checked in `new`.
        A::from_raw(self.start.raw() + self.len)
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: ranges are never empty. Present for API symmetry with collections.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The page size the range is aligned to.
    pub fn page_size(&self) -> PageSize {
        self.page
    }

    /// Number of pages in the range.
    pub fn page_count(&self) -> u64 {
        self.len >> self.page.shift()
    }

    /// Whether `addr` lies in the range.
    pub fn contains(&self, addr: A) -> bool {
        addr.raw() >= self.start.raw() && addr.raw() - self.start.raw() < self.len
    }

    /// Whether the two ranges share at least one byte.
    pub fn overlaps(&self, other: &Self) -> bool {
        self.start.raw() < other.end().raw() && other.start.raw() < self.end().raw()
    }

    /// The start address of every page in the range.
    pub fn pages(&self) -> impl Iterator<Item = A> + '_ {
        let step = self.page.bytes();
        (0..self.page_count()).map(move |i| A::from_raw(self.start.raw() + i * step))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn add_overflow_is_an_error() {
        let a = PhysAddr::new(u64::MAX - 1);
        assert_eq!(a.checked_add(1), Ok(PhysAddr::new(u64::MAX)));
        assert_eq!(
            a.checked_add(2),
            Err(HalError::AddressOverflow {
                base: u64::MAX - 1,
                offset: 2
            })
        );
        assert!(Iova::new(5).checked_sub(6).is_err());
        assert_eq!(
            VirtAddr::new(0x2000).offset_from(VirtAddr::new(0x1000)),
            Ok(0x1000)
        );
        assert!(
            VirtAddr::new(0x1000)
                .offset_from(VirtAddr::new(0x2000))
                .is_err()
        );
    }

    #[test]
    fn alignment() {
        let a = Iova::new(0x20_1234);
        assert!(!a.is_aligned(PageSize::Size4K));
        assert_eq!(a.align_down(PageSize::Size4K), Iova::new(0x20_1000));
        assert_eq!(a.align_up(PageSize::Size4K), Ok(Iova::new(0x20_2000)));
        assert_eq!(a.align_down(PageSize::Size2M), Iova::new(0x20_0000));
        assert_eq!(a.page_offset(PageSize::Size4K), 0x234);
        assert_eq!(
            a.require_aligned(PageSize::Size4K),
            Err(HalError::Misaligned {
                value: 0x20_1234,
                align: 0x1000
            })
        );
        assert!(Iova::new(u64::MAX).align_up(PageSize::Size4K).is_err());
        assert_eq!(PageSize::from_bytes(0x20_0000), Some(PageSize::Size2M));
        assert_eq!(PageSize::from_bytes(0x3000), None);
    }

    #[test]
    fn range_validation() {
        let r = AlignedRange::new(PhysAddr::new(0x4000_0000), 0x3000, PageSize::Size4K).unwrap();
        assert_eq!(r.end(), PhysAddr::new(0x4000_3000));
        assert_eq!(r.page_count(), 3);
        assert_eq!(r.pages().collect::<Vec<_>>().len(), 3);
        assert!(r.contains(PhysAddr::new(0x4000_2fff)));
        assert!(!r.contains(PhysAddr::new(0x4000_3000)));
        assert_eq!(
            AlignedRange::new(PhysAddr::new(0x1001), 0x1000, PageSize::Size4K),
            Err(HalError::Misaligned {
                value: 0x1001,
                align: 0x1000
            })
        );
        assert_eq!(
            AlignedRange::new(PhysAddr::new(0x1000), 0x800, PageSize::Size4K),
            Err(HalError::Misaligned {
                value: 0x800,
                align: 0x1000
            })
        );
        assert_eq!(
            AlignedRange::new(PhysAddr::new(0), 0, PageSize::Size4K),
            Err(HalError::EmptyRange)
        );
        assert!(matches!(
            AlignedRange::new(
                PhysAddr::new(0xffff_ffff_ffff_f000),
                0x1000,
                PageSize::Size4K
            ),
            Err(HalError::AddressOverflow { .. })
        ));
        let c = AlignedRange::covering(Iova::new(0x1ffe), 4, PageSize::Size4K).unwrap();
        assert_eq!((c.start(), c.len()), (Iova::new(0x1000), 0x2000));
        assert!(AlignedRange::covering(Iova::new(u64::MAX - 2), 2, PageSize::Size4K).is_err());
    }

    proptest! {
        #[test]
        fn covering_contains_every_byte(addr in 0u64..(1 << 48), len in 1u64..(1 << 24)) {
            let r = AlignedRange::covering(Iova::new(addr), len, PageSize::Size4K).unwrap();
            prop_assert!(r.contains(Iova::new(addr)));
            prop_assert!(r.contains(Iova::new(addr + len - 1)));
            prop_assert!(r.len() < len + 2 * 0x1000);
        }

        #[test]
        fn align_roundtrip(addr in any::<u64>()) {
            let a = PhysAddr::new(addr);
            let down = a.align_down(PageSize::Size2M);
            prop_assert!(down.is_aligned(PageSize::Size2M));
            prop_assert!(down <= a);
            match a.align_up(PageSize::Size2M) {
                Ok(up) => { prop_assert!(up >= a); prop_assert!(up.as_u64() - down.as_u64() <= PageSize::Size2M.bytes()); }
                Err(_) => prop_assert!(addr > u64::MAX - (PageSize::Size2M.bytes() - 1)),
            }
        }
    }
}
