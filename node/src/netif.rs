//! The address a node announces: the IPv4 address of a network interface by name, for
//! `DMLC_INTERFACE` (ps-lite and BytePS users set e.g. `DMLC_INTERFACE=eth0` to choose the
//! network a node announces), or without it the address that routes to the scheduler
//! ([`route_to`]).
//!
//! ```
//! let lo = node::netif::interface_ipv4("lo")?;
//! assert!(lo.is_loopback());
//! # Ok::<(), node::netif::InterfaceError>(())
//! ```

use std::ffi::CStr;
use std::io;
use std::net::Ipv4Addr;

/// Why an interface's address could not be found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InterfaceError {
    /// No interface has this name: pick one of `available` (or set `DMLC_NODE_HOST`).
    #[error(
        "no network interface named {name:?}; available: {}; set DMLC_INTERFACE to one of \
         them, or DMLC_NODE_HOST to the address to announce",
        available.join(", ")
    )]
    NotFound {
        /// The name asked for.
        name: String,
        /// Every interface of this machine, in the order the system lists them.
        available: Vec<String>,
    },
    /// The interface exists but has no IPv4 address (it is down, or IPv6 only).
    #[error(
        "network interface {name:?} has no IPv4 address; bring it up, choose another \
         DMLC_INTERFACE, or set DMLC_NODE_HOST to the address to announce"
    )]
    NoIpv4 {
        /// The interface.
        name: String,
    },
    /// The system could not list its interfaces (`getifaddrs` failed).
    #[error("cannot list the network interfaces: {0}")]
    Os(#[from] io::Error),
}

/// The first IPv4 address of interface `name` (as ps-lite's `GetIP` picks it).
pub fn interface_ipv4(name: &str) -> Result<Ipv4Addr, InterfaceError> {
    let entries = IfAddrs::get()?.entries();
    if let Some(ip) = entries
        .iter()
        .find_map(|(n, ip)| if n == name { *ip } else { None })
    {
        return Ok(ip);
    }
    if entries.iter().any(|(n, _)| n == name) {
        return Err(InterfaceError::NoIpv4 { name: name.into() });
    }
    let mut available: Vec<String> = Vec::new();
    for (n, _) in entries {
        if !available.contains(&n) {
            available.push(n);
        }
    }
    Err(InterfaceError::NotFound {
        name: name.into(),
        available,
    })
}

/// Every IPv4 address of every interface, as (interface name, address), in the order the
/// system lists them; an interface with several addresses appears once per address.
pub fn interfaces() -> Result<Vec<(String, Ipv4Addr)>, InterfaceError> {
    let entries = IfAddrs::get()?.entries();
    Ok(entries
        .into_iter()
        .filter_map(|(name, ip)| Some((name, ip?)))
        .collect())
}

/// Why no address routes to the scheduler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The scheduler's name did not resolve to an IPv4 address.
    #[error("cannot resolve {host}:{port} to an IPv4 address: {reason}")]
    Resolve {
        /// The name.
        host: String,
        /// The port.
        port: u16,
        /// What the resolver said.
        reason: String,
    },
    /// No route reaches it (the kernel refused to pick a source address).
    #[error("no route from this machine to {addr}: {source}")]
    NoRoute {
        /// The scheduler's address.
        addr: std::net::SocketAddrV4,
        /// The system's error.
        source: io::Error,
    },
}

/// The local IPv4 address the kernel sends from to reach `host:port`, and the interface that
/// holds it (when one does): what ps-lite announces when `DMLC_INTERFACE` is unset, so a
/// launcher that sets only `DMLC_PS_ROOT_URI` (ps-lite's own tracker) works. A UDP socket
/// connected to the address reports the source address routing picks; nothing is sent.
pub async fn route_to(host: &str, port: u16) -> Result<(Ipv4Addr, Option<String>), RouteError> {
    let resolve = |reason: String| RouteError::Resolve {
        host: host.into(),
        port,
        reason,
    };
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| resolve(e.to_string()))?;
    let addr = addrs
        .filter_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(v4),
            std::net::SocketAddr::V6(_) => None,
        })
        .next()
        .ok_or_else(|| resolve("no IPv4 address".into()))?;
    let no_route = |source: io::Error| RouteError::NoRoute { addr, source };
    let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(no_route)?;
    socket.connect(addr).map_err(no_route)?;
    let local = match socket.local_addr().map_err(no_route)? {
        std::net::SocketAddr::V4(v4) => *v4.ip(),
        std::net::SocketAddr::V6(v6) => {
            return Err(no_route(io::Error::other(format!(
                "the route picks the IPv6 address {}",
                v6.ip()
            ))))
        }
    };
    let interface = interfaces()
        .ok()
        .and_then(|all| all.into_iter().find(|(_, ip)| *ip == local))
        .map(|(name, _)| name);
    Ok((local, interface))
}

