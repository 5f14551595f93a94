//! The job service against callers it should not trust: `vans-master` runs whatever command
//! a request names, so every call needs its token when it has one, and without one it stays
//! on loopback. Then abuse: no token, a wrong one, path traversal in task names, oversized
//! and malformed bodies, 1,000 requests at once and a client that never finishes its
//! request; each is refused or bounded, and the master goes on serving. And TLS (feature
//! `tls`): the client trusts the certificate it is given, and no other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::master::{Master, MASTER, SUBMIT};
use jobs::token::TOKEN_ENV;

/// A token as an operator would make one (`openssl rand -hex 16`).
const TOKEN: &str = "3f9c2a7be41d08c65a1f7e93b2d4c081";

/// One master at a time (they pick their tasks' ports in their own processes).
static ONE_MASTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sends `request` (raw bytes) to `addr` and reads the answer until the master closes the
/// connection; the status code and the whole text.
fn raw(addr: &str, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// `GET path` with an optional `Authorization` header value.
fn get(addr: &str, path: &str, authorization: Option<&str>) -> (u16, String) {
    let header = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n{header}\r\n").as_bytes(),
    )
}

/// Runs a command to its end under the tests' deadline (a master that binds instead of
/// refusing would otherwise hang the test), its output captured.
trait RunWithin {
    fn run(&mut self, what: &str) -> std::process::Output;
}

impl RunWithin for std::process::Command {
    fn run(&mut self, what: &str) -> std::process::Output {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        common::wait_output(child, what)
    }
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

#[test]
fn without_a_token_the_master_listens_on_loopback_only() {
    // Refused before it binds anything: the message is about the token, not the address.
    let refused = std::process::Command::new(MASTER)
        .args(["--host", "10.255.255.1", "--port", "1"])
        .env_remove(TOKEN_ENV)
        .run("the master without a token");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains(TOKEN_ENV) && said.contains("--token-file"),
        "{said}"
    );
    // A token too short to be one is refused by name, without being printed.
    let short = std::process::Command::new(MASTER)
        .args(["--port", "1"])
        .env(TOKEN_ENV, "letmein")
        .run("the master with a short token");
    let said = String::from_utf8_lossy(&short.stderr);
    assert!(!short.status.success(), "{said}");
    assert!(
        said.contains("at least 16") && !said.contains("letmein"),
        "{said}"
    );
}

#[test]
fn every_call_needs_the_token_and_vans_submit_presents_it() {
    let _one = ONE_MASTER.lock().unwrap_or_else(|e| e.into_inner());
    let master = Master::start("local", &[(TOKEN_ENV, TOKEN)]);
    let wrong = format!("Bearer {}", TOKEN.replace('3', "4"));
    for authorization in [None, Some("Bearer "), Some(wrong.as_str()), Some(TOKEN)] {
        for path in ["/jobs", "/jobs/1", "/jobs/1/logs/worker-0"] {
            let (code, text) = get(&master.addr, path, authorization);
            assert_eq!(code, 401, "{path} with {authorization:?}: {text}");
            assert!(text.contains("needs its token"), "{text}");
        }
    }
    let (code, text) = get(&master.addr, "/jobs", Some(&bearer()));
    assert_eq!(code, 200, "{text}");
    // vans-submit reads the token from the environment (Master::submit passes it) ...
    let ran = master.submit_task("true", &["true"]);
    let said = common::text(&ran);
    assert!(ran.status.success(), "{said}");
    assert!(said.contains("job 1: succeeded"), "{said}");
    // ... or a file; without either it is refused, and says why.
    let file = std::env::temp_dir().join(format!("vans-token-test-{}", std::process::id()));
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let submit = |token_file: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(SUBMIT);
        cmd.env_remove(TOKEN_ENV)
            .args(["--master", &master.addr, "--strategy", "ParameterServer"])
            .args(["--worker-num", "1", "--task", "again"]);
        if let Some(file) = token_file {
            cmd.arg("--token-file").arg(file);
        }
        cmd.args(["--", "true"]).run("vans-submit")
    };
    let with_file = submit(Some(&file));
    assert!(with_file.status.success(), "{}", common::text(&with_file));
    let without = submit(None);
    let said = common::text(&without);
    assert!(!without.status.success(), "{said}");
    assert!(
        said.contains("401") && said.contains("needs its token"),
        "{said}"
    );
    let _ = std::fs::remove_file(file);
}

