//! The RDMA van against real verbs: the van-core conformance suite (in-process and across
//! processes), credits with tiny rings, large messages through the WRITE_WITH_IMM rendezvous
//! and the registration cache.
//!
//! Where there is no RDMA device (this repository's CI host: no RDMA in its kernel), every
//! test checks that the van refuses to start with the "no RDMA device" error naming the cause
//! the kernel shows, prints it, and stops there. `scripts/rdma-vm.sh` runs this binary inside
//! a Soft-RoCE guest with `VANS_RDMA_REQUIRE_DEVICE=1`, where a missing device fails instead.
#![cfg(feature = "rdma")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use van_core::config::RdmaSettings;
use van_core::testkit::{self, check_numbered, expect_message, numbered, within};
use van_core::{Message, Van, VanKind};
use van_rdma::{sysfs, RdmaOptions, RdmaVan};

/// Whether a device is here; without one, checks the error and says why the test stops.
fn device_here() -> bool {
    match van_rdma::probe(&RdmaSettings::default()) {
        Ok(_) => true,
        Err(e) => {
            let message = e.to_string();
            assert!(
                std::env::var_os("VANS_RDMA_REQUIRE_DEVICE").is_none(),
                "VANS_RDMA_REQUIRE_DEVICE is set but the van cannot start: {message}"
            );
            let cause = sysfs::no_device_cause(&sysfs::kernel_view());
            assert!(
                message.starts_with("no RDMA device: ") && message.contains(&cause),
                "without a device the error must name the cause the kernel shows \
                 ({cause}); got: {message}"
            );
            eprintln!("skipped (no RDMA device here): {message}");
            false
        }
    }
}

fn options(rx_depth: u32, start_depth: u32) -> RdmaOptions {
    RdmaOptions {
        settings: RdmaSettings {
            rx_depth,
            start_depth,
            pool_bytes: 192 << 20,
            ..RdmaSettings::default()
        },
        ..RdmaOptions::default()
    }
}

fn make() -> RdmaVan {
    RdmaVan::new(options(128, 16)).unwrap_or_else(|e| panic!("RDMA van: {e}"))
}

fn make_tiny() -> RdmaVan {
    let mut options = options(4, 2);
    options.slot_bytes = 512;
    RdmaVan::new(options).unwrap_or_else(|e| panic!("RDMA van: {e}"))
}

mod conformance {
    use super::*;
    van_core::van_conformance_tests!(make, requires: device_here);
}

/// The same checks with 4 receive buffers of 512 bytes and 2 large messages in flight: the
/// credit flow, the reserved credit and the rendezvous are exercised on every few messages.
mod tiny_rings {
    use super::*;
    // (Not `message_sizes`: its 64 MiB messages take ~40 s in the emulated guest and are
    // covered above; `large_and_small_messages_interleaved_keep_their_order` runs large
    // frames through these rings.)
    van_core::van_conformance_tests!(make_tiny, requires: device_here,
        checks: [ordering_per_peer, concurrent_senders, ping_pong, stop_flushes_and_ends]);
}

/// The cluster secret on the side channel: checked before any queue pair is created.
mod auth {
    use super::*;
    use van_core::auth::AuthOptions;

    fn make_with(auth: AuthOptions) -> RdmaVan {
        RdmaVan::new(RdmaOptions {
            auth,
            ..options(128, 16)
        })
        .unwrap_or_else(|e| panic!("RDMA van: {e}"))
    }

    van_core::van_auth_tests! {
        make: make_with,
        refused: |van: &RdmaVan| van.refused_connections(),
        tcp_listener: true,
        requires: device_here,
    }
}

// The peer entry (`cross_process_conformance_peer`) and the checks against it.
van_core::van_cross_process_conformance_tests!(make, requires: device_here);

#[test]
fn the_van_starts_or_names_why_not() {
    match RdmaVan::new(RdmaOptions::default()) {
        Ok(van) => {
            assert!(device_here());
            let described = van.device_description();
            eprintln!("{described}");
            // Inside the Soft-RoCE guest the GID must be the RoCE v2 IPv4 one it set up.
            if let Ok(index) = std::env::var("RDMA_GID_INDEX") {
                assert!(
                    described.contains(&format!("GID {index} = ::ffff:")),
                    "auto GID choice {described} is not the guest's RoCE v2 IPv4 GID {index}"
                );
                assert!(described.contains("(RoCE v2)"), "{described}");
            }
        }
        Err(e) => {
            assert!(!device_here());
            assert!(e.to_string().starts_with("no RDMA device: "), "{e}");
        }
    }
}

