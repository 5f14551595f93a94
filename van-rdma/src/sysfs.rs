//! What the kernel says about RDMA, read from sysfs without libibverbs: whether the kernel has
//! RDMA support loaded, which devices exist, their ports, link layers and GIDs. The probe uses
//! it to name the cause when libibverbs finds no device; `vans-doctor` prints it.

use std::path::{Path, PathBuf};

/// Where the kernel lists RDMA devices.
pub const CLASS_DIR: &str = "/sys/class/infiniband";
/// Where user-space verbs access (`ib_uverbs`) lists its devices.
pub const VERBS_CLASS_DIR: &str = "/sys/class/infiniband_verbs";

/// One GID table entry of a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidInfo {
    /// Index in the table.
    pub index: u32,
    /// The GID, as the kernel prints it (`fe80:0000:…`).
    pub gid: String,
    /// `RoCE v2`, `IB/RoCE v1`, or empty when the kernel does not say.
    pub kind: String,
    /// The network device it belongs to (RoCE), if any.
    pub netdev: String,
}

impl GidInfo {
    /// Whether this is a RoCE v2 GID holding an IPv4 address (`::ffff:a.b.c.d`).
    pub fn is_roce_v2_ipv4(&self) -> bool {
        self.kind == "RoCE v2" && self.gid.starts_with("0000:0000:0000:0000:0000:ffff:")
    }
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub number: u32,
    /// `4: ACTIVE`, `1: DOWN`, …
    pub state: String,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: String,
    /// `100 Gb/sec (4X EDR)`, …
    pub rate: String,
    /// The GIDs in use (zero GIDs left out).
    pub gids: Vec<GidInfo>,
}

/// One RDMA device as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// The kernel driver behind it, when known (`mlx5_core`, `rdma_rxe`).
    pub driver: String,
    /// Its ports.
    pub ports: Vec<PortInfo>,
}

