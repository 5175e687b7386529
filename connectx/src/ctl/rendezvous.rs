//! The control connection itself: listening on a pair's port, connecting to it, and fixed-size
//! messages over the resulting RC QP pair (docs/connectx.md §13).
//!
//! Everything here is the library's own: an rdma_cm id and event channel, a protection domain,
//! a CQ, a QP and one page of message buffers registered for local access only. The QP carries
//! SENDs only; nothing in its protection domain is registered for remote access, so a peer at
//! the other end can reach no memory of this process through it, whatever it sends.
//!
//! Calls block up to a deadline the caller gives; nothing waits without one.

use core::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::cm::{Cm, LoadError};
use super::pair::{
    Answer, Pair, PairError, Refusal, decode_answer, decode_hello, encode_answer, encode_hello,
};
use crate::sys::rdmacm::*;
use crate::sys::*;

/// The size of one control message.
pub const MSG_LEN: usize = super::msg::MSG_LEN;

/// Receive buffers kept posted (the peer never has more than this many messages in flight:
/// the protocol on top answers each request before the next).
const RECV_SLOTS: usize = 16;

/// Bytes a channel pins: its message buffers are one aligned page.
pub const PINNED_PER_CHANNEL: u64 = 4096;

/// The message buffers (`RECV_SLOTS` receives, then one send), one aligned page, so that the
/// registration pins exactly [`PINNED_PER_CHANNEL`] bytes.
#[repr(C, align(4096))]
struct Page([[u8; MSG_LEN]; 4096 / MSG_LEN]);

const _: () = assert!(RECV_SLOTS < 4096 / MSG_LEN && core::mem::size_of::<Page>() == 4096);

/// Where the control connections listen and how long one step may take.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// First port of the range.
    pub port_base: u16,
    /// Number of ports in the range.
    pub port_span: u16,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            port_base: super::pair::DEFAULT_PORT_BASE,
            port_span: super::pair::DEFAULT_PORT_SPAN,
        }
    }
}

/// Why a control connection could not be made or used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CtlError {
    /// librdmacm or a verbs function is missing.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The pair cannot have a control connection.
    #[error(transparent)]
    Pair(#[from] PairError),
    /// An rdma_cm or verbs call failed.
    #[error("{op} failed: errno {errno}")]
    Call {
        /// The call.
        op: &'static str,
        /// Its errno.
        errno: i32,
    },
    /// Every port the pair may use is taken by other listeners on this host.
    #[error("all {0} control ports of this pair are in use on this host")]
    NoPort(usize),
    /// Nobody accepted the pair before the deadline: the peer runs without the library, or
    /// has not reached RTR yet, or cannot be reached.
    #[error("no listener accepted the pair on any of its {ports} ports ({rounds} rounds)")]
    NoListener {
        /// Ports per round.
        ports: usize,
        /// Rounds tried.
        rounds: u32,
    },
    /// The deadline passed while waiting for an event or a completion.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// A message's work request completed with an error status (the connection is gone).
    #[error("a control message completed with status {0}")]
    Completion(u32),
    /// The peer disconnected.
    #[error("the peer closed the control connection")]
    Closed,
}

type Result<T> = core::result::Result<T, CtlError>;

fn call(op: &'static str) -> impl FnOnce(i32) -> CtlError {
    move |errno| CtlError::Call { op, errno }
}

/// An event, copied out of librdmacm's buffer (which is returned at once).
struct Event {
    kind: u32,
    status: i32,
    id: *mut rdma_cm_id,
    listen_id: *mut rdma_cm_id,
    data: Vec<u8>,
}

