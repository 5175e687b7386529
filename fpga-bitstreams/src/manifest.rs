//! The manifest of a board image: what the bitstream is for and the sha256 of every file.
//!
//! A text file, one `key = value` per line, then one `sha256 <hex> <file>` line per file
//! (`#` starts a comment line):
//!
//! ```text
//! format = 1
//! board = zcu102
//! part = xczu9eg-ffvb1156-2-e
//! design = nprdma_zcu102
//! npe_version = 1
//! regmap_hash = 0x1234abcd
//! sha256 9f86...0a08 nprdma-zcu102.bit.bin
//! ```
//!
//! `npe_version` and `regmap_hash` are `dma_engine::npe::regmap::DRIVER_DESIGN` of the
//! tree the image was built from; at probe time the driver compares them, and the engine's
//! `ID.VERSION`, with its own (`regmap::check_design`, given [`Manifest::design_id`]).

use std::fmt::Write as _;
use std::path::Path;

use boards::zynqmp::pl::PlDesign;
use dma_engine::npe::regmap::{DRIVER_DESIGN, DesignId};

use crate::digest::sha256_hex;
use crate::{BitstreamError, Result};

/// The manifest's file name in an image.
pub const FILE_NAME: &str = "manifest.txt";
/// The format this code writes and reads.
pub const FORMAT: u32 = 1;

/// A manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Board name (`boards::zynqmp::pl::PlDesign::board`).
    pub board: String,
    /// The part, in Vivado's spelling.
    pub part: String,
    /// The design name from the bitstream's header (`-` if the image has no bitstream).
    pub design: String,
    /// NPE spec version the design implements.
    pub npe_version: u32,
    /// Register-map hash of the design.
    pub regmap_hash: u32,
    /// (file name, sha256 hex) in the order added.
    pub files: Vec<(String, String)>,
}

