//! [`EndpointMap`]: the `.endpoint_map` file of the TensorFlow Seastar and StarServer
//! deployments, which maps each control address to a data address.
//!
//! Those deployments keep gRPC for control and run their fast data plane on a second port per
//! task; the file, in the launch directory, says which data port belongs to which control
//! address, one mapping per line:
//!
//! ```text
//! # control (gRPC) address = data (Seastar) address
//! 127.0.0.1:42353=127.0.0.1:46068
//! 127.0.0.1:42354=127.0.0.1:47079
//! [::1]:3333=[::1]:5555
//! ```
//!
//! Rules:
//!
//! - Blank lines and lines starting with `#` are ignored; whitespace around a line and
//!   around each side of `=` is trimmed.
//! - Each side is a [`HostPort`]: a non-empty host and a port in 1..=65535, with IPv6
//!   addresses in brackets (`[::1]:80`).
//! - A control address may appear twice only with the same data address.
//! - Every error names the 1-based line, shows the line and says what was expected.
//!
//! [`Config`](crate::Config) loads the file named by `VANS_ENDPOINT_MAP`, or
//! `./.endpoint_map` when that exists (see [`crate::config`]).
//!
//! # Example
//!
//! ```
//! use van_core::endpoint_map::EndpointMap;
//!
//! let map = EndpointMap::parse("127.0.0.1:3333=127.0.0.1:5555\n# comment\n")?;
//! let data = map.get("127.0.0.1", 3333).unwrap();
//! assert_eq!((data.host.as_str(), data.port), ("127.0.0.1", 5555));
//! assert_eq!(map.lookup("127.0.0.1:3333"), Some(data));
//!
//! let err = EndpointMap::parse("127.0.0.1:3333=127.0.0.1\n").unwrap_err();
//! assert!(err.to_string().contains("line 1"));
//! # Ok::<(), van_core::endpoint_map::EndpointMapError>(())
//! ```

use std::collections::btree_map::{self, BTreeMap};
use std::fmt;
use std::net::Ipv6Addr;
use std::path::Path;
use std::str::FromStr;

/// A `host:port` address as written in `.endpoint_map` and `TF_CONFIG`.
///
/// The host is kept without brackets (`::1`, not `[::1]`); [`Display`](fmt::Display) puts
/// them back for IPv6 hosts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// Host name or IP address, without brackets.
    pub host: String,
    /// Port, 1..=65535.
    pub port: u16,
}

impl HostPort {
    /// An address from its parts; brackets around `host` are removed.
    pub fn new(host: &str, port: u16) -> HostPort {
        HostPort {
            host: unbracket(host).to_owned(),
            port,
        }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for HostPort {
    type Err = AddressError;

    /// Parses `host:port` or `[ipv6]:port` (surrounding whitespace ignored).
    fn from_str(s: &str) -> Result<HostPort, AddressError> {
        let s = s.trim();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or(AddressError::UnclosedBracket)?;
            // A zone (`fe80::1%eth0`) is allowed after the address.
            let address = inside.split_once('%').map_or(inside, |(a, _)| a);
            if address.parse::<Ipv6Addr>().is_err() {
                return Err(AddressError::InvalidIpv6);
            }
            let port = after.strip_prefix(':').ok_or(AddressError::MissingPort)?;
            (inside, port)
        } else {
            let (host, port) = s.rsplit_once(':').ok_or(AddressError::MissingPort)?;
            if host.contains(':') {
                return Err(AddressError::UnbracketedIpv6);
            }
            (host, port)
        };
        if host.is_empty() {
            return Err(AddressError::EmptyHost);
        }
        if host
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '[' | ']' | '/' | '=' | '#'))
        {
            return Err(AddressError::InvalidHost);
        }
        // `u16::from_str` accepts a leading `+`; a port is digits only.
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AddressError::InvalidPort);
        }
        match port.parse::<u16>() {
            Ok(0) | Err(_) => Err(AddressError::InvalidPort),
            Ok(port) => Ok(HostPort {
                host: host.to_owned(),
                port,
            }),
        }
    }
}

