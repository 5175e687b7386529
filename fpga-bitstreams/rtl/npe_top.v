// NPE top level (docs/npe-rtl.md): AXI4-Lite register slave, two AXI4 masters (queue port:
// rings in pinned memory; data port: user memory through the SMMU, AXI ID = PDID[4:0] with
// bit 5 set for writes), the link as two AXI4-Stream pairs (data VC 0 and control VC 1, each a
// transmit and a receive stream), and the level interrupt line. One clock, synchronous
// active-low reset.
module npe_top #(
    parameter CHANNELS = 4,
    parameter SLOTS_LOG2 = 3
) (
    input  wire         clk,
    input  wire         rst_n,
    // routable coordinates are 0 .. route_limit-1 (a board constant)
    input  wire [21:0]  route_limit,
    output wire         irq,
    // AXI4-Lite register slave
    input  wire [15:0]  s_axil_awaddr,
    input  wire         s_axil_awvalid,
    output wire         s_axil_awready,
    input  wire [63:0]  s_axil_wdata,
    input  wire [7:0]   s_axil_wstrb,
    input  wire         s_axil_wvalid,
    output wire         s_axil_wready,
    output wire [1:0]   s_axil_bresp,
    output wire         s_axil_bvalid,
    input  wire         s_axil_bready,
    input  wire [15:0]  s_axil_araddr,
    input  wire         s_axil_arvalid,
    output wire         s_axil_arready,
    output wire [63:0]  s_axil_rdata,
    output wire [1:0]   s_axil_rresp,
    output wire         s_axil_rvalid,
    input  wire         s_axil_rready,
    // AXI4 master, queue port
    output wire [5:0]   m_axi_q_arid,
    output wire [63:0]  m_axi_q_araddr,
    output wire [7:0]   m_axi_q_arlen,
    output wire [2:0]   m_axi_q_arsize,
    output wire [1:0]   m_axi_q_arburst,
    output wire         m_axi_q_arvalid,
    input  wire         m_axi_q_arready,
    // One burst at a time: response IDs need no matching.
    /* verilator lint_off UNUSEDSIGNAL */
    input  wire [5:0]   m_axi_q_rid,
    /* verilator lint_on UNUSEDSIGNAL */
    input  wire [127:0] m_axi_q_rdata,
    input  wire [1:0]   m_axi_q_rresp,
    input  wire         m_axi_q_rlast,
    input  wire         m_axi_q_rvalid,
    output wire         m_axi_q_rready,
    output wire [5:0]   m_axi_q_awid,
    output wire [63:0]  m_axi_q_awaddr,
    output wire [7:0]   m_axi_q_awlen,
    output wire [2:0]   m_axi_q_awsize,
    output wire [1:0]   m_axi_q_awburst,
    output wire         m_axi_q_awvalid,
    input  wire         m_axi_q_awready,
    output wire [127:0] m_axi_q_wdata,
    output wire [15:0]  m_axi_q_wstrb,
    output wire         m_axi_q_wlast,
    output wire         m_axi_q_wvalid,
    input  wire         m_axi_q_wready,
    /* verilator lint_off UNUSEDSIGNAL */
    input  wire [5:0]   m_axi_q_bid,
    /* verilator lint_on UNUSEDSIGNAL */
    input  wire [1:0]   m_axi_q_bresp,
    input  wire         m_axi_q_bvalid,
    output wire         m_axi_q_bready,
    // AXI4 master, data port
    output wire [5:0]   m_axi_d_arid,
    output wire [63:0]  m_axi_d_araddr,
    output wire [7:0]   m_axi_d_arlen,
    output wire [2:0]   m_axi_d_arsize,
    output wire [1:0]   m_axi_d_arburst,
    output wire         m_axi_d_arvalid,
    input  wire         m_axi_d_arready,
    /* verilator lint_off UNUSEDSIGNAL */
    input  wire [5:0]   m_axi_d_rid,
    /* verilator lint_on UNUSEDSIGNAL */
    input  wire [127:0] m_axi_d_rdata,
    input  wire [1:0]   m_axi_d_rresp,
    input  wire         m_axi_d_rlast,
    input  wire         m_axi_d_rvalid,
    output wire         m_axi_d_rready,
    output wire [5:0]   m_axi_d_awid,
    output wire [63:0]  m_axi_d_awaddr,
    output wire [7:0]   m_axi_d_awlen,
    output wire [2:0]   m_axi_d_awsize,
    output wire [1:0]   m_axi_d_awburst,
    output wire         m_axi_d_awvalid,
    input  wire         m_axi_d_awready,
    output wire [127:0] m_axi_d_wdata,
    output wire [15:0]  m_axi_d_wstrb,
    output wire         m_axi_d_wlast,
    output wire         m_axi_d_wvalid,
    input  wire         m_axi_d_wready,
    /* verilator lint_off UNUSEDSIGNAL */
    input  wire [5:0]   m_axi_d_bid,
    /* verilator lint_on UNUSEDSIGNAL */
    input  wire [1:0]   m_axi_d_bresp,
    input  wire         m_axi_d_bvalid,
    output wire         m_axi_d_bready,
    // link, data VC
    output wire [127:0] tx_data_tdata,
    output wire         tx_data_tvalid,
    output wire         tx_data_tlast,
    input  wire         tx_data_tready,
    input  wire [127:0] rx_data_tdata,
    input  wire         rx_data_tvalid,
    input  wire         rx_data_tlast,
    output wire         rx_data_tready,
    // link, control VC
    output wire [127:0] tx_ctrl_tdata,
    output wire         tx_ctrl_tvalid,
    output wire         tx_ctrl_tlast,
    input  wire         tx_ctrl_tready,
    input  wire [127:0] rx_ctrl_tdata,
    input  wire         rx_ctrl_tvalid,
    input  wire         rx_ctrl_tlast,
    output wire         rx_ctrl_tready
);
    wire        enable_w;
    wire        wr_lo, wr_hi, rd_en;
    wire [15:3] wr_addr, rd_addr;
    wire [63:0] wr_data, rd_data;

    npe_axil u_axil (
        .clk(clk), .rst_n(rst_n),
        .s_awaddr(s_axil_awaddr), .s_awvalid(s_axil_awvalid), .s_awready(s_axil_awready),
        .s_wdata(s_axil_wdata), .s_wstrb(s_axil_wstrb), .s_wvalid(s_axil_wvalid),
        .s_wready(s_axil_wready), .s_bresp(s_axil_bresp), .s_bvalid(s_axil_bvalid),
        .s_bready(s_axil_bready), .s_araddr(s_axil_araddr), .s_arvalid(s_axil_arvalid),
        .s_arready(s_axil_arready), .s_rdata(s_axil_rdata), .s_rresp(s_axil_rresp),
        .s_rvalid(s_axil_rvalid), .s_rready(s_axil_rready),
        .wr_lo(wr_lo), .wr_hi(wr_hi), .wr_addr(wr_addr), .wr_data(wr_data),
        .rd_en(rd_en), .rd_addr(rd_addr), .rd_data(rd_data)
    );

    // The internal master and its split onto the two ports (m_q changes only between bursts).
    wire         m_q;
    wire [5:0]   m_id;
    wire [63:0]  m_araddr, m_awaddr;
    wire [7:0]   m_arlen, m_awlen;
    wire         m_arvalid, m_rready, m_awvalid, m_wlast, m_wvalid, m_bready;
    wire [127:0] m_wdata;
    wire [15:0]  m_wstrb;

    assign m_axi_q_arid = m_id;          assign m_axi_d_arid = m_id;
    assign m_axi_q_araddr = m_araddr;    assign m_axi_d_araddr = m_araddr;
    assign m_axi_q_arlen = m_arlen;      assign m_axi_d_arlen = m_arlen;
    assign m_axi_q_arsize = 3'd4;        assign m_axi_d_arsize = 3'd4;
    assign m_axi_q_arburst = 2'b01;      assign m_axi_d_arburst = 2'b01;
    assign m_axi_q_arvalid = m_arvalid && m_q;
    assign m_axi_d_arvalid = m_arvalid && !m_q;
    assign m_axi_q_rready = m_rready && m_q;
    assign m_axi_d_rready = m_rready && !m_q;
    assign m_axi_q_awid = m_id;          assign m_axi_d_awid = m_id;
    assign m_axi_q_awaddr = m_awaddr;    assign m_axi_d_awaddr = m_awaddr;
    assign m_axi_q_awlen = m_awlen;      assign m_axi_d_awlen = m_awlen;
    assign m_axi_q_awsize = 3'd4;        assign m_axi_d_awsize = 3'd4;
    assign m_axi_q_awburst = 2'b01;      assign m_axi_d_awburst = 2'b01;
    assign m_axi_q_awvalid = m_awvalid && m_q;
    assign m_axi_d_awvalid = m_awvalid && !m_q;
    assign m_axi_q_wdata = m_wdata;      assign m_axi_d_wdata = m_wdata;
    assign m_axi_q_wstrb = m_wstrb;      assign m_axi_d_wstrb = m_wstrb;
    assign m_axi_q_wlast = m_wlast;      assign m_axi_d_wlast = m_wlast;
    assign m_axi_q_wvalid = m_wvalid && m_q;
    assign m_axi_d_wvalid = m_wvalid && !m_q;
    assign m_axi_q_bready = m_bready && m_q;
    assign m_axi_d_bready = m_bready && !m_q;

    wire         arready = m_q ? m_axi_q_arready : m_axi_d_arready;
    wire [127:0] rdata = m_q ? m_axi_q_rdata : m_axi_d_rdata;
    wire [1:0]   rresp = m_q ? m_axi_q_rresp : m_axi_d_rresp;
    wire         rlast = m_q ? m_axi_q_rlast : m_axi_d_rlast;
    wire         rvalid = m_q ? m_axi_q_rvalid : m_axi_d_rvalid;
    wire         awready = m_q ? m_axi_q_awready : m_axi_d_awready;
    wire         wready = m_q ? m_axi_q_wready : m_axi_d_wready;
    wire [1:0]   bresp = m_q ? m_axi_q_bresp : m_axi_d_bresp;
    wire         bvalid = m_q ? m_axi_q_bvalid : m_axi_d_bvalid;

    // Transmit buffer and transmitters.
    wire         tb_we, txd_start, txd_busy, txc_start, txc_busy;
    wire [8:0]   tb_waddr;
    wire [127:0] tb_wdata;
    wire         txd_rd_en, txc_rd_en;
    wire [8:0]   txd_rd_addr;
    wire [1:0]   txc_rd_addr;
    wire [127:0] txd_rd_data, txc_rd_data;
    wire [21:0]  tx_dst, tx_src;
    wire [15:0]  tx_pdid;
    wire [13:0]  tx_tid;
    wire [7:0]   tx_msg_len;
    wire [48:0]  tx_dst_va;
    wire [12:0]  tx_bytes;

    npe_ram #(.AW(9), .DW(128)) u_txbuf (
        .clk(clk), .we(tb_we), .waddr(tb_waddr), .wdata(tb_wdata),
        .re(txd_rd_en), .raddr(txd_rd_addr), .rdata(txd_rd_data)
    );

    npe_pkt_tx #(.AW(9)) u_tx_data (
        .clk(clk), .rst_n(rst_n), .start(txd_start),
        .f_dst(tx_dst), .f_pdid(tx_pdid), .f_tid(tx_tid), .f_src(tx_src),
        .f_msg_len(tx_msg_len), .f_type(5'd0), .f_vc(1'b0), .f_dst_va(tx_dst_va),
        .f_bytes(tx_bytes), .busy(txd_busy),
        .rd_en(txd_rd_en), .rd_addr(txd_rd_addr), .rd_data(txd_rd_data),
        .m_tdata(tx_data_tdata), .m_tvalid(tx_data_tvalid), .m_tlast(tx_data_tlast),
        .m_tready(tx_data_tready)
    );

    npe_pkt_tx #(.AW(2)) u_tx_ctrl (
        .clk(clk), .rst_n(rst_n), .start(txc_start),
        .f_dst(tx_dst), .f_pdid(tx_pdid), .f_tid(tx_tid), .f_src(tx_src),
        .f_msg_len(tx_msg_len), .f_type(5'd2), .f_vc(1'b1), .f_dst_va(tx_dst_va),
        .f_bytes(tx_bytes), .busy(txc_busy),
        .rd_en(txc_rd_en), .rd_addr(txc_rd_addr), .rd_data(txc_rd_data),
        .m_tdata(tx_ctrl_tdata), .m_tvalid(tx_ctrl_tvalid), .m_tlast(tx_ctrl_tlast),
        .m_tready(tx_ctrl_tready)
    );

    // Receivers and the receive slots.
    localparam NS = 1 << SLOTS_LOG2;
    wire [NS-1:0]         slot_free;
    wire                  rx_alloc, rx_drop, rx_flush;
    wire [SLOTS_LOG2-1:0] rx_slot;
    wire                  sl_we, sl_re;
    wire [SLOTS_LOG2+7:0] sl_waddr, sl_raddr;
    wire [127:0]          sl_wdata, sl_rdata;
    wire                  rxd_pend, rxc_pend, rxd_taken, rxc_taken;
    wire [12:0]           rxd_len;
    /* verilator lint_off UNUSEDSIGNAL */
    wire [12:0]           rxc_len;      // a message has no payload length
    /* verilator lint_on UNUSEDSIGNAL */
    wire [21:0]           rxd_src, rxc_src;
    wire [15:0]           rxd_pdid, rxc_pdid;
    wire [13:0]           rxd_tid, rxc_tid;
    wire [7:0]            rxd_msg_len, rxc_msg_len;
    wire [511:0]          rxd_msg, rxc_msg;
    wire                  rxd_crc_drop, rxc_crc_drop, rxd_held, rxc_held;

    npe_ram #(.AW(SLOTS_LOG2 + 8), .DW(128)) u_slots (
        .clk(clk), .we(sl_we), .waddr(sl_waddr), .wdata(sl_wdata),
        .re(sl_re), .raddr(sl_raddr), .rdata(sl_rdata)
    );

    npe_pkt_rx #(.DATA(1), .SLOTS_LOG2(SLOTS_LOG2)) u_rx_data (
        .clk(clk), .rst_n(rst_n), .enable(enable_w), .flush(rx_flush),
        .s_tdata(rx_data_tdata), .s_tvalid(rx_data_tvalid), .s_tlast(rx_data_tlast),
        .s_tready(rx_data_tready),
        .slot_free(slot_free), .alloc(rx_alloc), .drop(rx_drop), .slot(rx_slot),
        .slot_we(sl_we), .slot_waddr(sl_waddr), .slot_wdata(sl_wdata),
        .pend(rxd_pend), .p_len(rxd_len), .p_src(rxd_src), .p_pdid(rxd_pdid), .p_tid(rxd_tid),
        .p_msg_len(rxd_msg_len), .p_msg(rxd_msg), .taken(rxd_taken),
        .crc_drop(rxd_crc_drop), .held(rxd_held)
    );

    // The control receiver has no slots: its slot outputs are left open.
    /* verilator lint_off PINCONNECTEMPTY */
    npe_pkt_rx #(.DATA(0), .SLOTS_LOG2(SLOTS_LOG2)) u_rx_ctrl (
        .clk(clk), .rst_n(rst_n), .enable(enable_w), .flush(rx_flush),
        .s_tdata(rx_ctrl_tdata), .s_tvalid(rx_ctrl_tvalid), .s_tlast(rx_ctrl_tlast),
        .s_tready(rx_ctrl_tready),
        .slot_free({NS{1'b0}}), .alloc(), .drop(), .slot(),
        .slot_we(), .slot_waddr(), .slot_wdata(),
        .pend(rxc_pend), .p_len(rxc_len), .p_src(rxc_src), .p_pdid(rxc_pdid), .p_tid(rxc_tid),
        .p_msg_len(rxc_msg_len), .p_msg(rxc_msg), .taken(rxc_taken),
        .crc_drop(rxc_crc_drop), .held(rxc_held)
    );
    /* verilator lint_on PINCONNECTEMPTY */

    npe_core #(.CHANNELS(CHANNELS), .SLOTS_LOG2(SLOTS_LOG2)) u_core (
        .clk(clk), .rst_n(rst_n), .route_limit(route_limit),
        .wr_lo(wr_lo), .wr_hi(wr_hi), .wr_addr(wr_addr), .wr_data(wr_data),
        .rd_en(rd_en), .rd_addr(rd_addr), .rd_data(rd_data), .irq(irq), .enable_out(enable_w),
        .m_q(m_q), .m_id(m_id), .m_araddr(m_araddr), .m_arlen(m_arlen), .m_arvalid(m_arvalid),
        .m_arready(arready), .m_rdata(rdata), .m_rresp(rresp), .m_rlast(rlast),
        .m_rvalid(rvalid), .m_rready(m_rready), .m_awaddr(m_awaddr), .m_awlen(m_awlen),
        .m_awvalid(m_awvalid), .m_awready(awready), .m_wdata(m_wdata), .m_wstrb(m_wstrb),
        .m_wlast(m_wlast), .m_wvalid(m_wvalid), .m_wready(wready), .m_bresp(bresp),
        .m_bvalid(bvalid), .m_bready(m_bready),
        .tb_we(tb_we), .tb_waddr(tb_waddr), .tb_wdata(tb_wdata),
        .txd_start(txd_start), .txd_busy(txd_busy),
        .txc_start(txc_start), .txc_busy(txc_busy), .txc_rd_en(txc_rd_en),
        .txc_rd_addr(txc_rd_addr), .txc_rd_data(txc_rd_data),
        .tx_dst(tx_dst), .tx_pdid(tx_pdid), .tx_tid(tx_tid), .tx_src(tx_src),
        .tx_msg_len(tx_msg_len), .tx_dst_va(tx_dst_va), .tx_bytes(tx_bytes),
        .slot_free(slot_free), .rx_alloc(rx_alloc), .rx_drop(rx_drop), .rx_slot(rx_slot),
        .rx_flush(rx_flush),
        .rxd_pend(rxd_pend), .rxd_len(rxd_len), .rxd_src(rxd_src), .rxd_pdid(rxd_pdid),
        .rxd_tid(rxd_tid), .rxd_msg_len(rxd_msg_len), .rxd_msg(rxd_msg), .rxd_taken(rxd_taken),
        .rxc_pend(rxc_pend), .rxc_src(rxc_src), .rxc_pdid(rxc_pdid), .rxc_tid(rxc_tid),
        .rxc_msg_len(rxc_msg_len), .rxc_msg(rxc_msg), .rxc_taken(rxc_taken),
        .rx_crc_drop(rxd_crc_drop || rxc_crc_drop), .rx_held(rxd_held || rxc_held),
        .sl_raddr(sl_raddr), .sl_re(sl_re), .sl_rdata(sl_rdata)
    );
endmodule
