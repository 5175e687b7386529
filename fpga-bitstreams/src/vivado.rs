//! The Vivado flow: a Tcl script and constraints, generated from the board's PL description,
//! that build the block design and produce the `.bit`.
//!
//! Vivado is not available on the build machines, so this script is never run in CI; what
//! CI checks is that it says what the board description and the overlay say (the tests
//! below read the addresses, interrupt lines and PL ports back out of the generated Tcl and
//! compare them with both). A user with Vivado runs:
//!
//! ```text
//! vivado -mode batch -source nprdma-zcu102.tcl -tclargs <rtl dir> <output dir>
//! ```
//!
//! The block design: the Zynq UltraScale+ PS (`zynq_ultra_ps_e`, with the ZCU102 board
//! preset when the board files are installed) with M_AXI_HPM0_FPD, the engines' PL-to-PS
//! ports at 128 bits, `pl_clk0` and `pl_ps_irq0`; an AXI SmartConnect from M_AXI_HPM0_FPD to
//! every engine's AXI4-Lite slave; each engine's two AXI masters straight onto PS ports of
//! their own, no interconnect in between: the queue port `m_axi_q` onto the board's
//! `queue_port` (an HPC port), the data port `m_axi_d` onto its `data_port` (an HP port). The
//! data port's AXI ID carries the protection domain into the stream ID the TBU forms (UG1085,
//! the SMMU chapter, table 16-13: stream ID = TBU, the port's master ID, AXI ID), and AXI SmartConnect does not pass AXI IDs through (Xilinx AR 69447),
//! so nothing may sit between the master and the port. Then the engines' two link stream
//! pairs (`tx_data`/`rx_data`, `tx_ctrl`/`rx_ctrl`) in a ring; `route_limit`
//! tied to the number of engines (an `xlconstant`); their interrupts concatenated onto
//! `pl_ps_irq0`; one clock (`pl_clk0`) and one synchronised reset (`proc_sys_reset`) for
//! everything. The engine is the RTL module `npe_top` (`clk`, `rst_n`, `s_axil_*`,
//! `m_axi_q_*`, `m_axi_d_*`, `tx_*`, `rx_*`, `irq`, `route_limit`), added as a module
//! reference;
//! Vivado infers the AXI and AXI4-Stream interfaces from those prefixes.

use std::fmt::Write as _;

use boards::zynqmp::PlPort;
use boards::zynqmp::pl::{NpeInstance, PlDesign};

use crate::{BitstreamError, Result};

/// The RTL top-level module of one engine.
pub const NPE_MODULE: &str = "npe_top";

/// The engine's ports and interfaces as the block design connects them: the one place that
/// names them, for the Tcl and for reading it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpePorts {
    /// Clock pin.
    pub clock: &'static str,
    /// Active-low reset pin.
    pub reset: &'static str,
    /// AXI4-Lite register slave interface (ports `<name>_*`).
    pub slave: &'static str,
    /// AXI4 master interfaces (queue port, data port), each connected straight to a PS port
    /// of its own: [`master_ports`] gives the board's port of each, in this order.
    pub masters: [&'static str; 2],
    /// Link AXI4-Stream pairs (out, in), one per virtual channel.
    pub links: [(&'static str, &'static str); 2],
    /// Interrupt pin.
    pub irq: &'static str,
    /// The board constant input: coordinates `0 .. route_limit-1` are routable
    /// (docs/npe-rtl.md, "Interfaces").
    pub route_limit: &'static str,
}

/// The interface of `npe_top` (fpga-bitstreams/rtl/npe_top.v) this generator wires.
pub const NPE_PORTS: NpePorts = NpePorts {
    clock: "clk",
    reset: "rst_n",
    slave: "s_axil",
    masters: ["m_axi_q", "m_axi_d"],
    links: [("tx_data", "rx_data"), ("tx_ctrl", "rx_ctrl")],
    irq: "irq",
    route_limit: "route_limit",
};

/// The PS ports of an engine's masters, in the order of [`NpePorts::masters`] (queue, data).
pub fn master_ports(npe: &NpeInstance) -> [PlPort; 2] {
    [npe.queue_port, npe.data_port]
}