/// Why a `host:port` address does not parse; the message says what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// No `:port` after the host.
    #[error("expected `host:port` (the port is missing)")]
    MissingPort,
    /// Nothing before `:port`.
    #[error("expected a non-empty host before `:port`")]
    EmptyHost,
    /// The host holds whitespace, `/`, `=`, `#` or a stray bracket.
    #[error("expected a host name or IP address without whitespace, `/`, `=`, `#`, `[` or `]`")]
    InvalidHost,
    /// The port is not a number in 1..=65535.
    #[error("expected a port number in 1..=65535")]
    InvalidPort,
    /// An IPv6 address without brackets: the port cannot be told apart.
    #[error("expected an IPv6 address in brackets, as in `[::1]:80`")]
    UnbracketedIpv6,
    /// `[` without `]`.
    #[error("expected `]` closing the IPv6 address, as in `[::1]:80`")]
    UnclosedBracket,
    /// The text in brackets is not an IPv6 address.
    #[error("expected an IPv6 address inside the brackets, as in `[::1]:80`")]
    InvalidIpv6,
}

/// A `.endpoint_map` that cannot be used. Parse errors carry the 1-based line number and
/// the line's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointMapError {
    /// The file could not be read.
    #[error("cannot read endpoint map {path:?}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        message: String,
    },
    /// A line is not `address=address`.
    #[error(
        "line {line} ({text:?}): expected `host:port=host:port` (a control address, `=`, \
         its data address)"
    )]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// The line, trimmed.
        text: String,
    },
    /// One side of a line is not a valid `host:port`.
    #[error("line {line} ({text:?}): invalid address {address:?}: {error}")]
    InvalidAddress {
        /// 1-based line number.
        line: usize,
        /// The line, trimmed.
        text: String,
        /// The offending side.
        address: String,
        /// What is wrong with it.
        error: AddressError,
    },
    /// A control address already mapped to a different data address.
    #[error(
        "line {line} ({text:?}): {control} is already mapped to {first} on line {first_line}; \
         expected one data address per control address"
    )]
    Conflict {
        /// 1-based line number of the second mapping.
        line: usize,
        /// The line, trimmed.
        text: String,
        /// The control address mapped twice.
        control: HostPort,
        /// The data address of the first mapping.
        first: HostPort,
        /// 1-based line number of the first mapping.
        first_line: usize,
    },
}

/// Control address → data address, as read from a `.endpoint_map` file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointMap {
    entries: BTreeMap<HostPort, HostPort>,
}

