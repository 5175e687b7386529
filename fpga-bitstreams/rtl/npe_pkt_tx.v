// Link transmitter: cuts one frame (a block or a message) into ExaNet-style packets on an
// AXI4-Stream (docs/npe-rtl.md "Link framing"): per packet a header flit, up to 16 payload
// flits (256 B) and a footer flit carrying the CRC-32C of header, payload and the footer's
// own fields; TLAST marks the footer. The payload is fetched from a synchronous RAM through
// rd_*, word 0 first.
//
// Every output is a register; TREADY only decides whether the output register is reloaded.
module npe_pkt_tx #(
    parameter AW = 9
) (
    input  wire          clk,
    input  wire          rst_n,
    // frame to send (sampled on start, which is only raised while busy is low)
    input  wire          start,
    input  wire [21:0]   f_dst,
    input  wire [15:0]   f_pdid,
    input  wire [13:0]   f_tid,
    input  wire [21:0]   f_src,
    input  wire [7:0]    f_msg_len,
    input  wire [4:0]    f_type,
    input  wire          f_vc,
    input  wire [48:0]   f_dst_va,
    input  wire [12:0]   f_bytes,
    output reg           busy,
    // payload RAM
    output reg           rd_en,
    output reg  [AW-1:0] rd_addr,
    input  wire [127:0]  rd_data,
    // AXI4-Stream master
    output reg  [127:0]  m_tdata,
    output reg           m_tvalid,
    output reg           m_tlast,
    input  wire          m_tready
);

    localparam T_IDLE = 3'd0, T_HDR = 3'd1, T_FETCH = 3'd2, T_WAIT = 3'd3, T_DATA = 3'd4,
               T_PAY = 3'd5, T_FTR = 3'd6;

    reg [2:0]  st;
    reg [21:0] dst;
    reg [15:0] pdid;
    reg [13:0] tid;
    reg [21:0] src;
    reg [7:0]  msg_len;
    reg [4:0]  ptype;
    reg        vc;
    reg [48:0] dst_va;
    reg [12:0] left;       // payload bytes not yet sent
    reg [8:0]  pkt_left;   // bytes of this packet not yet sent
    reg [3:0]  pkt_idx;
    reg        first;
    reg [31:0] crc;
    reg [127:0] flit;

    wire out_free = !m_tvalid || m_tready;
    wire [12:0] pkt_bytes13 = (left > 13'd256) ? 13'd256 : left;
    wire [8:0]  pkt_bytes = pkt_bytes13[8:0];
    wire [4:0]  pkt_flits = pkt_bytes13[8:4] + {4'd0, |pkt_bytes13[3:0]};

    // Payload bytes past the frame's end are sent as zero.
    function [127:0] mask_tail;
        input [127:0] d;
        input [8:0] n;
        integer b;
        begin
            for (b = 0; b < 16; b = b + 1)
                mask_tail[b*8 +: 8] = (b < n) ? d[b*8 +: 8] : 8'd0;
        end
    endfunction

    wire [127:0] hdr = {7'd0, msg_len, dst_va, 6'd0, pkt_bytes, pkt_flits, vc, ptype, pdid, dst};
    wire [127:0] masked = mask_tail(flit, pkt_left);
    wire         last_pkt = (left == 13'd0);
    // The footer's fields (TID, source, FIRST, LAST, packet index), bits [63:0].
    wire [63:0]  ftr_fields = {12'd0, 10'd0, pkt_idx, last_pkt, first, src, tid};
    // One CRC tree: the header starts a packet's CRC, each payload flit continues it, and the
    // footer's fields (as a flit with bits [127:64] zero) end it.
    wire [31:0]  crc_upd;
    npe_crc32c u_crc (
        .crc_in(st == T_HDR ? 32'hFFFF_FFFF : crc),
        .flit(st == T_HDR ? hdr : st == T_FTR ? {64'd0, ftr_fields} : masked),
        .crc_out(crc_upd)
    );
    wire [127:0] ftr = {32'd0, ~crc_upd, ftr_fields};

    always @(posedge clk) begin
        if (!rst_n) begin
            st <= T_IDLE;
            busy <= 1'b0;
            rd_en <= 1'b0;
            rd_addr <= {AW{1'b0}};
            m_tdata <= 128'd0;
            m_tvalid <= 1'b0;
            m_tlast <= 1'b0;
            dst <= 22'd0; pdid <= 16'd0; tid <= 14'd0; src <= 22'd0; msg_len <= 8'd0;
            ptype <= 5'd0; vc <= 1'b0; dst_va <= 49'd0; left <= 13'd0; pkt_left <= 9'd0;
            pkt_idx <= 4'd0; first <= 1'b0; crc <= 32'hFFFF_FFFF; flit <= 128'd0;
        end else begin
            rd_en <= 1'b0;
            if (m_tvalid && m_tready) m_tvalid <= 1'b0;
            case (st)
                T_IDLE: if (start) begin
                    dst <= f_dst; pdid <= f_pdid; tid <= f_tid; src <= f_src;
                    msg_len <= f_msg_len; ptype <= f_type; vc <= f_vc; dst_va <= f_dst_va;
                    left <= f_bytes; pkt_idx <= 4'd0; first <= 1'b1;
                    rd_addr <= {AW{1'b0}};
                    busy <= 1'b1;
                    st <= T_HDR;
                end
                T_HDR: if (out_free) begin
                    m_tdata <= hdr;
                    m_tvalid <= 1'b1;
                    m_tlast <= 1'b0;
                    crc <= crc_upd;
                    pkt_left <= pkt_bytes;
                    left <= left - pkt_bytes13;
                    st <= T_FETCH;
                end
                T_FETCH: begin
                    rd_en <= 1'b1;
                    st <= T_WAIT;
                end
                T_WAIT: st <= T_DATA;
                T_DATA: begin
                    flit <= rd_data;
                    st <= T_PAY;
                end
                T_PAY: if (out_free) begin
                    m_tdata <= masked;
                    m_tvalid <= 1'b1;
                    crc <= crc_upd;
                    rd_addr <= rd_addr + 1'b1;
                    if (pkt_left > 9'd16) begin
                        pkt_left <= pkt_left - 9'd16;
                        st <= T_FETCH;
                    end else begin
                        pkt_left <= 9'd0;
                        st <= T_FTR;
                    end
                end
                T_FTR: if (out_free) begin
                    m_tdata <= ftr;
                    m_tvalid <= 1'b1;
                    m_tlast <= 1'b1;
                    first <= 1'b0;
                    pkt_idx <= pkt_idx + 1'b1;
                    if (last_pkt) begin
                        busy <= 1'b0;
                        st <= T_IDLE;
                    end else begin
                        st <= T_HDR;
                    end
                end
                default: st <= T_IDLE;
            endcase
        end
    end
endmodule
