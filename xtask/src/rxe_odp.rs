//! The ODP anchor of `cargo xtask rxe-test`: a second guest, booted on a newer Debian kernel
//! whose Soft-RoCE has on-demand paging (`rdma_rxe` supports `IBV_ACCESS_ON_DEMAND` from
//! Linux 6.14 on, `drivers/infiniband/sw/rxe/rxe_odp.c`), that measures in one boot, side by
//! side, plain pinned registration, ODP and the library (docs/connectx.md §11):
//!
//! - `nprdma-odp-anchor` once per mode: `ibv_reg_mr` of 1 GiB, of the largest size the guest
//!   can pin and (ODP and the library only) of twice the guest's memory; the first WRITE and
//!   the first READ of 64 MiB into untouched memory over a loopback RC QP, and a warm WRITE;
//!   every delivered byte verified; the peak of `VmPin` and the library's own peak count;
//! - `ib_write_lat` and `ib_write_bw` per mode (perftest's `--odp` for ODP).
//!
//! The kernel comes from Debian's `trixie-backports` ([`SUITE`]) through a private apt state
//! under `target/rxe-odp/apt` ([`AptState::suite`]), downloaded once with `apt-get download`
//! and cached in `target/rxe-odp/debs`; a later run that finds the package files named in
//! `target/rxe-odp/kernel.list` asks apt nothing. The user space is the main guest's
//! (Debian 12's rdma-core 44 and perftest 4.5, which work with these kernels). The guest has
//! 2 CPUs: with 4 on a 2-core host, rxe's latency on these kernels rose from tens of
//! microseconds to milliseconds.
//!
//! ODP on Soft-RoCE is software: a page fault there is a kernel function call in the same
//! machine, not a ConnectX's fault round trip through its firmware and the driver, so its
//! times anchor nothing about a ConnectX's fault cost. Whatever ODP does wrong is reported, and
//! fails nothing; the pinned and the library columns fail the run on any error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::guest::{self, AptState, Cpio, Vm, Wanted, other};
use crate::rxe::{add_libraries, add_modules, add_userspace};
use crate::util::{XtaskError, section, workspace_root};

/// The Debian suite the second kernel comes from. trixie-backports rather than unstable:
/// its package index is about 30 times smaller (a few hundred kB against about 10 MB to
/// download on the first run), and its kernel changes every few weeks rather than every few
/// days, so the cached one stays the archive's longer. Both carried 7.x kernels with ODP in
/// rxe when this was written (7.3.4 here, 7.2.13 in unstable).
pub const SUITE: &str = "trixie-backports";

/// Guest programs (paths inside the unpacked packages) and where they go.
const ODP_BINARIES: &[(&str, &str)] = &[
    ("bin/busybox", "bin/busybox"),
    ("bin/ip", "usr/sbin/ip"),
    ("usr/bin/rdma", "usr/bin/rdma"),
    ("usr/bin/ibv_devinfo", "usr/bin/ibv_devinfo"),
    ("usr/bin/ib_write_lat", "usr/bin/ib_write_lat"),
    ("usr/bin/ib_write_bw", "usr/bin/ib_write_bw"),
];

/// Kernel modules to load, their dependencies added from `.modinfo` (crc32 is built into
/// these kernels, and rxe calls it as a library function).
const ODP_MODULES: &[&str] = &["rdma_rxe", "ib_uverbs", "dummy"];

/// Guest CPUs (see the module comment).
const SMP: u64 = 2;

/// Guest memory, MiB.
const MEMORY_MIB: u64 = 2048;

/// Wall-clock limit of the boot.
const TIMEOUT: Duration = Duration::from_secs(240);

/// The guest's /init.
const ODP_INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
say() { echo "NPRDMA-RXE: $*"; }
up() { awk '{print $1}' /proc/uptime; }
KVER=$(uname -r)
for m in $(cat /etc/modules.order); do
  insmod /lib/modules/$KVER/$m 2>/tmp/e || grep -q 'File exists' /tmp/e || say "WARN insmod $m: $(cat /tmp/e)"
