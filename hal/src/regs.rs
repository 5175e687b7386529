//! The register seam.
//!
//! Drivers describe *fields* with tock-registers' `register_bitfields!` and *blocks* with
//! [`register_block!`](crate::register_block). A block is a view of a [`RegisterBus`] at a base
//! offset; each accessor returns a [`Register`] proxy that implements tock-registers'
//! `Readable`/`Writeable` traits, so the whole typed-field API (`read`, `write`, `modify`,
//! `is_set`, ...) is available, but every access is a call into the bus.
//!
//! On silicon the bus is an [`MmioBus`] (volatile loads and stores). On the host it is a device
//! model (see `hal::model` with the `std` feature, and the `sim` crate) that sees every read,
//! write and barrier in program order, so it can implement write-1-to-clear bits, read-only
//! fields, doorbells and read side effects. Plain memory could not.
//!
//! # Why a bus and not `&'static RegisterBlock`
//! tock-registers' own `ReadWrite<T>` types are `UnsafeCell`s in memory: a test can back them
//! with a heap buffer, but nothing runs when the driver writes, so a W1C status bit or a
//! doorbell cannot be modelled. It also hands out Rust references to MMIO, which the compiler
//! may assume dereferenceable (rust-lang/unsafe-code-guidelines#411). [`MmioBus`] keeps only a
//! raw base pointer and uses `read_volatile`/`write_volatile` per access.
//!
//! # Status registers
//! `modify` is a read-modify-write. On W1C registers it clears every bit that happened to be set
//! at the read; drivers must use `set`/`write` with an explicit mask there (a known pitfall,
//! e.g. embassy-rs/chiptool#86).

use core::marker::PhantomData;
use core::ptr::NonNull;

use tock_registers::interfaces::{Readable, Writeable};
use tock_registers::{RegisterLongName, UIntLike};

use crate::barrier::Barrier;

/// Width of a single register access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessWidth {
    /// 8 bits.
    U8,
    /// 16 bits.
    U16,
    /// 32 bits.
    U32,
    /// 64 bits.
    U64,
}

impl AccessWidth {
    /// Size of the access in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            AccessWidth::U8 => 1,
            AccessWidth::U16 => 2,
            AccessWidth::U32 => 4,
            AccessWidth::U64 => 8,
        }
    }

    /// Mask of the bits an access of this width carries.
    pub const fn mask(self) -> u64 {
        match self {
            AccessWidth::U64 => u64::MAX,
            w => (1u64 << (w.bytes() * 8)) - 1,
        }
    }
}

/// Something that decodes register accesses: an MMIO window or a device model.
///
/// Offsets are bytes from the start of the window. Accesses through a [`register_block!`]
/// are always within [`RegisterBus::size`] and naturally aligned; a raw caller that violates
/// this gets all-ones on reads and dropped writes from [`MmioBus`] (a model may do anything a
/// real decoder would, typically the same).
///
/// [`register_block!`]: crate::register_block
pub trait RegisterBus {
    /// Reads `width` bits at `offset`. The value is zero-extended.
    fn read(&self, offset: usize, width: AccessWidth) -> u64;
    /// Writes the low `width` bits of `value` at `offset`.
    fn write(&self, offset: usize, width: AccessWidth, value: u64);
    /// Size of the window in bytes.
    fn size(&self) -> usize;
    /// Orders this device's accesses against memory. Real buses execute the barrier; models
    /// may also record it (e.g. to check that queue memory was published before a doorbell).
    fn barrier(&self, kind: Barrier) {
        crate::barrier::issue(kind);
    }
}

impl<B: RegisterBus + ?Sized> RegisterBus for &B {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        (**self).read(offset, width)
    }
    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        (**self).write(offset, width, value)
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn barrier(&self, kind: Barrier) {
        (**self).barrier(kind)
    }
}

/// Register word types the bus can carry.
pub trait BusWord: UIntLike {
    /// The access width of this type.
    const WIDTH: AccessWidth;
    /// Truncating conversion from the bus value.
    fn from_bus(value: u64) -> Self;
    /// Zero-extending conversion to the bus value.
    fn to_bus(self) -> u64;
}

macro_rules! bus_word {
    ($t:ty, $w:ident) => {
        impl BusWord for $t {
            const WIDTH: AccessWidth = AccessWidth::$w;
            fn from_bus(value: u64) -> Self {
                value as $t
            }
            fn to_bus(self) -> u64 {
                self as u64
            }
        }
    };
}
bus_word!(u8, U8);
bus_word!(u16, U16);
bus_word!(u32, U32);
bus_word!(u64, U64);

