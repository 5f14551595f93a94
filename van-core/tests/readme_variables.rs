//! The README's variable table lists every variable `Config` reads, with its default.

use van_core::config::VARIABLES;

#[test]
fn the_readme_lists_every_configuration_variable() {
    let readme = include_str!("../../README.md");
    for var in VARIABLES {
        let row = readme
            .lines()
            .find(|line| line.starts_with(&format!("| `{}` |", var.name)));
        let Some(row) = row else {
            panic!("README.md has no table row for {}", var.name);
        };
        assert!(
            row.contains(var.default),
            "README.md row of {} does not give its default `{}`",
            var.name,
            var.default
        );
    }
}
