//! `vans-shm`: lists and removes the named shared-memory segments of vans in `/dev/shm`.
//!
//! ```text
//! vans-shm list               every vans-* entry: size, owner pid, whether the owner lives
//! vans-shm clean [--dry-run]  remove (or just show) this user's segments whose owner died
//! ```
//!
//! Exit status: 0 on success, 1 when `/dev/shm` cannot be read or a stale segment could not
//! be removed, 2 on a usage error. Run it with `cargo run -p van-ipc --bin vans-shm -- list`.

#[cfg(target_os = "linux")]
fn main() {
    std::process::exit(linux::run(std::env::args_os().skip(1)));
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("vans-shm: named shared-memory segments exist only on Linux");
    std::process::exit(1);
}

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::OsString;

    use clap::{Parser, Subcommand};
    use van_ipc::named::{self, OwnerStatus, ShmEntry, SHM_DIR};

    /// Lists and removes the named shared-memory segments of vans in /dev/shm.
    #[derive(Debug, Parser)]
    #[command(
        name = "vans-shm",
        arg_required_else_help = true,
        after_help = "Exit status: 0 on success, 1 when /dev/shm cannot be read or a stale \
                      segment could not be removed, 2 on a usage error."
    )]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        /// Show every vans-* segment in /dev/shm with its size, owner pid and whether the
        /// owner is alive.
        List,
        /// Remove this user's segments whose owner process is dead.
        Clean {
            /// Only show what would be removed.
            #[arg(short = 'n', long)]
            dry_run: bool,
        },
    }

    /// Runs the command (`args` without the program name); returns the exit status.
    pub(crate) fn run(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> i32 {
        let program = std::iter::once(OsString::from("vans-shm"));
        match Cli::try_parse_from(program.chain(args.into_iter().map(Into::into))) {
            Ok(Cli {
                command: Command::List,
            }) => list(),
            Ok(Cli {
                command: Command::Clean { dry_run },
            }) => clean(dry_run),
            // Help on stdout with status 0; usage errors on stderr with status 2.
            Err(e) => {
                let _ = e.print();
                e.exit_code()
            }
        }
    }

    fn list() -> i32 {
        let entries = match named::list_segments() {
            Ok(entries) => entries,
            Err(e) => {
                eprintln!("vans-shm: cannot list {SHM_DIR}: {e}");
                return 1;
            }
        };
        if entries.is_empty() {
            println!("no vans segments in {SHM_DIR}");
            return 0;
        }
        let width = entries
            .iter()
            .map(|e| e.file_name.len())
            .max()
            .unwrap_or(0)
            .max("NAME".len());
        println!(
            "{:<width$}  {:>12}  {:>8}  {:>6}  STATUS",
            "NAME", "SIZE", "PID", "UID"
        );
        for entry in &entries {
            println!(
                "{:<width$}  {:>12}  {:>8}  {:>6}  {}",
                entry.file_name,
                human_bytes(entry.size),
                entry
                    .owner_pid()
                    .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                entry.file_uid,
                entry.owner
            );
        }
        let stale: Vec<&ShmEntry> = entries.iter().filter(|e| e.is_stale()).collect();
        let bytes: u64 = stale.iter().map(|e| e.size).sum();
        let malformed = entries
            .iter()
            .filter(|e| matches!(e.owner, OwnerStatus::Malformed { .. }))
            .count();
        print!("{} segment(s), {} stale", entries.len(), stale.len());
        if !stale.is_empty() {
            print!(" ({}): `vans-shm clean` removes them", human_bytes(bytes));
        }
        println!();
        if malformed > 0 {
            println!(
                "{malformed} malformed entr{} (not created by vans, or damaged): left alone",
                if malformed == 1 { "y" } else { "ies" }
            );
        }
        0
    }

    fn clean(dry_run: bool) -> i32 {
        if dry_run {
            return match named::stale_segments() {
                Ok(stale) => {
                    for entry in &stale {
                        println!("would remove {}", describe(entry));
                    }
                    let bytes: u64 = stale.iter().map(|e| e.size).sum();
                    println!(
                        "{} stale segment(s), {} (dry run: nothing removed)",
                        stale.len(),
                        human_bytes(bytes)
                    );
                    0
                }
                Err(e) => {
                    eprintln!("vans-shm: cannot list {SHM_DIR}: {e}");
                    1
                }
            };
        }
        match named::clean_stale() {
            Ok(report) => {
                for entry in &report.removed {
                    println!("removed {}", describe(entry));
                }
                for (entry, reason) in &report.failed {
                    eprintln!("vans-shm: could not remove {}: {reason}", entry.file_name);
                }
                let bytes: u64 = report.removed.iter().map(|e| e.size).sum();
                println!(
                    "removed {} stale segment(s), {} freed",
                    report.removed.len(),
                    human_bytes(bytes)
                );
                if report.failed.is_empty() {
                    0
                } else {
                    1
                }
            }
            Err(e) => {
                eprintln!("vans-shm: cannot list {SHM_DIR}: {e}");
                1
            }
        }
    }

    fn describe(entry: &ShmEntry) -> String {
        format!(
            "{} ({}, owner pid {} dead)",
            entry.file_name,
            human_bytes(entry.size),
            entry
                .owner_pid()
                .map_or_else(|| "?".to_owned(), |p| p.to_string())
        )
    }

    /// `12288` → `12.0 KiB`; below 1 KiB, plain bytes.
    fn human_bytes(bytes: u64) -> String {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if bytes < 1024 {
            return format!("{bytes} B");
        }
        let mut value = bytes as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        format!("{value:.1} {}", UNITS[unit])
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn sizes_read_well() {
            assert_eq!(human_bytes(0), "0 B");
            assert_eq!(human_bytes(1023), "1023 B");
            assert_eq!(human_bytes(12288), "12.0 KiB");
            assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        }

        #[test]
        fn usage_errors_exit_2() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
            assert_eq!(run(Vec::<String>::new()), 2);
            assert_eq!(run(["clean", "--force"]), 2);
            assert_eq!(run(["frobnicate"]), 2);
            assert_eq!(run(["--help"]), 0);
            assert_eq!(run(["help"]), 0);
            assert_eq!(run(["clean", "--help"]), 0);
        }

        #[test]
        fn the_commands_parse_as_before() {
            let parse = |args: &[&str]| {
                Cli::try_parse_from(std::iter::once("vans-shm").chain(args.iter().copied()))
                    .map(|cli| cli.command)
            };
            assert!(matches!(parse(&["list"]), Ok(Command::List)));
            assert!(matches!(
                parse(&["clean"]),
                Ok(Command::Clean { dry_run: false })
            ));
            for dry in ["--dry-run", "-n"] {
                assert!(matches!(
                    parse(&["clean", dry]),
                    Ok(Command::Clean { dry_run: true })
                ));
            }
            assert!(parse(&["list", "--dry-run"]).is_err());
        }
    }
}