#[test]
fn a_bad_device_or_gid_is_named() {
    if !device_here() {
        return;
    }
    let mut options = RdmaOptions::default();
    options.settings.device = Some("nosuchdev0".into());
    let e = RdmaVan::new(options).unwrap_err().to_string();
    assert!(
        e.contains("`nosuchdev0`") && e.contains("devices here"),
        "{e}"
    );
    let mut options = RdmaOptions::default();
    options.settings.gid_index = Some(200);
    let e = RdmaVan::new(options).unwrap_err().to_string();
    assert!(e.contains("no usable GID at index 200"), "{e}");
}

/// Two vans, `a` connected to `b`.
async fn pair(make: impl Fn() -> RdmaVan) -> (testkit::Peer<RdmaVan>, testkit::Peer<RdmaVan>) {
    let a = testkit::start(&make, 9).await;
    let b = testkit::start(&make, 8).await;
    testkit::connect(&a, &b).await;
    (a, b)
}

#[test]
fn repeated_large_pushes_reuse_their_registered_buffers() {
    if !device_here() {
        return;
    }
    testkit::run(async {
        let (a, mut b) = pair(make).await;
        const N: u32 = 20;
        for seq in 0..N {
            testkit::send(&*a.van, numbered(9, 8, seq, 1 << 20)).await;
            // Checked and dropped: the buffer it was written into goes back to the pool.
            check_numbered(&expect_message(&mut b.inbox).await, 9, seq);
        }
        let (sent, received) = (a.van.pool_stats(), b.van.pool_stats());
        eprintln!("sender {sent:?}, receiver {received:?}");
        assert!(
            received.registrations <= 2 && received.reuses >= u64::from(N) - 2,
            "receiver registered per message: {received:?}"
        );
        assert!(
            sent.registrations <= 2 && sent.reuses >= u64::from(N) - 2,
            "sender staging registered per message: {sent:?}"
        );
    });
}

#[test]
fn buffers_from_alloc_are_sent_from_registered_memory_and_arrive_intact() {
    if !device_here() {
        return;
    }
    testkit::run(async {
        let (a, mut b) = pair(make).await;
        assert!(
            a.van.alloc(100).unwrap().is_none(),
            "small buffers are not worth it"
        );
        for round in 0..3u8 {
            let mut buf = a.van.alloc(3 << 20).unwrap().expect("a registered buffer");
            assert_eq!(buf.van(), Some(VanKind::Rdma));
            for (i, byte) in buf.as_mut_slice().iter_mut().enumerate() {
                *byte = (i as u8).wrapping_mul(31).wrapping_add(round);
            }
            let bytes = buf.freeze();
            let mut msg = Message::to(8, vec![Bytes::from_static(b"k"), bytes.clone()]);
            msg.meta.sender = Some(9);
            testkit::send(&*a.van, msg).await;
            let got = expect_message(&mut b.inbox).await;
            assert_eq!(got.data[1], bytes, "round {round}");
            // The receiver's data is 8-byte aligned inside registered memory.
            assert_eq!(got.data[1].as_ptr() as usize % 8, 0);
        }
        let sent = a.van.pool_stats();
        eprintln!("sender {sent:?}");
        assert!(sent.reuses >= 2, "{sent:?}");
    });
}

#[test]
fn large_and_small_messages_interleaved_keep_their_order() {
    if !device_here() {
        return;
    }
    testkit::run(async {
        let (a, mut b) = pair(make_tiny).await;
        let sender = Arc::clone(&a.van);
        const N: u32 = 300;
        let size = |seq: u32| match seq % 5 {
            0 => 200_000,
            1 => 3,
            2 => 700,
            3 => 70_000,
            _ => 0,
        };
        let task = tokio::spawn(async move {
            for seq in 0..N {
                testkit::send(&*sender, numbered(9, 8, seq, size(seq))).await;
            }
        });
        for seq in 0..N {
            let msg = expect_message(&mut b.inbox).await;
            assert_eq!(msg.data[0].len(), size(seq));
            check_numbered(&msg, 9, seq);
        }
        task.await.unwrap();
        testkit::expect_quiet(&mut b.inbox, Duration::from_millis(200)).await;
        within(a.van.stop(), "stop").await;
    });
}