done
ip link set lo up
ip link add dummy0 type dummy
# A jumbo MTU lets rxe offer a path MTU of 4096 bytes (perftest takes the port's active MTU;
# the measuring program sets its own).
ip link set dummy0 mtu 9000
ip link set dummy0 up
ip addr add 192.0.2.1/24 dev dummy0
rdma link add rxe0 type rxe netdev dummy0 || say "FAIL setup rdma link add"
GIDX=
for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  case "$(cat $g 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) GIDX=${g##*/}; break;; esac
done
GIDX=${GIDX:-1}
LIB=/opt/nprdma/libnprdma.so
ANCHOR=/opt/nprdma/nprdma-odp-anchor
export NPRDMA_STATUS_DIR=/dev/shm/nprdma
say "INFO kernel $KVER gid-index $GIDX cpus $(nproc) booted at $(up) s"
# What the device says of on-demand paging (ibv_query_device_ex's odp_caps).
ibv_devinfo -v -d rxe0 | awk '/odp_caps/ {k = $1; next} k && /SUPPORT/ {c[k] = c[k] " " $1; next} {k = ""} END {for (x in c) print "NPRDMA-RXE: INFO " x c[x]}'
# The largest registration the guest can pin: what is available, less room for the rest.
MAXREG=$(awk '/MemAvailable/ {m = int($2 / 1024) - 384; print int(m / 64) * 64 "M"}' /proc/meminfo)
# Twice the guest's memory: only what pins nothing can register it.
OVER=$(awk '/MemTotal/ {print int($2 / 1024 / 512 + 1) * 2 * 512 "M"}' /proc/meminfo)
say "INFO largest pinnable registration $MAXREG, beyond memory $OVER"
# anchor MODE PRELOAD SIZES TOUCH MTU TAG: one run of the measuring program.
anchor() {
  t=$(up)
  env $2 $ANCHOR --mode $1 --gid-index $GIDX --reg-sizes "$3" --touch-size $4 --mtu $5 --tag $6 > /tmp/a.out 2>&1
  rc=$?
  grep '^NPRDMA-ANCHOR' /tmp/a.out
  grep -v '^NPRDMA-ANCHOR' /tmp/a.out | tail -n 8 | sed 's/^/  out| /'
  if [ $rc = 0 ]; then say "PASS anchor_$6"; else say "FAIL anchor_$6 exit=$rc"; fi
  echo "NPRDMA-TIME: anchor_$6 $(awk -v t=$t '{print $1 - t}' /proc/uptime)"
}
# Path MTU 1024, the port's default on a 1500-byte netdev (perftest's and the main guest's).
anchor pinned "" 1G,$MAXREG 64M 1024 pinned
anchor odp "" 1G,$MAXREG,$OVER 64M 1024 odp
anchor lib "LD_PRELOAD=$LIB" 1G,$MAXREG,$OVER 64M 1024 lib
# The library with NPRDMA_MODE=odp: its self-test must still catch rxe's ODP (item 5 of
# issue 27), so it falls back to windows and the data stays exact (small: 4 MiB).
anchor lib "LD_PRELOAD=$LIB NPRDMA_MODE=odp" "" 4M 1024 lib_forced
# ODP once more with packets of a whole page each (path MTU 4096, page-aligned buffers).
anchor odp "" "" 4M 4096 odp_mtu4096
wait_listen() {
  i=0
  while [ $i -lt 250 ]; do
    awk '$2 ~ /:4853$/ && $4 == "0A" {f = 1} END {exit !f}' /proc/net/tcp && return 0
    sleep 0.02; i=$((i + 1))
  done
}
# perf NAME PRELOAD CMD...: perftest server and client, each with PRELOAD in its environment.
perf() {
  name=$1; pre=$2; shift 2
  t=$(up)
  env $pre timeout 60 "$@" > /tmp/srv.out 2>&1 &
  spid=$!
  wait_listen
  env $pre timeout 60 "$@" 127.0.0.1 > /tmp/cli.out 2>&1
  crc=$?
  wait $spid; src=$?
  if [ $src = 0 ] && [ $crc = 0 ]; then say "PASS $name"; else
    say "FAIL $name server=$src client=$crc"
    sed 's/^/  srv| /' /tmp/srv.out | tail -n 12
    sed 's/^/  cli| /' /tmp/cli.out | tail -n 12
  fi
  echo "NPRDMA-TIME: $name $(awk -v t=$t '{print $1 - t}' /proc/uptime)"
}
RESULT_ROW='NF >= 5 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/'
lat() { awk "/t_typical/ {h = 1; next} h && $RESULT_ROW {print \$5; exit}" /tmp/cli.out; }
bw() { awk "/BW average/ {h = 1; next} h && $RESULT_ROW {print \$4; exit}" /tmp/cli.out; }
for k in pinned odp lib; do
  case $k in odp) F=--odp; P= ;; lib) F=; P=LD_PRELOAD=$LIB ;; *) F=; P= ;; esac
  perf anchor_write_lat_$k "$P" ib_write_lat -d rxe0 -x $GIDX -n 300 -F -C $F
  echo "NPRDMA-METRIC: anchor_write_lat_$k $(lat)"
  perf anchor_write_bw_$k "$P" ib_write_bw -d rxe0 -x $GIDX -n 300 -F --report_gbits $F
  echo "NPRDMA-METRIC: anchor_write_bw_$k $(bw)"
done
say "INFO done at $(up) s"
say DONE
sync
poweroff -f
"#;

