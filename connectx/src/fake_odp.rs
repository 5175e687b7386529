//! On-demand paging in the fake provider (crate::fake): devices that report ODP
//! capabilities, the extra entry points the ODP self-test uses (crate::odp), and a model of a
//! *wrong* ODP data path.
//!
//! The wrong data path follows what Soft-RoCE of Linux 7.2/7.3 was measured to do
//! (docs/connectx.md §11, "ODP as the measured anchor"): at a path MTU below the page size,
//! every packet that starts inside a page has its bytes placed at the start of that page's
//! mapping, which fits `__rxe_odp_mr_copy` (drivers/infiniband/sw/rxe/rxe_odp.c) computing the
//! offset in the first page and then copying at the start of the page. Here every RDMA
//! WRITE into, RDMA READ out of, and READ response into an ODP MR of such a device moves its
//! bytes in packets of [`PACKET`] bytes, each placed (or fetched) that way; the capability
//! bits it reports are the full ones of a correct device. ODP MRs pin nothing: the fake does
//! not count them in [`crate::fake::pinned`].

use core::ffi::c_int;

use crate::sys::*;

/// The path MTU of the wrong data path's packets (rxe's default on a 1500-byte netdev).
pub const PACKET: u64 = 1024;

static ODP_DEVICE: u8 = 0;
static BROKEN_ODP_DEVICE: u8 = 0;
static ODP_WITHOUT_READ_DEVICE: u8 = 0;

/// What a fake device does with on-demand paging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OdpKind {
    /// Reports full RC ODP capabilities and moves ODP data correctly.
    Good,
    /// Reports full RC ODP capabilities and places packets wrongly (the module's text).
    Broken,
    /// Reports ODP, but not for RC RDMA READ: correct where it claims support.
    WithoutRead,
}

/// A device whose contexts report full RC ODP capabilities and move ODP data correctly.
pub fn device_with_odp() -> *mut ibv_device {
    (&raw const ODP_DEVICE).cast_mut().cast()
}

/// A device that reports full RC ODP capabilities but moves ODP data wrongly.
pub fn device_with_broken_odp() -> *mut ibv_device {
    (&raw const BROKEN_ODP_DEVICE).cast_mut().cast()
}

/// A device that reports ODP for RC SEND, RECV, WRITE and ATOMIC but not READ.
pub fn device_with_odp_without_read() -> *mut ibv_device {
    (&raw const ODP_WITHOUT_READ_DEVICE).cast_mut().cast()
}

/// The ODP behaviour of `dev` (`None`: no ODP at all, as Linux 6.1's rxe).
pub fn kind(dev: *mut ibv_device) -> Option<OdpKind> {
    if dev == device_with_odp() {
        Some(OdpKind::Good)
    } else if dev == device_with_broken_odp() {
        Some(OdpKind::Broken)
    } else if dev == device_with_odp_without_read() {
        Some(OdpKind::WithoutRead)
    } else {
        None
    }
}

/// The ODP capabilities a device of `kind` reports.
pub fn caps(kind: Option<OdpKind>) -> ibv_odp_caps {
    let full = IBV_ODP_SUPPORT_SEND
        | IBV_ODP_SUPPORT_RECV
        | IBV_ODP_SUPPORT_WRITE
        | IBV_ODP_SUPPORT_READ
        | IBV_ODP_SUPPORT_ATOMIC
        | IBV_ODP_SUPPORT_SRQ_RECV;
    match kind {
        None => ibv_odp_caps::default(),
        Some(OdpKind::Good | OdpKind::Broken) => ibv_odp_caps {
            general_caps: IBV_ODP_SUPPORT,
            rc_odp_caps: full,
            ..Default::default()
        },
        Some(OdpKind::WithoutRead) => ibv_odp_caps {
            general_caps: IBV_ODP_SUPPORT,
            rc_odp_caps: full & !IBV_ODP_SUPPORT_READ,
            ..Default::default()
        },
    }
}

