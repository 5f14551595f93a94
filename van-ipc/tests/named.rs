//! The named-segment mode with real `/dev/shm` files and real processes: permissions and
//! round trips, a listener and a dialer in a child process, crashes before and after the
//! handshake (listed, cleaned, detected by heartbeat), a `/dev/shm` too small, garbage in
//! the accept queue and in connection segments, and the `vans-shm` command.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::OpenOptions;
use std::io::ErrorKind::NotFound;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use van_ipc::named::layout::{accept_queue as queue_layout, connection as conn_layout};
use van_ipc::named::{
    self, connect, NamedListener, NamedSegment, OwnerStatus, PeerStatus, SegmentName,
};
use van_ipc::ring::{Consumer, Producer, LAST};
use van_ipc::{IpcError, WaitResult};

/// Tells `child_process` what to be.
const CHILD_MODE: &str = "VANS_NAMED_TEST_CHILD";
/// The listener address a child dials.
const CHILD_ADDRESS: &str = "VANS_NAMED_TEST_ADDRESS";
/// The line a child prints when it is ready, followed by a detail.
const READY: &str = "VANS-CHILD-READY";
/// Longest any wait in these tests may take.
const WAIT: Duration = Duration::from_secs(30);
/// Rings of the cross-process tests: small, so large messages are fragmented and wrap.
const RING_BYTES: usize = 64 << 10;
/// How long a child lives at most if nobody kills it.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);

/// Tests that remove dead processes' segments (or depend on one staying listed until they
/// remove it) run one at a time.
static CLEANER: Mutex<()> = Mutex::new(());

fn cleaner() -> MutexGuard<'static, ()> {
    CLEANER.lock().unwrap_or_else(|e| e.into_inner())
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

// ---------------------------------------------------------------------------------------
// The child side.