fn cache_dir() -> PathBuf {
    workspace_root().join("target").join("rxe-odp")
}

/// A `Depends:` entry of `apt-cache show`: the package and the version it pins (`(= v)`),
/// the first of each group of alternatives.
fn depends(show: &str) -> Vec<(String, Option<String>)> {
    let Some(line) = show.lines().find_map(|l| l.strip_prefix("Depends: ")) else {
        return Vec::new();
    };
    line.split(',')
        .filter_map(|group| {
            let first = group.split('|').next()?.trim();
            let (name, rest) = first.split_once(' ').unwrap_or((first, ""));
            let version = rest
                .trim()
                .strip_prefix("(=")
                .and_then(|v| v.strip_suffix(')'))
                .map(|v| v.trim().to_string());
            (!name.is_empty()).then(|| (name.to_string(), version))
        })
        .collect()
}

/// The kernel's packages from the `apt-cache show` of `linux-image-amd64` (`meta`) and of
/// the image package it names (`image`, asked for by the caller with the name this returns
/// first): the image itself and, where it is only a meta package (Debian 13's backports and
/// later: the kernel in `linux-binary-*`, its modules in `linux-modules-*`, the module lists
/// in `linux-base-*`), the packages of the same ABI and version it depends on.
fn kernel_set(meta: &str, image: Option<&str>) -> Option<(String, Vec<Wanted>)> {
    let (name, version) = depends(meta)
        .into_iter()
        .find(|(n, v)| n.starts_with("linux-image-") && n.ends_with("-amd64") && v.is_some())?;
    let abi = name.strip_prefix("linux-image-")?.to_string();
    let mut wanted = vec![Wanted {
        name: name.clone(),
        version: version.clone(),
    }];
    for (dep, v) in image.map(depends).unwrap_or_default() {
        let part = ["linux-binary-", "linux-modules-", "linux-base-"]
            .iter()
            .any(|p| dep.strip_prefix(p) == Some(abi.as_str()));
        if part && v == version {
            wanted.push(Wanted {
                name: dep,
                version: v,
            });
        }
    }
    Some((name, wanted))
}

/// The kernel's package files: those of an earlier run if all are still in `debs/`, else
/// downloaded from [`SUITE`] (one `apt-get update` of the private state the first time).
fn fetch_kernel(cache: &Path) -> Result<Vec<PathBuf>, XtaskError> {
    let debs_dir = cache.join("debs");
    let stamp = cache.join("kernel.list");
    if let Ok(list) = std::fs::read_to_string(&stamp) {
        let files: Vec<PathBuf> = list.lines().map(|l| debs_dir.join(l)).collect();
        if !files.is_empty() && files.iter().all(|f| f.is_file()) {
            return Ok(files);
        }
    }
    let apt = AptState::suite(cache.join("apt"), "amd64", SUITE);
    let resolve = || -> Result<Option<Vec<Wanted>>, XtaskError> {
        let meta = apt.cache_query(&["show", "--no-all-versions", "linux-image-amd64"])?;
        let Some((image, _)) = kernel_set(&meta, None) else {
            return Ok(None);
        };
        let shown = apt.cache_query(&["show", "--no-all-versions", &image])?;
        Ok(kernel_set(&meta, Some(&shown)).map(|(_, w)| w))
    };
    apt.update(false)?;
    let wanted = match resolve()? {
        Some(w) => w,
        None => {
            apt.update(true)?;
            resolve()?.ok_or_else(|| {
                other(format!(
                    "{SUITE} has no linux-image-amd64 with a versioned kernel image"
                ))
            })?
        }
    };
    let files = guest::fetch_packages_from(&debs_dir, &wanted, Some(&apt))?;
    let names: String = files
        .iter()
        .filter_map(|f| f.file_name())
        .map(|n| n.to_string_lossy() + "\n")
        .collect();
    std::fs::write(&stamp, names).map_err(|e| other(format!("{}: {e}", stamp.display())))?;
    Ok(files)
}

/// The kernel image of the kernel unpacked in `kdir`: `vmlinuz` in its module directory
/// (Debian 13 and later) or `boot/vmlinuz-<kver>`.
fn vmlinuz(kdir: &Path, kver: &str) -> Result<PathBuf, XtaskError> {
    [
        guest::modules_root(kdir).join(kver).join("vmlinuz"),
        kdir.join("boot").join(format!("vmlinuz-{kver}")),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or_else(|| other(format!("no vmlinuz for {kver} in {}", kdir.display())))
}

/// What the ODP boot needs from the main test.
pub struct Inputs<'a> {
    /// `qemu-system-x86_64`.
    pub qemu: &'a Path,
    /// The main guest's unpacked user space (Debian 12 packages).
    pub stage: &'a Path,
    /// The library.
    pub lib: &'a Path,
    /// The measuring program.
    pub anchor: &'a Path,
    /// `kvm` or `tcg`.
    pub accel: &'a str,
}