/// Access marker: the register can be read.
pub trait CanRead {}
/// Access marker: the register can be written.
pub trait CanWrite {}
/// Read-only register.
#[derive(Debug)]
pub enum Ro {}
/// Write-only register.
#[derive(Debug)]
pub enum Wo {}
/// Read-write register.
#[derive(Debug)]
pub enum Rw {}
impl CanRead for Ro {}
impl CanRead for Rw {}
impl CanWrite for Wo {}
impl CanWrite for Rw {}

/// One register of a block: a bus, an offset, a word type `T`, the tock-registers long name `R`
/// its fields belong to, and an access marker `A` ([`Ro`], [`Wo`] or [`Rw`]).
pub struct Register<'a, B: ?Sized, T, R = (), A = Rw> {
    bus: &'a B,
    offset: usize,
    _marker: PhantomData<(T, R, A)>,
}

impl<B: ?Sized, T, R, A> Clone for Register<'_, B, T, R, A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: ?Sized, T, R, A> Copy for Register<'_, B, T, R, A> {}

impl<'a, B: RegisterBus + ?Sized, T: BusWord, R: RegisterLongName, A> Register<'a, B, T, R, A> {
    /// A register at `offset` of `bus`. Prefer the accessors generated by
    /// [`register_block!`](crate::register_block), which check the offset against the window.
    pub fn new(bus: &'a B, offset: usize) -> Self {
        Self {
            bus,
            offset,
            _marker: PhantomData,
        }
    }

    /// Byte offset of the register in its bus window.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl<B: RegisterBus + ?Sized, T: BusWord, R: RegisterLongName, A: CanRead> Readable
    for Register<'_, B, T, R, A>
{
    type T = T;
    type R = R;
    fn get(&self) -> T {
        T::from_bus(self.bus.read(self.offset, T::WIDTH))
    }
}

impl<B: RegisterBus + ?Sized, T: BusWord, R: RegisterLongName, A: CanWrite> Writeable
    for Register<'_, B, T, R, A>
{
    type T = T;
    type R = R;
    fn set(&self, value: T) {
        self.bus.write(self.offset, T::WIDTH, value.to_bus())
    }
}

/// A window of real device registers, accessed with volatile loads and stores.
#[derive(Debug)]
pub struct MmioBus {
    base: NonNull<u8>,
    size: usize,
}

// SAFETY: an MMIO window is a device, not Rust memory; concurrent volatile accesses from several
// threads are what the hardware sees anyway. Drivers that need exclusive access take `&mut`
// of the driver object, not of the bus.
unsafe impl Send for MmioBus {}
// SAFETY: as for `Send`: all accesses are single volatile instructions.
unsafe impl Sync for MmioBus {}

impl MmioBus {
    /// Wraps the register window `[base, base + size)`.
    ///
    /// # Safety
    /// `base` must be the (mapped, device-memory) address of a register window of at least
    /// `size` bytes that stays valid for the life of the bus, and nothing else may treat that
    /// range as ordinary Rust memory.
    pub unsafe fn new(base: NonNull<u8>, size: usize) -> Self {
        Self { base, size }
    }

    fn in_window(&self, offset: usize, width: AccessWidth) -> bool {
        // The address, not just the offset, must be naturally aligned: `new` does not require
        // an aligned `base`, and a misaligned volatile access is undefined behaviour.
        (self.base.as_ptr() as usize)
            .wrapping_add(offset)
            .is_multiple_of(width.bytes())
            && offset
                .checked_add(width.bytes())
                .is_some_and(|end| end <= self.size)
    }
}

impl RegisterBus for MmioBus {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        if !self.in_window(offset, width) {
            return width.mask();
        }
        // SAFETY: `new`'s contract makes [base, base + size) a device window; the access is in
        // bounds and its address naturally aligned (both checked by `in_window` above).
        unsafe {
            let p = self.base.as_ptr().add(offset);
            match width {
                AccessWidth::U8 => u64::from(p.read_volatile()),
                AccessWidth::U16 => u64::from(p.cast::<u16>().read_volatile()),
                AccessWidth::U32 => u64::from(p.cast::<u32>().read_volatile()),
                AccessWidth::U64 => p.cast::<u64>().read_volatile(),
            }
        }
    }

    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        if !self.in_window(offset, width) {
            return;
        }
        // SAFETY: as in `read`.
        unsafe {
            let p = self.base.as_ptr().add(offset);
            match width {
                AccessWidth::U8 => p.write_volatile(value as u8),
                AccessWidth::U16 => p.cast::<u16>().write_volatile(value as u16),
                AccessWidth::U32 => p.cast::<u32>().write_volatile(value as u32),
                AccessWidth::U64 => p.cast::<u64>().write_volatile(value),
            }
        }
    }

    fn size(&self) -> usize {
        self.size
    }
}