/// More large frames in flight than the peer has receive buffers (a `BYTEPS_RDMA_START_DEPTH`
/// above `BYTEPS_RDMA_RX_DEPTH`, or nodes configured differently), both ways at once so that
/// credits come back in credit-only messages ahead of replies: the sender stays below the
/// peer's depth, instead of the peer refusing the announcement and dropping the connection.
#[test]
fn a_start_depth_above_the_peers_receive_depth_stays_within_it() {
    if !device_here() {
        return;
    }
    let make = || {
        let mut options = options(4, 16);
        options.slot_bytes = 512;
        RdmaVan::new(options).unwrap_or_else(|e| panic!("RDMA van: {e}"))
    };
    testkit::run(async {
        let (mut a, mut b) = pair(make).await;
        testkit::connect(&b, &a).await;
        const N: u32 = 300;
        let stream = |van: Arc<RdmaVan>, from, to| {
            tokio::spawn(async move {
                for seq in 0..N {
                    let size = if seq % 3 == 2 { 100 } else { 20_000 };
                    testkit::send(&*van, numbered(from, to, seq, size)).await;
                }
            })
        };
        let to_b = stream(Arc::clone(&a.van), 9, 8);
        let to_a = stream(Arc::clone(&b.van), 8, 9);
        for seq in 0..N {
            check_numbered(&expect_message(&mut b.inbox).await, 9, seq);
            check_numbered(&expect_message(&mut a.inbox).await, 8, seq);
        }
        to_b.await.unwrap();
        to_a.await.unwrap();
        testkit::expect_quiet(&mut b.inbox, Duration::from_millis(200)).await;
        testkit::expect_quiet(&mut a.inbox, Duration::from_millis(200)).await;
    });
}

/// Queue depths the device cannot hold fail when the van starts, naming the variable, the
/// value and the device's limit (`ibv_query_device`), instead of failing every connection
/// later with `EINVAL` from `ibv_create_qp` / `ibv_create_cq`; the largest value the error
/// suggests starts.
#[test]
fn depths_above_the_devices_limits_fail_at_start() {
    if !device_here() {
        return;
    }
    let attributes = van_rdma::device::open(&RdmaSettings::default())
        .unwrap()
        .attributes;
    eprintln!("device limits: {attributes:?}");
    let start =
        |rx_depth: u32, start_depth: u32| RdmaVan::new(options(rx_depth, start_depth)).map(|_| ());
    let check = |error: van_rdma::RdmaError, variable: &str, value: u64, attribute: &str| {
        let message = error.to_string();
        eprintln!("{message}");
        let van_rdma::RdmaError::DepthAboveDeviceLimit {
            variable: named,
            value: shown,
            attribute: exceeded,
            limit,
            largest,
            ..
        } = error
        else {
            panic!("not a depth error: {message}");
        };
        let largest = largest.unwrap_or_else(|| panic!("no suggested value: {message}"));
        assert_eq!(
            (named, shown, exceeded),
            (variable, value, attribute),
            "{message}"
        );
        for part in [
            format!("{variable}={value}"),
            format!("{attribute} is {limit}"),
            format!("at most {largest}"),
        ] {
            assert!(message.contains(&part), "`{part}` missing: {message}");
        }
        largest
    };
    let max_qp_wr = attributes.max_qp_wr;
    // The deepest rings vans takes (`VANS_RDMA_RX_DEPTH` ..= 32768), from the environment
    // when the device's max_qp_wr is below it; else a start depth above it, from code.
    if max_qp_wr < 32768 {
        let depth = (max_qp_wr + 1).to_string();
        let config = van_core::Config::from_vars([("VANS_RDMA_RX_DEPTH", depth.as_str())]).unwrap();
        let error = RdmaVan::new(RdmaOptions::from_config(&config)).unwrap_err();
        check(
            error,
            "VANS_RDMA_RX_DEPTH",
            u64::from(max_qp_wr) + 1,
            "max_qp_wr",
        );
    } else {
        let error = start(4, max_qp_wr).unwrap_err();
        let largest = check(
            error,
            "VANS_RDMA_START_DEPTH",
            u64::from(max_qp_wr),
            "max_qp_wr",
        );
        start(4, u32::try_from(largest).unwrap()).unwrap();
    }
    // A completion queue above max_cqe (2 × rx + start + 2 entries), when a depth vans takes
    // and the queue pair holds gets there.
    let rx = (u64::from(attributes.max_cqe).saturating_sub(18) / 2 + 1).max(4);
    if rx <= 32768 && rx + 17 <= u64::from(max_qp_wr) {
        let rx = u32::try_from(rx).unwrap();
        let error = start(rx, 16).unwrap_err();
        let largest = check(error, "VANS_RDMA_RX_DEPTH", u64::from(rx), "max_cqe");
        start(u32::try_from(largest).unwrap(), 16).unwrap();
    } else {
        eprintln!(
            "max_cqe {} holds every depth vans takes",
            attributes.max_cqe
        );
    }
    // The defaults fit.
    start(128, 16).unwrap();
}

/// The bound on accepted handshakes (`VANS_RDMA_MAX_HANDSHAKES`): a burst of side channels
/// cannot make a van create a queue pair and rings for each at once.
mod handshakes {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    use van_rdma::protocol::QpAttributes;

