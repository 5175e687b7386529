//! An extended CQ's records (`ibv_create_cq_ex`): the provider's functions the library
//! wrapped, and the state of the application's poll session. The session logic is in
//! crate::cq_ex (the functions the library installs) and crate::engine::poll.

use core::ffi::{c_int, c_void};

use crate::sys::*;

/// The provider's functions of an extended CQ.
#[derive(Clone, Copy)]
pub(crate) struct CqExFns {
    pub(crate) start_poll: unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int,
    pub(crate) next_poll: unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int,
    pub(crate) end_poll: unsafe extern "C" fn(*mut ibv_cq_ex),
    pub(crate) read_opcode: Option<CqExReadU32>,
    pub(crate) read_vendor_err: Option<CqExReadU32>,
    pub(crate) read_byte_len: Option<CqExReadU32>,
    pub(crate) read_imm_data: Option<CqExReadU32>,
    pub(crate) read_qp_num: Option<CqExReadU32>,
    pub(crate) read_src_qp: Option<CqExReadU32>,
    pub(crate) read_wc_flags: Option<CqExReadU32>,
    pub(crate) read_slid: Option<CqExReadU32>,
    pub(crate) read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub(crate) read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub(crate) read_completion_ts: Option<CqExReadU64>,
    pub(crate) read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub(crate) read_flow_tag: Option<CqExReadU32>,
    pub(crate) read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    pub(crate) read_completion_wallclock_ns: Option<CqExReadU64>,
}

/// A completion held by the library rather than the provider: everything its readers return.
#[derive(Clone, Copy, Default)]
pub(crate) struct Held {
    pub(crate) wc: ibv_wc,
    pub(crate) ts: u64,
    pub(crate) wallclock_ns: u64,
    pub(crate) cvlan: u16,
    pub(crate) flow_tag: u32,
}

/// Which completion the application is looking at.
#[derive(Clone, Copy, Default)]
pub(crate) enum Current {
    /// No session, or the session ran out.
    #[default]
    Idle,
    /// One the library holds: stashed earlier, or the provider's that the library had to move
    /// past while the application was looking at it.
    Held(Held),
    /// The provider's current one.
    Provider,
}

/// An extended CQ's poll session (under the CQ's lock).
#[derive(Default)]
pub(crate) struct Session {
    /// Between a successful `start_poll` and `end_poll`.
    pub(crate) active: bool,
    pub(crate) current: Current,
    /// Whether the provider's own session is open (its `end_poll` is owed).
    pub(crate) provider_open: bool,
    /// The thread that started the session.
    pub(crate) owner: usize,
    /// The application's `start_poll` attributes, for a provider session started later.
    pub(crate) attr: ibv_poll_cq_attr,
}

impl Session {
    /// Whether the provider's own session is open (it holds the provider's CQ lock until its
    /// `end_poll`, so nobody else may poll the provider meanwhile while holding the stash).
    pub(crate) fn provider_open(&self) -> bool {
        self.provider_open
    }

    /// Whether the calling thread opened the session.
    pub(crate) fn owned_here(&self) -> bool {
        self.owner == crate::engine::call::this_thread()
    }
}
