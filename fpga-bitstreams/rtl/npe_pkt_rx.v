// Link receiver for one virtual channel (docs/npe-rtl.md "Link framing"). It checks every
// packet (header sizes, TLAST only on the footer, FIRST/LAST order, the footer's reserved
// word, the CRC-32C over header, payload and the footer's fields) and assembles a frame: the
// first 64 payload bytes are the inline message (header area), the rest (data VC only) goes
// into a receive slot. A frame with any bad packet is discarded whole (crc_drop); a good one
// is held in p_* until the core has written its RQ entry (taken). A packet is decided one
// clock after its footer is taken (the check clock, `chk`): taking the footer registers the
// CRC continued over the footer's fields and everything else the decision reads, so no path
// runs from the stream through the CRC tree into the receiver's control. Back-pressure: TREADY
// (a register) is low in the check clock, while a frame is held, while the engine is disabled
// and, on the data VC, while no receive slot is free at a frame's start (only that last case
// raises `held`). A flush (CTRL.SOFT_RESET) discards the frame being received without a
// trace: `fl` marks it, it is taken to its last packet and dropped there, with no CRC_DROP and
// no RQ entry, also when its footer is taken in the flush clock itself or it is in its check
// clock then.
module npe_pkt_rx #(
    parameter DATA = 1,
    parameter SLOTS_LOG2 = 3
) (
    input  wire                     clk,
    input  wire                     rst_n,
    input  wire                     enable,
    input  wire                     flush,
    // AXI4-Stream slave
    input  wire [127:0]             s_tdata,
    input  wire                     s_tvalid,
    input  wire                     s_tlast,
    output reg                      s_tready,
    // receive slots (data VC)
    input  wire [(1<<SLOTS_LOG2)-1:0] slot_free,
    output reg                      alloc,
    output reg                      drop,
    output reg  [SLOTS_LOG2-1:0]    slot,
    output reg                      slot_we,
    output reg  [SLOTS_LOG2+7:0]    slot_waddr,
    output reg  [127:0]             slot_wdata,
    // the frame waiting for its RQ entry
    output reg                      pend,
    output reg  [12:0]              p_len,
    output reg  [21:0]              p_src,
    output reg  [15:0]              p_pdid,
    output reg  [13:0]              p_tid,
    output reg  [7:0]               p_msg_len,
    output reg  [511:0]             p_msg,
    input  wire                     taken,
    output reg                      crc_drop,
    output reg                      held
);

    localparam NS = 1 << SLOTS_LOG2;
    localparam R_HDR = 2'd0, R_PAY = 2'd1, R_FTR = 2'd2, R_SKIP = 2'd3;

    reg [1:0]   st;
    reg         in_frame;
    reg         first_pkt;
    reg         bad;
    reg [12:0]  fbytes;
    reg [8:0]   fidx;      // payload flits of the frame so far
    reg [4:0]   pk_flits;
    reg [8:0]   pk_bytes;
    reg [4:0]   pk_cnt;
    reg [31:0]  crc;
    reg [15:0]  pdid;
    reg [7:0]   msg_len;
    // The footer taken in the last clock, decided in this one (the check clock).
    reg         chk;
    reg         c_pre;     // every check of the packet but its CRC passed
    reg [31:0]  c_crc;     // the footer's CRC field
    reg         c_last;
    // The frame being received was flushed: it ends silently (no crc_drop, never pending) at
    // the check clock of its last packet.
    reg         fl;
    integer     wk;        // word of p_msg (loop index)

    function [SLOTS_LOG2:0] lowest_free;   // {found, index}
        input [NS-1:0] f;
        integer i;
        begin
            lowest_free = {1'b0, {SLOTS_LOG2{1'b0}}};
            for (i = NS - 1; i >= 0; i = i - 1)
                if (f[i]) lowest_free = {1'b1, i[SLOTS_LOG2-1:0]};
        end
    endfunction

    wire [SLOTS_LOG2:0] lf = lowest_free(slot_free);
    wire        take = s_tvalid && s_tready;
    wire [4:0]  h_flits = s_tdata[48:44];
    wire [8:0]  h_bytes = s_tdata[57:49];
    wire        h_ok = h_flits != 5'd0 && h_flits <= 5'd16 &&
                       h_flits == h_bytes[8:4] + {4'd0, |h_bytes[3:0]};
    // One CRC tree: a header starts a packet's CRC, payload flits continue it, and the
    // footer's fields (bits [63:0], as a flit with bits [127:64] zero) end it. Its output
    // only ever goes into `crc`; the check clock compares that register.
    wire [31:0] crc_next;
    npe_crc32c u_crc (
        .crc_in(st == R_HDR ? 32'hFFFF_FFFF : crc),
        .flit({st == R_FTR ? 64'd0 : s_tdata[127:64], s_tdata[63:0]}), .crc_out(crc_next)
    );
    // Message bytes at or past MSG_LEN are delivered as zero (the RQ entry's message area).
    function [127:0] mask16;
        input [127:0] d;
        input [8:0] first;    // frame byte of d's byte 0
        input [7:0] n;
        integer b;
        begin
            for (b = 0; b < 16; b = b + 1)
                mask16[b*8 +: 8] = (first + {5'd0, b[3:0]} < {1'b0, n}) ? d[b*8 +: 8] : 8'd0;
        end
    endfunction
    wire        f_first = s_tdata[36];
    wire        f_last = s_tdata[37];
    wire [12:0] total = fbytes + {4'd0, pk_bytes};
    wire        frame_ok = DATA != 0
        ? (total > 13'd64 && total <= 13'd4160 && msg_len >= 8'd16 && msg_len <= 8'd64)
        : (total == {5'd0, msg_len} && msg_len >= 8'd16 && msg_len <= 8'd64);
    // Taking a footer (TLAST on it) starts its check clock.
    wire        chk_n = take && st == R_FTR && s_tlast;
    // In the check clock: the packet is good (registers only).
    wire        pkt_good = c_pre && (~crc == c_crc);
    // The frame is discarded by a flush, now (the flush clock) or earlier.
    wire        gone = fl || flush;

    reg pend_n;
    reg in_frame_n;
    always @(*) begin
        pend_n = pend && !taken;
        in_frame_n = in_frame;
        if (chk && !gone && pkt_good && c_last && frame_ok) pend_n = 1'b1;
        if (take && st == R_HDR && !in_frame) in_frame_n = 1'b1;
        if (take && s_tlast && st != R_FTR) in_frame_n = 1'b0;
        // A flushed frame runs to its last packet (a transmitter completes what it sends).
        if (chk && (gone ? c_last : !(pkt_good && !c_last))) in_frame_n = 1'b0;
    end

    always @(posedge clk) begin
        if (!rst_n) begin
            st <= R_HDR; in_frame <= 1'b0; first_pkt <= 1'b0; bad <= 1'b0;
            fbytes <= 13'd0; fidx <= 9'd0; pk_flits <= 5'd0; pk_bytes <= 9'd0; pk_cnt <= 5'd0;
            crc <= 32'd0; pdid <= 16'd0; msg_len <= 8'd0;
            s_tready <= 1'b0; alloc <= 1'b0; drop <= 1'b0; slot <= {SLOTS_LOG2{1'b0}};
            slot_we <= 1'b0; slot_waddr <= {(SLOTS_LOG2+8){1'b0}}; slot_wdata <= 128'd0;
            pend <= 1'b0; p_len <= 13'd0; p_src <= 22'd0; p_pdid <= 16'd0; p_tid <= 14'd0;
            p_msg_len <= 8'd0; p_msg <= 512'd0; crc_drop <= 1'b0; held <= 1'b0;
            chk <= 1'b0; c_pre <= 1'b0; c_crc <= 32'd0; c_last <= 1'b0; fl <= 1'b0;
        end else begin
            alloc <= 1'b0;
            drop <= 1'b0;
            slot_we <= 1'b0;
            crc_drop <= 1'b0;
            pend <= pend_n;
            // Held for want of a receive slot: a frame waits at its start and none is free
            // (the RQ side of RX_HELD is the core's).
            held <= DATA != 0 && enable && s_tvalid && !in_frame && !lf[SLOTS_LOG2];
            s_tready <= enable && !flush && !pend_n && !chk_n &&
                        (DATA == 0 || in_frame_n || (lf[SLOTS_LOG2] && !alloc));
            chk <= chk_n;
            if (chk) begin
                if (gone) begin
                    // a flushed frame: its slot is freed at its end, nothing is reported
                    if (c_last) begin
                        fl <= 1'b0;
                        if (DATA != 0) drop <= 1'b1;
                    end
                end else if (!pkt_good || (c_last && !frame_ok)) begin
                    crc_drop <= 1'b1;
                    if (DATA != 0) drop <= 1'b1;
                end else begin
                    fbytes <= total;
                    if (c_last) begin
                        p_pdid <= pdid;
                        p_msg_len <= msg_len;
                        p_len <= (DATA != 0) ? total - 13'd64 : 13'd0;
                    end
                end
            end
            if (take) begin
                case (st)
                    R_HDR: begin
                        crc <= crc_next;
                        pk_flits <= h_flits;
                        pk_bytes <= h_bytes;
                        pk_cnt <= 5'd0;
                        if (!in_frame) begin
                            first_pkt <= 1'b1;
                            bad <= 1'b0;
                            fl <= 1'b0;
                            fbytes <= 13'd0;
                            fidx <= 9'd0;
                            pdid <= s_tdata[37:22];
                            msg_len <= s_tdata[120:113];
                            p_msg <= 512'd0;
                            if (DATA != 0) begin
                                slot <= lf[SLOTS_LOG2-1:0];
                                alloc <= 1'b1;
                            end
                        end else begin
                            first_pkt <= 1'b0;
                        end
                        if (s_tlast) begin
                            // A one-flit packet: malformed; the frame is lost.
                            crc_drop <= !gone;
                            fl <= 1'b0;
                            if (DATA != 0) drop <= 1'b1;
                            st <= R_HDR;
                        end else if (!h_ok) begin
                            bad <= 1'b1;
                            st <= R_SKIP;
                        end else begin
                            st <= R_PAY;
                        end
                    end
                    R_PAY: begin
                        crc <= crc_next;
                        fidx <= fidx + 1'b1;
                        pk_cnt <= pk_cnt + 1'b1;
                        if (fidx < 9'd4) begin
                            // a constant part-select per word: no 512-bit shifter
                            for (wk = 0; wk < 4; wk = wk + 1)
                                if (fidx[1:0] == wk[1:0])
                                    p_msg[wk*128 +: 128] <=
                                        mask16(s_tdata, {3'd0, fidx[1:0], 4'd0}, msg_len);
                        end else if (DATA != 0 && fidx < 9'd260) begin
                            slot_we <= 1'b1;
                            slot_waddr <= {slot, fidx[7:0] - 8'd4};
                            slot_wdata <= s_tdata;
                        end else begin
                            bad <= 1'b1;
                        end
                        if (s_tlast) begin
                            crc_drop <= !gone;
                            fl <= 1'b0;
                            if (DATA != 0) drop <= 1'b1;
                            st <= R_HDR;
                        end else if (pk_cnt + 1'b1 == pk_flits) begin
                            st <= R_FTR;
                        end
                    end
                    R_FTR: begin
                        if (!s_tlast) begin
                            bad <= 1'b1;
                            st <= R_SKIP;
                        end else begin
                            // decided in the check clock (s_tready is low in it)
                            st <= R_HDR;
                            crc <= crc_next;
                            c_pre <= !bad && (f_first == first_pkt) && (DATA != 0 || f_last) &&
                                     s_tdata[127:96] == 32'd0;
                            c_crc <= s_tdata[95:64];
                            c_last <= f_last;
                            // Used only if the check clock accepts the frame; no frame is
                            // pending while a flit is taken, so nothing reads them before.
                            if (first_pkt) begin
                                p_tid <= s_tdata[13:0];
                                p_src <= s_tdata[35:14];
                            end
                        end
                    end
                    default: begin // R_SKIP: to the end of the broken packet
                        if (s_tlast) begin
                            crc_drop <= !gone;
                            fl <= 1'b0;
                            if (DATA != 0) drop <= 1'b1;
                            st <= R_HDR;
                        end
                    end
                endcase
            end
            if (flush) begin
                pend <= 1'b0;
                if (in_frame_n) begin
                    bad <= 1'b1;
                    fl <= 1'b1;
                end
            end
            in_frame <= in_frame_n;
        end
    end
endmodule
