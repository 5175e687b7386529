//! The Debian guest machinery shared by `cargo xtask rxe-test` and `cargo xtask
//! kernel-test`: Debian packages fetched with `apt-get download` and unpacked under `target/`,
//! the kernel's module order, the shared libraries a host-built binary needs inside the guest,
//! a newc initramfs, and one boot of `qemu-system-x86_64` (or, for kernel-test's arm64 guest,
//! `qemu-system-aarch64`) with the serial console as the test protocol. Packages of another
//! architecture or another Debian suite come through a private apt state under `target/`
//! ([`AptState`]), so the machine's own apt configuration is never changed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{XtaskError, run_status};

pub fn other(msg: impl Into<String>) -> XtaskError {
    XtaskError::Other(msg.into())
}

/// Runs `cargo build <args>` with JSON messages and returns the artifacts named `names`, in
/// that order, where cargo says it put them (so `CARGO_TARGET_DIR` or a configured target
/// directory is honoured, and a stale copy elsewhere is never booted).
pub fn cargo_artifacts(args: &[&str], names: &[&str]) -> Result<Vec<PathBuf>, XtaskError> {
    let what = format!("cargo build {}", args.join(" "));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(crate::util::workspace_root())
        .args(["build", "--quiet"])
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: what.clone(),
            error,
        })?;
    if !out.status.success() {
        return Err(XtaskError::CommandFailed {
            what,
            status: out.status,
        });
    }
    let messages = String::from_utf8_lossy(&out.stdout);
    names
        .iter()
        .map(|name| {
            built_artifact(&messages, name)
                .filter(|p| p.is_file())
                .ok_or_else(|| other(format!("{what}: cargo reported no {name}")))
        })
        .collect()
}

/// The path of the artifact named `file_name` among cargo's JSON build messages (a
/// `compiler-artifact`'s `filenames` or `executable`).
pub fn built_artifact(messages: &str, file_name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .flat_map(|m| {
            let files = m["filenames"].as_array().cloned().unwrap_or_default();
            files.into_iter().chain([m["executable"].clone()])
        })
        .filter_map(|v| v.as_str().map(PathBuf::from))
        .find(|p| p.file_name().is_some_and(|n| n == file_name))
}

/// A Debian package to fetch: its name and, if it matters, its exact version.
pub struct Wanted {
    /// Package name.
    pub name: String,
    /// Exact version (`apt-get download name=version`), or the candidate.
    pub version: Option<String>,
}

impl Wanted {
    /// The candidate version of `name`.
    pub fn any(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: None,
        }
    }

    /// The file name prefix of its `.deb` (`name_version_`, the version's `:` as `%3a`, as
    /// apt names downloads).
    fn file_prefix(&self) -> String {
        match &self.version {
            Some(v) => format!("{}_{}_", self.name, v.replace(':', "%3a")),
            None => format!("{}_", self.name),
        }
    }

    fn apt_arg(&self) -> String {
        match &self.version {
            Some(v) => format!("{}={v}", self.name),
            None => self.name.clone(),
        }
    }
}

/// Downloads the `wanted` packages into `dir` with `apt-get download` unless a `.deb` of each
/// is already there; returns their files in the order asked.
pub fn fetch_packages(dir: &Path, wanted: &[Wanted]) -> Result<Vec<PathBuf>, XtaskError> {
    fetch_packages_from(dir, wanted, None)
}

/// An apt state of its own (package lists and cache under `root`), for one foreign
/// architecture or one other Debian suite, so that nothing of the machine's apt or dpkg
/// configuration changes (no `dpkg --add-architecture`, no new entry in its sources):
///
/// - [`AptState::new`]: `apt-get -o Dir::State::Lists=... -o APT::Architecture=arm64 ...`
///   reads the machine's sources and keeps its lists apart;
/// - [`AptState::suite`]: a sources list of its own under `root` (`Dir::Etc::SourceList`,
///   with an empty `Dir::Etc::SourceParts`), one suite of the Debian archive checked against
///   debian-archive-keyring's keys, and only its package indices (`target=Packages`).
pub struct AptState {
    root: PathBuf,
    arch: &'static str,
    /// `Some(suite)` when the state has a sources list of its own.
    suite: Option<&'static str>,
}

/// The Debian archive the private sources list of [`AptState::suite`] names.
pub const DEBIAN_ARCHIVE: &str = "http://deb.debian.org/debian";

