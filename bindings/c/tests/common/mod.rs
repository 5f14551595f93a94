//! Compiling C and C++ programs against `include/vans.h` and `libvans.so` with the system
//! compilers, and running them as a local cluster through `launcher`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use launcher::{launch, LaunchSpec};

/// How long one cluster may run: generous for a loaded 2-core machine.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(90);

/// `bindings/c`.
pub(crate) fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put `libvans.so` and `libvans.a` for this build: the test executable is
/// `target/<profile>/deps/<test>-<hash>`, and `cargo test` builds the library's C crate
/// types right there (only `cargo build` copies them up to `target/<profile>`, so those
/// could be stale).
pub(crate) fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    for lib in ["libvans.so", "libvans.a"] {
        assert!(
            dir.join(lib).exists(),
            "no {lib} in {} (cargo test builds it beside the tests)",
            dir.display()
        );
    }
    dir
}

/// Where the test programs go: `target/<profile>/vans-c-tests`.
pub(crate) fn out_dir() -> PathBuf {
    let dir = lib_dir().parent().unwrap().join("vans-c-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// How a test program links the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// `-lvans` (`libvans.so`) with an rpath to it.
    Shared,
    /// `libvans.a`, with the system libraries the C chapter of the book names.
    Static,
}

/// A compiled test program, deleted when dropped (a statically linked debug build is large).
pub(crate) struct Program(PathBuf);

impl Program {
    /// The executable.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Compiles `sources` into the executable `name` with `cc` (C11) or, when `cpp`, `c++`
/// (C++17), warnings as errors, linked against `libvans.so` with an rpath to it.
pub(crate) fn compile(name: &str, sources: &[PathBuf], cpp: bool) -> Program {
    compile_linked(name, sources, cpp, Link::Shared)
}

/// [`compile`], linking as `link` says.
pub(crate) fn compile_linked(name: &str, sources: &[PathBuf], cpp: bool, link: Link) -> Program {
    let lib_dir = lib_dir();
    let out_dir = out_dir();
    // Tests run in parallel and may build the same source: each build gets its own file.
    static BUILDS: AtomicUsize = AtomicUsize::new(0);
    let build = BUILDS.fetch_add(1, Ordering::Relaxed);
    let exe = out_dir.join(format!("{name}-{}-{build}", std::process::id()));
    let tests = crate_dir().join("tests");
    let (compiler, standard) = if cpp {
        ("c++", "-std=c++17")
    } else {
        ("cc", "-std=c11")
    };
    let output = Command::new(compiler)
        .arg(standard)
        .arg("-D_POSIX_C_SOURCE=200809L")
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-g"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-I")
        .arg(tests.join("c"))
        .arg("-I")
        .arg(tests.join("cpp"))
        .arg("-o")
        .arg(&exe)
        .args(sources)
        .args(link_args(&lib_dir, link))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} failed for {name}:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Program(exe)
}

/// The linker arguments for `link`.
fn link_args(lib_dir: &Path, link: Link) -> Vec<String> {
    let mut args = match link {
        Link::Shared => vec![
            "-L".to_owned(),
            lib_dir.display().to_string(),
            format!("-Wl,-rpath,{}", lib_dir.display()),
            // DT_RPATH, which the loader searches before LD_LIBRARY_PATH: `cargo test` puts
            // `target/<profile>` on that path, where an older libvans.so may lie.
            "-Wl,--disable-new-dtags".to_owned(),
            "-lvans".to_owned(),
        ],
        Link::Static => vec![lib_dir.join("libvans.a").display().to_string()],
    };
    args.extend(["-lpthread", "-ldl", "-lm"].map(str::to_owned));
    if link == Link::Static && cfg!(feature = "rdma") {
        args.push("-libverbs".to_owned());
    }
    args
}

/// A C test program of `tests/c`.
pub(crate) fn c_program(file: &str) -> Program {
    let name = file.trim_end_matches(".c");
    compile(name, &[crate_dir().join("tests/c").join(file)], false)
}

/// What each node of a cluster printed (stdout and stderr together), by name
/// (`scheduler-0`, `server-1`, `worker-0`, ...), in start order.
pub(crate) struct ClusterRun {
    pub(crate) result: Result<(), String>,
    pub(crate) logs: Vec<(String, String)>,
}

impl ClusterRun {
    /// Panics, showing every node's output, unless every node exited with code 0.
    pub(crate) fn assert_success(&self) -> &Self {
        if let Err(e) = &self.result {
            panic!("the cluster failed: {e}\n{}", self.all_logs());
        }
        self
    }

    /// Every node's output, each under its name.
    pub(crate) fn all_logs(&self) -> String {
        self.logs
            .iter()
            .map(|(name, log)| format!("--- {name}\n{log}"))
            .collect()
    }

    /// The output of node `name` (`worker-0`, ...).
    pub(crate) fn log(&self, name: &str) -> &str {
        self.logs
            .iter()
            .find(|(node, _)| node == name)
            .map_or("", |(_, log)| log.as_str())
    }
}

/// Runs `program args` as a local cluster of one scheduler, `servers` servers and `workers`
/// workers (`launcher::launch`, which gives each its `DMLC_*` environment), each node's
/// output going to its own log.
pub(crate) fn run_cluster(program: &Path, args: &[&str], servers: u32, workers: u32) -> ClusterRun {
    let name = program.file_name().unwrap().to_string_lossy().into_owned();
    let logs_dir = std::env::temp_dir().join(format!(
        "vans-c-{}-{name}-{}",
        std::process::id(),
        args.join("-")
    ));
    let _ = std::fs::remove_dir_all(&logs_dir);
    std::fs::create_dir_all(&logs_dir).unwrap();

    let mut spec = LaunchSpec::new(servers, workers, "/bin/sh");
    spec.args = vec![
        "-c".into(),
        r#"exec "$0" "$@" >"$VANS_C_TEST_LOGS/$DMLC_ROLE-$VANS_LAUNCH_RANK" 2>&1"#.into(),
        program.display().to_string(),
    ];
    spec.args.extend(args.iter().map(|arg| arg.to_string()));
    spec.env = vec![
        ("VANS_C_TEST_LOGS".into(), logs_dir.display().to_string()),
        ("VANS_BOOTSTRAP_TIMEOUT_SECS".into(), "30".into()),
    ];
    spec.timeout = Some(CLUSTER_TIMEOUT);
    spec.grace = Duration::from_secs(1);
    spec.handle_signals = false;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = runtime
        .block_on(launch(&spec))
        .map(drop)
        .map_err(|e| e.to_string());

    let names = std::iter::once("scheduler-0".to_owned())
        .chain((0..servers).map(|rank| format!("server-{rank}")))
        .chain((0..workers).map(|rank| format!("worker-{rank}")));
    let logs = names
        .map(|node| {
            let log = std::fs::read_to_string(logs_dir.join(&node)).unwrap_or_default();
            (node, log)
        })
        .collect();
    let _ = std::fs::remove_dir_all(&logs_dir);
    let run = ClusterRun { result, logs };
    eprintln!("{}", run.all_logs());
    run
}

/// The number after `prefix` on the line of `log` that contains it.
pub(crate) fn number_after(log: &str, prefix: &str) -> Option<f64> {
    let at = log.find(prefix)? + prefix.len();
    log[at..]
        .split_whitespace()
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()
}
