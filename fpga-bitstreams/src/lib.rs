//! nprdma's PL designs and their checks (docs/fpga-bitstreams.md).
//!
//! - [`bit`]: Xilinx `.bit` files: the header (design, part, date, time, length), the sync
//!   word; the part and the device IDCODE checked against the board.
//! - [`packets`]: the configuration packets after the sync word, walked to the write of
//!   the device's IDCODE.
//! - [`bin`]: the `.bin` Linux's FPGA manager hands to the ZynqMP's PMU firmware.
//! - [`digest`]: sha256 as lower-case hex.
//! - `manifest` (std): what a bitstream is for (board, part, NPE version, register-map hash)
//!   and the sha256 of every file of an image, written and checked.
//! - `overlay` (std): the NPE device-tree overlay generated from `boards::zynqmp::pl`.
//! - `vivado` (std): the Vivado Tcl and constraints generated from the same description.
//! - `fpga_manager` (std): loading through Linux's FPGA manager (sysfs, configfs) and its
//!   state.
//! - `testbit` (std): bitstream-shaped files with a valid header, sync word and IDCODE
//!   write, for the image builder's own checks and the tests (they configure nothing).
//!
//! The parser is `no_std` and allocation-free: it borrows from the file's bytes.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

pub mod bin;
pub mod bit;
pub mod digest;
mod error;
#[cfg(any(test, feature = "std"))]
pub mod fpga_manager;
#[cfg(any(test, feature = "std"))]
pub mod manifest;
#[cfg(any(test, feature = "std"))]
pub mod overlay;
pub mod packets;
#[cfg(any(test, feature = "std"))]
pub mod testbit;
#[cfg(any(test, feature = "std"))]
pub mod vivado;

pub use error::{BitstreamError, Result};
