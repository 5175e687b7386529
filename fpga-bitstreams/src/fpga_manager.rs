//! Loading a bitstream through Linux's FPGA manager, and its state.
//!
//! Two interfaces exist, and this module uses whichever the kernel has:
//!
//! - **A device-tree overlay through configfs** (preferred): the `.bin` is put in the
//!   firmware search path (`/lib/firmware`, Linux `Documentation/driver-api/firmware/
//!   fw_search_path.rst`), and the overlay, whose `firmware-name` names it and which targets
//!   the ZynqMP's `fpga_full` region (`arch/arm64/boot/dts/xilinx/zynqmp.dtsi`), is written
//!   to `/sys/kernel/config/device-tree/overlays/<name>/dtbo`. Applying it programs the PL
//!   through the region's manager and then adds the NPE nodes (Linux
//!   `Documentation/devicetree/bindings/fpga/fpga-region.yaml`, `drivers/fpga/of-fpga-region.c`).
//!   The configfs overlay interface is not in mainline Linux; Xilinx's kernel (linux-xlnx,
//!   `drivers/of/configfs.c`) has it.
//! - **`/sys/class/fpga_manager/<mgr>/firmware`** (Xilinx's kernel): writing a file name
//!   loads it from the firmware search path. This programs the PL but adds no device nodes.
//!
//! The state is `/sys/class/fpga_manager/<mgr>/state`, one of the strings of Linux's
//! `drivers/fpga/fpga-mgr.c` (`state_str`).
//!
//! Everything goes through [`SysPaths`], so the tests run over a tree in a temporary
//! directory: the interface is files, and a tree of files is what it is tested against.

use std::path::{Path, PathBuf};

use crate::{BitstreamError, Result};

/// An FPGA manager state (Linux `include/linux/fpga/fpga-mgr.h`, `enum fpga_mgr_states`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MgrState {
    /// "unknown"
    Unknown,
    /// "power off"
    PowerOff,
    /// "power up"
    PowerUp,
    /// "reset"
    Reset,
    /// "firmware request"
    FirmwareRequest,
    /// "firmware request error"
    FirmwareRequestError,
    /// "parse header" (Linux 6.1 and later)
    ParseHeader,
    /// "parse header error"
    ParseHeaderError,
    /// "write init"
    WriteInit,
    /// "write init error"
    WriteInitError,
    /// "write"
    Write,
    /// "write error"
    WriteError,
    /// "write complete"
    WriteComplete,
    /// "write complete error"
    WriteCompleteError,
    /// "operating"
    Operating,
}

const STATES: [(&str, MgrState); 15] = [
    ("unknown", MgrState::Unknown),
    ("power off", MgrState::PowerOff),
    ("power up", MgrState::PowerUp),
    ("reset", MgrState::Reset),
    ("firmware request", MgrState::FirmwareRequest),
    ("firmware request error", MgrState::FirmwareRequestError),
    ("parse header", MgrState::ParseHeader),
    ("parse header error", MgrState::ParseHeaderError),
    ("write init", MgrState::WriteInit),
    ("write init error", MgrState::WriteInitError),
    ("write", MgrState::Write),
    ("write error", MgrState::WriteError),
    ("write complete", MgrState::WriteComplete),
    ("write complete error", MgrState::WriteCompleteError),
    ("operating", MgrState::Operating),
];

impl MgrState {
    /// Parses the `state` attribute's text.
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim_end_matches('\n');
        STATES
            .iter()
            .find(|(s, _)| *s == t)
            .map(|(_, st)| *st)
            .ok_or_else(|| BitstreamError::UnknownState(t.into()))
    }

    /// The kernel's spelling.
    pub fn as_str(self) -> &'static str {
        STATES
            .iter()
            .find(|(_, st)| *st == self)
            .map_or("unknown", |(s, _)| s)
    }

    /// Whether the state reports a failed step.
    pub fn is_error(self) -> bool {
        self.as_str().ends_with(" error")
    }
}

/// Where the kernel's interfaces are: the real paths, or the same under a test root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysPaths {
    /// `/sys/class/fpga_manager`.
    pub fpga_class: PathBuf,
    /// `/lib/firmware`.
    pub firmware_dir: PathBuf,
    /// `/sys/kernel/config/device-tree/overlays`.
    pub overlays: PathBuf,
}

impl SysPaths {
    /// The paths of a running Linux.
    pub fn system() -> Self {
        Self::under(Path::new("/"))
    }

    /// The same paths under `root`.
    pub fn under(root: &Path) -> Self {
        Self {
            fpga_class: root.join("sys/class/fpga_manager"),
            firmware_dir: root.join("lib/firmware"),
            overlays: root.join("sys/kernel/config/device-tree/overlays"),
        }
    }
}

