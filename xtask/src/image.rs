//! `cargo xtask image BOARD`: a directory ready to copy to an SD card's boot partition, and
//! the image builder's own checks that `cargo xtask test` runs.
//!
//! Inputs the user brings from a Xilinx tool flow: the bitstream (Vivado, from the generated
//! Tcl), the FSBL and the PMU firmware (Vitis or PetaLinux), and for Linux ATF's `bl31.elf`
//! and U-Boot. Without ATF and U-Boot the image boots the bare-metal test program
//! `zynqmp-smmu-faults` at EL3 after the FSBL instead. What is generated here: the overlay,
//! the Vivado Tcl and constraints, the `.bin` for Linux's FPGA manager, the `.bif`,
//! `BOOT.BIN` (Debian's `bootgen`), the firmware ELFs and the manifest (docs/fpga-bitstreams.md).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use boards::zynqmp::pl::{PlDesign, ZCU102_PL};
use fpga_bitstreams::manifest::{self, Manifest};
use fpga_bitstreams::testbit::TestBitstream;
use fpga_bitstreams::{bin, bit, overlay, vivado};

use crate::firmware;
use crate::util::{XtaskError, require_tool, workspace_root};

/// The user's inputs.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// The Vivado `.bit`.
    pub bitstream: Option<PathBuf>,
    /// The FSBL ELF.
    pub fsbl: Option<PathBuf>,
    /// The PMU firmware ELF.
    pub pmufw: Option<PathBuf>,
    /// ATF's `bl31.elf`.
    pub atf: Option<PathBuf>,
    /// U-Boot's ELF.
    pub uboot: Option<PathBuf>,
    /// Output directory (default `target/image-<board>`).
    pub out: Option<PathBuf>,
    /// Do not build the firmware programs (the CI check).
    pub skip_firmware: bool,
}

/// Marks an image directory whose build has not finished (removed at the end).
const INCOMPLETE: &str = ".nprdma-image-incomplete";

/// The bare-metal program the image boots without Linux.
const BARE_METAL_PROGRAM: &str = "zynqmp-smmu-faults";

fn board(name: &str) -> Result<&'static PlDesign, XtaskError> {
    match name {
        "zcu102" => Ok(&ZCU102_PL),
        other => Err(XtaskError::Usage(format!(
            "board `{other}`: only zcu102 has a PL design (boards::zynqmp::pl)"
        ))),
    }
}

fn other(e: impl std::fmt::Display) -> XtaskError {
    XtaskError::Other(e.to_string())
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), XtaskError> {
    std::fs::write(path, bytes).map_err(|e| other(format!("write {}: {e}", path.display())))
}

fn read(path: &Path) -> Result<Vec<u8>, XtaskError> {
    std::fs::read(path).map_err(|e| other(format!("read {}: {e}", path.display())))
}

fn copy_in(src: &Path, out: &Path, name: &str) -> Result<Vec<u8>, XtaskError> {
    let bytes = read(src)?;
    if bytes.get(..4) != Some(b"\x7fELF") && name.ends_with(".elf") {
        return Err(other(format!("{} is not an ELF file", src.display())));
    }
    write(&out.join(name), &bytes)?;
    Ok(bytes)
}

/// Runs bootgen; its output goes to the log file next to the image.
fn bootgen(dir: &Path, args: &[&str], what: &str) -> Result<(), XtaskError> {
    require_tool("bootgen", "xilinx-bootgen")?;
    let out = Command::new("bootgen")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "bootgen".into(),
            error,
        })?;
    let log = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    let text = String::from_utf8_lossy(&log);
    if !out.status.success() || text.contains("[ERROR]") {
        return Err(other(format!("bootgen ({what}) failed:\n{}", text.trim())));
    }
    Ok(())
}

/// What an image build produced and what it lacks.
pub struct Report {
    /// The image directory.
    pub dir: PathBuf,
    /// Files in the image (name, bytes).
    pub files: Vec<(String, u64)>,
    /// What is missing and how to get it.
    pub missing: Vec<String>,
}

