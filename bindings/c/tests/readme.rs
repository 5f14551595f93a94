//! The book's "Use from C and C++" chapter (`docs/src/c.md`) cannot rot: its C snippet is
//! extracted, compiled against `libvans.so` and against `libvans.a` with the commands the
//! chapter gives, and run as a cluster of 1 scheduler, 1 server and 2 workers that must print
//! the sums it promises.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{compile_linked, crate_dir, out_dir, run_cluster, Link};

/// The chapter, from the repository's root.
const CHAPTER: &str = "docs/src/c.md";

/// The chapter's title, its first line.
const HEADING: &str = "# Use from C and C++\n";

/// The C chapter, checked to be the one this test is about.
fn chapter() -> String {
    let text = std::fs::read_to_string(crate_dir().join("../..").join(CHAPTER))
        .unwrap_or_else(|e| panic!("cannot read {CHAPTER}: {e}"));
    assert!(
        text.starts_with(HEADING),
        "{CHAPTER} no longer starts with {HEADING:?}"
    );
    text
}

/// The first ```c block of the book's C chapter.
fn snippet() -> String {
    let section = chapter();
    let code = section
        .split_once("\n```c\n")
        .expect("the C chapter has no ```c block")
        .1;
    let end = code.find("\n```\n").expect("the ```c block does not end");
    code[..=end].to_owned()
}

#[test]
fn the_chapter_snippet_builds_and_runs_shared_and_static() {
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
fn the_chapter_names_the_build_outputs() {
    let section = chapter();
    for promised in [
        "cargo build --release -p vans-c",
        "target/release/libvans.so and libvans.a",
        "bindings/c/include/vans.h",
        "VANS_BLESS=1 cargo test -p vans-c --test header",
    ] {
        assert!(
            section.contains(promised),
            "the C chapter ({CHAPTER}) lost {promised:?}"
        );
    }
}