impl EndpointMap {
    /// Parses the text of a `.endpoint_map` file (see the [module docs](self)).
    pub fn parse(text: &str) -> Result<EndpointMap, EndpointMapError> {
        let mut entries: BTreeMap<HostPort, (HostPort, usize)> = BTreeMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let text = raw.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let syntax = || EndpointMapError::Syntax {
                line,
                text: text.to_owned(),
            };
            let (left, right) = text.split_once('=').ok_or_else(syntax)?;
            if right.contains('=') {
                return Err(syntax());
            }
            let address = |side: &str| {
                side.parse::<HostPort>()
                    .map_err(|error| EndpointMapError::InvalidAddress {
                        line,
                        text: text.to_owned(),
                        address: side.trim().to_owned(),
                        error,
                    })
            };
            let (control, data) = (address(left)?, address(right)?);
            match entries.get(&control) {
                Some((first, _)) if *first == data => {}
                Some((first, first_line)) => {
                    return Err(EndpointMapError::Conflict {
                        line,
                        text: text.to_owned(),
                        control,
                        first: first.clone(),
                        first_line: *first_line,
                    })
                }
                None => {
                    entries.insert(control, (data, line));
                }
            }
        }
        Ok(EndpointMap {
            entries: entries
                .into_iter()
                .map(|(control, (data, _))| (control, data))
                .collect(),
        })
    }

    /// Reads and parses the file at `path`; a read error names the path.
    pub fn load(path: &Path) -> Result<EndpointMap, EndpointMapError> {
        let text = std::fs::read_to_string(path).map_err(|e| EndpointMapError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        EndpointMap::parse(&text)
    }

    /// The data address mapped to the control address `host:port` (brackets around an IPv6
    /// `host` are optional).
    pub fn get(&self, host: &str, port: u16) -> Option<&HostPort> {
        self.entries.get(&HostPort::new(host, port))
    }

    /// The data address mapped to the control address written as `host:port`; `None` also
    /// when `address` does not parse.
    pub fn lookup(&self, address: &str) -> Option<&HostPort> {
        self.entries.get(&address.parse::<HostPort>().ok()?)
    }

    /// Maps `control` to `data`, returning the data address it replaces.
    pub fn insert(&mut self, control: HostPort, data: HostPort) -> Option<HostPort> {
        self.entries.insert(control, data)
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no mappings.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The mappings `(control, data)`, ordered by control address.
    pub fn iter(&self) -> btree_map::Iter<'_, HostPort, HostPort> {
        self.entries.iter()
    }
}