/// Declares a register block: a typed view of a [`RegisterBus`] at a base offset.
///
/// ```
/// use hal::regs::RegisterBus;
/// use tock_registers::interfaces::{Readable, Writeable};
/// use tock_registers::register_bitfields;
///
/// register_bitfields![u32,
///     /// Control register.
///     pub CTRL [
///         /// Enable the device.
///         EN OFFSET(0) NUMBITS(1) [],
///     ]
/// ];
///
/// hal::register_block! {
///     /// A tiny device.
///     pub struct Tiny {
///         /// Identification.
///         (0x00 => pub id: Ro u32),
///         /// Control.
///         (0x04 => pub ctrl: Rw u32, CTRL::Register),
///         /// Eight scratch registers, 8 bytes apart.
///         (0x10 => pub scratch: [Rw u64; 8, stride 8]),
///     }
///     size = 0x50;
/// }
///
/// # fn demo<B: RegisterBus>(bus: &B) -> hal::Result {
/// let regs = Tiny::new(bus, 0)?;
/// regs.ctrl().write(CTRL::EN::SET);
/// let _id = regs.id().get();
/// regs.scratch(3)?.set(7);
/// # Ok(()) }
/// ```
///
/// Every register is checked where the block is declared, whether or not its accessor is ever
/// used: one outside the block, or misaligned, does not compile.
///
/// ```compile_fail,E0080
/// hal::register_block! {
///     /// A block whose last register does not fit.
///     pub struct TooSmall {
///         /// Fits.
///         (0x00 => pub id: Ro u32),
///         /// Ends at 0x14, past the block's 0x10 bytes.
///         (0x10 => pub unused: Rw u32),
///     }
///     size = 0x10;
/// }
/// ```
///
/// ```compile_fail,E0080
/// hal::register_block! {
///     /// A block with a register array reaching past its end.
///     pub struct ArrayTooLong {
///         /// 4 x u64, 8 bytes apart: 0x20 bytes from 0x08.
///         (0x08 => pub table: [Rw u64; 4, stride 8]),
///     }
///     size = 0x20;
/// }
/// ```
///
/// ```compile_fail,E0080
/// hal::register_block! {
///     /// A block with a misaligned 64-bit register.
///     pub struct Misaligned {
///         /// At 0x04: not 8-byte aligned.
///         (0x04 => pub wide: Rw u64),
///     }
///     size = 0x10;
/// }
/// ```
#[macro_export]
macro_rules! register_block {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* ( $($entry:tt)* ) ),* $(,)?
        }
        size = $size:expr;
    ) => {
        $(#[$meta])*
        $vis struct $name<'a, B: $crate::regs::RegisterBus + ?Sized> {
            bus: &'a B,
            base: usize,
        }

        impl<B: $crate::regs::RegisterBus + ?Sized> ::core::clone::Clone for $name<'_, B> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<B: $crate::regs::RegisterBus + ?Sized> ::core::marker::Copy for $name<'_, B> {}

        #[allow(dead_code)]
        impl<'a, B: $crate::regs::RegisterBus + ?Sized> $name<'a, B> {
            /// Size of the block in bytes.
            pub const SIZE: usize = $size;

            /// The alignment a base needs: the width of the block's widest register, so that
            /// every register is naturally aligned wherever the block is placed.
            pub const ALIGN: usize = {
                let mut widest = 1;
                $(
                    let width = $crate::__register_width!($($entry)*);
                    if width > widest {
                        widest = width;
                    }
                )*
                widest
            };

            /// Views the block at byte offset `base` of `bus`; fails if it does not fit, or if
            /// `base` would leave a register misaligned (every access to it would fail).
            pub fn new(bus: &'a B, base: usize) -> $crate::Result<Self> {
                if base % Self::ALIGN != 0 {
                    return Err($crate::HalError::Misaligned {
                        value: base as u64,
                        align: Self::ALIGN as u64,
                    });
                }
                match base.checked_add(Self::SIZE) {
                    Some(end) if end <= bus.size() => Ok(Self { bus, base }),
                    _ => Err($crate::HalError::BlockOutsideWindow {
                        base,
                        size: Self::SIZE,
                        window: bus.size(),
                    }),
                }
            }

            /// The bus this block lives on.
            pub fn bus(&self) -> &'a B {
                self.bus
            }

            /// Byte offset of the block in its bus window.
            pub fn base(&self) -> usize {
                self.base
            }

            /// Orders this device's accesses against memory (see [`RegisterBus::barrier`]).
            ///
            /// [`RegisterBus::barrier`]: $crate::regs::RegisterBus::barrier
            pub fn barrier(&self, kind: $crate::barrier::Barrier) {
                $crate::regs::RegisterBus::barrier(self.bus, kind)
            }

            $( $crate::__register_accessor!{ $(#[$fmeta])* $($entry)* } )*
        }

        // Every register checked where the block is declared, used or not.
        const _: () = {
            $( $crate::__register_check!{ ($size) $($entry)* } )*
        };
    };
}

/// Checks at compile time that one entry of a [`register_block!`] is naturally aligned and
/// inside its block; not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! __register_check {
    (($size:expr) $off:literal => $vis:vis $name:ident : $acc:ident $ty:ty $(, $reg:ty)?) => {
        assert!(
            $off % ::core::mem::size_of::<$ty>() == 0,
            concat!("misaligned register `", stringify!($name), "`")
        );
        assert!(
            $off + ::core::mem::size_of::<$ty>() <= $size,
            concat!("register `", stringify!($name), "` outside its block")
        );
    };
    (($size:expr) $off:literal => $vis:vis $name:ident : [$acc:ident $ty:ty $(, $reg:ty)? ; $count:literal, stride $stride:literal]) => {
        assert!(
            $off % ::core::mem::size_of::<$ty>() == 0
                && $stride % ::core::mem::size_of::<$ty>() == 0,
            concat!("misaligned register array `", stringify!($name), "`")
        );
        assert!(
            $count > 0 && $off + ($count - 1) * $stride + ::core::mem::size_of::<$ty>() <= $size,
            concat!(
                "register array `",
                stringify!($name),
                "` empty or outside its block"
            )
        );
    };
}