/// The next event on `ch`, or a timeout at `deadline`.
fn next_event(cm: &Cm, ch: *mut rdma_event_channel, deadline: Instant) -> Result<Event> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CtlError::Timeout("an rdma_cm event"));
        }
        // SAFETY: `ch` is live (the caller's), its fd a descriptor of this process.
        let fd = unsafe { (*ch).fd };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = c_int::try_from(left.as_millis().clamp(1, 1000)).unwrap_or(1000);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if e == libc::EINTR {
                continue;
            }
            return Err(CtlError::Call {
                op: "poll",
                errno: e,
            });
        }
        if n == 0 {
            continue;
        }
        // SAFETY: a live channel with an event pending, so this does not block.
        let ev = unsafe { cm.get_cm_event(ch) }.map_err(call("rdma_get_cm_event"))?;
        // SAFETY: librdmacm's event, valid until acknowledged below; its private data (if
        // any) is `private_data_len` bytes.
        let copied = unsafe {
            let e = &*ev;
            let data = if e.conn.private_data.is_null() {
                Vec::new()
            } else {
                core::slice::from_raw_parts(
                    e.conn.private_data.cast::<u8>(),
                    usize::from(e.conn.private_data_len),
                )
                .to_vec()
            };
            Event {
                kind: e.event,
                status: e.status,
                id: e.id,
                listen_id: e.listen_id,
                data,
            }
        };
        // SAFETY: the event came from get_cm_event and is not used again.
        unsafe { cm.ack_cm_event(ev) };
        return Ok(copied);
    }
}

fn sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { core::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { core::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// The IP address in a `sockaddr_storage`'s bytes (IPv4-mapped IPv6 as IPv4).
fn ip_of(bytes: &[u8; 128]) -> Option<IpAddr> {
    let family = i32::from(u16::from_ne_bytes([bytes[0], bytes[1]]));
    if family == libc::AF_INET {
        Some(IpAddr::from([bytes[4], bytes[5], bytes[6], bytes[7]]))
    } else if family == libc::AF_INET6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&bytes[8..24]);
        let v6 = std::net::Ipv6Addr::from(a);
        Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        })
    } else {
        None
    }
}

/// The verbs objects of one control connection.
struct Resources {
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    mr: *mut ibv_mr,
    /// RECV_SLOTS receive buffers, then one send buffer.
    buf: Box<Page>,
}

impl Resources {
    /// # Safety
    /// `ctx` is the live verbs context of the id the QP will be created on.
    unsafe fn new(cm: &Cm, ctx: *mut ibv_context) -> Result<Self> {
        let mut r = Resources {
            pd: core::ptr::null_mut(),
            cq: core::ptr::null_mut(),
            mr: core::ptr::null_mut(),
            buf: Box::new(Page([[0u8; MSG_LEN]; 4096 / MSG_LEN])),
        };
        // SAFETY: the caller's promise.
        r.pd = unsafe { cm.alloc_pd(ctx) };
        if r.pd.is_null() {
            return Err(CtlError::Call {
                op: "ibv_alloc_pd",
                errno: libc::ENOMEM,
            });
        }
        // SAFETY: as above; room for every send and receive completion.
        r.cq = unsafe { cm.create_cq(ctx, (2 * RECV_SLOTS + 2) as c_int) };
        if r.cq.is_null() {
            // SAFETY: the PD just allocated, empty.
            unsafe { r.release(cm) };
            return Err(CtlError::Call {
                op: "ibv_create_cq",
                errno: libc::ENOMEM,
            });
        }
        let len = core::mem::size_of::<Page>();
        // SAFETY: the boxed page stays allocated (and does not move) until `release`.
        r.mr = unsafe { cm.reg_local_mr(r.pd, r.buf.0.as_mut_ptr().cast(), len) };
        if r.mr.is_null() {
            // SAFETY: the CQ and PD just made, unused.
            unsafe { r.release(cm) };
            return Err(CtlError::Call {
                op: "ibv_reg_mr",
                errno: libc::ENOMEM,
            });
        }
        Ok(r)
    }

