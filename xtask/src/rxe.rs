//! `cargo xtask rxe-test`: the server path on a real verbs stack.
//!
//! Boots Debian's amd64 kernel in `qemu-system-x86_64` with an initramfs built from Debian
//! packages (fetched once with `apt-get download` and cached in `target/rxe/`), loads Soft-RoCE
//! (`rdma_rxe`) on a dummy netdev, and runs, on one rxe device, unmodified perftest and
//! rdma-core tools with `LD_PRELOAD=libnprdma.so`, our stress program
//! (`nprdma-verbs-stress`), and a with/without comparison of `ib_write_lat` and `ib_write_bw`.
//! The recipe follows an earlier prototype of ours (what worked there: module order,
//! crc32 before rdma_rxe, the IPv4-mapped GID index, one device for both ends, TCG because
//! the build machines' /dev/kvm is the nested PVM variant).
//!
//! Our binaries are built on the host (Debian 12, glibc 2.36) and run in the guest (Debian 12
//! packages, the same glibc), so they need no rebuild. The guest has no NIC (`-nic none`): all
//! traffic stays inside it.
//!
//! The guest prints `NPRDMA-RXE: PASS|FAIL <name> ...` per test and `NPRDMA-METRIC <name>
//! <value>` per measurement; the host turns them into the exit status and the ratio report.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{XtaskError, require_tool, run_status, section, workspace_root};

/// Debian packages unpacked into the guest (besides the kernel).
const GUEST_PACKAGES: &[&str] = &[
    "busybox-static",
    "libibverbs1",
    "ibverbs-providers",
    "ibverbs-utils",
    "librdmacm1",
    "libibumad3",
    "perftest",
    "iproute2",
    "libc6",
    "libgcc-s1",
    "libnl-3-200",
    "libnl-route-3-200",
    "libpci3",
    "libudev1",
    "zlib1g",
    "libmnl0",
    "libbsd0",
    "libmd0",
    "libcap2",
    "libelf1",
    "libbpf1",
];

/// Guest programs (paths inside the unpacked packages) and where they go.
const GUEST_BINARIES: &[(&str, &str)] = &[
    ("bin/busybox", "bin/busybox"),
    ("bin/ip", "usr/sbin/ip"),
    ("usr/bin/rdma", "usr/bin/rdma"),
    ("usr/bin/ibv_devices", "usr/bin/ibv_devices"),
    ("usr/bin/ibv_rc_pingpong", "usr/bin/ibv_rc_pingpong"),
    ("usr/bin/ibv_srq_pingpong", "usr/bin/ibv_srq_pingpong"),
    ("usr/bin/ib_write_lat", "usr/bin/ib_write_lat"),
    ("usr/bin/ib_write_bw", "usr/bin/ib_write_bw"),
    ("usr/bin/ib_read_lat", "usr/bin/ib_read_lat"),
    ("usr/bin/ib_send_lat", "usr/bin/ib_send_lat"),
];

/// Kernel modules to load (their dependencies are added from `.modinfo`). rdma_rxe needs the
/// "crc32" shash, which the guest cannot autoload (no modprobe), so crc32 comes first.
const GUEST_MODULES: &[&str] = &[
    "crc32_generic",
    "crc32-pclmul",
    "rdma_rxe",
    "ib_uverbs",
    "rdma_ucm",
    "dummy",
];

/// Wall-clock limit for the whole VM run.
const VM_TIMEOUT: Duration = Duration::from_secs(420);

/// The guest's /init.
const GUEST_INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
say() { echo "NPRDMA-RXE: $*"; }
# metric NAME VALUE; an empty VALUE (the client's output was not what lat/bw expect) is said.
metric() {
  [ -n "$2" ] || say "WARN $1: no value found in the client's output"
  echo "NPRDMA-METRIC: $*"
}
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
KVER=$(uname -r)
for m in $(cat /etc/modules.order); do
  insmod /lib/modules/$KVER/$m 2>/tmp/e || grep -q 'File exists' /tmp/e || say "WARN insmod $m: $(cat /tmp/e)"
done
IP=/usr/sbin/ip
$IP link set lo up
[ -e /sys/class/net/dummy0 ] || $IP link add dummy0 type dummy
$IP link set dummy0 up
$IP addr add 192.0.2.1/24 dev dummy0
rdma link add rxe0 type rxe netdev dummy0 || say "FAIL setup rdma link add"
GIDX=
for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  case "$(cat $g 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) GIDX=${g##*/}; break;; esac
done
GIDX=${GIDX:-1}
LIB=/opt/nprdma/libnprdma.so
CAND=/opt/nprdma/libnprdma-candidate.so
STRESS=/opt/nprdma/nprdma-verbs-stress
ITERS=$(arg iters); ITERS=${ITERS:-300}
CMP_ITERS=$(arg cmp_iters); CMP_ITERS=${CMP_ITERS:-500}
export NPRDMA_STATUS_DIR=/dev/shm/nprdma
say "INFO kernel $KVER gid-index $GIDX"
# The emulated CPU, and whether the kernel isolates page tables (a page-table switch on every
# system call, which under TCG empties the software TLB): context for the comparison below.
say "INFO cpu $(awk -F': ' '/^vendor_id/ {print $2; exit}' /proc/cpuinfo) x$(nproc), meltdown: $(cat /sys/devices/system/cpu/vulnerabilities/meltdown 2>/dev/null)"

# wait_listen: until the server listens on TCP port 18515 (perftest's, ibv_rc_pingpong's and the
# stress program's; hex 4853 in /proc/net/tcp, state 0A = LISTEN), at most 5 s. A fixed sleep
# long enough for the slowest start under emulation was half of every latency run's time.
wait_listen() {
  i=0
  while [ $i -lt 250 ]; do
    awk '$2 ~ /:4853$/ && $4 == "0A" {f = 1} END {exit !f}' /proc/net/tcp && return 0
    sleep 0.02; i=$((i + 1))
  done
}

# run NAME MODE TARGET CMD...: server in the background, client against TARGET.
# MODE: lib (LD_PRELOAD), off (LD_PRELOAD + NPRDMA=off), small (LD_PRELOAD, 16 MiB budget,
# 256 KiB windows), cand (LD_PRELOAD of the candidate build, --candidate), none (plain).
run() {
  name=$1; mode=$2; target=$3; shift 3
  case $mode in
    lib) pre="env LD_PRELOAD=$LIB" ;;
    off) pre="env LD_PRELOAD=$LIB NPRDMA=off" ;;
    small) pre="env LD_PRELOAD=$LIB NPRDMA_PIN_BUDGET=16M NPRDMA_WINDOW=256K" ;;
    cand) pre="env LD_PRELOAD=$CAND" ;;
    *) pre="env" ;;
  esac
  $pre $SRV_PIN timeout 90 "$@" > /tmp/srv.out 2>&1 &
  spid=$!
  # SRV_WAIT: a fixed wait instead, for servers that listen through rdma_cm, not TCP.
  if [ -n "$SRV_WAIT" ]; then sleep $SRV_WAIT; else wait_listen; fi
  $pre $CLI_PIN timeout 90 "$@" $target > /tmp/cli.out 2>&1
  crc=$?
  # perftest -R connects a second time after exchanging parameters; a server slow to listen
  # again under emulation rejects it (REJECTED, reason 8: no listener). Retry the client once.
  if [ $crc != 0 ] && grep -q RDMA_CM_EVENT_REJECTED /tmp/cli.out && kill -0 $spid 2>/dev/null; then
    say "NOTE $name: the client was rejected (the server was not listening yet); retrying once"
    sed 's/^/  cli| /' /tmp/cli.out | tail -n 8
    sleep 1
    $pre $CLI_PIN timeout 90 "$@" $target > /tmp/cli.out 2>&1
    crc=$?
  fi
  wait $spid; src=$?
  if [ $src = 0 ] && [ $crc = 0 ]; then say "PASS $name"; else
    say "FAIL $name server=$src client=$crc"
    sed 's/^/  srv| /' /tmp/srv.out | tail -n 25
    sed 's/^/  cli| /' /tmp/cli.out | tail -n 25
  fi
  grep -h '^nprdma\[' /tmp/srv.out /tmp/cli.out | sort -u | sed 's/^/  lib| /'
}
# lat [FILE]: the client's t_typical, column 5 of the first result row after the t_typical
# header (a row starts with the message size and the iterations; with -U or -H, perftest
# prints "n, value" sample lines between the header and that row). The comparison runs use
# -C (cycles): perftest's CPU-MHz calibration sometimes fails under TCG and prints inf for
# microseconds (seen in our own runs); the ratio needs no unit.
RESULT_ROW='NF >= 5 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/'
lat() { awk "/t_typical/ {h = 1; next} h && $RESULT_ROW {print \$5; exit}" "${1:-/tmp/cli.out}"; }
# bw [FILE]: the client's average bandwidth, column 4 of the first result row after the
# BW header.
bw() { awk "/BW average/ {h = 1; next} h && $RESULT_ROW {print \$4; exit}" "${1:-/tmp/cli.out}"; }

