//! One connection's queue and ring sizes ([`RingSizes`]), what they ask of the device, and
//! the start-up check of them against what the device allows ([`RingSizes::check`] against
//! [`DeviceAttributes`] from `ibv_query_device`).
//!
//! Without the check, a depth the device cannot hold (`VANS_RDMA_RX_DEPTH` above its
//! `max_qp_wr`, or a completion queue above its `max_cqe`) lets the van start and then fails
//! every connection with `EINVAL` from `ibv_create_qp` or `ibv_create_cq`: the error would
//! name neither the variable nor the limit, and would come at the first connection instead of
//! at start.

use crate::verbs::{region_len, DeviceAttributes};
use crate::RdmaError;

/// Sizes of one connection's queues and rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingSizes {
    /// Receive buffers (and send slots).
    pub(crate) rx_depth: u32,
    /// Bytes per buffer.
    pub(crate) slot_bytes: usize,
    /// Large frames in flight.
    pub(crate) start_depth: u32,
}

impl RingSizes {
    /// Send work requests the queue pair is created with: a SEND per send slot, a write per
    /// large frame in flight, and one for a credit-only message.
    pub(crate) fn send_wr(&self) -> u32 {
        self.rx_depth
            .saturating_add(self.start_depth)
            .saturating_add(1)
    }

    /// Receive work requests the queue pair is created with: one per receive buffer.
    pub(crate) fn recv_wr(&self) -> u32 {
        self.rx_depth
    }

    /// Entries of the completion queue both queues share: every send and every receive may
    /// complete at once, plus one.
    pub(crate) fn cq_entries(&self) -> u32 {
        self.send_wr()
            .saturating_add(self.recv_wr())
            .saturating_add(1)
    }

    /// Bytes of one ring (receive or send) as requested; registration rounds it up to pages.
    pub(crate) fn ring_bytes(&self) -> u64 {
        u64::from(self.rx_depth).saturating_mul(self.slot_bytes as u64)
    }

