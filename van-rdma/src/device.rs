//! Opening the RDMA device a van uses: which device, which GID, and — when there is none —
//! exactly why (see [`RdmaError::NoDevice`]).
//!
//! The `ibverbs` crate's safe API lists the devices and reads the GID table (with each GID's
//! RoCE version); the van's own context, protection domain and queue pairs come from
//! [`crate::verbs`].

use std::sync::Arc;

use van_core::config::RdmaSettings;

use crate::sysfs;
use crate::verbs::{self, Context, DeviceAttributes, Pd};
use crate::RdmaError;

/// A GID table entry as the device reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gid {
    /// Index in the table.
    pub index: u32,
    /// The 16 bytes.
    pub raw: [u8; 16],
    /// RoCE v2 (UDP/IP encapsulation, routable).
    pub roce_v2: bool,
}

impl Gid {
    /// Whether the GID holds an IPv4 address (`::ffff:a.b.c.d`), as RoCE v2 GIDs of an
    /// interface with an IPv4 address do.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.raw[..10].iter().all(|b| *b == 0) && self.raw[10] == 0xff && self.raw[11] == 0xff
    }

    /// Readable: `::ffff:10.77.0.1` for IPv4-mapped GIDs, else the IPv6 form.
    pub fn text(&self) -> String {
        let ip = std::net::Ipv6Addr::from(self.raw);
        match ip.to_ipv4_mapped() {
            Some(v4) => format!("::ffff:{v4}"),
            None => ip.to_string(),
        }
    }
}

/// Picks the GID index: `wanted` if given (it must exist), else the RoCE v2 IPv4-mapped GID,
/// else the first RoCE v2 GID, else the first GID (InfiniBand).
pub fn choose_gid(gids: &[Gid], wanted: Option<u32>) -> Option<&Gid> {
    if let Some(index) = wanted {
        return gids.iter().find(|g| g.index == index);
    }
    gids.iter()
        .find(|g| g.roce_v2 && g.is_ipv4_mapped())
        .or_else(|| gids.iter().find(|g| g.roce_v2))
        .or_else(|| gids.first())
}

/// The device a van opened, with what its queue pairs need.
pub struct Device {
    /// Our context (for CQs and QPs).
    pub context: Arc<Context>,
    /// The protection domain of every registration and queue pair of the van.
    pub pd: Arc<Pd>,
    /// The GID the van sends from.
    pub gid: Gid,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active MTU (verbs enum).
    pub mtu: u32,
    /// Scatter/gather entries per send the van uses.
    pub max_sge: u32,
    /// What the device allows (`ibv_query_device`): queue depths are checked against it at
    /// start.
    pub attributes: DeviceAttributes,
    /// Largest message the port carries.
    pub max_msg: u64,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: &'static str,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Device {
    /// One line: device, link layer, GID, MTU.
    pub fn describe(&self) -> String {
        format!(
            "{} port {} ({}), GID {} = {}{}, MTU {}",
            self.context.name(),
            verbs::PORT,
            self.link_layer,
            self.gid.index,
            self.gid.text(),
            if self.gid.roce_v2 { " (RoCE v2)" } else { "" },
            128u32 << self.mtu.min(5),
        )
    }
}

/// The devices libibverbs lists, or why there are none (the cause named from sysfs).
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let no_device = |detail: Option<std::io::Error>| {
        let mut cause = sysfs::no_device_cause(&sysfs::kernel_view());
        if let Some(e) = detail {
            cause = format!("{cause} (libibverbs: {e})");
        }
        RdmaError::NoDevice { cause }
    };
    let list = match ibverbs::devices() {
        Ok(list) => list,
        Err(e) => return Err(no_device(Some(e))),
    };
    let names: Vec<String> = list
        .iter()
        .map(|d| {
            d.name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    if names.is_empty() {
        return Err(no_device(None));
    }
    Ok(names)
}

/// The GID table of device `name`'s port 1, through the `ibverbs` crate (which also checks
/// that the port is ACTIVE).
pub fn gid_table(name: &str) -> Result<Vec<Gid>, RdmaError> {
    let list = ibverbs::devices().map_err(|e| RdmaError::NoDevice {
        cause: e.to_string(),
    })?;
    let device = list
        .iter()
        .find(|d| d.name().is_some_and(|n| n.to_string_lossy() == name))
        .ok_or_else(|| RdmaError::DeviceNotFound {
            wanted: name.to_owned(),
            available: String::new(),
        })?;
    let context = device.open().map_err(|e| RdmaError::PortDown {
        device: name.to_owned(),
        detail: e.to_string(),
    })?;
    Ok(context
        .gid_table()
        .iter()
        .map(|entry| {
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&entry.gid.subnet_prefix().to_be_bytes());
            raw[8..].copy_from_slice(&entry.gid.interface_id().to_be_bytes());
            Gid {
                index: entry.gid_index,
                raw,
                roce_v2: entry.gid_type == ibverbs_sys::IBV_GID_TYPE_ROCE_V2,
            }
        })
        .filter(|g| g.raw != [0; 16])
        .collect())
}