L=127.0.0.1
SUITE=$(arg suite); SUITE=${SUITE:-all}
ROUNDS=$(arg rounds); ROUNDS=${ROUNDS:-3}
BW_ROUNDS=$(arg bw_rounds); BW_ROUNDS=${BW_ROUNDS:-3}
# Extra perftest flags for the comparison runs (commas for spaces on the kernel command line).
XF=$(arg cmp_flags | tr ',' ' ')
if [ "$SUITE" = all ]; then
run ibv_rc_pingpong lib $L ibv_rc_pingpong -d rxe0 -g $GIDX -n 200
run ibv_rc_pingpong_events lib $L ibv_rc_pingpong -d rxe0 -g $GIDX -n 200 -e
# 16 QPs sharing an SRQ created for one SGE per receive (ibv_create_srq, widened by the library).
run ibv_srq_pingpong lib $L ibv_srq_pingpong -d rxe0 -g $GIDX -n 200
run ib_write_lat lib $L ib_write_lat -d rxe0 -x $GIDX -n $ITERS -F
run ib_write_bw lib $L ib_write_bw -d rxe0 -x $GIDX -n $ITERS -F --report_gbits
run ib_read_lat lib $L ib_read_lat -d rxe0 -x $GIDX -n $ITERS -F
run ib_send_lat lib $L ib_send_lat -d rxe0 -x $GIDX -n $ITERS -F
SRV_WAIT=1.5
run ib_write_lat_rdma_cm lib 192.0.2.1 ib_write_lat -d rxe0 -x $GIDX -n $ITERS -F -R
SRV_WAIT=
run ib_write_lat_nprdma_off off $L ib_write_lat -d rxe0 -x $GIDX -n $ITERS -F

# The stress program: 1 GiB registered on each side, 16 MiB budget.
run nprdma_verbs_stress small "--connect 127.0.0.1" \
  $STRESS --device rxe0 --gid-index $GIDX --size 1G --ops $(arg stress_ops) --budget 16M
grep -h '^STRESS' /tmp/srv.out /tmp/cli.out | sed 's/^/  /'
# The same with extended CQs (ibv_create_cq_ex, polled with ibv_start_poll/next_poll).
run nprdma_verbs_stress_cq_ex small "--connect 127.0.0.1" \
  $STRESS --device rxe0 --gid-index $GIDX --size 1G --ops $(( $(arg stress_ops) / 2 + 1 )) --budget 16M --cq-ex --seed 7
grep -h '^STRESS' /tmp/srv.out /tmp/cli.out | sed 's/^/  /'
# And sleeping on a completion channel between polls (the library's waits stash completions).
run nprdma_verbs_stress_events small "--connect 127.0.0.1" \
  $STRESS --device rxe0 --gid-index $GIDX --size 1G --ops $(( $(arg stress_ops) / 2 + 1 )) --budget 16M --events --seed 11
grep -h '^STRESS' /tmp/srv.out /tmp/cli.out | sed 's/^/  /'
fi

# Same boot, with and without the library, alternating; server and client on CPUs of their
# own when there are enough (perftest's advice for latency runs; less scheduling noise).
if [ "$(arg pin)" = 1 ] && [ "$(nproc)" -ge 4 ]; then
  SRV_PIN="taskset -c 2"; CLI_PIN="taskset -c 3"
fi
# Same boot, with and without the library, alternating (the compare suite adds the library
# switched off, NPRDMA=off, which separates the cost of being loaded from the data path's).
# lat_run KIND MODE / bw_run KIND MODE: one comparison run and its metric.
lat_run() {
  run cmp_write_lat_$1 $2 $L ib_write_lat -d rxe0 -x $GIDX -n $CMP_ITERS -F -C $XF
  metric write_lat_$1 $(lat)
}
bw_run() {
  run cmp_write_bw_$1 $2 $L ib_write_bw -d rxe0 -x $GIDX -n $CMP_ITERS -F --report_gbits
  metric write_bw_$1 $(bw)
}
if [ -x /opt/nprdma/bench ]; then
  NPRDMA_BENCH_N=50000 $CLI_PIN /opt/nprdma/bench 2>&1 | sed 's/^/NPRDMA-RXE: BENCH /'
  NPRDMA_BENCH_N=50000 NPRDMA_BENCH_SYSCALL=1 $CLI_PIN /opt/nprdma/bench 2>&1 | sed 's/^/NPRDMA-RXE: BENCH+syscall /'
  # The library's own cost against the fake's null data path, alternating (less noise).
  for k in plain lib plain lib; do
    NPRDMA_BENCH_N=200000 NPRDMA_BENCH_NULL=1 NPRDMA_BENCH_ONLY=$k $CLI_PIN /opt/nprdma/bench 2>&1 | sed 's/^/NPRDMA-RXE: BENCH+null /'
  done
fi
r=0
while [ $r -lt $ROUNDS ]; do
  r=$((r + 1))
  # Marks which metrics belong together: a round's runs ran back to back.
  echo "NPRDMA-ROUND: $r"
  # Odd rounds run plain first, even rounds the library first: no kind always goes first
  # (the compare suite rotates three kinds: runs later in a round were measured faster).
  # With a candidate build, it takes the third place.
  if [ -e $CAND ]; then K3="cand cand"; else K3="off off"; fi
  if [ "$SUITE" = compare ] || [ -e $CAND ]; then
    case $((r % 3)) in
      1) lat_run plain none; lat_run lib lib; lat_run $K3 ;;
      2) lat_run lib lib; lat_run $K3; lat_run plain none ;;
      *) lat_run $K3; lat_run plain none; lat_run lib lib ;;
    esac
  elif [ $((r % 2)) = 1 ]; then
    lat_run plain none; lat_run lib lib
  else
    lat_run lib lib; lat_run plain none
  fi
  if [ $r -gt $BW_ROUNDS ]; then
    :
  elif [ $((r % 2)) = 1 ]; then
    bw_run plain none; bw_run lib lib
  else
    bw_run lib lib; bw_run plain none
  fi
done
say DONE
sync
poweroff -f
"#;