/// Generates one accessor of a [`register_block!`]; not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! __register_accessor {
    ($(#[$m:meta])* $off:literal => $vis:vis $name:ident : $acc:ident $ty:ty $(, $reg:ty)?) => {
        $(#[$m])*
        #[inline]
        $vis fn $name(&self) -> $crate::regs::Register<'a, B, $ty, $crate::__reg_name!($($reg)?), $crate::regs::$acc> {
            $crate::regs::Register::new(self.bus, self.base + $off)
        }
    };
    ($(#[$m:meta])* $off:literal => $vis:vis $name:ident : [$acc:ident $ty:ty $(, $reg:ty)? ; $count:literal, stride $stride:literal]) => {
        $(#[$m])*
        #[doc = concat!("\n\nIndex 0..", stringify!($count), "; an index past the end is an error.")]
        #[inline]
        $vis fn $name(&self, index: usize) -> $crate::Result<$crate::regs::Register<'a, B, $ty, $crate::__reg_name!($($reg)?), $crate::regs::$acc>> {
            if index >= $count {
                return Err($crate::HalError::RegisterIndex { index, count: $count });
            }
            Ok($crate::regs::Register::new(self.bus, self.base + $off + index * $stride))
        }
    };
}

/// The width in bytes of one entry of a [`register_block!`]; not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! __register_width {
    ($(#[$m:meta])* $off:literal => $vis:vis $name:ident : $acc:ident $ty:ty $(, $reg:ty)?) => {
        ::core::mem::size_of::<$ty>()
    };
    ($(#[$m:meta])* $off:literal => $vis:vis $name:ident : [$acc:ident $ty:ty $(, $reg:ty)? ; $count:literal, stride $stride:literal]) => {
        ::core::mem::size_of::<$ty>()
    };
}

/// The long name of a register, `()` when none is given; not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! __reg_name {
    () => {
        ()
    };
    ($reg:ty) => {
        $reg
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmio_bus_checks_the_alignment_of_the_address_not_only_of_the_offset() {
        let mut words = [0u64; 2];
        let base = NonNull::from(&mut words).cast::<u8>();
        let odd = NonNull::new(base.as_ptr().wrapping_add(1)).unwrap();
        // SAFETY: `words` outlives both buses and is touched only through them while they are
        // used (volatile accesses; no Rust reference into it is held meanwhile).
        let (bus, shifted) = unsafe { (MmioBus::new(base, 16), MmioBus::new(odd, 15)) };
        for i in 0..16u8 {
            bus.write(usize::from(i), AccessWidth::U8, u64::from(i));
        }
        assert_eq!(
            bus.read(4, AccessWidth::U32),
            u64::from(u32::from_ne_bytes([4, 5, 6, 7]))
        );
        // Window offset 0 is byte 1 of `words`: a 32-bit access there is misaligned and reads
        // all-ones; offset 3 is byte 4, which is aligned.
        assert_eq!(shifted.read(0, AccessWidth::U32), 0xffff_ffff);
        assert_eq!(
            shifted.read(3, AccessWidth::U32),
            u64::from(u32::from_ne_bytes([4, 5, 6, 7]))
        );
        shifted.write(0, AccessWidth::U16, 0xabcd);
        assert_eq!(
            shifted.read(0, AccessWidth::U8),
            1,
            "misaligned write dropped"
        );
        assert_eq!(bus.read(1, AccessWidth::U8), 1);
    }
}
