//! What a [`RequestHandler`](super::RequestHandler) needs to answer a request later instead
//! of at once: the shard's [`ShardContext`], the [`Handled`] outcome, and the [`Released`]
//! answers of requests it held, each naming its [`HeldRequest`].

use van_core::NodeId;

use super::{KvMeta, KvPairs};

/// Requests one shard holds at most (answers owed by its handler, such as the pushes of
/// synchronous rounds still waiting for other workers).
///
/// In a well-behaved cluster a shard holds at most `num_workers × round keys in flight per
/// worker` on that shard, less one request per open round (its last push completes it): 256
/// workers with 1024 partitions each in flight on one shard stay within it. A held request
/// costs the shard about 100 bytes (its meta and its slot in the table), so the limit also
/// caps that bookkeeping near 25 MiB per shard. Beyond it a request that would be held is
/// answered with an error instead: the worker hears why rather than the server growing
/// without end.
pub const MAX_HELD_REQUESTS: usize = 1 << 18;

/// What a shard tells its handler with each request
/// ([`RequestHandler::handle_or_hold`](super::RequestHandler::handle_or_hold)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardContext {
    /// The workers of the cluster (the postoffice's `num_workers`): how many pushes of a key a
    /// synchronous round waits for.
    pub num_workers: u32,
    /// How many more requests the shard can hold ([`MAX_HELD_REQUESTS`] less those it holds).
    /// A handler refuses a request it would hold when this is 0; one it holds anyway is
    /// answered with an error by the shard.
    pub hold_room: usize,
}

/// A handler's outcome for one request: its answer now, or a promise of one later.
#[derive(Debug)]
pub enum Handled {
    /// The answer, sent at once: the response's pairs (empty for a push), or the reason the
    /// request failed, which the worker sees as
    /// [`NodeError::HandlerFailed`](crate::NodeError::HandlerFailed).
    Answer(Result<KvPairs, String>),
    /// Held: the handler answers it later, through
    /// [`RequestHandler::take_released`](super::RequestHandler::take_released), naming it by
    /// its [`HeldRequest`]. The shard keeps only the request's meta meanwhile: the handler
    /// was given the request's bytes and keeps what it needs of them (the request's share of
    /// the server's byte budget is returned at once, so held requests never stop the server
    /// from reading the pushes that would complete them).
    Held,
}

/// Which held request an answer is for: the requesting node and its request id. A server
/// application hears one customer of each worker node (messages are routed by application
/// and customer id), and a worker's request ids are unique while in flight, so the pair names
/// one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeldRequest {
    /// The node that sent the request.
    pub sender: NodeId,
    /// The sender's request id.
    pub request_id: i32,
}

impl HeldRequest {
    /// The held request `meta` describes.
    pub fn of(meta: &KvMeta) -> HeldRequest {
        HeldRequest {
            sender: meta.sender,
            request_id: meta.request_id,
        }
    }

    /// Both ids in one integer, for the shard's table of held requests.
    pub(crate) fn table_key(self) -> u64 {
        (u64::from(self.sender as u32) << 32) | u64::from(self.request_id as u32)
    }
}

/// The answer to a request a handler held earlier.
#[derive(Debug)]
pub struct Released {
    /// The request answered.
    pub request: HeldRequest,
    /// Its answer: the response's pairs, or the reason it failed.
    pub answer: Result<KvPairs, String>,
}
