//! The real-client part of `cargo xtask rxe-test`: every perftest benchmark Soft-RoCE
//! supports and rdma-core's example programs with their data checks, each run without the
//! library, with it and with `NPRDMA=off` (docs/connectx.md §12). The rule it checks: the
//! library never breaks a program that works without it (no error plain verbs would not
//! give, no hang). A run that does not finish within its timeout (40 s under TCG, where the
//! slowest default run takes about 15 s; 240 s with `--clients-full`) counts as a hang.

/// Guest programs for the clients (paths inside the unpacked packages) and where they go.
pub const CLIENT_BINARIES: &[(&str, &str)] = &[
    ("usr/bin/ibv_uc_pingpong", "usr/bin/ibv_uc_pingpong"),
    ("usr/bin/ibv_ud_pingpong", "usr/bin/ibv_ud_pingpong"),
    ("usr/bin/ib_read_bw", "usr/bin/ib_read_bw"),
    ("usr/bin/ib_send_bw", "usr/bin/ib_send_bw"),
    ("usr/bin/ib_atomic_lat", "usr/bin/ib_atomic_lat"),
    ("usr/bin/ib_atomic_bw", "usr/bin/ib_atomic_bw"),
    ("usr/bin/rping", "usr/bin/rping"),
];

/// The guest script, sourced by /init (it uses /init's `run`, `say`, `$L`, `$GIDX`, `arg`).
///
/// perftest: `-a` runs every size from 2 bytes to 2^23 (8 MiB), `-n 5` is the least number
/// of iterations it takes (and caps the send-queue depth at 5). UC is offered by write and
/// send, UD by send (perftest's usage); read and atomics are RC only. By default the runs use
/// 1 or 2 MiB (RC), 64 KiB (UC) or 512 B (UD, whose messages end at the MTU);
/// `--clients-full` runs all with `-a`, and adds `ib_write_bw -s 4M -n 128` (its default
/// send-queue depth of 128 in flight: the case where split WRITEs filled the send queue) and
/// the 16 MiB UC and SRQ pingpongs. rdma-core's pingpongs
/// run with `-c` (they check every received byte), `ibv_rc_pingpong` also with 16 MiB
/// messages; `rping -V` checks its data too (its largest buffer is 64 KiB).
pub const CLIENTS_SCRIPT: &str = r#"
# clients.sh: real clients, each without the library, with it and with NPRDMA=off.
# clients_full=1: every perftest benchmark with -a (2 B to 8 MiB) and the 16 MiB pingpongs of
# every kind; otherwise sizes that cross 1 MiB windows (2 MiB: three windows, more than the
# two SGEs a perftest receive gets) and one 16 MiB pingpong, which keeps the step within a
# few minutes under TCG (rxe moves a few MB/s there: ib_write_bw -a alone takes 40 s).
FULL=$(arg clients_full)
# client=NAME[,NAME...] (`--client`): only the runs named NAME (all three modes) or NAME_MODE.
ONLY=$(arg client)
if [ "$FULL" = 1 ]; then
  LAT=-a; BW=-a; SMALL=-a; UD=-a; CT=240
else
  LAT="-s 1048576"; BW="-s 2097152"; SMALL="-s 65536"; UD="-s 512"; CT=40
fi
now() { cut -d' ' -f1 /proc/uptime; }
# trio NAME TARGET CMD...: three runs of CMD (server and client), timed; a run that does not
# finish within CT seconds is killed and fails (a hang).
trio() {
  tname=$1; ttarget=$2; shift 2
  for tmode in none lib off; do
    if [ -n "$ONLY" ]; then
      case ",$ONLY," in *",$tname,"* | *",${tname}_$tmode,"*) ;; *) continue ;; esac
    fi
    t0=$(now)
    RUN_TIMEOUT=$CT run client_${tname}_$tmode $tmode $ttarget "$@"
    say "TIME client_${tname}_$tmode $(awk -v a=$t0 -v b=$(now) 'BEGIN {printf "%.1f", b - a}') s"
  done
}
C0=$(now)
P="-d rxe0 -x $GIDX -F -n 5"
trio write_lat_rc $L ib_write_lat $P $LAT
trio write_lat_uc $L ib_write_lat $P $SMALL -c UC
trio write_bw_rc $L ib_write_bw $P $BW
trio write_bw_uc $L ib_write_bw $P $SMALL -c UC
trio read_lat_rc $L ib_read_lat $P $LAT
trio read_bw_rc $L ib_read_bw $P $BW
trio send_lat_rc $L ib_send_lat $P $BW
trio send_lat_uc $L ib_send_lat $P $SMALL -c UC
trio send_lat_ud $L ib_send_lat $P $UD -c UD
trio send_bw_rc $L ib_send_bw $P $BW
trio send_bw_uc $L ib_send_bw $P $SMALL -c UC
trio send_bw_ud $L ib_send_bw $P $UD -c UD
trio atomic_lat_rc $L ib_atomic_lat $P
trio atomic_bw_rc $L ib_atomic_bw $P
G="-d rxe0 -g $GIDX -c"
trio rc_pingpong_4k $L ibv_rc_pingpong $G -n 10
trio rc_pingpong_16m $L ibv_rc_pingpong $G -n 1 -s 16777216
trio uc_pingpong_4k $L ibv_uc_pingpong $G -n 10
trio ud_pingpong_512 $L ibv_ud_pingpong $G -n 10 -s 512
trio srq_pingpong_4k $L ibv_srq_pingpong $G -n 5
if [ "$FULL" = 1 ]; then
  # The whole default send-queue depth (128) of 4 MiB WRITEs in flight: five windows each.
  trio write_bw_rc_4m_depth128 $L ib_write_bw -d rxe0 -x $GIDX -F -s 4194304 -n 128
  trio uc_pingpong_16m $L ibv_uc_pingpong $G -n 1 -s 16777216
  trio srq_pingpong_16m $L ibv_srq_pingpong $G -n 1 -q 2 -s 16777216
fi
# rdma_cm: the server waits a fixed time; the client is the server's command plus -c
# (rping's last -s/-c wins).
SRV_WAIT=1.5
trio rping_64k -c rping -s -a 192.0.2.1 -V -C 5 -S 65000
SRV_WAIT=
say "TIME clients $(awk -v a=$C0 -v b=$(now) 'BEGIN {printf "%.0f", b - a}') s"
"#;
