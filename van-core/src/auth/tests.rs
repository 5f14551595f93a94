#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};

use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

use super::*;

fn secret(s: &str) -> ClusterSecret {
    ClusterSecret::new(s).unwrap()
}

fn gate(secret: Option<ClusterSecret>, handshake_timeout: Duration) -> Gate {
    Gate::new(AuthOptions {
        secret,
        handshake_timeout,
        ..AuthOptions::default()
    })
}

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

async fn pair(
    a: Option<ClusterSecret>,
    b: Option<ClusterSecret>,
) -> (Result<(), AuthError>, Result<(), AuthError>, Gate) {
    let (mut x, mut y) = duplex(4096);
    let dialer = gate(a, Duration::from_secs(5));
    let acceptor = gate(b, Duration::from_secs(5));
    let (r1, r2) = tokio::join!(
        async {
            let r = dialer.authenticate(&mut x, Side::Dialer, &LOCAL).await;
            if r.is_err() {
                drop(x);
            }
            r
        },
        async {
            let r = acceptor.authenticate(&mut y, Side::Acceptor, &LOCAL).await;
            if r.is_err() {
                drop(y);
            }
            r
        }
    );
    (r1, r2, acceptor)
}

#[tokio::test]
async fn the_same_secret_authenticates_both_sides_and_then_bytes_flow() {
    let (mut x, mut y) = duplex(4096);
    let s = secret("0123456789abcdef-cluster");
    let (a, b) = tokio::join!(
        handshake(&mut x, &s, Side::Dialer),
        handshake(&mut y, &s, Side::Acceptor)
    );
    a.unwrap();
    b.unwrap();
    x.write_all(b"first frame").await.unwrap();
    let mut got = [0u8; 11];
    y.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"first frame");
}

#[tokio::test]
async fn a_different_secret_is_refused_on_both_sides_and_counted() {
    let (a, b, gate) = pair(
        Some(secret("0123456789abcdef-one")),
        Some(secret("0123456789abcdef-two")),
    )
    .await;
    assert!(matches!(a, Err(AuthError::WrongSecret)), "{a:?}");
    assert!(matches!(b, Err(AuthError::WrongSecret)), "{b:?}");
    assert_eq!(gate.refused_count(), 1);
}

#[tokio::test]
async fn a_peer_without_a_secret_is_refused_before_its_frame_is_read() {
    let (mut x, mut y) = duplex(4096);
    let gate = gate(Some(secret("0123456789abcdef")), Duration::from_secs(5));
    // What a node without a secret sends first: a wire frame.
    let frame =
        crate::wire::encode_to_vec(&crate::Message::default(), &crate::Limits::default()).unwrap();
    x.write_all(&frame).await.unwrap();
    let r = gate.authenticate(&mut y, Side::Acceptor, &LOCAL).await;
    assert!(matches!(r, Err(AuthError::NotAuthenticating)), "{r:?}");
    assert_eq!(gate.refused_count(), 1);
}

#[tokio::test]
async fn a_peer_that_closes_or_stays_silent_fails_in_time() {
    let (x, mut y) = duplex(4096);
    drop(x);
    let gate = gate(Some(secret("0123456789abcdef")), Duration::from_millis(200));
    let r = gate.authenticate(&mut y, Side::Acceptor, &LOCAL).await;
    assert!(matches!(r, Err(AuthError::Closed)), "{r:?}");

    let (_x, mut y) = duplex(4096);
    let r = gate.authenticate(&mut y, Side::Acceptor, &LOCAL).await;
    assert!(matches!(r, Err(AuthError::Timeout(_))), "{r:?}");
    assert_eq!(gate.refused_count(), 2);
}

#[tokio::test]
async fn a_reflected_hello_is_refused() {
    // A peer that echoes every byte back (our hello, then our proof).
    let (mut x, y) = duplex(4096);
    let (mut r, mut w) = tokio::io::split(y);
    tokio::spawn(async move { tokio::io::copy(&mut r, &mut w).await });
    let r = handshake(&mut x, &secret("0123456789abcdef"), Side::Dialer).await;
    assert!(matches!(r, Err(AuthError::Reflected)), "{r:?}");
}

#[tokio::test]
async fn without_a_secret_nothing_is_exchanged() {
    let (a, b, gate) = pair(None, None).await;
    a.unwrap();
    b.unwrap();
    assert!(!gate.requires_auth());
}

#[test]
fn pending_places_per_address_are_bounded_and_returned() {
    let gate = Gate::new(AuthOptions {
        secret: None,
        handshake_timeout: Duration::from_secs(1),
        max_pending_per_address: 2,
        ..AuthOptions::default()
    });
    let other = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let one = gate.admit(LOCAL).unwrap();
    let _two = gate.admit(LOCAL).unwrap();
    let third = gate.admit(LOCAL);
    assert!(matches!(
        third,
        Err(AuthError::TooManyPending { count: 2, max: 2 })
    ));
    // Another address is not affected, and a returned place is free again.
    let _elsewhere = gate.admit(other).unwrap();
    drop(one);
    gate.admit(LOCAL).unwrap();
    assert_eq!(gate.refused_count(), 1);
}

#[test]
fn pending_places_are_bounded_in_all_too() {
    let gate = Gate::new(AuthOptions {
        max_pending_per_address: 2,
        ..AuthOptions::default()
    });
    // One place each from many addresses: 16 × 2 = 32 in all, then none.
    let places: Vec<_> = (1..=32u8)
        .map(|i| gate.admit(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))).unwrap())
        .collect();
    let over = gate.admit(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)));
    assert!(matches!(
        over,
        Err(AuthError::TooManyPending { count: 32, max: 32 })
    ));
    drop(places);
    gate.admit(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1))).unwrap();
}

#[test]
fn the_refusal_record_remembers_a_bounded_number_of_addresses() {
    let gate = gate(None, Duration::from_secs(1));
    for i in 0..5000u32 {
        gate.refuse(&format!("10.{}.{}.1", i >> 8, i & 0xff), &"test");
    }
    assert_eq!(gate.refused_count(), 5000);
    assert_eq!(gate.record.by_address.lock().unwrap().len(), 1024);
}

#[test]
fn secrets_are_checked_and_never_shown() {
    assert!(matches!(
        ClusterSecret::new("short"),
        Err(SecretError::TooShort { len: 5 })
    ));
    let s = secret("a-very-secret-value-123");
    assert!(!format!("{s:?}").contains("secret-value"));
    let dir = std::env::temp_dir().join(format!("vans-secret-{}", std::process::id()));
    std::fs::write(&dir, "0123456789abcdef\n").unwrap();
    assert_eq!(
        ClusterSecret::from_file(&dir).unwrap(),
        secret("0123456789abcdef")
    );
    std::fs::remove_file(&dir).unwrap();
    assert!(matches!(
        ClusterSecret::from_file(&dir),
        Err(SecretError::Unreadable { .. })
    ));
}
