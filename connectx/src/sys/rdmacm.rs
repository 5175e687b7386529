//! The part of librdmacm's ABI (`<rdma/rdma_cma.h>`, rdma-core) that the control connection
//! uses, layout-checked against the installed header like the verbs declarations.
//!
//! `rdma_cm_id` and `rdma_cm_event` are allocated by librdmacm and only read here, so they are
//! declared up to the last field read; `rdma_conn_param` is passed in and declared whole.

#![allow(non_camel_case_types)]

use core::ffi::{c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};

use super::layout as l;
use super::{ibv_context, ibv_qp};

/// `RDMA_PS_TCP`: the port space of rdma_cm's reliable connections.
pub const RDMA_PS_TCP: c_uint = 0x0106;

/// `enum rdma_cm_event_type` values.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_uint = 0;
/// `RDMA_CM_EVENT_ADDR_ERROR`.
pub const RDMA_CM_EVENT_ADDR_ERROR: c_uint = 1;
/// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_uint = 2;
/// `RDMA_CM_EVENT_ROUTE_ERROR`.
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_uint = 3;
/// `RDMA_CM_EVENT_CONNECT_REQUEST`.
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_uint = 5;
/// `RDMA_CM_EVENT_CONNECT_ERROR`.
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_uint = 6;
/// `RDMA_CM_EVENT_UNREACHABLE`.
pub const RDMA_CM_EVENT_UNREACHABLE: c_uint = 7;
/// `RDMA_CM_EVENT_REJECTED`.
pub const RDMA_CM_EVENT_REJECTED: c_uint = 8;
/// `RDMA_CM_EVENT_ESTABLISHED`.
pub const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
/// `RDMA_CM_EVENT_DISCONNECTED`.
pub const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;
/// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_uint = 11;
/// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_uint = 15;

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    /// The descriptor that becomes readable when an event is pending.
    pub fd: c_int,
}

/// `struct rdma_cm_id`, up to the route's destination address.
#[repr(C)]
pub struct rdma_cm_id {
    /// The verbs context of the device the id is bound to (librdmacm's own context).
    pub verbs: *mut ibv_context,
    /// `channel`.
    pub channel: *mut rdma_event_channel,
    /// `context`: the user's pointer.
    pub context: *mut c_void,
    /// The QP created on the id, if any.
    pub qp: *mut ibv_qp,
    /// `route.addr.src_addr` (a `sockaddr_storage`).
    pub src_addr: [u8; 128],
    /// `route.addr.dst_addr` (a `sockaddr_storage`).
    pub dst_addr: [u8; 128],
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// `private_data`.
    pub private_data: *const c_void,
    /// `private_data_len`.
    pub private_data_len: u8,
    /// `responder_resources`.
    pub responder_resources: u8,
    /// `initiator_depth`.
    pub initiator_depth: u8,
    /// `flow_control`.
    pub flow_control: u8,
    /// `retry_count`.
    pub retry_count: u8,
    /// `rnr_retry_count`.
    pub rnr_retry_count: u8,
    /// `srq`.
    pub srq: u8,
    /// `qp_num`.
    pub qp_num: u32,
}

/// `struct rdma_cm_event`, with the connection parameters of its union.
#[repr(C)]
pub struct rdma_cm_event {
    /// The id the event is for (for a CONNECT_REQUEST, the new id).
    pub id: *mut rdma_cm_id,
    /// The listening id, for a CONNECT_REQUEST.
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: c_uint,
    /// `status`: for REJECTED, the reject reason of the transport.
    pub status: c_int,
    /// `param.conn`.
    pub conn: rdma_conn_param,
}

const _: () = assert!(size_of::<rdma_event_channel>() == l::SIZE_RDMA_EVENT_CHANNEL);
const _: () = assert!(offset_of!(rdma_event_channel, fd) == l::OFF_RDMA_EVENT_CHANNEL_FD);
const _: () = assert!(offset_of!(rdma_cm_id, verbs) == l::OFF_RDMA_CM_ID_VERBS);
const _: () = assert!(offset_of!(rdma_cm_id, qp) == l::OFF_RDMA_CM_ID_QP);
const _: () = assert!(offset_of!(rdma_cm_id, dst_addr) == l::OFF_RDMA_CM_ID_ROUTE_ADDR_DST_ADDR);
const _: () = assert!(size_of::<rdma_conn_param>() == l::SIZE_RDMA_CONN_PARAM);
const _: () =
    assert!(offset_of!(rdma_conn_param, private_data) == l::OFF_RDMA_CONN_PARAM_PRIVATE_DATA);
const _: () = assert!(
    offset_of!(rdma_conn_param, private_data_len) == l::OFF_RDMA_CONN_PARAM_PRIVATE_DATA_LEN
);
const _: () = assert!(
    offset_of!(rdma_conn_param, responder_resources) == l::OFF_RDMA_CONN_PARAM_RESPONDER_RESOURCES
);
const _: () =
    assert!(offset_of!(rdma_conn_param, initiator_depth) == l::OFF_RDMA_CONN_PARAM_INITIATOR_DEPTH);
const _: () =
    assert!(offset_of!(rdma_conn_param, retry_count) == l::OFF_RDMA_CONN_PARAM_RETRY_COUNT);
const _: () =
    assert!(offset_of!(rdma_conn_param, rnr_retry_count) == l::OFF_RDMA_CONN_PARAM_RNR_RETRY_COUNT);
const _: () = assert!(offset_of!(rdma_conn_param, srq) == l::OFF_RDMA_CONN_PARAM_SRQ);
const _: () = assert!(offset_of!(rdma_conn_param, qp_num) == l::OFF_RDMA_CONN_PARAM_QP_NUM);
const _: () = assert!(offset_of!(rdma_cm_event, id) == l::OFF_RDMA_CM_EVENT_ID);
const _: () = assert!(offset_of!(rdma_cm_event, listen_id) == l::OFF_RDMA_CM_EVENT_LISTEN_ID);
const _: () = assert!(offset_of!(rdma_cm_event, event) == l::OFF_RDMA_CM_EVENT_EVENT);
const _: () = assert!(offset_of!(rdma_cm_event, status) == l::OFF_RDMA_CM_EVENT_STATUS);
const _: () = assert!(offset_of!(rdma_cm_event, conn) == l::OFF_RDMA_CM_EVENT_PARAM_CONN);
