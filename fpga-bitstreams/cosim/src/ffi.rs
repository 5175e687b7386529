//! The C ABI of `csrc/npe_shim.cpp`: one `NpeIo` per engine, one call per clock.
//!
//! Each field of these structs is the `npe_top` port of the same name (`m_axi_q_<field>`,
//! `s_axil_<field>`, `<stream>_t<field>`), so the fields carry no documentation of their own.
#![allow(missing_docs)]

use core::ffi::c_void;
use core::ptr::NonNull;

/// One AXI4 master port of the engine (outputs first, then inputs), as the shim lays it out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AxiPort {
    pub arid: u8,
    pub arlen: u8,
    pub arvalid: u8,
    pub rready: u8,
    pub awid: u8,
    pub awlen: u8,
    pub awvalid: u8,
    pub wstrb_lo: u8,
    pub wstrb_hi: u8,
    pub wlast: u8,
    pub wvalid: u8,
    pub bready: u8,
    pub _pad0: [u8; 3],
    pub araddr: u64,
    pub awaddr: u64,
    pub wdata: [u64; 2],
    pub arready: u8,
    pub rid: u8,
    pub rresp: u8,
    pub rlast: u8,
    pub rvalid: u8,
    pub awready: u8,
    pub wready: u8,
    pub bid: u8,
    pub bresp: u8,
    pub bvalid: u8,
    pub _pad1: [u8; 6],
    pub rdata: [u64; 2],
}

/// One AXI4-Stream (128-bit flits).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    pub data: [u64; 2],
    pub valid: u8,
    pub last: u8,
    pub ready: u8,
    pub _pad: [u8; 5],
}

/// Every port of `npe_top` except the clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Io {
    pub rst_n: u8,
    pub _pad0: [u8; 3],
    pub route_limit: u32,
    pub awaddr: u16,
    pub araddr: u16,
    pub awvalid: u8,
    pub wvalid: u8,
    pub wstrb: u8,
    pub bready: u8,
    pub arvalid: u8,
    pub rready: u8,
    pub wdata: u64,
    pub irq: u8,
    pub awready: u8,
    pub wready: u8,
    pub bresp: u8,
    pub bvalid: u8,
    pub arready: u8,
    pub rresp: u8,
    pub rvalid: u8,
    pub rdata: u64,
    pub q: AxiPort,
    pub d: AxiPort,
    pub tx_data: Stream,
    pub tx_ctrl: Stream,
    pub rx_data: Stream,
    pub rx_ctrl: Stream,
}

unsafe extern "C" {
    fn npe_new() -> *mut c_void;
    fn npe_free(p: *mut c_void);
    fn npe_cycle(p: *mut c_void, io: *mut Io);
}

/// One Verilated `npe_top`.
#[derive(Debug)]
pub struct Verilated {
    model: NonNull<c_void>,
}

// SAFETY: the Verilated model is plain heap state with no thread affinity (single-threaded
// model, no `--threads`); `Verilated` is only used through `&mut self`, so one thread at a
// time.
unsafe impl Send for Verilated {}

impl Verilated {
    /// A new engine, in reset.
    pub fn new() -> Self {
        // SAFETY: npe_new allocates a model and never returns null (C++ `new` throws instead).
        let ptr = unsafe { npe_new() };
        Self {
            model: NonNull::new(ptr).expect("npe_new returned a model"),
        }
    }

    /// One clock: drives the inputs of `io`, and leaves the outputs after the rising edge in it.
    pub fn cycle(&mut self, io: &mut Io) {
        // SAFETY: `model` came from npe_new and is freed only in Drop; `io` is a valid,
        // exclusively borrowed `Io` whose layout matches the shim's `NpeIo` (repr(C), same
        // field order and types).
        unsafe { npe_cycle(self.model.as_ptr(), io) }
    }
}

impl Default for Verilated {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Verilated {
    fn drop(&mut self) {
        // SAFETY: `model` came from npe_new and is freed exactly once, here.
        unsafe { npe_free(self.model.as_ptr()) }
    }
}
