// Simple dual-port RAM: one synchronous write port, one synchronous read port (read data one
// clock after the address). Written so that Yosys maps it to block RAM and Verilator models it
// as an array.
module npe_ram #(
    parameter AW = 9,
    parameter DW = 128
) (
    input  wire          clk,
    input  wire          we,
    input  wire [AW-1:0] waddr,
    input  wire [DW-1:0] wdata,
    input  wire          re,
    input  wire [AW-1:0] raddr,
    output reg  [DW-1:0] rdata
);
    reg [DW-1:0] mem[0:(1<<AW)-1];

    always @(posedge clk) begin
        if (we) mem[waddr] <= wdata;
        if (re) rdata <= mem[raddr];
    end
endmodule