/// Options of `cargo xtask rxe-test`.
pub struct Options {
    /// Iterations per functional perftest run.
    pub iters: u64,
    /// Iterations per run of the with/without comparison.
    pub cmp_iters: u64,
    /// Operations of the stress program.
    pub stress_ops: u64,
    /// Only the with/without comparison (no functional tests, no stress program).
    pub compare_only: bool,
    /// Rounds of the alternating latency comparison.
    pub rounds: u64,
    /// How many of those rounds also compare bandwidth (a bandwidth run takes about three
    /// latency runs' time, and its ratio has no goal).
    pub bw_rounds: u64,
    /// Guest CPUs.
    pub smp: u64,
    /// Extra perftest flags for the comparison's latency runs (e.g. `--use_old_post_send`).
    pub cmp_flags: String,
    /// Pin the comparison's server and client to CPUs of their own.
    pub pin: bool,
    /// Another build of the library (a change under evaluation), run in the comparison's
    /// rounds in place of `NPRDMA=off` and paired run by run with this tree's build: two
    /// builds measured in one boot, where the difference between boots (about ±1% under
    /// TCG) does not enter.
    pub candidate: Option<PathBuf>,
    /// Boots of the guest, one after another. With more than one, the latency ratios of all
    /// boots are also pooled (see [`pooled_ratio`]): the ratio wanders between boots by more
    /// than one boot's interval, so a goal is shown only across several.
    pub boots: u64,
}

/// Most comparison rounds one boot runs (about 10 s each under TCG: over a day).
pub const MAX_ROUNDS: u64 = 10_000;

impl Options {
    /// How long one boot may run: the functional part's budget plus, per comparison round,
    /// about 10 s of latency runs and 40 s of bandwidth runs at 500 iterations, scaled up for
    /// longer runs. Saturates instead of overflowing on absurd arguments.
    fn vm_timeout(&self) -> Duration {
        let scale = self.cmp_iters.div_ceil(500).max(1);
        let per_round = 10u64.saturating_mul(scale);
        let per_bw_round = 40u64.saturating_mul(scale);
        let extra = per_round
            .saturating_mul(self.rounds)
            .saturating_add(per_bw_round.saturating_mul(self.bw_rounds));
        VM_TIMEOUT.saturating_add(Duration::from_secs(extra))
    }

    /// Refuses option values no run can use.
    pub fn validate(&self) -> Result<(), XtaskError> {
        if self.rounds > MAX_ROUNDS || self.bw_rounds > MAX_ROUNDS {
            return Err(XtaskError::Usage(format!(
                "--rounds and --bw-rounds must be at most {MAX_ROUNDS} (got {} and {})",
                self.rounds, self.bw_rounds
            )));
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Self {
        // Sized for CI (the whole step must stay within about three minutes under TCG).
        Self {
            iters: 300,
            cmp_iters: 500,
            stress_ops: 100,
            compare_only: false,
            rounds: 31,
            bw_rounds: 5,
            smp: 4,
            cmp_flags: String::new(),
            pin: true,
            candidate: None,
            boots: 1,
        }
    }
}

fn cache_dir() -> PathBuf {
    workspace_root().join("target").join("rxe")
}

fn other(msg: impl Into<String>) -> XtaskError {
    XtaskError::Other(msg.into())
}

/// Builds connectx in release mode and returns where cargo put `libnprdma.so` and
/// `nprdma-verbs-stress`, as its build messages say (so `CARGO_TARGET_DIR` or a configured
/// target directory is honoured, and a stale copy elsewhere is never booted).
fn build_connectx() -> Result<(PathBuf, PathBuf), XtaskError> {
    let what = "cargo build -p connectx --release";
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "connectx",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: what.into(),
            error,
        })?;
    if !out.status.success() {
        return Err(XtaskError::CommandFailed {
            what: what.into(),
            status: out.status,
        });
    }
    let messages = String::from_utf8_lossy(&out.stdout);
    let find = |name: &str| {
        built_artifact(&messages, name)
            .filter(|p| p.is_file())
            .ok_or_else(|| other(format!("{what}: cargo reported no {name}")))
    };
    Ok((find("libnprdma.so")?, find("nprdma-verbs-stress")?))
}

/// The path of the artifact named `file_name` among cargo's JSON build messages (a
/// `compiler-artifact`'s `filenames` or `executable`).
fn built_artifact(messages: &str, file_name: &str) -> Option<PathBuf> {
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

/// Runs the whole test; fails if any guest test failed.
pub fn run(opts: &Options) -> Result<(), XtaskError> {
    let started = Instant::now();
    let qemu = require_tool("qemu-system-x86_64", "qemu-system-x86")?;
    require_tool("apt-get", "apt")?;
    require_tool("dpkg-deb", "dpkg")?;
    require_tool("ldd", "libc-bin")?;

    section("rxe: build libnprdma.so and nprdma-verbs-stress (release)");
    let (lib, stress) = build_connectx()?;

    section("rxe: Debian packages for the guest (cached in target/rxe)");
    let cache = cache_dir();
    let debs = fetch_packages(&cache)?;
    let (stage, kdir) = unpack(&cache, &debs)?;
    let kver = kernel_version(&kdir)?;
    let vmlinuz = kdir.join("boot").join(format!("vmlinuz-{kver}"));
    let initrd = cache.join("initramfs.cpio");
    if let Some(c) = &opts.candidate
        && !c.is_file()
    {
        return Err(other(format!(
            "--candidate {}: no such file (a libnprdma.so built from the change to compare)",
            c.display()
        )));
    }
    build_initramfs(
        &stage,
        &kdir,
        &kver,
        &lib,
        opts.candidate.as_deref(),
        &stress,
        &initrd,
    )?;
    println!(
        "xtask: guest kernel {kver}, initramfs {} MiB, prepared in {:.1} s",
        std::fs::metadata(&initrd)
            .map(|m| m.len() >> 20)
            .unwrap_or(0),
        started.elapsed().as_secs_f64()
    );

    section("rxe: boot and test (qemu-system-x86_64)");
    let accel = pick_accel();
    let boots = opts.boots.max(1);
    let mut failed = Vec::new();
    let mut boot_ratios = Vec::new();
    for boot in 1..=boots {
        let log = if boots == 1 {
            cache.join("last-run.log")
        } else {
            println!("\nxtask: boot {boot} of {boots}");
            cache.join(format!("last-run-{boot}.log"))
        };
        let lines = match run_vm(&qemu, &vmlinuz, &initrd, accel, opts, &log) {
            Ok(lines) => lines,
            Err(e) if boots == 1 => return Err(e),
            // One failed boot of several: the others still count and are pooled.
            Err(e) => {
                println!("xtask: boot {boot} failed: {e}");
                failed.push(format!("boot {boot}: {e}"));
                continue;
            }
        };
        let verdict = evaluate(&lines);
        println!(
            "xtask: rxe-test {} {:.0} s (full serial log: {})",
            if boots == 1 {
                "finished in"
            } else {
                "boot done at"
            },
            started.elapsed().as_secs_f64(),
            log.display()
        );
        if boots == 1 {
            return verdict;
        }
        if let Err(e) = verdict {
            failed.push(format!("boot {boot}: {e}"));
        }
        boot_ratios
            .push(POOLED_KINDS.map(|(kind, _)| latency_ratios(&lines, "write_lat_plain", kind)));
    }
    print_pooled(&boot_ratios);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Checks(failed))
    }
}

/// The kinds whose per-round ratios to plain `--boots` pools, and what each is.
const POOLED_KINDS: [(&str, &str); 3] = [
    ("write_lat_lib", "with the library"),
    (
        "write_lat_off",
        "NPRDMA=off (the control: the library loaded, passing through)",
    ),
    ("write_lat_cand", "the candidate build"),
];