/// Fetches (once) and boots the second kernel, prints the table; fails on a pinned or a
/// library column's error, never on ODP's.
pub fn run(inputs: &Inputs<'_>) -> Result<(), XtaskError> {
    let started = Instant::now();
    section(&format!(
        "rxe: ODP anchor, Debian's {SUITE} kernel (cached in target/rxe-odp)"
    ));
    let cache = cache_dir();
    let debs = fetch_kernel(&cache)?;
    guest::unpack(&cache, &debs, &|_| "kernel")?;
    let kdir = cache.join("kernel");
    let kver = guest::kernel_version(&kdir)?;
    let image = vmlinuz(&kdir, &kver)?;
    let initrd = cache.join("initramfs.cpio");
    let mut cpio = Cpio::new();
    let mut elfs = add_userspace(&mut cpio, inputs.stage, &[ODP_BINARIES])?;
    cpio.file("opt/nprdma/libnprdma.so", 0o755, &guest::read(inputs.lib)?);
    cpio.file(
        "opt/nprdma/nprdma-odp-anchor",
        0o755,
        &guest::read(inputs.anchor)?,
    );
    elfs.extend([inputs.lib.to_path_buf(), inputs.anchor.to_path_buf()]);
    add_libraries(&mut cpio, inputs.stage, &elfs)?;
    add_modules(&mut cpio, &kdir, &kver, ODP_MODULES)?;
    cpio.file("init", 0o755, ODP_INIT.as_bytes());
    std::fs::write(&initrd, cpio.finish())
        .map_err(|e| other(format!("{}: {e}", initrd.display())))?;
    println!(
        "xtask: ODP guest kernel {kver}, prepared in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let log = cache.join("last-run.log");
    let booted = Instant::now();
    let lines = guest::run_vm(&Vm {
        qemu: inputs.qemu,
        vmlinuz: &image,
        initrd: &initrd,
        accel: inputs.accel,
        smp: SMP,
        memory_mib: MEMORY_MIB,
        append: "console=ttyS0 panic=-1 loglevel=3".into(),
        timeout: TIMEOUT,
        log: &log,
        show: |line| {
            line.starts_with("NPRDMA-") || line.starts_with("  ") || line.contains("Kernel panic")
        },
    })?;
    let boot_secs = booted.elapsed().as_secs_f64();
    let verdict = evaluate(&lines, &kver);
    println!(
        "xtask: ODP anchor: boot and measurements {boot_secs:.1} s, step {:.1} s in all (full serial log: {})",
        started.elapsed().as_secs_f64(),
        log.display()
    );
    verdict
}

/// One `NPRDMA-ANCHOR:` line: its `key=value` fields (a quoted value keeps its spaces).
fn fields(line: &str) -> Option<BTreeMap<String, String>> {
    let rest = line.strip_prefix("NPRDMA-ANCHOR: ")?;
    let mut out = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ').is_some() {}
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ' ')).collect();
        if key.is_empty() {
            break;
        }
        if chars.next_if_eq(&'=').is_none() {
            out.insert(key, String::new());
            continue;
        }
        let value: String = if chars.next_if_eq(&'"').is_some() {
            let mut v = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => v.extend(chars.next()),
                    c => v.push(c),
                }
            }
            v
        } else {
            std::iter::from_fn(|| chars.next_if(|c| *c != ' ')).collect()
        };
        out.insert(key, value);
    }
    Some(out)
}

/// The modes, as the guest names them, and as the table heads them.
const MODES: [(&str, &str); 3] = [("pinned", "pinned"), ("odp", "ODP"), ("lib", "library")];

/// What the guest measured, by mode.
#[derive(Default)]
struct Measured {
    /// `(mode, what)` → the fields of its line; registrations are `reg:<bytes>`.
    records: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// perftest's values, by metric name.
    metrics: BTreeMap<String, f64>,
    /// `(name, detail)` of each failed guest step.
    failed: Vec<(String, String)>,
    passed: usize,
    done: bool,
}

fn measured(lines: &[String]) -> Measured {
    let mut m = Measured::default();
    for l in lines {
        if let Some(f) = fields(l) {
            match (f.get("mode"), f.get("what")) {
                (Some(mode), Some(what)) => {
                    let what = match (what.as_str(), f.get("bytes")) {
                        ("reg", Some(b)) => format!("reg:{b}"),
                        _ => what.clone(),
                    };
                    m.records.insert((mode.clone(), what), f);
                }
                _ => m
                    .failed
                    .push(("anchor".into(), f.get("error").cloned().unwrap_or_default())),
            }
        } else if let Some(rest) = l.strip_prefix("NPRDMA-METRIC: ") {
            let mut it = rest.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<f64>().ok()))
                && v.is_finite()
                && v > 0.0
            {
                m.metrics.insert(k.to_string(), v);
            }
        } else if let Some(rest) = l.strip_prefix("NPRDMA-RXE: ") {
            if rest.starts_with("PASS ") {
                m.passed += 1;
            } else if let Some(what) = rest.strip_prefix("FAIL ") {
                let (name, detail) = what.split_once(' ').unwrap_or((what, ""));
                m.failed.push((name.to_string(), detail.to_string()));
            } else if rest.trim() == "DONE" {
                m.done = true;
            }
        }
    }
    m
}