/// Builds the image for `board_name`.
pub fn build(board_name: &str, inputs: &Inputs) -> Result<Report, XtaskError> {
    let pl = board(board_name)?;
    let base = vivado::base_name(pl);
    let dir = inputs.out.clone().unwrap_or_else(|| {
        workspace_root()
            .join("target")
            .join(format!("image-{}", pl.board))
    });
    if dir.exists() {
        // Only an earlier image (our manifest, or the marker of a build that failed) or an
        // empty directory is cleared.
        let ours = std::fs::read_to_string(dir.join(manifest::FILE_NAME))
            .is_ok_and(|m| m.starts_with("# nprdma board image manifest"))
            || dir.join(INCOMPLETE).exists();
        let empty = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
        if !ours && !empty {
            return Err(other(format!(
                "{} exists and is not an earlier image: give an empty or new --out",
                dir.display()
            )));
        }
        std::fs::remove_dir_all(&dir)
            .map_err(|e| other(format!("clear {}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("create {}: {e}", dir.display())))?;
    write(
        &dir.join(INCOMPLETE),
        "an nprdma image build that has not finished\n",
    )?;
    let mut missing = Vec::new();
    let mut manifest_files: Vec<String> = Vec::new();

    // The Vivado flow, generated (not run here: Vivado is not on the build machines).
    let (tcl, xdc) = (format!("{base}.tcl"), format!("{base}.xdc"));
    write(&dir.join(&tcl), vivado::tcl(pl).map_err(other)?)?;
    write(&dir.join(&xdc), vivado::xdc(pl))?;
    manifest_files.extend([tcl, xdc]);

    // The overlay.
    let dtso = dir.join(overlay::DTSO_NAME);
    write(&dtso, overlay::dtso(pl).map_err(other)?)?;
    require_tool("dtc", "device-tree-compiler")?;
    overlay::compile(&dtso, &dir.join(overlay::DTBO_NAME)).map_err(other)?;
    manifest_files.extend([overlay::DTSO_NAME.into(), overlay::DTBO_NAME.into()]);

    // The bitstream: checked, its .bin for the FPGA manager, and bootgen's view of it.
    let mut design = String::from("-");
    let bit_name = format!("{base}.bit");
    match &inputs.bitstream {
        Some(path) => {
            let bytes = read(path)?;
            let parsed = bit::parse(&bytes).map_err(|e| other(format!("{}: {e}", path.display())))?;
            parsed
                .check_part(&pl.part)
                .map_err(|e| other(format!("{}: {e}", path.display())))?;
            design = parsed.design_name().to_string();
            let bin = bin::to_bin(&parsed).map_err(other)?;
            write(&dir.join(&bit_name), &bytes)?;
            write(&dir.join(pl.firmware_name), &bin)?;
            // Debian's bootgen converts it too, in a scratch directory (its output name is
            // the .bit's name + ".bin"); both must agree byte for byte.
            let scratch = dir.join("bootgen-check");
            std::fs::create_dir_all(&scratch)
                .map_err(|e| other(format!("create {}: {e}", scratch.display())))?;
            write(&scratch.join(&bit_name), &bytes)?;
            write(
                &scratch.join("bitstream-only.bif"),
                format!("all:\n{{\n  [destination_device = pl] {bit_name}\n}}\n"),
            )?;
            bootgen(
                &scratch,
                &["-arch", "zynqmp", "-image", "bitstream-only.bif", "-process_bitstream", "bin", "-w", "on"],
                "process_bitstream",
            )?;
            let theirs = read(&scratch.join(format!("{bit_name}.bin")))?;
            std::fs::remove_dir_all(&scratch).ok();
            if theirs != bin {
                return Err(other(format!(
                    "the .bin differs from bootgen -process_bitstream bin ({} vs {} bytes)",
                    bin.len(),
                    theirs.len()
                )));
            }
            manifest_files.extend([bit_name.clone(), pl.firmware_name.to_string()]);
        }
        None => missing.push(format!(
            "bitstream: --bitstream {bit_name}, built by `vivado -mode batch -source {}/{base}.tcl -tclargs fpga-bitstreams/rtl <dir>` (Vivado with the ZCU102 board files)",
            dir.display()
        )),
    }

    // Firmware ELFs.
    let linux = inputs.atf.is_some() || inputs.uboot.is_some();
    let mut program_elf = None;
    if !inputs.skip_firmware {
        for p in firmware::PROGRAMS
            .iter()
            .filter(|p| p.machine == firmware::Machine::ZynqMp)
        {
            let elf = firmware::build(p, true)?;
            let name = format!("{}.elf", p.name);
            copy_in(&elf, &dir, &name)?;
            manifest_files.push(name.clone());
            if p.name == BARE_METAL_PROGRAM {
                program_elf = Some(name);
            }
        }
    }

    // The boot image.
    let mut parts: Vec<String> = Vec::new();
    let mut have = |flag: &str,
                    input: &Option<PathBuf>,
                    name: &str,
                    how: &str,
                    missing: &mut Vec<String>|
     -> Result<Option<String>, XtaskError> {
        match input {
            Some(p) => {
                copy_in(p, &dir, name)?;
                manifest_files.push(name.into());
                Ok(Some(name.into()))
            }
            None => {
                missing.push(format!("{flag}: {how}"));
                Ok(None)
            }
        }
    };
    let fsbl = have(
        "--fsbl",
        &inputs.fsbl,
        "fsbl.elf",
        "the FSBL ELF for the ZCU102 (Vitis: zynqmp_fsbl, or PetaLinux's zynqmp_fsbl.elf)",
        &mut missing,
    )?;
    let pmufw = have(
        "--pmufw",
        &inputs.pmufw,
        "pmufw.elf",
        "the PMU firmware ELF (Vitis: zynqmp_pmufw, or PetaLinux's pmufw.elf)",
        &mut missing,
    )?;
    let (atf, uboot) = if linux {
        (
            have(
                "--atf",
                &inputs.atf,
                "bl31.elf",
                "ATF's bl31.elf for zynqmp",
                &mut missing,
            )?,
            have(
                "--uboot",
                &inputs.uboot,
                "u-boot.elf",
                "U-Boot's ELF for the ZCU102",
                &mut missing,
            )?,
        )
    } else {
        (None, None)
    };
    if let Some(f) = &fsbl {
        parts.push(format!("  [bootloader, destination_cpu = a53-0] {f}"));
    }
    if let Some(p) = &pmufw {
        parts.push(format!("  [destination_cpu = pmu] {p}"));
    }
    if inputs.bitstream.is_some() {
        parts.push(format!("  [destination_device = pl] {bit_name}"));
    }
    if linux {
        if let Some(a) = &atf {
            parts.push(format!(
                "  [destination_cpu = a53-0, exception_level = el-3, trustzone] {a}"
            ));
        }
        if let Some(u) = &uboot {
            parts.push(format!(
                "  [destination_cpu = a53-0, exception_level = el-2] {u}"
            ));
        }
    } else if let Some(p) = &program_elf {
        parts.push(format!(
            "  [destination_cpu = a53-0, exception_level = el-3] {p}"
        ));
    } else if !inputs.skip_firmware {
        missing.push(format!(
            "the bare-metal program {BARE_METAL_PROGRAM} (not built)"
        ));
    }
    let bif = format!(
        "// BOOT.BIN of the nprdma {} image (bootgen -arch zynqmp -image boot.bif -o BOOT.BIN)\nthe_ROM_image:\n{{\n{}\n}}\n",
        pl.board,
        parts.join("\n")
    );
    write(&dir.join("boot.bif"), &bif)?;
    manifest_files.push("boot.bif".into());
    let complete =
        fsbl.is_some() && pmufw.is_some() && (!linux || (atf.is_some() && uboot.is_some()));
    if complete {
        bootgen(
            &dir,
            &[
                "-arch", "zynqmp", "-image", "boot.bif", "-o", "BOOT.BIN", "-w", "on",
            ],
            "BOOT.BIN",
        )?;
        manifest_files.push("BOOT.BIN".into());
    } else {
        missing.push("BOOT.BIN: not built until the FSBL and the PMU firmware (and for Linux ATF and U-Boot) are given".into());
    }

    // The manifest, last: the sha256 of every file above.
    let mut m = Manifest::new(pl, &design);
    for name in &manifest_files {
        m.add_file(name, &read(&dir.join(name))?).map_err(other)?;
    }
    write(&dir.join(manifest::FILE_NAME), m.to_text())?;
    Manifest::parse(&m.to_text())
        .and_then(|back| back.check(pl, &dir))
        .map_err(other)?;

    std::fs::remove_file(dir.join(INCOMPLETE))
        .map_err(|e| other(format!("remove {INCOMPLETE}: {e}")))?;
    let mut files = Vec::new();
    for name in manifest_files
        .iter()
        .chain([&manifest::FILE_NAME.to_string()])
    {
        let len = std::fs::metadata(dir.join(name))
            .map(|m| m.len())
            .unwrap_or(0);
        files.push((name.clone(), len));
    }
    Ok(Report {
        dir,
        files,
        missing,
    })
}

/// Prints a report.
pub fn print(report: &Report) {
    println!("image in {}:", report.dir.display());
    for (name, len) in &report.files {
        println!("  {name:<28} {len:>10} bytes");
    }
    if report.missing.is_empty() {
        println!("complete: copy the files to the SD card's FAT boot partition");
    } else {
        println!("missing (everything else is built):");
        for m in &report.missing {
            println!("  - {m}");
        }
    }
}

/// The image builder's own checks (`cargo xtask test`): a bitstream-shaped test file for the
/// board's part goes through the whole builder (parse, part and device IDCODE, .bin against
/// bootgen's, overlay with dtc, manifest), then bootgen packs it into a boot image that must
/// carry exactly our .bin; a test file for another part, and one whose header names the
/// board's part but whose data is for another device, must be refused. Prints its time.
pub fn self_check() -> Result<(), XtaskError> {
    let started = Instant::now();
    let pl = &ZCU102_PL;
    let tmp = workspace_root().join("target").join("image-check");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .map_err(|e| other(format!("clear {}: {e}", tmp.display())))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| other(format!("create {}: {e}", tmp.display())))?;
    let test_bit = tmp.join("test.bit");
    write(&test_bit, TestBitstream::for_part(&pl.part, 4096).bytes())?;
    let inputs = Inputs {
        bitstream: Some(test_bit.clone()),
        out: Some(tmp.join("image")),
        skip_firmware: true,
        ..Inputs::default()
    };
    let report = build(pl.board, &inputs)?;
    let names: Vec<&str> = report.files.iter().map(|(n, _)| n.as_str()).collect();
    for needed in [
        pl.firmware_name,
        overlay::DTBO_NAME,
        manifest::FILE_NAME,
        "boot.bif",
    ] {
        if !names.contains(&needed) {
            return Err(other(format!("the image lacks {needed}")));
        }
    }
    if !report.missing.iter().any(|m| m.starts_with("--fsbl")) {
        return Err(other("an image without an FSBL must say so"));
    }
    // bootgen packs the PL partition; it must carry our .bin unchanged.
    let img = &report.dir;
    write(
        &img.join("pl-only.bif"),
        "all:\n{\n  [destination_device = pl] nprdma-zcu102.bit\n}\n",
    )?;
    bootgen(
        img,
        &[
            "-arch",
            "zynqmp",
            "-image",
            "pl-only.bif",
            "-o",
            "pl-only.bin",
            "-w",
            "on",
        ],
        "PL-only boot image",
    )?;
    let boot = read(&img.join("pl-only.bin"))?;
    let ours = read(&img.join(pl.firmware_name))?;
    if !boot.windows(ours.len()).any(|w| w == ours.as_slice()) {
        return Err(other("bootgen's boot image does not carry our .bin"));
    }
    // A bitstream for another part is refused, by its header's part or, when the header
    // names the board's part, by the device IDCODE its configuration data writes (the
    // XCZU7EV's, 0x04730093, in both).
    let mut name = [0u8; 64];
    let n = pl.part.write_name(&mut name).unwrap_or(0);
    let name = String::from_utf8_lossy(&name[..n]).into_owned();
    for (file, header, why) in [
        ("wrong-part.bit", "xczu7ev-ffvc1156-2-e", "xczu7ev"),
        ("wrong-idcode.bit", name.as_str(), "IDCODE 0x04730093"),
    ] {
        let wrong = tmp.join(file);
        write(&wrong, TestBitstream::new(header, 0x0473_0093, 64).bytes())?;
        let refused = build(
            pl.board,
            &Inputs {
                bitstream: Some(wrong),
                out: Some(tmp.join(file.trim_end_matches(".bit"))),
                skip_firmware: true,
                ..Inputs::default()
            },
        );
        match refused {
            Err(e) if e.to_string().contains(why) => {}
            Err(e) => return Err(other(format!("{file} refused for another reason: {e}"))),
            Ok(_) => return Err(other(format!("{file} (another device's) was accepted"))),
        }
    }
    println!(
        "image builder checks passed: {} files, .bin = bootgen's ({} bytes), in {:.2} s",
        report.files.len(),
        ours.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
