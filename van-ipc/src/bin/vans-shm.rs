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
    std::process::exit(linux::run(std::env::args().skip(1).collect()));
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("vans-shm: named shared-memory segments exist only on Linux");
    std::process::exit(1);
}

#[cfg(target_os = "linux")]
mod linux {
    use van_ipc::named::{self, OwnerStatus, ShmEntry, SHM_DIR};

    const USAGE: &str = "\
usage: vans-shm list
       vans-shm clean [--dry-run]

list   show every vans-* segment in /dev/shm with its size, owner pid and whether the
       owner is alive
clean  remove this user's segments whose owner process is dead; --dry-run only shows them";

    /// Runs the command; returns the exit status.
    pub(crate) fn run(args: Vec<String>) -> i32 {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match args.as_slice() {
            ["list"] => list(),
            ["clean"] => clean(false),
            ["clean", "--dry-run"] | ["clean", "-n"] => clean(true),
            ["help"] | ["--help"] | ["-h"] => {
                println!("{USAGE}");
                0
            }
            _ => {
                eprintln!("{USAGE}");
                2
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
            assert_eq!(run(vec![]), 2);
            assert_eq!(run(vec!["clean".into(), "--force".into()]), 2);
            assert_eq!(run(vec!["--help".into()]), 0);
        }
    }
}