impl Measured {
    fn get(&self, mode: &str, what: &str, key: &str) -> Option<f64> {
        self.records
            .get(&(mode.to_string(), what.to_string()))?
            .get(key)?
            .parse()
            .ok()
    }

    /// The registration sizes measured, smallest first.
    fn reg_sizes(&self) -> Vec<u64> {
        let mut sizes: Vec<u64> = self
            .records
            .keys()
            .filter_map(|(_, w)| w.strip_prefix("reg:")?.parse().ok())
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// The registrations `mode` was refused, with the provider's error.
    fn refused(&self, mode: &str) -> Vec<String> {
        self.records
            .iter()
            .filter(|((m, w), _)| m == mode && w.starts_with("reg"))
            .filter_map(|((_, w), f)| {
                let bytes: u64 = w.strip_prefix("reg:")?.parse().ok()?;
                Some(format!(
                    "{} MiB refused after {} s: {}",
                    bytes >> 20,
                    f.get("secs").map(String::as_str).unwrap_or("?"),
                    f.get("error")?
                ))
            })
            .collect()
    }

    /// The highest `VmPin` seen while `mode`'s transfers ran.
    fn transfer_vmpin(&self, mode: &str) -> Option<f64> {
        TRANSFERS
            .iter()
            .map(|(w, _)| *w)
            .chain(["reg_buffers"])
            .filter_map(|w| self.get(mode, w, "vmpin"))
            .reduce(f64::max)
    }

    /// What went wrong with the transfers of `mode`: each one's error or wrong bytes.
    fn data_errors(&self, mode: &str) -> Vec<String> {
        let mut out = Vec::new();
        for what in TRANSFERS.map(|(w, _)| w) {
            let Some(f) = self.records.get(&(mode.to_string(), what.to_string())) else {
                out.push(format!("{what}: not measured"));
                continue;
            };
            let wrong = f.get("wrong_bytes").map(String::as_str).unwrap_or("?");
            if let Some(e) = f.get("error") {
                out.push(format!("{what}: {e} ({wrong} wrong bytes)"));
            } else if wrong != "0" {
                out.push(format!(
                    "{what}: {wrong} of {} bytes wrong, the first at offset {}",
                    f.get("bytes").map(String::as_str).unwrap_or("?"),
                    f.get("first_wrong").map(String::as_str).unwrap_or("?")
                ));
            }
        }
        out
    }
}

/// The tag of the second ODP run, with whole-page packets.
const MTU4096: &str = "odp_mtu4096";

/// The timed transfers, as the program names them and as the table says them.
const TRANSFERS: [(&str, &str); 3] = [
    (
        "write_first",
        "first WRITE, 64 MiB into untouched memory (s)",
    ),
    ("read_first", "first READ, 64 MiB into untouched memory (s)"),
    ("write_warm", "the WRITE again, into the same pages (s)"),
];

/// A table cell: the value, or `-`.
fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// `b / a` as a ratio cell.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.3}x", b / a),
        _ => "-".into(),
    }
}

/// One table row: the three modes' values and the ratios ODP/pinned, library/pinned and
/// library/ODP.
fn row(label: &str, v: [Option<f64>; 3], decimals: usize) -> String {
    format!(
        "  {label:<50} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        cell(v[0], decimals),
        cell(v[1], decimals),
        cell(v[2], decimals),
        ratio(v[0], v[1]),
        ratio(v[0], v[2]),
        ratio(v[1], v[2]),
    )
}