    /// # Safety
    /// No QP uses the CQ or PD any more and no work request is outstanding.
    unsafe fn release(&mut self, cm: &Cm) {
        // SAFETY: each object is live if non-null and unused, per the caller.
        unsafe {
            if !self.mr.is_null() {
                cm.dereg_mr(self.mr);
            }
            if !self.cq.is_null() {
                cm.destroy_cq(self.cq);
            }
            if !self.pd.is_null() {
                cm.dealloc_pd(self.pd);
            }
        }
        self.mr = core::ptr::null_mut();
        self.cq = core::ptr::null_mut();
        self.pd = core::ptr::null_mut();
    }

    fn qp_attr(&self) -> ibv_qp_init_attr {
        ibv_qp_init_attr {
            qp_context: core::ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: core::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: RECV_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        }
    }
}

/// A pair's listener, bound to one of its ports.
pub struct Listening {
    cm: &'static Cm,
    ch: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
    pair: Pair,
    port: u16,
}

// SAFETY: the rdma_cm objects are used by one thread at a time (the owner of this value);
// librdmacm allows ids and channels to move between threads.
unsafe impl Send for Listening {}

impl Listening {
    /// Binds the first free port of `pair` at the listener's address and listens.
    pub fn open(pair: Pair, s: &Settings) -> Result<Listening> {
        let cm = Cm::get()?;
        let ports = pair.ports(s.port_base, s.port_span)?;
        let ch = cm
            .create_event_channel()
            .map_err(call("rdma_create_event_channel"))?;
        for &port in &ports {
            // SAFETY: a live channel.
            let id = match unsafe { cm.create_id(ch) } {
                Ok(id) => id,
                Err(e) => {
                    // SAFETY: the channel has no ids.
                    unsafe { cm.destroy_event_channel(ch) };
                    return Err(call("rdma_create_id")(e));
                }
            };
            let addr = sockaddr(pair.listen_addr(port)?);
            // SAFETY: a live id and a socket address of the right size for its family.
            let bound =
                unsafe { cm.bind_addr(id, (&addr as *const libc::sockaddr_storage).cast()) }
                    .and_then(|()| {
                        // SAFETY: a live, bound id.
                        unsafe { cm.listen(id, 8) }
                    });
            match bound {
                Ok(()) => {
                    return Ok(Listening {
                        cm,
                        ch,
                        id,
                        pair,
                        port,
                    });
                }
                Err(e) => {
                    // SAFETY: an id with no QP and no pending events.
                    unsafe { cm.destroy_id(id) };
                    if e != libc::EADDRINUSE {
                        // SAFETY: the channel has no ids left.
                        unsafe { cm.destroy_event_channel(ch) };
                        return Err(call("rdma_bind_addr/rdma_listen")(e));
                    }
                }
            }
        }
        // SAFETY: the channel has no ids left.
        unsafe { cm.destroy_event_channel(ch) };
        Err(CtlError::NoPort(ports.len()))
    }