/// The PS8's clock pin of a PL-to-PS port: S_AXI_HP0_FPD's is `saxihp0_fpd_aclk`,
/// S_AXI_HPC0_FPD's `saxihpc0_fpd_aclk`.
fn clock_pin(port: PlPort) -> String {
    let name = port.vivado_port().to_ascii_lowercase();
    let short = name.trim_start_matches("s_axi_").trim_end_matches("_fpd");
    format!("saxi{short}_fpd_aclk")
}

fn bad(what: String) -> BitstreamError {
    BitstreamError::ManifestMismatch { what }
}

/// The project's base name for `pl` (`nprdma-zcu102`).
pub fn base_name(pl: &PlDesign) -> String {
    format!("nprdma-{}", pl.board)
}

/// The Tcl script for `pl`.
pub fn tcl(pl: &PlDesign) -> Result<String> {
    let name = base_name(pl);
    let mut part = [0u8; 64];
    let n = pl.part.write_name(&mut part).unwrap_or(0);
    let part = String::from_utf8_lossy(&part[..n]).into_owned();
    let irq_lines: Vec<u8> = pl.npes.iter().map(|e| e.irq.0).collect();
    if irq_lines.iter().any(|&l| l >= 8) {
        return Err(bad("the generator wires pl_ps_irq0 only (lines 0-7)".into()));
    }
    let irq_ports = irq_lines.iter().max().map_or(1, |m| m + 1);
    let masters: Vec<&str> = pl.npes.iter().map(|e| e.master.vivado_port()).collect();
    if masters.iter().any(|m| *m != "M_AXI_HPM0_FPD") {
        return Err(bad("the generator wires M_AXI_HPM0_FPD only".into()));
    }
    let mhz = pl.pl_clk0_hz / 1_000_000;

    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "# The {board} PL design of nprdma: {n} NPE engines. Generated by fpga-bitstreams from\n\
         # boards::zynqmp::pl (do not edit; `cargo xtask image {board}` writes it).\n\
         # Usage: vivado -mode batch -source {name}.tcl -tclargs <rtl dir> <output dir>\n\
         # Writes <output dir>/{name}.bit. Needs Vivado (not run in nprdma's CI).",
        board = pl.board,
        n = pl.npes.len()
    );
    let _ = writeln!(
        w,
        "if {{$argc != 2}} {{\n  puts \"usage: vivado -mode batch -source {name}.tcl -tclargs <rtl dir> <output dir>\"\n  exit 2\n}}"
    );
    let _ = writeln!(w, "set rtl_dir [file normalize [lindex $argv 0]]");
    let _ = writeln!(w, "set out_dir [file normalize [lindex $argv 1]]");
    let _ = writeln!(w, "set part {part}");
    let _ = writeln!(
        w,
        "create_project {name} [file join $out_dir vivado] -part $part -force"
    );
    let _ = writeln!(
        w,
        "set board [lindex [get_board_parts -quiet -latest_file_version {{{}}}] 0]",
        pl.vivado_board_part
    );
    let _ = writeln!(
        w,
        "if {{$board ne \"\"}} {{ set_property board_part $board [current_project] }}"
    );
    let _ = writeln!(
        w,
        "set rtl [concat [glob -nocomplain -directory $rtl_dir *.v] [glob -nocomplain -directory $rtl_dir *.sv]]"
    );
    let _ = writeln!(
        w,
        "if {{[llength $rtl] == 0}} {{ puts \"no Verilog in $rtl_dir\"; exit 1 }}"
    );
    let _ = writeln!(w, "add_files -norecurse $rtl");
    // The core's `include`d fragments: Verilog Headers (not compiled on their own), found
    // through the fileset's include path.
    let _ = writeln!(w, "set headers [glob -nocomplain -directory $rtl_dir *.vh]");
    let _ = writeln!(
        w,
        "if {{[llength $headers] > 0}} {{\n  add_files -norecurse $headers\n  set_property file_type {{Verilog Header}} [get_files $headers]\n}}"
    );
    let _ = writeln!(
        w,
        "set_property include_dirs [list $rtl_dir] [get_filesets sources_1]"
    );
    let _ = writeln!(
        w,
        "add_files -fileset constrs_1 -norecurse [file join [file dirname [file normalize [info script]]] {name}.xdc]"
    );
    let _ = writeln!(w, "update_compile_order -fileset sources_1\n");

    let _ = writeln!(w, "create_bd_design nprdma");
    let _ = writeln!(
        w,
        "set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e:* ps]"
    );
    let _ = writeln!(
        w,
        "if {{$board ne \"\"}} {{ apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {{apply_board_preset \"1\"}} $ps }}"
    );
    let _ = writeln!(w, "set_property -dict [list \\");
    let _ = writeln!(w, "  CONFIG.PSU__USE__M_AXI_GP0 {{1}} \\");
    let _ = writeln!(w, "  CONFIG.PSU__USE__M_AXI_GP1 {{0}} \\");
    let _ = writeln!(w, "  CONFIG.PSU__USE__M_AXI_GP2 {{0}} \\");
    let ports: Vec<PlPort> = pl.npes.iter().flat_map(master_ports).collect();
    for (i, p) in ports.iter().enumerate() {
        if ports[i + 1..].contains(p) {
            return Err(bad(format!(
                "{} is given to two masters: each needs a port of its own",
                p.vivado_port()
            )));
        }
    }
    for port in &ports {
        let gp = port.vivado_gp_index();
        let _ = writeln!(
            w,
            "  CONFIG.PSU__USE__S_AXI_GP{gp} {{1}} CONFIG.PSU__SAXIGP{gp}__DATA_WIDTH {{128}} \\"
        );
    }
    let _ = writeln!(w, "  CONFIG.PSU__USE__IRQ0 {{1}} \\");
    let _ = writeln!(w, "  CONFIG.PSU__FPGA_PL0_ENABLE {{1}} \\");
    let _ = writeln!(
        w,
        "  CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {{{mhz}}} \\"
    );
    let _ = writeln!(w, "] $ps");
    let _ = writeln!(
        w,
        "create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset:* rst_pl0"
    );
    let _ = writeln!(
        w,
        "set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{{}}}] [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:* smc_regs]",
        pl.npes.len()
    );
    let _ = writeln!(
        w,
        "set_property CONFIG.NUM_PORTS {{{irq_ports}}} [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconcat:* irq_concat]"
    );
    for e in &pl.npes {
        let _ = writeln!(
            w,
            "create_bd_cell -type module -reference {NPE_MODULE} {}",
            e.name
        );
    }
    let _ = writeln!(
        w,
        "set_property -dict [list CONFIG.CONST_WIDTH {{22}} CONFIG.CONST_VAL {{{}}}] [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconstant:* route_limit]",
        pl.npes.len()
    );

    let _ = writeln!(
        w,
        "\n# One clock (pl_clk0, {mhz} MHz) and one reset for everything."
    );
    let mut clk =
        String::from("connect_bd_net [get_bd_pins ps/pl_clk0] [get_bd_pins ps/maxihpm0_fpd_aclk]");
    for e in &pl.npes {
        for port in master_ports(e) {
            let _ = write!(clk, " [get_bd_pins ps/{}]", clock_pin(port));
        }
        let _ = write!(clk, " [get_bd_pins {}/{}]", e.name, NPE_PORTS.clock);
    }
    let _ = writeln!(
        w,
        "{clk} [get_bd_pins rst_pl0/slowest_sync_clk] [get_bd_pins smc_regs/aclk]"
    );
    let _ = writeln!(
        w,
        "connect_bd_net [get_bd_pins ps/pl_resetn0] [get_bd_pins rst_pl0/ext_reset_in]"
    );
    let mut rst = String::from(
        "connect_bd_net [get_bd_pins rst_pl0/peripheral_aresetn] [get_bd_pins smc_regs/aresetn]",
    );
    for e in &pl.npes {
        let _ = write!(rst, " [get_bd_pins {}/{}]", e.name, NPE_PORTS.reset);
    }
    let _ = writeln!(w, "{rst}");

    let _ = writeln!(w, "\n# Registers: M_AXI_HPM0_FPD through the SmartConnect.");
    let _ = writeln!(
        w,
        "connect_bd_intf_net [get_bd_intf_pins ps/M_AXI_HPM0_FPD] [get_bd_intf_pins smc_regs/S00_AXI]"
    );
    for (i, e) in pl.npes.iter().enumerate() {
        let _ = writeln!(
            w,
            "connect_bd_intf_net [get_bd_intf_pins smc_regs/M{i:02}_AXI] [get_bd_intf_pins {}/{}]",
            e.name, NPE_PORTS.slave
        );
    }
    let _ = writeln!(
        w,
        "\n# Masters: each straight onto a PS port of its own, no interconnect, so the data\n\
         # port's AXI ID (the protection domain) reaches the TBU, which forms the stream ID\n\
         # from the TBU, the port's master ID and the AXI ID (UG1085 table 16-13; AXI\n\
         # SmartConnect would not pass AXI IDs through, Xilinx AR 69447)."
    );
    for e in &pl.npes {
        let _ = writeln!(
            w,
            "# {}: queue {} stream {:#x}; data {} streams {:#x}-{:#x}",
            e.name,
            e.queue_port.vivado_port(),
            e.queue_stream().0,
            e.data_port.vivado_port(),
            e.stream_base().0,
            e.stream_base().0 | 0x3f
        );
        for (m, port) in NPE_PORTS.masters.iter().zip(master_ports(e)) {
            let _ = writeln!(
                w,
                "connect_bd_intf_net [get_bd_intf_pins {}/{m}] [get_bd_intf_pins ps/{}]",
                e.name,
                port.vivado_port()
            );
        }
    }
    let _ = writeln!(
        w,
        "\n# The link: the engines' streams in a ring, both virtual channels; the routable\n\
         # coordinates are the engines'."
    );
    for (i, e) in pl.npes.iter().enumerate() {
        let next = &pl.npes[(i + 1) % pl.npes.len()];
        for (tx, rx) in NPE_PORTS.links {
            let _ = writeln!(
                w,
                "connect_bd_intf_net [get_bd_intf_pins {}/{tx}] [get_bd_intf_pins {}/{rx}]",
                e.name, next.name
            );
        }
        let _ = writeln!(
            w,
            "connect_bd_net [get_bd_pins route_limit/dout] [get_bd_pins {}/{}]",
            e.name, NPE_PORTS.route_limit
        );
    }
    let _ = writeln!(
        w,
        "\n# Interrupts: pl_ps_irq0[n] is SPI 89 + n (UG1085 table 13-1)."
    );
    for e in &pl.npes {
        let _ = writeln!(
            w,
            "connect_bd_net [get_bd_pins {}/{}] [get_bd_pins irq_concat/In{}]",
            e.name, NPE_PORTS.irq, e.irq.0
        );
    }
    let _ = writeln!(
        w,
        "connect_bd_net [get_bd_pins irq_concat/dout] [get_bd_pins ps/pl_ps_irq0]"
    );
    let _ = writeln!(w, "\n# Address segments.");
    for e in &pl.npes {
        let _ = writeln!(
            w,
            "assign_bd_address -offset {:#010x} -range {:#010x} -target_address_space [get_bd_addr_spaces ps/Data] [get_bd_addr_segs {}/{}/reg0] -force",
            e.regs.base, e.regs.size, e.name, NPE_PORTS.slave
        );
        for (m, port) in NPE_PORTS.masters.into_iter().zip(master_ports(e)) {
            let gp = port.vivado_gp_index();
            let short = port
                .vivado_port()
                .trim_start_matches("S_AXI_")
                .trim_end_matches("_FPD");
            for seg in ["DDR_LOW", "DDR_HIGH"] {
                let _ = writeln!(
                    w,
                    "assign_bd_address -target_address_space [get_bd_addr_spaces {}/{m}] [get_bd_addr_segs ps/SAXIGP{gp}/{short}_{seg}] -force",
                    e.name
                );
            }
        }
    }
    let _ = writeln!(w, "\nvalidate_bd_design\nsave_bd_design");
    let _ = writeln!(
        w,
        "set wrapper [make_wrapper -files [get_files nprdma.bd] -top]\nadd_files -norecurse $wrapper\nset_property top nprdma_wrapper [current_fileset]\nupdate_compile_order -fileset sources_1"
    );
    let _ = writeln!(
        w,
        "launch_runs impl_1 -to_step write_bitstream -jobs 4\nwait_on_run impl_1"
    );
    let _ = writeln!(
        w,
        "if {{[get_property PROGRESS [get_runs impl_1]] ne \"100%\"}} {{ puts \"implementation failed\"; exit 1 }}"
    );
    let _ = writeln!(
        w,
        "file copy -force [file join $out_dir vivado {name}.runs impl_1 nprdma_wrapper.bit] [file join $out_dir {name}.bit]"
    );
    Ok(s)
}