/// The child process: `echo` (dial, echo every message, exit when the parent closes),
/// `beat` (dial, heartbeat, idle), `dial` (dial a listener that never accepts), `hold`
/// (create a named segment and sleep).
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return; // only meaningful when started by the tests below
    };
    let address = std::env::var(CHILD_ADDRESS).unwrap_or_default();
    match mode.as_str() {
        "echo" => {
            let connection = connect(&address, RING_BYTES, WAIT).unwrap();
            println!("{READY} {}", connection.liveness.segment_name());
            let (mut producer, mut consumer) = (connection.producer, connection.consumer);
            let stop = Arc::new(AtomicBool::new(false));
            let beater = beat_in_background(connection.liveness, Arc::clone(&stop));
            while let Some(message) = recv(&mut consumer, CHILD_LIFETIME) {
                send(&mut producer, &message);
            }
            producer.close();
            stop.store(true, Ordering::Relaxed);
            beater.join().unwrap();
        }
        "beat" => {
            let connection = connect(&address, RING_BYTES, WAIT).unwrap();
            println!("{READY} {}", connection.liveness.segment_name());
            let stop = Arc::new(AtomicBool::new(false));
            let _beater = beat_in_background(connection.liveness, stop);
            std::thread::sleep(CHILD_LIFETIME);
        }
        "dial" => {
            println!("{READY} dialing");
            let _ = connect(&address, RING_BYTES, CHILD_LIFETIME);
        }
        "hold" => {
            let segment = NamedSegment::create(64 << 10).unwrap();
            println!("{READY} {}", segment.name());
            std::thread::sleep(CHILD_LIFETIME);
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn beat_in_background(
    liveness: named::Liveness,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            liveness.beat();
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// A child process, SIGKILLed when dropped (so a failing test leaves no orphan).
struct ChildProcess {
    child: Child,
    /// Receives what the child prints after its ready marker.
    ready: std::sync::mpsc::Receiver<String>,
}

impl ChildProcess {
    /// Starts a child; call [`ChildProcess::ready`] to wait for its marker (after accepting,
    /// for a child that dials: it reports once connected).
    fn spawn(mode: &str, address: &str) -> ChildProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_MODE, mode)
            .env(CHILD_ADDRESS, address)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // Reads lines until the marker; the rest of the child's output is drained and dropped.
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness prints `test child_process ... ` on the same line first.
                if !sent {
                    if let Some(at) = line.find(READY) {
                        let _ = tx.send(line[at + READY.len()..].trim().to_owned());
                        sent = true;
                    }
                }
            }
        });
        ChildProcess { child, ready: rx }
    }

    /// Waits for the child's ready marker and returns what follows it.
    fn ready(&self) -> String {
        self.ready
            .recv_timeout(WAIT)
            .expect("the child never reported ready")
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap (an unreaped zombie still counts as alive for `kill(pid, 0)`).
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn wait_success(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "child failed: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "the child did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Ring helpers: whole messages, fragmented as needed, every wait bounded.

fn send(producer: &mut Producer, message: &[u8]) {
    let deadline = Instant::now() + WAIT;
    let mut offset = 0;
    loop {
        match producer.try_push_message(&[message], offset).unwrap() {
            Some(next) => {
                offset = next;
                if offset >= message.len() {
                    break;
                }
            }
            None => {
                producer.wake_consumer();
                assert!(
                    Instant::now() < deadline,
                    "no room in the ring for {WAIT:?}"
                );
                let want = (message.len() - offset).min(producer.max_record());
                producer.wait_for_space(want, 100, Duration::from_millis(100));
            }
        }
    }
    producer.wake_consumer();
}

/// The next whole message, or `None` when the ring is closed and drained (or `limit` passed).
fn recv(consumer: &mut Consumer, limit: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let mut out = BytesMut::new();
    let mut closed = false;
    loop {
        match consumer.try_pop(&mut out).unwrap() {
            Some(flags) if flags & LAST != 0 => return Some(out.to_vec()),
            Some(_) => {}
            None if closed => return None,
            None => {
                if Instant::now() >= deadline {
                    return None;
                }
                if consumer.wait_for_data(100, Duration::from_millis(100)) == WaitResult::Closed {
                    closed = true; // drain once more
                }
            }
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Reading and writing the accept-queue file directly, as another process would.

fn slot_offset(index: usize) -> u64 {
    (queue_layout::SLOTS_OFFSET + index * queue_layout::SLOT_BYTES) as u64
}

fn open_rw(path: &std::path::Path) -> std::fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Writes `name` into accept-queue slot `index` as a dialer would, state last.
fn post_raw(queue: &std::path::Path, index: usize, name: &[u8], len: u32, state: u32) {
    let file = open_rw(queue);
    let base = slot_offset(index);
    file.write_at(name, base + queue_layout::SLOT_NAME_OFFSET as u64)
        .unwrap();
    file.write_at(
        &len.to_ne_bytes(),
        base + queue_layout::SLOT_NAME_LEN_OFFSET as u64,
    )
    .unwrap();
    file.write_at(
        &state.to_ne_bytes(),
        base + queue_layout::SLOT_STATE_OFFSET as u64,
    )
    .unwrap();
}

/// The first name posted in the accept queue, once one shows up.
fn wait_for_posted_name(queue: &std::path::Path) -> SegmentName {
    let file = open_rw(queue);
    let deadline = Instant::now() + WAIT;
    loop {
        for index in 0..queue_layout::SLOT_COUNT {
            let base = slot_offset(index);
            let mut word = [0u8; 4];
            file.read_exact_at(&mut word, base).unwrap();
            if u32::from_ne_bytes(word) & queue_layout::STATE_MASK == queue_layout::POSTED {
                file.read_exact_at(&mut word, base + 4).unwrap();
                let len = u32::from_ne_bytes(word) as usize;
                let mut name = vec![0u8; len];
                file.read_exact_at(&mut name, base + 8).unwrap();
                return SegmentName::parse(std::str::from_utf8(&name).unwrap()).unwrap();
            }
        }
        assert!(Instant::now() < deadline, "nothing was posted");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn create_open_unlink_round_trip_is_owner_only() {
    let len = 3 * 4096 + 100;
    let created = NamedSegment::create(len).unwrap();
    let name = *created.name();
    assert_eq!(name.uid, euid());
    assert_eq!(name.pid, std::process::id());
    assert_eq!(
        created.path(),
        std::path::Path::new("/dev/shm").join(name.to_string())
    );
    let metadata = std::fs::metadata(created.path()).unwrap();
    assert_eq!(metadata.permissions().mode() & 0o7777, 0o600);
    assert_eq!(metadata.uid(), euid());
    assert_eq!(metadata.len(), len as u64);
    assert!(
        metadata.blocks() * 512 >= len as u64,
        "the memory is reserved up front ({} blocks)",
        metadata.blocks()
    );

    let opened = NamedSegment::open(&name, 1 << 20).unwrap();
    assert_eq!(opened.len(), len);
    assert!(!opened.is_creator());
    // SAFETY: both mappings are valid for `len` bytes; nothing else touches them.
    unsafe {
        created.as_ptr().add(len - 1).write(0x5A);
        assert_eq!(opened.as_ptr().add(len - 1).read(), 0x5A);
    }
    let small = NamedSegment::open(&name, len - 1).unwrap_err();
    assert!(matches!(small, IpcError::BadSegment { .. }), "{small}");

    assert!(opened.unlink().unwrap());
    assert!(!created.path().exists());
    assert!(!created.unlink().unwrap(), "already gone");
    // SAFETY: as above: unlinking leaves the mappings intact.
    unsafe { assert_eq!(created.as_ptr().add(len - 1).read(), 0x5A) };
    let gone = NamedSegment::open(&name, 1 << 20).unwrap_err();
    assert!(
        matches!(&gone, IpcError::Os { call: "open", source } if source.kind() == NotFound),
        "{gone}"
    );

    // The creator's drop removes a name nobody unlinked.
    let dropped = NamedSegment::create(4096).unwrap();
    let path = dropped.path();
    assert!(path.exists());
    drop(dropped);
    assert!(!path.exists());

    // A window for the rings stays inside the segment.
    let shared = Arc::new(NamedSegment::create(5 * 4096).unwrap());
    let window = van_ipc::Segment::from_named(Arc::clone(&shared), 4096, 2 * 4096).unwrap();
    assert_eq!(window.len(), 2 * 4096);
    assert_eq!(window.as_ptr(), shared.as_ptr().wrapping_add(4096));
    for (offset, len) in [
        (100, 4096),
        (4096, 5 * 4096),
        (0, 0),
        (usize::MAX - 4095, 4096),
    ] {
        assert!(matches!(
            van_ipc::Segment::from_named(Arc::clone(&shared), offset, len),
            Err(IpcError::BadSegment { .. })
        ));
    }
}

#[test]
fn opening_refuses_permissive_or_foreign_files() {
    // A file with the right kind of name but group/other bits: refused before mapping.
    let name = SegmentName::fresh().unwrap();
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(name.path())
        .unwrap();
    file.set_len(4096).unwrap();
    std::fs::set_permissions(name.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = NamedSegment::open(&name, 1 << 20).unwrap_err();
    assert!(err.to_string().contains("mode 644"), "{err}");
    std::fs::remove_file(name.path()).unwrap();

    // A name of another uid: refused without touching the file system.
    let foreign = SegmentName {
        uid: euid().wrapping_add(1),
        ..SegmentName::fresh().unwrap()
    };
    let err = NamedSegment::open(&foreign, 1 << 20).unwrap_err();
    assert!(err.to_string().contains("belongs to uid"), "{err}");

    // A symlink planted under a valid name is not followed.
    let link = SegmentName::fresh().unwrap();
    std::os::unix::fs::symlink("/etc/hostname", link.path()).unwrap();
    let err = NamedSegment::open(&link, 1 << 20).unwrap_err();
    std::fs::remove_file(link.path()).unwrap();
    assert!(matches!(err, IpcError::Os { call: "open", .. }), "{err}");
}

#[test]
fn listener_and_child_dialer_exchange_messages() {
    let mut listener = NamedListener::bind().unwrap();
    let queue_mode = std::fs::metadata(listener.name().path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(queue_mode & 0o7777, 0o600);
    let mut child = ChildProcess::spawn("echo", listener.address());
    let connection = listener
        .accept(WAIT)
        .unwrap()
        .expect("the child dialed within the timeout");
    let name = connection.liveness.segment_name();
    assert_eq!(name.to_string(), child.ready());
    assert_eq!(name.pid, child.pid(), "the dialer created the segment");
    assert!(
        !name.path().exists(),
        "both sides mapped it, so the name is gone"
    );
    assert!(
        named::list_segments()
            .unwrap()
            .iter()
            .all(|e| e.owner_pid() != Some(child.pid())),
        "the child has nothing left in /dev/shm"
    );

    let (mut producer, mut consumer, mut liveness) = (
        connection.producer,
        connection.consumer,
        connection.liveness,
    );
    // Sizes up to 16× the ring: fragmented, reassembled, wrapped.
    let sizes = [0usize, 1, 8, 4095, 16 << 10, 100_000, 1 << 20];
    for round in 0..3u8 {
        for (i, &size) in sizes.iter().enumerate() {
            let message = pattern(size, round.wrapping_mul(16).wrapping_add(i as u8));
            send(&mut producer, &message);
            let echo = recv(&mut consumer, WAIT).expect("an echo");
            assert_eq!(echo.len(), size);
            assert!(echo == message, "echo of {size} bytes differs");
            liveness.beat();
        }
    }
    // Many small messages in flight at once, in order.
    let sender = std::thread::spawn(move || {
        for seq in 0..2000u32 {
            send(&mut producer, &seq.to_le_bytes());
        }
        producer
    });
    for seq in 0..2000u32 {
        assert_eq!(recv(&mut consumer, WAIT).unwrap(), seq.to_le_bytes());
    }
    let producer = sender.join().unwrap();
    assert!(liveness.peer_alive(), "the child beats");
    // An orderly end: we close, the child drains, closes and exits; liveness says Closed.
    producer.close();
    child.wait_success();
    assert_eq!(liveness.status(), PeerStatus::Closed);
    assert!(recv(&mut consumer, Duration::from_secs(1)).is_none());
}

#[test]
fn heartbeat_detects_a_killed_dialer() {
    let mut listener = NamedListener::bind().unwrap();
    let mut child = ChildProcess::spawn("beat", listener.address());
    let connection = listener.accept(WAIT).unwrap().expect("the child dialed");
    child.ready();
    let mut liveness = connection.liveness;
    let timeout = Duration::from_secs(1);
    liveness.set_timeout(timeout);
    // Alive while it beats (every 100 ms).
    let watch_until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < watch_until {
        liveness.beat();
        assert_eq!(liveness.status(), PeerStatus::Alive);
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill();
    let killed = Instant::now();
    let since = loop {
        liveness.beat();
        match liveness.status() {
            PeerStatus::Alive => {}
            PeerStatus::Silent { since } => break since,
            PeerStatus::Closed => panic!("a SIGKILLed process closes nothing"),
        }
        assert!(killed.elapsed() < WAIT, "the dead peer was never detected");
        std::thread::sleep(Duration::from_millis(20));
    };
    let detected = killed.elapsed();
    assert!(since >= timeout);
    assert!(
        detected <= timeout + Duration::from_millis(1500),
        "detected after {detected:?}, the timeout is {timeout:?}"
    );
    // The rings are still usable locally; nothing of the child is left in /dev/shm.
    assert!(
        named::list_segments()
            .unwrap()
            .iter()
            .all(|e| e.owner_pid() != Some(child.pid())),
        "the killed child left a segment"
    );
}

#[test]
fn a_dialer_killed_mid_handshake_is_listed_dead_and_cleaned() {
    let _cleaner = cleaner();
    // A listener that does not accept yet: the child creates its connection segment, posts
    // it and waits; we kill it there.
    let mut listener = NamedListener::bind().unwrap();
    let mut child = ChildProcess::spawn("dial", listener.address());
    child.ready();
    let posted = wait_for_posted_name(&listener.name().path());
    assert_eq!(posted.pid, child.pid());
    assert!(posted.path().exists());
    child.kill();

    let entry = named::list_segments()
        .unwrap()
        .into_iter()
        .find(|e| e.name == Some(posted))
        .expect("the dead child's segment is listed");
    assert_eq!(entry.owner, OwnerStatus::Dead);
    assert_eq!(entry.owner_pid(), Some(child.pid()));
    assert!(entry.size > 0);
    assert!(entry.is_ours() && entry.is_stale());
    // Our own accept queue is listed too, alive, and not stale.
    let queue = named::list_segments()
        .unwrap()
        .into_iter()
        .find(|e| e.name.as_ref() == Some(listener.name()))
        .expect("the accept queue is listed");
    assert_eq!(queue.owner, OwnerStatus::Alive);
    assert!(!queue.is_stale());

    assert!(named::stale_segments().unwrap().contains(&entry));
    let report = named::clean_stale().unwrap();
    assert!(report.removed.contains(&entry), "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(!posted.path().exists(), "the file is gone from /dev/shm");
    assert!(
        listener.name().path().exists(),
        "a live owner's segment stays"
    );
    // The post is still in the accept queue; taking it finds the file gone and moves on.
    assert!(listener
        .accept(Duration::from_millis(200))
        .unwrap()
        .is_none());
}

#[test]
fn a_child_killed_holding_a_segment_is_cleaned_by_vans_shm() {
    let _cleaner = cleaner();
    let mut child = ChildProcess::spawn("hold", "");
    let detail = child.ready();
    let name = SegmentName::parse(&detail).unwrap();
    assert!(name.path().exists());
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_vans-shm"))
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, out) = run(&["list"]);
    assert_eq!(code, Some(0));
    let line = out.lines().find(|l| l.starts_with(&detail)).unwrap();
    assert!(line.contains("alive"), "{out}");

    child.kill();
    let (code, out) = run(&["list"]);
    assert_eq!(code, Some(0));
    let line = out.lines().find(|l| l.starts_with(&detail)).unwrap();
    assert!(line.contains("dead"), "{out}");
    assert!(line.contains(&child.pid().to_string()), "{out}");
    assert!(line.contains("64.0 KiB"), "{out}");

    let (code, out) = run(&["clean", "--dry-run"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(&format!("would remove {detail}")), "{out}");
    assert!(name.path().exists(), "a dry run removes nothing");

    let (code, out) = run(&["clean"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(&format!("removed {detail}")), "{out}");
    assert!(!name.path().exists());

    let (code, _) = run(&["frobnicate"]);
    assert_eq!(code, Some(2));
}

#[test]
fn a_small_dev_shm_is_an_error_naming_the_bytes() {
    let available = named::shm_free_bytes().unwrap();
    let request = available + (1 << 30) + 1;
    let err = NamedSegment::create(usize::try_from(request).unwrap()).unwrap_err();
    match &err {
        IpcError::ShmTooSmall {
            needed,
            available: reported,
            path,
        } => {
            assert!(*needed >= request);
            assert!(*needed < request + 4096, "rounded to a page, no more");
            assert!(*reported < *needed);
            assert_eq!(path, std::path::Path::new("/dev/shm"));
        }
        other => panic!("expected ShmTooSmall, got {other:?}"),
    }
    let message = err.to_string();
    let needed = match err {
        IpcError::ShmTooSmall { needed, .. } => needed,
        _ => unreachable!(),
    };
    assert!(message.contains(&needed.to_string()), "{message}");
    assert!(message.contains("--shm-size"), "{message}");
    assert!(message.contains("sizeLimit"), "{message}");
}

#[test]
fn garbage_in_accept_queue_slots_is_a_typed_error() {
    let mut listener = NamedListener::bind().unwrap();
    let queue = listener.name().path();
    let short = Duration::from_millis(100);
    let generation = 1 << 8;

    // An unknown state.
    post_raw(&queue, 0, b"", 0, generation | 0x7f);
    let err = listener.accept(short).unwrap_err();
    assert!(matches!(err, IpcError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("unknown state"), "{err}");

    // A name longer than a slot.
    post_raw(&queue, 1, b"vans-", 500, generation | queue_layout::POSTED);
    let err = listener.accept(short).unwrap_err();
    assert!(matches!(err, IpcError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("500 bytes"), "{err}");

    // A malformed name, and one that is not UTF-8.
    post_raw(
        &queue,
        2,
        b"vans-../../etc/passwd",
        21,
        generation | queue_layout::POSTED,
    );
    let err = listener.accept(short).unwrap_err();
    assert!(matches!(err, IpcError::BadName { .. }), "{err}");
    post_raw(
        &queue,
        3,
        b"vans-\xff\xfe",
        7,
        generation | queue_layout::POSTED,
    );
    let err = listener.accept(short).unwrap_err();
    assert!(matches!(err, IpcError::BadName { .. }), "{err}");

    // Another uid's name: refused without opening anything.
    let foreign = SegmentName {
        uid: euid().wrapping_add(1),
        ..SegmentName::fresh().unwrap()
    }
    .to_string();
    post_raw(
        &queue,
        4,
        foreign.as_bytes(),
        foreign.len() as u32,
        generation | queue_layout::POSTED,
    );
    let err = listener.accept(short).unwrap_err();
    assert!(matches!(err, IpcError::BadSegment { .. }), "{err}");

    // A well-formed name of a file that does not exist: skipped quietly.
    let missing = SegmentName::fresh().unwrap().to_string();
    post_raw(
        &queue,
        5,
        missing.as_bytes(),
        missing.len() as u32,
        generation | queue_layout::POSTED,
    );
    assert!(listener.accept(short).unwrap().is_none());

    // The listener is still usable, and the slots were freed.
    let address = listener.address().to_owned();
    let dialer = std::thread::spawn(move || connect(&address, 4096, WAIT));
    let mut accepted = listener.accept(WAIT).unwrap().expect("a real dialer");
    let mut dialed = dialer.join().unwrap().unwrap();
    send(&mut dialed.producer, b"still works");
    assert_eq!(recv(&mut accepted.consumer, WAIT).unwrap(), b"still works");
}

#[test]
fn garbage_connection_segments_are_refused_and_removed() {
    use conn_layout::{CAPACITY_OFFSET, MAGIC, POSTED, STATE_OFFSET, VERSION, VERSION_OFFSET};
    let mut listener = NamedListener::bind().unwrap();
    let queue = listener.name().path();
    let capacity = 4096usize;
    let total = conn_layout::HEADER_BYTES + 2 * (van_ipc::ring::layout::HEADER_BYTES + capacity);

    // (length, header writer, expected words in the error)
    type Writer = fn(&std::fs::File);
    let cases: [(usize, Writer, &str); 4] = [
        (total, |_| {}, "bad magic"),
        (100, |_| {}, "less than its"),
        (
            total,
            |f| {
                f.write_at(&MAGIC.to_ne_bytes(), 0).unwrap();
                f.write_at(&VERSION.to_ne_bytes(), VERSION_OFFSET as u64)
                    .unwrap();
                f.write_at(&12345u64.to_ne_bytes(), CAPACITY_OFFSET as u64)
                    .unwrap();
                f.write_at(&POSTED.to_ne_bytes(), STATE_OFFSET as u64)
                    .unwrap();
            },
            "declares rings of 12345",
        ),
        (
            total,
            |f| {
                f.write_at(&MAGIC.to_ne_bytes(), 0).unwrap();
                f.write_at(&VERSION.to_ne_bytes(), VERSION_OFFSET as u64)
                    .unwrap();
                f.write_at(&4096u64.to_ne_bytes(), CAPACITY_OFFSET as u64)
                    .unwrap();
                f.write_at(&POSTED.to_ne_bytes(), STATE_OFFSET as u64)
                    .unwrap();
                // The ring headers stay zero.
            },
            "ring magic",
        ),
    ];
    for (i, (len, write, expected)) in cases.into_iter().enumerate() {
        let segment = NamedSegment::create(len).unwrap();
        write(&open_rw(&segment.path()));
        let name = segment.name().to_string();
        post_raw(
            &queue,
            i,
            name.as_bytes(),
            name.len() as u32,
            (1 << 8) | queue_layout::POSTED,
        );
        let err = listener.accept(Duration::from_millis(100)).unwrap_err();
        assert!(
            matches!(err, IpcError::BadSegment { .. }),
            "case {i}: {err}"
        );
        assert!(err.to_string().contains(expected), "case {i}: {err}");
        assert!(
            !segment.path().exists(),
            "case {i}: the listener removed it"
        );
        if len >= conn_layout::HEADER_BYTES && i >= 2 {
            // The dialer (us) is told: the state says refused.
            let mut state = [0u8; 4];
            // SAFETY: the segment is mapped for `len >= HEADER_BYTES` bytes; STATE_OFFSET is
            // inside and 4-aligned.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    segment.as_ptr().add(STATE_OFFSET),
                    state.as_mut_ptr(),
                    4,
                )
            };
            assert_eq!(u32::from_ne_bytes(state), conn_layout::REFUSED, "case {i}");
        }
    }
}

#[test]
fn bad_addresses_and_garbage_accept_queues_are_refused() {
    for address in [
        "",
        "shm:",
        "shm:vans-garbage",
        "tcp://127.0.0.1:9",
        "@vans-sock-1-2",
    ] {
        let err = connect(address, 4096, Duration::from_millis(100)).unwrap_err();
        assert!(
            matches!(err, IpcError::BadName { .. }),
            "{address:?}: {err}"
        );
    }
    let missing = SegmentName::fresh().unwrap().address();
    let err = connect(&missing, 4096, Duration::from_millis(100)).unwrap_err();
    assert!(
        matches!(&err, IpcError::Os { source, .. } if source.kind() == NotFound),
        "{err}"
    );
    // Right size, no magic.
    let zeros = NamedSegment::create(queue_layout::BYTES).unwrap();
    let err = connect(&zeros.name().address(), 4096, Duration::from_millis(100)).unwrap_err();
    assert!(err.to_string().contains("not a vans accept queue"), "{err}");
    // Wrong size.
    let small = NamedSegment::create(4096).unwrap();
    let err = connect(&small.name().address(), 4096, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, IpcError::BadSegment { .. }), "{err}");
    // Right magic, wrong geometry.
    let file = open_rw(&zeros.path());
    file.write_at(&queue_layout::MAGIC.to_ne_bytes(), 0)
        .unwrap();
    file.write_at(&queue_layout::VERSION.to_ne_bytes(), 8)
        .unwrap();
    file.write_at(&7u32.to_ne_bytes(), 12).unwrap();
    let err = connect(&zeros.name().address(), 4096, Duration::from_millis(100)).unwrap_err();
    assert!(err.to_string().contains("7 slots"), "{err}");
}

#[test]
fn an_abandoned_connect_leaves_nothing_behind() {
    let mut listener = NamedListener::bind().unwrap();
    let address = listener.address().to_owned();
    let dialer = std::thread::spawn(move || connect(&address, 4096, Duration::from_millis(500)));
    let posted = wait_for_posted_name(&listener.name().path());
    let err = dialer.join().unwrap().unwrap_err();
    assert!(matches!(err, IpcError::Rendezvous { .. }), "{err}");
    assert!(!posted.path().exists(), "the dialer removed its segment");
    // The stale post is taken and skipped.
    assert!(listener
        .accept(Duration::from_millis(100))
        .unwrap()
        .is_none());

    // A listener that goes away makes a waiting dialer fail at once, not at its timeout.
    let address = listener.address().to_owned();
    let dialer = std::thread::spawn(move || {
        let start = Instant::now();
        (connect(&address, 4096, WAIT), start.elapsed())
    });
    let posted = wait_for_posted_name(&listener.name().path());
    let queue = listener.name().path();
    drop(listener);
    assert!(!queue.exists(), "the listener removed its accept queue");
    let (result, waited) = dialer.join().unwrap();
    let err = result.unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
    assert!(waited < WAIT / 2, "waited {waited:?}");
    assert!(!posted.path().exists());
}

#[test]
fn malformed_and_foreign_entries_are_listed_never_removed() {
    let _cleaner = cleaner();
    let pid = std::process::id();
    let malformed = std::path::PathBuf::from(format!("/dev/shm/vans-garbage-{pid}-test"));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&malformed)
        .unwrap();
    let directory = std::path::PathBuf::from(format!("/dev/shm/vans-dir-{pid}"));
    std::fs::create_dir(&directory).unwrap();
    // A valid name from another pid namespace whose pid is dead here: unknown, kept.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let elsewhere = SegmentName {
        pid: dead_pid,
        pid_namespace: named::pid_namespace().wrapping_add(1),
        ..SegmentName::fresh().unwrap()
    };
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(elsewhere.path())
        .unwrap();

    let listed = named::list_segments().unwrap();
    let find = |path: &std::path::Path| {
        listed
            .iter()
            .find(|e| e.path == path)
            .unwrap_or_else(|| panic!("{} is not listed", path.display()))
            .clone()
    };
    for path in [&malformed, &directory] {
        let entry = find(path);
        assert!(
            matches!(entry.owner, OwnerStatus::Malformed { .. }),
            "{entry:?}"
        );
        assert_eq!(entry.name, None);
        assert!(!entry.is_stale());
    }
    let entry = find(&elsewhere.path());
    assert!(
        matches!(entry.owner, OwnerStatus::Unknown { .. }),
        "{entry:?}"
    );
    assert!(!entry.is_stale());

    let report = named::clean_stale().unwrap();
    let removed: Vec<_> = report.removed.iter().map(|e| e.path.clone()).collect();
    for path in [&malformed, &directory, &elsewhere.path()] {
        assert!(path.exists(), "{} was touched", path.display());
        assert!(!removed.contains(path));
    }
    std::fs::remove_file(&malformed).unwrap();
    std::fs::remove_dir(&directory).unwrap();
    std::fs::remove_file(elsewhere.path()).unwrap();
}