/// The keyring (package debian-archive-keyring) that checks a suite's `InRelease`.
pub const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

impl AptState {
    /// The state under `root` for Debian architecture `arch`, from the machine's sources.
    pub fn new(root: PathBuf, arch: &'static str) -> Self {
        Self {
            root,
            arch,
            suite: None,
        }
    }

    /// The state under `root` for `suite` (e.g. `trixie-backports`) of the Debian archive,
    /// main only, architecture `arch`, from a sources list of its own.
    pub fn suite(root: PathBuf, arch: &'static str, suite: &'static str) -> Self {
        Self {
            root,
            arch,
            suite: Some(suite),
        }
    }

    /// The one-line sources list of a [`AptState::suite`] state.
    fn sources_line(suite: &str) -> String {
        format!("deb [target=Packages signed-by={DEBIAN_KEYRING}] {DEBIAN_ARCHIVE} {suite} main\n")
    }

    /// The `-o` options that select this state.
    pub fn options(&self) -> Vec<String> {
        let mut o = vec![
            "-o".into(),
            format!("Dir::State::Lists={}", self.root.join("lists").display()),
            "-o".into(),
            format!("Dir::Cache={}", self.root.join("cache").display()),
            "-o".into(),
            format!("APT::Architecture={}", self.arch),
            "-o".into(),
            format!("APT::Architectures::={}", self.arch),
        ];
        if self.suite.is_some() {
            let etc = self.root.join("etc");
            for (key, path) in [
                ("Dir::Etc::SourceList", etc.join("sources.list")),
                ("Dir::Etc::SourceParts", etc.join("sources.list.d")),
                ("Dir::Etc::Preferences", etc.join("preferences")),
                ("Dir::Etc::PreferencesParts", etc.join("preferences.d")),
            ] {
                o.push("-o".into());
                o.push(format!("{key}={}", path.display()));
            }
            o.extend(["-o".into(), "Acquire::Languages=none".into()]);
        }
        o
    }

    /// Writes a suite state's sources list (and its empty parts directories).
    fn write_sources(&self) -> Result<(), XtaskError> {
        let Some(suite) = self.suite else {
            return Ok(());
        };
        let etc = self.root.join("etc");
        for d in [etc.join("sources.list.d"), etc.join("preferences.d")] {
            std::fs::create_dir_all(&d).map_err(|e| other(format!("{}: {e}", d.display())))?;
        }
        let list = etc.join("sources.list");
        std::fs::write(&list, Self::sources_line(suite))
            .map_err(|e| other(format!("{}: {e}", list.display())))
    }

    /// What the state is, for messages.
    fn what(&self) -> String {
        match self.suite {
            Some(suite) => format!("{suite} {}", self.arch),
            None => self.arch.to_string(),
        }
    }