/// The constraints for `pl`.
pub fn xdc(pl: &PlDesign) -> String {
    format!(
        "# Constraints of the {board} PL design of nprdma. Generated by fpga-bitstreams (do not edit).\n\
         # The design uses no package pins: registers, DMA, interrupts, clock and reset all cross\n\
         # the PS-PL boundary, and the PS IP constrains pl_clk0 ({mhz} MHz) itself. What remains\n\
         # are bitstream options.\n\
         set_property BITSTREAM.GENERAL.COMPRESS TRUE [current_design]\n",
        board = pl.board,
        mhz = pl.pl_clk0_hz / 1_000_000
    )
}

/// One engine as the Tcl wires it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineFacts {
    /// Cell name.
    pub name: String,
    /// `assign_bd_address -offset`.
    pub base: u64,
    /// `assign_bd_address -range`.
    pub range: u64,
    /// The PS port its queue master `m_axi_q` is connected to.
    pub queue_port: PlPort,
    /// The PS port its data master `m_axi_d` is connected to.
    pub data_port: PlPort,
    /// The `irq_concat` input its `irq` drives (= `pl_ps_irq0` line).
    pub irq_line: u8,
}

/// What a generated Tcl script wires, read back from its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TclFacts {
    /// `set part`.
    pub part: String,
    /// `pl_clk0` in MHz.
    pub pl_clk0_mhz: u32,
    /// The engines, in cell-creation order.
    pub engines: Vec<EngineFacts>,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// The arguments of the `[get_bd_* ...]` commands in `line`.
