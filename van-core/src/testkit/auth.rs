//! Authentication checks. For every van: the same secret connects, a wrong or missing one is
//! refused on both sides and counted. For a van that listens on TCP (TCP, io_uring, the RDMA
//! side channel): a raw frame from a socket that never authenticated is not delivered, and a
//! flood of idle connections from one address neither holds the listener nor keeps a real
//! peer out. One line in a van's tests runs them:
//!
//! ```ignore
//! van_core::van_auth_tests! {
//!     make: |auth| my_van::MyVan::new(my_van::Options { auth, ..Default::default() }),
//!     refused: |van: &my_van::MyVan| van.refused_connections(),
//!     tcp_listener: true,
//! }
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use super::garbage::{address, expect_closed, valid_frame};
use super::{
    check_numbered, connect, expect_message, expect_peer_lost, expect_quiet, numbered, send, start,
    WAIT,
};
use crate::auth::{AuthError, AuthOptions, ClusterSecret};
use crate::van::{Van, VanError};

/// Generates the authentication checks: `make` builds a van from [`AuthOptions`],
/// `refused` reads its count of refused connections; optionally behind a guard
/// (`requires: fn() -> bool`, as for [`van_conformance_tests!`](crate::van_conformance_tests)).
#[macro_export]
macro_rules! van_auth_tests {
    (make: $make:expr, refused: $refused:expr, tcp_listener: $tcp:ident $(,)?) => {
        $crate::van_auth_tests!(
            make: $make,
            refused: $refused,
            tcp_listener: $tcp,
            requires: $crate::testkit::always,
        );
    };
    (make: $make:expr, refused: $refused:expr, tcp_listener: false,
     requires: $requires:expr $(,)?) => {
        #[test]
        fn auth_the_same_secret_connects_both_ways() {
            if !($requires)() {
                return;
            }
            $crate::testkit::run($crate::testkit::auth::the_same_secret_connects(&$make));
        }

        #[test]
        fn auth_a_wrong_or_missing_secret_is_refused_on_both_sides() {
            if !($requires)() {
                return;
            }
            $crate::testkit::run($crate::testkit::auth::wrong_or_missing_secret_is_refused(
                &$make, $refused,
            ));
        }
    };
    (make: $make:expr, refused: $refused:expr, tcp_listener: true,
     requires: $requires:expr $(,)?) => {
        $crate::van_auth_tests!(
            make: $make,
            refused: $refused,
            tcp_listener: false,
            requires: $requires,
        );

        #[test]
        fn auth_a_frame_from_an_unauthenticated_socket_is_never_delivered() {
            if !($requires)() {
                return;
            }
            $crate::testkit::run($crate::testkit::auth::raw_frames_are_not_delivered(
                &$make, $refused,
            ));
        }

        #[test]
        fn auth_a_flood_of_idle_connections_does_not_keep_a_peer_out() {
            if !($requires)() {
                return;
            }
            $crate::testkit::run($crate::testkit::auth::idle_flood_does_not_keep_a_peer_out(
                &$make, $refused,
            ));
        }
    };
}

fn secret(s: &str) -> Option<ClusterSecret> {
    Some(ClusterSecret::new(s).unwrap_or_else(|e| panic!("test secret: {e}")))
}

fn options(secret: Option<ClusterSecret>) -> AuthOptions {
    AuthOptions {
        secret,
        handshake_timeout: Duration::from_millis(500),
        ..AuthOptions::default()
    }
}

/// Waits until the van has counted `n` refusals (each side finishes the handshake on its
/// own: the dialer may know before the acceptor has counted); fails on more, or after
/// [`WAIT`].
async fn expect_refusals<V>(refused: &impl Fn(&V) -> u64, van: &V, n: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while refused(van) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} refusals counted, {n} expected",
            refused(van)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(refused(van), n, "more refusals than connections refused");
}

const ONE: &str = "cluster-secret-number-one";
const TWO: &str = "cluster-secret-number-two";

/// Two vans with the same secret exchange messages both ways.
pub async fn the_same_secret_connects<V: Van + 'static>(make: &impl Fn(AuthOptions) -> V) {
    let make = || make(options(secret(ONE)));
    let mut a = start(&make, 9).await;
    let mut b = start(&make, 8).await;
    connect(&a, &b).await;
    send(&*a.van, numbered(9, 8, 1, 100)).await;
    check_numbered(&expect_message(&mut b.inbox).await, 9, 1);
    send(&*b.van, numbered(8, 9, 2, 100)).await;
    check_numbered(&expect_message(&mut a.inbox).await, 8, 2);
}

