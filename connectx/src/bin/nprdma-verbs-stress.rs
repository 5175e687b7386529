//! `nprdma-verbs-stress`: a verbs program that registers a large region on each side and
//! checks that every byte it moves arrives, while pinned memory stays under the budget.
//!
//! Run one server and one client (same arguments, the client adds `--connect HOST`), with
//! `LD_PRELOAD=libnprdma.so`. Each side registers `--size` bytes (untouched memory: the pages
//! appear only where operations land) and connects one RC QP (out-of-band exchange over TCP,
//! as perftest does). The client then runs `--ops` operations at random offsets, drawn from a
//! seed both sides share:
//!
//! - WRITE + READ back: fills a local range with the operation's pattern, writes it to a
//!   random remote offset, reads that remote range back into another random local offset, and
//!   compares every byte with the pattern;
//! - SEND with immediate: the server receives into a random offset of its region and compares
//!   every byte with the pattern of the operation the immediate names;
//! - FETCH_AND_ADD on a remote counter: the final counter is read back and must equal the
//!   number of adds (each executed exactly once).
//!
//! Both sides read `VmPin` from /proc/self/status after every operation and the library's
//! status page at the end, and fail if either ever exceeded `--budget`. Every completion must
//! carry the expected `wr_id` and status. With `--cq-ex` the CQ is an extended one
//! (`ibv_create_cq_ex`) polled through `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`; with
//! `--events` the program sleeps on a completion channel between polls (arm, poll again,
//! `ibv_get_cq_event`, `ibv_ack_cq_events`), the way event-driven applications wait.
//!
//! The program calls libibverbs through `dlsym` at run time (never by link-time symbols), so
//! that the preloaded library is the one that interposes; the data path goes through the
//! context's operations exactly as verbs.h's inline functions do.

use std::ffi::{CStr, c_int};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nprdma::sys::*;

#[path = "common/dlverbs.rs"]
mod dlverbs;
use dlverbs::*;

struct Verbs {
    get_device_list: GetDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    alloc_pd: AllocPd,
    create_cq: CreateCq,
    create_qp: CreateQp,
    modify_qp: ModifyQp,
    query_gid: QueryGid,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
    create_comp_channel: CreateCompChannel,
    get_cq_event: GetCqEvent,
    ack_cq_events: AckCqEvents,
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
            modify_qp: load!("ibv_modify_qp", ModifyQp),
            query_gid: load!("ibv_query_gid", QueryGid),
            reg_mr: load!("ibv_reg_mr", RegMr),
            dereg_mr: load!("ibv_dereg_mr", DeregMr),
            create_comp_channel: load!("ibv_create_comp_channel", CreateCompChannel),
            get_cq_event: load!("ibv_get_cq_event", GetCqEvent),
            ack_cq_events: load!("ibv_ack_cq_events", AckCqEvents),
        })
    }
}