fn pins(line: &str) -> Vec<&str> {
    line.split('[')
        .skip(1)
        .filter_map(|p| {
            p.split_once(' ')
                .and_then(|(_, rest)| rest.split(']').next())
        })
        .collect()
}

/// Reads the facts back out of a script [`tcl`] wrote.
pub fn facts(tcl: &str) -> Result<TclFacts> {
    let masters = NPE_PORTS
        .masters
        .map(|m| format!("/{m}] [get_bd_intf_pins ps/"));
    let irq = format!("/{}] [get_bd_pins irq_concat/In", NPE_PORTS.irq);
    let reg_seg = format!("/{}/reg0", NPE_PORTS.slave);
    let mut part = None;
    let mut mhz = None;
    let mut engines: Vec<EngineFacts> = Vec::new();
    let engine = |engines: &mut Vec<EngineFacts>, name: &str| -> Result<usize> {
        engines
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| bad(format!("Tcl: {name} used before it is created")))
    };
    for line in tcl.lines().map(str::trim) {
        if let Some(p) = line.strip_prefix("set part ") {
            part = Some(p.to_string());
        } else if let Some(rest) = line.strip_prefix("CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {")
        {
            mhz = rest.split('}').next().and_then(|v| v.parse().ok());
        } else if let Some(rest) = line.strip_prefix(&format!(
            "create_bd_cell -type module -reference {NPE_MODULE} "
        )) {
            engines.push(EngineFacts {
                name: rest.into(),
                base: 0,
                range: 0,
                queue_port: PlPort::Hpc0,
                data_port: PlPort::Hpc0,
                irq_line: u8::MAX,
            });
        } else if let Some(which) = masters
            .iter()
            .position(|m| line.starts_with("connect_bd_intf_net") && line.contains(m.as_str()))
        {
            let p = pins(line);
            let (Some(from), Some(to)) = (p.first(), p.get(1)) else {
                continue;
            };
            let master = NPE_PORTS.masters[which];
            let name = from.trim_end_matches(master).trim_end_matches('/');
            let port_name = to.trim_start_matches("ps/");
            let port = PlPort::ALL
                .into_iter()
                .find(|p| p.vivado_port() == port_name)
                .ok_or_else(|| bad(format!("Tcl: unknown PS port {port_name}")))?;
            let i = engine(&mut engines, name)?;
            if which == 0 {
                engines[i].queue_port = port;
            } else {
                engines[i].data_port = port;
            }
        } else if line.starts_with("connect_bd_net") && line.contains(&irq) {
            let p = pins(line);
            let (Some(from), Some(to)) = (p.first(), p.get(1)) else {
                continue;
            };
            let name = from.trim_end_matches(&irq[..NPE_PORTS.irq.len() + 1]);
            let line_no = to
                .trim_start_matches("irq_concat/In")
                .parse()
                .map_err(|_| bad(format!("Tcl: bad concat input {to}")))?;
            let i = engine(&mut engines, name)?;
            engines[i].irq_line = line_no;
        } else if line.starts_with("assign_bd_address -offset") {
            let words: Vec<&str> = line.split_whitespace().collect();
            let base = words.get(2).and_then(|w| hex(w));
            let range = words.get(4).and_then(|w| hex(w));
            let seg = pins(line).into_iter().find(|p| p.ends_with(&reg_seg));
            let (Some(base), Some(range), Some(seg)) = (base, range, seg) else {
                return Err(bad(format!("Tcl: cannot read `{line}`")));
            };
            let i = engine(&mut engines, seg.trim_end_matches(&reg_seg))?;
            engines[i].base = base;
            engines[i].range = range;
        }
    }
    Ok(TclFacts {
        part: part.ok_or_else(|| bad("Tcl: no `set part`".into()))?,
        pl_clk0_mhz: mhz.ok_or_else(|| bad("Tcl: no PL0 frequency".into()))?,
        engines,
    })
}

