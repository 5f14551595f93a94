//! [`KvServer`]: ps-lite's `KVServer`, with shared-nothing shards.
//!
//! The server's key range is cut into `shards` contiguous sub-ranges; each is owned by one
//! task running its own [`RequestHandler`] (for [`SumHandler`](super::SumHandler), its own
//! store), fed by a bounded queue. A request whose keys all fall in one shard (the common case, and always
//! with one key per request) goes to that shard whole; a request spanning shards is split
//! into zero-copy slices and the answers are joined before the response goes out. No lock is
//! taken on the aggregation path.

use std::collections::hash_map::Entry;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::warn;
use van_core::{Message, Meta};

use super::hold::{Handled, HeldRequest, Released, ShardContext, MAX_HELD_REQUESTS};
use super::round::ROUND_CMD;
use super::snapshot::Snapshot;
use super::{kv_message, kv_pairs, KvMeta, KvPairs};
use crate::range::{server_key_ranges, slice_sorted_keys, KeyRange};
use crate::values::Value;
use node::error::{NodeError, Result};
use node::hash::IntMap;
use node::postoffice::{Customer, Postoffice};

/// Requests queued per shard before the server stops reading (back-pressure).
const SHARD_QUEUE: usize = 4096;
/// Granularity of the server's byte budget; requests smaller than this never wait for it.
const BUDGET_UNIT: usize = 64 << 10;
/// The smallest byte budget of a server, whatever the frame pool's size.
const MIN_BUDGET_BYTES: usize = 16 << 20;
/// Requests a shard takes from its queue at a time; their answers leave together.
const SHARD_BATCH: usize = 256;

/// Answers the requests of one shard. Runs on that shard's task only: it owns its state and
/// needs no locks. It runs on an async runtime thread, so it must not block (no sleeping, no
/// blocking I/O): a blocked handler stalls the tasks queued behind it on that thread.
pub trait RequestHandler: Send + 'static {
    /// Handles one request; the returned pairs are the response's data (empty for a push).
    /// An `Err` is sent back to the worker, whose `wait` fails with
    /// [`NodeError::HandlerFailed`] naming this server and carrying the text.
    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> std::result::Result<KvPairs, String>;

    /// Handles one request, or holds it to answer later: what the server calls. A handler
    /// that holds requests (a synchronous round waiting for every worker, as
    /// [`SumHandler`](super::SumHandler) does for [`ROUND_CMD`]) answers them through
    /// [`take_released`](Self::take_released); `context` says how many workers there are
    /// and how many more requests the shard can hold. The default answers at once with
    /// [`handle`](Self::handle).
    fn handle_or_hold(
        &mut self,
        meta: &KvMeta,
        request: KvPairs,
        context: &ShardContext,
    ) -> Handled {
        let _ = context;
        Handled::Answer(self.handle(meta, request))
    }

    /// Moves the answers of requests held earlier ([`Handled::Held`]) that are ready into
    /// `released`; the server sends them. Called after each request handled. The default
    /// holds nothing, so has nothing to give.
    fn take_released(&mut self, released: &mut Vec<Released>) {
        let _ = released;
    }

    /// This shard's state as bytes, for [`KvServer::snapshot`]. The default has none to
    /// give: an error saying so.
    fn snapshot(&self) -> std::result::Result<Vec<u8>, String> {
        Err("this request handler does not take snapshots".to_owned())
    }

    /// Replaces this shard's state with bytes [`snapshot`](Self::snapshot) gave, for
    /// [`KvServer::restore`]. The default cannot: an error saying so.
    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        let _ = state;
        Err("this request handler does not restore snapshots".to_owned())
    }
}

/// What a shard's task is asked to do, in the order asked.
enum Work {
    /// Handle a request (or a part of one).
    Request(Job),
    /// Give the handler's state.
    Snapshot(oneshot::Sender<std::result::Result<Vec<u8>, String>>),
    /// Replace the handler's state.
    Restore(Bytes, oneshot::Sender<std::result::Result<(), String>>),
}

/// One request, or one shard's part of it, on its way to a shard.
struct Job {
    meta: KvMeta,
    pairs: KvPairs,
    reply: Reply,
    /// The request's share of the server's byte budget, returned once handled.
    _held: Option<Arc<Hold>>,
}