/// How often a host name that does not resolve yet is looked up again.
const RESOLVE_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// Waits until `host` resolves, for at most `within`; returns whether it does. An IP
/// address resolves at once. On Kubernetes a pod's own DNS name (its service's record, or
/// `hostname.subdomain`) appears only after the pod started, so a process that binds or
/// routes by that name right at start must wait for it; the wait is logged once.
pub async fn wait_resolvable(host: &str, within: std::time::Duration) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let deadline = tokio::time::Instant::now() + within;
    let mut logged = false;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let error = match tokio::time::timeout(left, tokio::net::lookup_host((host, 0))).await {
            Ok(Ok(addrs)) => match addrs.count() {
                0 => "no address".to_owned(),
                _ => return true,
            },
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the lookup took too long".to_owned(),
        };
        if tokio::time::Instant::now() + RESOLVE_RETRY > deadline {
            return false;
        }
        if !logged {
            tracing::warn!(
                "{host} does not resolve yet ({error}); looking it up again for up to {within:?} \
                 (a Kubernetes pod's DNS name appears once the pod is up)"
            );
            logged = true;
        }
        tokio::time::sleep(RESOLVE_RETRY).await;
    }
}

/// The address this node announces: `DMLC_NODE_HOST`, else the IPv4 address of
/// `DMLC_INTERFACE`, else loopback when the scheduler is on loopback, else the address
/// routing picks to reach the scheduler (as ps-lite does without `DMLC_INTERFACE`).
/// A scheduler name that does not resolve yet is looked up again for up to `within`.
pub(crate) async fn announced_host(
    config: &van_core::Config,
    within: std::time::Duration,
) -> crate::Result<String> {
    if let Some(host) = &config.node_host {
        return Ok(host.clone());
    }
    let loopback = config.root_uri == "localhost"
        || config
            .root_uri
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match config.interface.as_deref() {
        None if loopback => Ok("127.0.0.1".into()),
        Some(interface) => interface_ipv4(interface)
            .map(|ip| ip.to_string())
            .map_err(|e| {
                crate::NodeError::InvalidArgument(format!("DMLC_INTERFACE={interface}: {e}"))
            }),
        None => {
            wait_resolvable(&config.root_uri, within).await;
            let (ip, interface) =
                route_to(&config.root_uri, config.root_port)
                    .await
                    .map_err(|e| {
                        crate::NodeError::InvalidArgument(format!(
                            "DMLC_INTERFACE is unset and no address routes to the scheduler: {e}; \
                         set DMLC_INTERFACE or DMLC_NODE_HOST to the address this node should \
                         announce"
                        ))
                    })?;
            tracing::info!(
                "DMLC_INTERFACE is unset: announcing {ip} ({}), the address that routes to the \
                 scheduler at {}:{}",
                interface.as_deref().unwrap_or("no interface holds it"),
                config.root_uri,
                config.root_port
            );
            Ok(ip.to_string())
        }
    }
}

// libc, not rustix: getifaddrs is libc code over netlink, which rustix does not implement.
/// The list `getifaddrs` allocated. Owned: it is freed exactly once, when this drops, and
/// nothing else frees or changes it meanwhile.
struct IfAddrs {
    head: *mut libc::ifaddrs,
}

impl IfAddrs {
    fn get() -> io::Result<IfAddrs> {
        let mut head = std::ptr::null_mut();
        // SAFETY: `head` is a valid, writable `*mut ifaddrs` out-pointer. On success
        // getifaddrs stores there a list (possibly null, when there are no interfaces) that
        // we own and must free with freeifaddrs; on failure it returns -1 and we keep nothing.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(IfAddrs { head })
    }

