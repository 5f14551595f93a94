//! [`KvWorker`]: ps-lite's `KVWorker`: push, pull, push-pull, by request id.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use van_core::smallvec::SmallVec;
use van_core::{node_ids, Message, Meta, NodeId};

use super::{kv_message, kv_pairs, KvPairs, Op};
use crate::in_flight::{insert_new, lock, Completion};
use crate::range::{server_key_ranges, slice_sorted_keys, KeyRange};
use crate::values::{self, Value};
use node::error::{NodeError, Result};
use node::hash::IntMap;
use node::postoffice::{Customer, Postoffice};
pub use node::RequestId;

/// Pushes and pulls values of type `T` to and from the servers.
///
/// Every call slices the (sorted) keys by server key range, sends one request per server
/// involved, and returns a [`RequestId`] at once; [`wait`](Self::wait) (async) or
/// [`wait_blocking`](Self::wait_blocking) returns the result: nothing for a push, the pulled
/// pairs (keys in order, with per-key lengths) for a pull. Requests to a server that died
/// or whose connection broke complete with [`NodeError::NodeFailed`] naming it; a request
/// that a live server's handler refused completes with [`NodeError::HandlerFailed`] carrying
/// the handler's text.
pub struct KvWorker<T: Value> {
    inner: Arc<WorkerInner>,
    _values: PhantomData<fn() -> T>,
}

impl<T: Value> Clone for KvWorker<T> {
    fn clone(&self) -> Self {
        KvWorker {
            inner: Arc::clone(&self.inner),
            _values: PhantomData,
        }
    }
}

impl<T: Value> std::fmt::Debug for KvWorker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvWorker")
            .field("app_id", &self.inner.app_id)
            .field("customer_id", &self.inner.customer_id)
            .finish_non_exhaustive()
    }
}

struct WorkerInner {
    po: Postoffice,
    /// Key range of each server, by rank (fixed for the life of the cluster).
    ranges: Vec<KeyRange>,
    app_id: i32,
    customer_id: i32,
    /// Bytes per value.
    elem: usize,
    next_id: AtomicI32,
    /// Value bytes copied from received frames into callers' buffers ([`Dest::place`]).
    copied: AtomicU64,
    pending: Mutex<IntMap<RequestId, InFlightRequest>>,
    /// Servers a new process took the place of, not yet taken by the application.
    restarted: Mutex<Vec<NodeId>>,
}

/// Servers of one request (inline up to four: no allocation per request).
type Servers = SmallVec<[NodeId; 4]>;

#[derive(Default)]
struct InFlightRequest {
    /// Servers that have not answered yet.
    outstanding: Servers,
    /// Answers so far, by server id (server ids sort in key-range order).
    parts: SmallVec<[(NodeId, KvPairs); 1]>,
    /// A pull into the caller's memory: where each server's answer goes.
    dest: Option<Dest>,
    completion: Completion<KvPairs>,
}

/// Memory a pull writes its values into ([`KvWorker::zpull_into`]): a `Vec<u8>`, a
/// `BytesMut`, or a binding's view of a caller's array. It becomes the answer's values.
pub trait PullBuffer: AsRef<[u8]> + AsMut<[u8]> + Send + 'static {}

impl<B: AsRef<[u8]> + AsMut<[u8]> + Send + 'static> PullBuffer for B {}

/// A boxed [`PullBuffer`], itself one (the owner of the answer's `Bytes`).
struct Filled(Box<dyn PullBuffer>);

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl AsMut<[u8]> for Filled {
    fn as_mut(&mut self) -> &mut [u8] {
        (*self.0).as_mut()
    }
}

/// Where a pull into the caller's memory puts each server's answer.
struct Dest {
    buf: Box<dyn PullBuffer>,
    /// Bytes of values per key.
    per_key: usize,
    /// Each server's part of the request: the indices of its keys among the request's.
    parts: SmallVec<[(NodeId, Range<usize>); 4]>,
    keys: Bytes,
}