/// A large request's bytes while the server holds them: its share of the byte budget (once
/// granted) and its count in [`KvServer::held_bytes`], both returned when the last part of
/// the request has been handled.
struct Hold {
    bytes: usize,
    counter: Arc<AtomicUsize>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Hold {
    fn new(bytes: usize, counter: &Arc<AtomicUsize>) -> Hold {
        counter.fetch_add(bytes, Ordering::Relaxed);
        Hold {
            bytes,
            counter: Arc::clone(counter),
            _permit: None,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

enum Reply {
    /// The whole request went to this shard: answer directly.
    Direct,
    /// One part of a split request.
    Part(Arc<Gather>, usize),
}

/// What a handler answered for one part of a request.
type PartResult = std::result::Result<KvPairs, String>;

/// Collects the parts of a request that spans shards: how many are missing, and each part.
struct Gather {
    parts: Mutex<(usize, Vec<Option<PartResult>>)>,
}

/// Answers pushes and pulls for this node's key range.
pub struct KvServer<T: Value> {
    _inner: Arc<ServerInner>,
    _values: PhantomData<fn() -> T>,
}

impl<T: Value> std::fmt::Debug for KvServer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvServer")
            .field("shards", &self._inner.shards.len())
            .finish_non_exhaustive()
    }
}

struct ServerInner {
    po: Postoffice,
    /// This server's key range, and each shard's part of it.
    range: KeyRange,
    ranges: Vec<KeyRange>,
    shards: Vec<mpsc::Sender<Work>>,
    /// Bytes of large requests received and not yet handled, in units of
    /// [`BUDGET_UNIT`]: a server holds at most the frame pool's worth (so the pool's buffers
    /// are reused instead of fresh memory paging in), and stops reading beyond that, which
    /// pushes back on the senders through the van.
    budget: Arc<Semaphore>,
    budget_units: u32,
    /// Bytes of large requests received and not yet handled, including one waiting for
    /// budget: what [`KvServer::held_bytes`] reports.
    held: Arc<AtomicUsize>,
}

impl<T: Value> KvServer<T> {
    /// A server application whose `shards` shards each run a handler from `make(shard)`.
    pub async fn new<H: RequestHandler>(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: impl Fn(usize) -> H,
    ) -> Result<KvServer<T>> {
        KvServer::build(po, app_id, customer_id, shards, make, None).await
    }

    /// Like [`new`](Self::new), each shard's handler restored from `snapshot` before the
    /// server takes any request: how a server that came back as a new process (recovery,
    /// [`Postoffice::is_recovery`]) resumes from a checkpoint without a push that arrives
    /// meanwhile being overwritten. The snapshot must come from a server of the same key
    /// range and shard count.
    pub async fn new_restored<H: RequestHandler>(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: impl Fn(usize) -> H,
        snapshot: &Snapshot,
    ) -> Result<KvServer<T>> {
        KvServer::build(po, app_id, customer_id, shards, make, Some(snapshot)).await
    }

    async fn build<H: RequestHandler>(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: impl Fn(usize) -> H,
        snapshot: Option<&Snapshot>,
    ) -> Result<KvServer<T>> {
        let my_range = server_key_ranges(po.num_servers().max(1) as usize)
            .get(po.my_rank() as usize)
            .copied()
            .ok_or_else(|| NodeError::InvalidArgument("this node is not a server".into()))?;
        let ranges = my_range.split(shards.max(1));
        if let Some(snapshot) = snapshot {
            snapshot.check_shape(my_range, ranges.len())?;
        }
        let mut handlers = Vec::with_capacity(ranges.len());
        for shard in 0..ranges.len() {
            let mut handler = make(shard);
            if let Some(state) = snapshot.and_then(|s| s.shards.get(shard)) {
                handler.restore(state).map_err(|e| {
                    NodeError::InvalidArgument(format!("shard {shard} cannot restore: {e}"))
                })?;
            }
            handlers.push(handler);
        }
        let mut senders = Vec::with_capacity(ranges.len());
        for handler in handlers {
            let (tx, rx) = mpsc::channel(SHARD_QUEUE);
            tokio::spawn(run_shard(po.clone(), handler, rx));
            senders.push(tx);
        }
        let budget_units =
            u32::try_from(po.config().frame_pool_bytes.max(MIN_BUDGET_BYTES) / BUDGET_UNIT)
                .unwrap_or(u32::MAX >> 4);
        let inner = Arc::new(ServerInner {
            po: po.clone(),
            range: my_range,
            ranges,
            shards: senders,
            budget: Arc::new(Semaphore::new(budget_units as usize)),
            budget_units,
            held: Arc::new(AtomicUsize::new(0)),
        });
        po.register_customer(app_id, customer_id, Arc::clone(&inner) as Arc<dyn Customer>)
            .await?;
        Ok(KvServer {
            _inner: inner,
            _values: PhantomData,
        })
    }

    /// Bytes of large requests (64 KiB and up) this server has received and not yet
    /// answered. The server's byte budget (the frame pool's size, at least 16 MiB) bounds it,
    /// plus the one request waiting for room: beyond that the server stops reading and its
    /// senders are pushed back on through the van.
    pub fn held_bytes(&self) -> usize {
        self._inner.held.load(Ordering::Relaxed)
    }

    /// The values this server holds, shard by shard, for a checkpoint. Each shard's state is
    /// taken after the requests queued to it before this call: take it where no request is
    /// in flight (after a barrier of the workers) for a consistent checkpoint of the cluster.
    /// Fails if a handler cannot give its state ([`RequestHandler::snapshot`]).
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let mut shards = Vec::with_capacity(self._inner.shards.len());
        for (shard, queue) in self._inner.shards.iter().enumerate() {
            let (tx, rx) = oneshot::channel();
            queue
                .send(Work::Snapshot(tx))
                .await
                .map_err(|_| NodeError::Stopped)?;
            let state = rx.await.map_err(|_| NodeError::Stopped)?;
            let state = state.map_err(|e| {
                NodeError::InvalidArgument(format!("shard {shard} cannot take a snapshot: {e}"))
            })?;
            shards.push(Bytes::from(state));
        }
        Ok(Snapshot {
            range: self._inner.range,
            shards,
        })
    }

    /// Replaces the values this server holds with `snapshot`'s, after the requests already
    /// queued (a rollback to a checkpoint). A server started again after a failure should
    /// use [`new_restored`](Self::new_restored) instead: requests may reach it as soon as it
    /// exists, and this would overwrite them. The snapshot must come from a server of the
    /// same key range and shard count.
    pub async fn restore(&self, snapshot: &Snapshot) -> Result<()> {
        let inner = &self._inner;
        snapshot.check_shape(inner.range, inner.shards.len())?;
        for (shard, (queue, state)) in inner.shards.iter().zip(&snapshot.shards).enumerate() {
            let (tx, rx) = oneshot::channel();
            queue
                .send(Work::Restore(state.clone(), tx))
                .await
                .map_err(|_| NodeError::Stopped)?;
            rx.await.map_err(|_| NodeError::Stopped)?.map_err(|e| {
                NodeError::InvalidArgument(format!("shard {shard} cannot restore: {e}"))
            })?;
        }
        Ok(())
    }
}

/// A request the handler holds ([`Handled::Held`]): what its answer needs.
struct HeldJob {
    meta: KvMeta,
    reply: Reply,
}

async fn run_shard<H: RequestHandler>(
    po: Postoffice,
    mut handler: H,
    mut jobs: mpsc::Receiver<Work>,
) {
    let num_workers = po.num_workers();
    let mut batch = Vec::with_capacity(SHARD_BATCH);
    let mut answers = Vec::new();
    // The requests the handler holds, by `HeldRequest::table_key`: at most
    // MAX_HELD_REQUESTS (its doc says why that many), and their answers it released.
    let mut held: IntMap<u64, HeldJob> = IntMap::default();
    let mut released = Vec::new();
    while jobs.recv_many(&mut batch, SHARD_BATCH).await > 0 {
        for work in batch.drain(..) {
            let Job {
                meta,
                pairs,
                reply,
                _held: budget,
            } = match work {
                Work::Request(job) => job,
                Work::Snapshot(reply) => {
                    let _ = reply.send(handler.snapshot());
                    continue;
                }
                Work::Restore(state, reply) => {
                    let _ = reply.send(handler.restore(&state));
                    continue;
                }
            };
            let context = ShardContext {
                num_workers,
                hold_room: MAX_HELD_REQUESTS.saturating_sub(held.len()),
            };
            // A handler that panics answers this request with an error and keeps its shard.
            let call =
                std::panic::AssertUnwindSafe(|| handler.handle_or_hold(&meta, pairs, &context));
            let handled = std::panic::catch_unwind(call).unwrap_or_else(|_| {
                Handled::Answer(Err("the server's request handler panicked".to_owned()))
            });
            // The request's bytes are the handler's now: its share of the byte budget goes
            // back, so that held requests never stop the server from reading the pushes
            // that complete them.
            drop(budget);
            let id = HeldRequest::of(&meta);
            match handled {
                Handled::Answer(result) => answer(&po, &meta, reply, result, &mut answers),
                Handled::Held if held.len() >= MAX_HELD_REQUESTS => {
                    let reason = format!("the shard already holds {MAX_HELD_REQUESTS} requests");
                    answer(&po, &meta, reply, Err(reason), &mut answers);
                }
                Handled::Held => match held.entry(id.table_key()) {
                    Entry::Vacant(slot) => {
                        slot.insert(HeldJob { meta, reply });
                    }
                    Entry::Occupied(_) => {
                        let reason = format!("request {} is already held", id.request_id);
                        answer(&po, &meta, reply, Err(reason), &mut answers);
                    }
                },
            }
            handler.take_released(&mut released);
            for Released {
                request,
                answer: result,
            } in released.drain(..)
            {
                match held.remove(&request.table_key()) {
                    Some(job) => answer(&po, &job.meta, job.reply, result, &mut answers),
                    None => warn!(?request, "the handler released a request it did not hold"),
                }
            }
        }
        send_responses(&po, &mut answers).await;
    }
}

/// Adds the answer to one request, or to one part of a split request, to `answers`: at once
/// for a whole request, with the last part for a split one.
fn answer(
    po: &Postoffice,
    meta: &KvMeta,
    reply: Reply,
    result: PartResult,
    answers: &mut Vec<Message>,
) {
    let whole = match reply {
        Reply::Direct => Some(result),
        Reply::Part(gather, index) => gather.add(index, result),
    };
    if let Some(result) = whole {
        answers.push(response(po, meta, result));
    }
}

/// Sends the answers of one batch of requests, each run of answers to the same worker as one
/// batch (one route lookup, one hand-over to the van); a worker that cannot be reached loses
/// only its own answers.
async fn send_responses(po: &Postoffice, answers: &mut Vec<Message>) {
    while !answers.is_empty() {
        let worker = answers[0].meta.recipient;
        let run = answers
            .iter()
            .position(|m| m.meta.recipient != worker)
            .unwrap_or(answers.len());
        let rest = answers.split_off(run);
        let run = std::mem::replace(answers, rest);
        let count = run.len();
        let result = if count == 1 {
            match run.into_iter().next() {
                Some(msg) => po.send(msg).await,
                None => Ok(()),
            }
        } else {
            po.send_batch(run).await
        };
        if let Err(e) = result {
            warn!(?worker, "cannot answer {count} request(s): {e}");
        }
    }
}

impl Gather {
    /// Stores one part; returns the joined answer once the last part is in.
    fn add(
        &self,
        index: usize,
        part: std::result::Result<KvPairs, String>,
    ) -> Option<std::result::Result<KvPairs, String>> {
        let mut guard = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        let (remaining, parts) = &mut *guard;
        if let Some(slot) = parts.get_mut(index) {
            *slot = Some(part);
        }
        *remaining = remaining.saturating_sub(1);
        if *remaining > 0 {
            return None;
        }
        let mut done = Vec::with_capacity(parts.len());
        for part in parts.drain(..).flatten() {
            match part {
                Ok(p) => done.push(p),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(KvPairs::concat(&done)))
    }
}

/// The answer to `request`: its values, or the reason it failed.
fn response(
    po: &Postoffice,
    request: &KvMeta,
    result: std::result::Result<KvPairs, String>,
) -> Message {
    let mut meta = Meta {
        head: request.cmd,
        app_id: request.app_id,
        customer_id: request.customer_id,
        request_id: request.request_id,
        sender: Some(po.my_id()),
        recipient: Some(request.sender),
        request: false,
        push: request.push,
        pull: request.pull,
        ..Meta::default()
    };
    match result {
        Ok(pairs) if pairs.keys.is_empty() && pairs.vals.is_empty() => Message {
            meta,
            data: van_core::Parts::new(),
        },
        Ok(pairs) => kv_message(meta, &pairs, request.val_type),
        Err(reason) => {
            meta.body = Bytes::from(if reason.is_empty() {
                "handler failed".to_owned()
            } else {
                reason
            });
            Message {
                meta,
                data: van_core::Parts::new(),
            }
        }
    }
}

/// A large request's hold on `units` of the byte budget, waiting for them (0 units: a small
/// request, nothing to hold). Its `bytes` count in `held` while it waits, too: the message is
/// held in memory meanwhile. Fails only if the budget was closed, which the caller answers
/// like any request it cannot serve.
async fn wait_for_budget(
    budget: &Arc<Semaphore>,
    units: u32,
    bytes: usize,
    held: &Arc<AtomicUsize>,
) -> std::result::Result<Option<Arc<Hold>>, String> {
    if units == 0 {
        return Ok(None);
    }
    let mut hold = Hold::new(bytes, held);
    let permit = Arc::clone(budget)
        .acquire_many_owned(units)
        .await
        .map_err(|_| "the server is stopping (its byte budget is closed)".to_owned())?;
    hold._permit = Some(permit);
    Ok(Some(Arc::new(hold)))
}

/// Sends the answer to `request` on its own.
async fn respond(po: &Postoffice, request: &KvMeta, result: std::result::Result<KvPairs, String>) {
    let msg = response(po, request, result);
    if let Err(e) = po.send(msg).await {
        warn!(
            worker = request.sender,
            "cannot answer request {}: {e}", request.request_id
        );
    }
}

#[async_trait]
impl Customer for ServerInner {
    /// A key-value request for an application this node does not serve: answered with the
    /// node's reason, as a handler's failure is (the worker's `HandlerFailed`).
    fn refusal(&self, request: &Message, reason: &str) -> Option<Message> {
        // ps-lite's key-value requests push, pull or both; other applications' (a
        // rendezvous, collectives, a simple app) do neither and are not this server's to
        // refuse.
        let m = &request.meta;
        let key_value = m.request && (m.push || m.pull) && !m.simple_app && m.control.is_none();
        let meta = kv_meta(request).filter(|_| key_value)?;
        Some(response(&self.po, &meta, Err(reason.to_owned())))
    }