    /// The name of every entry, with its address if that is IPv4. Copies everything out, so
    /// nothing borrowed from the list outlives it.
    fn entries(&self) -> Vec<(String, Option<Ipv4Addr>)> {
        let mut entries = Vec::new();
        let mut cursor = self.head.cast_const();
        while !cursor.is_null() {
            // SAFETY: `cursor` is non-null and is the head or an `ifa_next` of the list
            // getifaddrs built: a properly aligned, initialized `ifaddrs` that stays allocated
            // and unmodified while `self` lives (only `drop` frees it, and `&self` is held).
            let entry = unsafe { &*cursor };
            let name = if entry.ifa_name.is_null() {
                String::new()
            } else {
                // SAFETY: non-null `ifa_name` points to a NUL-terminated string owned by the
                // list, alive while `self` lives; it is copied out before the borrow ends.
                unsafe { CStr::from_ptr(entry.ifa_name) }
                    .to_string_lossy()
                    .into_owned()
            };
            entries.push((name, ipv4(entry.ifa_addr)));
            cursor = entry.ifa_next.cast_const();
        }
        entries
    }
}

/// The IPv4 address at `addr`, an `ifa_addr` of a live list (null for interfaces without an
/// address).
fn ipv4(addr: *const libc::sockaddr) -> Option<Ipv4Addr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: non-null `ifa_addr` points to a socket address of the list, alive and
    // initialized; every socket address starts with the `sockaddr` header, so its family
    // field is in bounds. `read_unaligned` and `addr_of!` make no alignment assumption and
    // create no reference.
    let family = unsafe { std::ptr::addr_of!((*addr).sa_family).read_unaligned() };
    if i32::from(family) != libc::AF_INET {
        return None;
    }
    // SAFETY: the family is AF_INET, so the object at `addr` is a whole `sockaddr_in`
    // (that is what the family promises), valid for reads of its size; plain integer fields,
    // so any bits are a valid value; read without assuming alignment.
    let sin = unsafe { addr.cast::<libc::sockaddr_in>().read_unaligned() };
    Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
}

impl Drop for IfAddrs {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: `head` came from a successful getifaddrs, is freed only here, and drop
            // runs once; no reference into the list outlives `entries`, which copies out.
            unsafe { libc::freeifaddrs(self.head) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_route_to_a_loopback_scheduler_leaves_from_loopback() {
        let (ip, interface) = route_to("127.0.0.1", 9000)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ip, Ipv4Addr::LOCALHOST);
        assert_eq!(interface.as_deref(), Some("lo"));
        let (ip, _) = route_to("localhost", 9000)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ip.is_loopback(), "{ip}");
    }

    #[tokio::test]
    async fn an_unresolvable_scheduler_is_named() {
        let e = route_to("no-such-host.invalid", 9000)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no-such-host.invalid:9000"), "{e}");
    }

    #[test]
    fn loopback_is_127_0_0_1() {
        assert_eq!(interface_ipv4("lo").ok(), Some(Ipv4Addr::LOCALHOST));
        let all = interfaces().unwrap_or_default();
        assert!(
            all.contains(&("lo".to_owned(), Ipv4Addr::LOCALHOST)),
            "{all:?}"
        );
    }

    #[test]
    fn an_unknown_name_lists_the_available_interfaces() {
        let error = interface_ipv4("no-such-if0").unwrap_err();
        let text = error.to_string();
        let InterfaceError::NotFound { name, available } = error else {
            panic!("expected NotFound, got: {text}");
        };
        assert_eq!(name, "no-such-if0");
        assert!(available.iter().any(|n| n == "lo"), "{available:?}");
        assert!(
            text.contains("no-such-if0") && text.contains("lo"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_waited_for_then_given_up() {
        use std::time::{Duration, Instant};
        assert!(wait_resolvable("127.0.0.1", Duration::ZERO).await);
        assert!(wait_resolvable("localhost", Duration::from_secs(5)).await);
        let start = Instant::now();
        let within = Duration::from_millis(800);
        assert!(!wait_resolvable("no-such-host.invalid", within).await);
        let waited = start.elapsed();
        assert!(
            waited >= within - RESOLVE_RETRY && waited < within + Duration::from_secs(5),
            "waited {waited:?} for {within:?}"
        );
    }
}
