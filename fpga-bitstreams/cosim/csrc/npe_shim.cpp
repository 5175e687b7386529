// C ABI over the Verilated NPE (npe_top): one call per clock edge. The Rust side
// (src/ffi.rs) owns an NpeIo, fills its inputs, calls npe_cycle, and reads the outputs, which
// are the values right after the rising edge (every output of npe_top is a register or a gate
// of registers, so they hold for the whole next clock).
#include <cstdint>
#include <cstring>

#include "Vnpe_top.h"
#include "verilated.h"

extern "C" {

struct NpeAxi {
    // outputs
    uint8_t arid, arlen, arvalid, rready, awid, awlen, awvalid, wstrb_lo, wstrb_hi, wlast,
        wvalid, bready, _pad0[3];
    uint64_t araddr, awaddr, wdata[2];
    // inputs
    uint8_t arready, rid, rresp, rlast, rvalid, awready, wready, bid, bresp, bvalid, _pad1[6];
    uint64_t rdata[2];
};

struct NpeStream {
    uint64_t data[2];
    uint8_t valid, last, ready, _pad[5];
};

struct NpeIo {
    // inputs
    uint8_t rst_n, _pad0[3];
    uint32_t route_limit;
    uint16_t awaddr, araddr;
    uint8_t awvalid, wvalid, wstrb, bready, arvalid, rready;
    uint64_t wdata;
    // outputs
    uint8_t irq, awready, wready, bresp, bvalid, arready, rresp, rvalid;
    uint64_t rdata;
    NpeAxi q, d;
    // link: tx streams are outputs (ready is an input), rx streams inputs (ready an output)
    NpeStream tx_data, tx_ctrl, rx_data, rx_ctrl;
};

static void put128(VlWide<4>& w, const uint64_t* v) {
    w[0] = static_cast<uint32_t>(v[0]);
    w[1] = static_cast<uint32_t>(v[0] >> 32);
    w[2] = static_cast<uint32_t>(v[1]);
    w[3] = static_cast<uint32_t>(v[1] >> 32);
}

static void get128(const VlWide<4>& w, uint64_t* v) {
    v[0] = static_cast<uint64_t>(w[0]) | (static_cast<uint64_t>(w[1]) << 32);
    v[1] = static_cast<uint64_t>(w[2]) | (static_cast<uint64_t>(w[3]) << 32);
}

struct NpeSim {
    VerilatedContext ctx;
    Vnpe_top* top;
};

void* npe_new(void) {
    NpeSim* s = new NpeSim;
    s->top = new Vnpe_top(&s->ctx);
    s->top->clk = 0;
    s->top->rst_n = 0;
    s->top->eval();
    return s;
}

void npe_free(void* p) {
    NpeSim* s = static_cast<NpeSim*>(p);
    if (s == nullptr) return;
    s->top->final();
    delete s->top;
    delete s;
}

#define AXI_IN(port, P)                                                   \
    t->m_axi_##port##_arready = io->P.arready;                           \
    t->m_axi_##port##_rid = io->P.rid;                                   \
    put128(t->m_axi_##port##_rdata, io->P.rdata);                        \
    t->m_axi_##port##_rresp = io->P.rresp;                               \
    t->m_axi_##port##_rlast = io->P.rlast;                               \
    t->m_axi_##port##_rvalid = io->P.rvalid;                             \
    t->m_axi_##port##_awready = io->P.awready;                           \
    t->m_axi_##port##_wready = io->P.wready;                             \
    t->m_axi_##port##_bid = io->P.bid;                                   \
    t->m_axi_##port##_bresp = io->P.bresp;                               \
    t->m_axi_##port##_bvalid = io->P.bvalid;

#define AXI_OUT(port, P)                                                  \
    io->P.arid = t->m_axi_##port##_arid;                                 \
    io->P.araddr = t->m_axi_##port##_araddr;                             \
    io->P.arlen = t->m_axi_##port##_arlen;                               \
    io->P.arvalid = t->m_axi_##port##_arvalid;                           \
    io->P.rready = t->m_axi_##port##_rready;                             \
    io->P.awid = t->m_axi_##port##_awid;                                 \
    io->P.awaddr = t->m_axi_##port##_awaddr;                             \
    io->P.awlen = t->m_axi_##port##_awlen;                               \
    io->P.awvalid = t->m_axi_##port##_awvalid;                           \
    get128(t->m_axi_##port##_wdata, io->P.wdata);                        \
    io->P.wstrb_lo = t->m_axi_##port##_wstrb & 0xff;                     \
    io->P.wstrb_hi = (t->m_axi_##port##_wstrb >> 8) & 0xff;              \
    io->P.wlast = t->m_axi_##port##_wlast;                               \
    io->P.wvalid = t->m_axi_##port##_wvalid;                             \
    io->P.bready = t->m_axi_##port##_bready;

// One clock: drive the inputs, rising edge, sample the outputs, falling edge.
void npe_cycle(void* p, NpeIo* io) {
    NpeSim* s = static_cast<NpeSim*>(p);
    Vnpe_top* t = s->top;
    t->rst_n = io->rst_n;
    t->route_limit = io->route_limit;
    t->s_axil_awaddr = io->awaddr;
    t->s_axil_awvalid = io->awvalid;
    t->s_axil_wdata = io->wdata;
    t->s_axil_wstrb = io->wstrb;
    t->s_axil_wvalid = io->wvalid;
    t->s_axil_bready = io->bready;
    t->s_axil_araddr = io->araddr;
    t->s_axil_arvalid = io->arvalid;
    t->s_axil_rready = io->rready;
    AXI_IN(q, q)
    AXI_IN(d, d)
    t->tx_data_tready = io->tx_data.ready;
    t->tx_ctrl_tready = io->tx_ctrl.ready;
    put128(t->rx_data_tdata, io->rx_data.data);
    t->rx_data_tvalid = io->rx_data.valid;
    t->rx_data_tlast = io->rx_data.last;
    put128(t->rx_ctrl_tdata, io->rx_ctrl.data);
    t->rx_ctrl_tvalid = io->rx_ctrl.valid;
    t->rx_ctrl_tlast = io->rx_ctrl.last;

    t->clk = 1;
    t->eval();

    io->irq = t->irq;
    io->awready = t->s_axil_awready;
    io->wready = t->s_axil_wready;
    io->bresp = t->s_axil_bresp;
    io->bvalid = t->s_axil_bvalid;
    io->arready = t->s_axil_arready;
    io->rdata = t->s_axil_rdata;
    io->rresp = t->s_axil_rresp;
    io->rvalid = t->s_axil_rvalid;
    AXI_OUT(q, q)
    AXI_OUT(d, d)
    get128(t->tx_data_tdata, io->tx_data.data);
    io->tx_data.valid = t->tx_data_tvalid;
    io->tx_data.last = t->tx_data_tlast;
    get128(t->tx_ctrl_tdata, io->tx_ctrl.data);
    io->tx_ctrl.valid = t->tx_ctrl_tvalid;
    io->tx_ctrl.last = t->tx_ctrl_tlast;
    io->rx_data.ready = t->rx_data_tready;
    io->rx_ctrl.ready = t->rx_ctrl_tready;

    t->clk = 0;
    t->eval();
}

}  // extern "C"