struct Args {
    device: String,
    gid_index: i32,
    size: u64,
    ops: u64,
    budget: u64,
    port: u16,
    connect: Option<String>,
    seed: u64,
    cq_ex: bool,
    events: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        device: "rxe0".into(),
        gid_index: 1,
        size: 1 << 30,
        ops: 1000,
        budget: 16 << 20,
        port: 18515,
        connect: None,
        seed: 0x6e70_7264_6d61,
        cq_ex: false,
        events: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--device" => a.device = v()?,
            "--gid-index" => a.gid_index = v()?.parse().map_err(|_| "bad --gid-index")?,
            "--size" => {
                a.size = nprdma::config::parse_size("--size", &v()?).map_err(|e| e.to_string())?
            }
            "--ops" => a.ops = v()?.parse().map_err(|_| "bad --ops")?,
            "--budget" => {
                a.budget =
                    nprdma::config::parse_size("--budget", &v()?).map_err(|e| e.to_string())?
            }
            "--port" => a.port = v()?.parse().map_err(|_| "bad --port")?,
            "--connect" => a.connect = Some(v()?),
            "--seed" => a.seed = v()?.parse().map_err(|_| "bad --seed")?,
            "--cq-ex" => a.cq_ex = true,
            "--events" => a.events = true,
            "--help" | "-h" => {
                return Err("usage: nprdma-verbs-stress [--device rxe0] [--gid-index N] [--size 1G] [--ops N] [--budget 16M] [--port P] [--seed S] [--cq-ex | --events] [--connect HOST]".into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.cq_ex && a.events {
        return Err("--cq-ex and --events do not go together".into());
    }
    if a.size < 1 << 20 {
        return Err("--size must be at least 1M".into());
    }
    Ok(a)
}

/// The operations both sides agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    WriteRead { lo: u64, ro: u64, so: u64, len: u64 },
    Send { lo: u64, len: u64 },
    Add,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const MAX_LEN: u64 = 64 * 1024;
/// The remote counter of the fetch-and-adds lives in the region's first 8 bytes; operations
/// keep away from the first page.
const COUNTER: u64 = 0;

fn plan(seed: u64, ops: u64, size: u64) -> Vec<Op> {
    let mut r = Rng(seed | 1);
    let mut pick = |len: u64| 4096 + r.next() % (size - 4096 - len);
    (0..ops)
        .map(|_| {
            let kind = pick(0) % 8;
            let len = 1 + pick(0) % MAX_LEN;
            match kind {
                0..=4 => Op::WriteRead {
                    lo: pick(len),
                    ro: pick(len),
                    so: pick(len),
                    len,
                },
                5 | 6 => Op::Send { lo: pick(len), len },
                _ => Op::Add,
            }
        })
        .collect()
}

fn pattern(i: u64, len: u64) -> impl Iterator<Item = u8> {
    let mut x = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    })
}

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

struct Side {
    v: Verbs,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    /// The same CQ as an extended one (`--cq-ex`).
    cq_ex: *mut ibv_cq_ex,
    /// The CQ's completion channel (`--events`).
    channel: *mut ibv_comp_channel,
    /// Events taken and not yet acknowledged.
    unacked: u32,
    /// Events taken in all.
    events: u64,
    /// A completion found by the poll after arming, for the wait loop.
    pending: Option<(c_int, ibv_wc)>,
    buf: *mut u8,
    size: u64,
    lkey: u32,
    peer_addr: u64,
    peer_rkey: u32,
    vmpin_max: u64,
}