/// One FPGA manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manager {
    /// Its sysfs directory.
    pub dir: PathBuf,
    /// The `name` attribute (the driver's name for it, e.g. "Xilinx ZynqMP FPGA Manager").
    pub name: String,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| BitstreamError::io(format!("read {}", path.display()), &e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .map_err(|e| BitstreamError::io(format!("write {}", path.display()), &e))
}

/// The managers under `paths.fpga_class`, sorted by directory name.
pub fn managers(paths: &SysPaths) -> Result<Vec<Manager>> {
    let class = &paths.fpga_class;
    let entries = match std::fs::read_dir(class) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BitstreamError::NoFpgaManager {
                root: class.display().to_string(),
            });
        }
        Err(e) => return Err(BitstreamError::io(format!("list {}", class.display()), &e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| BitstreamError::io(format!("list {}", class.display()), &e))?;
        let dir = entry.path();
        if dir.join("state").exists() {
            let name = read(&dir.join("name"))
                .unwrap_or_default()
                .trim()
                .to_string();
            out.push(Manager { dir, name });
        }
    }
    out.sort_by(|a, b| a.dir.cmp(&b.dir));
    if out.is_empty() {
        return Err(BitstreamError::NoFpgaManager {
            root: class.display().to_string(),
        });
    }
    Ok(out)
}

impl Manager {
    /// The manager's state now.
    pub fn state(&self) -> Result<MgrState> {
        MgrState::parse(&read(&self.dir.join("state"))?)
    }
}

/// How a bitstream was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// A configfs overlay: the PL and the NPE device nodes.
    ConfigfsOverlay,
    /// The `firmware` attribute: the PL only, no device nodes.
    SysfsFirmware,
}

/// What a load did and the state it left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadReport {
    /// The manager's directory.
    pub manager: PathBuf,
    /// The interface used.
    pub method: Method,
    /// The manager's state after the load.
    pub state: MgrState,
}

/// A load request: the `.bin`, its file name (the overlay's `firmware-name`), and the
/// compiled overlay.
pub struct LoadRequest<'a> {
    /// File name in the firmware search path.
    pub firmware_name: &'a str,
    /// The `.bin`.
    pub bin: &'a [u8],
    /// The compiled overlay (`.dtbo`).
    pub dtbo: &'a [u8],
    /// The configfs overlay directory's name.
    pub overlay_name: &'a str,
}