    /// The common case without waiting: a well-formed request whose keys one shard owns,
    /// queued to it while its queue has room. Anything else takes the full path.
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        let Some(meta) = kv_meta(&msg) else {
            return Some(msg);
        };
        if self.shards.len() != 1 || !msg.meta.request {
            return Some(msg);
        }
        let Ok(pairs) = kv_pairs(&msg) else {
            return Some(msg);
        };
        // Keys borrowed in place (aligned), so checking their order allocates nothing.
        let sorted = pairs
            .keys()
            .is_ok_and(|keys| keys.windows(2).all(|w| w[0] < w[1]));
        if !sorted {
            return Some(msg);
        }
        let units = self.units(&msg);
        let held = if units == 0 {
            None
        } else {
            let mut hold = Hold::new(msg.data_len(), &self.held);
            match Arc::clone(&self.budget).try_acquire_many_owned(units) {
                Ok(permit) => hold._permit = Some(permit),
                Err(_) => return Some(msg),
            }
            Some(Arc::new(hold))
        };
        let job = Job {
            meta,
            pairs,
            reply: Reply::Direct,
            _held: held,
        };
        match self.shards[0].try_send(Work::Request(job)) {
            Ok(()) => None,
            Err(_) => Some(msg),
        }
    }

    async fn deliver(&self, msg: Message) {
        let Some(meta) = kv_meta(&msg) else {
            warn!("KV request without a sender; ignored");
            return;
        };
        let sender = meta.sender;
        if !msg.meta.request {
            warn!(from = sender, "a server received a response; ignored");
            return;
        }
        let units = self.units(&msg);
        let routed = match wait_for_budget(&self.budget, units, msg.data_len(), &self.held).await {
            Ok(held) => self.route(meta, &msg, held).await,
            Err(reason) => Err(reason),
        };
        // A request that cannot be served is answered with the reason: the worker's `wait`
        // must end, and the server keeps serving everyone else.
        if let Err(reason) = routed {
            warn!("request {} from {sender}: {reason}", meta.request_id);
            respond(&self.po, &meta, Err(reason)).await;
        }
    }

