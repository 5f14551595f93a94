//! Hosts as network namespaces, for `allreduce-bench --hosts` and the namespace tests: a
//! switch namespace holding a bridge, and host namespaces each joined to it by a veth pair
//! (`eth0` inside the host) on a private subnet that exists only inside them. Processes run
//! in a host with `ip netns exec`, so every address they use is one of these. Needs root and
//! `ip` (Debian: iproute2); everything made is deleted when the [`Hosts`] drop.

use std::ffi::OsStr;
use std::process::Command;

/// The namespaces of one run: a switch and its hosts.
pub struct Hosts {
    /// The switch namespace's name.
    pub switch: String,
    /// Each host namespace's name.
    pub names: Vec<String>,
    /// Each host's address on the private subnet (`eth0`).
    pub addrs: Vec<String>,
    /// The subnet, as `a.b.c.0/24`.
    pub subnet: String,
}

/// Runs `ip` with `args`; its error output on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e} (Debian: apt-get install iproute2)"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Whether this process runs as root (namespaces need it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

impl Hosts {
    /// Makes `count` hosts (at most 200), named and addressed after this process's id and
    /// `tag` (so runs and tests side by side do not meet; interface names stay within 15
    /// bytes for tags of up to 3). With `decoy`, each host first gets an `eth1` on another
    /// subnet that no other host reaches (a node that took the first interface instead of
    /// the one it was told would announce an address nobody can dial). On failure, what was
    /// made is deleted.
    pub fn create(tag: &str, count: usize, decoy: bool) -> Result<Hosts, String> {
        if !is_root() {
            return Err("network namespaces need root".into());
        }
        if count == 0 || count > 200 || tag.len() > 3 {
            return Err(format!(
                "{count} hosts tagged {tag:?}: 1 to 200, tags of 3 bytes"
            ));
        }
        let id = std::process::id() % 100_000;
        let subnet = format!("10.213.{}", id % 250);
        let mut made = Hosts {
            switch: format!("vans{id}{tag}sw"),
            names: Vec::new(),
            addrs: Vec::new(),
            subnet: format!("{subnet}.0/24"),
        };
        // On failure `made` drops, which deletes what was made.
        made.build(&subnet, id, tag, count, decoy)?;
        Ok(made)
    }

    /// Makes the switch and the hosts, recording each as it is made.
    fn build(
        &mut self,
        subnet: &str,
        id: u32,
        tag: &str,
        count: usize,
        decoy: bool,
    ) -> Result<(), String> {
        let switch = self.switch.clone();
        ip(&["netns", "add", &switch])?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for i in 0..count {
            let host = format!("vans{id}{tag}h{i}");
            ip(&["netns", "add", &host])?;
            self.names.push(host.clone());
            if decoy {
                ip(&[
                    "-n", &host, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p",
                ])?;
                let decoy = format!("10.214.{}.{}/24", id % 250, i + 1);
                ip(&["-n", &host, "addr", "add", &decoy, "dev", "eth1"])?;
                ip(&["-n", &host, "link", "set", "eth1", "up"])?;
                ip(&["-n", &host, "link", "set", "eth1p", "up"])?;
            }
            // One end in the switch (on the bridge), the other the host's eth0.
            let port = format!("vp{id}{tag}{i}");
            ip(&[
                "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &host,
            ])?;
            ip(&["link", "set", &port, "netns", &switch])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("{subnet}.{}", i + 1);
            let cidr = format!("{addr}/24");
            ip(&["-n", &host, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &host, "link", "set", "eth0", "up"])?;
            ip(&["-n", &host, "link", "set", "lo", "up"])?;
            self.addrs.push(addr);
        }
        Ok(())
    }

    /// `program` to run on host `host` (inside its namespace).
    pub fn command(&self, host: usize, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.names[host]]).arg(program);
        cmd
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.names.iter().chain([&self.switch]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// A network fault on one host's link to the switch, as an nftables table in the host's
/// namespace (the kernel's own filter: every socket of every process on the host meets it,
/// and nothing in the processes knows). Packets are dropped, never refused: the peers see
/// silence, as behind a dead switch port, not a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Each packet in and out of the host is dropped with this probability, in thousandths
    /// (10 is 1 %).
    Loss {
        /// Thousandths of the packets dropped, each way: 1 to 1000.
        per_mille: u32,
    },
    /// Nothing in or out: the host is cut off both ways.
    Partition,
    /// The host receives nothing but still sends: a one-way partition (its packets reach the
    /// others; no answer reaches it).
    Deaf,
    /// The host sends nothing but still receives: the other one-way partition.
    Mute,
}

