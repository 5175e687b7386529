//! Who meets whom for the library's control connection, and where: pure rules, no I/O.
//!
//! Two libraries whose applications connected an RC QP pair need a connection of their own
//! (docs/connectx.md §13): the application's QP is the application's, and nothing else names
//! the peer process. What both sides know after `ibv_modify_qp(RTR)` is the *pair*: the two
//! QPs' GIDs and numbers (`ah_attr.grh` gives the peer's GID and the local GID index,
//! `dest_qp_num` the peer's QP number). Everything here is a function of the pair, so both
//! sides compute the same answer without talking:
//!
//! - the side whose endpoint orders first (GID bytes, then QP number) *listens*, the other
//!   *connects* (one control connection per application connection, used both ways);
//! - the listener binds an rdma_cm port of the librdmacm TCP port space at its GID's IP
//!   address; the port is derived from a hash of the pair, and when that port is taken (another
//!   connection of this host hashed there) the next ones are tried, [`PROBES`] in all;
//! - the connector tries the same ports in the same order; private data in the connection
//!   request names the pair, and a listener accepts only its own pair (a listener of another
//!   pair refuses with [`Refusal::NotMine`], and the connector tries the next port).
//!
//! The GID must carry an IP address (RoCE v2: an IPv4-mapped or an IPv6 GID): rdma_cm resolves
//! routes from IP addresses on RoCE (the `AF_IB` address family of `rdma_cma.h` is for
//! InfiniBand link layers only). Other GIDs get [`PairError::NoIpAddress`], and the connection
//! falls back as docs/connectx.md §13 says.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use protocol::crc32c;

/// How many ports a pair may use, starting at its hashed one.
pub const PROBES: u16 = 8;

/// The first port of the range the control connections use (default): "NP" in ASCII.
pub const DEFAULT_PORT_BASE: u16 = 0x4E50;

/// The number of ports in the range (default).
pub const DEFAULT_PORT_SPAN: u16 = 4096;

/// One side of an application connection: the GID its QP uses and its QP number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The GID (16 bytes, network order).
    pub gid: [u8; 16],
    /// The QP number (24 bits).
    pub qpn: u32,
}

impl Endpoint {
    /// The endpoint whose GID is `ip` IPv4-mapped (the GID of a RoCE v2 port over IPv4).
    pub fn ipv4(ip: Ipv4Addr, qpn: u32) -> Self {
        Endpoint {
            gid: ip.to_ipv6_mapped().octets(),
            qpn,
        }
    }

    /// The IP address of the GID: an IPv4-mapped GID (`::ffff:a.b.c.d`, RoCE v2 over IPv4)
    /// gives the IPv4 address, a global or unique-local IPv6 GID (RoCE v2 over IPv6) itself.
    /// Link-local GIDs (`fe80::/64`: RoCE v1, InfiniBand port GIDs) and the unspecified
    /// address name no IP endpoint that rdma_cm could route to.
    pub fn ip(&self) -> Result<IpAddr, PairError> {
        let v6 = Ipv6Addr::from(self.gid);
        if let Some(v4) = v6.to_ipv4_mapped() {
            if v4 == Ipv4Addr::UNSPECIFIED {
                return Err(PairError::NoIpAddress(*self));
            }
            return Ok(IpAddr::V4(v4));
        }
        let s = v6.segments();
        if v6.is_unspecified() || (s[0] & 0xffc0) == 0xfe80 || v6.is_multicast() {
            return Err(PairError::NoIpAddress(*self));
        }
        Ok(IpAddr::V6(v6))
    }
}

/// What may go wrong before any packet is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairError {
    /// The endpoint's GID carries no routable IP address (RoCE v1 or InfiniBand).
    #[error("GID of QP {:#x} carries no IP address (RoCE v1 or InfiniBand)", .0.qpn)]
    NoIpAddress(Endpoint),
    /// Both sides are the same endpoint (a QP connected to itself needs no control connection).
    #[error("QP {:#x} is connected to itself", .0.qpn)]
    SameEndpoint(Endpoint),
    /// The port range is empty or runs past 65535.
    #[error("control port range {base}+{span} is not a range of TCP ports")]
    BadPortRange {
        /// First port.
        base: u16,
        /// Number of ports.
        span: u16,
    },
}