    /// `apt-get update` of this state, once per process, or when it has no lists yet.
    pub fn update(&self, force: bool) -> Result<(), XtaskError> {
        // The states updated in this process, by root.
        static DONE: std::sync::Mutex<BTreeSet<PathBuf>> = std::sync::Mutex::new(BTreeSet::new());
        let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
        let lists = self.root.join("lists");
        let has_lists = std::fs::read_dir(&lists)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().contains("Packages"))
            })
            .unwrap_or(false);
        if has_lists && (done.contains(&self.root) || !force) {
            return Ok(());
        }
        for d in [
            lists.join("partial"),
            self.root.join("cache/archives/partial"),
        ] {
            std::fs::create_dir_all(&d).map_err(|e| other(format!("{}: {e}", d.display())))?;
        }
        self.write_sources()?;
        println!(
            "xtask: apt-get update ({} lists in {})",
            self.what(),
            self.root.display()
        );
        run_status(
            &format!("apt-get update ({})", self.what()),
            Command::new("apt-get")
                .args(["-q", "-o", "Dpkg::Use-Pty=0"])
                .args(self.options())
                .arg("update")
                .stdout(Stdio::null())
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        done.insert(self.root.clone());
        Ok(())
    }

    /// The line `apt-cache <args>` prints, through this state.
    pub fn cache_query(&self, args: &[&str]) -> Result<String, XtaskError> {
        let out = Command::new("apt-cache")
            .args(self.options())
            .args(args)
            .output()
            .map_err(|error| XtaskError::Spawn {
                what: "apt-cache".into(),
                error,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// [`fetch_packages`] through `state` (a foreign architecture), or the machine's apt.
pub fn fetch_packages_from(
    dir: &Path,
    wanted: &[Wanted],
    state: Option<&AptState>,
) -> Result<Vec<PathBuf>, XtaskError> {
    std::fs::create_dir_all(dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let have = |w: &Wanted| -> Option<PathBuf> {
        let prefix = w.file_prefix();
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .find_map(|e| {
                let f = e.file_name().to_string_lossy().into_owned();
                (f.starts_with(&prefix) && f.ends_with(".deb")).then(|| e.path())
            })
    };
    let missing: Vec<String> = wanted
        .iter()
        .filter(|w| have(w).is_none())
        .map(Wanted::apt_arg)
        .collect();
    if !missing.is_empty() {
        println!("xtask: apt-get download {} package(s)", missing.len());
        let options = state.map(AptState::options).unwrap_or_default();
        let download = || {
            Command::new("apt-get")
                .current_dir(dir)
                .args(&options)
                .arg("download")
                .args(&missing)
                .output()
                .map_err(|error| XtaskError::Spawn {
                    what: "apt-get download".into(),
                    error,
                })
        };
        let mut out = download()?;
        if !out.status.success() {
            match state {
                Some(s) => s.update(true)?,
                None => apt_update_once(),
            }
            out = download()?;
        }
        if !out.status.success() {
            return Err(other(format!(
                "apt-get download failed (run `apt-get update` first?): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    wanted
        .iter()
        .map(|w| {
            have(w).ok_or_else(|| other(format!("package {} was not downloaded", w.apt_arg())))
        })
        .collect()
}

/// Runs `apt-get update` once per process (package lists may be missing on a machine where
/// every needed package was already installed).
pub fn apt_update_once() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        println!("xtask: apt-get update");
        let _ = Command::new("apt-get")
            .args(["-q", "-o", "Dpkg::Use-Pty=0", "update"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
    });
}

/// The kernel package `linux-image-amd64` currently depends on.
pub fn kernel_package() -> Result<String, XtaskError> {
    match kernel_package_from_lists() {
        Ok(k) => Ok(k),
        Err(_) => {
            apt_update_once();
            kernel_package_from_lists()
        }
    }
}

fn kernel_package_from_lists() -> Result<String, XtaskError> {
    let out = Command::new("apt-cache")
        .args(["depends", "linux-image-amd64"])
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "apt-cache depends".into(),
            error,
        })?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Depends: ")
                .filter(|p| p.starts_with("linux-image-") && p.ends_with("-amd64"))
                .map(str::to_string)
        })
        .ok_or_else(|| other("apt-cache knows no linux-image-amd64 (run `apt-get update` first)"))
}

/// The version apt would install of `name` (`apt-cache show --no-all-versions`).
pub fn candidate_version(name: &str) -> Result<String, XtaskError> {
    let query = || -> Result<Option<String>, XtaskError> {
        let out = Command::new("apt-cache")
            .args(["show", "--no-all-versions", name])
            .output()
            .map_err(|error| XtaskError::Spawn {
                what: "apt-cache show".into(),
                error,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("Version: "))
            .map(|v| v.trim().to_string()))
    };
    match query()? {
        Some(v) => Ok(v),
        None => {
            apt_update_once();
            query()?.ok_or_else(|| other(format!("apt-cache knows no {name}")))
        }
    }
}

/// Unpacks the packages once, each into `cache/<dest_of(its file name)>`; a stamp file lists
/// what was unpacked, so the same set is not unpacked again (a different one replaces every
/// destination directory).
pub fn unpack(
    cache: &Path,
    debs: &[PathBuf],
    dest_of: &dyn Fn(&str) -> &'static str,
) -> Result<(), XtaskError> {
    let stamp = cache.join("unpacked.list");
    let list: String = debs
        .iter()
        .map(|d| d.file_name().unwrap_or_default().to_string_lossy() + "\n")
        .collect();
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(list.as_str()) {
        return Ok(());
    }
    let names: Vec<String> = debs
        .iter()
        .map(|d| {
            d.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let dests: BTreeSet<&str> = names.iter().map(|n| dest_of(n)).collect();
    for d in &dests {
        let _ = std::fs::remove_dir_all(cache.join(d));
    }
    for (deb, name) in debs.iter().zip(&names) {
        run_status(
            &format!("dpkg-deb -x {name}"),
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(deb)
                .arg(cache.join(dest_of(name))),
        )?;
    }
    std::fs::write(&stamp, list).map_err(|e| other(e.to_string()))
}

pub fn kernel_version(kdir: &Path) -> Result<String, XtaskError> {
    std::fs::read_dir(modules_root(kdir))
        .map_err(|e| other(format!("no kernel modules in {}: {e}", kdir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or_else(|| other("no kernel version directory"))
}

/// Where an unpacked kernel keeps its module directories: `usr/lib/modules` in packages
/// built for a merged /usr (Debian 13 and later), else `lib/modules`.
pub fn modules_root(kdir: &Path) -> PathBuf {
    let merged = kdir.join("usr/lib/modules");
    if merged.is_dir() {
        merged
    } else {
        kdir.join("lib/modules")
    }
}

/// A module's name from its file name (`rdma_rxe.ko` or, compressed, `rdma_rxe.ko.xz`),
/// with `-` read as `_` as the kernel does.
fn module_name(file: &str) -> Option<String> {
    file.strip_suffix(".ko")
        .or_else(|| file.strip_suffix(".ko.xz"))
        .map(|n| n.replace('-', "_"))
}

/// The bytes of the module at `path`, decompressed with `xz -dc` when it is a `.ko.xz`
/// (busybox's insmod in the guests loads plain ELF only).
pub fn read_module(path: &Path) -> Result<Vec<u8>, XtaskError> {
    if path.extension().is_none_or(|e| e != "xz") {
        return read(path);
    }
    let out = Command::new("xz")
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "xz -dc (package xz-utils)".into(),
            error,
        })?;
    if !out.status.success() {
        return Err(other(format!(
            "xz -dc {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// Where a module from [`module_order`] goes in a guest, relative to its module directory:
/// its path without a compression suffix (the guest gets it decompressed).
pub fn module_guest_path(rel: &Path) -> PathBuf {
    match rel.extension() {
        Some(e) if e == "xz" => rel.with_extension(""),
        _ => rel.to_path_buf(),
    }
}

/// The `depends=` list of a kernel module (the `.modinfo` ELF section). `None` for anything
/// that is not a well-formed ELF64 module: every offset and size in it is checked.
fn module_depends(ko: &[u8]) -> Option<Vec<String>> {
    let bytes = |at: usize, len: usize| ko.get(at..at.checked_add(len)?);
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?));
    let usize_at =
        |at: usize| usize::try_from(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?)).ok();
    if bytes(0, 4)? != b"\x7fELF" || *ko.get(4)? != 2 {
        return None;
    }
    let shoff = usize_at(0x28)?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    let shstrndx = usize::from(u16_at(0x3e)?);
    // (sh_name, sh_offset, sh_size) of section `i` (ELF64: at 0, 24 and 32 of its header).
    let section = |i: usize| -> Option<(u32, usize, usize)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(h)?,
            usize_at(h.checked_add(24)?)?,
            usize_at(h.checked_add(32)?)?,
        ))
    };
    let (_, stroff, strsize) = section(shstrndx)?;
    let names = bytes(stroff, strsize)?;
    for i in 0..shnum {
        let (name, off, size) = section(i)?;
        let n = names.get(usize::try_from(name).ok()?..)?;
        let end = n.iter().position(|b| *b == 0)?;
        if &n[..end] == b".modinfo" {
            let info = bytes(off, size)?;
            let deps = info
                .split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(b"depends="))
                .map(|d| String::from_utf8_lossy(d).into_owned())
                .unwrap_or_default();
            return Some(
                deps.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.replace('-', "_"))
                    .collect(),
            );
        }
    }
    Some(Vec::new())
}

/// The wanted modules and their dependencies, dependencies first (paths relative to the
/// kernel's module directory; `.ko` or `.ko.xz`, which [`read_module`] reads alike).
pub fn module_order(moddir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>, XtaskError> {
    let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut stack = vec![moddir.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| other(format!("{}: {e}", d.display())))? {
            let p = e.map_err(|e| other(e.to_string()))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p.file_name().and_then(|n| n.to_str()).and_then(module_name) {
                by_name.insert(n, p.strip_prefix(moddir).unwrap_or(&p).to_path_buf());
            }
        }
    }
    // Modules compiled into the kernel (`modules.builtin`: one `kernel/.../name.ko` per line).
    let builtin: BTreeSet<String> = std::fs::read_to_string(moddir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| module_name(Path::new(l.trim()).file_name()?.to_str()?))
        .collect();
    let mut order: Vec<PathBuf> = Vec::new();
    fn visit(
        name: &str,
        moddir: &Path,
        (by_name, builtin): (&BTreeMap<String, PathBuf>, &BTreeSet<String>),
        order: &mut Vec<PathBuf>,
        depth: usize,
    ) -> Result<(), XtaskError> {
        let Some(rel) = by_name.get(name) else {
            if builtin.contains(name) {
                return Ok(());
            }
            return Err(other(format!(
                "kernel module {name} is neither in {} nor built in (modules.builtin)",
                moddir.display()
            )));
        };
        if order.contains(rel) || depth > 32 {
            return Ok(());
        }
        let bytes = read_module(&moddir.join(rel))?;
        let deps = module_depends(&bytes)
            .ok_or_else(|| other(format!("{}: not a kernel module", rel.display())))?;
        for d in deps {
            visit(&d, moddir, (by_name, builtin), order, depth + 1)?;
        }
        if !order.contains(rel) {
            order.push(rel.clone());
        }
        Ok(())
    }
    for w in wanted {
        visit(
            &w.replace('-', "_"),
            moddir,
            (&by_name, &builtin),
            &mut order,
            0,
        )?;
    }
    Ok(order)
}

/// Shared libraries `files` need, resolved inside the unpacked packages: (source, guest path).
pub fn library_closure(
    stage: &Path,
    files: &[PathBuf],
) -> Result<Vec<(PathBuf, String)>, XtaskError> {
    let ld_path = format!(
        "{}:{}",
        stage.join("lib/x86_64-linux-gnu").display(),
        stage.join("usr/lib/x86_64-linux-gnu").display()
    );
    let out = Command::new("ldd")
        .args(files)
        .env("LD_LIBRARY_PATH", ld_path)
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "ldd".into(),
            error,
        })?;
    let mut libs: BTreeMap<String, PathBuf> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim();
        if line.ends_with(':') {
            continue; // "file:" headers when several files are listed
        }
        let path = if let Some((_, rest)) = line.split_once("=> ") {
            rest.split_whitespace().next()
        } else if line.starts_with('/') {
            line.split_whitespace().next()
        } else {
            None
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            if line.contains("not found") {
                return Err(other(format!("ldd: {line}")));
            }
            continue;
        };
        let p = PathBuf::from(path);
        let guest = match p.strip_prefix(stage) {
            Ok(rel) => format!("/{}", rel.display()),
            Err(_) => path.to_string(),
        };
        let guest = if guest.ends_with("ld-linux-x86-64.so.2") {
            "/lib64/ld-linux-x86-64.so.2".to_string()
        } else {
            guest
        };
        // Prefer the packaged copy of a library the host also has.
        let src = p
            .file_name()
            .map(|n| stage.join("lib/x86_64-linux-gnu").join(n))
            .filter(|s| s.exists())
            .unwrap_or(p);
        libs.insert(guest, src);
    }
    Ok(libs.into_iter().map(|(g, s)| (s, g)).collect())
}

/// A newc ("070701") cpio archive, as the kernel's initramfs unpacker reads it.
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
    dirs: std::collections::BTreeSet<String>,
}

