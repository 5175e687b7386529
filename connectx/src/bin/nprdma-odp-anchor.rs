//! `nprdma-odp-anchor`: the measurements behind `cargo xtask rxe-test`'s ODP anchor
//! (docs/connectx.md §11), for one way of registering memory per run:
//!
//! - `--mode pinned`: plain `ibv_reg_mr` (the kernel pins every page);
//! - `--mode odp`: `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND` (the kernel pins nothing and
//!   faults pages in when the device touches them);
//! - `--mode lib`: plain `ibv_reg_mr` under `LD_PRELOAD=libnprdma.so` (the library's windows).
//!
//! It measures, on one device, in one process:
//!
//! 1. the time of `ibv_reg_mr` for each size of `--reg-sizes`, each over a fresh untouched
//!    anonymous mapping (`MAP_NORESERVE`), deregistered and unmapped after;
//! 2. first touch: an RDMA WRITE of `--touch-size` bytes from a filled buffer into an untouched
//!    one, and an RDMA READ of the same bytes into another untouched buffer, each over a
//!    fresh loopback RC QP pair (two QPs of this process connected to each other), each one
//!    work request and one completion, timed from the post to the completion;
//! 3. the same WRITE again, into the buffer the first one touched, with new contents (warm);
//! 4. every byte each transfer delivered, compared with what was sent: the number of wrong
//!    bytes and the offset of the first one are printed, never hidden;
//! 5. `VmPin` (/proc/self/status) after every step, and the library's own peak count.
//!
//! Every result is one line `NPRDMA-ANCHOR: mode=<mode> what=<step> key=value...`, which
//! `cargo xtask rxe-test` turns into its table. The exit status is 0 when every transfer
//! completed and delivered exactly the bytes sent, 2 when a transfer failed or delivered wrong
//! bytes, and 1 when the program could not run at all.
//!
//! libibverbs is called through `dlsym` at run time (never by link-time symbols), so that a
//! preloaded library is the one that interposes; the data path goes through the context's
//! operations as verbs.h's inline functions do.

use std::ffi::{CStr, c_int};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nprdma::sys::*;

#[path = "common/dlverbs.rs"]
mod dlverbs;
use dlverbs::*;

/// The libibverbs functions the program calls.
struct Verbs {
    get_device_list: GetDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    alloc_pd: AllocPd,
    create_cq: CreateCq,
    create_qp: CreateQp,
    destroy_qp: DestroyQp,
    modify_qp: ModifyQp,
    query_gid: QueryGid,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
}

impl Verbs {
    fn load() -> Result<Self, String> {
        open_libibverbs()?;
        Ok(Self {
            get_device_list: load!("ibv_get_device_list", GetDeviceList),
            get_device_name: load!("ibv_get_device_name", GetDeviceName),
            open_device: load!("ibv_open_device", OpenDevice),
            alloc_pd: load!("ibv_alloc_pd", AllocPd),
            create_cq: load!("ibv_create_cq", CreateCq),
            create_qp: load!("ibv_create_qp", CreateQp),
            destroy_qp: load!("ibv_destroy_qp", DestroyQp),
            modify_qp: load!("ibv_modify_qp", ModifyQp),
            query_gid: load!("ibv_query_gid", QueryGid),
            reg_mr: load!("ibv_reg_mr", RegMr),
            dereg_mr: load!("ibv_dereg_mr", DeregMr),
        })
    }
}

/// How the run registers memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Pinned,
    Odp,
    Lib,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Pinned => "pinned",
            Mode::Odp => "odp",
            Mode::Lib => "lib",
        }
    }

    /// The access flags of every registration of the run.
    fn access(self) -> u32 {
        let base = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        match self {
            Mode::Odp => base | IBV_ACCESS_ON_DEMAND,
            Mode::Pinned | Mode::Lib => base,
        }
    }
}