    /// The port this listener holds.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits for the pair's connector until `deadline`; requests for other pairs (or from
    /// another address than the pair's connector) are refused meanwhile. The port is free
    /// again once this returns.
    pub fn accept(self, deadline: Instant) -> Result<Channel> {
        let cm = self.cm;
        let want_ip = self.pair.connector.ip()?;
        loop {
            let ev = next_event(cm, self.ch, deadline)?;
            if ev.kind != RDMA_CM_EVENT_CONNECT_REQUEST || ev.listen_id != self.id {
                continue;
            }
            let asked = decode_hello(&ev.data);
            // SAFETY: the new id of a CONNECT_REQUEST is live until destroyed.
            let from = unsafe { ip_of(&(*ev.id).dst_addr) };
            let refusal = match asked {
                None => Some(Refusal::Malformed),
                Some(p) if p != self.pair || from != Some(want_ip) => Some(Refusal::NotMine),
                Some(_) => None,
            };
            if let Some(r) = refusal {
                let ans = encode_answer(&asked.unwrap_or(self.pair), Answer::Refused(r));
                // SAFETY: the request's live id; rejected, then destroyed, never used again.
                unsafe {
                    let _ = cm.reject(ev.id, &ans);
                    cm.destroy_id(ev.id);
                }
                continue;
            }
            // SAFETY: the request's live id, bound to a device.
            match unsafe { Channel::establish_passive(cm, self.ch, ev.id, self.pair, deadline) } {
                Ok(mut c) => {
                    c.port = self.port;
                    // The listening id goes now; `self`'s drop would take the channel too.
                    let me = core::mem::ManuallyDrop::new(self);
                    // SAFETY: the listening id has no QP and its events were acknowledged.
                    unsafe { cm.destroy_id(me.id) };
                    return Ok(c);
                }
                Err(CtlError::Timeout(w)) => return Err(CtlError::Timeout(w)),
                // The connector went away mid-way: keep listening for it.
                Err(_) => continue,
            }
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        // SAFETY: the listening id (no QP) and its channel, not used again.
        unsafe {
            self.cm.destroy_id(self.id);
            self.cm.destroy_event_channel(self.ch);
        }
    }
}

/// Connects to `pair`'s listener, trying its ports in order, in rounds until `deadline`.
pub fn connect(pair: Pair, s: &Settings, deadline: Instant) -> Result<Channel> {
    let cm = Cm::get()?;
    let ports = pair.ports(s.port_base, s.port_span)?;
    let mut rounds = 0u32;
    let mut pause = Duration::from_millis(20);
    loop {
        rounds += 1;
        for &port in &ports {
            match try_port(cm, pair, port, deadline) {
                Ok(c) => return Ok(c),
                Err(Attempt::Next) => {}
                // The deadline came in the middle of a port's attempt: nobody accepted.
                Err(Attempt::Fail(CtlError::Timeout(_))) => {
                    return Err(CtlError::NoListener {
                        ports: ports.len(),
                        rounds,
                    });
                }
                Err(Attempt::Fail(e)) => return Err(e),
            }
        }
        if Instant::now() + pause >= deadline {
            return Err(CtlError::NoListener {
                ports: ports.len(),
                rounds,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

enum Attempt {
    /// Nobody of this pair at that port (no listener, another pair's, unreachable).
    Next,
    Fail(CtlError),
}

fn try_port(
    cm: &'static Cm,
    pair: Pair,
    port: u16,
    deadline: Instant,
) -> core::result::Result<Channel, Attempt> {
    let fail = Attempt::Fail;
    let ch = cm
        .create_event_channel()
        .map_err(|e| fail(call("rdma_create_event_channel")(e)))?;
    // SAFETY: a live channel.
    let id = match unsafe { cm.create_id(ch) } {
        Ok(id) => id,
        Err(e) => {
            // SAFETY: the channel has no ids.
            unsafe { cm.destroy_event_channel(ch) };
            return Err(fail(call("rdma_create_id")(e)));
        }
    };
    let mut c = Channel {
        cm,
        ch,
        id,
        res: None,
        pair,
        port,
        stash: Vec::new(),
    };
    let dst = sockaddr(pair.listen_addr(port).map_err(|e| fail(e.into()))?);
    let step =
        |c: &mut Channel, want: u32, what: &'static str| -> core::result::Result<Event, Attempt> {
            let ev = next_event(cm, c.ch, deadline).map_err(Attempt::Fail)?;
            if ev.kind == want {
                Ok(ev)
            } else if matches!(
                ev.kind,
                RDMA_CM_EVENT_REJECTED | RDMA_CM_EVENT_UNREACHABLE | RDMA_CM_EVENT_CONNECT_ERROR
            ) {
                Err(Attempt::Next)
            } else {
                Err(Attempt::Fail(CtlError::Call {
                    op: what,
                    errno: ev.status.unsigned_abs() as i32,
                }))
            }
        };
    // SAFETY: a live id; `dst` a socket address of its family's size.
    unsafe { cm.resolve_addr(c.id, (&dst as *const libc::sockaddr_storage).cast(), 2000) }
        .map_err(|e| fail(call("rdma_resolve_addr")(e)))?;
    step(&mut c, RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_resolve_addr")?;
    // SAFETY: a live id with its address resolved.
    unsafe { cm.resolve_route(c.id, 2000) }.map_err(|e| fail(call("rdma_resolve_route")(e)))?;
    step(&mut c, RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_resolve_route")?;
    // SAFETY: the id is bound to its device now.
    unsafe { c.make_qp() }.map_err(fail)?;
    let hello = encode_hello(&pair);
    let mut param = conn_param(&hello);
    // SAFETY: a live id with a route and a QP; `hello` lives across the call.
    unsafe { cm.connect(c.id, &mut param) }.map_err(|e| fail(call("rdma_connect")(e)))?;
    let ev = match step(&mut c, RDMA_CM_EVENT_ESTABLISHED, "rdma_connect") {
        Ok(ev) => ev,
        Err(Attempt::Next) => return Err(Attempt::Next),
        Err(e) => return Err(e),
    };
    match decode_answer(&pair, &ev.data) {
        Some(Answer::Accepted) => Ok(c),
        // Established with something that is not our listener (an rdma_cm server of another
        // program that happens to use this port): leave it.
        _ => Err(Attempt::Next),
    }
}

fn conn_param(data: &[u8]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: data.as_ptr().cast(),
        private_data_len: u8::try_from(data.len()).unwrap_or(u8::MAX),
        // SENDs only: no RDMA READ or atomic in either direction.
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// An established control connection.
pub struct Channel {
    cm: &'static Cm,
    ch: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
    res: Option<Resources>,
    pair: Pair,
    port: u16,
    /// Receive slots whose message arrived while a send was being completed.
    stash: Vec<usize>,
}

// SAFETY: as for `Listening`: one thread at a time.
unsafe impl Send for Channel {}

impl Channel {
    /// # Safety
    /// `id` is the live id of an accepted CONNECT_REQUEST on `ch`.
    unsafe fn establish_passive(
        cm: &'static Cm,
        ch: *mut rdma_event_channel,
        id: *mut rdma_cm_id,
        pair: Pair,
        deadline: Instant,
    ) -> Result<Channel> {
        let mut c = Channel {
            cm,
            ch,
            id,
            res: None,
            pair,
            port: 0,
            stash: Vec::new(),
        };
        // The channel is the listener's: dropping `c` on failure must not destroy it.
        let fail = |mut c: Channel, e: CtlError| {
            c.teardown(false);
            core::mem::forget(c);
            Err(e)
        };
        // SAFETY: the id is bound to its device.
        if let Err(e) = unsafe { c.make_qp() } {
            return fail(c, e);
        }
        let ans = encode_answer(&pair, Answer::Accepted);
        let mut param = conn_param(&ans);
        // SAFETY: a live request id with a QP; `ans` lives across the call.
        if let Err(e) = unsafe { cm.accept(id, &mut param) } {
            return fail(c, call("rdma_accept")(e));
        }
        loop {
            match next_event(cm, ch, deadline) {
                Ok(ev) if ev.id == id && ev.kind == RDMA_CM_EVENT_ESTABLISHED => return Ok(c),
                Ok(ev) if ev.id == id => {
                    return fail(
                        c,
                        CtlError::Call {
                            op: "rdma_accept",
                            errno: ev.status.unsigned_abs() as i32,
                        },
                    );
                }
                Ok(ev) if ev.kind == RDMA_CM_EVENT_CONNECT_REQUEST => {
                    // Another request meanwhile: not the pair's (it has its connection now).
                    let ans = encode_answer(&pair, Answer::Refused(Refusal::NotMine));
                    // SAFETY: that request's live id, rejected and destroyed.
                    unsafe {
                        let _ = cm.reject(ev.id, &ans);
                        cm.destroy_id(ev.id);
                    }
                }
                Ok(_) => {}
                Err(e) => return fail(c, e),
            }
        }
    }

    /// Creates the QP on the id and posts every receive buffer.
    ///
    /// # Safety
    /// The id is bound to its device.
    unsafe fn make_qp(&mut self) -> Result<()> {
        // SAFETY: the id is live and bound, so `verbs` is its device's context.
        let ctx = unsafe { (*self.id).verbs };
        // SAFETY: as above.
        let res = unsafe { Resources::new(self.cm, ctx) }?;
        let mut attr = res.qp_attr();
        let pd = res.pd;
        self.res = Some(res);
        // SAFETY: the id is bound to the device of `pd` and of the CQ in `attr`.
        unsafe { self.cm.create_qp(self.id, pd, &mut attr) }.map_err(call("rdma_create_qp"))?;
        for slot in 0..RECV_SLOTS {
            self.post_recv(slot)?;
        }
        Ok(())
    }

    fn qp(&self) -> *mut ibv_qp {
        // SAFETY: the id is live while `self` is.
        unsafe { (*self.id).qp }
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let Some(res) = self.res.as_mut() else {
            return Err(CtlError::Closed);
        };
        let mut sge = ibv_sge {
            addr: res.buf.0[slot].as_mut_ptr() as u64,
            length: MSG_LEN as u32,
            // SAFETY: the MR is live while `res` is.
            lkey: unsafe { (*res.mr).lkey },
        };
        let mut wr = ibv_recv_wr {
            wr_id: slot as u64,
            next: core::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let qp = self.qp();
        let mut bad = core::ptr::null_mut();
        // SAFETY: a live QP of a live context; the ops are the provider's (librdmacm's context
        // was opened inside RealCall, so the library never wrapped it) or the library's
        // pass-through for an unmanaged QP.
        let rc = unsafe {
            match (*(*qp).context).ops.post_recv {
                Some(f) => f(qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(CtlError::Call {
                op: "ibv_post_recv",
                errno: rc,
            })
        }
    }

    /// Polls one completion, or `None` when the CQ is empty.
    fn poll_one(&mut self) -> Result<Option<ibv_wc>> {
        let Some(res) = self.res.as_ref() else {
            return Err(CtlError::Closed);
        };
        let cq = res.cq;
        let mut wc = ibv_wc::default();
        // SAFETY: a live CQ of a live context; one ibv_wc of room.
        let n = unsafe {
            match (*(*cq).context).ops.poll_cq {
                Some(f) => f(cq, 1, &mut wc),
                None => -1,
            }
        };
        match n {
            0 => Ok(None),
            1 if wc.status == IBV_WC_SUCCESS => Ok(Some(wc)),
            1 => Err(CtlError::Completion(wc.status)),
            _ => Err(CtlError::Call {
                op: "ibv_poll_cq",
                errno: libc::EIO,
            }),
        }
    }

    fn pause(spins: &mut u32) {
        *spins += 1;
        if *spins > 64 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            core::hint::spin_loop();
        }
    }

    /// Sends one message and waits (until `deadline`) for its completion.
    pub fn send(&mut self, msg: &[u8; MSG_LEN], deadline: Instant) -> Result<()> {
        let Some(res) = self.res.as_mut() else {
            return Err(CtlError::Closed);
        };
        let slot = RECV_SLOTS;
        res.buf.0[slot] = *msg;
        let mut sge = ibv_sge {
            addr: res.buf.0[slot].as_mut_ptr() as u64,
            length: MSG_LEN as u32,
            // SAFETY: the MR is live while `res` is.
            lkey: unsafe { (*res.mr).lkey },
        };
        // SAFETY: all-zero is a valid ibv_send_wr (no next, no flags).
        let mut wr: ibv_send_wr = unsafe { core::mem::zeroed() };
        wr.wr_id = u64::MAX;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        let qp = self.qp();
        let mut bad = core::ptr::null_mut();
        // SAFETY: as in `post_recv`.
        let rc = unsafe {
            match (*(*qp).context).ops.post_send {
                Some(f) => f(qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(CtlError::Call {
                op: "ibv_post_send",
                errno: rc,
            });
        }
        let mut spins = 0;
        loop {
            match self.poll_one()? {
                Some(wc) if wc.opcode == IBV_WC_SEND => return Ok(()),
                Some(wc) => self.stash.push(wc.wr_id as usize),
                None if Instant::now() >= deadline => {
                    return Err(CtlError::Timeout("a control message's send completion"));
                }
                None => Self::pause(&mut spins),
            }
        }
    }

    /// The next message from the peer, waiting until `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Result<[u8; MSG_LEN]> {
        let mut spins = 0;
        loop {
            if let Some(m) = self.try_recv()? {
                return Ok(m);
            }
            if Instant::now() >= deadline {
                return Err(CtlError::Timeout("a control message"));
            }
            Self::pause(&mut spins);
        }
    }

    /// The next message from the peer if one has arrived, without waiting.
    pub fn try_recv(&mut self) -> Result<Option<[u8; MSG_LEN]>> {
        let slot = loop {
            if !self.stash.is_empty() {
                break self.stash.remove(0);
            }
            match self.poll_one()? {
                Some(wc) if wc.opcode == IBV_WC_RECV => break wc.wr_id as usize,
                // A send's completion (its sender waited for it already).
                Some(_) => {}
                None => return Ok(None),
            }
        };
        let Some(res) = self.res.as_ref() else {
            return Err(CtlError::Closed);
        };
        let Some(msg) = res.buf.0.get(slot).copied() else {
            return Err(CtlError::Completion(IBV_WC_SUCCESS));
        };
        self.post_recv(slot)?;
        Ok(Some(msg))
    }

    /// Waits until the peer closes the connection (or `deadline`). A message's sender knows it
    /// arrived only from its send completion, which needs the receiver's acknowledgement, and
    /// a receiver that goes away right after its last receive may take that acknowledgement
    /// with it (rxe completes a receive before it acknowledges). So the side that sends last
    /// waits for its completion and then drops the connection; the other side waits here.
    pub fn wait_closed(&mut self, deadline: Instant) -> Result<()> {
        loop {
            let ev = next_event(self.cm, self.ch, deadline)?;
            if ev.id == self.id && ev.kind == RDMA_CM_EVENT_DISCONNECTED {
                return Ok(());
            }
        }
    }

    /// The pair this connection serves.
    pub fn pair(&self) -> Pair {
        self.pair
    }

    /// The port the connection was made on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Disconnects and frees everything but (unless `own_channel`) the event channel.
    fn teardown(&mut self, own_channel: bool) {
        let cm = self.cm;
        // SAFETY: the id is live; after disconnect the QP is in error and completes nothing
        // more into buffers that are released below.
        unsafe {
            if !self.qp().is_null() {
                cm.disconnect(self.id);
                cm.destroy_qp(self.id);
            }
            if let Some(mut res) = self.res.take() {
                res.release(cm);
            }
            cm.destroy_id(self.id);
            if own_channel {
                cm.destroy_event_channel(self.ch);
            }
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.teardown(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_sockaddr_storage() {
        for s in ["192.0.2.7:20048", "[2001:db8::5]:20049"] {
            let a: SocketAddr = s.parse().unwrap();
            let ss = sockaddr(a);
            // SAFETY: sockaddr_storage is 128 plain bytes.
            let bytes: [u8; 128] = unsafe { core::mem::transmute(ss) };
            assert_eq!(ip_of(&bytes), Some(a.ip()));
        }
        assert_eq!(ip_of(&[0u8; 128]), None);
    }
}
