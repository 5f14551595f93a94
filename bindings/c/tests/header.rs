//! The checked-in `include/vans.h` is what cbindgen generates from the sources today.
//!
//! Regenerate it after changing the C ABI with
//! `VANS_BLESS=1 cargo test -p vans-c --test header`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn the_checked_in_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap();
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = crate_dir.join("include").join("vans.h");
    if std::env::var_os("VANS_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    if checked_in != fresh {
        let first_difference = checked_in
            .split(|&b| b == b'\n')
            .zip(fresh.split(|&b| b == b'\n'))
            .position(|(old, new)| old != new)
            .map_or("at the end".to_owned(), |line| {
                format!("at line {}", line + 1)
            });
        panic!(
            "{} is stale (first difference {first_difference}): the C ABI changed. Regenerate \
             it with `VANS_BLESS=1 cargo test -p vans-c --test header` and commit it.",
            path.display()
        );
    }
}