/// Loads a bitstream with the first manager and reports its state; an error state is
/// [`BitstreamError::LoadFailed`].
pub fn load(paths: &SysPaths, req: &LoadRequest<'_>) -> Result<LoadReport> {
    if req.firmware_name.is_empty() || req.firmware_name.contains('/') {
        return Err(BitstreamError::ManifestMismatch {
            what: format!("firmware name {:?} is not a file name", req.firmware_name),
        });
    }
    let mgr = managers(paths)?.remove(0);
    let method = if paths.overlays.is_dir() {
        Method::ConfigfsOverlay
    } else if mgr.dir.join("firmware").exists() {
        Method::SysfsFirmware
    } else {
        return Err(BitstreamError::NoLoadInterface {
            manager: mgr.dir.display().to_string(),
            configfs: paths.overlays.display().to_string(),
        });
    };
    std::fs::create_dir_all(&paths.firmware_dir)
        .map_err(|e| BitstreamError::io(format!("create {}", paths.firmware_dir.display()), &e))?;
    write(&paths.firmware_dir.join(req.firmware_name), req.bin)?;
    match method {
        Method::ConfigfsOverlay => {
            let dir = paths.overlays.join(req.overlay_name);
            if dir.exists() {
                // An overlay of that name is applied: removing the directory removes it.
                std::fs::remove_dir(&dir)
                    .map_err(|e| BitstreamError::io(format!("remove {}", dir.display()), &e))?;
            }
            std::fs::create_dir(&dir)
                .map_err(|e| BitstreamError::io(format!("create {}", dir.display()), &e))?;
            write(&dir.join("dtbo"), req.dtbo)?;
            let status = dir.join("status");
            if status.exists() {
                let s = read(&status)?;
                if s.trim() != "applied" {
                    return Err(BitstreamError::LoadFailed {
                        state: format!("overlay {}", s.trim()),
                    });
                }
            }
        }
        Method::SysfsFirmware => {
            let flags = mgr.dir.join("flags");
            if flags.exists() {
                // 0: a full bitstream (Xilinx's fpga-mgr `flags` attribute).
                write(&flags, b"0")?;
            }
            write(&mgr.dir.join("firmware"), req.firmware_name.as_bytes())?;
        }
    }
    let state = mgr.state()?;
    if state.is_error() {
        return Err(BitstreamError::LoadFailed {
            state: state.as_str().into(),
        });
    }
    Ok(LoadReport {
        manager: mgr.dir,
        method,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake tree: one manager in `state`, with or without Xilinx's `firmware` attribute
    /// and with or without configfs overlays.
    fn tree(state: &str, firmware_attr: bool, configfs: bool) -> (tempfile::TempDir, SysPaths) {
        let root = tempfile::tempdir().unwrap();
        let paths = SysPaths::under(root.path());
        let mgr = paths.fpga_class.join("fpga0");
        std::fs::create_dir_all(&mgr).unwrap();
        std::fs::write(mgr.join("name"), "Xilinx ZynqMP FPGA Manager\n").unwrap();
        std::fs::write(mgr.join("state"), format!("{state}\n")).unwrap();
        if firmware_attr {
            std::fs::write(mgr.join("firmware"), "").unwrap();
            std::fs::write(mgr.join("flags"), "").unwrap();
        }
        if configfs {
            std::fs::create_dir_all(&paths.overlays).unwrap();
        }
        (root, paths)
    }

    const REQ: LoadRequest<'static> = LoadRequest {
        firmware_name: "nprdma-zcu102.bit.bin",
        bin: b"\x66\x55\x99\xaa",
        dtbo: b"\xd0\x0d\xfe\xed",
        overlay_name: "nprdma",
    };

    #[test]
    fn every_kernel_state_string_parses_and_round_trips() {
        for (s, st) in STATES {
            assert_eq!(MgrState::parse(&format!("{s}\n")).unwrap(), st);
            assert_eq!(st.as_str(), s);
        }
        assert!(MgrState::WriteError.is_error() && !MgrState::Operating.is_error());
        assert_eq!(
            MgrState::parse("operating-ish"),
            Err(BitstreamError::UnknownState("operating-ish".into()))
        );
    }

    #[test]
    fn an_overlay_goes_through_configfs_and_the_bin_into_the_firmware_path() {
        let (_root, paths) = tree("operating", true, true);
        let r = load(&paths, &REQ).unwrap();
        assert_eq!(
            (r.method, r.state),
            (Method::ConfigfsOverlay, MgrState::Operating)
        );
        assert_eq!(
            std::fs::read(paths.firmware_dir.join(REQ.firmware_name)).unwrap(),
            REQ.bin
        );
        assert_eq!(
            std::fs::read(paths.overlays.join("nprdma/dtbo")).unwrap(),
            REQ.dtbo
        );
        // The sysfs attribute was not used.
        assert_eq!(
            std::fs::read(paths.fpga_class.join("fpga0/firmware")).unwrap(),
            b""
        );
        // Loading again replaces the applied overlay.
        std::fs::remove_file(paths.overlays.join("nprdma/dtbo")).unwrap();
        load(&paths, &REQ).unwrap();
    }

    #[test]
    fn without_configfs_the_firmware_attribute_is_used() {
        let (_root, paths) = tree("operating", true, false);
        let r = load(&paths, &REQ).unwrap();
        assert_eq!(r.method, Method::SysfsFirmware);
        let mgr = paths.fpga_class.join("fpga0");
        assert_eq!(
            std::fs::read_to_string(mgr.join("firmware")).unwrap(),
            REQ.firmware_name
        );
        assert_eq!(std::fs::read_to_string(mgr.join("flags")).unwrap(), "0");
        assert_eq!(
            managers(&paths).unwrap()[0].name,
            "Xilinx ZynqMP FPGA Manager"
        );
    }

    #[test]
    fn failures_are_typed() {
        let (_root, paths) = tree("write error", true, false);
        assert_eq!(
            load(&paths, &REQ),
            Err(BitstreamError::LoadFailed {
                state: "write error".into()
            })
        );
        let (_root, paths) = tree("operating", false, false);
        assert!(matches!(
            load(&paths, &REQ),
            Err(BitstreamError::NoLoadInterface { .. })
        ));
        let (_root, paths) = tree("bogus", true, false);
        assert_eq!(
            load(&paths, &REQ),
            Err(BitstreamError::UnknownState("bogus".into()))
        );
        let empty = tempfile::tempdir().unwrap();
        let paths = SysPaths::under(empty.path());
        assert!(matches!(
            load(&paths, &REQ),
            Err(BitstreamError::NoFpgaManager { .. })
        ));
        std::fs::create_dir_all(paths.fpga_class.join("fpga0")).unwrap();
        assert!(matches!(
            managers(&paths),
            Err(BitstreamError::NoFpgaManager { .. })
        ));
        let (_root, paths) = tree("operating", true, true);
        let bad = LoadRequest {
            firmware_name: "../x.bin",
            ..REQ
        };
        assert!(load(&paths, &bad).is_err());
        // An overlay configfs reports as not applied.
        let (_root, paths) = tree("operating", false, true);
        std::fs::create_dir_all(paths.overlays.join("nprdma")).unwrap();
        // The fake kernel: a status file in a directory that load() recreates is not
        // possible, so a directory that cannot be removed (not empty) shows the error path.
        std::fs::write(paths.overlays.join("nprdma/status"), "unapplied\n").unwrap();
        assert!(matches!(load(&paths, &REQ), Err(BitstreamError::Io { .. })));
    }
}
