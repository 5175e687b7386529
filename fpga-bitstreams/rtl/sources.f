npe_top.v
npe_axil.v
npe_core.v
npe_pkt_tx.v
npe_pkt_rx.v
npe_ram.v
npe_crc32c.v