/// A dialer with another secret, or with none, reaches nothing: its connect fails (or, for a
/// stream van, whose dial without a secret needs no answer, its frames are dropped unread and
/// it is told the peer is lost), the acceptor counts the refusal and delivers nothing; an
/// acceptor without a secret makes a dialer with one fail to connect.
pub async fn wrong_or_missing_secret_is_refused<V: Van + 'static>(
    make: &impl Fn(AuthOptions) -> V,
    refused: impl Fn(&V) -> u64,
) {
    let mut b = start(&|| make(options(secret(ONE))), 8).await;

    // Another secret: refused on both sides, and said so.
    let a = start(&|| make(options(secret(TWO))), 9).await;
    match tokio::time::timeout(WAIT, a.van.connect(&b.node)).await {
        Ok(Err(VanError::Unauthenticated { source, .. })) => {
            assert!(matches!(source, AuthError::WrongSecret), "{source}")
        }
        other => panic!("a wrong secret connected: {other:?}"),
    }
    expect_refusals(&refused, &b.van, 1).await;

    // No secret: the dialer does not authenticate, so its connect succeeds locally, but the
    // acceptor reads a frame where a hello belongs, refuses it, and delivers nothing.
    let mut c = start(&|| make(options(None)), 11).await;
    match tokio::time::timeout(WAIT, c.van.connect(&b.node)).await {
        Ok(Ok(())) => {
            let _ = c.van.send(numbered(11, 8, 1, 100)).await;
            expect_peer_lost(&mut c.inbox, 8).await;
        }
        Ok(Err(_)) => {} // a van whose handshake needs the acceptor's answer
        Err(_) => panic!("connecting without a secret neither failed nor finished"),
    }
    expect_refusals(&refused, &b.van, 2).await;
    expect_quiet(&mut b.inbox, Duration::from_millis(300)).await;

    // An acceptor without a secret: a dialer with one fails to connect.
    let d = start(&|| make(options(None)), 10).await;
    let e = start(&|| make(options(secret(ONE))), 13).await;
    match tokio::time::timeout(WAIT, e.van.connect(&d.node)).await {
        Ok(Err(VanError::Unauthenticated { .. })) => {}
        other => panic!("connected to a node without a secret: {other:?}"),
    }
}

/// A socket that sends a well-formed frame without authenticating is closed, and the frame
/// never reaches the inbox.
pub async fn raw_frames_are_not_delivered<V: Van + 'static>(
    make: &impl Fn(AuthOptions) -> V,
    refused: impl Fn(&V) -> u64,
) {
    let mut b = start(&|| make(options(secret(ONE))), 8).await;
    let mut socket = TcpStream::connect(address(&b))
        .await
        .unwrap_or_else(|e| panic!("cannot dial: {e}"));
    socket
        .write_all(&valid_frame())
        .await
        .unwrap_or_else(|e| panic!("cannot write: {e}"));
    expect_closed(&mut socket, "an unauthenticated frame").await;
    expect_quiet(&mut b.inbox, Duration::from_millis(300)).await;
    expect_refusals(&refused, &b.van, 1).await;
}

/// 40 idle connections from 127.0.0.2: beyond the per-address bound they are closed at once,
/// the rest when the handshake times out; meanwhile a real peer on 127.0.0.1 connects and
/// delivers.
pub async fn idle_flood_does_not_keep_a_peer_out<V: Van + 'static>(
    make: &impl Fn(AuthOptions) -> V,
    refused: impl Fn(&V) -> u64,
) {
    const FLOOD: usize = 40;
    const BOUND: usize = 4;
    // A handshake timeout long enough that only the bound can explain quick refusals.
    let with_bound = || {
        make(AuthOptions {
            max_pending_per_address: BOUND,
            handshake_timeout: Duration::from_secs(5),
            ..options(secret(ONE))
        })
    };
    let mut b = start(&with_bound, 8).await;
    let target = address(&b);
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let socket = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
        socket
            .bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 0))
            .unwrap_or_else(|e| panic!("bind 127.0.0.2: {e}"));
        flood.push(
            socket
                .connect(target)
                .await
                .unwrap_or_else(|e| panic!("flood connect: {e}")),
        );
    }
    // Beyond the bound the flood is refused at once, long before the handshake timeout.
    let quick = tokio::time::Instant::now() + Duration::from_secs(2);
    while refused(&b.van) < (FLOOD - BOUND) as u64 {
        assert!(
            tokio::time::Instant::now() < quick,
            "{} of {FLOOD} idle connections refused at once; {} expected",
            refused(&b.van),
            FLOOD - BOUND
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let a = start(&|| make(options(secret(ONE))), 9).await;
    connect(&a, &b).await;
    send(&*a.van, numbered(9, 8, 1, 10)).await;
    check_numbered(&expect_message(&mut b.inbox).await, 9, 1);
    for socket in &mut flood {
        expect_closed(socket, "an idle connection of the flood").await;
    }
    expect_refusals(&refused, &b.van, FLOOD as u64).await;
}
