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
//!
//! With `--odp-anchor` (or only it, `--odp-only`) a second guest boots a newer Debian kernel
//! whose rxe has on-demand paging and measures pinned registration, ODP and the library side
//! by side ([`crate::rxe_odp`]). It is not part of `cargo xtask test`: under TCG on the
//! build machines it takes three to four minutes, beyond what the CI budget leaves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::guest::{
    self, Cpio, Vm, Wanted, cargo_artifacts, kernel_version, library_closure, module_order, other,
    pick_accel, read,
};
use crate::util::{XtaskError, require_tool, section, workspace_root};

/// Debian packages unpacked into the guest (besides the kernel).
const GUEST_PACKAGES: &[&str] = &[
    "busybox-static",
    "libibverbs1",
    "ibverbs-providers",
    "ibverbs-utils",
    "librdmacm1",
    "libibumad3",
    "perftest",
    "rdmacm-utils",
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
  $pre $SRV_PIN timeout ${RUN_TIMEOUT:-90} "$@" > /tmp/srv.out 2>&1 &
  spid=$!
  # SRV_WAIT: a fixed wait instead, for servers that listen through rdma_cm, not TCP.
  if [ -n "$SRV_WAIT" ]; then sleep $SRV_WAIT; else wait_listen; fi
  $pre $CLI_PIN timeout ${RUN_TIMEOUT:-90} "$@" $target > /tmp/cli.out 2>&1
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
# The library's control-connection rendezvous (docs/connectx.md §13) over rdma_cm on rxe0:
# a pair meets and exchanges a message each way; a neighbour squatting on a pair's first port
# refuses it and the pair meets on its next port; a connector whose peer never listens gives
# up at its deadline with "no listener".
ctl_case() {
  name=$1; shift
  if "$@" > /tmp/ctl.out 2>&1; then say "PASS $name"; else
    say "FAIL $name"; sed 's/^/  ctl| /' /tmp/ctl.out | tail -n 12
  fi
  sed 's/^/  /' /tmp/ctl.out | grep '^  CTL' | head -n 4
}
ctl_pair() {
  $CTL --ip 192.0.2.1 --local-qpn $1 --remote-qpn $2 --timeout-ms 15000 > /tmp/ctl.l 2>&1 &
  lp=$!
  $CTL --ip 192.0.2.1 --local-qpn $2 --remote-qpn $1 --timeout-ms 15000 > /tmp/ctl.c 2>&1
  cr=$?
  wait $lp; lr=$?
  cat /tmp/ctl.l /tmp/ctl.c
  [ $lr = 0 ] && [ $cr = 0 ]
}
ctl_squat() {
  first=$($CTL --ip 192.0.2.1 --local-qpn 0x300 --remote-qpn 0x400 --ports | head -n 1)
  $CTL --ip 192.0.2.1 --local-qpn 0x999 --remote-qpn 0x998 --squat $first --timeout-ms 12000 > /tmp/ctl.s 2>&1 &
  sp=$!
  sleep 1
  ctl_pair 0x300 0x400; pr=$?
  kill $sp 2>/dev/null; wait $sp
  cat /tmp/ctl.s
  echo "CTL first port $first"
  [ $pr = 0 ] && ! grep -q "port=$first\$" /tmp/ctl.l /tmp/ctl.c
}
CTL=/opt/nprdma/nprdma-ctl-check
if [ "$SUITE" = all ] || [ "$SUITE" = ctl ]; then
  ctl_case ctl_rendezvous ctl_pair 0x100 0x200
  ctl_case ctl_rendezvous_squatter ctl_squat
  ctl_case ctl_no_listener $CTL --ip 192.0.2.1 --local-qpn 0x600 --remote-qpn 0x500 --timeout-ms 1500 --expect-no-listener
fi
if [ "$SUITE" = ctl ]; then
  say DONE
  sync
  poweroff -f
fi
# Every perftest benchmark and rdma-core example, without the library, with it, NPRDMA=off.
if [ "$SUITE" = all ] || [ "$SUITE" = clients ]; then
  . /opt/nprdma/clients.sh
fi
if [ "$SUITE" = clients ]; then
  say DONE
  sync
  poweroff -f
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
    /// Only the real clients ([`crate::rxe_clients`]).
    pub clients_only: bool,
    /// Only the control-connection rendezvous checks (`nprdma-ctl-check`).
    pub ctl_only: bool,
    /// The clients with every perftest size (`-a`, up to 8 MiB); much longer under TCG.
    pub clients_full: bool,
    /// Only the client runs of these comma-separated names (`write_bw_rc`: all three modes)
    /// or names and modes (`write_bw_rc_lib`): a case reproduced in a single boot.
    pub client: Option<String>,
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
    /// Also boot the second kernel and measure pinned registration, ODP and the library side
    /// by side ([`crate::rxe_odp`]).
    pub odp_anchor: bool,
    /// Only that second boot.
    pub odp_only: bool,
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
            .saturating_add(per_bw_round.saturating_mul(self.bw_rounds))
            .saturating_add(self.clients_budget());
        VM_TIMEOUT.saturating_add(Duration::from_secs(extra))
    }

    /// Seconds the real clients may take: 60 runs of at most 40 s each (69 of 240 s with
    /// `--clients-full`), bounded well below that sum (most take a few seconds).
    fn clients_budget(&self) -> u64 {
        if self.compare_only {
            0
        } else if self.clients_full {
            4 * 3600
        } else {
            900
        }
    }

    /// Refuses option values no run can use.
    pub fn validate(&self) -> Result<(), XtaskError> {
        if self.rounds > MAX_ROUNDS || self.bw_rounds > MAX_ROUNDS {
            return Err(XtaskError::Usage(format!(
                "--rounds and --bw-rounds must be at most {MAX_ROUNDS} (got {} and {})",
                self.rounds, self.bw_rounds
            )));
        }
        if let Some(c) = &self.client
            && (c.is_empty()
                || !c.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b','
                }))
        {
            return Err(XtaskError::Usage(format!(
                "--client takes case names such as write_bw_rc or write_lat_rc_lib,write_bw_rc_lib (got {c:?})"
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
            clients_only: false,
            ctl_only: false,
            clients_full: false,
            client: None,
            rounds: 31,
            bw_rounds: 5,
            smp: 4,
            cmp_flags: String::new(),
            pin: true,
            candidate: None,
            boots: 1,
            odp_anchor: false,
            odp_only: false,
        }
    }
}

fn cache_dir() -> PathBuf {
    workspace_root().join("target").join("rxe")
}

/// Builds connectx in release mode and returns where cargo put `libnprdma.so`,
/// `nprdma-verbs-stress`, `nprdma-odp-anchor` and `nprdma-ctl-check`, as its build messages say (so
/// `CARGO_TARGET_DIR` or a configured target directory is honoured, and a stale copy elsewhere
/// is never booted).
fn build_connectx() -> Result<[PathBuf; 4], XtaskError> {
    let built = cargo_artifacts(
        &["--release", "-p", "connectx"],
        &[
            "libnprdma.so",
            "nprdma-verbs-stress",
            "nprdma-odp-anchor",
            "nprdma-ctl-check",
        ],
    )?;
    <[PathBuf; 4]>::try_from(built)
        .map_err(|_| other("cargo reported the wrong number of artifacts"))
}

/// Downloads the guest packages and the kernel `linux-image-amd64` depends on (cached in
/// `cache/debs`).
fn fetch_packages(cache: &Path) -> Result<Vec<PathBuf>, XtaskError> {
    let mut wanted: Vec<Wanted> = GUEST_PACKAGES.iter().map(|n| Wanted::any(*n)).collect();
    wanted.push(Wanted::any(guest::kernel_package()?));
    guest::fetch_packages(&cache.join("debs"), &wanted)
}

/// Unpacks the packages once into `stage/` and `kernel/`; returns both.
fn unpack(cache: &Path, debs: &[PathBuf]) -> Result<(PathBuf, PathBuf), XtaskError> {
    guest::unpack(cache, debs, &|name| {
        if name.starts_with("linux-image-") {
            "kernel"
        } else {
            "stage"
        }
    })?;
    Ok((cache.join("stage"), cache.join("kernel")))
}

/// One boot with the options on the kernel command line.
fn run_vm(
    qemu: &Path,
    vmlinuz: &Path,
    initrd: &Path,
    accel: &str,
    opts: &Options,
    log: &Path,
) -> Result<Vec<String>, XtaskError> {
    guest::run_vm(&Vm {
        qemu,
        vmlinuz,
        initrd,
        accel,
        smp: opts.smp,
        memory_mib: 2048,
        append: format!(
            "console=ttyS0 panic=-1 loglevel=3 iters={} cmp_iters={} stress_ops={} suite={} rounds={} bw_rounds={} cmp_flags={} pin={} clients_full={} client={}",
            opts.iters,
            opts.cmp_iters,
            opts.stress_ops,
            if opts.compare_only {
                "compare"
            } else if opts.ctl_only {
                "ctl"
            } else if opts.clients_only || opts.client.is_some() {
                "clients"
            } else {
                "all"
            },
            opts.rounds,
            opts.bw_rounds,
            opts.cmp_flags.replace(' ', ","),
            u8::from(opts.pin),
            u8::from(opts.clients_full),
            opts.client.as_deref().unwrap_or("")
        ),
        timeout: opts.vm_timeout(),
        log,
        show: |line| {
            line.starts_with("NPRDMA-") || line.starts_with("  ") || line.contains("Kernel panic")
        },
    })
}

/// Runs the whole test; fails if any guest test failed.
pub fn run(opts: &Options) -> Result<(), XtaskError> {
    let started = Instant::now();
    let qemu = require_tool("qemu-system-x86_64", "qemu-system-x86")?;
    require_tool("apt-get", "apt")?;
    require_tool("dpkg-deb", "dpkg")?;
    require_tool("ldd", "libc-bin")?;

    section("rxe: build libnprdma.so and the guest's verbs programs (release)");
    let [lib, stress, anchor, ctl] = build_connectx()?;

    section("rxe: Debian packages for the guest (cached in target/rxe)");
    let cache = cache_dir();
    let debs = fetch_packages(&cache)?;
    let (stage, kdir) = unpack(&cache, &debs)?;
    let accel = pick_accel();
    let main = if opts.odp_only {
        Ok(())
    } else {
        main_boots(
            opts,
            &qemu,
            (&stage, &kdir),
            (&lib, &stress, &ctl),
            accel,
            started,
        )
    };
    if !(opts.odp_anchor || opts.odp_only) {
        return main;
    }
    let odp = crate::rxe_odp::run(&crate::rxe_odp::Inputs {
        qemu: &qemu,
        stage: &stage,
        lib: &lib,
        anchor: &anchor,
        accel,
    });
    match (main, odp) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(XtaskError::Checks(vec![a.to_string(), b.to_string()])),
    }
}

