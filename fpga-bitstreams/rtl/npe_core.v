// NPE core: the register file of docs/dma-engine.md §3 and the engine's sequencer.
//
// One sequencer (st) does every memory access of the engine, one AXI burst at a time, through
// one internal AXI4 master (m_*) that npe_top splits into the queue port and the data port
// (m_q). In its idle state it picks, in this order: an arrived frame's RQ entry (control VC
// first), a kept WCQ entry, the next WQ entry, then the channels round-robin (a kept CQ entry,
// a RESUME, or the next SQ entry). A descriptor is fetched, decoded as strictly as the driver's
// SqEntry::decode, and run to its end: a block is read (realigned) into the transmit buffer and
// handed to the data-VC transmitter, a message to the control-VC transmitter. A descriptor
// whose transmitter is still busy is left in the SQ (not consumed) and fetched again once the
// transmitter is free, so the sequencer never waits on the link.
module npe_core #(
    parameter CHANNELS = 4,
    parameter SLOTS_LOG2 = 3
) (
    input  wire          clk,
    input  wire          rst_n,
    input  wire [21:0]   route_limit,
    // register file (from npe_axil)
    input  wire          wr_lo,
    input  wire          wr_hi,
    input  wire [15:3]   wr_addr,
    input  wire [63:0]   wr_data,
    input  wire          rd_en,
    input  wire [15:3]   rd_addr,
    output reg  [63:0]   rd_data,
    output reg           irq,
    output wire          enable_out,
    // internal AXI4 master
    output reg           m_q,
    output reg  [5:0]    m_id,
    output reg  [63:0]   m_araddr,
    output reg  [7:0]    m_arlen,
    output reg           m_arvalid,
    input  wire          m_arready,
    input  wire [127:0]  m_rdata,
    input  wire [1:0]    m_rresp,
    /* verilator lint_off UNUSEDSIGNAL */
    input  wire          m_rlast,        // bursts are counted; RLAST is not needed
    /* verilator lint_on UNUSEDSIGNAL */
    input  wire          m_rvalid,
    output reg           m_rready,
    output reg  [63:0]   m_awaddr,
    output reg  [7:0]    m_awlen,
    output reg           m_awvalid,
    input  wire          m_awready,
    output reg  [127:0]  m_wdata,
    output reg  [15:0]   m_wstrb,
    output reg           m_wlast,
    output reg           m_wvalid,
    input  wire          m_wready,
    input  wire [1:0]    m_bresp,
    input  wire          m_bvalid,
    output reg           m_bready,
    // transmit buffer (data VC payload) and data transmitter
    output reg           tb_we,
    output reg  [8:0]    tb_waddr,
    output reg  [127:0]  tb_wdata,
    output reg           txd_start,
    input  wire          txd_busy,
    // control transmitter and its message buffer
    output reg           txc_start,
    input  wire          txc_busy,
    input  wire          txc_rd_en,
    input  wire [1:0]    txc_rd_addr,
    output reg  [127:0]  txc_rd_data,
    // fields of the frame being started (both transmitters)
    output reg  [21:0]   tx_dst,
    output reg  [15:0]   tx_pdid,
    output reg  [13:0]   tx_tid,
    output wire [21:0]   tx_src,
    output reg  [7:0]    tx_msg_len,
    output reg  [48:0]   tx_dst_va,
    output reg  [12:0]   tx_bytes,
    // receivers
    output wire [(1<<SLOTS_LOG2)-1:0] slot_free,
    input  wire          rx_alloc,
    input  wire          rx_drop,
    input  wire [SLOTS_LOG2-1:0] rx_slot,
    output reg           rx_flush,
    input  wire          rxd_pend,
    input  wire [12:0]   rxd_len,
    input  wire [21:0]   rxd_src,
    input  wire [15:0]   rxd_pdid,
    input  wire [13:0]   rxd_tid,
    input  wire [7:0]    rxd_msg_len,
    input  wire [511:0]  rxd_msg,
    output reg           rxd_taken,
    input  wire          rxc_pend,
    input  wire [21:0]   rxc_src,
    input  wire [15:0]   rxc_pdid,
    input  wire [13:0]   rxc_tid,
    input  wire [7:0]    rxc_msg_len,
    input  wire [511:0]  rxc_msg,
    output reg           rxc_taken,
    input  wire          rx_crc_drop,
    input  wire          rx_held,
    // receive slot RAM read port (commits)
    output reg  [SLOTS_LOG2+7:0] sl_raddr,
    output reg           sl_re,
    input  wire [127:0]  sl_rdata
);
`include "npe_core_defs.vh"
`include "npe_core_regs.vh"
`include "npe_core_seq.vh"
endmodule
