//! The Dockerfile, checked as far as it can be without building the image (about 15 minutes,
//! too long for the test command; it is built by hand with `deploy/local-images.sh`'s base
//! images): its stages and what each copies from another, that it builds every program of
//! the `examples` and `jobs` crates with features that exist, that it installs each of those
//! programs,
//! that the Python wheel it builds is the project's, and that the build context leaves out
//! the build outputs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
        }
    }
    out
}

/// The crates whose programs the image holds.
const CRATES: [&str; 2] = ["examples", "jobs"];

/// The programs of `CRATES`: src/bin/NAME.rs and src/bin/NAME/main.rs.
fn programs() -> BTreeSet<String> {
    CRATES
        .iter()
        .flat_map(|krate| std::fs::read_dir(root().join(krate).join("src/bin")).unwrap())
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            if p.is_dir() {
                p.join("main.rs")
                    .exists()
                    .then(|| p.file_name().unwrap().to_string_lossy().into_owned())
            } else {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.strip_suffix(".rs").map(str::to_owned)
            }
        })
        .collect()
}

#[test]
fn the_dockerfile_builds_and_installs_every_program_from_its_own_stages() {
    let instructions = instructions();
    // Stages, and every COPY --from names an earlier one.
    let mut stages = Vec::new();
    for i in &instructions {
        if let Some(from) = i.strip_prefix("FROM ") {
            let name = from
                .split_once(" AS ")
                .map(|(_, n)| n.trim().to_owned())
                .expect("every stage is named");
            stages.push(name);
        }
        if let Some(copy) = i.strip_prefix("COPY --from=") {
            let stage = copy.split_whitespace().next().unwrap();
            assert!(
                stages.iter().any(|s| s == stage),
                "COPY --from={stage} before or without that stage: {stages:?}"
            );
        }
    }
    assert_eq!(
        stages,
        ["builder", "runtime"],
        "a build stage and a runtime stage"
    );

    // The cargo build: both crates, locked, with features (`crate/feature`) they have.
    let build = instructions
        .iter()
        .find(|i| i.contains("cargo build"))
        .expect("a cargo build");
    assert!(build.contains("--release") && build.contains("--locked"));
    for krate in CRATES {
        assert!(
            build.contains(&format!("-p {krate}")),
            "the build lacks -p {krate}"
        );
    }
    let features: Vec<&str> = build
        .split_once("--features")
        .map(|(_, f)| f.split_whitespace().next().unwrap().split(',').collect())
        .expect("--features");
    for feature in &features {
        let (krate, name) = feature
            .split_once('/')
            .expect("features named crate/feature (two crates are built)");
        assert!(
            CRATES.contains(&krate),
            "{feature}: not a crate of the image"
        );
        let manifest = toml_features::read(&root().join(krate).join("Cargo.toml"));
        assert!(manifest.contains(name), "no feature {name} in {krate}");
    }
    for needed in [
        "examples/ipc",
        "examples/uring",
        "examples/rdma",
        "jobs/ipc",
        "jobs/uring",
        "jobs/rdma",
        "jobs/kubernetes",
    ] {
        assert!(features.contains(&needed), "the image lacks {needed}");
    }
    // RDMA needs its system packages in the builder and libibverbs in the runtime.
    let apt: Vec<&String> = instructions
        .iter()
        .filter(|i| i.contains("apt-get install"))
        .collect();
    assert_eq!(apt.len(), 2);
    for package in ["cmake", "libclang-dev", "libibverbs-dev"] {
        assert!(apt[0].contains(package), "builder lacks {package}");
    }
    assert!(apt[1].contains("libibverbs1") && apt[1].contains("python3-numpy"));

    // Every program is installed, and nothing that is not one.
    let installs = instructions
        .iter()
        .find(|i| i.contains("for bin in"))
        .expect("the install loop");
    let listed: BTreeSet<String> = installs
        .split_once("for bin in")
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(names, _)| names.split_whitespace().map(str::to_owned).collect())
        .unwrap();
    assert_eq!(listed, programs());

    // The wheel is the project's Python package.
    let wheel = instructions
        .iter()
        .find(|i| i.contains("maturin build"))
        .expect("a wheel build");
    let manifest = wheel
        .split_once("maturin build")
        .unwrap()
        .1
        .split_whitespace()
        .skip_while(|w| *w != "-m")
        .nth(1)
        .unwrap();
    assert!(root().join(manifest).exists(), "{manifest}");

    // The build context leaves out build outputs.
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    for path in ["target/", ".git/", "fuzz/target/"] {
        assert!(
            ignore.lines().any(|l| l.trim() == path),
            ".dockerignore lacks {path}"
        );
    }
}

/// The feature names of a Cargo manifest, read without a TOML parser: the keys of its
/// `[features]` table.
mod toml_features {
    use std::path::Path;

    pub(crate) struct Features(Vec<String>);

    impl Features {
        pub(crate) fn contains(&self, name: &str) -> bool {
            self.0.iter().any(|f| f == name)
        }
    }

    pub(crate) fn read(path: &Path) -> Features {
        let text = std::fs::read_to_string(path).unwrap();
        let mut in_features = false;
        let mut names = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_features = line == "[features]";
                continue;
            }
            if in_features {
                if let Some((name, _)) = line.split_once('=') {
                    if !line.starts_with('#') {
                        names.push(name.trim().to_owned());
                    }
                }
            }
        }
        Features(names)
    }
}