impl Dest {
    /// Copies a server's answer to its keys' place: the one copy from the received frame.
    fn place(&mut self, server: NodeId, pairs: &KvPairs, elem: usize) -> Result<()> {
        let Some((_, range)) = self.parts.iter().find(|(s, _)| *s == server) else {
            return Ok(());
        };
        let want = range.len() * self.per_key;
        let bad = |why: String| NodeError::Protocol {
            from: Some(server),
            reason: format!(
                "a pull into a buffer of {} bytes per key: {why}",
                self.per_key
            ),
        };
        if pairs.len() != range.len() || pairs.vals.len() != want {
            return Err(bad(format!(
                "the answer has {} keys and {} value bytes for {} keys",
                pairs.len(),
                pairs.vals.len(),
                range.len()
            )));
        }
        if let Some(lens) = pairs.lens()? {
            let fits = |l: i32| {
                usize::try_from(l).ok().and_then(|l| l.checked_mul(elem)) == Some(self.per_key)
            };
            if !lens.iter().all(|&l| fits(l)) {
                return Err(bad("the answer's keys have other lengths".into()));
            }
        }
        let at = range.start * self.per_key;
        let Some(place) = (*self.buf).as_mut().get_mut(at..at + want) else {
            return Err(bad("the buffer shrank while the pull was in flight".into()));
        };
        place.copy_from_slice(&pairs.vals);
        Ok(())
    }

    fn finish(self) -> KvPairs {
        KvPairs {
            keys: self.keys,
            vals: Bytes::from_owner(Filled(self.buf)),
            lens: None,
        }
    }
}

impl InFlightRequest {
    /// Completes the request; later answers are ignored.
    fn complete(&mut self, result: Result<KvPairs>) {
        self.outstanding.clear();
        self.completion.complete(result);
    }
}

impl crate::in_flight::InFlight<KvPairs> for InFlightRequest {
    fn completion(&mut self) -> &mut Completion<KvPairs> {
        &mut self.completion
    }
}

impl<T: Value> KvWorker<T> {
    /// A worker application (`app_id`, `customer_id`) on this node.
    /// Fails when the cluster has no servers (a cluster of workers for collectives only),
    /// and as every call does on a node that stopped ([`Postoffice::stopped_error`]).
    pub async fn new(po: &Postoffice, app_id: i32, customer_id: i32) -> Result<KvWorker<T>> {
        if po.is_stopped() {
            return Err(po.stopped_error());
        }
        if po.num_servers() == 0 {
            return Err(NodeError::InvalidArgument(
                "this cluster has no servers (DMLC_NUM_SERVER=0): a key-value worker needs at \
                 least one"
                    .into(),
            ));
        }
        let inner = Arc::new(WorkerInner {
            po: po.clone(),
            ranges: server_key_ranges(po.num_servers() as usize),
            app_id,
            customer_id,
            elem: std::mem::size_of::<T>(),
            next_id: AtomicI32::new(0),
            copied: AtomicU64::new(0),
            pending: Mutex::new(IntMap::default()),
            restarted: Mutex::new(Vec::new()),
        });
        po.register_customer(app_id, customer_id, Arc::clone(&inner) as Arc<dyn Customer>)
            .await?;
        Ok(KvWorker {
            inner,
            _values: PhantomData,
        })
    }

    /// Pushes `vals` for sorted `keys` (with optional per-key `lens`), copying them once.
    pub async fn push(
        &self,
        keys: &[u64],
        vals: &[T],
        lens: Option<&[i32]>,
        cmd: i32,
    ) -> Result<RequestId> {
        self.zpush(KvPairs::from_slices(keys, vals, lens), cmd)
            .await
    }

    /// Pushes pairs already in [`Bytes`] without copying them.
    pub async fn zpush(&self, pairs: KvPairs, cmd: i32) -> Result<RequestId> {
        self.request(Op::Push, pairs, cmd, None).await
    }

    /// Pulls the values of sorted `keys`.
    pub async fn pull(&self, keys: &[u64], cmd: i32) -> Result<RequestId> {
        self.zpull(values::to_bytes(keys), cmd).await
    }

    /// Pulls the values of sorted `keys` given as little-endian `u64` bytes, without copying.
    pub async fn zpull(&self, keys: Bytes, cmd: i32) -> Result<RequestId> {
        let pairs = KvPairs {
            keys,
            ..KvPairs::default()
        };
        self.request(Op::Pull, pairs, cmd, None).await
    }