/// Which part this side plays for a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// This side binds a port and waits.
    Listen,
    /// This side connects to the other's port.
    Connect,
}

/// The two endpoints of an application connection, in the order both sides agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pair {
    /// The endpoint that listens (orders first).
    pub listener: Endpoint,
    /// The endpoint that connects.
    pub connector: Endpoint,
}

impl Pair {
    /// The pair of `local` and `remote`, and this side's role in it.
    pub fn new(local: Endpoint, remote: Endpoint) -> Result<(Pair, Role), PairError> {
        if local == remote {
            return Err(PairError::SameEndpoint(local));
        }
        local.ip()?;
        remote.ip()?;
        Ok(if local < remote {
            (
                Pair {
                    listener: local,
                    connector: remote,
                },
                Role::Listen,
            )
        } else {
            (
                Pair {
                    listener: remote,
                    connector: local,
                },
                Role::Connect,
            )
        })
    }

    fn bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..16].copy_from_slice(&self.listener.gid);
        b[16..20].copy_from_slice(&self.listener.qpn.to_be_bytes());
        b[20..36].copy_from_slice(&self.connector.gid);
        b[36..40].copy_from_slice(&self.connector.qpn.to_be_bytes());
        b
    }

    /// The ports to try, in order: the hashed port of the pair within `[base, base + span)`,
    /// then the next ones (wrapping inside the range), [`PROBES`] at most (fewer if the range
    /// is smaller).
    pub fn ports(&self, base: u16, span: u16) -> Result<Vec<u16>, PairError> {
        if span == 0 || u32::from(base) + u32::from(span) > 65536 || base == 0 {
            return Err(PairError::BadPortRange { base, span });
        }
        let first = crc32c(&self.bytes()) % u32::from(span);
        let n = u32::from(PROBES.min(span));
        Ok((0..n)
            .map(|k| {
                let off = (first + k) % u32::from(span);
                // base + off < 65536 by the range check above.
                (u32::from(base) + off) as u16
            })
            .collect())
    }

    /// The listener's socket address on `port`.
    pub fn listen_addr(&self, port: u16) -> Result<SocketAddr, PairError> {
        Ok(SocketAddr::new(self.listener.ip()?, port))
    }
}

/// Private data of the connection request: which pair the connector means.
pub const HELLO_LEN: usize = 52;
/// Private data of an acceptance or a refusal.
pub const ANSWER_LEN: usize = 16;

const HELLO_MAGIC: u32 = 0x4E50_4331; // "NPC1"
const ANSWER_MAGIC: u32 = 0x4E50_4341; // "NPCA"
const VERSION: u8 = 1;

/// Why a listener refused a connection request (in the refusal's private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The request names another pair: this port belongs to another connection.
    NotMine,
    /// The request is not a library hello this side understands.
    Malformed,
}

impl Refusal {
    fn code(self) -> u8 {
        match self {
            Refusal::NotMine => 1,
            Refusal::Malformed => 2,
        }
    }
}

/// What a listener answered, decoded from the private data of an acceptance or refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The listener accepted this pair.
    Accepted,
    /// The listener refused, for this reason.
    Refused(Refusal),
}

/// The connection request's private data for `pair`.
pub fn encode_hello(pair: &Pair) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..4].copy_from_slice(&HELLO_MAGIC.to_be_bytes());
    b[4] = VERSION;
    b[8..48].copy_from_slice(&pair.bytes());
    let crc = crc32c(&b[0..48]);
    b[48..52].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The pair a connection request names. The transport may deliver more bytes than were sent