    /// The largest receive depth `attributes` hold with the other sizes unchanged.
    fn largest_rx_depth(&self, attributes: &DeviceAttributes) -> u64 {
        let start = u64::from(self.start_depth);
        let max_qp_wr = u64::from(attributes.max_qp_wr);
        // A ring is registered in whole pages.
        let ring_pages = attributes.max_mr_size - attributes.max_mr_size % PAGE;
        [
            max_qp_wr,
            max_qp_wr.saturating_sub(start + 1),
            u64::from(attributes.max_cqe).saturating_sub(start + 2) / 2,
            ring_pages / (self.slot_bytes.max(1) as u64),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// The largest start depth `attributes` hold with the other sizes unchanged.
    fn largest_start_depth(&self, attributes: &DeviceAttributes) -> u64 {
        let rx = u64::from(self.rx_depth);
        u64::from(attributes.max_qp_wr)
            .saturating_sub(rx + 1)
            .min(u64::from(attributes.max_cqe).saturating_sub(2 * rx + 2))
    }

    /// Checks these sizes against `device`'s `attributes`: the first one the device cannot
    /// hold is an error naming the variable to lower, its value, the device limit and the
    /// largest value of that variable the device holds (the receive depth when lowering it
    /// is enough, else the start depth).
    pub(crate) fn check(
        &self,
        device: &str,
        attributes: &DeviceAttributes,
    ) -> Result<(), RdmaError> {
        let max_qp_wr = u64::from(attributes.max_qp_wr);
        let max_cqe = u64::from(attributes.max_cqe);
        let ring = usize::try_from(self.ring_bytes())
            .ok()
            .and_then(region_len)
            .map_or(u64::MAX, |n| n as u64);
        let with_both = format!(
            "with {RX_DEPTH}={} and {START_DEPTH}={}",
            self.rx_depth, self.start_depth
        );
        // (what each connection needs, the attribute, its value, whether the start depth
        // counts)
        let (needs, attribute, limit, start_counts) = if u64::from(self.recv_wr()) > max_qp_wr {
            let needs = format!("{} receive work requests", self.recv_wr());
            (needs, "max_qp_wr", max_qp_wr, false)
        } else if u64::from(self.send_wr()) > max_qp_wr {
            let needs = format!(
                "{} send work requests ({RX_DEPTH} + {START_DEPTH} + 1, {with_both})",
                self.send_wr()
            );
            (needs, "max_qp_wr", max_qp_wr, true)
        } else if u64::from(self.cq_entries()) > max_cqe {
            let needs = format!(
                "a completion queue of {} entries (2 × {RX_DEPTH} + {START_DEPTH} + 2, \
                 {with_both})",
                self.cq_entries()
            );
            (needs, "max_cqe", max_cqe, true)
        } else if ring > attributes.max_mr_size {
            let needs = format!(
                "two registered rings of {ring} bytes each ({RX_DEPTH} × {} bytes per buffer)",
                self.slot_bytes
            );
            (needs, "max_mr_size", attributes.max_mr_size, false)
        } else {
            return Ok(());
        };
        let rx = self.largest_rx_depth(attributes);
        let start = self.largest_start_depth(attributes);
        let min_rx = u64::from(*crate::protocol::RX_DEPTH.start());
        let (variable, value, largest) = if rx >= min_rx || !start_counts {
            (RX_DEPTH, self.rx_depth, (rx >= min_rx).then_some(rx))
        } else {
            (START_DEPTH, self.start_depth, (start >= 1).then_some(start))
        };
        Err(RdmaError::DepthAboveDeviceLimit {
            variable,
            value: u64::from(value),
            needs,
            device: device.to_owned(),
            attribute,
            limit,
            largest,
        })
    }
}

/// The page size registration rounds rings up to ([`region_len`]).
const PAGE: u64 = 4096;
/// The variable that sets the receive depth (BytePS: `BYTEPS_RDMA_RX_DEPTH`).
const RX_DEPTH: &str = "VANS_RDMA_RX_DEPTH";
/// The variable that sets the large frames in flight (BytePS: `BYTEPS_RDMA_START_DEPTH`).
const START_DEPTH: &str = "VANS_RDMA_START_DEPTH";

#[cfg(test)]
mod tests {
    use super::*;

    /// What Soft-RoCE (`rdma_rxe`) reports on Linux 6.1, and a NIC with smaller queues.
    fn device(max_qp_wr: u32, max_cqe: u32, max_mr_size: u64) -> DeviceAttributes {
        DeviceAttributes {
            max_sge: 32,
            max_qp_wr,
            max_cqe,
            max_mr_size,
        }
    }

    fn sizes(rx_depth: u32, start_depth: u32) -> RingSizes {
        RingSizes {
            rx_depth,
            slot_bytes: 8192,
            start_depth,
        }
    }

    fn refusal(sizes: RingSizes, attributes: DeviceAttributes) -> (RdmaError, String) {
        let error = sizes
            .check("mlx5_0", &attributes)
            .expect_err("the device cannot hold these sizes");
        let message = error.to_string();
        (error, message)
    }

    #[test]
    fn depths_the_device_holds_pass() {
        let roomy = device(1 << 20, 1 << 20, u64::MAX);
        assert!(sizes(128, 16).check("rxe0", &roomy).is_ok());
        assert!(sizes(32768, 4096).check("rxe0", &roomy).is_ok());
        // Exactly at every limit: 2 × 100 + 10 + 2 = 212 entries, 111 send work requests.
        let exact = device(111, 212, 100 * 8192);
        assert!(sizes(100, 10).check("x", &exact).is_ok());
    }

    #[test]
    fn a_receive_depth_above_max_qp_wr_names_the_variable_the_value_and_the_limit() {
        let (error, message) = refusal(sizes(20000, 16), device(16384, 1 << 20, u64::MAX));
        assert!(
            matches!(
                error,
                RdmaError::DepthAboveDeviceLimit {
                    variable: "VANS_RDMA_RX_DEPTH",
                    value: 20000,
                    attribute: "max_qp_wr",
                    limit: 16384,
                    ..
                }
            ),
            "{error:?}"
        );
        for part in [
            "VANS_RDMA_RX_DEPTH=20000",
            "mlx5_0",
            "20000 receive work requests",
            "max_qp_wr is 16384",
            // Not 16384: 16384 + 16 + 1 send work requests would not fit either.
            "at most 16367",
        ] {
            assert!(message.contains(part), "`{part}` missing: {message}");
        }
    }

    #[test]
    fn send_work_requests_count_the_start_depth_too() {
        // 16380 + 16 + 1 = 16397 send work requests: the receive depth alone fits.
        let (error, message) = refusal(sizes(16380, 16), device(16384, 1 << 20, u64::MAX));
        assert!(
            message.contains("VANS_RDMA_RX_DEPTH=16380")
                && message.contains("16397 send work requests")
                && message.contains("VANS_RDMA_START_DEPTH=16")
                && message.contains("at most 16367"),
            "{message}"
        );
        assert!(matches!(
            error,
            RdmaError::DepthAboveDeviceLimit {
                largest: Some(16367),
                ..
            }
        ));
        // A start depth that leaves the receive depth no room is the one named.
        let (_, message) = refusal(sizes(4, 4096), device(1024, 1 << 20, u64::MAX));
        assert!(
            message.starts_with("VANS_RDMA_START_DEPTH=4096") && message.contains("at most 1019"),
            "{message}"
        );
    }

    #[test]
    fn a_completion_queue_above_max_cqe_names_the_receive_depth() {
        // rxe's max_cqe on older kernels: 32767. 2 × 16384 + 16 + 2 = 32786 entries.
        let (error, message) = refusal(sizes(16384, 16), device(1 << 20, 32767, u64::MAX));
        assert!(
            matches!(
                error,
                RdmaError::DepthAboveDeviceLimit {
                    variable: "VANS_RDMA_RX_DEPTH",
                    value: 16384,
                    attribute: "max_cqe",
                    limit: 32767,
                    largest: Some(16374),
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            message.contains("completion queue of 32786 entries") && message.contains("max_cqe"),
            "{message}"
        );
        assert!(sizes(16374, 16)
            .check("x", &device(1 << 20, 32767, u64::MAX))
            .is_ok());
    }

    #[test]
    fn a_ring_above_max_mr_size_is_named() {
        let (error, message) = refusal(sizes(1024, 16), device(1 << 20, 1 << 20, 4 << 20));
        assert!(
            matches!(
                error,
                RdmaError::DepthAboveDeviceLimit {
                    attribute: "max_mr_size",
                    largest: Some(512),
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(message.contains("8388608 bytes"), "{message}");
    }

    #[test]
    fn a_device_that_holds_no_value_of_the_variable_says_to_lower_both() {
        let (error, message) = refusal(sizes(128, 16), device(16, 1 << 20, u64::MAX));
        assert!(
            matches!(
                error,
                RdmaError::DepthAboveDeviceLimit { largest: None, .. }
            ),
            "{error:?}"
        );
        assert!(
            message.contains("lower VANS_RDMA_START_DEPTH and VANS_RDMA_RX_DEPTH"),
            "{message}"
        );
    }

    proptest::proptest! {
        /// Whatever the device, the value an error suggests is one the device holds.
        #[test]
        fn the_suggested_value_fits(
            rx_depth in 4u32..=40_000,
            start_depth in 1u32..=5_000,
            slot_bits in 8u32..=20,
            max_qp_wr in 1u32..=2_000_000,
            max_cqe in 1u32..=2_000_000,
            max_mr_size in 4096u64..=(1 << 40),
        ) {
            let mut sizes = RingSizes { rx_depth, slot_bytes: 1 << slot_bits, start_depth };
            let attributes = device(max_qp_wr, max_cqe, max_mr_size);
            if let Err(RdmaError::DepthAboveDeviceLimit { variable, largest: Some(largest), .. }) =
                sizes.check("x", &attributes)
            {
                let largest = u32::try_from(largest).unwrap();
                if variable == RX_DEPTH {
                    sizes.rx_depth = largest;
                } else {
                    sizes.start_depth = largest;
                }
                proptest::prop_assert!(sizes.check("x", &attributes).is_ok(), "{sizes:?}");
            }
        }
    }

    #[test]
    fn sizes_never_overflow() {
        let huge = sizes(u32::MAX, u32::MAX);
        assert_eq!(huge.send_wr(), u32::MAX);
        assert_eq!(huge.cq_entries(), u32::MAX);
        assert!(huge.check("x", &device(u32::MAX, u32::MAX, 1)).is_err());
    }
}
