//! The README's "Use from C and C++" section cannot rot: its C snippet is extracted, compiled
//! against `libvans.so` and against `libvans.a` with the commands the section gives, and run
//! as a cluster of 1 scheduler, 1 server and 2 workers that must print the sums it promises.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{compile_linked, crate_dir, out_dir, run_cluster, Link};

const HEADING: &str = "\n## Use from C and C++\n";

/// The first ```c block of the README's C section.
fn snippet() -> String {
    let readme = std::fs::read_to_string(crate_dir().join("../../README.md")).unwrap();
    let start = readme.find(HEADING).expect("the README has no C section") + HEADING.len();
    let section = &readme[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let code = section
        .split_once("\n```c\n")
        .expect("the C section has no ```c block")
        .1;
    let end = code.find("\n```\n").expect("the ```c block does not end");
    code[..=end].to_owned()
}

#[test]
fn the_readme_snippet_builds_and_runs_shared_and_static() {
    let source = out_dir().join(format!("readme-{}.c", std::process::id()));
    std::fs::write(&source, snippet()).unwrap();
    for link in [Link::Shared, Link::Static] {
        let program = compile_linked("readme_kv", std::slice::from_ref(&source), false, link);
        let run = run_cluster(program.path(), &[], 1, 2);
        run.assert_success();
        for worker in ["worker-0", "worker-1"] {
            assert_eq!(
                run.log(worker).trim(),
                "sums: 2 4 6",
                "{link:?}: {}",
                run.all_logs()
            );
        }
    }
    let _ = std::fs::remove_file(&source);
}

#[test]
fn the_readme_names_the_build_outputs() {
    let readme = std::fs::read_to_string(crate_dir().join("../../README.md")).unwrap();
    let start = readme.find(HEADING).unwrap();
    let section = &readme[start..];
    for promised in [
        "cargo build --release -p vans-c",
        "target/release/libvans.so and libvans.a",
        "bindings/c/include/vans.h",
        "VANS_BLESS=1 cargo test -p vans-c --test header",
    ] {
        assert!(
            section.contains(promised),
            "the C section lost {promised:?}"
        );
    }
}
