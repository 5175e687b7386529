// AXI4-Lite slave front end of NPE's register window (docs/dma-engine.md §3).
//
// 64-bit data bus: a 32-bit register sits in the lane its address selects (bit 2), a 64-bit
// register uses both lanes; a 32-bit access to either lane is a whole-register access (a lane
// is written when any of its four strobes is set). One access at a time; every output is a
// register, so no combinational path runs from an AXI input to an AXI output. The register
// file itself lives in npe_core: this module hands it one write (`wr_*`, both lanes at once)
// or one read (`rd_*`, data back the next clock) per access.
module npe_axil (
    input  wire        clk,
    input  wire        rst_n,
    // AXI4-Lite slave
    // Address bits [2:0] select nothing: the lane comes from the strobes (writes) or is
    // returned whole (reads).
    /* verilator lint_off UNUSEDSIGNAL */
    input  wire [15:0] s_awaddr,
    input  wire        s_awvalid,
    output reg         s_awready,
    input  wire [63:0] s_wdata,
    input  wire [7:0]  s_wstrb,
    input  wire        s_wvalid,
    output reg         s_wready,
    output reg  [1:0]  s_bresp,
    output reg         s_bvalid,
    input  wire        s_bready,
    input  wire [15:0] s_araddr,
    /* verilator lint_on UNUSEDSIGNAL */
    input  wire        s_arvalid,
    output reg         s_arready,
    output reg  [63:0] s_rdata,
    output reg  [1:0]  s_rresp,
    output reg         s_rvalid,
    input  wire        s_rready,
    // register file side
    output reg         wr_lo,
    output reg         wr_hi,
    output reg  [15:3] wr_addr,
    output reg  [63:0] wr_data,
    output reg         rd_en,
    output reg  [15:3] rd_addr,
    input  wire [63:0] rd_data
);
    reg        have_aw;
    reg        have_w;
    reg [15:3] aw_addr;
    reg [63:0] w_data;
    reg [7:0]  w_strb;
    reg        rd_wait;

    always @(posedge clk) begin
        if (!rst_n) begin
            s_awready <= 1'b0;
            s_wready  <= 1'b0;
            s_bvalid  <= 1'b0;
            s_bresp   <= 2'b00;
            s_arready <= 1'b0;
            s_rvalid  <= 1'b0;
            s_rresp   <= 2'b00;
            s_rdata   <= 64'd0;
            have_aw   <= 1'b0;
            have_w    <= 1'b0;
            aw_addr   <= 13'd0;
            w_data    <= 64'd0;
            w_strb    <= 8'd0;
            wr_lo     <= 1'b0;
            wr_hi     <= 1'b0;
            wr_addr   <= 13'd0;
            wr_data   <= 64'd0;
            rd_en     <= 1'b0;
            rd_addr   <= 13'd0;
            rd_wait   <= 1'b0;
        end else begin
            wr_lo <= 1'b0;
            wr_hi <= 1'b0;
            rd_en <= 1'b0;
            // Write address and data, each accepted once (ready for one clock).
            s_awready <= !have_aw && !s_awready && !s_bvalid;
            s_wready  <= !have_w && !s_wready && !s_bvalid;
            if (s_awvalid && s_awready) begin
                have_aw <= 1'b1;
                aw_addr <= s_awaddr[15:3];
                s_awready <= 1'b0;
            end
            if (s_wvalid && s_wready) begin
                have_w <= 1'b1;
                w_data <= s_wdata;
                w_strb <= s_wstrb;
                s_wready <= 1'b0;
            end
            if (have_aw && have_w && !s_bvalid) begin
                wr_lo   <= |w_strb[3:0];
                wr_hi   <= |w_strb[7:4];
                wr_addr <= aw_addr;
                wr_data <= w_data;
                have_aw <= 1'b0;
                have_w  <= 1'b0;
                s_bvalid <= 1'b1;
                s_bresp  <= 2'b00;
            end
            if (s_bvalid && s_bready) s_bvalid <= 1'b0;
            // Reads: address, one clock in the register file, data.
            s_arready <= !s_arready && !rd_wait && !rd_en && !s_rvalid;
            if (s_arvalid && s_arready) begin
                s_arready <= 1'b0;
                rd_en     <= 1'b1;
                rd_addr   <= s_araddr[15:3];
            end
            if (rd_en) rd_wait <= 1'b1;
            if (rd_wait) begin
                rd_wait  <= 1'b0;
                s_rvalid <= 1'b1;
                s_rdata  <= rd_data;
                s_rresp  <= 2'b00;
            end
            if (s_rvalid && s_rready) s_rvalid <= 1'b0;
        end
    end
endmodule
