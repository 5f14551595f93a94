//! Connection limits of a van that listens on TCP (TCP, io_uring): accepted connections are
//! bounded per source address (`VANS_MAX_CONNECTIONS_PER_ADDRESS`) and in all
//! (`VANS_MAX_CONNECTIONS`); beyond a bound a new connection is closed at once and counted,
//! the ones admitted stay open, a closed one frees its place, and a peer from another address
//! still gets in. One line in a van's tests runs them:
//!
//! ```ignore
//! van_core::van_connection_limit_tests! {
//!     make: |auth| my_van::MyVan::new(my_van::Options { auth, ..Default::default() }),
//!     refused: |van: &my_van::MyVan| van.refused_connections(),
//! }
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

use super::garbage::{address, expect_closed};
use super::{check_numbered, connect, expect_message, numbered, send, start};
use crate::auth::AuthOptions;
use crate::van::Van;

/// Generates the connection-limit checks: `make` builds a van from [`AuthOptions`],
/// `refused` reads its count of refused connections.
#[macro_export]
macro_rules! van_connection_limit_tests {
    (make: $make:expr, refused: $refused:expr $(,)?) => {
        #[test]
        fn limits_one_address_cannot_take_every_place() {
            $crate::testkit::run($crate::testkit::limits::per_address(&$make, $refused));
        }

        #[test]
        fn limits_the_van_holds_at_most_its_total() {
            $crate::testkit::run($crate::testkit::limits::in_all(&$make, $refused));
        }
    };
}

/// An idle connection from `from` (a loopback address) to `target`.
async fn idle_from(from: Ipv4Addr, target: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    socket
        .connect(target)
        .await
        .unwrap_or_else(|e| panic!("connect from {from}: {e}"))
}

/// Checks that the van keeps `socket` open: nothing, not even an end, within a moment.
async fn expect_open(socket: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_millis(300), socket.read(&mut buf)).await;
    assert!(read.is_err(), "{what}: the van closed it ({read:?})");
}

/// Waits until the van has refused `want` connections.
async fn expect_refused<V>(van: &V, refused: &impl Fn(&V) -> u64, want: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while refused(van) < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} connections refused, {want} expected",
            refused(van)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Per address: an address holding its bound of idle connections gets the next closed at
/// once; a peer from another address connects and delivers; a closed connection frees its
/// place.
pub async fn per_address<V: Van + 'static>(
    make: &impl Fn(AuthOptions) -> V,
    refused: impl Fn(&V) -> u64,
) {
    const BOUND: usize = 4;
    let limited = || {
        make(AuthOptions {
            max_connections_per_address: BOUND,
            ..AuthOptions::default()
        })
    };
    let mut b = start(&limited, 8).await;
    let target = address(&b);
    let flooder = Ipv4Addr::new(127, 0, 0, 2);
    let mut held = Vec::new();
    for _ in 0..BOUND {
        held.push(idle_from(flooder, target).await);
    }
    let mut extra = Vec::new();
    for _ in 0..3 {
        extra.push(idle_from(flooder, target).await);
    }
    for socket in &mut extra {
        expect_closed(socket, "a connection beyond the address's bound").await;
    }
    expect_refused(&*b.van, &refused, 3).await;
    for socket in &mut held {
        expect_open(socket, "a connection within the bound").await;
    }
    // Another address is not held back by the first one's bound.
    let a = start(&|| make(AuthOptions::default()), 9).await;
    connect(&a, &b).await;
    send(&*a.van, numbered(9, 8, 1, 10)).await;
    check_numbered(&expect_message(&mut b.inbox).await, 9, 1);
    // A place freed by a close is taken again.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = idle_from(flooder, target).await;
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_millis(300), again.read(&mut buf)).await;
        if closed.is_err() {
            break; // kept open: the freed place was taken
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed connection never freed its place"
        );
    }
}

/// In all: a van holding its total of accepted connections closes the next at once,
/// whatever its address.
pub async fn in_all<V: Van + 'static>(
    make: &impl Fn(AuthOptions) -> V,
    refused: impl Fn(&V) -> u64,
) {
    const TOTAL: usize = 3;
    let limited = || {
        make(AuthOptions {
            max_connections: TOTAL,
            ..AuthOptions::default()
        })
    };
    let b = start(&limited, 8).await;
    let target = address(&b);
    let mut held = Vec::new();
    for i in 0..TOTAL {
        let from = Ipv4Addr::new(127, 0, 0, 2 + i as u8);
        held.push(idle_from(from, target).await);
    }
    let mut beyond = idle_from(Ipv4Addr::new(127, 0, 0, 9), target).await;
    expect_closed(&mut beyond, "a connection beyond the van's total").await;
    expect_refused(&*b.van, &refused, 1).await;
    for socket in &mut held {
        expect_open(socket, "a connection within the total").await;
    }
}