impl Side {
    fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), String> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: what verbs.h's ibv_post_send does, on a live QP.
        let rc = unsafe {
            ((*(*self.qp).context).ops.post_send.ok_or("no post_send")?)(self.qp, wr, &mut bad)
        };
        if rc != 0 {
            return Err(format!("post_send failed: errno {rc}"));
        }
        Ok(())
    }

    fn post_recv(&self, wr_id: u64, off: u64, len: u64) -> Result<(), String> {
        let mut s = ibv_sge {
            addr: self.buf as u64 + off,
            length: len as u32,
            lkey: self.lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut s,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: what verbs.h's ibv_post_recv does, on a live QP.
        let rc = unsafe {
            ((*(*self.qp).context).ops.post_recv.ok_or("no post_recv")?)(self.qp, &mut wr, &mut bad)
        };
        if rc != 0 {
            return Err(format!("post_recv failed: errno {rc}"));
        }
        Ok(())
    }

    /// One completion through an extended CQ's poll session (what verbs.h's ibv_start_poll,
    /// the ibv_wc_read_* functions and ibv_end_poll do); 0 if there was none.
    fn poll_ex(&mut self, wc: &mut ibv_wc) -> Result<c_int, String> {
        let cq = self.cq_ex;
        // SAFETY: the CQ's own functions, called as the inline functions call them.
        unsafe {
            let c = &*cq;
            let mut attr = ibv_poll_cq_attr::default();
            let rc = (c.start_poll.ok_or("no start_poll")?)(cq, &mut attr);
            if rc == libc::ENOENT {
                return Ok(0);
            }
            if rc != 0 {
                return Err(format!("start_poll failed: {rc}"));
            }
            let c = &*cq;
            wc.wr_id = c.wr_id;
            wc.status = c.status;
            wc.opcode = (c.read_opcode.ok_or("no read_opcode")?)(cq);
            wc.byte_len = c.read_byte_len.map_or(0, |f| f(cq));
            wc.imm_data = c.read_imm_data.map_or(0, |f| f(cq));
            wc.wc_flags = c.read_wc_flags.map_or(0, |f| f(cq));
            (c.end_poll.ok_or("no end_poll")?)(cq);
        }
        Ok(1)
    }

    fn wait(&mut self, want_wr_id: u64) -> Result<ibv_wc, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut wc = ibv_wc::default();
            let n = if let Some((n, w)) = self.pending.take() {
                wc = w;
                n
            } else if self.cq_ex.is_null() {
                // SAFETY: what verbs.h's ibv_poll_cq does, on a live CQ.
                unsafe {
                    ((*(*self.cq).context).ops.poll_cq.ok_or("no poll_cq")?)(self.cq, 1, &mut wc)
                }
            } else {
                self.poll_ex(&mut wc)?
            };
            if n < 0 {
                return Err("poll_cq failed".into());
            }
            if n == 1 {
                if wc.status != IBV_WC_SUCCESS {
                    return Err(format!(
                        "completion {} failed with status {}",
                        wc.wr_id, wc.status
                    ));
                }
                if wc.wr_id != want_wr_id {
                    return Err(format!(
                        "completion carries wr_id {} instead of {want_wr_id}",
                        wc.wr_id
                    ));
                }
                return Ok(wc);
            }
            if Instant::now() > deadline {
                return Err(format!("no completion for wr_id {want_wr_id} within 60 s"));
            }
            if !self.channel.is_null() {
                self.sleep_on_channel(deadline)?;
            }
        }
    }

    /// Arms the CQ and, unless a completion came in meanwhile, sleeps until its event.
    fn sleep_on_channel(&mut self, deadline: Instant) -> Result<(), String> {
        // SAFETY: what verbs.h's ibv_req_notify_cq does, on a live CQ.
        let rc = unsafe {
            ((*(*self.cq).context)
                .ops
                .req_notify_cq
                .ok_or("no req_notify_cq")?)(self.cq, 0)
        };
        if rc != 0 {
            return Err(format!("ibv_req_notify_cq failed: {rc}"));
        }
        // Poll after arming (a completion that came before the arm raised no event); hand
        // what it finds to the wait loop, and sleep only if the CQ is still empty.
        let mut wc = ibv_wc::default();
        // SAFETY: what verbs.h's ibv_poll_cq does, on a live CQ.
        let n = unsafe {
            ((*(*self.cq).context).ops.poll_cq.ok_or("no poll_cq")?)(self.cq, 1, &mut wc)
        };
        if n != 0 {
            self.pending = Some((n, wc));
            return Ok(());
        }
        // SAFETY: the channel's fd, polled for readability with a timeout.
        let fd = unsafe { (*self.channel).fd };
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(60_000) as c_int) };
        if r <= 0 {
            return Ok(()); // the caller's deadline check reports the timeout
        }
        let mut ev_cq = std::ptr::null_mut();
        let mut ev_ctx = std::ptr::null_mut();
        // SAFETY: a live channel with an event ready.
        if unsafe { (self.v.get_cq_event)(self.channel, &mut ev_cq, &mut ev_ctx) } != 0 {
            return Err("ibv_get_cq_event failed".into());
        }
        if ev_cq != self.cq {
            return Err("an event for a CQ that is not ours".into());
        }
        self.unacked += 1;
        self.events += 1;
        if self.unacked >= 16 {
            // SAFETY: events of this CQ taken above.
            unsafe { (self.v.ack_cq_events)(self.cq, self.unacked) };
            self.unacked = 0;
        }
        Ok(())
    }

    fn bytes(&mut self, off: u64, len: u64) -> &mut [u8] {
        // SAFETY: `off + len <= size` for every operation of the plan; the mapping lives as
        // long as the process and is only reached through `&mut self` here.
        unsafe { std::slice::from_raw_parts_mut(self.buf.add(off as usize), len as usize) }
    }

    fn rdma(&self, opcode: u32, wr_id: u64, remote: u64) -> ibv_send_wr {
        let mut w = ibv_send_wr::zeroed();
        w.wr_id = wr_id;
        w.opcode = opcode;
        w.send_flags = IBV_SEND_SIGNALED;
        w.set_rdma(self.peer_addr + remote, self.peer_rkey);
        w
    }
}