#[cfg(test)]
mod tests {
    use boards::zynqmp::pl::ZCU102_PL;

    use super::*;
    use crate::overlay;

    #[test]
    fn the_tcl_wires_what_the_board_description_says() {
        let f = facts(&tcl(&ZCU102_PL).unwrap()).unwrap();
        assert_eq!(f.part, "xczu9eg-ffvb1156-2-e");
        assert_eq!(f.pl_clk0_mhz, 250);
        assert_eq!(f.engines.len(), ZCU102_PL.npes.len());
        for (e, npe) in f.engines.iter().zip(ZCU102_PL.npes) {
            assert_eq!(e.name, npe.name);
            assert_eq!((e.base, e.range), (npe.regs.base, npe.regs.size));
            assert_eq!((e.queue_port, e.data_port), (npe.queue_port, npe.data_port));
            assert_eq!(e.irq_line, npe.irq.0);
        }
    }

    #[test]
    fn the_tcl_and_the_compiled_overlay_agree() {
        let f = facts(&tcl(&ZCU102_PL).unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (src, dtbo) = (dir.path().join("o.dtso"), dir.path().join("o.dtbo"));
        std::fs::write(&src, overlay::dtso(&ZCU102_PL).unwrap()).unwrap();
        overlay::compile(&src, &dtbo).unwrap();
        let dts = overlay::decompile(&dtbo).unwrap();
        for e in &f.engines {
            let node = format!("npe@{:x}", e.base);
            let reg = overlay::cells(&dts, &node, "reg").unwrap_or_default();
            assert_eq!(
                reg,
                [
                    (e.base >> 32) as u32,
                    e.base as u32,
                    (e.range >> 32) as u32,
                    e.range as u32
                ]
            );
            let spi = boards::zynqmp::pl::PlIrq(e.irq_line).spi().unwrap();
            assert_eq!(
                overlay::cells(&dts, &node, "interrupts").unwrap(),
                [0, u32::from(spi.0), 4]
            );
            let sid = u32::from(e.queue_port.stream_base());
            assert_eq!(
                overlay::cells(&dts, &node, "iommus").unwrap(),
                [u32::MAX, sid],
                "{}: the overlay's stream is that of the port the Tcl connects the queue master to",
                e.name
            );
        }
    }

    #[test]
    fn every_engine_is_clocked_reset_linked_and_its_port_enabled() {
        let t = tcl(&ZCU102_PL).unwrap();
        // UG1085 names, Vivado's GP numbering: HPC0 GP0, HPC1 GP1, HP0 GP2, HP1 GP3.
        for (npe, gps) in [(ZCU102_PL.npes[0], [0, 2]), (ZCU102_PL.npes[1], [1, 3])] {
            assert!(t.contains(&format!("[get_bd_pins {}/clk]", npe.name)));
            assert!(t.contains(&format!("[get_bd_pins {}/rst_n]", npe.name)));
            assert!(t.contains(&format!(
                "[get_bd_intf_pins {}/m_axi_q] [get_bd_intf_pins ps/{}]",
                npe.name,
                npe.queue_port.vivado_port()
            )));
            assert!(t.contains(&format!(
                "[get_bd_intf_pins {}/m_axi_d] [get_bd_intf_pins ps/{}]",
                npe.name,
                npe.data_port.vivado_port()
            )));
            assert!(t.contains(&format!(
                "[get_bd_pins route_limit/dout] [get_bd_pins {}/route_limit]",
                npe.name
            )));
            for gp in gps {
                assert!(t.contains(&format!("CONFIG.PSU__USE__S_AXI_GP{gp} {{1}}")));
            }
        }
        for pin in [
            "saxihpc0_fpd_aclk",
            "saxihpc1_fpd_aclk",
            "saxihp0_fpd_aclk",
            "saxihp1_fpd_aclk",
        ] {
            assert!(t.contains(&format!("[get_bd_pins ps/{pin}]")), "{pin}");
        }
        // One SmartConnect, for the registers; none on a master's way to the PS.
        assert_eq!(t.matches("xilinx.com:ip:smartconnect:").count(), 1);
        assert!(t.contains("[get_bd_intf_pins npe_0/tx_data] [get_bd_intf_pins npe_1/rx_data]"));
        assert!(t.contains("[get_bd_intf_pins npe_1/tx_ctrl] [get_bd_intf_pins npe_0/rx_ctrl]"));
        assert!(t.contains("CONFIG.CONST_VAL {2}"));
        assert!(t.contains("ps/SAXIGP2/HP0_DDR_LOW") && t.contains("ps/SAXIGP3/HP1_DDR_HIGH"));
        assert!(
            t.contains("npe_0/m_axi_q] [get_bd_addr_segs ps/SAXIGP0/HPC0_DDR_LOW]")
                && t.contains("npe_1/m_axi_q] [get_bd_addr_segs ps/SAXIGP1/HPC1_DDR_HIGH]")
        );
        // Braces balance (a cheap syntax check of what Tcl would parse).
        let opens = t.matches('{').count();
        assert_eq!(opens, t.matches('}').count());
        assert!(xdc(&ZCU102_PL).contains("250 MHz"));
    }

    /// The names the Tcl wires are the RTL's: every pin and interface prefix of
    /// [`NPE_PORTS`] is a port of `npe_top` in fpga-bitstreams/rtl/npe_top.v.
    #[test]
    fn the_wired_ports_are_the_rtl_tops() {
        let rtl = include_str!("../rtl/npe_top.v");
        let ports: Vec<&str> = rtl
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("input") || l.starts_with("output"))
            .filter_map(|l| l.trim_end_matches(',').split_whitespace().last())
            .collect();
        assert!(rtl.contains(&format!("module {NPE_MODULE}")));
        let pins = [
            NPE_PORTS.clock,
            NPE_PORTS.reset,
            NPE_PORTS.irq,
            NPE_PORTS.route_limit,
        ];
        for pin in pins {
            assert!(ports.contains(&pin), "{pin} is not a port of npe_top");
        }
        let mut interfaces = vec![NPE_PORTS.slave];
        interfaces.extend(NPE_PORTS.masters);
        for (tx, rx) in NPE_PORTS.links {
            interfaces.extend([tx, rx]);
        }
        for i in interfaces {
            let prefix = format!("{i}_");
            assert!(
                ports.iter().any(|p| p.starts_with(&prefix)),
                "no port of npe_top starts with {prefix}"
            );
        }
        // And no interface of the RTL is left unwired.
        for p in &ports {
            let wired = pins.contains(p)
                || [NPE_PORTS.slave]
                    .iter()
                    .chain(&NPE_PORTS.masters)
                    .chain(NPE_PORTS.links.iter().flat_map(|(t, r)| [t, r]))
                    .any(|i| p.starts_with(&format!("{i}_")));
            assert!(wired, "npe_top's port {p} is not wired by the Tcl");
        }
    }