fn part_name(pl: &PlDesign) -> String {
    let mut buf = [0u8; 64];
    let n = pl.part.write_name(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

impl Manifest {
    /// A manifest for `pl` with the driver's design identity and no files yet.
    pub fn new(pl: &PlDesign, design: &str) -> Self {
        Self {
            board: pl.board.into(),
            part: part_name(pl),
            design: design.into(),
            npe_version: DRIVER_DESIGN.version,
            regmap_hash: DRIVER_DESIGN.regmap_hash,
            files: Vec::new(),
        }
    }

    /// The identity the driver checks at probe time.
    pub fn design_id(&self) -> DesignId {
        DesignId {
            version: self.npe_version,
            regmap_hash: self.regmap_hash,
        }
    }

    /// Records `name` with the sha256 of `bytes`. Names are one path component without
    /// white space.
    pub fn add_file(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        check_name(name, 0)?;
        if self.files.iter().any(|(n, _)| n == name) {
            return Err(BitstreamError::ManifestMismatch {
                what: format!("{name} is listed twice"),
            });
        }
        let hex = sha256_hex(bytes);
        self.files
            .push((name.into(), String::from_utf8_lossy(&hex).into_owned()));
        Ok(())
    }

    /// The manifest's text.
    pub fn to_text(&self) -> String {
        let mut s = String::from("# nprdma board image manifest (fpga-bitstreams)\n");
        let _ = writeln!(s, "format = {FORMAT}");
        let _ = writeln!(s, "board = {}", self.board);
        let _ = writeln!(s, "part = {}", self.part);
        let _ = writeln!(s, "design = {}", self.design);
        let _ = writeln!(s, "npe_version = {}", self.npe_version);
        let _ = writeln!(s, "regmap_hash = {:#010x}", self.regmap_hash);
        for (name, hex) in &self.files {
            let _ = writeln!(s, "sha256 {hex} {name}");
        }
        s
    }

    /// Parses a manifest's text.
    pub fn parse(text: &str) -> Result<Self> {
        let mut m = Manifest {
            board: String::new(),
            part: String::new(),
            design: String::new(),
            npe_version: 0,
            regmap_hash: 0,
            files: Vec::new(),
        };
        let mut seen = [false; 6];
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let syntax = |what: &str| BitstreamError::ManifestSyntax {
                line: line_no,
                what: what.into(),
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("sha256 ") {
                let (hex, name) = rest
                    .split_once(' ')
                    .ok_or_else(|| syntax("`sha256 <hex> <file>` expected"))?;
                if hex.len() != 64
                    || !hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(syntax("the sha256 is not 64 lower-case hex digits"));
                }
                check_name(name, line_no)?;
                if m.files.iter().any(|(n, _)| n == name) {
                    return Err(syntax("file listed twice"));
                }
                m.files.push((name.into(), hex.into()));
                continue;
            }
            let (key, value) = line
                .split_once(" = ")
                .ok_or_else(|| syntax("`key = value` expected"))?;
            let idx = [
                "format",
                "board",
                "part",
                "design",
                "npe_version",
                "regmap_hash",
            ]
            .iter()
            .position(|k| *k == key)
            .ok_or_else(|| syntax("unknown key"))?;
            if std::mem::replace(&mut seen[idx], true) {
                return Err(syntax("key given twice"));
            }
            match idx {
                0 => {
                    if value.parse::<u32>() != Ok(FORMAT) {
                        return Err(syntax("unsupported format"));
                    }
                }
                1 => m.board = value.into(),
                2 => m.part = value.into(),
                3 => m.design = value.into(),
                4 => {
                    m.npe_version = value
                        .parse()
                        .map_err(|_| syntax("npe_version is not a number"))?
                }
                _ => {
                    let hex = value
                        .strip_prefix("0x")
                        .ok_or_else(|| syntax("regmap_hash must be 0x-prefixed hex"))?;
                    m.regmap_hash = u32::from_str_radix(hex, 16)
                        .map_err(|_| syntax("regmap_hash is not 32-bit hex"))?;
                }
            }
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            return Err(BitstreamError::ManifestSyntax {
                line: text.lines().count(),
                what: format!(
                    "key `{}` missing",
                    [
                        "format",
                        "board",
                        "part",
                        "design",
                        "npe_version",
                        "regmap_hash"
                    ][missing]
                ),
            });
        }
        Ok(m)
    }

    /// Checks the manifest against the board's design, the driver and the files in `dir`:
    /// board and part, NPE version and register-map hash, and every listed file's sha256.
    pub fn check(&self, pl: &PlDesign, dir: &Path) -> Result<()> {
        let mismatch = |what: String| Err(BitstreamError::ManifestMismatch { what });
        if self.board != pl.board {
            return mismatch(format!("board {} is not {}", self.board, pl.board));
        }
        let part = part_name(pl);
        if self.part != part {
            return mismatch(format!("part {} is not the board's {part}", self.part));
        }
        if self.design_id() != DRIVER_DESIGN {
            return mismatch(format!(
                "NPE version {} with register-map hash {:#010x}; the driver implements version {} with {:#010x}",
                self.npe_version,
                self.regmap_hash,
                DRIVER_DESIGN.version,
                DRIVER_DESIGN.regmap_hash
            ));
        }
        for (name, hex) in &self.files {
            let path = dir.join(name);
            let bytes = std::fs::read(&path)
                .map_err(|e| BitstreamError::io(format!("read {}", path.display()), &e))?;
            if sha256_hex(&bytes)[..] != *hex.as_bytes() {
                return mismatch(format!("{name}: sha256 differs from the manifest"));
            }
        }
        Ok(())
    }
}

fn check_name(name: &str, line: usize) -> Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains(['/', '\\'])
        || name.chars().any(char::is_whitespace)
    {
        return Err(BitstreamError::ManifestSyntax {
            line,
            what: format!("bad file name {name:?}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use boards::zynqmp::pl::ZCU102_PL;
    use dma_engine::npe::regmap::check_design;
    use dma_engine::npe::regs::{MAGIC, VERSION};

    use super::*;

    fn image() -> (tempfile::TempDir, Manifest) {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::new(&ZCU102_PL, "nprdma_zcu102");
        for (name, bytes) in [("a.bin", &b"bitstream"[..]), ("npe.dtbo", b"overlay")] {
            std::fs::write(dir.path().join(name), bytes).unwrap();
            m.add_file(name, bytes).unwrap();
        }
        (dir, m)
    }

    #[test]
    fn written_manifests_parse_back_and_check() {
        let (dir, m) = image();
        let text = m.to_text();
        let back = Manifest::parse(&text).unwrap();
        assert_eq!(back, m);
        back.check(&ZCU102_PL, dir.path()).unwrap();
        assert!(text.contains("part = xczu9eg-ffvb1156-2-e"));
        // What the driver checks at probe time with the engine's ID register.
        check_design(MAGIC << 8 | VERSION, back.design_id()).unwrap();
    }

    #[test]
    fn a_changed_file_or_identity_fails_the_check() {
        let (dir, m) = image();
        std::fs::write(dir.path().join("a.bin"), b"bitstreaM").unwrap();
        assert!(matches!(
            m.check(&ZCU102_PL, dir.path()),
            Err(BitstreamError::ManifestMismatch { what }) if what.starts_with("a.bin")
        ));
        let (dir, mut m) = image();
        m.regmap_hash ^= 0x100;
        assert!(m.check(&ZCU102_PL, dir.path()).is_err());
        assert!(check_design(MAGIC << 8 | VERSION, m.design_id()).is_err());
        let (dir, mut m) = image();
        m.part = "xczu7ev-ffvc1156-2-e".into();
        assert!(m.check(&ZCU102_PL, dir.path()).is_err());
        let (dir, m) = image();
        std::fs::remove_file(dir.path().join("npe.dtbo")).unwrap();
        assert!(matches!(
            m.check(&ZCU102_PL, dir.path()),
            Err(BitstreamError::Io { .. })
        ));
    }

    #[test]
    fn malformed_manifests_are_syntax_errors() {
        let (_dir, m) = image();
        let good = m.to_text();
        for (bad, line) in [
            (good.replace("format = 1", "format = 2"), 2),
            (good.replace("regmap_hash = 0x", "regmap_hash = "), 7),
            (good.replace("sha256 ", "sha256 x"), 8),
            (good.replace(" a.bin", " ../a.bin"), 8),
            (good.replace("board = ", "board: "), 3),
            (format!("{good}board = zcu102\n"), 10),
        ] {
            match Manifest::parse(&bad) {
                Err(BitstreamError::ManifestSyntax { line: l, .. }) => assert_eq!(l, line, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let without_part: String = good
            .lines()
            .filter(|l| !l.starts_with("part"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(matches!(
            Manifest::parse(&without_part),
            Err(BitstreamError::ManifestSyntax { what, .. }) if what.contains("part")
        ));
        let mut m2 = m.clone();
        assert!(m2.add_file("a.bin", b"x").is_err());
        assert!(m2.add_file("with space", b"x").is_err());
    }
}
