//! `nprdma-ctl-check`: drives the library's control-connection rendezvous (`nprdma::ctl`) on a
//! real rdma_cm device, for `cargo xtask rxe-test` (docs/connectx.md §13).
//!
//! Both endpoints are named by IPv4 address and QP number, as a library would name them from
//! an application QP's `ibv_modify_qp(RTR)` (the GID of a RoCE v2 port over IPv4 is the
//! address, IPv4-mapped):
//!
//! - `nprdma-ctl-check --ip A --local-qpn X --remote-qpn Y [--peer-ip B]`: takes the role the
//!   pair gives this side, meets the other side, exchanges one message each way (each names
//!   the pair and its sender; both are checked) and prints `CTL ok role=.. port=..`;
//! - `--ports`: prints the pair's ports in the order both sides try them;
//! - `--squat PORT`: listens for the pair at exactly `PORT` and refuses every other pair's
//!   request there until `--timeout-ms` passes (a neighbour that took another pair's port);
//! - `--expect-no-listener`: connects and succeeds only if nobody accepts before the timeout
//!   (the peer runs without the library).
//!
//! Exit status: 0 when the expectation holds, 1 otherwise, 2 on bad arguments.

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nprdma::ctl::pair::{Endpoint, Pair, Role};
use nprdma::ctl::rendezvous::{self, Channel, CtlError, Listening, MSG_LEN, Settings};

struct Args {
    ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    local_qpn: u32,
    remote_qpn: u32,
    settings: Settings,
    timeout: Duration,
    ports: bool,
    squat: Option<u16>,
    expect_no_listener: bool,
}

fn num(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s}: {e}"))
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        ip: Ipv4Addr::LOCALHOST,
        peer_ip: Ipv4Addr::UNSPECIFIED,
        local_qpn: 0,
        remote_qpn: 0,
        settings: Settings::default(),
        timeout: Duration::from_secs(10),
        ports: false,
        squat: None,
        expect_no_listener: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--ip" => a.ip = v()?.parse().map_err(|e| format!("--ip: {e}"))?,
            "--peer-ip" => a.peer_ip = v()?.parse().map_err(|e| format!("--peer-ip: {e}"))?,
            "--local-qpn" => a.local_qpn = num(&v()?)?,
            "--remote-qpn" => a.remote_qpn = num(&v()?)?,
            "--port-base" => {
                a.settings.port_base = u16::try_from(num(&v()?)?).map_err(|e| e.to_string())?
            }
            "--port-span" => {
                a.settings.port_span = u16::try_from(num(&v()?)?).map_err(|e| e.to_string())?
            }
            "--timeout-ms" => a.timeout = Duration::from_millis(u64::from(num(&v()?)?)),
            "--ports" => a.ports = true,
            "--squat" => a.squat = Some(u16::try_from(num(&v()?)?).map_err(|e| e.to_string())?),
            "--expect-no-listener" => a.expect_no_listener = true,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.peer_ip.is_unspecified() {
        a.peer_ip = a.ip;
    }
    Ok(a)
}

/// The message a side sends: the pair's listener and connector QP numbers and the sender's.
fn message(pair: &Pair, from: u32) -> [u8; MSG_LEN] {
    let mut m = [0u8; MSG_LEN];
    m[0..4].copy_from_slice(b"PING");
    m[4..8].copy_from_slice(&pair.listener.qpn.to_be_bytes());
    m[8..12].copy_from_slice(&pair.connector.qpn.to_be_bytes());
    m[12..16].copy_from_slice(&from.to_be_bytes());
    m
}

fn exchange(
    mut c: Channel,
    role: Role,
    local: u32,
    remote: u32,
    deadline: Instant,
) -> Result<(), String> {
    let pair = c.pair();
    let mine = message(&pair, local);
    let theirs = message(&pair, remote);
    let e = |e: CtlError| e.to_string();
    // The listener sends last: it waits for its message's completion and closes; the
    // connector stays until then (`Channel::wait_closed`).
    if role == Role::Connect {
        c.send(&mine, deadline).map_err(e)?;
        let got = c.recv(deadline).map_err(e)?;
        if got != theirs {
            return Err("the listener's message is not the pair's".into());
        }
        c.wait_closed(deadline).map_err(e)?;
    } else {
        let got = c.recv(deadline).map_err(e)?;
        if got != theirs {
            return Err("the connector's message is not the pair's".into());
        }
        c.send(&mine, deadline).map_err(e)?;
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let local = Endpoint::ipv4(a.ip, a.local_qpn);
    let remote = Endpoint::ipv4(a.peer_ip, a.remote_qpn);
    let (pair, role) = Pair::new(local, remote).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + a.timeout;
    if a.ports {
        for p in pair
            .ports(a.settings.port_base, a.settings.port_span)
            .map_err(|e| e.to_string())?
        {
            println!("{p}");
        }
        return Ok(());
    }
    if let Some(port) = a.squat {
        let s = Settings {
            port_base: port,
            port_span: 1,
        };
        let l = Listening::open(pair, &s).map_err(|e| e.to_string())?;
        println!("CTL squatting port={}", l.port());
        return match l.accept(deadline) {
            Err(CtlError::Timeout(_)) => {
                println!("CTL squat done");
                Ok(())
            }
            Ok(_) => Err("the squatter's own pair connected, which no one was asked to do".into()),
            Err(e) => Err(e.to_string()),
        };
    }
    if a.expect_no_listener {
        return match rendezvous::connect(pair, &a.settings, deadline) {
            Err(CtlError::NoListener { ports, rounds }) => {
                println!("CTL ok no-listener ports={ports} rounds={rounds}");
                Ok(())
            }
            Ok(c) => Err(format!("connected on port {}", c.port())),
            Err(e) => Err(e.to_string()),
        };
    }
    let c = match role {
        Role::Listen => {
            let l = Listening::open(pair, &a.settings).map_err(|e| e.to_string())?;
            println!("CTL listening port={}", l.port());
            l.accept(deadline).map_err(|e| e.to_string())?
        }
        Role::Connect => {
            rendezvous::connect(pair, &a.settings, deadline).map_err(|e| e.to_string())?
        }
    };
    let port = c.port();
    exchange(c, role, a.local_qpn, a.remote_qpn, deadline)?;
    println!(
        "CTL ok role={} port={port}",
        if role == Role::Listen {
            "listen"
        } else {
            "connect"
        }
    );
    Ok(())
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nprdma-ctl-check: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("CTL FAIL: {e}");
            ExitCode::from(1)
        }
    }
}