/// Where the wrong data path puts (or takes) the packet that belongs at `addr`: the start
/// of its page when it starts inside one, never below `floor` (the MR's first byte).
fn misplaced(addr: u64, floor: u64) -> u64 {
    if addr.is_multiple_of(4096) {
        addr
    } else {
        (addr & !4095).max(floor)
    }
}

/// Writes `data` at `dst` as the wrong data path does, in packets of [`PACKET`] bytes.
///
/// # Safety
/// `[floor, dst + data.len())` is writable memory of a registered region of this process.
pub unsafe fn write_misplaced(dst: u64, floor: u64, data: &[u8]) {
    for (i, chunk) in data.chunks(PACKET as usize).enumerate() {
        let at = misplaced(dst + i as u64 * PACKET, floor);
        // SAFETY: `at` lies in `[floor, dst + data.len())` and the chunk ends no later than
        // its proper place does (the caller's contract).
        unsafe { core::ptr::copy(chunk.as_ptr(), at as *mut u8, chunk.len()) };
    }
}

/// Reads `len` bytes belonging at `src` as the wrong data path does.
///
/// # Safety
/// `[floor, src + len)` is readable memory of a registered region of this process.
pub unsafe fn read_misplaced(src: u64, floor: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (i, chunk) in out.chunks_mut(PACKET as usize).enumerate() {
        let at = misplaced(src + i as u64 * PACKET, floor);
        // SAFETY: as in `write_misplaced`.
        unsafe { core::ptr::copy(at as *const u8, chunk.as_mut_ptr(), chunk.len()) };
    }
    out
}

/// `ibv_query_port`: one active RoCE port, path MTU up to 1024.
pub(crate) unsafe extern "C" fn fake_query_port(
    _ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's struct.
    unsafe {
        attr.write(ibv_port_attr {
            state: IBV_PORT_ACTIVE,
            max_mtu: 3,
            active_mtu: 3,
            gid_tbl_len: 2,
            link_layer: IBV_LINK_LAYER_ETHERNET,
            ..Default::default()
        })
    };
    0
}

/// `ibv_get_device_name`.
pub(crate) unsafe extern "C" fn fake_get_device_name(
    dev: *mut ibv_device,
) -> *const core::ffi::c_char {
    match kind(dev) {
        None => c"fake0".as_ptr(),
        Some(OdpKind::Good) => c"fake_odp0".as_ptr(),
        Some(OdpKind::Broken) => c"fake_badodp0".as_ptr(),
        Some(OdpKind::WithoutRead) => c"fake_odpnoread0".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrong_data_path_misplaces_every_packet_that_starts_inside_a_page() {
        let mut whole = vec![0u8; 4 * 4096];
        let skip = (whole.as_ptr() as u64).next_multiple_of(4096) - whole.as_ptr() as u64;
        let buf = &mut whole[skip as usize..skip as usize + 3 * 4096];
        let base = buf.as_mut_ptr() as u64;
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 + 1).collect();
        // SAFETY: inside `buf`.
        unsafe { write_misplaced(base, base, &data) };
        // The packets at page offsets 0 and 4096 land right; those at 1024, 2048, 3072 land
        // at the page's start, over the first packet; the bytes after 1024 stay zero.
        assert_eq!(&buf[1024..4096], &vec![0u8; 3072][..]);
        assert_eq!(&buf[..1024], &data[3072..4096]);
        assert_eq!(&buf[4096..5120], &data[7168..8192]);
        // Page-aligned packets read right, the others from their page's start.
        // SAFETY: inside `buf`.
        let back = unsafe { read_misplaced(base, base, 2048) };
        assert_eq!(&back[..1024], &buf[..1024]);
        assert_eq!(&back[1024..], &buf[..1024]);
        assert_eq!(misplaced(base + 5000, base + 4500), base + 4500);
    }
}