impl<'a> IntoIterator for &'a EndpointMap {
    type Item = (&'a HostPort, &'a HostPort);
    type IntoIter = btree_map::Iter<'a, HostPort, HostPort>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

impl FromIterator<(HostPort, HostPort)> for EndpointMap {
    /// Later pairs replace earlier ones with the same control address.
    fn from_iter<I: IntoIterator<Item = (HostPort, HostPort)>>(pairs: I) -> EndpointMap {
        EndpointMap {
            entries: pairs.into_iter().collect(),
        }
    }
}

fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort::new(host, port)
    }

    #[test]
    fn parses_the_seastar_example_with_comments_and_blanks() {
        let text = "# grpc = seastar\n\
                    \n\
                    127.0.0.1:42353=127.0.0.1:46068\n\
                    \t 127.0.0.1:42354 = 127.0.0.1:47079  \r\n\
                    worker-0.svc:2222=worker-0.svc:5555\n\
                    # duplicate with the same target is fine\n\
                    127.0.0.1:42353=127.0.0.1:46068\n";
        let map = EndpointMap::parse(text).unwrap();
        assert_eq!(map.len(), 3);
        assert!(!map.is_empty());
        assert_eq!(map.get("127.0.0.1", 42353), Some(&hp("127.0.0.1", 46068)));
        assert_eq!(map.get("127.0.0.1", 42354), Some(&hp("127.0.0.1", 47079)));
        assert_eq!(
            map.lookup("worker-0.svc:2222"),
            Some(&hp("worker-0.svc", 5555))
        );
        assert_eq!(map.get("127.0.0.1", 1), None);
        assert_eq!(map.lookup("nonsense"), None);
        let controls: Vec<String> = map.iter().map(|(c, _)| c.to_string()).collect();
        assert_eq!(
            controls,
            ["127.0.0.1:42353", "127.0.0.1:42354", "worker-0.svc:2222"]
        );
        assert_eq!((&map).into_iter().count(), 3);
        let rebuilt: EndpointMap = map.iter().map(|(c, d)| (c.clone(), d.clone())).collect();
        assert_eq!(rebuilt, map);
    }

    #[test]
    fn empty_and_comment_only_files_are_empty_maps() {
        for text in ["", "\n\n", "# nothing\n   # here\n"] {
            let map = EndpointMap::parse(text).unwrap();
            assert!(map.is_empty());
            assert_eq!(map.len(), 0);
            assert_eq!(map, EndpointMap::default());
        }
    }

    #[test]
    fn ipv6_in_brackets() {
        let map = EndpointMap::parse("[::1]:3333=[fe80::1%eth0]:5555\n").unwrap();
        let data = map.get("::1", 3333).unwrap();
        assert_eq!(data, &hp("fe80::1%eth0", 5555));
        assert_eq!(map.get("[::1]", 3333), Some(data));
        assert_eq!(map.lookup("[::1]:3333"), Some(data));
        assert_eq!(data.to_string(), "[fe80::1%eth0]:5555");
    }

    #[test]
    fn host_port_errors() {
        let cases = [
            ("host", AddressError::MissingPort),
            (":80", AddressError::EmptyHost),
            ("host:", AddressError::InvalidPort),
            ("host:0", AddressError::InvalidPort),
            ("host:65536", AddressError::InvalidPort),
            ("host:+80", AddressError::InvalidPort),
            ("host:http", AddressError::InvalidPort),
            ("::1:80", AddressError::UnbracketedIpv6),
            ("[::1:80", AddressError::UnclosedBracket),
            ("[nope]:80", AddressError::InvalidIpv6),
            ("[::1]80", AddressError::MissingPort),
            ("a b:80", AddressError::InvalidHost),
            ("a/b:80", AddressError::InvalidHost),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<HostPort>(), Err(expected), "{text}");
        }
        assert_eq!(" h:65535 ".parse::<HostPort>(), Ok(hp("h", 65535)));
    }

    #[test]
    fn errors_name_line_text_and_expectation() {
        let cases: [(&str, usize, &str, &str); 7] = [
            (
                "a:1=b:2\nno equals sign\n",
                2,
                "no equals sign",
                "host:port=host:port",
            ),
            (
                "# c\na:1=b:2=c:3\n",
                2,
                "a:1=b:2=c:3",
                "host:port=host:port",
            ),
            ("\n\na:1=b\n", 3, "a:1=b", "port is missing"),
            ("a:0=b:2\n", 1, "a:0=b:2", "1..=65535"),
            ("=b:2\n", 1, "=b:2", "host:port"),
            ("::1:80=b:2\n", 1, "::1:80=b:2", "brackets"),
            ("a:1=b:2\na:1=c:3\n", 2, "a:1=c:3", "line 1"),
        ];
        for (text, line, shown, expected) in cases {
            let e = EndpointMap::parse(text).unwrap_err();
            let message = e.to_string();
            for part in [
                format!("line {line}"),
                format!("{shown:?}"),
                expected.into(),
            ] {
                assert!(message.contains(&part), "{message:?} lacks {part:?}");
            }
        }
        assert!(matches!(
            EndpointMap::parse("x").unwrap_err(),
            EndpointMapError::Syntax { line: 1, .. }
        ));
        assert!(matches!(
            EndpointMap::parse("a:1=b:2\n a:1 = c:3").unwrap_err(),
            EndpointMapError::Conflict {
                line: 2,
                first_line: 1,
                ..
            }
        ));
        assert!(matches!(
            EndpointMap::parse("a:1=b:99999").unwrap_err(),
            EndpointMapError::InvalidAddress { line: 1, error: AddressError::InvalidPort, ref address, .. }
                if address == "b:99999"
        ));
    }

    #[test]
    fn load_reads_a_file_and_names_a_missing_one() {
        let dir = std::env::temp_dir().join(format!("vans-endpoint-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(".endpoint_map");
        std::fs::write(&path, "127.0.0.1:3333=127.0.0.1:5555\n").unwrap();
        let map = EndpointMap::load(&path).unwrap();
        assert_eq!(map.get("127.0.0.1", 3333), Some(&hp("127.0.0.1", 5555)));
        std::fs::remove_dir_all(&dir).unwrap();
        let e = EndpointMap::load(&path).unwrap_err();
        assert!(matches!(e, EndpointMapError::Io { .. }));
        assert!(e.to_string().contains(".endpoint_map"), "{e}");
    }
}
