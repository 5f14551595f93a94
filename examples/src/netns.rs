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