struct Args {
    mode: Mode,
    /// The name the result lines give the run (the mode's name unless `--tag` says otherwise).
    tag: String,
    device: String,
    gid_index: i32,
    reg_sizes: Vec<u64>,
    touch_size: u64,
    /// The path MTU, as `enum ibv_mtu` (1 = 256 B ... 5 = 4096 B).
    mtu: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        mode: Mode::Pinned,
        tag: String::new(),
        device: "rxe0".into(),
        gid_index: 1,
        reg_sizes: vec![1 << 30],
        touch_size: 64 << 20,
        mtu: 3,
    };
    let size =
        |k: &'static str, v: &str| nprdma::config::parse_size(k, v).map_err(|e| e.to_string());
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--mode" => {
                a.mode = match v()?.as_str() {
                    "pinned" => Mode::Pinned,
                    "odp" => Mode::Odp,
                    "lib" => Mode::Lib,
                    m => return Err(format!("--mode {m}: pinned, odp or lib")),
                }
            }
            "--tag" => a.tag = v()?,
            "--device" => a.device = v()?,
            "--gid-index" => a.gid_index = v()?.parse().map_err(|_| "bad --gid-index")?,
            "--reg-sizes" => {
                a.reg_sizes = v()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| size("--reg-sizes", s))
                    .collect::<Result<_, _>>()?
            }
            "--touch-size" => a.touch_size = size("--touch-size", &v()?)?,
            "--mtu" => {
                a.mtu = match v()?.as_str() {
                    "256" => 1,
                    "512" => 2,
                    "1024" => 3,
                    "2048" => 4,
                    "4096" => 5,
                    m => return Err(format!("--mtu {m}: 256, 512, 1024, 2048 or 4096")),
                }
            }
            "--help" | "-h" => {
                return Err("usage: nprdma-odp-anchor --mode pinned|odp|lib [--device rxe0] [--gid-index N] [--reg-sizes 1G,1536M] [--touch-size 64M] [--mtu 1024] [--tag NAME]".into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.tag.is_empty() {
        a.tag = a.mode.name().into();
    }
    if !a.tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("--tag takes letters, digits and _".into());
    }
    if a.touch_size < 4096 || a.touch_size > 1 << 30 || !a.touch_size.is_multiple_of(8) {
        return Err("--touch-size must be a multiple of 8 from 4K to 1G".into());
    }
    if a.mode == Mode::Lib && std::env::var_os("LD_PRELOAD").is_none() {
        return Err("--mode lib measures the library: run it with LD_PRELOAD=libnprdma.so".into());
    }
    Ok(a)
}