/// What sysfs shows about RDMA on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelView {
    /// `/sys/class/infiniband` exists: the RDMA core (`ib_core`) is loaded.
    pub core_loaded: bool,
    /// `/sys/class/infiniband_verbs` exists: user-space verbs (`ib_uverbs`) are loaded.
    pub uverbs_loaded: bool,
    /// The devices.
    pub devices: Vec<DeviceInfo>,
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Reads sysfs under `root` (`/` on a real machine; tests pass a fake tree).
pub fn kernel_view_at(root: &Path) -> KernelView {
    let class = root.join(CLASS_DIR.trim_start_matches('/'));
    let verbs = root.join(VERBS_CLASS_DIR.trim_start_matches('/'));
    let mut devices = Vec::new();
    for (name, path) in entries(&class) {
        let driver = std::fs::read_link(path.join("device/driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| read(&path.join("parent")));
        let mut ports = Vec::new();
        for (port, port_path) in entries(&path.join("ports")) {
            let Ok(number) = port.parse() else { continue };
            let mut gids = Vec::new();
            for (index, gid_path) in entries(&port_path.join("gids")) {
                let Ok(index) = index.parse::<u32>() else {
                    continue;
                };
                let gid = read(&gid_path);
                if gid.is_empty() || gid.chars().all(|c| c == '0' || c == ':') {
                    continue;
                }
                let attrs = port_path.join("gid_attrs");
                gids.push(GidInfo {
                    index,
                    gid,
                    kind: read(&attrs.join("types").join(index.to_string())),
                    netdev: read(&attrs.join("ndevs").join(index.to_string())),
                });
            }
            gids.sort_by_key(|g| g.index);
            ports.push(PortInfo {
                number,
                state: read(&port_path.join("state")),
                link_layer: read(&port_path.join("link_layer")),
                rate: read(&port_path.join("rate")),
                gids,
            });
        }
        devices.push(DeviceInfo {
            name,
            driver,
            ports,
        });
    }
    KernelView {
        core_loaded: class.is_dir(),
        uverbs_loaded: verbs.is_dir(),
        devices,
    }
}

/// Reads `/sys`.
pub fn kernel_view() -> KernelView {
    kernel_view_at(Path::new("/"))
}

/// Why there is no usable device, when libibverbs lists none: the cause and its fix, from
/// what the kernel shows. `provider_devices` is how many devices libibverbs listed (0 here
/// unless the caller knows better).
pub fn no_device_cause(view: &KernelView) -> String {
    if !view.core_loaded {
        return "this kernel has no RDMA support loaded (no /sys/class/infiniband): load the \
                driver of your RDMA NIC (mlx5_ib, irdma, bnxt_re, efa, …) or Soft-RoCE \
                (`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`), or run on a \
                machine with RDMA; set VANS_RDMA_FALLBACK=tcp to use TCP instead"
            .to_owned();
    }
    if view.devices.is_empty() {
        return "the kernel has RDMA support but no RDMA device (/sys/class/infiniband is \
                empty): no NIC driver registered one; load the NIC's RDMA driver or add a \
                Soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`); set \
                VANS_RDMA_FALLBACK=tcp to use TCP instead"
            .to_owned();
    }
    let names: Vec<&str> = view.devices.iter().map(|d| d.name.as_str()).collect();
    if !view.uverbs_loaded {
        return format!(
            "the kernel has RDMA device(s) {} but no user-space access: load ib_uverbs \
             (`modprobe ib_uverbs`) and check /dev/infiniband is present (containers: pass \
             --device=/dev/infiniband)",
            names.join(", ")
        );
    }
    format!(
        "the kernel has RDMA device(s) {} but libibverbs lists none: install the user-space \
         provider (driver) library for them (Debian/Ubuntu: `apt-get install \
         ibverbs-providers`; RHEL: `rdma-core`), and check /dev/infiniband is accessible",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "vans-rdma-sysfs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for (path, content) in files {
            let path = root.join(path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).unwrap_or_default();
            }
            if path.to_string_lossy().ends_with('/') {
                std::fs::create_dir_all(&path).unwrap_or_default();
            } else {
                std::fs::write(&path, content).unwrap_or_default();
            }
        }
        root
    }

    #[test]
    fn each_missing_layer_is_named_with_its_fix() {
        let root = fake(&[("sys/class/", "")]);
        let cause = no_device_cause(&kernel_view_at(&root));
        assert!(cause.contains("no RDMA support loaded"), "{cause}");
        let root = fake(&[("sys/class/infiniband/", "")]);
        let cause = no_device_cause(&kernel_view_at(&root));
        assert!(cause.contains("no RDMA device"), "{cause}");
        let p = "sys/class/infiniband/rxe0/ports/1";
        let root = fake(&[
            (&format!("{p}/state"), "4: ACTIVE\n"),
            (&format!("{p}/link_layer"), "Ethernet\n"),
            (
                &format!("{p}/gids/0"),
                "fe80:0000:0000:0000:0476:b9ff:fe87:4773\n",
            ),
            (
                &format!("{p}/gids/1"),
                "0000:0000:0000:0000:0000:ffff:0a4d:0001\n",
            ),
            (
                &format!("{p}/gids/2"),
                "0000:0000:0000:0000:0000:0000:0000:0000\n",
            ),
            (&format!("{p}/gid_attrs/types/0"), "IB/RoCE v1\n"),
            (&format!("{p}/gid_attrs/types/1"), "RoCE v2\n"),
            (&format!("{p}/gid_attrs/ndevs/1"), "rxenet0\n"),
        ]);
        let view = kernel_view_at(&root);
        let cause = no_device_cause(&view);
        assert!(
            cause.contains("rxe0") && cause.contains("ib_uverbs"),
            "{cause}"
        );
        let port = &view.devices[0].ports[0];
        assert_eq!((port.number, port.state.as_str()), (1, "4: ACTIVE"));
        assert_eq!(port.gids.len(), 2, "the zero GID is left out");
        assert!(port.gids[1].is_roce_v2_ipv4() && !port.gids[0].is_roce_v2_ipv4());
        assert_eq!(port.gids[1].netdev, "rxenet0");
        std::fs::create_dir_all(root.join("sys/class/infiniband_verbs")).unwrap_or_default();
        let cause = no_device_cause(&kernel_view_at(&root));
        assert!(cause.contains("ibverbs-providers"), "{cause}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