    fn node_failed(&self, _node: van_core::NodeId, _error: &str) {}
}

/// The request's fields a server needs, or `None` without a sender.
fn kv_meta(msg: &Message) -> Option<KvMeta> {
    let sender = msg.meta.sender?;
    Some(KvMeta {
        cmd: msg.meta.head,
        push: msg.meta.push,
        pull: msg.meta.pull,
        sender,
        request_id: msg.meta.request_id,
        app_id: msg.meta.app_id,
        customer_id: msg.meta.customer_id,
        val_type: msg
            .meta
            .data_types
            .get(1)
            .copied()
            .unwrap_or(van_core::DataType::Other),
    })
}

impl ServerInner {
    /// Sends a request (or its parts) to the shard(s) owning its keys.
    /// The request's share of the byte budget (0 for small requests; at most all of it, so
    /// that a request larger than the budget still goes through, alone).
    fn units(&self, msg: &Message) -> u32 {
        u32::try_from(msg.data_len() / BUDGET_UNIT)
            .unwrap_or(u32::MAX)
            .min(self.budget_units)
    }

    async fn route(
        &self,
        meta: KvMeta,
        msg: &Message,
        held: Option<Arc<Hold>>,
    ) -> std::result::Result<(), String> {
        let pairs = kv_pairs(msg).map_err(|e| e.to_string())?;
        let keys = pairs.keys().map_err(|e| e.to_string())?;
        let slices = slice_sorted_keys(&keys, &self.ranges).map_err(|e| e.to_string())?;
        drop(keys);
        let touched: Vec<usize> = (0..slices.len())
            .filter(|i| !slices[*i].is_empty())
            .collect();
        if touched.len() <= 1 {
            let shard = touched.first().copied().unwrap_or(0);
            let job = Job {
                meta,
                pairs,
                reply: Reply::Direct,
                _held: held,
            };
            return self.submit(shard, job).await;
        }
        // Each shard's part would look like a round of its own to the handler.
        if meta.cmd == ROUND_CMD {
            return Err(format!(
                "a round push-pull carries one key per request, not {}",
                pairs.len()
            ));
        }
        let offsets = if meta.push {
            Some(
                pairs
                    .value_offsets(meta.val_type.size())
                    .map_err(|e| e.to_string())?,
            )
        } else {
            None
        };
        let gather = Arc::new(Gather {
            parts: Mutex::new((touched.len(), vec![None; touched.len()])),
        });
        for (index, shard) in touched.into_iter().enumerate() {
            let s = slices[shard].clone();
            // `kv_pairs` checked that lengths, when present, cover every key.
            let part = pairs.slice(s, offsets.as_deref());
            let reply = Reply::Part(Arc::clone(&gather), index);
            let job = Job {
                meta,
                pairs: part,
                reply,
                _held: held.clone(),
            };
            if let Err(reason) = self.submit(shard, job).await {
                // Complete the gather so the parts already queued still answer once.
                if let Some(answer) = gather.add(index, Err(reason)) {
                    respond(&self.po, &meta, answer).await;
                }
            }
        }
        Ok(())
    }