    fn make_bounded(max_handshakes: usize, connect_timeout: Duration) -> RdmaVan {
        let mut options = options(128, 16);
        options.settings.max_handshakes = max_handshakes;
        options.connect_timeout = connect_timeout;
        RdmaVan::new(options).unwrap_or_else(|e| panic!("RDMA van: {e}"))
    }

    fn side_channel(peer: &testkit::Peer<RdmaVan>) -> SocketAddr {
        peer.node.endpoints[0].address.parse().unwrap()
    }

    /// Attributes a real dialer on this device could send (its GID, so moving a queue pair
    /// to RTR towards it succeeds), for a queue pair that never answers.
    fn stalled_dialer_attributes() -> [u8; QpAttributes::LEN] {
        let device = van_rdma::device::open(&RdmaSettings::default()).unwrap();
        QpAttributes {
            qpn: 0x00ab_cdef,
            psn: 1,
            lid: device.lid,
            mtu: u8::try_from(device.mtu).unwrap(),
            gid: device.gid.raw,
            rx_depth: 128,
            slot_bytes: 8192,
        }
        .encode()
    }

    /// Polls `value` every 10 ms for `period` and returns the largest value seen.
    async fn largest_over(period: Duration, value: impl Fn() -> usize) -> usize {
        let end = tokio::time::Instant::now() + period;
        let mut largest = value();
        while tokio::time::Instant::now() < end {
            largest = largest.max(value());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        largest
    }

    /// Waits (at most 60 s: queue pairs are slow to create in an emulated guest) until
    /// `done`.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Side channels that send nothing get no queue pair (the van reads the dialer's
    /// attributes first), and hold no turn: with one turn and a dozen of them open, a real
    /// peer connects at once.
    #[test]
    fn idle_side_channels_get_no_queue_pair_and_hold_no_turn() {
        if !device_here() {
            return;
        }
        testkit::run(async {
            let make = || make_bounded(1, Duration::from_secs(30));
            let mut b = testkit::start(&make, 8).await;
            let mut idle = Vec::new();
            for _ in 0..12 {
                idle.push(TcpStream::connect(side_channel(&b)).await.unwrap());
            }
            let largest =
                largest_over(Duration::from_secs(2), || b.van.handshakes_in_progress()).await;
            assert_eq!(largest, 0, "idle side channels got queue pairs");
            let a = testkit::start(&make, 9).await;
            testkit::connect(&a, &b).await;
            testkit::send(&*a.van, numbered(9, 8, 1, 100)).await;
            check_numbered(&expect_message(&mut b.inbox).await, 9, 1);
            assert_eq!(b.van.handshakes_in_progress(), 0);
            drop(idle);
        });
    }

    /// 140 dialers send their attributes and stall: 2 handshakes (the bound) hold a queue
    /// pair at a time, 128 (64 per turn) wait for a turn, the other 10 are closed at once;
    /// once the dialers go, every handshake ends and a real peer connects.
    #[test]
    fn a_burst_of_handshakes_holds_at_most_the_bound() {
        if !device_here() {
            return;
        }
        testkit::run(async {
            const BOUND: usize = 2;
            const BURST: usize = 140;
            let make = || make_bounded(BOUND, Duration::from_secs(60));
            let mut b = testkit::start(&make, 8).await;
            let attributes = stalled_dialer_attributes();
            let mut burst = Vec::with_capacity(BURST);
            for _ in 0..BURST {
                let mut socket = TcpStream::connect(side_channel(&b)).await.unwrap();
                socket.write_all(&attributes).await.unwrap();
                burst.push(socket);
            }
            until("the bound's handshakes", || {
                b.van.handshakes_in_progress() >= BOUND
            })
            .await;
            let largest =
                largest_over(Duration::from_secs(2), || b.van.handshakes_in_progress()).await;
            assert_eq!(largest, BOUND, "more handshakes than the bound");
            // 140 - 2 with a turn - 128 waiting; a turn's place may come back a moment late.
            until("the refusals beyond the waiting places", || {
                b.van.refused_connections() >= 10
            })
            .await;
            let refused = b.van.refused_connections();
            eprintln!("{largest} handshakes in progress at most, {refused} refused");
            assert!(
                (10..=12).contains(&refused),
                "{refused} refused, 10 expected"
            );

            // The dialers give up: the handshakes with a turn fail, the waiting ones are
            // dropped without a queue pair, and a real peer connects.
            drop(burst);
            until("every handshake's end", || {
                b.van.handshakes_in_progress() == 0
            })
            .await;
            let a = testkit::start(&make, 9).await;
            testkit::connect(&a, &b).await;
            testkit::send(&*a.van, numbered(9, 8, 1, 100)).await;
            check_numbered(&expect_message(&mut b.inbox).await, 9, 1);
        });
    }
}
