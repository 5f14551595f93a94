//! The frame-pool check for stream vans: large received frames reuse the buffers of frames
//! the application has dropped, and get fresh memory when the pool is off.

use crate::pool::PoolStats;
use crate::Van;

use super::{expect_message, numbered, send, start, within};

/// Large frames in a check: above every stream van's large-frame threshold.
const LARGE: usize = 2 << 20;

/// Sends 20 large frames from one van made by `pooled` to another, dropping each as it
/// arrives, and checks that the receiver allocated at most two buffers; then 4 frames between
/// vans made by `unpooled` (pool off), each of which must be a fresh allocation. `stats` reads
/// a van's pool counters.
pub async fn check_frame_pool<V: Van + 'static>(
    pooled: impl Fn() -> V,
    unpooled: impl Fn() -> V,
    stats: impl Fn(&V) -> PoolStats,
) {
    const FRAMES: u32 = 20;
    let a = start(&pooled, 9).await;
    let mut b = start(&pooled, 8).await;
    within(a.van.connect(&b.node), "connect").await;
    for seq in 0..FRAMES {
        send(&*a.van, numbered(9, 8, seq, LARGE)).await;
        // Received, checked, dropped: its buffer goes back before the next frame arrives.
        let msg = expect_message(&mut b.inbox).await;
        assert_eq!(msg.meta.request_id, seq as i32);
        assert_eq!(msg.data_len(), LARGE);
    }
    let seen = stats(&b.van);
    assert_eq!(seen.allocated + seen.reused, u64::from(FRAMES), "{seen:?}");
    assert!(
        seen.allocated <= 2,
        "fresh buffers for most frames: {seen:?}"
    );

    let c = start(&unpooled, 11).await;
    let mut d = start(&unpooled, 10).await;
    within(c.van.connect(&d.node), "connect").await;
    for seq in 0..4 {
        send(&*c.van, numbered(11, 10, seq, LARGE)).await;
        drop(expect_message(&mut d.inbox).await);
    }
    let seen = stats(&d.van);
    assert_eq!((seen.allocated, seen.reused), (4, 0), "{seen:?}");
}
