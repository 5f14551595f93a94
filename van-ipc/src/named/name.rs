//! Segment names: `vans-<uid>-<pid>-<pid namespace>-<16 hex digits>`, made fresh and parsed
//! strictly.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::OnceLock;

use super::{ADDRESS_PREFIX, MAX_NAME_BYTES, NAME_PREFIX, SHM_DIR};
use crate::error::IpcError;

/// The name of a named segment: `vans-<uid>-<pid>-<pid namespace>-<16 hex digits>`.
///
/// Parsing is strict — decimal fields without leading zeros, a pid in `1..=i32::MAX`,
/// exactly 16 lowercase hex digits — so [`fmt::Display`] gives back exactly the parsed text.
///
/// ```
/// use van_ipc::named::SegmentName;
/// let name: SegmentName = "vans-1000-4242-4026531836-0123456789abcdef".parse()?;
/// assert_eq!(name.uid, 1000);
/// assert_eq!(name.pid, 4242);
/// assert_eq!(name.address(), "shm:vans-1000-4242-4026531836-0123456789abcdef");
/// assert!("vans-1000-4242-0123456789abcdef".parse::<SegmentName>().is_err());
/// # Ok::<(), van_ipc::IpcError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentName {
    /// Effective uid of the creator.
    pub uid: u32,
    /// Pid of the creator, in its own pid namespace.
    pub pid: u32,
    /// Inode of the creator's pid namespace (`/proc/self/ns/pid`), 0 when unknown.
    pub pid_namespace: u64,
    /// The unguessable part.
    pub random: u64,
}

impl SegmentName {
    /// A fresh name for a segment this process creates.
    ///
    /// # Errors
    ///
    /// [`IpcError::Os`] when `getrandom` fails: names must not be guessable, so there is no
    /// weaker fallback.
    pub fn fresh() -> Result<SegmentName, IpcError> {
        Ok(SegmentName {
            uid: effective_uid(),
            pid: std::process::id(),
            pid_namespace: pid_namespace(),
            random: random_u64()?,
        })
    }

    /// Parses a segment name (the file name in `/dev/shm`, without a leading `/`).
    ///
    /// # Errors
    ///
    /// [`IpcError::BadName`] saying which part is wrong.
    pub fn parse(name: &str) -> Result<SegmentName, IpcError> {
        let bad = |reason: String| IpcError::BadName {
            name: name.chars().take(2 * MAX_NAME_BYTES).collect(),
            reason,
        };
        if name.len() > MAX_NAME_BYTES {
            return Err(bad(format!(
                "{} bytes, longer than the {MAX_NAME_BYTES} a segment name can have",
                name.len()
            )));
        }
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
            return Err(bad(format!("does not start with {NAME_PREFIX:?}")));
        };
        let mut parts = rest.split('-');
        let (Some(uid), Some(pid), Some(namespace), Some(random), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad(
                "expected vans-<uid>-<pid>-<pid namespace>-<16 hex digits>".into(),
            ));
        };
        let uid = decimal(uid, "uid", u64::from(u32::MAX)).map_err(&bad)?;
        let pid = decimal(pid, "pid", i32::MAX as u64).map_err(&bad)?;
        if pid == 0 {
            return Err(bad("pid 0 is not a process".into()));
        }
        let pid_namespace = decimal(namespace, "pid namespace", u64::MAX).map_err(&bad)?;
        if random.len() != 16
            || !random
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(bad(format!(
                "random part {random:?} is not 16 lowercase hex digits"
            )));
        }
        let random = u64::from_str_radix(random, 16).map_err(|e| bad(e.to_string()))?;
        Ok(SegmentName {
            uid: u32::try_from(uid).map_err(|e| bad(e.to_string()))?,
            pid: u32::try_from(pid).map_err(|e| bad(e.to_string()))?,
            pid_namespace,
            random,
        })
    }

    /// Parses a listener address: `shm:<name>` (a bare name is accepted too).
    ///
    /// # Errors
    ///
    /// [`IpcError::BadName`] when the name inside is not valid.
    pub fn from_address(address: &str) -> Result<SegmentName, IpcError> {
        SegmentName::parse(address.strip_prefix(ADDRESS_PREFIX).unwrap_or(address))
    }

    /// The address a listener whose accept queue has this name announces: `shm:<name>`.
    pub fn address(&self) -> String {
        format!("{ADDRESS_PREFIX}{self}")
    }

    /// The file behind the name: `/dev/shm/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(SHM_DIR).join(self.to_string())
    }

    /// The name as `shm_open` takes it (with a leading `/`).
    pub(crate) fn os_id(&self) -> String {
        format!("/{self}")
    }
}

