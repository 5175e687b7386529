// npe_core: register writes and the sequencer (one clocked process, so that the driver's
// writes and the engine's updates of the same registers have one order: the engine's come
// last within a clock).

reg [511:0] cmsg;                       // message of the control transmitter
reg [63:12] burst_addr;
reg [63:0]  burst_end_r;
integer     wk;                         // word of a multi-word register (loop index)

wire        do_soft = sr_req && st == S_IDLE;
wire [15:0] wr_a = {wr_addr, 3'b000};
wire [15:0] wrel = wr_a - 16'h1000;
wire        wr_is_ch = wr_a >= 16'h1000 && wrel[15:8] < CHANNELS;
wire [CW-1:0] wch = wrel[8+CW-1:8];
wire [7:0]  wreg = wrel[7:0];
wire [31:0] wd_lo = wr_data[31:0];
wire [31:0] wd_hi = wr_data[63:32];

assign enable_out = enable;

// The control transmitter reads its message like a RAM (data one clock after the address).
always @(posedge clk) begin
    if (txc_rd_en) txc_rd_data <= word4(cmsg, txc_rd_addr);
end

task automatic reset_all;
    integer n;
    begin
        enable <= 1'b0; irq_en <= 1'b0; sr_req <= 1'b0; node_reg <= 32'd0; gevent <= 5'd0;
        rq_base <= 64'd0; wq_base <= 64'd0; wcq_base <= 64'd0;
        rq_log2 <= 5'd0; wq_log2 <= 5'd0; wcq_log2 <= 5'd0;
        rq_head <= 32'd0; rq_tail <= 32'd0; wq_head <= 32'd0; wq_tail <= 32'd0;
        wcq_head <= 32'd0; wcq_tail <= 32'd0;
        rq_err <= 1'b0; wq_err <= 1'b0; wcq_err <= 1'b0;
        tx_count <= 32'd0; rx_count <= 32'd0;
        slot_busy <= {NS{1'b0}}; slot_full <= {NS{1'b0}};
        wcqp <= 1'b0; wcqp_status <= 8'd0; wcqp_slot <= 8'd0; wcqp_bytes <= 32'd0;
        wcqp_cookie <= 64'd0; wcqp_fault <= 64'd0; wcqp_resp <= 2'd0;
        for (n = 0; n < CHANNELS; n = n + 1) begin
            ch_en[n] <= 1'b0; ch_irq_en[n] <= 1'b0; ch_pdid[n] <= 16'd0;
            sq_base[n] <= 64'd0; sq_log2[n] <= 5'd0; sq_head[n] <= 32'd0; sq_tail[n] <= 32'd0;
            sq_err[n] <= 1'b0;
            cq_base[n] <= 64'd0; cq_log2[n] <= 5'd0; cq_head[n] <= 32'd0; cq_tail[n] <= 32'd0;
            cq_err[n] <= 1'b0;
            ch_irq[n] <= 3'd0; last_err[n] <= 8'd0; fault_addr[n] <= 64'd0;
            fault_idx[n] <= 16'd0; fault_valid[n] <= 1'b0; fault_resp[n] <= 2'd0;
            fw[n] <= 1'b0; resume[n] <= 2'd0; txwait[n] <= 2'd0;
            cqp[n] <= 1'b0; cqp_status[n] <= 8'd0; cqp_index[n] <= 16'd0; cqp_bytes[n] <= 32'd0;
            cqp_cookie[n] <= 64'd0; cqp_fault[n] <= 64'd0;
        end
        st <= S_IDLE; ret <= S_IDLE; purp <= P_SQ; cur <= {CW{1'b0}}; rr <= {CW{1'b0}};
        rq_from_data <= 1'b0; desc <= 1024'd0; msg_nz <= 1'b0; wqe <= 256'd0; mop_err <= 1'b0;
        mop_resp <= 2'd0; beat <= 5'd0; nbeats <= 5'd0; gbeat <= 9'd0; prev <= 128'd0;
        done_bytes <= 32'd0; wait_cnt <= 11'd0; fin_fault <= 64'd0; fin_status <= 8'd0;
        fin_bytes <= 32'd0; resuming <= 1'b0; cmsg <= 512'd0; burst_addr <= 52'd0;
        burst_end_r <= 64'd0;
        m_q <= 1'b0; m_id <= 6'd0; m_araddr <= 64'd0; m_arlen <= 8'd0; m_arvalid <= 1'b0;
        m_rready <= 1'b0; m_awaddr <= 64'd0; m_awlen <= 8'd0; m_awvalid <= 1'b0;
        m_wdata <= 128'd0; m_wstrb <= 16'd0; m_wlast <= 1'b0; m_wvalid <= 1'b0;
        m_bready <= 1'b0;
        tb_we <= 1'b0; tb_waddr <= 9'd0; tb_wdata <= 128'd0; txd_start <= 1'b0;
        txc_start <= 1'b0; tx_dst <= 22'd0; tx_pdid <= 16'd0; tx_tid <= 14'd0;
        tx_msg_len <= 8'd0; tx_dst_va <= 49'd0; tx_bytes <= 13'd0;
        rxd_taken <= 1'b0; rxc_taken <= 1'b0; sl_raddr <= {(SLOTS_LOG2+8){1'b0}};
        sl_re <= 1'b0;
    end
endtask

// Starts a read burst of `beats` beats, returning to `to`; an address past the top of the
// bus fails at once with DECERR (§4: nothing is issued).
task automatic start_read;
    input q;
    input [5:0] id;
    input [64:0] a;
    input [4:0] beats;
    input [2:0] p;
    input [4:0] to;
    begin
        purp <= p; ret <= to; beat <= 5'd0; nbeats <= beats; wait_cnt <= 11'd0;
        mop_err <= a[64]; mop_resp <= a[64] ? 2'd3 : 2'd0;
        burst_addr <= a[63:12];
        if (a[64]) begin
            st <= to;
        end else begin
            m_q <= q; m_id <= id; m_araddr <= a[63:0]; m_arlen <= {3'd0, beats - 5'd1};
            m_arvalid <= 1'b1;
            st <= M_AR;
        end
    end
endtask

task automatic start_write;
    input q;
    input [5:0] id;
    input [64:0] a;
    input [4:0] beats;
    input [2:0] p;
    input [4:0] to;
    begin
        purp <= p; ret <= to; beat <= 5'd0; nbeats <= beats; wait_cnt <= 11'd0;
        mop_err <= a[64]; mop_resp <= a[64] ? 2'd3 : 2'd0;
        burst_addr <= a[63:12];
        if (a[64]) begin
            st <= to;
        end else begin
            m_q <= q; m_id <= id; m_awaddr <= a[63:0]; m_awlen <= {3'd0, beats - 5'd1};
            // AWVALID and the first W beat go out independently: the master does not wait
            // for AWREADY before WVALID (Arm IHI 0022 A3.3.1).
            m_awvalid <= 1'b1;
            st <= M_WPREP;
        end
    end
endtask

// Finishes the current descriptor with `s` (§4.2).
task automatic finish;
    input [7:0] s;
    input [31:0] bytes;
    input [63:0] fault;
    begin
        fin_status <= s; fin_bytes <= bytes; fin_fault <= fault;
        st <= S_FINISH;
    end
endtask

task automatic free_slot;
    input [7:0] s;
    begin
        if (s < NS && slot_full[s[SLOTS_LOG2-1:0]]) begin
            slot_full[s[SLOTS_LOG2-1:0]] <= 1'b0;
            slot_busy[s[SLOTS_LOG2-1:0]] <= 1'b0;
        end
    end
endtask

task automatic keep_wcq;
    input [7:0] s;
    input [31:0] bytes;
    input [63:0] fault;
    input [1:0] resp;
    begin
        wcqp <= 1'b1; wcqp_status <= s; wcqp_slot <= w_slot; wcqp_bytes <= bytes;
        wcqp_cookie <= ww2; wcqp_fault <= fault; wcqp_resp <= resp;
        free_slot(w_slot);
        st <= S_WCQ;
    end
endtask

wire [63:0] cq_w0 = {cqp_bytes[cur], cqp_index[cur], cqp_status[cur], 7'd0,
                     phase_of(cq_tail[cur], cq_log2[cur])};
wire [63:0] wcq_w0 = {wcqp_bytes, 8'd0, wcqp_slot, wcqp_status, 7'd0,
                      phase_of(wcq_tail, wcq_log2)};
wire [63:0] wcq_w3 = (wcqp_status == ST_DST_FAULT) ? {60'd0, 2'b11, wcqp_resp} : 64'd0;
wire [63:0] rq_w0 = {rq_from_data ? {19'd0, rxd_len} : 32'd0, 16'd0,
                     rq_from_data ? {{(8-SLOTS_LOG2){1'b0}}, rx_slot} : 8'd0, 4'd0,
                     rq_from_data ? 3'd2 : 3'd1, phase_of(rq_tail, rq_log2)};
wire [63:0] rq_w1 = rq_from_data ? {12'd0, rxd_tid, rxd_pdid, rxd_src}
                                 : {12'd0, rxc_tid, rxc_pdid, rxc_src};
wire [63:0] rq_w2 = {56'd0, rq_from_data ? rxd_msg_len : rxc_msg_len};
// The message word of beat 4..7 of an RQ entry: each receiver's word is picked first (two
// 4:1 muxes), then the receiver (one 2:1 mux), not a 512-bit 2:1 mux before a 4:1.
wire [127:0] rq_msg_word = rq_from_data ? word4(rxd_msg, beat[1:0])
                                        : word4(rxc_msg, beat[1:0]);
// The one realigning shifter: source beats into the transmit buffer (M_R, S_SRC_TAIL),
// slot words onto the write data (M_WLOAD: shifted the other way).
wire        sh_commit = st == M_WLOAD;
wire [255:0] sh_in = sh_commit ? (blk_off == 4'd0 ? {128'd0, sl_rdata} : {sl_rdata, prev})
                   : (st == S_SRC_TAIL) ? {128'd0, prev} : {m_rdata, prev};
wire [127:0] sh_out = take16(sh_in, sh_commit ? 4'd0 - blk_off : blk_off);
wire [63:0] src_fault = ({burst_addr, 12'd0} < dw1) ? dw1 : {burst_addr, 12'd0};
// Bytes of the commit written once the current burst is acknowledged.
wire [31:0] cmt_done = ((burst_end_r < blk_end) ? burst_end_r[31:0] : blk_end[31:0]) - ww1[31:0];

// What the idle sequencer starts (in this order; see S_IDLE): an RQ entry, a kept WCQ
// entry, a WQ entry, a channel.
wire        idle_rq = (rxc_pend || rxd_pend) && !rq_err &&
                      {1'b0, rq_tail - rq_head} < ring_size(rq_log2);
wire        idle_wq = !wcqp && !wq_err && wq_tail != wq_head &&
                      {1'b0, wcq_tail - wcq_head} < ring_size(wcq_log2);
// The address of the ring entry the sequencer accesses next, through one adder: the ring is
// chosen first (CQ in S_CQ, WCQ in S_WCQ, else as S_IDLE chooses), then its entry address.
reg  [63:0] qa_base;
reg  [4:0]  qa_log2;
reg  [31:0] qa_index;
reg         qa_big;                     // 128-byte entries (SQ, RQ), else 32
always @(*) begin
    if (st == S_CQ) begin
        qa_base = cq_base[cur]; qa_log2 = cq_log2[cur]; qa_index = cq_tail[cur]; qa_big = 1'b0;
    end else if (st == S_WCQ) begin
        qa_base = wcq_base; qa_log2 = wcq_log2; qa_index = wcq_tail; qa_big = 1'b0;
    end else if (idle_rq) begin
        qa_base = rq_base; qa_log2 = rq_log2; qa_index = rq_tail; qa_big = 1'b1;
    end else if (idle_wq) begin
        qa_base = wq_base; qa_log2 = wq_log2; qa_index = wq_head; qa_big = 1'b0;
    end else begin
        qa_base = sq_base[pick_ch]; qa_log2 = sq_log2[pick_ch]; qa_index = sq_head[pick_ch];
        qa_big = 1'b1;
    end
end
wire [64:0] q_addr = ring_addr(qa_base, qa_log2, qa_index, qa_big);

always @(posedge clk) begin
    if (!rst_n || do_soft) begin
        reset_all;
        rx_flush <= do_soft;
    end else begin
        rx_flush <= 1'b0;
        tb_we <= 1'b0;
        txd_start <= 1'b0;
        txc_start <= 1'b0;
        rxd_taken <= 1'b0;
        rxc_taken <= 1'b0;
        sl_re <= 1'b0;

        // ---- register writes from the bus (§3) ----
        if (wr_is_ch) begin
            case (wreg)
                8'h00: begin
                    if (wr_lo) sq_base[wch][31:0] <= {wd_lo[31:7], 7'd0};
                    if (wr_hi) sq_base[wch][63:32] <= wd_hi;
                    if (wr_lo || wr_hi) sq_err[wch] <= 1'b0;
                end
                8'h08: begin
                    if (wr_lo) sq_log2[wch] <= clamp_log2(wd_lo[4:0], MAX_CH_LOG2);
                    if (wr_hi) begin
                        if (wd_hi - sq_head[wch] > ring_size(sq_log2[wch])) begin
                            gevent[GE_BAD_DOORBELL] <= 1'b1;
                        end else begin
                            sq_tail[wch] <= wd_hi;
                        end
                    end
                end
                8'h18: begin
                    if (wr_lo) cq_base[wch][31:0] <= {wd_lo[31:5], 5'd0};
                    if (wr_hi) cq_base[wch][63:32] <= wd_hi;
                    if (wr_lo || wr_hi) cq_err[wch] <= 1'b0;
                end
                8'h20: begin
                    if (wr_lo) cq_log2[wch] <= clamp_log2(wd_lo[4:0], MAX_CH_LOG2);
                    if (wr_hi) begin
                        if (wd_hi - cq_head[wch] > cq_tail[wch] - cq_head[wch])
                            gevent[GE_BAD_DOORBELL] <= 1'b1;
                        else
                            cq_head[wch] <= wd_hi;
                    end
                end
                8'h28: if (wr_hi) begin
                    ch_en[wch] <= wd_hi[0];
                    ch_irq_en[wch] <= wd_hi[1];
                    ch_pdid[wch] <= wd_hi[31:16];
                end
                8'h30: if (wr_hi) ch_irq[wch] <= ch_irq[wch] & ~wd_hi[2:0];
                8'h48: if (wr_lo && fw[wch] && (wd_lo[0] != wd_lo[1])) resume[wch] <= wd_lo[1:0];
                default: ;
            endcase
        end else begin
            case (wr_a)
                16'h008: begin
                    if (wr_lo) node_reg <= wd_lo & 32'h803F_FFFF;
                    if (wr_hi) begin
                        if (wd_hi[1]) begin
                            sr_req <= 1'b1;
                            enable <= 1'b0;
                        end else begin
                            enable <= wd_hi[0];
                            irq_en <= wd_hi[2];
                        end
                    end
                end
                16'h010: if (wr_hi) gevent <= gevent & ~wd_hi[4:0];
                16'h020: begin
                    if (wr_lo) rq_base[31:0] <= {wd_lo[31:7], 7'd0};
                    if (wr_hi) rq_base[63:32] <= wd_hi;
                    if (wr_lo || wr_hi) rq_err <= 1'b0;
                end
                16'h028: begin
                    if (wr_lo) rq_log2 <= clamp_log2(wd_lo[4:0], MAX_ENG_LOG2);
                    if (wr_hi) begin
                        if (wd_hi - rq_head > rq_tail - rq_head) gevent[GE_BAD_DOORBELL] <= 1'b1;
                        else rq_head <= wd_hi;
                    end
                end
                16'h038: begin
                    if (wr_lo) wq_base[31:0] <= {wd_lo[31:5], 5'd0};
                    if (wr_hi) wq_base[63:32] <= wd_hi;
                    if (wr_lo || wr_hi) wq_err <= 1'b0;
                end
                16'h040: begin
                    if (wr_lo) wq_log2 <= clamp_log2(wd_lo[4:0], MAX_ENG_LOG2);
                    if (wr_hi) begin
                        if ({1'b0, wd_hi - wq_head} > ring_size(wq_log2))
                            gevent[GE_BAD_DOORBELL] <= 1'b1;
                        else
                            wq_tail <= wd_hi;
                    end
                end
                16'h050: begin
                    if (wr_lo) wcq_base[31:0] <= {wd_lo[31:5], 5'd0};
                    if (wr_hi) wcq_base[63:32] <= wd_hi;
                    if (wr_lo || wr_hi) wcq_err <= 1'b0;
                end
                16'h058: begin
                    if (wr_lo) wcq_log2 <= clamp_log2(wd_lo[4:0], MAX_ENG_LOG2);
                    if (wr_hi) begin
                        if (wd_hi - wcq_head > wcq_tail - wcq_head)
                            gevent[GE_BAD_DOORBELL] <= 1'b1;
                        else
                            wcq_head <= wd_hi;
                    end
                end
                default: ;
            endcase
        end

        // ---- receivers: slots and events ----
        if (rx_alloc) slot_busy[rx_slot] <= 1'b1;
        if (rx_drop) begin
            slot_busy[rx_slot] <= 1'b0;
            slot_full[rx_slot] <= 1'b0;
        end
        if (rx_crc_drop) gevent[GE_CRC_DROP] <= 1'b1;
        // RX_HELD (§3): a frame waits because no receive slot is free (the data receiver's
        // rx_held) or no RQ entry is (full, or the RQ cannot be written); a frame waiting
        // only for the sequencer to write its entry is not held.
        if (rx_held || ((rxc_pend || rxd_pend) && !idle_rq)) gevent[GE_RX_HELD] <= 1'b1;

        // ---- the write address channel, apart from the data beats ----
        if (m_awready) m_awvalid <= 1'b0;

        // ---- the sequencer ----
        case (st)
            S_IDLE: if (enable) begin
                if (idle_rq) begin
                    rq_from_data <= !rxc_pend;
                    start_write(1'b1, 6'd0, q_addr, 5'd8,
                                P_RQ, S_RQ_DONE);
                end else if (wcqp && !wcq_err) begin
                    st <= S_WCQ;
                end else if (idle_wq) begin
                    start_read(1'b1, 6'd0, q_addr, 5'd2,
                               P_WQ, S_WQ_DONE);
                end else if (pick_any) begin
                    cur <= pick_ch;
                    rr <= pick_ch + 1'b1;
                    if (cqp[pick_ch]) begin
                        st <= S_CQ;
                    end else begin
                        resuming <= fw[pick_ch];
                        start_read(1'b1, 6'd0, q_addr, 5'd8, P_SQ, S_SQ_DONE);
                    end
                end
            end

            // ---- channels ----
            S_SQ_DONE: begin
                if (mop_err) begin
                    // Nothing consumed: the channel stops in ERROR until SQ_BASE is written.
                    sq_err[cur] <= 1'b1;
                    ch_irq[cur][CI_ERROR] <= 1'b1;
                    st <= S_IDLE;
                end else begin
                    txwait[cur] <= 2'd0;
                    if (resuming) begin
                        fw[cur] <= 1'b0;
                        fault_valid[cur] <= 1'b0;
                        resume[cur] <= 2'd0;
                    end
                    if (resuming && resume[cur][1]) begin
                        finish(ST_SRC_FAULT, 32'd0, fault_addr[cur]);
                    end else if (!d_good) begin
                        finish(ST_BAD, 32'd0, 64'd0);
                    end else if (d_nop) begin
                        finish(ST_OK, 32'd0, 64'd0);
                    end else if (d_msg) begin
                        if (!d_reach) begin
                            gevent[GE_LINK_ERROR] <= 1'b1;
                            finish(ST_LINK, 32'd0, 64'd0);
                        end else if (txc_busy) begin
                            txwait[cur] <= 2'b10;
                            st <= S_IDLE;
                        end else begin
                            cmsg <= desc[1023:512];
                            tx_dst <= d_peer; tx_pdid <= d_pdid; tx_tid <= d_tid;
                            tx_msg_len <= d_msg_len; tx_dst_va <= 49'd0;
                            tx_bytes <= {5'd0, d_msg_len};
                            txc_start <= 1'b1;
                            finish(ST_OK, 32'd0, 64'd0);
                        end
                    end else if (txd_busy) begin
                        txwait[cur] <= 2'b01;
                        st <= S_IDLE;
                    end else begin
                        purp <= P_SRC;
                        gbeat <= 9'd0;
                        prev <= 128'd0;
                        st <= S_SRC_NEXT;
                    end
                end
            end
            S_SRC_NEXT: begin
                if (gbeat == blk_beats) begin
                    st <= S_SRC_TAIL;
                end else begin
                    start_read(1'b0, {1'b0, ch_pdid[cur][4:0]}, {1'b0, blk_addr},
                               burst_beats[4:0], P_SRC, S_SRC_DONE);
                end
            end
            S_SRC_DONE: begin
                if (mop_err) begin
                    // Terminated: FAULT_WAIT until RESUME (§5.4); nothing was sent.
                    fw[cur] <= 1'b1;
                    fault_addr[cur] <= src_fault;
                    fault_idx[cur] <= sq_head[cur][15:0];
                    fault_valid[cur] <= 1'b1;
                    fault_resp[cur] <= mop_resp;
                    ch_irq[cur][CI_LOCAL_FAULT] <= 1'b1;
                    st <= S_IDLE;
                end else begin
                    st <= S_SRC_NEXT;
                end
            end
            S_SRC_TAIL: begin
                if (d_len[31:4] + {27'd0, |d_len[3:0]} == {19'd0, blk_beats}) begin
                    tb_we <= 1'b1;
                    tb_waddr <= 9'd3 + blk_beats;
                    tb_wdata <= sh_out;
                end
                beat <= 5'd0;
                st <= S_MSG_COPY;
            end
            S_MSG_COPY: begin
                tb_we <= 1'b1;
                tb_waddr <= {7'd0, beat[1:0]};
                tb_wdata <= word4(desc[1023:512], beat[1:0]);
                beat <= beat + 5'd1;
                if (beat == 5'd3) st <= S_SEND;
            end
            S_SEND: begin
                if (!d_reach) begin
                    gevent[GE_LINK_ERROR] <= 1'b1;
                    finish(ST_LINK, 32'd0, 64'd0);
                end else begin
                    tx_dst <= d_peer; tx_pdid <= d_pdid; tx_tid <= d_tid;
                    tx_msg_len <= d_msg_len; tx_dst_va <= dw3[48:0];
                    tx_bytes <= d_len[12:0] + 13'd64;
                    txd_start <= 1'b1;
                    tx_count <= tx_count + 32'd1;
                    finish(ST_OK, d_len, 64'd0);
                end
            end
            S_FINISH: begin
                sq_head[cur] <= sq_head[cur] + 32'd1;
                if (fin_status != ST_OK) begin
                    last_err[cur] <= fin_status;
                    if (fin_status != ST_SRC_FAULT) ch_irq[cur][CI_ERROR] <= 1'b1;
                end
                if (d_signal || fin_status != ST_OK) begin
                    cqp[cur] <= 1'b1;
                    cqp_status[cur] <= fin_status;
                    cqp_index[cur] <= sq_head[cur][15:0];
                    cqp_bytes[cur] <= fin_bytes;
                    cqp_cookie[cur] <= dw4;
                    cqp_fault[cur] <= fin_fault;
                    st <= S_CQ;
                end else begin
                    st <= S_IDLE;
                end
            end
            S_CQ: start_write(1'b1, 6'd0, q_addr,
                              5'd2, P_CQ, S_CQ_DONE);
            S_CQ_DONE: begin
                if (mop_err) begin
                    // Kept, written first once CQ_BASE is written again (§4).
                    cq_err[cur] <= 1'b1;
                    ch_irq[cur][CI_ERROR] <= 1'b1;
                end else begin
                    cq_tail[cur] <= cq_tail[cur] + 32'd1;
                    cqp[cur] <= 1'b0;
                    ch_irq[cur][CI_COMPLETION] <= 1'b1;
                end
                st <= S_IDLE;
            end

            // ---- the write engine ----
            S_WQ_DONE: begin
                if (mop_err) begin
                    wq_err <= 1'b1;
                    gevent[GE_QUEUE_ERROR] <= 1'b1;
                    st <= S_IDLE;
                end else begin
                    wq_head <= wq_head + 32'd1;
                    if (w_release) begin
                        free_slot(w_slot);
                        st <= S_IDLE;
                    end else if (w_commit && w_slot_ok) begin
                        purp <= P_COMMIT;
                        gbeat <= 9'd0;
                        prev <= 128'd0;
                        done_bytes <= 32'd0;
                        st <= S_CMT_NEXT;
                    end else begin
                        keep_wcq(ST_BAD, 32'd0, 64'd0, 2'd0);
                    end
                end
            end
            S_CMT_NEXT: begin
                if (gbeat == blk_beats) begin
                    keep_wcq(ST_OK, w_len, 64'd0, 2'd0);
                end else begin
                    burst_end_r <= burst_end;
                    start_write(1'b0, {1'b1, w_pdid[4:0]}, {1'b0, blk_addr}, burst_beats[4:0],
                                P_COMMIT, S_CMT_DONE);
                end
            end
            S_CMT_DONE: begin
                if (mop_err) begin
                    // Terminated: the block stops here, DST_FAULT (§5.3).
                    keep_wcq(ST_DST_FAULT, done_bytes, ww1 + {32'd0, done_bytes}, mop_resp);
                end else begin
                    done_bytes <= cmt_done;
                    st <= S_CMT_NEXT;
                end
            end
            S_WCQ: start_write(1'b1, 6'd0, q_addr, 5'd2,
                               P_WCQ, S_WCQ_DONE);
            S_WCQ_DONE: begin
                if (mop_err) begin
                    wcq_err <= 1'b1;
                    gevent[GE_QUEUE_ERROR] <= 1'b1;
                end else begin
                    wcq_tail <= wcq_tail + 32'd1;
                    wcqp <= 1'b0;
                end
                st <= S_IDLE;
            end

            // ---- the receive queue ----
            S_RQ_DONE: begin
                if (mop_err) begin
                    rq_err <= 1'b1;
                    gevent[GE_QUEUE_ERROR] <= 1'b1;
                end else begin
                    rq_tail <= rq_tail + 32'd1;
                    if (rq_from_data) begin
                        rxd_taken <= 1'b1;
                        slot_full[rx_slot] <= 1'b1;
                        slot_len[rx_slot] <= rxd_len;
                        rx_count <= rx_count + 32'd1;
                    end else begin
                        rxc_taken <= 1'b1;
                    end
                end
                st <= S_RQ_GAP;
            end
            S_RQ_GAP: st <= S_IDLE;

            // ---- one AXI burst ----
            M_AR: begin
                if (!wait_cnt[10]) wait_cnt <= wait_cnt + 11'd1;
                if (m_arready) begin
                    m_arvalid <= 1'b0;
                    m_rready <= 1'b1;
                    st <= M_R;
                end
            end
            M_R: begin
                if (!wait_cnt[10]) wait_cnt <= wait_cnt + 11'd1;
                if (m_rvalid) begin
                    wait_cnt <= 11'd0;
                    if (m_rresp != 2'd0 && !mop_err) begin
                        mop_err <= 1'b1;
                        mop_resp <= m_rresp;
                    end
                    case (purp)
                        P_SQ: begin
                            // one word per beat: a constant part-select per word, so
                            // each flip-flop loads m_rdata under its word's enable (no
                            // 1024-bit shifter for a variable offset)
                            for (wk = 0; wk < 8; wk = wk + 1)
                                if (beat[2:0] == wk[2:0]) desc[wk*128 +: 128] <= m_rdata;
                            if (beat[2:0] == 3'd0) msg_nz <= 1'b0;
                            else if (beat[2] && beat_tail_nz(m_rdata, beat[1:0], d_msg_len))
                                msg_nz <= 1'b1;
                        end
                        P_WQ: begin
                            if (beat[0]) wqe[255:128] <= m_rdata;
                            else wqe[127:0] <= m_rdata;
                        end
                        default: begin // P_SRC: realign into the transmit buffer
                            if (gbeat != 9'd0) begin
                                tb_we <= 1'b1;
                                tb_waddr <= 9'd3 + gbeat;
                                tb_wdata <= sh_out;
                            end
                            prev <= m_rdata;
                            gbeat <= gbeat + 9'd1;
                        end
                    endcase
                    beat <= beat + 5'd1;
                    if (beat + 5'd1 == nbeats) begin
                        m_rready <= 1'b0;
                        st <= ret;
                    end
                end
            end
            M_WPREP: begin
                sl_re <= 1'b1;
                sl_raddr <= {w_slot[SLOTS_LOG2-1:0], gbeat[7:0]};
                st <= M_WWAIT;
            end
            M_WWAIT: st <= M_WLOAD;
            M_WLOAD: begin
                m_wvalid <= 1'b1;
                m_wlast <= beat + 5'd1 == nbeats;
                m_wstrb <= 16'hFFFF;
                case (purp)
                    P_CQ: m_wdata <= beat[0] ? {64'd0, cqp_fault[cur]} : {cqp_cookie[cur], cq_w0};
                    P_WCQ: m_wdata <= beat[0] ? {wcq_w3, wcqp_fault} : {wcqp_cookie, wcq_w0};
                    P_RQ: begin
                        case (beat[2:0])
                            3'd0: m_wdata <= {rq_w1, rq_w0};
                            3'd1: m_wdata <= {64'd0, rq_w2};
                            3'd2, 3'd3: m_wdata <= 128'd0;
                            default: m_wdata <= rq_msg_word;
                        endcase
                    end
                    default: begin // P_COMMIT
                        m_wdata <= sh_out;
                        m_wstrb <= strobes(gbeat, blk_beats, blk_off, blk_end[3:0]);
                        prev <= sl_rdata;
                    end
                endcase
                st <= M_WSEND;
            end
            M_WSEND: begin
                if (m_wready) begin
                    m_wvalid <= 1'b0;
                    m_wlast <= 1'b0;
                    beat <= beat + 5'd1;
                    if (purp == P_COMMIT) gbeat <= gbeat + 9'd1;
                    if (beat + 5'd1 == nbeats) begin
                        m_bready <= 1'b1;
                        st <= M_B;
                    end else begin
                        st <= M_WPREP;
                    end
                end
            end
            M_B: begin
                if (m_bvalid) begin
                    m_bready <= 1'b0;
                    if (m_bresp != 2'd0) begin
                        mop_err <= 1'b1;
                        mop_resp <= m_bresp;
                    end
                    st <= ret;
                end
            end
            default: st <= S_IDLE;
        endcase
    end
end