/// The main guest's boots (Debian 12's kernel): the functional tests, the stress program, the
/// real clients and the with/without comparison.
fn main_boots(
    opts: &Options,
    qemu: &Path,
    (stage, kdir): (&Path, &Path),
    (lib, stress, ctl): (&Path, &Path, &Path),
    accel: &str,
    started: Instant,
) -> Result<(), XtaskError> {
    let cache = cache_dir();
    let kver = kernel_version(kdir)?;
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
        stage,
        kdir,
        &kver,
        lib,
        opts.candidate.as_deref(),
        (stress, ctl),
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
        let lines = match run_vm(qemu, &vmlinuz, &initrd, accel, opts, &log) {
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

fn build_initramfs(
    stage: &Path,
    kdir: &Path,
    kver: &str,
    lib: &Path,
    candidate: Option<&Path>,
    (stress, ctl): (&Path, &Path),
    out: &Path,
) -> Result<(), XtaskError> {
    let mut cpio = Cpio::new();
    let mut elfs = add_userspace(
        &mut cpio,
        stage,
        &[GUEST_BINARIES, crate::rxe_clients::CLIENT_BINARIES],
    )?;
    cpio.file("opt/nprdma/libnprdma.so", 0o755, &read(lib)?);
    // Everything copied in also brings the shared libraries it needs (library_closure).
    if let Some(c) = candidate {
        cpio.file("opt/nprdma/libnprdma-candidate.so", 0o755, &read(c)?);
        elfs.push(c.to_path_buf());
    }
    cpio.file("opt/nprdma/nprdma-verbs-stress", 0o755, &read(stress)?);
    cpio.file("opt/nprdma/nprdma-ctl-check", 0o755, &read(ctl)?);
    if let Some(bench) = std::env::var_os("NPRDMA_RXE_BENCH") {
        cpio.file("opt/nprdma/bench", 0o755, &read(Path::new(&bench))?);
        elfs.push(PathBuf::from(bench));
    }
    elfs.push(lib.to_path_buf());
    elfs.push(stress.to_path_buf());
    elfs.push(ctl.to_path_buf());
    add_libraries(&mut cpio, stage, &elfs)?;
    add_modules(&mut cpio, kdir, kver, GUEST_MODULES)?;
    cpio.file("init", 0o755, GUEST_INIT.as_bytes());
    cpio.file(
        "opt/nprdma/clients.sh",
        0o644,
        crate::rxe_clients::CLIENTS_SCRIPT.as_bytes(),
    );
    std::fs::write(out, cpio.finish()).map_err(|e| other(format!("{}: {e}", out.display())))
}

/// Adds the guest's directories, the `binaries` (paths in the unpacked packages and in the
/// guest) and the rxe provider with its driver file to `cpio`; returns the ELF files whose
/// shared libraries the guest needs (for [`add_libraries`]).
pub(crate) fn add_userspace(
    cpio: &mut Cpio,
    stage: &Path,
    binaries: &[&[(&str, &str)]],
) -> Result<Vec<PathBuf>, XtaskError> {
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
    for (src, dest) in binaries.iter().flat_map(|b| b.iter()) {
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
    Ok(elfs)
}

/// Adds the shared libraries `elfs` need, from the unpacked packages (the loader also at its
/// multiarch path).
pub(crate) fn add_libraries(
    cpio: &mut Cpio,
    stage: &Path,
    elfs: &[PathBuf],
) -> Result<(), XtaskError> {
    for (src, guest) in library_closure(stage, elfs)? {
        cpio.file(&guest, 0o755, &read(&src)?);
        if guest == "/lib64/ld-linux-x86-64.so.2" {
            cpio.file(
                "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                0o755,
                &read(&src)?,
            );
        }
    }
    Ok(())
}

/// Adds the `wanted` kernel modules of the kernel unpacked in `kdir` and their dependencies
/// (decompressed, under `lib/modules/<kver>/`), and `etc/modules.order`: the order in which
/// the guest's /init loads them, dependencies first.
pub(crate) fn add_modules(
    cpio: &mut Cpio,
    kdir: &Path,
    kver: &str,
    wanted: &[&str],
) -> Result<(), XtaskError> {
    let moddir = guest::modules_root(kdir).join(kver);
    let order = module_order(&moddir, wanted)?;
    let mut list = String::new();
    for rel in &order {
        let plain = guest::module_guest_path(rel);
        let guest = format!("lib/modules/{kver}/{}", plain.display());
        cpio.file(&guest, 0o644, &guest::read_module(&moddir.join(rel))?);
        list.push_str(&format!("{}\n", plain.display()));
    }
    cpio.file("etc/modules.order", 0o644, list.as_bytes());
    Ok(())
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
/// The library's ODP mode (docs/connectx.md §9a) on this guest's kernel, Debian 12's 6.1,
/// whose rxe has no on-demand paging: `auto` must choose windows for the device because of
/// its capabilities, without a self-test. Prints the first such line of the library's log and
/// returns what is wrong: a choice of ODP, a self-test, or library runs that logged no
/// choice at all. Reads only what the runs printed (no guest time).
fn odp_mode_on_stock_kernel(lines: &[String]) -> Vec<String> {
    let lib_lines: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("lib| nprdma["))
        .collect();
    let choices: Vec<&&String> = lib_lines
        .iter()
        .filter(|l| l.contains(": device rxe0: "))
        .collect();
    let mut failed = Vec::new();
    if let Some(first) = choices.first() {
        println!(
            "  ODP mode on this kernel: {}",
            first
                .split_once(": device ")
                .map_or(first.as_str(), |(_, r)| r)
        );
    } else if !lib_lines.is_empty() {
        failed.push("ODP mode: the library's runs logged no choice for rxe0".to_string());
    }
    for l in choices {
        if !l.contains(": windows (NPRDMA_MODE=auto)") || l.contains("self-test") {
            failed.push(format!(
                "ODP mode: rxe0 of Linux 6.1 has no ODP, but the library said: {}",
                l.trim()
            ));
        }
    }
    failed
}

fn evaluate(lines: &[String]) -> Result<(), XtaskError> {
    let mut failed = odp_mode_on_stock_kernel(lines);
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
    fn absurd_round_counts_are_refused_and_the_timeout_cannot_overflow() {
        let mut o = Options::default();
        assert_eq!(
            o.vm_timeout(),
            VM_TIMEOUT + Duration::from_secs(31 * 10 + 5 * 40 + 900)
        );
        assert!(o.validate().is_ok());
        o.cmp_iters = 1000;
        assert_eq!(
            o.vm_timeout(),
            VM_TIMEOUT + Duration::from_secs(2 * (31 * 10 + 5 * 40) + 900)
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

    #[test]
    fn on_the_stock_kernel_the_odp_mode_must_choose_windows_without_a_self_test() {
        let windows = "  lib| nprdma[88]: device rxe0: no on-demand paging reported (odp_caps.general_caps lacks IBV_ODP_SUPPORT): windows (NPRDMA_MODE=auto)";
        let start = "  lib| nprdma[88]: mode unpinned, NPRDMA_MODE=auto, pinned-memory budget 67108864 bytes (default), window 1048576 bytes";
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(odp_mode_on_stock_kernel(&l(&[start, windows])).is_empty());
        // No library runs (a comparison-only boot): nothing to check.
        assert!(odp_mode_on_stock_kernel(&l(&["NPRDMA-RXE: PASS a"])).is_empty());
        // Library runs without a choice, a choice of ODP, or a self-test: failures.
        assert_eq!(odp_mode_on_stock_kernel(&l(&[start])).len(), 1);
        let odp = "  lib| nprdma[9]: device rxe0: ODP self-test passed (RC ODP capabilities SEND): on-demand paging (NPRDMA_MODE=auto, self-test took 5 ms)";
        assert_eq!(
            odp_mode_on_stock_kernel(&l(&[start, windows, odp])).len(),
            1
        );
        let tested =
            "  lib| nprdma[9]: device rxe0: ODP self-test FAILED: x: windows (NPRDMA_MODE=auto)";
        assert_eq!(odp_mode_on_stock_kernel(&l(&[start, tested])).len(), 1);
    }
}