impl fmt::Display for SegmentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{NAME_PREFIX}{}-{}-{}-{:016x}",
            self.uid, self.pid, self.pid_namespace, self.random
        )
    }
}

impl FromStr for SegmentName {
    type Err = IpcError;

    fn from_str(name: &str) -> Result<SegmentName, IpcError> {
        SegmentName::parse(name)
    }
}

/// A canonical decimal (digits only, no leading zero unless it is `0`) of at most `max`.
fn decimal(text: &str, what: &str, max: u64) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} {text:?} is not a decimal number"));
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(format!("{what} {text:?} has a leading zero"));
    }
    match text.parse::<u64>() {
        Ok(value) if value <= max => Ok(value),
        _ => Err(format!("{what} {text:?} is larger than {max}")),
    }
}

/// This process's effective uid.
pub(crate) fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Inode of this process's pid namespace, 0 when `/proc` cannot tell (then no segment's
/// owner can be judged dead by pid, see [`OwnerStatus`](super::OwnerStatus)).
pub fn pid_namespace() -> u64 {
    static NAMESPACE: OnceLock<u64> = OnceLock::new();
    *NAMESPACE.get_or_init(|| std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino()))
}

/// 64 random bits from the kernel: there is no fallback, a name must not be guessable.
pub(crate) fn random_u64() -> Result<u64, IpcError> {
    getrandom::u64().map_err(|e| IpcError::Os {
        call: "getrandom",
        source: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any name prints and parses back to itself.
        #[test]
        fn any_name_round_trips(
            uid: u32,
            pid in 1u32..=i32::MAX as u32,
            pid_namespace: u64,
            random: u64,
        ) {
            let name = SegmentName { uid, pid, pid_namespace, random };
            prop_assert_eq!(SegmentName::parse(&name.to_string()).unwrap(), name);
        }

        /// Parsing arbitrary text never panics, and what parses prints back identically.
        #[test]
        fn parsing_is_total_and_canonical(text in "(vans-)?[0-9a-f-]{0,70}|\\PC{0,80}") {
            if let Ok(name) = SegmentName::parse(&text) {
                prop_assert_eq!(name.to_string(), text);
            }
        }
    }

    fn name(text: &str) -> Result<SegmentName, IpcError> {
        SegmentName::parse(text)
    }

    #[test]
    fn names_round_trip() {
        let fresh = SegmentName::fresh().unwrap();
        assert_eq!(fresh.uid, effective_uid());
        assert_eq!(fresh.pid, std::process::id());
        let text = fresh.to_string();
        assert!(text.len() <= MAX_NAME_BYTES);
        assert_eq!(name(&text).unwrap(), fresh);
        assert_eq!(SegmentName::from_address(&fresh.address()).unwrap(), fresh);
        let max = SegmentName {
            uid: u32::MAX,
            pid: i32::MAX as u32,
            pid_namespace: u64::MAX,
            random: u64::MAX,
        };
        assert_eq!(max.to_string().len(), MAX_NAME_BYTES);
        assert_eq!(name(&max.to_string()).unwrap(), max);
        assert_ne!(SegmentName::fresh().unwrap().random, fresh.random);
    }

    #[test]
    fn malformed_names_are_rejected_with_a_reason() {
        for bad in [
            "",
            "vans-",
            "vans-1-2-3",
            "vans-1-2-3-0123456789abcdef-x",
            "shm-1-2-3-0123456789abcdef",
            "vans-01-2-3-0123456789abcdef",
            "vans-1-0-3-0123456789abcdef",
            "vans-1-2147483648-3-0123456789abcdef",
            "vans-4294967296-2-3-0123456789abcdef",
            "vans-1-2-3-0123456789ABCDEF",
            "vans-1-2-3-0123456789abcde",
            "vans-1-2-3-0123456789abcdeg",
            "vans-+1-2-3-0123456789abcdef",
            "vans-1-2-99999999999999999999999-0123456789abcdef",
            "vans-1-2-3-../../etc/passwd",
            "vans-1-2-3-01234567\u{e9}abcdef",
            &"vans-1-2-3-".repeat(20),
        ] {
            match name(bad) {
                Err(IpcError::BadName { reason, .. }) => assert!(!reason.is_empty()),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}