/// Prints the table; passes iff the guest finished and the pinned and library columns had no
/// error (ODP's errors are reported, not failed on).
fn evaluate(lines: &[String], kver: &str) -> Result<(), XtaskError> {
    let m = measured(lines);
    println!(
        "\nxtask: ODP anchor on Soft-RoCE, kernel {kver}, one boot (TCG timing is noisy; one run each)."
    );
    println!(
        "  ODP on Soft-RoCE is software: rxe resolves a fault with a kernel function call in the same machine. \
         Its fault cost is not a ConnectX's (where a fault stops the NIC's pipeline and goes through its firmware and the driver)."
    );
    println!(
        "  {:<50} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "", "pinned", "ODP", "library", "ODP/pinned", "lib/pinned", "lib/ODP"
    );
    let per_mode = |f: &dyn Fn(&str) -> Option<f64>| MODES.map(|(k, _)| f(k));
    for size in m.reg_sizes() {
        let label = format!("ibv_reg_mr of {} MiB untouched (s)", size >> 20);
        println!(
            "{}",
            row(
                &label,
                per_mode(&|k| m.get(k, &format!("reg:{size}"), "secs")),
                4
            )
        );
    }
    println!(
        "{}",
        row(
            "ibv_reg_mr of the three 64 MiB buffers (s)",
            per_mode(&|k| m.get(k, "reg_buffers", "secs")),
            4
        )
    );
    for (what, label) in TRANSFERS {
        println!("{}", row(label, per_mode(&|k| m.get(k, what, "secs")), 3));
    }
    println!(
        "{}",
        row(
            "ib_write_lat t_typical (cycles, 2 B)",
            per_mode(&|k| m.metrics.get(&format!("anchor_write_lat_{k}")).copied()),
            0
        )
    );
    println!(
        "{}",
        row(
            "ib_write_bw average (Gb/s, 64 KiB)",
            per_mode(&|k| m.metrics.get(&format!("anchor_write_bw_{k}")).copied()),
            3
        )
    );
    let mib = |v: Option<f64>| v.map(|b| b / f64::from(1 << 20));
    println!(
        "{}",
        row(
            "VmPin while the 64 MiB buffers moved (MiB)",
            per_mode(&|k| mib(m.transfer_vmpin(k))),
            1
        )
    );
    println!(
        "{}",
        row(
            "peak VmPin of the whole run (MiB)",
            per_mode(&|k| mib(m.get(k, "pinned_peak", "vmpin"))),
            1
        )
    );
    if let Some(l) = m.get("lib", "pinned_peak", "library") {
        println!(
            "  the library's own peak count of pinned bytes: {:.1} MiB",
            l / f64::from(1 << 20)
        );
    }
    println!("  (times: a ratio below 1 is faster; bandwidth: above 1 is faster)");
    let mut failed = Vec::new();
    for (mode, name) in MODES {
        let refused = m.refused(mode);
        if !refused.is_empty() {
            println!("  registrations, {name}: {}", refused.join("; "));
            // The library registers what plain verbs would; pinned and ODP registrations
            // are refused by the provider's own limits, which is what is measured.
            if mode == "lib" {
                failed.extend(refused.into_iter().map(|e| format!("{name}: {e}")));
            }
        }
        let errors = m.data_errors(mode);
        if errors.is_empty() {
            println!("  data, {name}: every byte of every transfer as sent");
        } else {
            println!("  data, {name}: {}", errors.join("; "));
            if mode != "odp" {
                failed.extend(errors.into_iter().map(|e| format!("{name}: {e}")));
            }
        }
    }
    let page_sized = m.data_errors(MTU4096);
    if m.records.keys().any(|(k, _)| k == MTU4096) {
        println!(
            "  data, ODP again with path MTU 4096 (each packet one whole page of a page-aligned buffer, 4 MiB): {}",
            if page_sized.is_empty() {
                "every byte of every transfer as sent".to_string()
            } else {
                page_sized.join("; ")
            }
        );
    }
    failed.extend(odp_mode_verdicts(&m));
    for (step, detail) in &m.failed {
        if step.contains("odp") {
            println!("  ODP step {step} failed ({detail}): reported, not a failure of the test");
        } else {
            failed.push(format!("{step} {detail}"));
        }
    }
    if !m.done {
        failed.push("the ODP guest did not reach the end of its list".into());
    }
    if failed.is_empty() {
        println!(
            "xtask: ODP anchor: {} guest steps passed (ODP's own errors, if any, are above)",
            m.passed
        );
        Ok(())
    } else {
        Err(XtaskError::Checks(failed))
    }
}

/// The library's runs with `NPRDMA_MODE=odp`: its tag.
const LIB_FORCED: &str = "lib_forced";

