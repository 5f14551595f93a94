//! The book's configuration chapter, `docs/src/operators/configuration.md`, is generated from
//! [`VARIABLES`]: the table between its marker comments is exactly [`render`]'s output, so it
//! lists every variable `Config` reads, with its default and effect, and nothing else.
//!
//! When the table in the code changes, regenerate the chapter with
//! `VANS_BLESS=1 cargo test -p van-core --test docs_variables` (it rewrites only the part
//! between the markers) and commit the result.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::OnceLock;

use van_core::config::VARIABLES;

/// The command that regenerates the chapter, as the failure messages and the markers say.
const BLESS: &str = "VANS_BLESS=1 cargo test -p van-core --test docs_variables";

/// The marker comment before the generated table.
const BEGIN: &str = concat!(
    "<!-- BEGIN GENERATED from van_core::config::VARIABLES: do not edit; regenerate with ",
    "VANS_BLESS=1 cargo test -p van-core --test docs_variables -->"
);

/// The marker comment after it.
const END: &str = "<!-- END GENERATED -->";

/// The chapter, from the repository's root.
const CHAPTER: &str = "docs/src/operators/configuration.md";

fn chapter_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(CHAPTER)
}

/// A table cell: one line, with the characters that would end a cell or a line escaped.
fn cell(text: &str) -> String {
    assert!(
        !text.contains('\n'),
        "a table cell cannot hold a line break: {text:?}"
    );
    text.replace('|', "\\|")
}

/// [`VARIABLES`] as a markdown table, in the order `Config::from_env` checks them.
fn render() -> String {
    let mut table = String::from("| variable | default | effect |\n| --- | --- | --- |\n");
    for var in VARIABLES {
        table.push_str(&format!(
            "| `{}` | {} | {} |\n",
            var.name,
            cell(var.default),
            cell(var.effect)
        ));
    }
    table
}

/// The chapter split around its generated part: (before and `BEGIN`, the table, `END` and after).
fn split(chapter: &str) -> (&str, &str, &str) {
    let begin = chapter.find(BEGIN).unwrap_or_else(|| {
        panic!("{CHAPTER} lacks the marker line {BEGIN:?}; put it (and {END:?}) around the table")
    }) + BEGIN.len();
    let end = begin
        + chapter[begin..]
            .find(END)
            .unwrap_or_else(|| panic!("{CHAPTER} lacks the marker line {END:?}"));
    (&chapter[..begin], &chapter[begin..end], &chapter[end..])
}

/// What goes between the markers: the table, a blank line either side.
fn expected_table() -> String {
    format!("\n\n{}\n", render())
}

/// The chapter's text, after rewriting its generated part first when `VANS_BLESS=1` (once,
/// before any test reads it: the tests run in parallel).
fn chapter() -> String {
    static BLESSED: OnceLock<()> = OnceLock::new();
    let path = chapter_path();
    let read = || {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    };
    BLESSED.get_or_init(|| {
        if std::env::var_os("VANS_BLESS").is_some_and(|v| v == "1") {
            let text = read();
            let (before, table, after) = split(&text);
            let expected = expected_table();
            if table != expected {
                std::fs::write(&path, format!("{before}{expected}{after}")).unwrap();
                eprintln!("rewrote the generated table of {}", path.display());
            }
        }
    });
    read()
}

#[test]
fn the_configuration_chapter_is_generated_from_the_variable_table() {
    let chapter = chapter();
    let (_, table, _) = split(&chapter);
    let expected = expected_table();
    if table == expected {
        return;
    }
    let first_difference = table
        .lines()
        .zip(expected.lines())
        .position(|(have, want)| have != want)
        .map_or_else(
            || {
                format!(
                    "the chapter's table has {} lines, the code's {}",
                    table.lines().count(),
                    expected.lines().count()
                )
            },
            |i| {
                format!(
                    "first difference at table line {}:\n  chapter: {}\n  code:    {}",
                    i + 1,
                    table.lines().nth(i).unwrap_or(""),
                    expected.lines().nth(i).unwrap_or("")
                )
            },
        );
    panic!(
        "{CHAPTER} is out of date with van_core::config::VARIABLES ({first_difference}).\n\
         Regenerate it with `{BLESS}` and commit the result."
    );
}

/// The promise the README's table made before it became this chapter, checked on the
/// file itself: a row per variable, giving its default, and no row for a variable `Config`
/// does not read.
#[test]
fn the_chapter_lists_every_configuration_variable_with_its_default() {
    let chapter = chapter();
    let (_, table, _) = split(&chapter);
    for var in VARIABLES {
        let prefix = format!("| `{}` |", var.name);
        let rows: Vec<_> = table
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .collect();
        let [row] = rows[..] else {
            panic!(
                "the configuration chapter has {} table rows for {} (want 1); regenerate it with `{BLESS}`",
                rows.len(),
                var.name
            );
        };
        assert!(
            row.contains(var.default),
            "the configuration chapter's row of {} does not give its default `{}`; regenerate it with `{BLESS}`",
            var.name,
            var.default
        );
    }
    for line in table.lines().filter(|line| line.starts_with("| `")) {
        let name = line.trim_start_matches("| `").split('`').next().unwrap();
        assert!(
            VARIABLES.iter().any(|var| var.name == name),
            "the configuration chapter's generated table lists {name}, which Config does not read; regenerate it with `{BLESS}`"
        );
    }
}