    /// Every file the RTL `include`s is a `.vh` in fpga-bitstreams/rtl, so the Tcl's glob
    /// adds it as a Verilog Header and the include path (the RTL directory) finds it.
    #[test]
    fn the_tcl_adds_the_included_headers_and_their_directory() {
        let t = tcl(&ZCU102_PL).unwrap();
        let lines: Vec<&str> = t.lines().map(str::trim).collect();
        let at = |l: &str| {
            lines
                .iter()
                .position(|x| *x == l)
                .unwrap_or_else(|| panic!("the Tcl lacks `{l}`"))
        };
        let glob = at("set headers [glob -nocomplain -directory $rtl_dir *.vh]");
        let add = at("add_files -norecurse $headers");
        let kind = at("set_property file_type {Verilog Header} [get_files $headers]");
        let dirs = at("set_property include_dirs [list $rtl_dir] [get_filesets sources_1]");
        let design = at("create_bd_design nprdma");
        assert!(glob < add && add < kind && kind < design && dirs < design);

        let rtl_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rtl");
        let mut included = 0;
        for entry in std::fs::read_dir(&rtl_dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for line in text.lines() {
                let Some(rest) = line.trim().strip_prefix("`include") else {
                    continue;
                };
                let name = rest.trim().trim_matches('"');
                assert!(
                    name.ends_with(".vh"),
                    "{name} would not be added as a header"
                );
                assert!(
                    rtl_dir.join(name).is_file(),
                    "{name}, included by {}, is not in the RTL directory",
                    path.display()
                );
                included += 1;
            }
        }
        assert!(included > 0, "the RTL includes its core's fragments");
    }

