// npe_core: register reads (§3) and the interrupt line (§9).

// Both 32-bit lanes of the 8-byte-aligned register pair at `a` (one read mux, 64 bits wide).
function [63:0] rd_global;
    input [11:3] a;
    begin
        case (a)
            9'h000: rd_global = {CAPS_VALUE, ID_VALUE};
            9'h001: rd_global = {29'd0, irq_en, 1'b0, enable, node_reg};
            9'h002: rd_global = {27'd0, gevent, 28'd0, irq_status};
            9'h004: rd_global = rq_base;
            9'h005: rd_global = {rq_head, 27'd0, rq_log2};
            9'h006: rd_global = {32'd0, rq_tail};
            9'h007: rd_global = wq_base;
            9'h008: rd_global = {wq_tail, 27'd0, wq_log2};
            9'h009: rd_global = {32'd0, wq_head};
            9'h00A: rd_global = wcq_base;
            9'h00B: rd_global = {wcq_head, 27'd0, wcq_log2};
            9'h00C: rd_global = {14'd0, rx_pending, free_slots, wcq_tail};
            9'h00D: rd_global = {rx_count, tx_count};
            default: rd_global = 64'd0;
        endcase
    end
endfunction

function [63:0] rd_channel;
    input [CW-1:0] n;
    input [7:3] r;
    reg [31:0] pending;
    begin
        pending = sq_tail[n] - sq_head[n];
        case (r)
            5'h00: rd_channel = sq_base[n];
            5'h01: rd_channel = {sq_tail[n], 27'd0, sq_log2[n]};
            5'h02: rd_channel = {32'd0, sq_head[n]};
            5'h03: rd_channel = cq_base[n];
            5'h04: rd_channel = {cq_head[n], 27'd0, cq_log2[n]};
            5'h05: rd_channel = {ch_pdid[n], 14'd0, ch_irq_en[n], ch_en[n], cq_tail[n]};
            5'h06: rd_channel = {29'd0, ch_irq[n],
                                 (pending > 32'hFFFF) ? 16'hFFFF : pending[15:0], last_err[n],
                                 5'd0, ch_state(n)};
            5'h07: rd_channel = fault_addr[n];
            5'h08: rd_channel = {fault_valid[n] ? {28'd0, 1'b1, 1'b0, fault_resp[n]} : 32'd0,
                                 16'd0, fault_idx[n]};
            default: rd_channel = 64'd0;
        endcase
    end
endfunction

// CH_STATUS.STATE: IDLE 0, RUNNING 1, FAULT_WAIT 2, ERROR 3, STALLED 4. STALLED: the
// sequencer has waited more than 1024 clocks for this channel's source read.
function [2:0] ch_state;
    input [CW-1:0] n;
    begin
        if (!ch_en[n]) ch_state = 3'd0;
        else if (fw[n]) ch_state = 3'd2;
        else if ((st == M_AR || st == M_R) && purp == P_SRC && cur == n && wait_cnt[10])
            ch_state = 3'd4;
        else if (sq_err[n] || cq_err[n] || cqp[n]) ch_state = 3'd3;
        else if (sq_tail[n] != sq_head[n]) ch_state = 3'd1;
        else ch_state = 3'd0;
    end
endfunction

function [63:0] rd64;
    input [15:3] a;
    reg [15:3] rel;
    begin
        if (a[15:12] == 4'd0) begin
            rd64 = rd_global(a[11:3]);
        end else begin
            rel = a - 13'h200;
            if (rel[15:8] < CHANNELS) rd64 = rd_channel(rel[8+CW-1:8], rel[7:3]);
            else rd64 = 64'd0;
        end
    end
endfunction

reg [3:0]  irq_status;
reg [15:0] free_slots;
reg [1:0]  rx_pending;
integer    ii;
always @(*) begin
    irq_status = 4'd0;
    for (ii = 0; ii < CHANNELS; ii = ii + 1)
        if (ch_irq_en[ii] && ch_irq[ii] != 3'd0) irq_status[0] = 1'b1;
    irq_status[1] = rq_tail != rq_head;
    irq_status[2] = wcq_tail != wcq_head;
    irq_status[3] = gevent != 5'd0;
    free_slots = 16'd0;
    for (ii = 0; ii < NS; ii = ii + 1)
        if (!slot_busy[ii]) free_slots = free_slots + 16'd1;
    rx_pending = {1'b0, rxd_pend} + {1'b0, rxc_pend};
end

always @(posedge clk) begin
    if (!rst_n) begin
        rd_data <= 64'd0;
        irq <= 1'b0;
    end else begin
        if (rd_en) rd_data <= rd64(rd_addr);
        irq <= irq_en && irq_status != 4'd0;
    end
end