/// The across-boots summary of `--boots`: for each kind that ran, each boot's median per-round
/// ratio to plain, and the pooled median with its two-level interval (the goal's verdict for
/// the library).
fn print_pooled(boot_ratios: &[[Vec<f64>; 3]]) {
    for (k, (_, what)) in POOLED_KINDS.iter().enumerate() {
        let boots: Vec<Vec<f64>> = boot_ratios.iter().map(|b| b[k].clone()).collect();
        if boots.iter().all(Vec::is_empty) {
            continue;
        }
        let medians: Vec<String> = boots
            .iter()
            .map(|r| median(r.clone()).map_or("-".into(), |m| format!("{m:.3}x")))
            .collect();
        println!(
            "\nxtask: ib_write_lat per-round ratios to plain, {what}, over {} boots: boot medians {}",
            boots.len(),
            medians.join(", ")
        );
        match pooled_ratio(&boots) {
            Some((m, (low, high))) => println!(
                "  pooled: median {m:.3}x over {} rounds, 95% two-level bootstrap interval (boots, then their rounds) {low:.3}x to {high:.3}x{}",
                boots.iter().map(Vec::len).sum::<usize>(),
                if k == 0 {
                    format!(
                        "; across these boots the goal is {}",
                        goal_verdict(LATENCY_GOAL, (low, high))
                    )
                } else {
                    String::new()
                }
            ),
            None => println!("  pooled: too few boots with valid rounds (need 2)"),
        }
    }
}