impl Fault {
    /// The rules of the fault, for the `input` and the `output` hook.
    fn rules(self) -> Result<(Option<String>, Option<String>), String> {
        // Every drop is counted, for [`Injected::dropped`].
        let drop = "counter drop".to_owned();
        Ok(match self {
            Fault::Loss { per_mille } if (1..=1000).contains(&per_mille) => {
                let rule = format!("numgen random mod 1000 < {per_mille} counter drop");
                (Some(rule.clone()), Some(rule))
            }
            Fault::Loss { per_mille } => {
                return Err(format!("a loss of {per_mille}/1000: expected 1 to 1000"))
            }
            Fault::Partition => (Some(drop.clone()), Some(drop)),
            Fault::Deaf => (Some(drop), None),
            Fault::Mute => (None, Some(drop)),
        })
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Loss { per_mille } => write!(f, "{}.{} % loss", per_mille / 10, per_mille % 10),
            Fault::Partition => f.write_str("partition"),
            Fault::Deaf => f.write_str("one-way partition (deaf)"),
            Fault::Mute => f.write_str("one-way partition (mute)"),
        }
    }
}

/// A fault in force on a host; [`Injected::heal`] (or dropping it) removes its rules.
/// Faults on one host stack (each is its own table); deleting the hosts removes them all.
#[must_use = "the fault is healed when this is dropped"]
pub struct Injected {
    namespace: String,
    table: String,
    fault: Fault,
    healed: bool,
}

/// Faults made so far by this process (names their tables).
static FAULTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `nft` in `namespace` with `script` on its standard input (one transaction: all its
/// rules or none); what it printed.
fn nft(namespace: &str, script: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", namespace, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "ip netns exec {namespace} nft: {e} (Debian: apt-get install iproute2 nftables)"
            )
        })?;
    // The script goes in whole, then stdin closes; the child is waited for either way.
    let written = match child.stdin.take() {
        Some(mut stdin) => stdin.write_all(script.as_bytes()),
        None => Ok(()),
    };
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {namespace}: {e}"))?;
    written.map_err(|e| format!("nft in {namespace}: writing its script: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(format!(
            "nft in {namespace}: {} (Debian: apt-get install nftables; the kernel needs \
             nf_tables)",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl Hosts {
    /// Puts `fault` on host `host`'s link (its `eth0`); in force until the returned guard
    /// heals it or drops. Loopback and shared memory within the host are untouched.
    pub fn inject(&self, host: usize, fault: Fault) -> Result<Injected, String> {
        let namespace = self
            .names
            .get(host)
            .ok_or_else(|| format!("no host {host}: there are {}", self.names.len()))?
            .clone();
        let (input, output) = fault.rules()?;
        let n = FAULTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let table = format!("vans_fault_{n}");
        let mut script = format!("add table inet {table}\n");
        for (hook, dir, rule) in [("input", "iifname", input), ("output", "oifname", output)] {
            if let Some(rule) = rule {
                script.push_str(&format!(
                    "add chain inet {table} {hook} {{ type filter hook {hook} priority 0; }}\n\
                     add rule inet {table} {hook} {dir} \"eth0\" {rule}\n"
                ));
            }
        }
        nft(&namespace, &script)?;
        Ok(Injected {
            namespace,
            table,
            fault,
            healed: false,
        })
    }
}

impl Injected {
    /// The fault in force.
    pub fn fault(&self) -> Fault {
        self.fault
    }

    /// How many packets the fault has dropped so far, both ways (its rules' counters): a
    /// test shows with it that the fault met its traffic.
    pub fn dropped(&self) -> Result<u64, String> {
        let listing = nft(
            &self.namespace,
            &format!("list table inet {}\n", self.table),
        )?;
        let mut packets = 0;
        let mut words = listing.split_whitespace();
        while let Some(word) = words.next() {
            if word == "packets" {
                let count = words.next().unwrap_or_default();
                packets += count
                    .parse::<u64>()
                    .map_err(|_| format!("nft printed a counter of {count:?}: {listing}"))?;
            }
        }
        Ok(packets)
    }

    /// Removes the fault's rules: the link carries everything again.
    pub fn heal(mut self) -> Result<(), String> {
        self.healed = true;
        nft(
            &self.namespace,
            &format!("delete table inet {}\n", self.table),
        )
        .map(drop)
    }
}

impl Drop for Injected {
    fn drop(&mut self) {
        if !self.healed {
            let _ = nft(
                &self.namespace,
                &format!("delete table inet {}\n", self.table),
            );
        }
    }
}