#[test]
fn abuse_is_refused_or_bounded_and_the_master_goes_on_serving() {
    let _one = ONE_MASTER.lock().unwrap_or_else(|e| e.into_inner());
    // Room for the 1,000 requests at once below (the cap itself is tested on its own).
    let master = Master::start_with(
        "local",
        &["--read-timeout", "2", "--max-connections", "1100"],
        &[(TOKEN_ENV, TOKEN)],
    );
    let auth = bearer();
    let ran = master.submit_task("t", &["true"]);
    assert!(ran.status.success(), "{}", common::text(&ran));

    // A client that sends half a request and then nothing, held open throughout.
    let mut slow = TcpStream::connect(&master.addr).unwrap();
    slow.write_all(b"POST /jobs HTTP/1.1\r\nHost: m\r\nContent-Length: 100\r\n")
        .unwrap();

    // Path traversal in the task name: no file outside the job's folder is read.
    for path in [
        "/jobs/1/logs/../../../../etc/passwd",
        "/jobs/1/logs/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
        "/jobs/1/logs/%2Fetc%2Fpasswd",
        "/jobs/1/logs/worker-0%2F..%2F..%2F..%2Fetc%2Fpasswd",
    ] {
        let (code, text) = get(&master.addr, path, Some(&auth));
        assert!(code == 404 || code == 400, "{path}: {code} {text}");
        assert!(!text.contains("root:"), "{path}: {text}");
    }
    // Bodies: too large (16 MiB: more than the loopback's socket buffers hold, so the client
    // is still writing when the answer is decided; the whole answer must still reach it),
    // not JSON, JSON of the wrong shape, a lying length.
    let big = vec![b'x'; 16 << 20];
    let mut request = format!(
        "POST /jobs HTTP/1.1\r\nHost: m\r\nConnection: close\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    request.extend_from_slice(&big);
    let (code, text) = raw(&master.addr, &request);
    assert_eq!(code, 413, "{text}");
    // A declared length past what the master drains: answered at once, before any body.
    let request = format!(
        "POST /jobs HTTP/1.1\r\nHost: m\r\nConnection: close\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1u64 << 30
    );
    let (code, text) = raw(&master.addr, request.as_bytes());
    assert_eq!(code, 413, "{text}");
    for body in ["{not json", "[1, 2, 3]", "{\"name\": 7}"] {
        let request = format!(
            "POST /jobs HTTP/1.1\r\nHost: m\r\nConnection: close\r\nAuthorization: {auth}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (code, text) = raw(&master.addr, request.as_bytes());
        assert!((400..500).contains(&code), "{body}: {code} {text}");
    }
    let (code, text) = raw(
        &master.addr,
        format!(
            "POST /jobs HTTP/1.1\r\nHost: m\r\nConnection: close\r\nAuthorization: {auth}\r\n\
             Content-Length: 99999999999999999999\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    assert!((400..500).contains(&code), "{code} {text}");

    // 1,000 requests at once: every one answered, all of them correctly.
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let token = master.token.clone();
    let codes: Vec<u16> = runtime.block_on(async {
        let calls: Vec<_> = (0..1000)
            .map(|_| {
                let (addr, token) = (master.addr.clone(), token.clone());
                tokio::spawn(async move {
                    jobs::client::request(&addr, "GET", "/jobs/1", None, token.as_ref())
                        .await
                        .map_or(0, |(code, _)| code)
                })
            })
            .collect();
        let mut codes = Vec::with_capacity(calls.len());
        for call in calls {
            codes.push(call.await.unwrap_or(0));
        }
        codes
    });
    let answered = codes.iter().filter(|&&c| c == 200).count();
    assert_eq!(answered, 1000, "codes other than 200: {:?}", {
        let mut other: Vec<u16> = codes.into_iter().filter(|&c| c != 200).collect();
        other.dedup();
        other
    });
    eprintln!(
        "1000 concurrent requests answered in {:?}",
        started.elapsed()
    );

    // The master answers at once all along ...
    let quick = Instant::now();
    let (code, text) = get(&master.addr, "/jobs", Some(&auth));
    assert_eq!(code, 200, "{text}");
    assert!(
        quick.elapsed() < Duration::from_secs(5),
        "{:?}",
        quick.elapsed()
    );
    // ... and the slow client's half request was cut off at the read timeout (2 s here): it
    // reads the end of the connection, not a time-out of its own 10 s wait.
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let waited = Instant::now();
    let mut rest = Vec::new();
    let end = slow.read_to_end(&mut rest);
    assert!(end.is_ok(), "{end:?} after {:?}", waited.elapsed());
    assert!(
        waited.elapsed() < Duration::from_secs(5),
        "{:?}",
        waited.elapsed()
    );
    // A body promised and never sent: 408 at the read timeout, no handler runs.
    let started = Instant::now();
    let (code, text) = raw(
        &master.addr,
        format!(
            "POST /jobs HTTP/1.1\r\nHost: m\r\nConnection: close\r\nAuthorization: {auth}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
        )
        .as_bytes(),
    );
    assert_eq!(code, 408, "{text}");
    // The same without the token: refused before any body is read (401, not 408).
    let (code, text) = raw(
        &master.addr,
        b"POST /jobs HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\
          Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    );
    assert_eq!(code, 401, "{text}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

/// The master over HTTPS (`--tls-cert`, `--tls-key`): vans-submit trusts the certificate it
/// is given and no other, and plain HTTP gets no answer.
#[cfg(feature = "tls")]
#[test]
fn over_tls_vans_submit_trusts_the_named_certificate_only() {
    let _one = ONE_MASTER.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("vans-master-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let make = |name: &str| {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
        (cert, key)
    };
    let (cert, key) = make("master");
    let (other, _) = make("other");
    let master = Master::start_with(
        "local",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[(TOKEN_ENV, TOKEN)],
    );
    let submit = |ca: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(SUBMIT);
        cmd.env(TOKEN_ENV, TOKEN)
            .args(["--master", &format!("https://{}", master.addr)])
            .args(["--strategy", "ParameterServer", "--worker-num", "1"])
            .args(["--task", "tls"]);
        if let Some(ca) = ca {
            cmd.arg("--ca-file").arg(ca);
        }
        cmd.args(["--", "true"]).run("vans-submit")
    };
    let trusted = submit(Some(&cert));
    let said = common::text(&trusted);
    assert!(trusted.status.success(), "{said}");
    assert!(said.contains("job 1: succeeded"), "{said}");
    let untrusted = submit(Some(&other));
    let said = common::text(&untrusted);
    assert!(!untrusted.status.success(), "{said}");
    assert!(said.contains("TLS with the master"), "{said}");
    let unnamed = submit(None);
    let said = common::text(&unnamed);
    assert!(!unnamed.status.success(), "{said}");
    assert!(said.contains("--ca-file"), "{said}");
    // Plain HTTP to the TLS port: no HTTP answer; the master goes on serving.
    let (code, _) = get(&master.addr, "/jobs", Some(&bearer()));
    assert_eq!(code, 0);
    let again = submit(Some(&cert));
    assert!(again.status.success(), "{}", common::text(&again));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn connections_beyond_the_cap_get_503_and_a_client_that_never_reads_is_cut_off() {
    let _one = ONE_MASTER.lock().unwrap_or_else(|e| e.into_inner());
    let master = Master::start_with(
        "local",
        &[
            "--max-connections",
            "2",
            "--write-timeout",
            "1",
            "--read-timeout",
            "60",
        ],
        &[],
    );
    // A task whose log (32 MiB) is far more than the loopback's socket buffers hold.
    let ran = master.submit_task(
        "big",
        &[
            "/bin/sh",
            "-c",
            "[ \"$DMLC_ROLE\" = worker ] && head -c 33554432 /dev/zero; exit 0",
        ],
    );
    assert!(ran.status.success(), "{}", common::text(&ran));

    // Slot 1: asks for that log and never reads it. Slot 2: half a request, held open.
    let mut stuck = TcpStream::connect(&master.addr).unwrap();
    stuck
        .write_all(b"GET /jobs/1/logs/worker-0 HTTP/1.1\r\nHost: m\r\n\r\n")
        .unwrap();
    let mut slow = TcpStream::connect(&master.addr).unwrap();
    slow.write_all(b"GET /jobs HTTP/1.1\r\nHost: m\r\n")
        .unwrap();
    // The master accepts in order: the third connection finds both slots taken.
    let (code, text) = get(&master.addr, "/jobs", None);
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("too many connections"), "{text}");

    // Within the write timeout (1 s) the stuck answer is cut off and its slot is free again,
    // long before the half request's read timeout (60 s) would free the other.
    let started = Instant::now();
    loop {
        let (code, text) = get(&master.addr, "/jobs", None);
        if code == 200 {
            assert!(text.contains("\"big\""), "{text}");
            break;
        }
        assert_eq!(code, 503, "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the stuck connection still holds its slot"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // What the stuck client can still read ends well short of the 32 MiB.
    stuck
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let _ = stuck.read_to_end(&mut got);
    assert!(got.len() < 32 << 20, "read {} bytes", got.len());
    drop(slow);
}