/// Downloads the guest packages (and the kernel `linux-image-amd64` depends on) unless a
/// `.deb` of each is already in the cache.
fn fetch_packages(cache: &Path) -> Result<Vec<PathBuf>, XtaskError> {
    let dir = cache.join("debs");
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let kernel = kernel_package()?;
    let mut names: Vec<String> = GUEST_PACKAGES.iter().map(|s| s.to_string()).collect();
    names.push(kernel);
    let have = |name: &str| -> Option<PathBuf> {
        std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok())
            .find_map(|e| {
                let f = e.file_name().to_string_lossy().into_owned();
                (f.starts_with(&format!("{name}_")) && f.ends_with(".deb")).then(|| e.path())
            })
    };
    let missing: Vec<&String> = names.iter().filter(|n| have(n).is_none()).collect();
    if !missing.is_empty() {
        println!("xtask: apt-get download {} package(s)", missing.len());
        let download = || {
            Command::new("apt-get")
                .current_dir(&dir)
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
            apt_update_once();
            out = download()?;
        }
        if !out.status.success() {
            return Err(other(format!(
                "apt-get download failed (run `apt-get update` first?): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    names
        .iter()
        .map(|n| have(n).ok_or_else(|| other(format!("package {n} was not downloaded"))))
        .collect()
}

/// Runs `apt-get update` once per process (package lists may be missing on a machine where
/// every needed package was already installed).
fn apt_update_once() {
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
fn kernel_package() -> Result<String, XtaskError> {
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

/// Unpacks the packages once into `stage/` and `kernel/`; returns both.
fn unpack(cache: &Path, debs: &[PathBuf]) -> Result<(PathBuf, PathBuf), XtaskError> {
    let stage = cache.join("stage");
    let kdir = cache.join("kernel");
    let stamp = cache.join("unpacked.list");
    let list: String = debs
        .iter()
        .map(|d| d.file_name().unwrap_or_default().to_string_lossy() + "\n")
        .collect();
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(list.as_str()) {
        return Ok((stage, kdir));
    }
    let _ = std::fs::remove_dir_all(&stage);
    let _ = std::fs::remove_dir_all(&kdir);
    for deb in debs {
        let name = deb.file_name().unwrap_or_default().to_string_lossy();
        let dest = if name.starts_with("linux-image-") {
            &kdir
        } else {
            &stage
        };
        run_status(
            &format!("dpkg-deb -x {name}"),
            Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest),
        )?;
    }
    std::fs::write(&stamp, list).map_err(|e| other(e.to_string()))?;
    Ok((stage, kdir))
}

fn kernel_version(kdir: &Path) -> Result<String, XtaskError> {
    std::fs::read_dir(kdir.join("lib/modules"))
        .map_err(|e| other(format!("no kernel modules in {}: {e}", kdir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or_else(|| other("no kernel version directory"))
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
/// kernel's module directory).
fn module_order(moddir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>, XtaskError> {
    let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut stack = vec![moddir.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| other(format!("{}: {e}", d.display())))? {
            let p = e.map_err(|e| other(e.to_string()))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
            {
                by_name.insert(
                    n.replace('-', "_"),
                    p.strip_prefix(moddir).unwrap_or(&p).to_path_buf(),
                );
            }
        }
    }
    // Modules compiled into the kernel (`modules.builtin`: one `kernel/.../name.ko` per line).
    let builtin: BTreeSet<String> = std::fs::read_to_string(moddir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            Path::new(l.trim())
                .file_stem()?
                .to_str()
                .map(|n| n.replace('-', "_"))
        })
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
        let bytes = std::fs::read(moddir.join(rel)).map_err(|e| other(e.to_string()))?;
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
fn library_closure(stage: &Path, files: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, XtaskError> {
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
struct Cpio {
    out: Vec<u8>,
    ino: u32,
    dirs: std::collections::BTreeSet<String>,
}

impl Cpio {
    fn new() -> Self {
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

    fn dir(&mut self, path: &str) {
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

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        let path = path.trim_start_matches('/');
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, 0o100000 | mode, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
        self.out
    }
}

fn read(p: &Path) -> Result<Vec<u8>, XtaskError> {
    std::fs::read(p).map_err(|e| other(format!("{}: {e}", p.display())))
}

fn build_initramfs(
    stage: &Path,
    kdir: &Path,
    kver: &str,
    lib: &Path,
    candidate: Option<&Path>,
    stress: &Path,
    out: &Path,
) -> Result<(), XtaskError> {
    let mut cpio = Cpio::new();
    for d in [
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "etc",
        "lib64",
        "opt/nprdma",
    ] {
        cpio.dir(d);
    }
    let mut elfs: Vec<PathBuf> = Vec::new();
    for (src, dest) in GUEST_BINARIES {
        let p = stage.join(src);
        cpio.file(dest, 0o755, &read(&p)?);
        if !src.ends_with("busybox") {
            elfs.push(p);
        }
    }
    let provider = stage.join("usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so");
    cpio.file(
        "usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
        0o644,
        &read(&provider)?,
    );
    cpio.file(
        "etc/libibverbs.d/rxe.driver",
        0o644,
        &read(&stage.join("etc/libibverbs.d/rxe.driver"))?,
    );
    elfs.push(provider);
    cpio.file("opt/nprdma/libnprdma.so", 0o755, &read(lib)?);
    // Everything copied in also brings the shared libraries it needs (library_closure).
    if let Some(c) = candidate {
        cpio.file("opt/nprdma/libnprdma-candidate.so", 0o755, &read(c)?);
        elfs.push(c.to_path_buf());
    }
    cpio.file("opt/nprdma/nprdma-verbs-stress", 0o755, &read(stress)?);
    if let Some(bench) = std::env::var_os("NPRDMA_RXE_BENCH") {
        cpio.file("opt/nprdma/bench", 0o755, &read(Path::new(&bench))?);
        elfs.push(PathBuf::from(bench));
    }
    elfs.push(lib.to_path_buf());
    elfs.push(stress.to_path_buf());
    for (src, guest) in library_closure(stage, &elfs)? {
        cpio.file(&guest, 0o755, &read(&src)?);
        if guest == "/lib64/ld-linux-x86-64.so.2" {
            cpio.file(
                "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                0o755,
                &read(&src)?,
            );
        }
    }
    let moddir = kdir.join("lib/modules").join(kver);
    let order = module_order(&moddir, GUEST_MODULES)?;
    let mut list = String::new();
    for rel in &order {
        let guest = format!("lib/modules/{kver}/{}", rel.display());
        cpio.file(&guest, 0o644, &read(&moddir.join(rel))?);
        list.push_str(&format!("{}\n", rel.display()));
    }
    cpio.file("etc/modules.order", 0o644, list.as_bytes());
    cpio.file("init", 0o755, GUEST_INIT.as_bytes());
    std::fs::write(out, cpio.finish()).map_err(|e| other(format!("{}: {e}", out.display())))
}

/// KVM only where it is hardware KVM (kvm_intel/kvm_amd, not the nested PVM variant, which
/// runs a stock kernel far slower than TCG, as we found on the build machines).
fn pick_accel() -> &'static str {
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

fn run_vm(
    qemu: &Path,
    vmlinuz: &Path,
    initrd: &Path,
    accel: &str,
    opts: &Options,
    log: &Path,
) -> Result<Vec<String>, XtaskError> {
    let mut cmd = Command::new(qemu);
    if accel == "kvm" {
        cmd.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        cmd.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    let smp = opts.smp.to_string();
    cmd.args(["-machine", "q35", "-smp", &smp, "-m", "2048"])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(["-monitor", "none", "-nic", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 loglevel=3 iters={} cmp_iters={} stress_ops={} suite={} rounds={} bw_rounds={} cmp_flags={} pin={}",
            opts.iters,
            opts.cmp_iters,
            opts.stress_ops,
            if opts.compare_only { "compare" } else { "all" },
            opts.rounds,
            opts.bw_rounds,
            opts.cmp_flags.replace(' ', ","),
            u8::from(opts.pin)
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    println!("xtask: accelerator {accel}; guest output (test lines only):");
    let mut child = cmd.spawn().map_err(|error| XtaskError::Spawn {
        what: "qemu-system-x86_64".into(),
        error,
    })?;
    let stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        if let Some(out) = stdout {
            for line in crate::util::lossy_lines(out) {
                // The first guest line can follow the boot loader's screen-clearing escapes
                // on the same console line: the test protocol starts at its marker.
                let line = match line.find("NPRDMA-") {
                    Some(at) if at > 0 => line[at..].to_string(),
                    _ => line,
                };
                let shown = line.starts_with("NPRDMA-")
                    || line.starts_with("  ")
                    || line.contains("Kernel panic");
                if shown {
                    println!("  | {line}");
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    // Each comparison round beyond the default five takes up to about a minute under TCG.
    // A latency round takes about 1 s here and a bandwidth round about 4 s: ten times that
    // on top of the rest.
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
    let timeout = opts.vm_timeout();
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(error) => {
                return Err(XtaskError::Spawn {
                    what: "qemu-system-x86_64 (wait)".into(),
                    error,
                });
            }
        }
    };
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    let lines: Vec<String> = rx.try_iter().collect();
    if let Ok(mut f) = std::fs::File::create(log) {
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
            timeout.as_secs()
        )))),
        Some(s) if !s.success() => Err(other(said(format!("qemu exited with {s}")))),
        Some(_) => Ok(lines),
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The `NPRDMA-METRIC: <name> <value>` samples. perftest prints inf/nan or 0 when its clock
/// calibration failed: those are not samples.
fn parse_metrics(lines: &[String]) -> BTreeMap<String, Vec<f64>> {
    let mut metrics: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for l in lines {
        let Some(rest) = l.strip_prefix("NPRDMA-METRIC: ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<f64>().ok()))
            && v.is_finite()
            && v > 0.0
        {
            metrics.entry(k.to_string()).or_default().push(v);
        }
    }
    metrics
}

/// The names of the `NPRDMA-METRIC` lines that [`parse_metrics`] drops (no value, or not a
/// positive finite number), one per line: runs that count for nothing in the ratios.
fn unusable_metrics(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("NPRDMA-METRIC: "))
        .filter_map(|rest| {
            let mut it = rest.split_whitespace();
            let name = it.next()?;
            let usable = it
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v.is_finite() && v > 0.0);
            (!usable).then(|| name.to_string())
        })
        .collect()
}

/// Picks sample indices below `n` for the bootstraps: xorshift64* from a fixed seed,
/// deterministic (the same samples always give the same interval) and good enough for this.
fn index_picker() -> impl FnMut(usize) -> usize {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    move |n| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// A 95% percentile-bootstrap interval for `median(lib) / median(plain)`: both kinds resampled
/// with replacement, 2,000 times, from a fixed seed (the same samples always give the same
/// interval). Under TCG a single boot's ratio of medians wanders by several percent, so the
/// ratio alone cannot say whether a goal of 1.02x was met; the interval says how far the
/// boot's samples pin it down.
fn ratio_interval(plain: &[f64], lib: &[f64]) -> Option<(f64, f64)> {
    if plain.len() < 2 || lib.len() < 2 {
        return None;
    }
    bootstrap_interval(|pick| {
        let p: Vec<f64> = (0..plain.len()).map(|_| plain[pick(plain.len())]).collect();
        let l: Vec<f64> = (0..lib.len()).map(|_| lib[pick(lib.len())]).collect();
        Some(median(l)? / median(p)?)
    })
}

/// The 2.5th and 97.5th percentiles of `statistic` over 2,000 resamples: each call draws its
/// resample with the index picker it is given ([`index_picker`], the same sequence every time).
fn bootstrap_interval(
    mut statistic: impl FnMut(&mut dyn FnMut(usize) -> usize) -> Option<f64>,
) -> Option<(f64, f64)> {
    const RESAMPLES: usize = 2000;
    let mut pick = index_picker();
    let mut values = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        values.push(statistic(&mut pick)?);
    }
    values.sort_by(|a, b| a.total_cmp(b));
    Some((
        values[RESAMPLES / 40],
        values[RESAMPLES - 1 - RESAMPLES / 40],
    ))
}

/// The rounds' `(a, b)` pairs of metrics: within one round (`NPRDMA-ROUND: n` up to the next
/// marker) the kinds ran back to back, so a pair shares whatever state the emulator was in.
/// Rounds where either metric is missing or invalid give no pair.
fn round_pairs(lines: &[String], a: &str, b: &str) -> Vec<(f64, f64)> {
    let mut pairs = Vec::new();
    let mut round: Option<BTreeMap<String, Vec<f64>>> = None;
    let mut close = |round: Option<BTreeMap<String, Vec<f64>>>| {
        if let Some(m) = round
            && let (Some(&[x]), Some(&[y])) =
                (m.get(a).map(Vec::as_slice), m.get(b).map(Vec::as_slice))
        {
            pairs.push((x, y));
        }
    };
    for l in lines {
        if l.starts_with("NPRDMA-ROUND: ") {
            close(round.take());
            round = Some(BTreeMap::new());
        } else if let Some(m) = round.as_mut()
            && l.starts_with("NPRDMA-METRIC: ")
        {
            for (k, v) in parse_metrics(std::slice::from_ref(l)) {
                m.entry(k).or_default().extend(v);
            }
        }
    }
    close(round);
    pairs
}

/// The median of the per-round ratios `b / a` and its 95% percentile-bootstrap interval
/// (rounds resampled with replacement, 2,000 times, fixed seed). Pairing takes out what changes
/// from round to round (a spell of slow host or slow mode hits both runs of a round alike),
/// which the ratio of medians leaves in; a round where the mode switched between its two runs
/// is one outlier for the median to ignore.
fn paired_ratio(pairs: &[(f64, f64)]) -> Option<(f64, (f64, f64))> {
    ratio_median(&pairs.iter().map(|(a, b)| b / a).collect::<Vec<_>>())
}

/// The median of some per-round ratios and its 95% percentile-bootstrap interval (see
/// [`paired_ratio`]); `None` with fewer than two.
fn ratio_median(ratios: &[f64]) -> Option<(f64, (f64, f64))> {
    if ratios.len() < 2 {
        return None;
    }
    let interval = bootstrap_interval(|pick| {
        median(
            (0..ratios.len())
                .map(|_| ratios[pick(ratios.len())])
                .collect(),
        )
    })?;
    Some((median(ratios.to_vec())?, interval))
}

/// The per-round ratios `b / a` of two latency kinds in one boot, rounds with a stalled run
/// (see [`stall_limit`]) left out.
fn latency_ratios(lines: &[String], a: &str, b: &str) -> Vec<f64> {
    let limit = stall_limit(&parse_metrics(lines));
    round_pairs(lines, a, b)
        .into_iter()
        .filter(|(x, y)| *x <= limit && *y <= limit)
        .map(|(x, y)| y / x)
        .collect()
}

/// The median of the per-round ratios of several boots pooled, and a 95% two-level bootstrap
/// interval for it: each resample draws boots with replacement and then, within each drawn
/// boot, its rounds with replacement (2,000 times, fixed seed). Drawing boots carries the
/// boot-to-boot wander (about ±1% under TCG, more than one boot's interval) into the interval,
/// which pooling the rounds as if from one boot would hide. Boots without ratios are left out;
/// `None` with fewer than two left.
fn pooled_ratio(boots: &[Vec<f64>]) -> Option<(f64, (f64, f64))> {
    let boots: Vec<&Vec<f64>> = boots.iter().filter(|b| !b.is_empty()).collect();
    if boots.len() < 2 {
        return None;
    }
    let all: Vec<f64> = boots.iter().flat_map(|b| b.iter().copied()).collect();
    let interval = bootstrap_interval(|pick| {
        let mut resample = Vec::with_capacity(all.len());
        for _ in 0..boots.len() {
            let boot = boots[pick(boots.len())];
            resample.extend((0..boot.len()).map(|_| boot[pick(boot.len())]));
        }
        median(resample)
    })?;
    Some((median(all)?, interval))
}

/// What the interval says of a latency goal (`goal`, as a ratio).
fn goal_verdict(goal: f64, (low, high): (f64, f64)) -> &'static str {
    if high <= goal {
        "met: the whole interval is at or below the goal"
    } else if low > goal {
        "missed: the whole interval is above the goal"
    } else {
        "not shown: the interval spans the goal"
    }
}

/// What the interval of the candidate's per-round ratios to this build says.
fn candidate_verdict((low, high): (f64, f64)) -> &'static str {
    if high < 1.0 {
        "the candidate is faster"
    } else if low > 1.0 {
        "the candidate is slower"
    } else {
        "no difference shown"
    }
}

/// The latency goal of the comparison (issue: at most 1.02x with a warm cache).
const LATENCY_GOAL: f64 = 1.02;

/// Runs within this factor of the boot's fastest latency run are in the fast mode.
const FAST_MODE: f64 = 1.2;

/// The comparison restricted to the fast mode. Under TCG on the build machines a latency run
/// either lands near the boot's fastest or about half again above it, at random and in every
/// kind alike (plain, library, `NPRDMA=off`; also with guest ASLR off and with the busy guest
/// CPUs pinned to host cores of their own): the medians of all runs then say more about which
/// runs hit the slow mode than about the library. Reported beside the ratio of medians, not
/// instead of it.
fn fast_mode_line(plain: &[f64], lib: &[f64], fastest: f64) -> Option<String> {
    let fast = |v: &[f64]| -> Vec<f64> {
        v.iter()
            .copied()
            .filter(|x| *x <= fastest * FAST_MODE)
            .collect()
    };
    let (fp, fl) = (fast(plain), fast(lib));
    let (np, nl) = (fp.len(), fl.len());
    let (p, l) = (median(fp)?, median(fl)?);
    Some(format!(
        "  ib_write_lat fast-mode runs (within {FAST_MODE}x of the fastest): plain {p:.0} cycles ({np} of {}), with library {l:.0} cycles ({nl} of {}), ratio {:.3}x",
        plain.len(),
        lib.len(),
        l / p
    ))
}

/// Latency runs above this are stalls. Under TCG, rxe's deferred work sometimes starves until
/// the next 4 ms tick and a whole run crawls (seen in our own runs): a latency run 10x
/// above the fastest run of any kind is such a stall, shown but left out of the medians and
/// the pairs.
fn stall_limit(metrics: &BTreeMap<String, Vec<f64>>) -> f64 {
    LATENCY_KINDS
        .iter()
        .flat_map(|k| metrics.get(*k).cloned().unwrap_or_default())
        .fold(f64::INFINITY, f64::min)
        * 10.0
}

/// The latency metrics of the comparison: plain, with the library, `NPRDMA=off`, candidate.
const LATENCY_KINDS: [&str; 4] = [
    "write_lat_plain",
    "write_lat_lib",
    "write_lat_off",
    "write_lat_cand",
];

/// Passes iff the guest finished and every test passed; prints the with/without ratios
/// (reported, not asserted: timing under emulation is noise-prone).
fn evaluate(lines: &[String]) -> Result<(), XtaskError> {
    let mut failed = Vec::new();
    let mut passed = 0;
    let mut done = false;
    let metrics = parse_metrics(lines);
    for l in lines {
        if let Some(rest) = l.strip_prefix("NPRDMA-RXE: ") {
            if let Some(name) = rest.strip_prefix("PASS ") {
                let _ = name;
                passed += 1;
            } else if let Some(what) = rest.strip_prefix("FAIL ") {
                failed.push(what.to_string());
            } else if rest.trim() == "DONE" {
                done = true;
            }
        }
    }
    println!(
        "\nxtask: with/without libnprdma.so in the same boot (medians of the valid runs; TCG timing is noisy):"
    );
    let unusable = unusable_metrics(lines);
    if !unusable.is_empty() {
        println!(
            "  warning: {} run(s) gave no usable value and are left out (perftest's clock \
             calibration failed, or its output was not recognised): {}",
            unusable.len(),
            unusable.join(", ")
        );
    }
    let limit = stall_limit(&metrics);
    let fastest = limit / 10.0;
    let stalled = |x: f64| x > limit;
    for k in LATENCY_KINDS
        .iter()
        .copied()
        .chain(["write_bw_plain", "write_bw_lib"])
    {
        if let Some(v) = metrics.get(k) {
            println!("  samples {k}: {v:?}");
        }
    }
    let samples = |k: &str| -> Vec<f64> {
        let v = metrics.get(k).cloned().unwrap_or_default();
        if k.starts_with("write_lat") {
            v.into_iter().filter(|x| !stalled(*x)).collect()
        } else {
            v
        }
    };
    let show = |k: &str| median(samples(k));
    let n = |k: &str| samples(k).len();
    // The per-round ratios `b / a` of two latency kinds (stalled runs left out), and how many
    // rounds gave a pair.
    let paired = |a: &str, b: &str| {
        let ratios = latency_ratios(lines, a, b);
        ratio_median(&ratios).map(|r| (r, ratios.len()))
    };
    let (lp, ll) = (show("write_lat_plain"), show("write_lat_lib"));
    let (bp, bl) = (show("write_bw_plain"), show("write_bw_lib"));
    match (lp, ll) {
        (Some(p), Some(l)) => {
            println!(
                "  ib_write_lat t_typical: plain {p:.0} cycles ({} runs), with library {l:.0} cycles ({} runs), ratio {:.3}x (goal <= {LATENCY_GOAL}x at warm cache)",
                n("write_lat_plain"),
                n("write_lat_lib"),
                l / p
            );
            if let Some((low, high)) =
                ratio_interval(&samples("write_lat_plain"), &samples("write_lat_lib"))
            {
                println!(
                    "  ib_write_lat ratio, 95% bootstrap interval: {low:.3}x to {high:.3}x; in this boot the goal is {}",
                    goal_verdict(LATENCY_GOAL, (low, high))
                );
            }
            if let Some(((m, (low, high)), k)) = paired("write_lat_plain", "write_lat_lib") {
                println!(
                    "  ib_write_lat per-round ratios (each round's two runs back to back): median {m:.3}x over {k} rounds, 95% bootstrap interval {low:.3}x to {high:.3}x; in this boot the goal is {}",
                    goal_verdict(LATENCY_GOAL, (low, high))
                );
            }
        }
        _ => println!("  ib_write_lat: no valid measurement"),
    }
    if let (Some(p), Some(o)) = (lp, show("write_lat_off")) {
        println!(
            "  ib_write_lat t_typical with the library loaded but off (NPRDMA=off): {o:.0} cycles ({} runs), ratio {:.3}x",
            n("write_lat_off"),
            o / p
        );
    }
    if let Some(line) = fast_mode_line(
        &samples("write_lat_plain"),
        &samples("write_lat_lib"),
        fastest,
    ) {
        println!("{line}");
    }
    if let (Some(p), Some(c)) = (lp, show("write_lat_cand")) {
        println!(
            "  candidate build: t_typical {c:.0} cycles ({} runs), ratio to plain {:.3}x",
            n("write_lat_cand"),
            c / p
        );
        if let Some(((m, (low, high)), k)) = paired("write_lat_plain", "write_lat_cand") {
            println!(
                "  candidate per-round ratios to plain: median {m:.3}x over {k} rounds, 95% bootstrap interval {low:.3}x to {high:.3}x"
            );
        }
        if let Some(((m, (low, high)), k)) = paired("write_lat_lib", "write_lat_cand") {
            println!(
                "  candidate against this build, per round: median {m:.3}x over {k} rounds, 95% bootstrap interval {low:.3}x to {high:.3}x ({})",
                candidate_verdict((low, high))
            );
        }
    }
    match (bp, bl) {
        (Some(p), Some(l)) => {
            println!(
                "  ib_write_bw average: plain {p:.3} Gb/s ({} runs), with library {l:.3} Gb/s ({} runs), ratio {:.3}x",
                n("write_bw_plain"),
                n("write_bw_lib"),
                l / p
            );
            // As for latency, pairing takes out the runs that fell into the slow mode together.
            let pairs = round_pairs(lines, "write_bw_plain", "write_bw_lib");
            if let Some((m, (low, high))) = paired_ratio(&pairs) {
                println!(
                    "  ib_write_bw per-round ratios: median {m:.3}x over {} rounds, 95% bootstrap interval {low:.3}x to {high:.3}x",
                    pairs.len()
                );
            }
        }
        _ => println!("  ib_write_bw: no valid measurement"),
    }
    if !done {
        failed.push("the guest did not reach the end of its test list".into());
    }
    if failed.is_empty() {
        println!("xtask: rxe-test: {passed} guest tests passed");
        Ok(())
    } else {
        Err(XtaskError::Checks(failed))
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

    /// Runs the guest script's `lat`/`bw` (and what they need) on `output` with the host's
    /// `sh` and `awk`, as busybox runs them in the guest.
    fn guest_extract(function: &str, output: &str) -> String {
        let defs: Vec<&str> = GUEST_INIT
            .lines()
            .filter(|l| {
                ["RESULT_ROW=", "lat() ", "bw() "]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .collect();
        assert_eq!(
            defs.len(),
            3,
            "the guest script's extractors moved: {defs:?}"
        );
        let dir = std::env::temp_dir().join(format!("nprdma-xtask-extract-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{function}.out"));
        std::fs::write(&file, output).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{}\n{function} \"$1\"", defs.join("\n")))
            .arg("sh")
            .arg(&file)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    const LAT_HEADER: &str = " #bytes #iterations    t_min[cycles]    t_max[cycles]  \
        t_typical[cycles]    t_avg[cycles]    t_stdev[cycles]   99% percentile[cycles]   \
        99.9% percentile[cycles] \n";
    const LAT_ROW: &str = " 2       1000          23011          91234        24002          24500        800     30000    91234\n";

    #[test]
    fn the_latency_is_the_result_row_even_with_samples_printed_before_it() {
        let plain = format!("---\n{LAT_HEADER}{LAT_ROW}---\n");
        assert_eq!(guest_extract("lat", &plain), "24002");
        // -U (unsorted samples) and -H (histogram) print "n, value" lines after the header.
        let unsorted =
            format!("---\n{LAT_HEADER}#, cycles\n1, 24012\n2, 23890\n3, 99999\n{LAT_ROW}---\n");
        assert_eq!(guest_extract("lat", &unsorted), "24002");
        // No result row: nothing, which the guest's `metric` reports as a warning.
        assert_eq!(
            guest_extract("lat", &format!("{LAT_HEADER}#, cycles\n1, 24012\n")),
            ""
        );
        let bw = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n \
                  65536      1000             1.95               1.93                 0.003681\n";
        assert_eq!(guest_extract("bw", bw), "1.93");
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
    fn absurd_round_counts_are_refused_and_the_timeout_cannot_overflow() {
        let mut o = Options::default();
        assert_eq!(
            o.vm_timeout(),
            VM_TIMEOUT + Duration::from_secs(31 * 10 + 5 * 40)
        );
        assert!(o.validate().is_ok());
        o.cmp_iters = 1000;
        assert_eq!(
            o.vm_timeout(),
            VM_TIMEOUT + Duration::from_secs(2 * (31 * 10 + 5 * 40))
        );
        o.rounds = u64::MAX;
        o.bw_rounds = u64::MAX;
        o.cmp_iters = u64::MAX;
        assert!(o.vm_timeout() >= Duration::from_secs(u64::MAX));
        assert!(matches!(o.validate(), Err(XtaskError::Usage(_))));
        o.rounds = MAX_ROUNDS;
        o.bw_rounds = MAX_ROUNDS;
        assert!(o.validate().is_ok());
    }

    #[test]
    fn invalid_samples_are_dropped() {
        let lines: Vec<String> = [
            "NPRDMA-METRIC: write_lat_lib inf",
            "NPRDMA-METRIC: write_lat_lib 12.5",
            "NPRDMA-METRIC: write_bw_lib 0.000000",
            "NPRDMA-METRIC: write_bw_lib nan",
            "NPRDMA-METRIC: write_lat_plain",
            "noise NPRDMA-METRIC: x 1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = parse_metrics(&lines);
        assert_eq!(m.get("write_lat_lib"), Some(&vec![12.5]));
        assert_eq!(m.len(), 1);
        assert_eq!(
            unusable_metrics(&lines),
            [
                "write_lat_lib",
                "write_bw_lib",
                "write_bw_lib",
                "write_lat_plain"
            ]
        );
    }

    #[test]
    fn fast_mode_leaves_out_the_slow_runs_of_each_kind() {
        let plain = [24_000.0, 36_000.0, 23_000.0, 35_000.0];
        let lib = [37_000.0, 24_500.0, 23_500.0, 38_000.0, 24_000.0];
        let line = fast_mode_line(&plain, &lib, 23_000.0).unwrap();
        assert!(line.contains("plain 23500 cycles (2 of 4)"), "{line}");
        assert!(
            line.contains("with library 24000 cycles (3 of 5)"),
            "{line}"
        );
        assert!(line.contains("ratio 1.021x"), "{line}");
        assert_eq!(fast_mode_line(&[36_000.0], &lib, 23_000.0), None);
    }

    #[test]
    fn the_bootstrap_interval_brackets_the_ratio_and_narrows_with_runs() {
        // Two kinds from one noisy distribution, the library's 1.5% slower.
        let spread = |i: usize| 23_000.0 * (1.0 + 0.04 * ((i * 7919 % 101) as f64 / 100.0));
        let plain: Vec<f64> = (0..40).map(spread).collect();
        let lib: Vec<f64> = (0..40).map(|i| spread(i + 13) * 1.015).collect();
        let (low, high) = ratio_interval(&plain, &lib).unwrap();
        let ratio = median(lib.clone()).unwrap() / median(plain.clone()).unwrap();
        assert!(low < ratio && ratio < high, "{low} {ratio} {high}");
        let (low9, high9) = ratio_interval(&plain[..9], &lib[..9]).unwrap();
        assert!(high9 - low9 > high - low, "{low9}-{high9} vs {low}-{high}");
        // Deterministic: the same samples, the same interval.
        assert_eq!(ratio_interval(&plain, &lib), Some((low, high)));
        assert_eq!(ratio_interval(&plain[..1], &lib), None);
    }

    #[test]
    fn rounds_pair_their_own_runs_and_skip_incomplete_ones() {
        let lines: Vec<String> = [
            "NPRDMA-METRIC: write_lat_plain 1", // before any round: not paired
            "NPRDMA-ROUND: 1",
            "NPRDMA-METRIC: write_lat_plain 100",
            "NPRDMA-RXE: PASS cmp_write_lat_lib",
            "NPRDMA-METRIC: write_lat_lib 102",
            "NPRDMA-ROUND: 2",
            "NPRDMA-METRIC: write_lat_lib inf", // invalid: the round has no pair
            "NPRDMA-METRIC: write_lat_plain 140",
            "NPRDMA-ROUND: 3",
            "NPRDMA-METRIC: write_lat_lib 150",
            "NPRDMA-METRIC: write_bw_plain 0.5",
            "NPRDMA-METRIC: write_lat_plain 147",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            round_pairs(&lines, "write_lat_plain", "write_lat_lib"),
            vec![(100.0, 102.0), (147.0, 150.0)]
        );
    }

    #[test]
    fn pairing_removes_round_to_round_drift() {
        // Each round's speed drifts by up to 40%; the library costs 2% in every round.
        let plain: Vec<f64> = (0..31)
            .map(|i| 100.0 * (1.0 + f64::from(i % 7) * 0.06))
            .collect();
        let pairs: Vec<(f64, f64)> = plain.iter().map(|&p| (p, p * 1.02)).collect();
        let (m, (low, high)) = paired_ratio(&pairs).unwrap();
        assert!((m - 1.02).abs() < 1e-9 && (low - 1.02).abs() < 1e-9 && (high - 1.02).abs() < 1e-9);
        // Unpaired, the same samples cannot pin the ratio down.
        let lib: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        let (ulow, uhigh) = ratio_interval(&plain, &lib).unwrap();
        assert!(uhigh - ulow > 0.05, "{ulow}-{uhigh}");
        // One round whose mode switched between its runs moves the median little.
        let mut switched = pairs.clone();
        switched[3].1 *= 1.5;
        let (m2, _) = paired_ratio(&switched).unwrap();
        assert!((m2 - 1.02).abs() < 1e-9, "{m2}");
        assert_eq!(paired_ratio(&pairs[..1]), None);
    }

    #[test]
    fn pooling_carries_the_wander_between_boots_into_the_interval() {
        // Three boots, each tight around its own level (1.00x, 1.02x, 1.04x).
        let boot = |level: f64| -> Vec<f64> {
            (0..31)
                .map(|i| level + f64::from(i % 5) * 0.001 - 0.002)
                .collect()
        };
        let boots = vec![boot(1.00), boot(1.02), boot(1.04)];
        let (m, (low, high)) = pooled_ratio(&boots).unwrap();
        assert!((m - 1.02).abs() < 1e-9, "{m}");
        // One boot alone pins its own level down to within a few thousandths ...
        let (_, (blow, bhigh)) = ratio_median(&boots[0]).unwrap();
        assert!(bhigh - blow < 0.005, "{blow}-{bhigh}");
        // ... pooled as if from one boot, the rounds would claim nearly as much; drawing boots
        // first keeps the spread between them in the interval.
        let (_, (flow, fhigh)) = ratio_median(&boots.concat()).unwrap();
        assert!(fhigh - flow < 0.025, "{flow}-{fhigh}");
        assert!(low <= 1.001 && high >= 1.039, "{low}-{high}");
        // Identical boots give the single boot's interval, so pooling costs nothing when
        // boots agree.
        let same = vec![boot(1.01), boot(1.01), boot(1.01)];
        let (_, (slow, shigh)) = pooled_ratio(&same).unwrap();
        assert!(shigh <= 1.013 && slow >= 1.007, "{slow}-{shigh}");
        // Empty boots are left out; one boot cannot be pooled.
        assert_eq!(pooled_ratio(&[boot(1.0), Vec::new()]), None);
        assert!(pooled_ratio(&[boot(1.0), Vec::new(), boot(1.0)]).is_some());
    }

    #[test]
    fn a_boots_latency_ratios_leave_out_rounds_with_a_stall() {
        let lines: Vec<String> = [
            "NPRDMA-ROUND: 1",
            "NPRDMA-METRIC: write_lat_plain 100",
            "NPRDMA-METRIC: write_lat_lib 102",
            "NPRDMA-ROUND: 2",
            "NPRDMA-METRIC: write_lat_lib 5000",
            "NPRDMA-METRIC: write_lat_plain 110",
            "NPRDMA-ROUND: 3",
            "NPRDMA-METRIC: write_lat_plain 120",
            "NPRDMA-METRIC: write_lat_lib 126",
        ]
        .iter()
        .map(|l| l.to_string())
        .collect();
        let r = latency_ratios(&lines, "write_lat_plain", "write_lat_lib");
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            (r[0] - 1.02).abs() < 1e-9 && (r[1] - 1.05).abs() < 1e-9,
            "{r:?}"
        );
    }

    #[test]
    fn the_goal_verdict_reads_the_whole_interval() {
        assert!(goal_verdict(1.02, (0.99, 1.015)).starts_with("met"));
        assert!(goal_verdict(1.02, (1.0, 1.03)).starts_with("not shown"));
        assert!(goal_verdict(1.02, (1.021, 1.05)).starts_with("missed"));
    }

    #[test]
    fn the_candidate_verdict_reads_the_whole_interval() {
        assert_eq!(candidate_verdict((0.97, 0.995)), "the candidate is faster");
        assert_eq!(candidate_verdict((0.99, 1.01)), "no difference shown");
        assert_eq!(candidate_verdict((1.001, 1.02)), "the candidate is slower");
    }

    #[test]
    fn a_candidate_build_takes_the_third_place_in_every_round() {
        // The guest script runs the candidate where it would run NPRDMA=off, and only when
        // the initramfs carries one.
        assert!(GUEST_INIT.contains("cand) pre=\"env LD_PRELOAD=$CAND\""));
        assert!(
            GUEST_INIT.contains("if [ -e $CAND ]; then K3=\"cand cand\"; else K3=\"off off\"; fi")
        );
        let lines: Vec<String> = [
            "NPRDMA-ROUND: 1",
            "NPRDMA-METRIC: write_lat_plain 100",
            "NPRDMA-METRIC: write_lat_lib 103",
            "NPRDMA-METRIC: write_lat_cand 101",
            "NPRDMA-ROUND: 2",
            "NPRDMA-METRIC: write_lat_lib 206",
            "NPRDMA-METRIC: write_lat_cand 202",
            "NPRDMA-METRIC: write_lat_plain 200",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (m, _) = paired_ratio(&round_pairs(&lines, "write_lat_lib", "write_lat_cand")).unwrap();
        assert!(
            (m - (101.0 / 103.0 + 202.0 / 206.0) / 2.0).abs() < 1e-12,
            "{m}"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn evaluation_needs_done_and_no_failure() {
        let ok: Vec<String> = [
            "NPRDMA-RXE: PASS a",
            "NPRDMA-METRIC: write_lat_plain 10",
            "NPRDMA-RXE: DONE",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert!(evaluate(&ok).is_ok());
        let fail: Vec<String> = ["NPRDMA-RXE: FAIL a server=1 client=0", "NPRDMA-RXE: DONE"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(evaluate(&fail).is_err());
        assert!(evaluate(&["NPRDMA-RXE: PASS a".to_string()]).is_err());
    }
}