/// `VmPin` of this process, in bytes.
fn vm_pin() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmPin:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// An anonymous private mapping, untouched until written, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: u64) -> Result<Self, String> {
        let len = usize::try_from(len).map_err(|_| "size does not fit the address space")?;
        // SAFETY: a fresh anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Self { ptr: p.cast(), len })
    }

    fn words(&mut self) -> &mut [u64] {
        // SAFETY: the mapping is page-aligned, `len` bytes long and only reached through
        // `&mut self` here; no transfer into it is in flight when this is called.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u64>(), self.len / 8) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer registered.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The 8 bytes at word `i` of a buffer filled for `round`: splitmix64 of the pair, so that
/// two rounds differ in almost every byte, with the lowest bit set (never a zero word, so an
/// untouched page never passes for data).
fn pattern(round: u64, i: usize) -> u64 {
    let mut z = (i as u64 + 1)
        .wrapping_add(round.wrapping_mul(0x9e37_79b9_7f4a_7c15 << 20))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// Wrong bytes of `got` against the pattern of `round`, and the offset of the first one.
fn check(got: &[u64], round: u64) -> (u64, Option<u64>) {
    let mut wrong = 0u64;
    let mut first = None;
    for (i, w) in got.iter().enumerate() {
        let diff = w ^ pattern(round, i);
        if diff != 0 {
            let bytes = diff.to_le_bytes();
            if first.is_none() {
                let b = bytes.iter().position(|b| *b != 0).unwrap_or(0);
                first = Some(i as u64 * 8 + b as u64);
            }
            wrong += bytes.iter().filter(|b| **b != 0).count() as u64;
        }
    }
    (wrong, first)
}

/// One device context: protection domain and completion queue.
struct Dev {
    v: Verbs,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    gid: [u8; 16],
    gid_index: i32,
    mtu: u32,
}

impl Dev {
    fn open(a: &Args) -> Result<Self, String> {
        let v = Verbs::load()?;
        let mut n = 0;
        // SAFETY: plain libibverbs calls with valid arguments; results are checked.
        unsafe {
            let list = (v.get_device_list)(&mut n);
            if list.is_null() || n <= 0 {
                return Err("no RDMA device".into());
            }
            let mut dev = std::ptr::null_mut();
            for i in 0..n as usize {
                let d = *list.add(i);
                if CStr::from_ptr((v.get_device_name)(d)).to_string_lossy() == a.device {
                    dev = d;
                }
            }
            if dev.is_null() {
                return Err(format!("no device {}", a.device));
            }
            let ctx = (v.open_device)(dev);
            if ctx.is_null() {
                return Err("ibv_open_device failed".into());
            }
            let pd = (v.alloc_pd)(ctx);
            if pd.is_null() {
                return Err("ibv_alloc_pd failed".into());
            }
            let cq = (v.create_cq)(ctx, 256, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            if cq.is_null() {
                return Err("ibv_create_cq failed".into());
            }
            let mut gid = [0u8; 16];
            if (v.query_gid)(ctx, 1, a.gid_index, &mut gid) != 0 {
                return Err("ibv_query_gid failed".into());
            }
            Ok(Self {
                v,
                ctx,
                pd,
                cq,
                gid,
                gid_index: a.gid_index,
                mtu: a.mtu,
            })
        }
    }

    /// Registers `m` with `access`; the MR or the error text.
    fn reg(&self, m: &Mapping, access: u32) -> Result<*mut ibv_mr, String> {
        // SAFETY: a live PD and a mapping that outlives the registration.
        let mr = unsafe { (self.v.reg_mr)(self.pd, m.ptr.cast(), m.len, access as c_int) };
        if mr.is_null() {
            Err(format!(
                "ibv_reg_mr of {} bytes: {}",
                m.len,
                std::io::Error::last_os_error()
            ))
        } else {
            Ok(mr)
        }
    }

    fn dereg(&self, mr: *mut ibv_mr) {
        // SAFETY: a live MR of ours, with no transfer in flight.
        unsafe { (self.v.dereg_mr)(mr) };
    }

    /// Two RC QPs on the CQ, connected to each other; `(requester, responder)`.
    fn loopback_pair(&self) -> Result<(*mut ibv_qp, *mut ibv_qp), String> {
        let mut qps = [std::ptr::null_mut(); 2];
        for qp in &mut qps {
            let mut attr = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: self.cq,
                recv_cq: self.cq,
                srq: std::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: 128,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: a live PD and valid attributes.
            *qp = unsafe { (self.v.create_qp)(self.pd, &mut attr) };
            if qp.is_null() {
                return Err("ibv_create_qp failed".into());
            }
        }
        for (qp, peer) in [(qps[0], qps[1]), (qps[1], qps[0])] {
            // SAFETY: a live QP.
            let peer_qpn = unsafe { (*peer).qp_num };
            self.connect(qp, peer_qpn)?;
        }
        Ok((qps[0], qps[1]))
    }

    /// RESET → INIT → RTR → RTS towards `peer_qpn` on this device's own GID.
    fn connect(&self, qp: *mut ibv_qp, peer_qpn: u32) -> Result<(), String> {
        let modify = |attr: &mut ibv_qp_attr, mask: c_int, what: &str| -> Result<(), String> {
            // SAFETY: a live QP and a valid attribute struct.
            match unsafe { (self.v.modify_qp)(qp, attr, mask) } {
                0 => Ok(()),
                rc => Err(format!("modify_qp to {what}: errno {rc}")),
            }
        };
        rc_to_rts(
            modify,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
            self.mtu,
            peer_qpn,
            self.gid,
            self.gid_index,
        )
    }

    fn destroy(&self, qp: *mut ibv_qp) {
        // SAFETY: a live QP of ours; its WRs completed or were abandoned with it.
        unsafe { (self.v.destroy_qp)(qp) };
    }

    /// Posts one signaled RDMA `opcode` of `len` bytes from local `(addr, lkey)` to
    /// `(remote, rkey)` on `qp` and waits for its completion: the seconds from the post to
    /// the completion, or why there was none.
    fn transfer(
        &self,
        qp: *mut ibv_qp,
        opcode: u32,
        local: (u64, u32),
        remote: (u64, u32),
        len: u64,
    ) -> Result<f64, String> {
        let mut sge = ibv_sge {
            addr: local.0,
            length: u32::try_from(len).map_err(|_| "transfer too long")?,
            lkey: local.1,
        };
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = 7;
        wr.opcode = opcode;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.set_rdma(remote.0, remote.1);
        let mut bad = std::ptr::null_mut();
        let started = Instant::now();
        // SAFETY: what verbs.h's ibv_post_send does, on a live QP; the SGE and WR live
        // until the call returns (the provider copies them).
        let rc = unsafe {
            ((*(*qp).context).ops.post_send.ok_or("no post_send")?)(qp, &mut wr, &mut bad)
        };
        if rc != 0 {
            return Err(format!("post_send: errno {rc}"));
        }
        let deadline = started + Duration::from_secs(60);
        loop {
            let mut wc = ibv_wc::default();
            // SAFETY: what verbs.h's ibv_poll_cq does, on a live CQ.
            let n = unsafe {
                ((*(*self.cq).context).ops.poll_cq.ok_or("no poll_cq")?)(self.cq, 1, &mut wc)
            };
            if n < 0 {
                return Err("poll_cq failed".into());
            }
            if n == 1 {
                let secs = started.elapsed().as_secs_f64();
                if wc.wr_id != 7 {
                    return Err(format!("a completion with wr_id {}", wc.wr_id));
                }
                if wc.status != IBV_WC_SUCCESS {
                    return Err(format!("completion status {}", wc.status));
                }
                return Ok(secs);
            }
            if Instant::now() > deadline {
                return Err("no completion within 60 s".into());
            }
        }
    }
}

/// Prints one result line.
fn say(tag: &str, what: &str, fields: &str) {
    println!("NPRDMA-ANCHOR: mode={tag} what={what} {fields}");
}

/// Step 1: the registration times.
fn registrations(dev: &Dev, a: &Args, vmpin_peak: &mut u64) {
    for &size in &a.reg_sizes {
        let m = match Mapping::new(size) {
            Ok(m) => m,
            Err(e) => {
                say(&a.tag, "reg", &format!("bytes={size} error={e:?}"));
                continue;
            }
        };
        let t = Instant::now();
        let mr = dev.reg(&m, a.mode.access());
        let secs = t.elapsed().as_secs_f64();
        let pinned = vm_pin();
        *vmpin_peak = (*vmpin_peak).max(pinned);
        match mr {
            Ok(mr) => {
                say(
                    &a.tag,
                    "reg",
                    &format!("bytes={size} secs={secs:.6} vmpin={pinned}"),
                );
                dev.dereg(mr);
            }
            Err(e) => say(
                &a.tag,
                "reg",
                &format!("bytes={size} error={e:?} secs={secs:.6}"),
            ),
        }
    }
}

/// One timed transfer over a fresh QP pair, its bytes verified; whether it was exact.
#[allow(clippy::too_many_arguments)]
fn timed(
    dev: &Dev,
    tag: &str,
    what: &str,
    opcode: u32,
    local: (&mut Mapping, u32),
    remote: (&mut Mapping, u32),
    check_local: bool,
    round: u64,
    vmpin_peak: &mut u64,
) -> Result<bool, String> {
    let (requester, responder) = dev.loopback_pair()?;
    let len = local.0.len as u64;
    let result = dev.transfer(
        requester,
        opcode,
        (local.0.ptr as u64, local.1),
        (remote.0.ptr as u64, remote.1),
        len,
    );
    let pinned = vm_pin();
    *vmpin_peak = (*vmpin_peak).max(pinned);
    dev.destroy(requester);
    dev.destroy(responder);
    let landed = if check_local { local.0 } else { remote.0 };
    let (wrong, first) = check(landed.words(), round);
    let first = first.map_or("none".to_string(), |f| f.to_string());
    let exact = result.is_ok() && wrong == 0;
    match result {
        Ok(secs) => say(
            tag,
            what,
            &format!(
                "bytes={len} secs={secs:.6} wrong_bytes={wrong} first_wrong={first} vmpin={pinned}"
            ),
        ),
        Err(e) => say(
            tag,
            what,
            &format!(
                "bytes={len} error={e:?} wrong_bytes={wrong} first_wrong={first} vmpin={pinned}"
            ),
        ),
    }
    Ok(exact)
}

/// Steps 2 to 4: first touch and warm; whether every transfer was exact.
fn first_touch(dev: &Dev, a: &Args, vmpin_peak: &mut u64) -> Result<bool, String> {
    let mut src = Mapping::new(a.touch_size)?;
    for (i, w) in src.words().iter_mut().enumerate() {
        *w = pattern(1, i);
    }
    let mut dst = Mapping::new(a.touch_size)?;
    let mut sink = Mapping::new(a.touch_size)?;
    let t = Instant::now();
    let mrs = [
        dev.reg(&src, a.mode.access())?,
        dev.reg(&dst, a.mode.access())?,
        dev.reg(&sink, a.mode.access())?,
    ];
    let secs = t.elapsed().as_secs_f64();
    let pinned = vm_pin();
    *vmpin_peak = (*vmpin_peak).max(pinned);
    say(
        &a.tag,
        "reg_buffers",
        &format!("bytes={} secs={secs:.6} vmpin={pinned}", 3 * a.touch_size),
    );
    doctor(&a.tag);
    // SAFETY: live MRs.
    let [(_, src_rkey), (_, dst_rkey), (sink_lkey, _)] =
        mrs.map(|mr| unsafe { ((*mr).lkey, (*mr).rkey) });
    // SAFETY: a live MR.
    let src_lkey = unsafe { (*mrs[0]).lkey };
    let mut exact = timed(
        dev,
        &a.tag,
        "write_first",
        IBV_WR_RDMA_WRITE,
        (&mut src, src_lkey),
        (&mut dst, dst_rkey),
        false,
        1,
        vmpin_peak,
    )?;
    exact &= timed(
        dev,
        &a.tag,
        "read_first",
        IBV_WR_RDMA_READ,
        (&mut sink, sink_lkey),
        (&mut src, src_rkey),
        true,
        1,
        vmpin_peak,
    )?;
    // Warm: new contents into the pages the first WRITE touched.
    for (i, w) in src.words().iter_mut().enumerate() {
        *w = pattern(2, i);
    }
    exact &= timed(
        dev,
        &a.tag,
        "write_warm",
        IBV_WR_RDMA_WRITE,
        (&mut src, src_lkey),
        (&mut dst, dst_rkey),
        false,
        2,
        vmpin_peak,
    )?;
    for mr in mrs {
        dev.dereg(mr);
    }
    Ok(exact)
}

/// The library's status page of this process (what `nprdma doctor` reads), if it is active.
fn own_report() -> Option<nprdma::status::Report> {
    let dir = std::env::var_os("NPRDMA_STATUS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| nprdma::config::default_status_dir(nprdma::config::current_uid()));
    let page = dir.join(format!("{}.status", std::process::id()));
    nprdma::status::read_file(&page).ok()
}

/// The library's own peak of pinned bytes (its status page), if it is active.
fn library_peak() -> Option<u64> {
    own_report().map(|r| r.pinned_peak)
}

/// What doctor says of this process while the buffers are registered (library runs only):
/// the mode chosen per device with the ODP self-test's result, and how many of the live MRs
/// each mode serves.
fn doctor(tag: &str) {
    let Some(r) = own_report() else {
        return;
    };
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    for d in &r.devices {
        say(
            tag,
            "doctor_device",
            &format!(
                "reg_mode={} name={} choice={} selftest={} odp_general={:#x} odp_rc={:#x} reason=\"{}\"",
                r.reg_mode,
                d.name,
                if d.odp { "odp" } else { "windows" },
                d.self_test.as_str().replace(' ', "_"),
                d.odp_general_caps,
                d.odp_rc_caps,
                quote(&d.reason)
            ),
        );
    }
    let count = |m: nprdma::status::MrMode| r.mrs.iter().filter(|x| x.mode == m).count();
    use nprdma::status::MrMode as M;
    say(
        tag,
        "doctor_mrs",
        &format!(
            "reg_mode={} odp={} windows={} pinned_fallback={} pass_through={} unlisted={}",
            r.reg_mode,
            count(M::Odp),
            count(M::Windows),
            count(M::PinnedFallback),
            count(M::PassThrough),
            r.mrs_unlisted
        ),
    );
}

fn run() -> Result<bool, String> {
    let a = parse_args()?;
    let dev = Dev::open(&a)?;
    let mut vmpin_peak = vm_pin();
    registrations(&dev, &a, &mut vmpin_peak);
    let exact = first_touch(&dev, &a, &mut vmpin_peak)?;
    let lib = library_peak().map_or("none".to_string(), |p| p.to_string());
    say(
        &a.tag,
        "pinned_peak",
        &format!("vmpin={vmpin_peak} library={lib}"),
    );
    // The context closes at exit (its QPs were destroyed, its MRs deregistered).
    let _ = dev.ctx;
    Ok(exact)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            println!("NPRDMA-ANCHOR: error={e:?}");
            eprintln!("nprdma-odp-anchor: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_counts_wrong_bytes_and_finds_the_first() {
        let mut words: Vec<u64> = (0..1024).map(|i| pattern(3, i)).collect();
        assert_eq!(check(&words, 3), (0, None));
        // An untouched (zero) page never passes: the pattern has no zero word.
        assert!(words.iter().all(|w| *w != 0));
        assert_eq!(check(&[0u64; 4], 3).0, 32);
        words[128] ^= 0xff << 16; // byte 2 of word 128
        words[129] = pattern(4, 129);
        let (wrong, first) = check(&words, 3);
        assert_eq!(first, Some(128 * 8 + 2));
        assert!(wrong >= 2, "{wrong}");
        // Another round's contents are wrong everywhere they differ.
        assert!(check(&words, 4).0 > 8000);
    }

    #[test]
    fn odp_asks_for_on_demand_paging_and_the_others_do_not() {
        assert_ne!(Mode::Odp.access() & IBV_ACCESS_ON_DEMAND, 0);
        assert_eq!(Mode::Pinned.access() & IBV_ACCESS_ON_DEMAND, 0);
        assert_eq!(Mode::Lib.access(), Mode::Pinned.access());
    }
}
