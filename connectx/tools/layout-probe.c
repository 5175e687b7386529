/* Prints the size and field offsets of the rdma-core structs that connectx's `sys` module
 * declares, one "name value" pair per line. tools/gen-layout.sh turns the output into
 * src/sys/layout.rs; tests/layout.rs re-runs it against the installed headers. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SZ(t) printf("SIZE_%s %zu\n", #t, sizeof(struct t))
#define OFF(t, f) printf("OFF_%s_%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	SZ(ibv_context_ops);
	OFF(ibv_context_ops, poll_cq); OFF(ibv_context_ops, req_notify_cq);
	OFF(ibv_context_ops, post_srq_recv); OFF(ibv_context_ops, post_send);
	OFF(ibv_context_ops, post_recv); OFF(ibv_context_ops, bind_mw);
	SZ(ibv_context);
	OFF(ibv_context, device); OFF(ibv_context, ops); OFF(ibv_context, cmd_fd);
	OFF(ibv_context, async_fd); OFF(ibv_context, num_comp_vectors);
	OFF(ibv_context, mutex); OFF(ibv_context, abi_compat);
	SZ(verbs_context);
	OFF(verbs_context, create_cq_ex); OFF(verbs_context, create_qp_ex);
	OFF(verbs_context, query_device_ex);
	OFF(verbs_context, sz); OFF(verbs_context, context);
	SZ(ibv_cq_ex);
	OFF(ibv_cq_ex, context); OFF(ibv_cq_ex, cqe); OFF(ibv_cq_ex, comp_mask);
	OFF(ibv_cq_ex, status); OFF(ibv_cq_ex, wr_id); OFF(ibv_cq_ex, start_poll);
	OFF(ibv_cq_ex, read_opcode); OFF(ibv_cq_ex, read_qp_num); OFF(ibv_cq_ex, read_completion_ts);
	OFF(ibv_cq_ex, read_completion_wallclock_ns);
	SZ(ibv_cq_init_attr_ex); OFF(ibv_cq_init_attr_ex, wc_flags);
	OFF(ibv_cq_init_attr_ex, parent_domain);
	SZ(ibv_pd); OFF(ibv_pd, context); OFF(ibv_pd, handle);
	SZ(ibv_mr);
	OFF(ibv_mr, context); OFF(ibv_mr, pd); OFF(ibv_mr, addr); OFF(ibv_mr, length);
	OFF(ibv_mr, handle); OFF(ibv_mr, lkey); OFF(ibv_mr, rkey);
	SZ(ibv_cq);
	OFF(ibv_cq, context); OFF(ibv_cq, channel); OFF(ibv_cq, cq_context); OFF(ibv_cq, handle);
	OFF(ibv_cq, cqe); OFF(ibv_cq, mutex); OFF(ibv_cq, cond);
	OFF(ibv_cq, comp_events_completed); OFF(ibv_cq, async_events_completed);
	SZ(ibv_srq); OFF(ibv_srq, context); OFF(ibv_srq, pd); OFF(ibv_srq, handle);
	SZ(ibv_qp);
	OFF(ibv_qp, context); OFF(ibv_qp, qp_context); OFF(ibv_qp, pd); OFF(ibv_qp, send_cq);
	OFF(ibv_qp, recv_cq); OFF(ibv_qp, srq); OFF(ibv_qp, handle); OFF(ibv_qp, qp_num);
	OFF(ibv_qp, state); OFF(ibv_qp, qp_type); OFF(ibv_qp, mutex); OFF(ibv_qp, cond);
	OFF(ibv_qp, events_completed);
	SZ(ibv_sge); OFF(ibv_sge, addr); OFF(ibv_sge, length); OFF(ibv_sge, lkey);
	SZ(ibv_srq_attr); OFF(ibv_srq_attr, max_wr); OFF(ibv_srq_attr, max_sge);
	OFF(ibv_srq_attr, srq_limit);
	SZ(ibv_srq_init_attr); OFF(ibv_srq_init_attr, srq_context); OFF(ibv_srq_init_attr, attr);
	SZ(ibv_send_wr);
	OFF(ibv_send_wr, wr_id); OFF(ibv_send_wr, next); OFF(ibv_send_wr, sg_list);
	OFF(ibv_send_wr, num_sge); OFF(ibv_send_wr, opcode); OFF(ibv_send_wr, send_flags);
	OFF(ibv_send_wr, imm_data); OFF(ibv_send_wr, wr); OFF(ibv_send_wr, wr.rdma.remote_addr);
	OFF(ibv_send_wr, wr.rdma.rkey); OFF(ibv_send_wr, wr.atomic.remote_addr);
	OFF(ibv_send_wr, wr.atomic.compare_add); OFF(ibv_send_wr, wr.atomic.swap);
	OFF(ibv_send_wr, wr.atomic.rkey); OFF(ibv_send_wr, wr.ud.ah);
	OFF(ibv_send_wr, wr.ud.remote_qpn); OFF(ibv_send_wr, wr.ud.remote_qkey);
	OFF(ibv_send_wr, qp_type); OFF(ibv_send_wr, bind_mw); OFF(ibv_send_wr, tso);
	SZ(ibv_recv_wr);
	OFF(ibv_recv_wr, wr_id); OFF(ibv_recv_wr, next); OFF(ibv_recv_wr, sg_list);
	OFF(ibv_recv_wr, num_sge);
	SZ(ibv_wc);
	OFF(ibv_wc, wr_id); OFF(ibv_wc, status); OFF(ibv_wc, opcode); OFF(ibv_wc, vendor_err);
	OFF(ibv_wc, byte_len); OFF(ibv_wc, imm_data); OFF(ibv_wc, qp_num); OFF(ibv_wc, src_qp);
	OFF(ibv_wc, wc_flags); OFF(ibv_wc, pkey_index); OFF(ibv_wc, slid); OFF(ibv_wc, sl);
	OFF(ibv_wc, dlid_path_bits);
	SZ(ibv_qp_cap);
	OFF(ibv_qp_cap, max_send_wr); OFF(ibv_qp_cap, max_recv_wr); OFF(ibv_qp_cap, max_send_sge);
	OFF(ibv_qp_cap, max_recv_sge); OFF(ibv_qp_cap, max_inline_data);
	SZ(ibv_qp_init_attr);
	OFF(ibv_qp_init_attr, qp_context); OFF(ibv_qp_init_attr, send_cq);
	OFF(ibv_qp_init_attr, recv_cq); OFF(ibv_qp_init_attr, srq); OFF(ibv_qp_init_attr, cap);
	OFF(ibv_qp_init_attr, qp_type); OFF(ibv_qp_init_attr, sq_sig_all);
	SZ(ibv_qp_init_attr_ex);
	OFF(ibv_qp_init_attr_ex, cap); OFF(ibv_qp_init_attr_ex, qp_type);
	OFF(ibv_qp_init_attr_ex, sq_sig_all); OFF(ibv_qp_init_attr_ex, comp_mask);
	OFF(ibv_qp_init_attr_ex, pd); OFF(ibv_qp_init_attr_ex, xrcd);
	OFF(ibv_qp_init_attr_ex, create_flags); OFF(ibv_qp_init_attr_ex, max_tso_header);
	OFF(ibv_qp_init_attr_ex, rwq_ind_tbl); OFF(ibv_qp_init_attr_ex, rx_hash_conf);
	OFF(ibv_qp_init_attr_ex, source_qpn); OFF(ibv_qp_init_attr_ex, send_ops_flags);
	SZ(ibv_rx_hash_conf);
	SZ(ibv_ah_attr); SZ(ibv_global_route);
	SZ(ibv_qp_attr);
	OFF(ibv_qp_attr, qp_state); OFF(ibv_qp_attr, cur_qp_state); OFF(ibv_qp_attr, path_mtu);
	OFF(ibv_qp_attr, qkey); OFF(ibv_qp_attr, rq_psn); OFF(ibv_qp_attr, sq_psn);
	OFF(ibv_qp_attr, dest_qp_num); OFF(ibv_qp_attr, qp_access_flags); OFF(ibv_qp_attr, cap);
	OFF(ibv_qp_attr, ah_attr); OFF(ibv_qp_attr, alt_ah_attr); OFF(ibv_qp_attr, pkey_index);
	OFF(ibv_qp_attr, max_rd_atomic); OFF(ibv_qp_attr, max_dest_rd_atomic);
	OFF(ibv_qp_attr, min_rnr_timer); OFF(ibv_qp_attr, port_num); OFF(ibv_qp_attr, timeout);
	OFF(ibv_qp_attr, retry_cnt); OFF(ibv_qp_attr, rnr_retry); OFF(ibv_qp_attr, alt_port_num);
	OFF(ibv_qp_attr, alt_timeout); OFF(ibv_qp_attr, rate_limit);
	SZ(ibv_device_attr);
	OFF(ibv_device_attr, max_mr_size); OFF(ibv_device_attr, max_qp_wr);
	OFF(ibv_device_attr, max_sge); OFF(ibv_device_attr, max_qp_rd_atom);
	OFF(ibv_device_attr, atomic_cap); OFF(ibv_device_attr, max_pkeys);
	OFF(ibv_device_attr, phys_port_cnt);
	SZ(ibv_qp_ex);
	OFF(ibv_qp_ex, comp_mask); OFF(ibv_qp_ex, wr_id); OFF(ibv_qp_ex, wr_flags);
	OFF(ibv_qp_ex, wr_atomic_cmp_swp); OFF(ibv_qp_ex, wr_rdma_write); OFF(ibv_qp_ex, wr_send);
	OFF(ibv_qp_ex, wr_set_ud_addr); OFF(ibv_qp_ex, wr_set_sge); OFF(ibv_qp_ex, wr_set_sge_list);
	OFF(ibv_qp_ex, wr_start); OFF(ibv_qp_ex, wr_complete); OFF(ibv_qp_ex, wr_abort);
	OFF(ibv_qp_ex, wr_atomic_write);
	SZ(ibv_data_buf);
	SZ(ibv_comp_channel); OFF(ibv_comp_channel, fd);
	SZ(rdma_event_channel); OFF(rdma_event_channel, fd);
	OFF(rdma_cm_id, verbs); OFF(rdma_cm_id, qp); OFF(rdma_cm_id, route.addr.dst_addr);
	OFF(rdma_cm_id, port_num);
	SZ(rdma_conn_param); OFF(rdma_conn_param, private_data);
	OFF(rdma_conn_param, private_data_len); OFF(rdma_conn_param, responder_resources);
	OFF(rdma_conn_param, initiator_depth); OFF(rdma_conn_param, retry_count);
	OFF(rdma_conn_param, rnr_retry_count); OFF(rdma_conn_param, srq);
	OFF(rdma_conn_param, qp_num);
	OFF(rdma_cm_event, id); OFF(rdma_cm_event, listen_id); OFF(rdma_cm_event, event);
	OFF(rdma_cm_event, status); OFF(rdma_cm_event, param.conn);
	SZ(ibv_odp_caps); OFF(ibv_odp_caps, general_caps);
	OFF(ibv_odp_caps, per_transport_caps.rc_odp_caps);
	OFF(ibv_odp_caps, per_transport_caps.uc_odp_caps);
	OFF(ibv_odp_caps, per_transport_caps.ud_odp_caps);
	SZ(ibv_device_attr_ex); OFF(ibv_device_attr_ex, orig_attr);
	OFF(ibv_device_attr_ex, comp_mask); OFF(ibv_device_attr_ex, odp_caps);
	OFF(ibv_device_attr_ex, completion_timestamp_mask);
	SZ(ibv_port_attr); OFF(ibv_port_attr, state); OFF(ibv_port_attr, active_mtu);
	OFF(ibv_port_attr, gid_tbl_len); OFF(ibv_port_attr, lid); OFF(ibv_port_attr, link_layer);
	OFF(ibv_port_attr, port_cap_flags2);
	return 0;
}