/// (an InfiniBand CM REQ carries a fixed-size private data field), so only the first
/// [`HELLO_LEN`] count.
pub fn decode_hello(b: &[u8]) -> Option<Pair> {
    let b = b.get(..HELLO_LEN)?;
    if b[0..4] != HELLO_MAGIC.to_be_bytes() || b[4] != VERSION || b[5..8] != [0, 0, 0] {
        return None;
    }
    if crc32c(&b[0..48]).to_be_bytes() != b[48..52] {
        return None;
    }
    let gid = |o: usize| -> [u8; 16] {
        let mut g = [0u8; 16];
        g.copy_from_slice(&b[o..o + 16]);
        g
    };
    let qpn = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    Some(Pair {
        listener: Endpoint {
            gid: gid(8),
            qpn: qpn(24),
        },
        connector: Endpoint {
            gid: gid(28),
            qpn: qpn(44),
        },
    })
}

/// The private data of the listener's answer to `pair`'s request.
pub fn encode_answer(pair: &Pair, answer: Answer) -> [u8; ANSWER_LEN] {
    let mut b = [0u8; ANSWER_LEN];
    b[0..4].copy_from_slice(&ANSWER_MAGIC.to_be_bytes());
    b[4] = VERSION;
    b[5] = match answer {
        Answer::Accepted => 0,
        Answer::Refused(r) => r.code(),
    };
    // The answer is bound to the request: a stale answer for another pair does not decode.
    let tag = crc32c(&pair.bytes());
    b[8..12].copy_from_slice(&tag.to_be_bytes());
    let crc = crc32c(&b[0..12]);
    b[12..16].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The listener's answer to `pair`'s request, if `b` is one.
pub fn decode_answer(pair: &Pair, b: &[u8]) -> Option<Answer> {
    let b = b.get(..ANSWER_LEN)?;
    if b[0..4] != ANSWER_MAGIC.to_be_bytes() || b[4] != VERSION || b[6..8] != [0, 0] {
        return None;
    }
    if crc32c(&b[0..12]).to_be_bytes() != b[12..16]
        || crc32c(&pair.bytes()).to_be_bytes() != b[8..12]
    {
        return None;
    }
    match b[5] {
        0 => Some(Answer::Accepted),
        1 => Some(Answer::Refused(Refusal::NotMine)),
        2 => Some(Answer::Refused(Refusal::Malformed)),
        _ => None,
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip() {
            Ok(ip) => write!(f, "{ip}/qp{:#x}", self.qpn),
            Err(_) => write!(f, "{}/qp{:#x}", Ipv6Addr::from(self.gid), self.qpn),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(a: [u8; 4], qpn: u32) -> Endpoint {
        Endpoint::ipv4(Ipv4Addr::from(a), qpn)
    }

    #[test]
    fn both_sides_agree_on_roles_and_ports() {
        let a = v4([192, 0, 2, 1], 0x11);
        let b = v4([192, 0, 2, 1], 0x12);
        let (pa, ra) = Pair::new(a, b).unwrap();
        let (pb, rb) = Pair::new(b, a).unwrap();
        assert_eq!(pa, pb);
        assert_eq!((ra, rb), (Role::Listen, Role::Connect));
        let ports = pa.ports(DEFAULT_PORT_BASE, DEFAULT_PORT_SPAN).unwrap();
        assert_eq!(
            ports,
            pb.ports(DEFAULT_PORT_BASE, DEFAULT_PORT_SPAN).unwrap()
        );
        assert_eq!(ports.len(), usize::from(PROBES));
        for p in &ports {
            assert!((DEFAULT_PORT_BASE..DEFAULT_PORT_BASE + DEFAULT_PORT_SPAN).contains(p));
        }
        assert_eq!(
            pa.listen_addr(ports[0]).unwrap(),
            "192.0.2.1:0"
                .parse::<SocketAddr>()
                .map(|mut s| {
                    s.set_port(ports[0]);
                    s
                })
                .unwrap()
        );
    }

    #[test]
    fn ports_wrap_inside_a_small_range_and_bad_ranges_are_refused() {
        let (p, _) = Pair::new(v4([10, 0, 0, 1], 1), v4([10, 0, 0, 2], 2)).unwrap();
        let ports = p.ports(65533, 3).unwrap();
        assert_eq!(ports.len(), 3);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![65533, 65534, 65535]);
        assert!(matches!(
            p.ports(65535, 2),
            Err(PairError::BadPortRange { .. })
        ));
        assert!(matches!(
            p.ports(100, 0),
            Err(PairError::BadPortRange { .. })
        ));
        assert!(matches!(
            p.ports(0, 10),
            Err(PairError::BadPortRange { .. })
        ));
    }

    #[test]
    fn gids_without_an_ip_address_are_refused() {
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[8] = 0x02;
        let roce_v1 = Endpoint { gid: ll, qpn: 5 };
        assert_eq!(roce_v1.ip(), Err(PairError::NoIpAddress(roce_v1)));
        let zero = Endpoint {
            gid: [0; 16],
            qpn: 5,
        };
        assert!(zero.ip().is_err());
        let mapped_zero = v4([0, 0, 0, 0], 5);
        assert!(mapped_zero.ip().is_err());
        assert!(Pair::new(roce_v1, v4([10, 0, 0, 2], 2)).is_err());
        let mut g6 = [0u8; 16];
        g6[0] = 0x20;
        g6[1] = 0x01;
        g6[2] = 0x0d;
        g6[3] = 0xb8;
        g6[15] = 1;
        let v6 = Endpoint { gid: g6, qpn: 9 };
        assert_eq!(v6.ip().unwrap(), "2001:db8::1".parse::<IpAddr>().unwrap());
        let a = v4([10, 0, 0, 1], 7);
        assert_eq!(Pair::new(a, a), Err(PairError::SameEndpoint(a)));
    }

    #[test]
    fn hello_and_answers_round_trip_and_are_bound_to_their_pair() {
        let (p, _) = Pair::new(v4([10, 0, 0, 1], 0x123456), v4([10, 0, 0, 2], 0x42)).unwrap();
        let (other, _) = Pair::new(v4([10, 0, 0, 1], 0x123456), v4([10, 0, 0, 2], 0x43)).unwrap();
        let hello = encode_hello(&p);
        assert_eq!(decode_hello(&hello), Some(p));
        // An InfiniBand CM REQ pads the private data: trailing bytes do not count.
        let mut padded = hello.to_vec();
        padded.extend_from_slice(&[0xAA; 4]);
        assert_eq!(decode_hello(&padded), Some(p));
        assert_eq!(decode_hello(&hello[..HELLO_LEN - 1]), None);
        for ans in [
            Answer::Accepted,
            Answer::Refused(Refusal::NotMine),
            Answer::Refused(Refusal::Malformed),
        ] {
            let b = encode_answer(&p, ans);
            assert_eq!(decode_answer(&p, &b), Some(ans));
            assert_eq!(decode_answer(&other, &b), None, "bound to its pair");
        }
    }

    proptest! {
        #[test]
        fn any_flipped_bit_of_a_hello_or_answer_is_caught(byte in 0usize..HELLO_LEN, bit in 0u8..8) {
            let (p, _) = Pair::new(v4([10, 0, 0, 1], 77), v4([10, 0, 0, 9], 78)).unwrap();
            let mut h = encode_hello(&p);
            h[byte] ^= 1 << bit;
            prop_assert_eq!(decode_hello(&h), None);
            let mut a = encode_answer(&p, Answer::Accepted);
            a[byte % ANSWER_LEN] ^= 1 << bit;
            prop_assert_eq!(decode_answer(&p, &a), None);
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let (p, _) = Pair::new(v4([10, 0, 0, 1], 77), v4([10, 0, 0, 9], 78)).unwrap();
            let _ = decode_hello(&b);
            let _ = decode_answer(&p, &b);
        }
    }
}
