//! What a second thread costs an application's system calls on descriptors, and what the
//! helper thread's private descriptor table (`nprdma::fdtable`) gives back: one-byte `write`s
//! to /dev/null (rxe's `ibv_post_send` rings its doorbell with one such `write`) measured
//! single-threaded, then beside an idle thread that shares the table, then beside the same
//! thread after it detached, alternating threads so that each kind is measured several
//! times. Printed, not asserted: `cargo bench -p connectx --bench descriptor_table` (and inside
//! the rxe guest with `NPRDMA_RXE_BENCH=<this bench's binary>`, where the emulator multiplies
//! the atomic operations' cost).
//!
//! Once any thread has been created, glibc keeps its cancellation bookkeeping on for good, so
//! "single" runs first and cannot be repeated; "shared" against "private" is the difference the
//! library can make.

use std::sync::mpsc;
use std::time::Instant;

use nprdma::fdtable::PrivateTable;

/// Best of 7 runs of `n` writes: (ns, TSC cycles) per write.
fn per_write(fd: i32, n: u32) -> (f64, f64) {
    let mut best = (f64::MAX, f64::MAX);
    for _ in 0..7 {
        let t = Instant::now();
        // SAFETY: reads the time-stamp counter, which has no preconditions on x86_64.
        let c = unsafe { core::arch::x86_64::_rdtsc() };
        for _ in 0..n {
            // SAFETY: writes one byte from a live buffer to a descriptor this bench owns.
            let w = unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
            assert_eq!(w, 1);
        }
        // SAFETY: as above.
        let cycles = (unsafe { core::arch::x86_64::_rdtsc() } - c) as f64 / f64::from(n);
        let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
        if ns < best.0 {
            best = (ns, cycles);
        }
    }
    best
}

/// An idle thread: shares the table until told to detach, then waits to be ended.
struct Idle {
    detach: mpsc::Sender<()>,
    detached: mpsc::Receiver<bool>,
    end: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

fn idle_thread() -> Idle {
    let (detach_tx, detach_rx) = mpsc::channel();
    let (detached_tx, detached_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        if detach_rx.recv().is_err() {
            return;
        }
        let table = PrivateTable::detach();
        let _ = detached_tx.send(table.is_ok());
        let _ = end_rx.recv();
        drop(table);
    });
    Idle {
        detach: detach_tx,
        detached: detached_rx,
        end: end_tx,
        thread,
    }
}

fn main() {
    let n: u32 = std::env::var("NPRDMA_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000)
        .clamp(1_000, 10_000_000);
    // SAFETY: opens /dev/null with a NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "cannot open /dev/null");
    let single = per_write(fd, n);
    println!(
        "descriptor_table: write(2) single-threaded   {:7.1} ns {:7.0} cycles",
        single.0, single.1
    );
    let (mut shared, mut private) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = idle_thread();
        shared.push(per_write(fd, n));
        t.detach.send(()).expect("the idle thread waits");
        if !t.detached.recv().unwrap_or(false) {
            println!("descriptor_table: this kernel cannot give a thread a private table");
            return;
        }
        private.push(per_write(fd, n));
        let _ = t.end.send(());
        let _ = t.thread.join();
    }
    let median = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let (s, p) = (median(&mut shared), median(&mut private));
    println!(
        "descriptor_table: beside a thread, shared    {:7.1} ns {:7.0} cycles ({:.3}x single)",
        s.0,
        s.1,
        s.0 / single.0
    );
    println!(
        "descriptor_table: beside a thread, private   {:7.1} ns {:7.0} cycles ({:.3}x single, {:.3}x shared)",
        p.0,
        p.1,
        p.0 / single.0,
        p.0 / s.0
    );
}