    async fn submit(&self, shard: usize, job: Job) -> std::result::Result<(), String> {
        let queue = self
            .shards
            .get(shard)
            .ok_or_else(|| format!("no shard {shard}"))?;
        queue
            .send(Work::Request(job))
            .await
            .map_err(|_| format!("shard {shard} has stopped"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waiting_for_a_closed_budget_fails_and_is_no_longer_counted() {
        let held = Arc::new(AtomicUsize::new(0));
        let budget = Arc::new(Semaphore::new(2));
        let small = wait_for_budget(&budget, 0, 100, &held).await.unwrap();
        assert!(small.is_none());
        let big = wait_for_budget(&budget, 2, 1 << 20, &held).await.unwrap();
        assert_eq!(held.load(Ordering::Relaxed), 1 << 20);
        // A second large request waits; closing the budget ends the wait with an error.
        let waiting = wait_for_budget(&budget, 1, 1 << 19, &held);
        let closer = async {
            tokio::task::yield_now().await;
            assert_eq!(held.load(Ordering::Relaxed), (1 << 20) + (1 << 19));
            budget.close();
        };
        let (refused, ()) = tokio::join!(waiting, closer);
        let Err(reason) = refused else {
            panic!("a closed budget granted a hold");
        };
        assert!(reason.contains("stopping"), "{reason}");
        assert_eq!(held.load(Ordering::Relaxed), 1 << 20);
        drop(big);
        assert_eq!(held.load(Ordering::Relaxed), 0);
    }
}
