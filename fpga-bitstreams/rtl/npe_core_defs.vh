// npe_core: constants, state and helpers (included once, inside the module).

localparam NS = 1 << SLOTS_LOG2;
// CHANNELS is a power of two, 2 ..= 32; channel numbers are CW bits wide.
localparam CW = $clog2(CHANNELS);
localparam [7:0] MAX_CH_LOG2 = 8'd6;     // CAPS [19:16]
localparam [7:0] MAX_ENG_LOG2 = 8'd8;    // CAPS [23:20]
localparam [31:0] ID_VALUE = 32'h4E50_4501;
localparam [31:0] CAPS_VALUE = CHANNELS | (SLOTS_LOG2 << 12) | (6 << 16) | (8 << 20) | (1 << 24);

// Status codes (§7).
localparam [7:0] ST_OK = 8'd0, ST_SRC_FAULT = 8'd1, ST_DST_FAULT = 8'd2, ST_BAD = 8'd3,
                 ST_LINK = 8'd4;
// GEVENT bits.
localparam GE_BAD_DOORBELL = 0, GE_LINK_ERROR = 1, GE_CRC_DROP = 2, GE_RX_HELD = 3,
           GE_QUEUE_ERROR = 4;
// CH_IRQ bits.
localparam CI_COMPLETION = 0, CI_LOCAL_FAULT = 1, CI_ERROR = 2;

// Sequencer states.
localparam [4:0]
    S_IDLE = 5'd0, S_SQ_DONE = 5'd1, S_SRC_NEXT = 5'd2, S_SRC_DONE = 5'd3, S_SRC_TAIL = 5'd4,
    S_MSG_COPY = 5'd5, S_SEND = 5'd6, S_FINISH = 5'd7, S_CQ_DONE = 5'd8, S_WQ_DONE = 5'd9,
    S_CMT_NEXT = 5'd10, S_CMT_DONE = 5'd11, S_WCQ = 5'd12, S_WCQ_DONE = 5'd13, S_RQ_DONE = 5'd14,
    S_CQ = 5'd15,
    // the memory access micro-sequence
    M_AR = 5'd16, M_R = 5'd17, M_WPREP = 5'd19, M_WWAIT = 5'd20, M_WLOAD = 5'd21,
    M_WSEND = 5'd22, M_B = 5'd23,
    // one idle clock after an RQ entry, while the receiver drops the frame it held
    S_RQ_GAP = 5'd24;
// What a memory access is for.
localparam [2:0] P_SQ = 3'd0, P_SRC = 3'd1, P_WQ = 3'd2, P_CQ = 3'd3, P_WCQ = 3'd4, P_RQ = 3'd5,
                 P_COMMIT = 3'd6;

// Global registers.
reg         enable, irq_en, sr_req;
reg [31:0]  node_reg;
reg [4:0]   gevent;
reg [63:0]  rq_base, wq_base, wcq_base;
reg [4:0]   rq_log2, wq_log2, wcq_log2;
reg [31:0]  rq_head, rq_tail, wq_head, wq_tail, wcq_head, wcq_tail;
reg         rq_err, wq_err, wcq_err;
reg [31:0]  tx_count, rx_count;
// Receive slots: busy from the first packet on, full once its RQ entry is written.
reg [NS-1:0] slot_busy, slot_full;
reg [12:0]  slot_len[0:NS-1];
// The kept WCQ entry.
reg         wcqp;
reg [7:0]   wcqp_status, wcqp_slot;
reg [31:0]  wcqp_bytes;
reg [63:0]  wcqp_cookie, wcqp_fault;
reg [1:0]   wcqp_resp;

// Channel registers.
reg         ch_en[0:CHANNELS-1];
reg         ch_irq_en[0:CHANNELS-1];
reg [15:0]  ch_pdid[0:CHANNELS-1];
reg [63:0]  sq_base[0:CHANNELS-1];
reg [4:0]   sq_log2[0:CHANNELS-1];
reg [31:0]  sq_head[0:CHANNELS-1];
reg [31:0]  sq_tail[0:CHANNELS-1];
reg         sq_err[0:CHANNELS-1];
reg [63:0]  cq_base[0:CHANNELS-1];
reg [4:0]   cq_log2[0:CHANNELS-1];
reg [31:0]  cq_head[0:CHANNELS-1];
reg [31:0]  cq_tail[0:CHANNELS-1];
reg         cq_err[0:CHANNELS-1];
reg [2:0]   ch_irq[0:CHANNELS-1];
reg [7:0]   last_err[0:CHANNELS-1];
reg [63:0]  fault_addr[0:CHANNELS-1];
reg [15:0]  fault_idx[0:CHANNELS-1];
reg         fault_valid[0:CHANNELS-1];
reg [1:0]   fault_resp[0:CHANNELS-1];
reg         fw[0:CHANNELS-1];           // FAULT_WAIT
reg [1:0]   resume[0:CHANNELS-1];       // RESUME written: [0] RETRY, [1] SKIP
reg [1:0]   txwait[0:CHANNELS-1];       // left in the SQ for a busy transmitter: [0] data, [1] control
// The kept CQ entry of each channel.
reg         cqp[0:CHANNELS-1];
reg [7:0]   cqp_status[0:CHANNELS-1];
reg [15:0]  cqp_index[0:CHANNELS-1];
reg [31:0]  cqp_bytes[0:CHANNELS-1];
reg [63:0]  cqp_cookie[0:CHANNELS-1];
reg [63:0]  cqp_fault[0:CHANNELS-1];