/// The library's ODP mode in its two runs (`auto`, the default, in the library column;
/// `odp` in [`LIB_FORCED`]): prints what doctor said of the device and the MRs, and returns
/// the failures: data errors of the forced run, or ODP chosen on a device whose ODP column
/// delivered wrong bytes (the self-test missed what the anchor found).
fn odp_mode_verdicts(m: &Measured) -> Vec<String> {
    let mut failed = Vec::new();
    let odp_wrong = !m.data_errors("odp").is_empty();
    for tag in ["lib", LIB_FORCED] {
        let rec = |what: &str| m.records.get(&(tag.to_string(), what.to_string()));
        let field = |f: &BTreeMap<String, String>, k: &str| f.get(k).cloned().unwrap_or_default();
        match rec("doctor_device") {
            Some(d) => {
                println!(
                    "  doctor, library with NPRDMA_MODE={}: device {}: {} (self-test {}): {}",
                    field(d, "reg_mode"),
                    field(d, "name"),
                    field(d, "choice"),
                    field(d, "selftest").replace('_', " "),
                    field(d, "reason")
                );
                if field(d, "choice") == "odp" && odp_wrong {
                    failed.push(format!(
                        "{tag}: the library chose ODP on a device whose ODP delivered wrong bytes"
                    ));
                }
            }
            None if m.records.keys().any(|(k, _)| k == tag) => {
                failed.push(format!("{tag}: doctor recorded no device"));
            }
            None => {}
        }
        if let Some(r) = rec("doctor_mrs") {
            println!(
                "    MRs while the buffers were registered: {} odp, {} windows, {} pinned-fallback, {} pass-through",
                field(r, "odp"),
                field(r, "windows"),
                field(r, "pinned_fallback"),
                field(r, "pass_through")
            );
        }
    }
    let forced = m.data_errors(LIB_FORCED);
    if m.records.keys().any(|(k, _)| k == LIB_FORCED) {
        if forced.is_empty() {
            println!(
                "  data, library with NPRDMA_MODE=odp (4 MiB): every byte of every transfer as sent"
            );
        } else {
            failed.extend(forced.into_iter().map(|e| format!("{LIB_FORCED}: {e}")));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_set_is_the_image_and_its_parts_of_the_same_version() {
        let meta = "Package: linux-image-amd64\nVersion: 7.3.4-1~bpo13+1\nDepends: linux-base-amd64 (= 7.3.4-1~bpo13+1), linux-image-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-amd64 (= 7.3.4-1~bpo13+1)\n";
        let image = "Package: linux-image-7.3.4+deb13-amd64\nDepends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-binary-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-7.3.4+deb13-amd64-extra (= 7.3.4-1~bpo13+1), linux-binary-7.3.3+deb13-amd64 (= 7.3.3-1)\n";
        let (name, wanted) = kernel_set(meta, Some(image)).unwrap();
        assert_eq!(name, "linux-image-7.3.4+deb13-amd64");
        let got: Vec<String> = wanted
            .iter()
            .map(|w| format!("{}={}", w.name, w.version.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(
            got,
            [
                "linux-image-7.3.4+deb13-amd64=7.3.4-1~bpo13+1",
                "linux-base-7.3.4+deb13-amd64=7.3.4-1~bpo13+1",
                "linux-binary-7.3.4+deb13-amd64=7.3.4-1~bpo13+1",
                "linux-modules-7.3.4+deb13-amd64=7.3.4-1~bpo13+1",
            ]
        );
        // A kernel image that is no meta package is the whole set.
        let old = "Depends: linux-image-6.1.0-57-amd64 (= 6.1.192-3)\n";
        let (_, wanted) = kernel_set(old, Some("Depends: kmod, linux-base (>= 4.3~)\n")).unwrap();
        assert_eq!(wanted.len(), 1);
        // No versioned image: nothing.
        assert!(kernel_set("Depends: linux-image-7.3.4+deb13-amd64\n", None).is_none());
        assert!(kernel_set("", None).is_none());
    }

    #[test]
    fn anchor_lines_are_read_with_quoted_values() {
        let f = fields(
            r#"NPRDMA-ANCHOR: mode=odp what=write_first bytes=67108864 error="completion status 10" wrong_bytes=50331648 first_wrong=1024"#,
        )
        .unwrap();
        assert_eq!(f["mode"], "odp");
        assert_eq!(f["error"], "completion status 10");
        assert_eq!(f["first_wrong"], "1024");
        assert!(fields("NPRDMA-RXE: PASS x").is_none());
        let e = fields(r#"NPRDMA-ANCHOR: error="no device \"rxe0\"""#).unwrap();
        assert_eq!(e["error"], r#"no device "rxe0""#);
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(|l| l.trim().to_string()).collect()
    }

    const GOOD: &str = r#"NPRDMA-ANCHOR: mode=pinned what=reg bytes=1073741824 secs=1.96 vmpin=1073741824
        NPRDMA-ANCHOR: mode=odp what=reg bytes=1073741824 secs=0.01 vmpin=0
        NPRDMA-ANCHOR: mode=lib what=reg bytes=1073741824 secs=0.002 vmpin=0
        NPRDMA-ANCHOR: mode=pinned what=write_first bytes=67108864 secs=2.0 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=pinned what=read_first bytes=67108864 secs=2.0 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=pinned what=write_warm bytes=67108864 secs=2.0 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=lib what=write_first bytes=67108864 secs=2.5 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=lib what=read_first bytes=67108864 secs=2.5 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=lib what=write_warm bytes=67108864 secs=2.1 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=lib what=doctor_device reg_mode=auto name=rxe0 choice=windows selftest=failed odp_general=0x1 odp_rc=0x3f reason="ODP self-test FAILED: WRITE into untouched ODP pages: 2 of 9 bytes wrong"
        NPRDMA-ANCHOR: mode=lib what=doctor_mrs reg_mode=auto odp=0 windows=3 pinned_fallback=0 pass_through=0 unlisted=0
        NPRDMA-ANCHOR: mode=lib_forced what=doctor_device reg_mode=odp name=rxe0 choice=windows selftest=failed odp_general=0x1 odp_rc=0x3f reason="NPRDMA_MODE=odp: ODP self-test FAILED"
        NPRDMA-ANCHOR: mode=lib_forced what=write_first bytes=4194304 secs=0.5 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=lib_forced what=read_first bytes=4194304 secs=0.5 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=lib_forced what=write_warm bytes=4194304 secs=0.5 wrong_bytes=0 first_wrong=none vmpin=1
        NPRDMA-ANCHOR: mode=odp what=write_first bytes=67108864 secs=3.0 wrong_bytes=50331648 first_wrong=1024 vmpin=0
        NPRDMA-ANCHOR: mode=odp what=read_first bytes=67108864 secs=3.0 wrong_bytes=0 first_wrong=none vmpin=0
        NPRDMA-ANCHOR: mode=odp what=write_warm bytes=67108864 error="completion status 10" wrong_bytes=7 first_wrong=0 vmpin=0
        NPRDMA-RXE: FAIL anchor_odp exit=2
        NPRDMA-RXE: PASS anchor_pinned
        NPRDMA-METRIC: anchor_write_lat_pinned 24000
        NPRDMA-METRIC: anchor_write_lat_odp inf
        NPRDMA-RXE: DONE"#;

    #[test]
    fn odp_errors_are_reported_and_fail_nothing() {
        let m = measured(&lines(GOOD));
        assert_eq!(m.get("pinned", "reg:1073741824", "secs"), Some(1.96));
        assert_eq!(m.reg_sizes(), [1 << 30]);
        assert!(m.data_errors("pinned").is_empty());
        let odp = m.data_errors("odp");
        assert_eq!(odp.len(), 2, "{odp:?}");
        assert!(odp[0].contains("50331648 of 67108864 bytes wrong, the first at offset 1024"));
        assert!(odp[1].contains("completion status 10"));
        assert_eq!(m.metrics.get("anchor_write_lat_pinned"), Some(&24000.0));
        assert!(!m.metrics.contains_key("anchor_write_lat_odp"));
        assert!(evaluate(&lines(GOOD), "7.3.4").is_ok());
    }

    #[test]
    fn a_pinned_or_library_error_or_an_unfinished_guest_fails() {
        let bad_lib = GOOD.replace(
            "mode=lib what=read_first bytes=67108864 secs=2.5 wrong_bytes=0",
            "mode=lib what=read_first bytes=67108864 secs=2.5 wrong_bytes=3",
        );
        assert!(evaluate(&lines(&bad_lib), "7.3.4").is_err());
        let missing = GOOD.replace("mode=pinned what=write_warm", "mode=pinned what=other");
        assert!(evaluate(&lines(&missing), "7.3.4").is_err());
        let failed = format!("{GOOD}\nNPRDMA-RXE: FAIL anchor_write_bw_lib server=1 client=0");
        assert!(evaluate(&lines(&failed), "7.3.4").is_err());
        let unfinished = GOOD.replace("NPRDMA-RXE: DONE", "");
        assert!(evaluate(&lines(&unfinished), "7.3.4").is_err());
        // The ODP mode: choosing ODP where the ODP column delivered wrong bytes, a forced
        // run's data error, or a library run without doctor's device record fails.
        let chose_odp = GOOD.replace(
            "mode=lib what=doctor_device reg_mode=auto name=rxe0 choice=windows",
            "mode=lib what=doctor_device reg_mode=auto name=rxe0 choice=odp",
        );
        assert!(evaluate(&lines(&chose_odp), "7.3.4").is_err());
        let forced_wrong = GOOD.replace(
            "mode=lib_forced what=read_first bytes=4194304 secs=0.5 wrong_bytes=0",
            "mode=lib_forced what=read_first bytes=4194304 secs=0.5 wrong_bytes=8",
        );
        assert!(evaluate(&lines(&forced_wrong), "7.3.4").is_err());
        let no_doctor = GOOD.replace("what=doctor_device reg_mode=auto", "what=other");
        assert!(evaluate(&lines(&no_doctor), "7.3.4").is_err());
        assert_eq!(ratio(Some(2.0), Some(1.0)), "0.500x");
        assert_eq!(ratio(None, Some(1.0)), "-");
    }
}