    #[test]
    fn two_masters_on_one_port_are_refused() {
        let mut pl = ZCU102_PL;
        pl.npes[1].queue_port = pl.npes[0].data_port;
        assert!(
            tcl(&pl).is_err(),
            "they would need an interconnect (AR 69447)"
        );
    }

    #[test]
    fn a_changed_tcl_is_caught() {
        let t = tcl(&ZCU102_PL).unwrap().replace("0xa0010000", "0xa0020000");
        let f = facts(&t).unwrap();
        assert_ne!(f.engines[1].base, ZCU102_PL.npes[1].regs.base);
        let t = tcl(&ZCU102_PL)
            .unwrap()
            .replace("ps/S_AXI_HP1_FPD]", "ps/S_AXI_HP2_FPD]");
        assert_eq!(facts(&t).unwrap().engines[1].data_port, PlPort::Hp2);
        let t = tcl(&ZCU102_PL)
            .unwrap()
            .replace("ps/S_AXI_HPC0_FPD]", "ps/S_AXI_HP3_FPD]");
        assert_eq!(facts(&t).unwrap().engines[0].queue_port, PlPort::Hp3);
        let t = tcl(&ZCU102_PL)
            .unwrap()
            .replace("ps/S_AXI_HP1_FPD]", "ps/S_AXI_XX_FPD]");
        assert!(facts(&t).is_err());
    }
}