// Sequencer.
reg [4:0]   st, ret;
reg [2:0]   purp;
reg [CW-1:0] cur;                       // channel being served
reg [CW-1:0] rr;                        // round-robin start
reg         rq_from_data;
reg [1023:0] desc;
reg [255:0] wqe;
reg         mop_err;
reg [1:0]   mop_resp;
reg [4:0]   beat;                       // beat within the burst
reg [4:0]   nbeats;                     // beats of the burst
reg [8:0]   gbeat;                      // beat within the block (source read, commit)
reg [127:0] prev;                       // previous beat (realignment)
reg [31:0]  done_bytes;
reg [10:0]  wait_cnt;                   // clocks an access has waited (CH_STATUS STALLED)
reg [63:0]  fin_fault;
reg [7:0]   fin_status;
reg [31:0]  fin_bytes;
reg         resuming;

assign tx_src = node_reg[21:0];
assign slot_free = ~slot_busy;

function [32:0] ring_size;
    input [4:0] l;
    begin
        ring_size = 33'd1 << l;
    end
endfunction

// Entry address of a ring: {overflow, address}; entries of 128 bytes (`big`) or 32.
function [64:0] ring_addr;
    input [63:0] base;
    input [4:0] l;
    input [31:0] index;
    input big;
    reg [31:0] slot;
    begin
        slot = index & ~(32'hFFFF_FFFF << l);
        ring_addr = {1'b0, base} + (big ? {26'd0, slot, 7'd0} : {28'd0, slot, 5'd0});
    end
endfunction

function phase_of;
    input [31:0] index;
    input [4:0] l;
    begin
        phase_of = !index[l];
    end
endfunction

function [4:0] clamp_log2;
    input [4:0] v;
    input [7:0] max;
    begin
        clamp_log2 = ({3'd0, v} > max) ? max[4:0] : v;
    end
endfunction

// Descriptor fields (§4.1).
wire [63:0] dw0 = desc[63:0];
wire [63:0] dw1 = desc[127:64];
wire [63:0] dw2 = desc[191:128];
wire [63:0] dw3 = desc[255:192];
wire [63:0] dw4 = desc[319:256];
wire [7:0]  d_op = dw0[7:0];
wire        d_signal = dw0[8];
wire [13:0] d_tid = dw0[29:16];
wire [31:0] d_len = dw0[63:32];
wire [21:0] d_peer = dw2[21:0];
wire [15:0] d_pdid = dw2[37:22];
wire [7:0]  d_msg_len = dw2[45:38];

// A byte of the inline message at or past MSG_LEN is not zero (§4.1). Checked as the
// message's beats (4..7) arrive, against MSG_LEN of beat 1, which is already in `desc`: one
// 16-byte check per beat instead of one over all 64 bytes.
function beat_tail_nz;
    input [127:0] d;
    input [1:0] w;          // message word: bytes w*16 ..
    input [7:0] n;
    integer b;
    begin
        beat_tail_nz = 1'b0;
        for (b = 0; b < 16; b = b + 1)
            if ({2'd0, w, b[3:0]} >= n && d[b*8 +: 8] != 8'd0) beat_tail_nz = 1'b1;
    end
endfunction
reg         msg_nz;                     // set by beat_tail_nz while the descriptor arrives

wire d_res = dw0[15:9] != 7'd0 || dw0[31:30] != 2'd0 || dw2[63:46] != 18'd0 ||
             desc[511:320] != 192'd0 || dw1[63:49] != 15'd0 || dw3[63:49] != 15'd0 ||
             d_msg_len > 8'd64 || msg_nz;
wire d_block = d_op == 8'd1 && d_len != 32'd0 && d_len <= 32'd4096 && d_msg_len >= 8'd16;
wire d_msg = d_op == 8'd2 && d_len == 32'd0 && dw1 == 64'd0 && dw3 == 64'd0 &&
             d_msg_len >= 8'd16;
wire d_nop = d_op == 8'd3 && d_len == 32'd0 && dw1 == 64'd0 && dw3 == 64'd0;
wire d_good = !d_res && (d_block || d_msg || d_nop);
wire d_reach = node_reg[31] && d_peer != node_reg[21:0] && d_peer < route_limit;

// Write entry fields (§4.4).
wire [63:0] ww0 = wqe[63:0];
wire [63:0] ww1 = wqe[127:64];
wire [63:0] ww2 = wqe[191:128];
wire [63:0] ww3 = wqe[255:192];
wire [7:0]  w_op = ww0[7:0];
wire [7:0]  w_slot = ww0[15:8];
wire [15:0] w_pdid = ww0[31:16];
wire [31:0] w_len = ww0[63:32];
wire        w_fmt = ww3 == 64'd0 && ww1[63:49] == 15'd0;
wire        w_commit = w_fmt && w_op == 8'd1 && w_len != 32'd0;
wire        w_release = w_fmt && w_op == 8'd2 && w_pdid == 16'd0 && w_len == 32'd0 &&
                        ww1 == 64'd0;
wire        w_slot_ok = w_slot < NS && slot_full[w_slot[SLOTS_LOG2-1:0]] &&
                        w_len <= {19'd0, slot_len[w_slot[SLOTS_LOG2-1:0]]};

// Block geometry of the current source read or commit: va, length, first beat address.
wire [63:0] blk_va = (purp == P_COMMIT) ? ww1 : dw1;
wire [31:0] blk_len = (purp == P_COMMIT) ? w_len : d_len;
wire [63:0] blk_end = blk_va + {32'd0, blk_len};
// Beats of the block (at most 257): ceil(end / 16) - floor(va / 16) modulo 512, which only
// depends on the low 13 bits of va and length (13-bit adders, not 64-bit ones).
wire [12:0] blk_end13 = blk_va[12:0] + blk_len[12:0];
wire [8:0]  blk_beats = blk_end13[12:4] + {8'd0, |blk_end13[3:0]} - blk_va[12:4];
wire [63:0] blk_addr = {blk_va[63:4], 4'd0} + {51'd0, gbeat, 4'd0};
wire [8:0]  page_beats = 9'd256 - {1'b0, blk_addr[11:4]};
wire [8:0]  left_beats = blk_beats - gbeat;
wire [8:0]  burst_beats = (left_beats < page_beats ? left_beats : page_beats) > 9'd16 ? 9'd16
                        : (left_beats < page_beats ? left_beats : page_beats);
wire [63:0] burst_end = blk_addr + {51'd0, burst_beats, 4'd0};
wire [3:0]  blk_off = blk_va[3:0];

// Word `i` of a 4-word (512-bit) message: a 4:1 multiplexer written as one (a part-select
// at a variable offset becomes a shifter over the whole vector).
function [127:0] word4;
    input [511:0] m;
    input [1:0] i;
    begin
        case (i)
            2'd0: word4 = m[127:0];
            2'd1: word4 = m[255:128];
            2'd2: word4 = m[383:256];
            default: word4 = m[511:384];
        endcase
    end
endfunction

// Realignment: bytes of a 32-byte window {hi, lo} starting at byte `o`.
function [127:0] take16;
    input [255:0] w;
    input [3:0] o;
    begin
        take16 = w[o*8 +: 128];
    end
endfunction

// Byte strobes of beat `k` of a commit of `n` beats: byte i is written when it falls in
// [va, va + len), i.e. not below the start offset `o` in the first beat and not at or past
// the end offset `e` (0: the whole beat) in the last.
function [15:0] strobes;
    input [8:0] k;
    input [8:0] n;
    input [3:0] o;
    input [3:0] e;
    integer i;
    begin
        for (i = 0; i < 16; i = i + 1)
            strobes[i] = !(k == 9'd0 && i[3:0] < o) &&
                         !(k + 9'd1 == n && e != 4'd0 && i[3:0] >= e);
    end
endfunction

// Channel picker: the first channel from rr with work (§4). Whether a channel has work is
// computed once per channel (ch_work); only those bits are rotated by rr, so the per-channel
// registers are not multiplexed by the rotating index.
reg [CHANNELS-1:0] ch_work;
reg         pick_any;
reg [CW-1:0] pick_ch;
integer     pi;
reg [CW-1:0] pc;
always @(*) begin
    for (pi = 0; pi < CHANNELS; pi = pi + 1)
        ch_work[pi] = ch_en[pi] && (
            (cqp[pi] && !cq_err[pi]) ||
            (fw[pi] && resume[pi] != 2'd0 && !sq_err[pi]) ||
            (!fw[pi] && !cqp[pi] && !sq_err[pi] && sq_tail[pi] != sq_head[pi] &&
             {1'b0, cq_tail[pi] - cq_head[pi]} < ring_size(cq_log2[pi]) &&
             !(txwait[pi][0] && txd_busy) && !(txwait[pi][1] && txc_busy)));
    pick_any = 1'b0;
    pick_ch = {CW{1'b0}};
    for (pi = 0; pi < CHANNELS; pi = pi + 1) begin
        pc = rr + pi[CW-1:0];
        if (ch_work[pc] && !pick_any) begin
            pick_any = 1'b1;
            pick_ch = pc;
        end
    end
end