    /// Pulls the values of sorted `keys` (little-endian `u64` bytes) into `out`, every key
    /// the same number of values (`out`'s length divided by the key count): each server's
    /// answer is copied once, from the received frame to its keys' place in `out`, with no
    /// join of the parts. The answer's values are `out` itself.
    pub async fn zpull_into(
        &self,
        keys: Bytes,
        out: impl PullBuffer,
        cmd: i32,
    ) -> Result<RequestId> {
        let pairs = KvPairs {
            keys,
            ..KvPairs::default()
        };
        self.request(Op::Pull, pairs, cmd, Some(Box::new(out)))
            .await
    }

    /// [`zpush_pull`](Self::zpush_pull) with the pulled values written into `out`, as
    /// [`zpull_into`](Self::zpull_into) does.
    pub async fn zpush_pull_into(
        &self,
        pairs: KvPairs,
        out: impl PullBuffer,
        cmd: i32,
    ) -> Result<RequestId> {
        self.request(Op::PushPull, pairs, cmd, Some(Box::new(out)))
            .await
    }

    /// Value bytes the pulls into callers' buffers ([`zpull_into`](Self::zpull_into)) have
    /// copied so far: each server's answer once, from its frame to its place. A pull with a
    /// join ([`zpull`](Self::zpull) over several servers) copies outside this count.
    pub fn copied_pull_bytes(&self) -> u64 {
        self.inner.copied.load(Ordering::Relaxed)
    }

    /// Pushes, then pulls the updated values, in one request per server.
    pub async fn push_pull(
        &self,
        keys: &[u64],
        vals: &[T],
        lens: Option<&[i32]>,
        cmd: i32,
    ) -> Result<RequestId> {
        self.zpush_pull(KvPairs::from_slices(keys, vals, lens), cmd)
            .await
    }

    /// [`push_pull`](Self::push_pull) without copying.
    pub async fn zpush_pull(&self, pairs: KvPairs, cmd: i32) -> Result<RequestId> {
        self.request(Op::PushPull, pairs, cmd, None).await
    }

    /// Waits for a request: nothing for a push, the pulled pairs for a pull or push-pull.
    pub async fn wait(&self, id: RequestId) -> Result<KvPairs> {
        crate::in_flight::wait(&self.inner.pending, id).await
    }

