//! How the launcher words what it reports: node names (`server 1`), exit statuses
//! ("was killed by signal 9 (SIGKILL)") and counts ("3 nodes").

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use rustix::process::Signal;
use van_core::Role;

/// A node's name in messages and output prefixes: `scheduler`, `server 0`, `worker 2`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeName(pub(crate) Role, pub(crate) u32);

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Role::Scheduler => f.write_str("scheduler"),
            role => write!(f, "{role} {}", self.1),
        }
    }
}

/// "exited with code 3", "was killed by signal 9 (SIGKILL)".
pub(crate) fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    let Some(number) = status.signal() else {
        return format!("ended with status {status}");
    };
    let core = if status.core_dumped() {
        ", core dumped"
    } else {
        ""
    };
    match signal_name(number) {
        Some(name) => format!("was killed by signal {number} ({name}{core})"),
        None => format!("was killed by signal {number}{core}"),
    }
}

fn signal_name(number: i32) -> Option<&'static str> {
    Some(match Signal::from_named_raw(number)? {
        Signal::HUP => "SIGHUP",
        Signal::INT => "SIGINT",
        Signal::QUIT => "SIGQUIT",
        Signal::ILL => "SIGILL",
        Signal::TRAP => "SIGTRAP",
        Signal::ABORT => "SIGABRT",
        Signal::BUS => "SIGBUS",
        Signal::FPE => "SIGFPE",
        Signal::KILL => "SIGKILL",
        Signal::SEGV => "SIGSEGV",
        Signal::PIPE => "SIGPIPE",
        Signal::ALARM => "SIGALRM",
        Signal::TERM => "SIGTERM",
        Signal::USR1 => "SIGUSR1",
        Signal::USR2 => "SIGUSR2",
        _ => return None,
    })
}

pub(crate) fn plural(count: u32, noun: &str) -> String {
    plural_count(count as usize, noun)
}

pub(crate) fn plural_count(count: usize, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        _ => format!("{count} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LaunchError;

    fn status_of(script: &str) -> ExitStatus {
        match std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .status()
        {
            Ok(status) => status,
            Err(error) => panic!("/bin/sh: {error}"),
        }
    }

    #[test]
    fn node_names_and_statuses_read_like_sentences() {
        assert_eq!(NodeName(Role::Scheduler, 0).to_string(), "scheduler");
        assert_eq!(NodeName(Role::Server, 1).to_string(), "server 1");
        assert_eq!(describe(status_of("exit 3")), "exited with code 3");
        assert_eq!(
            describe(status_of("kill -9 $$")),
            "was killed by signal 9 (SIGKILL)"
        );
        let error = LaunchError::NodeFailed {
            role: Role::Server,
            rank: 1,
            pid: 42,
            status: describe(status_of("exit 3")),
        };
        assert_eq!(error.to_string(), "server 1 exited with code 3");
    }
}