impl Cpio {
    pub fn new() -> Self {
        Self {
            out: Vec::new(),
            ino: 1,
            dirs: Default::default(),
        }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let name = name.trim_start_matches('/');
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
        self.out.extend_from_slice(data);
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    pub fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return;
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.dirs.insert(path.to_string());
        self.entry(path, 0o040755, &[]);
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        let path = path.trim_start_matches('/');
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, 0o100000 | mode, data);
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
        self.out
    }
}

pub fn read(p: &Path) -> Result<Vec<u8>, XtaskError> {
    std::fs::read(p).map_err(|e| other(format!("{}: {e}", p.display())))
}

/// KVM only where it is hardware KVM (kvm_intel/kvm_amd, not the nested PVM variant, which
/// runs a stock kernel far slower than TCG, as we found on the build machines).
pub fn pick_accel() -> &'static str {
    let sys = |m: &str| Path::new("/sys/module").join(m).is_dir();
    let writable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if writable && (sys("kvm_intel") || sys("kvm_amd")) && !sys("kvm_pvm") {
        "kvm"
    } else {
        "tcg"
    }
}

/// One boot of a Debian guest: `qemu-system-x86_64` with a kernel, an initramfs and a kernel
/// command line, the serial console on stdout.
pub struct Vm<'a> {
    /// `qemu-system-x86_64`.
    pub qemu: &'a Path,
    /// The kernel image.
    pub vmlinuz: &'a Path,
    /// The initramfs (a [`Cpio`] archive).
    pub initrd: &'a Path,
    /// `kvm` or `tcg` ([`pick_accel`]).
    pub accel: &'a str,
    /// Guest CPUs.
    pub smp: u64,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// The kernel command line.
    pub append: String,
    /// Wall-clock limit: the VM is killed after it and the run fails.
    pub timeout: Duration,
    /// Where the whole serial log is written.
    pub log: &'a Path,
    /// Which guest lines are echoed (`  | line`) while it runs.
    pub show: fn(&str) -> bool,
}