    /// [`wait`](Self::wait) for at most `limit`: [`NodeError::Timeout`] if the request is not
    /// answered by then. The request stays pending and may be waited for again. A failed
    /// server fails its requests by itself (the scheduler declares it within
    /// `PS_HEARTBEAT_TIMEOUT`); this bounds a wait on what that cannot see.
    pub async fn wait_timeout(&self, id: RequestId, limit: Duration) -> Result<KvPairs> {
        match tokio::time::timeout(limit, self.wait(id)).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout { waited: limit }),
        }
    }

    /// [`wait`](Self::wait) for threads outside the async runtime (ps-lite's `Wait`).
    ///
    /// Must not be called from inside a tokio runtime thread.
    pub fn wait_blocking(&self, id: RequestId) -> Result<KvPairs> {
        let handle = tokio::runtime::Handle::try_current();
        if handle.is_ok() {
            return Err(NodeError::InvalidArgument(
                "wait_blocking called on a runtime thread; use `wait(id).await`".into(),
            ));
        }
        node::handle::block_on_until(self.wait(id), None).unwrap_or(Err(NodeError::Stopped))
    }

    /// The servers that failed and came back as a new process (recovery) since the last
    /// call, by id. Such a server starts empty unless its application restored a snapshot
    /// ([`KvServer::restore`](crate::KvServer::restore)): a worker that finds one here
    /// should push again what the server must hold (or check what it restored).
    pub fn take_restarted_servers(&self) -> Vec<NodeId> {
        std::mem::take(
            &mut *self
                .inner
                .restarted
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Number of requests issued and not yet waited for.
    pub fn pending(&self) -> usize {
        lock(&self.inner.pending).len()
    }

    /// Sends request `op` with `pairs` (the keys alone for a pull) and `cmd`, sliced across
    /// the servers by key range: the door every push, pull and push-pull goes through. With
    /// `out`, the pulled values are written there ([`zpull_into`](Self::zpull_into)); a push
    /// with `out` is refused ([`NodeError::InvalidArgument`]).
    ///
    /// Keys must be sorted ascending, each once ([`slice_sorted_keys`]). A pull's per-key
    /// lengths, when given (a pull with `out` gives them), say how many values it expects of
    /// each key: a [`SumHandler`](super::SumHandler) answers a key no one pushed with that
    /// many zeros and fails a key that holds another number; without them such a key fails
    /// the pull ([`UnpushedKeys`](super::UnpushedKeys)).
    pub async fn request(
        &self,
        op: Op,
        mut pairs: KvPairs,
        cmd: i32,
        out: Option<Box<dyn PullBuffer>>,
    ) -> Result<RequestId> {
        if op == Op::Push && out.is_some() {
            return Err(NodeError::InvalidArgument(
                "a push answers no values: no buffer to write them into".into(),
            ));
        }
        let inner = &self.inner;
        let po = &inner.po;
        let keys = pairs.keys()?;
        let slices = slice_sorted_keys(&keys, &inner.ranges)
            .map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
        let offsets = match op {
            Op::Pull => None,
            Op::Push | Op::PushPull => Some(pairs.value_offsets(std::mem::size_of::<T>())?),
        };
        drop(keys);
        let servers: Servers = (0u32..)
            .zip(&slices)
            .filter(|(_, slice)| !slice.is_empty())
            .map(|(rank, _)| node_ids::server_rank_to_id(rank))
            .collect();
        let mut entry = InFlightRequest::default();
        if let Some(mut buf) = out {
            let n = slices.iter().map(|s| s.len()).sum::<usize>();
            let bytes = (*buf).as_mut().len();
            let elem = std::mem::size_of::<T>();
            let per_key = bytes.checked_div(n).unwrap_or(0);
            if per_key * n != bytes || per_key % elem != 0 || (n > 0 && per_key == 0) {
                return Err(NodeError::InvalidArgument(format!(
                    "a buffer of {bytes} bytes does not hold the same whole number of \
                     {elem}-byte values for each of {n} keys"
                )));
            }
            // A pull says how many values it expects of each key, so that a server can
            // answer a key no one pushed with that many zeros, or fail naming a key that
            // holds another number (`SumHandler`).
            if op == Op::Pull && pairs.lens.is_none() {
                let count = i32::try_from(per_key / elem).map_err(|_| {
                    NodeError::InvalidArgument(format!(
                        "{} values per key is more than a pull can ask for",
                        per_key / elem
                    ))
                })?;
                pairs.lens = Some(values::repeated(count, n));
            }
            let parts = (0u32..)
                .zip(&slices)
                .filter(|(_, slice)| !slice.is_empty())
                .map(|(rank, slice)| (node_ids::server_rank_to_id(rank), slice.clone()))
                .collect();
            entry.dest = Some(Dest {
                buf,
                per_key,
                parts,
                keys: pairs.keys.clone(),
            });
        }
        if servers.is_empty() {
            let empty = entry.dest.take().map(Dest::finish).unwrap_or_default();
            entry.complete(Ok(empty));
        } else {
            entry.outstanding = servers.clone();
        }
        let id = insert_new(&inner.next_id, &inner.pending, entry);
        let mut msgs: SmallVec<[Message; 1]> = SmallVec::new();
        for (slice, server) in slices.into_iter().filter(|s| !s.is_empty()).zip(&servers) {
            let server = *server;
            let part = pairs.slice(slice, offsets.as_deref());
            let meta = Meta {
                head: cmd,
                app_id: inner.app_id,
                customer_id: inner.customer_id,
                request_id: id,
                sender: Some(po.my_id()),
                recipient: Some(server),
                request: true,
                push: matches!(op, Op::Push | Op::PushPull),
                pull: matches!(op, Op::Pull | Op::PushPull),
                ..Meta::default()
            };
            msgs.push(kv_message(meta, &part, T::DATA_TYPE));
        }
        // Checked after the entry exists: a failure noticed from now on finds the entry, and
        // one noticed before is in the dead list (it is recorded before entries are failed).
        // A lost scheduler fails every request: the cluster can no longer coordinate.
        for server in servers.into_iter().chain([node_ids::SCHEDULER]) {
            if let Some(e) = po.dead_error(server) {
                lock(&inner.pending).remove(&id);
                return Err(e);
            }
        }
        let sent = match msgs.len() {
            0 => Ok(()),
            1 => match msgs.pop() {
                Some(msg) => po.send(msg).await,
                None => Ok(()),
            },
            _ => po.send_batch(msgs.into_vec()).await,
        };
        if let Err(e) = sent {
            lock(&inner.pending).remove(&id);
            return Err(e);
        }
        Ok(id)
    }
}

/// Joins the answers of several servers, in key order.
fn assemble(mut parts: SmallVec<[(NodeId, KvPairs); 1]>) -> KvPairs {
    if parts.len() == 1 {
        return parts.pop().map(|(_, p)| p).unwrap_or_default();
    }
    parts.sort_by_key(|(server, _)| *server);
    KvPairs::concat(parts.iter().map(|(_, part)| part))
}

#[async_trait]
impl Customer for WorkerInner {
    /// A response completes its request at once: nothing to wait for.
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        self.complete(msg);
        None
    }

    async fn deliver(&self, msg: Message) {
        self.complete(msg);
    }

    fn node_failed(&self, node: NodeId, error: &str) {
        self.fail_node(node, error);
    }

    fn node_recovered(&self, node: NodeId) {
        self.fail_node(node, node::postoffice::RECOVERED);
        if node_ids::role_of(node) != Some(van_core::Role::Server) {
            return;
        }
        tracing::warn!(
            server = node,
            "server {node} came back as a new process: it holds no values unless its \
             application restored them"
        );
        let mut restarted = self.restarted.lock().unwrap_or_else(|e| e.into_inner());
        if !restarted.contains(&node) {
            restarted.push(node);
        }
    }
}

