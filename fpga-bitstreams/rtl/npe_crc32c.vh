// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of one 16-byte flit, byte 0 in
// bits [7:0] first. The running value is kept un-inverted: start from 32'hFFFF_FFFF and
// invert the result (docs/npe-rtl.md "Link framing"; the same CRC as docs/protocol.md).
function [31:0] crc32c_flit;
    input [31:0] crc_in;
    input [127:0] flit;
    integer i;
    reg [31:0] c;
    begin
        c = crc_in;
        for (i = 0; i < 128; i = i + 1) begin
            c = (c >> 1) ^ ((c[0] ^ flit[i]) ? 32'h82F6_3B78 : 32'h0000_0000);
        end
        crc32c_flit = c;
    end
endfunction
