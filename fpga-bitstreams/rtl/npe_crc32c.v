// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of one 16-byte flit, byte 0 in
// bits [7:0] first, as a flat XOR network: the CRC is linear in {flit, crc_in}, so each output
// bit is the XOR of the input bits whose unit vector sets it. The columns are computed at
// elaboration by the bit-serial definition (crc_serial), so the network is that definition.
// The running value is kept un-inverted: start from 32'hFFFF_FFFF and invert the result
// (docs/npe-rtl.md "Link framing"; the same CRC as docs/protocol.md).
module npe_crc32c (
    input  wire [31:0]  crc_in,
    input  wire [127:0] flit,
    output wire [31:0]  crc_out
);
    function [31:0] crc_serial;
        input [31:0] c0;
        input [127:0] f;
        integer i;
        reg [31:0] c;
        begin
            c = c0;
            for (i = 0; i < 128; i = i + 1)
                c = (c >> 1) ^ ((c[0] ^ f[i]) ? 32'h82F6_3B78 : 32'h0000_0000);
            crc_serial = c;
        end
    endfunction

    wire [159:0] x = {flit, crc_in};
    wire [31:0] term[0:159];
    genvar k;
    generate
        for (k = 0; k < 160; k = k + 1) begin : g_col
            localparam [31:0] COL = (k < 32) ? crc_serial(32'd1 << k, 128'd0)
                                             : crc_serial(32'd0, 128'd1 << (k - 32));
            assign term[k] = COL & {32{x[k]}};
        end
    endgenerate

    reg [31:0] acc;
    integer n;
    always @(*) begin
        acc = 32'd0;
        for (n = 0; n < 160; n = n + 1) acc = acc ^ term[n];
    end
    assign crc_out = acc;
endmodule