impl WorkerInner {
    /// Files a server's response with its request, completing it once every server answered.
    fn complete(&self, msg: Message) {
        if msg.meta.request {
            tracing::warn!(from = ?msg.meta.sender, "a worker received a request; ignored");
            return;
        }
        let Some(server) = msg.meta.sender else {
            return;
        };
        let mut pending = lock(&self.pending);
        let Some(entry) = pending.get_mut(&msg.meta.request_id) else {
            tracing::warn!(
                request = msg.meta.request_id,
                "response to an unknown request"
            );
            return;
        };
        let Some(at) = entry.outstanding.iter().position(|s| *s == server) else {
            tracing::warn!(request = msg.meta.request_id, server, "unexpected response");
            return;
        };
        entry.outstanding.swap_remove(at);
        if !msg.meta.body.is_empty() {
            let reason = String::from_utf8_lossy(&msg.meta.body).into_owned();
            // The server answered: it is alive, only its handler failed this request.
            entry.complete(Err(NodeError::HandlerFailed { server, reason }));
            return;
        }
        let placed = kv_pairs(&msg).and_then(|pairs| match &mut entry.dest {
            Some(dest) => dest.place(server, &pairs, self.elem).map(|()| {
                self.copied
                    .fetch_add(pairs.vals.len() as u64, Ordering::Relaxed);
            }),
            None => {
                entry.parts.push((server, pairs));
                Ok(())
            }
        });
        if let Err(e) = placed {
            entry.complete(Err(e));
            return;
        }
        if entry.outstanding.is_empty() {
            let answer = match entry.dest.take() {
                Some(dest) => dest.finish(),
                None => assemble(std::mem::take(&mut entry.parts)),
            };
            entry.complete(Ok(answer));
        }
    }