/// Boots `vm` and returns every line of its serial console (a guest line that starts after
/// other output on the same console line begins at its `NPRDMA-` marker). Fails if QEMU fails
/// or the VM outlives its timeout.
pub fn run_vm(vm: &Vm<'_>) -> Result<Vec<String>, XtaskError> {
    let mut machine: Vec<String> = if vm.accel == "kvm" {
        vec!["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()]
    } else {
        vec![
            "-accel".into(),
            "tcg,thread=multi".into(),
            "-cpu".into(),
            "max".into(),
        ]
    };
    machine.extend(["-machine".into(), "q35".into()]);
    run_vm_on(vm, &machine)
}

/// [`run_vm`] on another machine: `machine` replaces the accelerator, CPU and machine
/// options (`vm.accel` is then only reported), e.g. `qemu-system-aarch64`'s `-M virt,...`.
pub fn run_vm_on(vm: &Vm<'_>, machine: &[String]) -> Result<Vec<String>, XtaskError> {
    let qemu_name = vm
        .qemu
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "qemu".into());
    let mut cmd = Command::new(vm.qemu);
    cmd.args(machine)
        .args(["-smp", &vm.smp.to_string()])
        .args(["-m", &vm.memory_mib.to_string()])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(["-monitor", "none", "-nic", "none"])
        .arg("-kernel")
        .arg(vm.vmlinuz)
        .arg("-initrd")
        .arg(vm.initrd)
        .arg("-append")
        .arg(&vm.append)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    println!(
        "xtask: accelerator {}; guest output (test lines only):",
        vm.accel
    );
    let mut child = cmd.spawn().map_err(|error| XtaskError::Spawn {
        what: qemu_name.clone(),
        error,
    })?;
    let stdout = child.stdout.take();
    let show = vm.show;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let booted = std::time::Instant::now();
    let reader = std::thread::spawn(move || {
        if let Some(out) = stdout {
            for line in crate::util::lossy_lines(out) {
                // The first guest line can follow the boot loader's screen-clearing escapes
                // on the same console line: the test protocol starts at its marker.
                let line = match line.find("NPRDMA-") {
                    Some(at) if at > 0 => line[at..].to_string(),
                    _ => line,
                };
                if show(&line) {
                    // Host seconds since QEMU started: where a guest's wall time goes.
                    println!("  | {:6.1} s {line}", booted.elapsed().as_secs_f64());
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    // QEMU's stderr is read all along: a full pipe would block it (and the run would end at
    // the timeout), and its message is what explains a failed start.
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = std::io::Read::read_to_string(e, &mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > vm.timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(error) => {
                return Err(XtaskError::Spawn {
                    what: format!("{qemu_name} (wait)"),
                    error,
                });
            }
        }
    };
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    let lines: Vec<String> = rx.try_iter().collect();
    if let Ok(mut f) = std::fs::File::create(vm.log) {
        for l in &lines {
            let _ = writeln!(f, "{l}");
        }
    }
    let said = |what: String| {
        let tail: Vec<&str> = qemu_stderr.lines().rev().take(5).collect();
        if tail.is_empty() {
            what
        } else {
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("{what}; qemu said: {}", tail.join(" / "))
        }
    };
    match status {
        None => Err(other(said(format!(
            "the VM did not finish within {} s",
            vm.timeout.as_secs()
        )))),
        Some(s) if !s.success() => Err(other(said(format!("qemu exited with {s}")))),
        Some(_) => Ok(lines),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut c = Cpio::new();
        c.file("a/b/c", 0o644, b"xyz");
        let out = c.finish();
        let text = String::from_utf8_lossy(&out);
        // Parents first, then the file, then the trailer.
        let a = text.find("a\0").unwrap();
        let ab = text.find("a/b\0").unwrap();
        let abc = text.find("a/b/c\0").unwrap();
        assert!(a < ab && ab < abc);
        assert!(text.contains("TRAILER!!!"));
        assert_eq!(&out[..6], b"070701");
        assert_eq!(out.len() % 512, 0);
        // The file's header: mode 100644, size 3.
        let h = &text[abc - 110..abc];
        assert_eq!(&h[14..22], "000081a4");
        assert_eq!(&h[54..62], "00000003");
    }

    /// A minimal ELF64 with a section-name table and a .modinfo section.
    fn tiny_module() -> Vec<u8> {
        module_with_depends("ib_core,crc32-generic")
    }

    /// A minimal ELF64 module whose .modinfo says `depends=<depends>`.
    fn module_with_depends(depends: &str) -> Vec<u8> {
        let strtab = b"\0.shstrtab\0.modinfo\0";
        let modinfo = format!("license=GPL\0depends={depends}\0");
        let modinfo = modinfo.as_bytes();
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        let str_off = elf.len();
        elf.extend_from_slice(strtab);
        let mi_off = elf.len();
        elf.extend_from_slice(modinfo);
        while !elf.len().is_multiple_of(8) {
            elf.push(0);
        }
        let shoff = elf.len();
        let mut sh = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend_from_slice(&h);
        };
        sh(0, 0, 0);
        sh(1, str_off, strtab.len());
        sh(11, mi_off, modinfo.len());
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf
    }

    #[test]
    fn modinfo_depends_are_read_from_the_elf_section() {
        assert_eq!(
            module_depends(&tiny_module()),
            Some(vec!["ib_core".to_string(), "crc32_generic".into()])
        );
        assert_eq!(module_depends(b"not an elf"), None);
    }

    #[test]
    fn modules_come_dependencies_first_and_a_missing_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("nprdma-xtask-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kernel/net")).unwrap();
        std::fs::write(
            dir.join("kernel/rdma_rxe.ko"),
            module_with_depends("ib-core,crc32_generic"),
        )
        .unwrap();
        std::fs::write(dir.join("kernel/net/ib_core.ko"), module_with_depends("")).unwrap();
        std::fs::write(
            dir.join("kernel/broken.ko"),
            module_with_depends("no_such_mod"),
        )
        .unwrap();
        std::fs::write(
            dir.join("modules.builtin"),
            "kernel/crypto/crc32_generic.ko\n",
        )
        .unwrap();
        let order = module_order(&dir, &["rdma_rxe", "crc32-generic"]).unwrap();
        assert_eq!(
            order,
            [
                PathBuf::from("kernel/net/ib_core.ko"),
                PathBuf::from("kernel/rdma_rxe.ko")
            ]
        );
        for wanted in ["rdma_rxee", "broken"] {
            let err = module_order(&dir, &[wanted]).unwrap_err().to_string();
            assert!(err.contains("neither in"), "{wanted}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compressed_modules_are_found_read_and_named_without_their_suffix() {
        let dir = std::env::temp_dir().join(format!("nprdma-xtask-modxz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kernel/sw")).unwrap();
        let core = dir.join("kernel/ib_core.ko");
        std::fs::write(&core, module_with_depends("")).unwrap();
        let rxe = dir.join("kernel/sw/rdma_rxe.ko");
        std::fs::write(&rxe, module_with_depends("ib_core")).unwrap();
        for f in [&core, &rxe] {
            let st = std::process::Command::new("xz").arg(f).status().unwrap();
            assert!(st.success());
        }
        let order = module_order(&dir, &["rdma-rxe"]).unwrap();
        assert_eq!(
            order,
            [
                PathBuf::from("kernel/ib_core.ko.xz"),
                PathBuf::from("kernel/sw/rdma_rxe.ko.xz")
            ]
        );
        assert_eq!(
            read_module(&dir.join(&order[1])).unwrap(),
            module_with_depends("ib_core")
        );
        assert_eq!(
            module_guest_path(&order[1]),
            PathBuf::from("kernel/sw/rdma_rxe.ko")
        );
        assert_eq!(
            module_guest_path(Path::new("kernel/dummy.ko")),
            PathBuf::from("kernel/dummy.ko")
        );
        // A file that only claims to be xz is an error, not a module.
        std::fs::write(dir.join("kernel/bad.ko.xz"), b"not xz").unwrap();
        assert!(module_order(&dir, &["bad"]).is_err());
        // Merged /usr: the module directories are under usr/lib/modules.
        std::fs::create_dir_all(dir.join("usr/lib/modules/7.3.4")).unwrap();
        assert_eq!(kernel_version(&dir).unwrap(), "7.3.4");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_suite_state_has_a_sources_list_of_its_own() {
        let root = PathBuf::from("/x/apt");
        let o = AptState::suite(root.clone(), "amd64", "trixie-backports").options();
        let has = |s: &str| o.iter().any(|x| x == s);
        assert!(has("Dir::Etc::SourceList=/x/apt/etc/sources.list"));
        assert!(has("Dir::Etc::SourceParts=/x/apt/etc/sources.list.d"));
        assert!(has("Dir::State::Lists=/x/apt/lists"));
        assert!(has("APT::Architecture=amd64"));
        assert_eq!(
            AptState::sources_line("trixie-backports"),
            format!(
                "deb [target=Packages signed-by={DEBIAN_KEYRING}] {DEBIAN_ARCHIVE} trixie-backports main\n"
            )
        );
        // The foreign-architecture state reads the machine's sources.
        let foreign = AptState::new(root, "arm64").options();
        assert!(!foreign.iter().any(|x| x.starts_with("Dir::Etc::")));
    }

    #[test]
    fn a_corrupt_module_is_none_never_a_panic() {
        let good = tiny_module();
        let mut shoff_max = good.clone();
        shoff_max[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(module_depends(&shoff_max), None);
        // Every 2-, 4- and 8-byte field anywhere set to all ones, and every byte flipped:
        // offsets and sizes that overflow, point outside the file or past a table.
        for width in [1, 2, 4, 8] {
            for at in 0..=good.len() - width {
                let mut elf = good.clone();
                if width == 1 {
                    elf[at] ^= 0xff;
                } else {
                    elf[at..at + width].fill(0xff);
                }
                let _ = module_depends(&elf);
            }
        }
        for len in 0..good.len() {
            let _ = module_depends(&good[..len]);
        }
    }

    #[test]
    fn the_library_is_taken_from_where_cargo_built_it() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"connectx"},"filenames":["/t/x/release/libnprdma.so","/t/x/release/libnprdma.rlib"],"executable":null}
not json
{"reason":"build-script-executed","filenames":["/t/x/release/build/libnprdma.so"]}
{"reason":"compiler-artifact","target":{"name":"nprdma-verbs-stress"},"filenames":["/t/x/release/nprdma-verbs-stress"],"executable":"/t/x/release/nprdma-verbs-stress"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            built_artifact(messages, "libnprdma.so"),
            Some(PathBuf::from("/t/x/release/libnprdma.so"))
        );
        assert_eq!(
            built_artifact(messages, "nprdma-verbs-stress"),
            Some(PathBuf::from("/t/x/release/nprdma-verbs-stress"))
        );
        assert_eq!(built_artifact(messages, "libnprdma.a"), None);
    }

    #[test]
    fn a_pinned_version_names_its_file_and_its_apt_argument() {
        let w = Wanted {
            name: "linux-kbuild-6.1".into(),
            version: Some("1:6.1.192-3".into()),
        };
        assert_eq!(w.file_prefix(), "linux-kbuild-6.1_1%3a6.1.192-3_");
        assert_eq!(w.apt_arg(), "linux-kbuild-6.1=1:6.1.192-3");
        let any = Wanted::any("busybox-static");
        assert_eq!(any.file_prefix(), "busybox-static_");
        assert_eq!(any.apt_arg(), "busybox-static");
    }
}