/// Opens the device `settings` ask for (or the first whose port is ACTIVE) and picks its GID.
pub fn open(settings: &RdmaSettings) -> Result<Device, RdmaError> {
    let names = device_names()?;
    let candidates: Vec<&String> = match &settings.device {
        Some(wanted) => {
            let found: Vec<&String> = names.iter().filter(|n| *n == wanted).collect();
            if found.is_empty() {
                return Err(RdmaError::DeviceNotFound {
                    wanted: wanted.clone(),
                    available: names.join(", "),
                });
            }
            found
        }
        None => names.iter().collect(),
    };
    let mut last_error = None;
    for name in candidates {
        match open_named(name, &names, settings) {
            Ok(device) => return Ok(device),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| RdmaError::NoDevice {
        cause: "no device could be opened".into(),
    }))
}

fn open_named(name: &str, names: &[String], settings: &RdmaSettings) -> Result<Device, RdmaError> {
    let gids = gid_table(name)?;
    let gid = choose_gid(&gids, settings.gid_index)
        .cloned()
        .ok_or_else(|| RdmaError::BadGidIndex {
            device: name.to_owned(),
            index: settings.gid_index.unwrap_or(0),
            valid: gids
                .iter()
                .map(|g| g.index.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let verbs_error = |call| {
        let device = name.to_owned();
        move |source| RdmaError::Verbs {
            call,
            device,
            source,
        }
    };
    let list = verbs::DeviceList::get().map_err(verbs_error("ibv_get_device_list"))?;
    // By name in this list: a second `ibv_get_device_list` need not list in the same order.
    let index =
        list.names()
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| RdmaError::DeviceNotFound {
                wanted: name.to_owned(),
                available: names.join(", "),
            })?;
    let context = Arc::new(list.open(index).map_err(verbs_error("ibv_open_device"))?);
    let port = context
        .query_port()
        .map_err(verbs_error("ibv_query_port"))?;
    if port.state != ibverbs_sys::ibv_port_state::IBV_PORT_ACTIVE {
        return Err(RdmaError::PortDown {
            device: name.to_owned(),
            detail: format!("state {}", port.state),
        });
    }
    let attributes = context
        .query_device()
        .map_err(verbs_error("ibv_query_device"))?;
    let pd = Pd::new(Arc::clone(&context)).map_err(verbs_error("ibv_alloc_pd"))?;
    Ok(Device {
        context,
        pd,
        gid,
        lid: port.lid,
        mtu: port.active_mtu,
        max_sge: attributes.max_sge.min(16),
        attributes,
        // 0 would mean "unknown": assume 1 MiB (every device carries that). A smaller
        // limit the port does report is kept, or larger writes would fail.
        max_msg: match port.max_msg_size {
            0 => 1 << 20,
            n => u64::from(n),
        },
        link_layer: if u32::from(port.link_layer) == ibverbs_sys::IBV_LINK_LAYER_INFINIBAND {
            "InfiniBand"
        } else {
            "Ethernet"
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u32, v4: bool, roce_v2: bool) -> Gid {
        let mut raw = [0u8; 16];
        if v4 {
            raw[10] = 0xff;
            raw[11] = 0xff;
            raw[12..].copy_from_slice(&[10, 77, 0, 1]);
        } else {
            raw[0] = 0xfe;
            raw[1] = 0x80;
            raw[15] = 1;
        }
        Gid {
            index,
            raw,
            roce_v2,
        }
    }

    #[test]
    fn the_roce_v2_ipv4_gid_is_chosen_unless_overridden() {
        let gids = [
            gid(0, false, false),
            gid(1, false, true),
            gid(2, true, false),
            gid(3, true, true),
        ];
        assert_eq!(choose_gid(&gids, None).map(|g| g.index), Some(3));
        assert_eq!(choose_gid(&gids[..3], None).map(|g| g.index), Some(1));
        assert_eq!(choose_gid(&gids[..1], None).map(|g| g.index), Some(0));
        assert_eq!(choose_gid(&gids, Some(2)).map(|g| g.index), Some(2));
        assert!(choose_gid(&gids, Some(9)).is_none());
        assert_eq!(gids[3].text(), "::ffff:10.77.0.1");
        assert_eq!(gids[0].text(), "fe80::1");
    }
}