    /// Fails the requests waiting on `node` (all of them when the scheduler is lost, or when
    /// our own postoffice stopped).
    fn fail_node(&self, node: NodeId, error: &str) {
        let mut pending = lock(&self.pending);
        // Our own postoffice stopped: nothing will answer anything any more.
        let everything = node == self.po.my_id() || self.po.is_stopped();
        let scheduler = node == node_ids::SCHEDULER;
        for entry in pending.values_mut() {
            if everything && !entry.outstanding.is_empty() {
                entry.complete(Err(self.po.stopped_error()));
            } else if entry.outstanding.contains(&node)
                || (scheduler && !entry.outstanding.is_empty())
            {
                entry.complete(Err(NodeError::node_failed(node, error.to_owned())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KvServer, Role};
    use node::local::LocalCluster;

    /// Awaits a test cluster's run: every node must finish, without error, within a minute.
    async fn within_a_minute<T>(run: impl std::future::Future<Output = crate::Result<T>>) {
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the cluster did not finish in time")
            .expect("a node failed");
    }

    #[tokio::test]
    async fn request_ids_skip_ones_still_pending_when_the_counter_wraps() {
        let cluster = LocalCluster::new(1, 1);
        let run = cluster.run(|po| async move {
            match po.role() {
                Role::Server => {
                    let _server = KvServer::<f32>::with_sum(&po, 0, 0, 1).await?;
                    po.finalize().await?;
                }
                Role::Worker => {
                    let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                    for key in 1..=4u64 {
                        let id = worker.push(&[key], &[key as f32], None, 0).await?;
                        worker.wait(id).await?;
                    }
                    // Issued and not yet waited for: its id must not be handed out again.
                    let first = worker.pull(&[1], 0).await?;
                    // The counter came all the way round to the pending id.
                    worker.inner.next_id.store(first, Ordering::Relaxed);
                    let second = worker.pull(&[2], 0).await?;
                    // The counter reaches the top and wraps.
                    worker.inner.next_id.store(i32::MAX, Ordering::Relaxed);
                    let third = worker.pull(&[3], 0).await?;
                    let fourth = worker.pull(&[4], 0).await?;
                    let ids = [first, second, third, fourth];
                    assert_eq!(third, i32::MAX);
                    for (i, id) in ids.iter().enumerate() {
                        assert!(*id >= 0, "request id {id} is negative");
                        assert!(!ids[..i].contains(id), "request id {id} reused: {ids:?}");
                    }
                    // Each wait gets its own request's answer.
                    for (key, id) in (1..=4u64).zip(ids) {
                        let pulled = worker.wait(id).await?;
                        assert_eq!(&*pulled.keys()?, &[key]);
                        assert_eq!(&*pulled.vals::<f32>()?, &[key as f32]);
                    }
                    assert_eq!(worker.pending(), 0);
                    // A push answers no values: a buffer for them is refused, not left
                    // waiting for an answer that cannot fill it.
                    let pairs = KvPairs::from_slices(&[1u64], &[1f32], None);
                    let out: Box<dyn PullBuffer> = Box::new(vec![0u8; 4]);
                    match worker.request(Op::Push, pairs, 0, Some(out)).await {
                        Err(NodeError::InvalidArgument(why)) => assert!(why.contains("push")),
                        other => panic!("a push with a buffer: {other:?}"),
                    }
                    assert_eq!(worker.pending(), 0);
                    po.finalize().await?;
                }
                Role::Scheduler => po.finalize().await?,
            }
            Ok(())
        });
        within_a_minute(run).await;
    }

    #[tokio::test]
    async fn a_wait_with_a_limit_ends_and_the_request_can_be_waited_for_again() {
        let cluster = LocalCluster::new(1, 1);
        let run = cluster.run(|po| async move {
            let both = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;
            match po.role() {
                Role::Server => {
                    // No application to answer until the worker's first wait ran out (the
                    // request is held for it meanwhile).
                    po.barrier(both).await?;
                    let _server = KvServer::<f32>::with_sum(&po, 0, 0, 1).await?;
                    po.finalize().await?;
                }
                Role::Worker => {
                    let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                    let id = worker.push(&[5], &[2.5], None, 0).await?;
                    let limit = Duration::from_millis(300);
                    match worker.wait_timeout(id, limit).await {
                        Err(NodeError::Timeout { waited }) => assert_eq!(waited, limit),
                        other => panic!("expected a timeout, got {other:?}"),
                    }
                    assert_eq!(worker.pending(), 1, "the request stays pending");
                    po.barrier(both).await?;
                    worker.wait_timeout(id, Duration::from_secs(30)).await?;
                    let pulled = worker.wait(worker.pull(&[5], 0).await?).await?;
                    assert_eq!(&*pulled.vals::<f32>()?, &[2.5]);
                    po.finalize().await?;
                }
                Role::Scheduler => po.finalize().await?,
            }
            Ok(())
        });
        within_a_minute(run).await;
    }
}