fn connect_qp(side: &Side, a: &Args, peer_qpn: u32, peer_gid: [u8; 16]) -> Result<(), String> {
    let modify = |attr: &mut ibv_qp_attr, mask: c_int, what: &str| -> Result<(), String> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { (side.v.modify_qp)(side.qp, attr, mask) };
        if rc != 0 {
            Err(format!("modify_qp to {what}: errno {rc}"))
        } else {
            Ok(())
        }
    };
    rc_to_rts(
        modify,
        IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC,
        3, // IBV_MTU_1024
        peer_qpn,
        peer_gid,
        a.gid_index,
    )
}

/// Exchanges (qpn, gid, addr, rkey) over TCP; returns the peer's and the stream.
fn exchange(a: &Args, mine: &[u8; 36]) -> Result<([u8; 36], TcpStream), String> {
    let mut s = match &a.connect {
        Some(host) => {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match TcpStream::connect((host.as_str(), a.port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", a.port)).map_err(|e| format!("listen: {e}"))?;
            l.accept().map_err(|e| format!("accept: {e}"))?.0
        }
    };
    s.write_all(mine).map_err(|e| e.to_string())?;
    let mut peer = [0u8; 36];
    s.read_exact(&mut peer).map_err(|e| e.to_string())?;
    Ok((peer, s))
}

fn run() -> Result<String, String> {
    let a = parse_args()?;
    let v = Verbs::load()?;
    let mut n = 0;
    // SAFETY: plain libibverbs calls with valid arguments; results are checked.
    let (ctx, pd, cq, cq_ex, channel, qp) = unsafe {
        let list = (v.get_device_list)(&mut n);
        if list.is_null() || n == 0 {
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
        let pd = if ctx.is_null() {
            std::ptr::null_mut()
        } else {
            (v.alloc_pd)(ctx)
        };
        let mut cq_ex: *mut ibv_cq_ex = std::ptr::null_mut();
        let channel = if a.events && !ctx.is_null() {
            let ch = (v.create_comp_channel)(ctx);
            if ch.is_null() {
                return Err("ibv_create_comp_channel failed".into());
            }
            ch
        } else {
            std::ptr::null_mut()
        };
        let cq = if pd.is_null() {
            std::ptr::null_mut()
        } else if a.cq_ex {
            cq_ex = create_cq_ex(ctx)?;
            cq_ex.cast::<ibv_cq>()
        } else {
            (v.create_cq)(ctx, 256, std::ptr::null_mut(), channel.cast(), 0)
        };
        if cq.is_null() {
            return Err("cannot open the device".into());
        }
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        let qp = (v.create_qp)(pd, &mut attr);
        if qp.is_null() {
            return Err("cannot create a QP".into());
        }
        (ctx, pd, cq, cq_ex, channel, qp)
    };
    // SAFETY: anonymous mapping, untouched; checked.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            a.size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if buf == libc::MAP_FAILED {
        return Err("cannot map the region".into());
    }
    let t_reg = Instant::now();
    let access = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    // SAFETY: a live PD and our mapping.
    let mr = unsafe { (v.reg_mr)(pd, buf, a.size as usize, access as c_int) };
    if mr.is_null() {
        return Err(format!(
            "ibv_reg_mr of {} bytes failed: {}",
            a.size,
            std::io::Error::last_os_error()
        ));
    }
    let reg_ms = t_reg.elapsed().as_secs_f64() * 1e3;
    // SAFETY: a live MR and QP.
    let (lkey, rkey, qpn) = unsafe { ((*mr).lkey, (*mr).rkey, (*qp).qp_num) };
    let mut gid = [0u8; 16];
    // SAFETY: a live context; `gid` is 16 writable bytes.
    if unsafe { (v.query_gid)(ctx, 1, a.gid_index, &mut gid) } != 0 {
        return Err("ibv_query_gid failed".into());
    }
    let mut mine = [0u8; 36];
    mine[0..4].copy_from_slice(&qpn.to_le_bytes());
    mine[4..20].copy_from_slice(&gid);
    mine[20..28].copy_from_slice(&(buf as u64).to_le_bytes());
    mine[28..32].copy_from_slice(&rkey.to_le_bytes());
    let (peer, mut stream) = exchange(&a, &mine)?;
    let mut side = Side {
        cq_ex,
        channel,
        unacked: 0,
        events: 0,
        pending: None,
        v,
        qp,
        cq,
        buf: buf.cast(),
        size: a.size,
        lkey,
        peer_addr: u64::from_le_bytes(peer[20..28].try_into().map_err(|_| "bad peer")?),
        peer_rkey: u32::from_le_bytes(peer[28..32].try_into().map_err(|_| "bad peer")?),
        vmpin_max: vm_pin(),
    };
    let mut peer_gid = [0u8; 16];
    peer_gid.copy_from_slice(&peer[4..20]);
    let peer_qpn = u32::from_le_bytes(peer[0..4].try_into().map_err(|_| "bad peer")?);
    let ops = plan(a.seed, a.ops, a.size);
    let sends: Vec<(u64, u64)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Op::Send { len, .. } => Some((i as u64, *len)),
            _ => None,
        })
        .collect();
    let role = if a.connect.is_some() {
        "client"
    } else {
        "server"
    };
    let mut moved = 0u64;
    let started = Instant::now();
    if a.connect.is_none() {
        // The server receives every SEND at a random offset of its own and checks it.
        let mut r = Rng(a.seed.rotate_left(17) | 1);
        let mut offs = std::collections::VecDeque::new();
        let depth = 4.min(sends.len() + 1);
        let mut next_post = 0usize;
        let total = sends.len() + 1; // + the final "done"
        let post =
            |side: &Side, r: &mut Rng, k: usize, offs: &mut std::collections::VecDeque<u64>| {
                let off = 4096 + r.next() % (side.size - 4096 - MAX_LEN);
                offs.push_back(off);
                side.post_recv(k as u64, off, MAX_LEN)
            };
        // Receives can be posted once the QP left RESET; the client starts after "R".
        connect_qp(&side, &a, peer_qpn, peer_gid)?;
        while next_post < depth {
            post(&side, &mut r, next_post, &mut offs)?;
            next_post += 1;
        }
        stream.write_all(b"R").map_err(|e| e.to_string())?;
        for k in 0..total {
            let wc = side.wait(k as u64)?;
            side.vmpin_max = side.vmpin_max.max(vm_pin());
            let off = offs.pop_front().ok_or("receive bookkeeping")?;
            if next_post < total {
                post(&side, &mut r, next_post, &mut offs)?;
                next_post += 1;
            }
            if k == sends.len() {
                if wc.imm_data != u32::MAX.to_be() {
                    return Err("the last message is not the end marker".into());
                }
                break;
            }
            let (i, len) = sends[k];
            if wc.imm_data != (i as u32).to_be() || u64::from(wc.byte_len) != len {
                return Err(format!(
                    "SEND {k}: got op {} ({} bytes), expected op {i} ({len} bytes)",
                    u32::from_be(wc.imm_data),
                    wc.byte_len
                ));
            }
            if !side.bytes(off, len).iter().copied().eq(pattern(i, len)) {
                return Err(format!("SEND of op {i}: received bytes differ"));
            }
            moved += len;
        }
    } else {
        connect_qp(&side, &a, peer_qpn, peer_gid)?;
        let mut ready = [0u8; 1];
        stream.read_exact(&mut ready).map_err(|e| e.to_string())?;
        let mut adds = 0u64;
        for (i, op) in ops.iter().enumerate() {
            let i = i as u64;
            side.vmpin_max = side.vmpin_max.max(vm_pin());
            match *op {
                Op::WriteRead { lo, ro, so, len } => {
                    for (b, p) in side.bytes(lo, len).iter_mut().zip(pattern(i, len)) {
                        *b = p;
                    }
                    let mut s = ibv_sge {
                        addr: side.buf as u64 + lo,
                        length: len as u32,
                        lkey,
                    };
                    let mut w = side.rdma(IBV_WR_RDMA_WRITE, 2 * i, ro);
                    w.sg_list = &mut s;
                    w.num_sge = 1;
                    side.post_send(&mut w)?;
                    side.wait(2 * i)?;
                    let mut s = ibv_sge {
                        addr: side.buf as u64 + so,
                        length: len as u32,
                        lkey,
                    };
                    let mut w = side.rdma(IBV_WR_RDMA_READ, 2 * i + 1, ro);
                    w.sg_list = &mut s;
                    w.num_sge = 1;
                    side.post_send(&mut w)?;
                    side.wait(2 * i + 1)?;
                    if !side.bytes(so, len).iter().copied().eq(pattern(i, len)) {
                        return Err(format!("op {i}: bytes read back differ from those written"));
                    }
                    moved += 2 * len;
                }
                Op::Send { lo, len } => {
                    for (b, p) in side.bytes(lo, len).iter_mut().zip(pattern(i, len)) {
                        *b = p;
                    }
                    let mut s = ibv_sge {
                        addr: side.buf as u64 + lo,
                        length: len as u32,
                        lkey,
                    };
                    let mut w = ibv_send_wr::zeroed();
                    w.wr_id = 2 * i;
                    w.opcode = IBV_WR_SEND_WITH_IMM;
                    w.imm_data = (i as u32).to_be();
                    w.send_flags = IBV_SEND_SIGNALED;
                    w.sg_list = &mut s;
                    w.num_sge = 1;
                    side.post_send(&mut w)?;
                    side.wait(2 * i)?;
                    moved += len;
                }
                Op::Add => {
                    let mut s = ibv_sge {
                        addr: side.buf as u64 + 64,
                        length: 8,
                        lkey,
                    };
                    let mut w = ibv_send_wr::zeroed();
                    w.wr_id = 2 * i;
                    w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
                    w.send_flags = IBV_SEND_SIGNALED;
                    w.sg_list = &mut s;
                    w.num_sge = 1;
                    w.set_atomic(side.peer_addr + COUNTER, 1, 0, side.peer_rkey);
                    side.post_send(&mut w)?;
                    side.wait(2 * i)?;
                    let old = u64::from_le_bytes(side.bytes(64, 8).try_into().map_err(|_| "x")?);
                    if old != adds {
                        return Err(format!("fetch-and-add {adds} returned {old}"));
                    }
                    adds += 1;
                }
            }
        }
        // Read the counter back: every add landed exactly once.
        let mut s = ibv_sge {
            addr: side.buf as u64 + 128,
            length: 8,
            lkey,
        };
        let mut w = side.rdma(IBV_WR_RDMA_READ, u64::MAX - 1, COUNTER);
        w.sg_list = &mut s;
        w.num_sge = 1;
        side.post_send(&mut w)?;
        side.wait(u64::MAX - 1)?;
        let counter = u64::from_le_bytes(side.bytes(128, 8).try_into().map_err(|_| "x")?);
        if counter != adds {
            return Err(format!("remote counter is {counter} after {adds} adds"));
        }
        // The end marker.
        let mut w = ibv_send_wr::zeroed();
        w.wr_id = u64::MAX;
        w.opcode = IBV_WR_SEND_WITH_IMM;
        w.imm_data = u32::MAX.to_be();
        w.send_flags = IBV_SEND_SIGNALED;
        side.post_send(&mut w)?;
        side.wait(u64::MAX)?;
    }
    side.vmpin_max = side.vmpin_max.max(vm_pin());
    let secs = started.elapsed().as_secs_f64();
    // The library's own view of this process (its status page), if it is active.
    let lib = std::env::var_os("NPRDMA_STATUS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| nprdma::config::default_status_dir(nprdma::config::current_uid()))
        .join(format!("{}.status", std::process::id()));
    let report = nprdma::status::read_file(&lib).ok();
    let mut line = format!(
        "STRESS {role}: ops={} bytes_verified={moved} time={secs:.1}s reg_1st={reg_ms:.2}ms vmpin_max={} budget={}",
        a.ops, side.vmpin_max, a.budget
    );
    if !side.channel.is_null() {
        line.push_str(&format!(" cq_events={}", side.events));
    }
    if let Some(r) = &report {
        line.push_str(&format!(
            " lib_pinned_peak={} lib_registered={} window_registrations={} evictions={} leases_granted={} remote_requests={}",
            r.pinned_peak, r.registered_bytes, r.window_registrations, r.evictions, r.leases_granted, r.remote_requests
        ));
    }
    if side.vmpin_max > a.budget {
        return Err(format!(
            "{line}\nVmPin reached {} bytes, above the budget",
            side.vmpin_max
        ));
    }
    match report {
        Some(r) if r.pinned_peak > a.budget => Err(format!(
            "{line}\nthe library counted {} pinned bytes, above the budget",
            r.pinned_peak
        )),
        Some(r) if r.registered_bytes < a.size => Err(format!(
            "{line}\nthe library does not see the region as unpinned"
        )),
        None if std::env::var_os("LD_PRELOAD").is_some() => Err(format!(
            "{line}\nthe library is preloaded but left no status page"
        )),
        _ => {
            // SAFETY: a live MR; the process exits next, which closes the device.
            unsafe { (side.v.dereg_mr)(mr) };
            Ok(line)
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("STRESS FAILED: {e}");
            println!("STRESS FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What verbs.h's inline `ibv_create_cq_ex` does: the context's `create_cq_ex`, asking for
/// byte counts and immediates only (the library adds what it needs itself).
///
/// # Safety
/// `ctx` is a live context.
unsafe fn create_cq_ex(ctx: *mut ibv_context) -> Result<*mut ibv_cq_ex, String> {
    // SAFETY: live context.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return Err("the device has no extended verbs (ibv_create_cq_ex)".into());
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: an extended context is the last field of its verbs_context (verbs_get_ctx).
    let vctx = unsafe { &*(ctx.cast::<u8>().sub(off).cast::<verbs_context>()) };
    if vctx.sz
        < std::mem::size_of::<verbs_context>() - std::mem::offset_of!(verbs_context, create_cq_ex)
    {
        return Err("the provider has no create_cq_ex".into());
    }
    let create = vctx
        .create_cq_ex
        .ok_or("the provider has no create_cq_ex")?;
    let mut attr = ibv_cq_init_attr_ex {
        cqe: 256,
        cq_context: std::ptr::null_mut(),
        channel: std::ptr::null_mut(),
        comp_vector: 0,
        wc_flags: IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM,
        comp_mask: 0,
        flags: 0,
        parent_domain: std::ptr::null_mut(),
    };
    // SAFETY: the provider's (or the library's) create_cq_ex with valid attributes.
    let cq = unsafe { create(ctx, &mut attr) };
    if cq.is_null() {
        return Err(format!(
            "ibv_create_cq_ex failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(cq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_deterministic_and_in_bounds() {
        let a = plan(42, 500, 1 << 30);
        assert!(a == plan(42, 500, 1 << 30), "same seed, same plan");
        assert!(a != plan(100, 500, 1 << 30), "another seed, another plan");
        for op in &a {
            if let Op::WriteRead { lo, ro, so, len } = *op {
                assert!((1..=MAX_LEN).contains(&len));
                for o in [lo, ro, so] {
                    assert!(o >= 4096 && o + len <= 1 << 30);
                }
            }
        }
        assert!(a.iter().any(|o| matches!(o, Op::Send { .. })));
        assert!(a.iter().any(|o| matches!(o, Op::Add)));
    }

    #[test]
    fn patterns_differ_per_operation() {
        assert!(!pattern(1, 64).eq(pattern(2, 64)));
        assert!(pattern(5, 100).eq(pattern(5, 100)));
    }
}
