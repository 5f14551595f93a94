//! [`Postoffice`]: one per node. It joins the cluster, runs barriers, sends heartbeats,
//! learns of failures and dispatches data messages to the node's applications (customers).
//!
//! On the scheduler it also drives the [`crate::control::Scheduler`] state
//! machine: every control message the scheduler receives goes through
//! `Scheduler::handle`, and the postoffice carries out what it returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use van_core::{
    inbox, node_ids, Command, Config, Event, Inbox, Message, Node, NodeId, Role, SharedBuf, Van,
    VanKind,
};

use crate::control::{Output, Scheduler, SchedulerConfig};
use crate::delivery::{Customers, DataQueue};
// The trait of a node's applications, defined beside how messages reach them.
pub use crate::delivery::{Customer, RECOVERED, UNSERVED_GRACE};
use crate::error::{NodeError, Result};
pub use crate::member::ALL_GROUPS;
use crate::member::{Action, Input, Member, MemberConfig};
use crate::router::Router;
use crate::table::NodeTable;

// Joining: reaching the scheduler, registering, the node table.
mod join;
// Carrying out what the node's `Member` decides, and the resends of `PS_RESEND`.
mod membership;
// The scheduler's sends: one ordered queue per node.
mod outbox;
// The vans a node has, and the scheduler it may host.
mod vans;

use self::outbox::{Outboxes, Post};
use self::vans::{endpoint_port, extra_vans, host_identity, stream_van};

/// Batches a node's inbox holds before its vans push back.
const INBOX_BATCHES: usize = 1024;
/// How long the scheduler waits, after the final barrier (passed or failed), for the others
/// to say goodbye or be declared dead.
const FINISH_GRACE: Duration = Duration::from_secs(10);
/// How long stopping waits for the scheduler's outboxes to empty.
const OUTBOX_FLUSH: Duration = Duration::from_secs(2);
/// How long a send that nothing waits for (a notice to a node declared dead, a batch of
/// acknowledgements) may take before it is given up: such sends run beside the loop that
/// queued them and must not pile up behind a peer that never answers.
const BEST_EFFORT_SEND: Duration = Duration::from_secs(5);

/// `send`, given up after `limit`; what happened, for the log, when it did not go out.
async fn bounded_send(
    limit: Duration,
    send: impl std::future::Future<Output = Result<()>>,
) -> std::result::Result<(), String> {
    match tokio::time::timeout(limit, send).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no progress in {limit:?}; given up")),
    }
}

/// A node's postoffice; cheap to clone (all clones are the same node).
#[derive(Clone)]
pub struct Postoffice {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Postoffice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postoffice")
            .field("role", &self.inner.role)
            .field("id", &self.inner.my_id.get())
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: Config,
    role: Role,
    router: Router,
    /// This node as announced (id unset until the table arrives).
    me: Node,
    my_id: OnceLock<NodeId>,
    /// The node table, scheduler first, then servers and workers by id.
    table: OnceLock<NodeTable>,
    ready: watch::Sender<bool>,
    /// This process's incarnation: sent with its registration, so that the scheduler tells a
    /// registration re-sent from one sent by a new process at the same address.
    incarnation: u64,
    /// Who is in the cluster and alive, barriers, finalize: the decisions, which this
    /// postoffice carries out (`membership.rs`).
    member: Arc<Mutex<Member>>,
    /// Bumped whenever a node is declared dead or recovers ([`Postoffice::wait_alive`]).
    membership: watch::Sender<u64>,
    scheduler: Option<Mutex<Scheduler>>,
    customers: Mutex<Customers>,
    /// Who waits for each pending barrier.
    barriers: Mutex<HashMap<i32, oneshot::Sender<Result<()>>>>,
    /// Set once `alloc` has warned about falling back to ordinary memory.
    alloc_warned: AtomicBool,
    /// Set once a `finalize` has left the cluster in order: a later one succeeds at once.
    finalized: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// On the scheduler: what it sends, queued per node (`outbox.rs`).
    outboxes: Outboxes,
    /// The scheduler this process hosts besides its own role (`TF_CONFIG` chief or worker 0).
    hosted_scheduler: Mutex<Option<JoinHandle<Result<()>>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section in this file is a few map operations with no await and no call
    // out, so a poisoned lock still holds consistent data.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Postoffice {
    /// Joins the cluster described by `config` with its stream van (TCP by default): binds,
    /// registers with the scheduler (or, on the scheduler, waits for everyone), receives the
    /// node table. Fails with [`NodeError::Bootstrap`] after `config.bootstrap_timeout`.
    pub async fn start(config: Config) -> Result<Postoffice> {
        let mut vans = vec![stream_van(&config)?];
        vans.extend(extra_vans(&config));
        vans.extend(crate::rdma::rdma_van(&config)?);
        Postoffice::start_with_vans(config, vans).await
    }

    /// Like [`start`](Self::start), over a van the caller made (e.g. an in-process van).
    pub async fn start_with_van(config: Config, van: Arc<dyn Van>) -> Result<Postoffice> {
        Postoffice::start_with_vans(config, vec![van]).await
    }

    /// Like [`start`](Self::start), over vans the caller made: the first is the stream van
    /// (it carries the scheduler link), the others are chosen per peer by the selection policy.
    pub async fn start_with_vans(config: Config, vans: Vec<Arc<dyn Van>>) -> Result<Postoffice> {
        // One deadline for all of joining: waiting for names to resolve, then bootstrap.
        let started = Instant::now();
        let left = || config.bootstrap_timeout.saturating_sub(started.elapsed());
        let role = config.role.ok_or_else(|| {
            NodeError::InvalidArgument("DMLC_ROLE is not set: scheduler, server or worker".into())
        })?;
        let host = if role == Role::Scheduler {
            config.root_uri.clone()
        } else {
            crate::netif::announced_host(&config, left()).await?
        };
        let port = if role == Role::Scheduler {
            config.root_port
        } else {
            config.port
        };
        let hosted_scheduler =
            (config.hosts_scheduler && role != Role::Scheduler).then(|| host_scheduler(&config));
        let mut me = Node::new(role, host.clone(), port);
        me.host_identity = config
            .host_id
            .clone()
            .unwrap_or_else(|| host_identity(&config));
        let incarnation = crate::resend::new_incarnation();
        me.incarnation = incarnation;
        me.task = config.tf_task.clone().filter(|_| role != Role::Scheduler);
        // A network van binds by name (the address announced is the name): wait for it to
        // resolve. In-process vans take any name.
        let networked = vans
            .first()
            .is_some_and(|van| van.kind() != VanKind::InProcess);
        let member = Arc::new(Mutex::new(Member::new(
            MemberConfig {
                role,
                incarnation,
                // Without heartbeats sent, no answer renews the lease on the scheduler.
                heartbeat_timeout: config.heartbeat_interval.and(config.heartbeat_timeout),
                resend: config.resend_timeout.is_some(),
            },
            Instant::now(),
        )));
        let router = Router::new(vans, &config, me.clone(), incarnation, member.clone());
        let (inbox_tx, inbox) = inbox(INBOX_BATCHES);
        if networked {
            crate::netif::wait_resolvable(&host, left()).await;
        }
        let endpoints = router.bind(&host, port, inbox_tx).await?;
        me.port = endpoints.first().map_or(port, endpoint_port);
        me.endpoints = endpoints;
        let scheduler = (role == Role::Scheduler).then(|| {
            Mutex::new(Scheduler::new(
                SchedulerConfig {
                    num_workers: config.num_workers,
                    num_servers: config.num_servers,
                    heartbeat_timeout: config.heartbeat_timeout,
                    replacement_grace: config.replacement_grace,
                },
                me.clone().with_id(node_ids::SCHEDULER),
            ))
        });
        let (ready, _) = watch::channel(false);
        let po = Postoffice {
            inner: Arc::new(Inner {
                config,
                role,
                router,
                me,
                my_id: OnceLock::new(),
                table: OnceLock::new(),
                ready,
                incarnation,
                member,
                membership: watch::channel(0).0,
                scheduler,
                customers: Mutex::new(Customers::default()),
                barriers: Mutex::new(HashMap::new()),
                alloc_warned: AtomicBool::new(false),
                finalized: AtomicBool::new(false),
                tasks: Mutex::new(Vec::new()),
                outboxes: Outboxes::default(),
                hosted_scheduler: Mutex::new(hosted_scheduler),
            }),
        };
        po.spawn(po.clone().dispatch(inbox));
        let deadline = started + po.inner.config.bootstrap_timeout;
        let joined = tokio::time::timeout_at(deadline.into(), po.bootstrap()).await;
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                po.stop().await;
                return Err(e);
            }
            Err(_) => {
                let summary = po.bootstrap_summary();
                po.stop().await;
                return Err(NodeError::Bootstrap {
                    waited: po.inner.config.bootstrap_timeout,
                    summary,
                });
            }
        }
        if po.inner.config.eager_connect {
            po.connect_all().await?;
        }
        po.start_timers();
        info!(
            "{} joined as node {} ({} servers, {} workers)",
            role,
            po.my_id(),
            po.num_servers(),
            po.num_workers()
        );
        Ok(po)
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        let mut tasks = lock(&self.inner.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    /// Runs `send` beside the caller, tracked (aborted when the postoffice shuts down) and
    /// bounded by [`BEST_EFFORT_SEND`]: for sends nothing waits on. `what` names it in the
    /// log when it does not go out.
    fn send_best_effort(
        &self,
        what: String,
        send: impl std::future::Future<Output = Result<()>> + Send + 'static,
    ) {
        self.spawn(async move {
            if let Err(e) = bounded_send(BEST_EFFORT_SEND, send).await {
                debug!("{what}: {e}");
            }
        });
    }

    fn start_timers(&self) {
        if let Some(resend) = self.inner.router.resender() {
            if self.inner.config.heartbeat_timeout.is_none() {
                warn!(
                    "PS_RESEND is on without PS_HEARTBEAT_TIMEOUT: a broken connection is no \
                     failure, so a node that dies is never declared dead"
                );
            }
            let period = (resend.timeout() / 4).max(Duration::from_millis(10));
            let po = self.clone();
            self.spawn(async move {
                let mut ticker = tokio::time::interval(period);
                loop {
                    ticker.tick().await;
                    po.resend_overdue().await;
                }
            });
        }
        if self.inner.role != Role::Scheduler {
            if let Some(interval) = self.inner.config.heartbeat_interval {
                let po = self.clone();
                self.spawn(async move {
                    let mut ticker = tokio::time::interval(interval);
                    loop {
                        ticker.tick().await;
                        let msg = crate::member::control_request(Command::Heartbeat);
                        // Bounded by the interval: a dial to a scheduler this node is cut off
                        // from waits out the connect timeout, and the lease is looked at on
                        // time all the same (a heartbeat given up is no loss: the next goes).
                        let sent = tokio::time::timeout(interval, po.send_control(msg)).await;
                        if matches!(sent, Ok(Err(_))) && po.is_stopped() {
                            break;
                        }
                        // A scheduler silent for a whole heartbeat timeout is lost.
                        po.feed(Input::Tick).await;
                    }
                });
            }
        } else {
            // Heartbeat expiries, and (with or without heartbeats) the end of finalize's wait
            // for a replacement.
            let po = self.clone();
            let period = self
                .inner
                .config
                .heartbeat_timeout
                .map_or(Duration::from_secs(1), |t| {
                    (t / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
                });
            self.spawn(async move {
                loop {
                    // At the next expiry, so a silent node is declared dead at its timeout,
                    // not up to a period later; at least every period (a node that
                    // registers meanwhile brings its own deadline), at most every 50 ms (a
                    // deadline that passed without a change must not make this spin).
                    let now = Instant::now();
                    let due = po.with_scheduler(|s| s.next_deadline());
                    let soonest = now + Duration::from_millis(50).min(period);
                    let wake = due.map_or(now + period, |due| due.clamp(soonest, now + period));
                    tokio::time::sleep_until(wake.into()).await;
                    if lock(&po.inner.member).is_finishing() {
                        break;
                    }
                    let outputs = po.with_scheduler(|s| s.tick(Instant::now()));
                    po.execute(outputs).await;
                }
            });
        }
    }

    /// Receives everything the vans deliver and dispatches it. Control messages are handled
    /// as they arrive, even while a customer takes its time over a data message (see
    /// [`DataQueue`]): a barrier release or a failure notice never waits behind data.
    async fn dispatch(self, mut inbox: Inbox) {
        let mut events = Vec::new();
        let mut acks = Vec::new();
        let mut data = DataQueue::default();
        loop {
            let read = if data.is_idle() {
                inbox.recv_batch(&mut events).await
            } else {
                let room = data.has_room();
                tokio::select! {
                    biased;
                    () = data.finish_waiting() => {
                        self.deliver_backlog(&mut data).await;
                        continue;
                    }
                    read = inbox.recv_batch(&mut events), if room => read,
                }
            };
            if read == 0 {
                break;
            }
            for event in events.drain(..) {
                if let Event::Message(msg) = &event {
                    if self.inner.config.verbose >= 2 {
                        info!("recv {}", msg.summary());
                    }
                    if let Some(resend) = self.inner.router.resender() {
                        let sender = msg
                            .meta
                            .sender
                            .map_or(0, |s| self.inner.router.incarnation_of(s));
                        let received = resend.received(msg, self.inner.incarnation, sender);
                        acks.extend(received.ack);
                        if received.duplicate {
                            debug!("dropping a copy already received: {}", msg.summary());
                            continue;
                        }
                    }
                }
                match event {
                    Event::Message(msg) if msg.meta.control.is_some() => {
                        self.handle_control(msg).await
                    }
                    event => {
                        // The loss is the process the table names now: by the time it is
                        // handled (behind data), a new process may have taken the node over.
                        let read_as = match &event {
                            Event::PeerLost(lost) => lost
                                .peer
                                .map_or(0, |peer| lock(&self.inner.member).incarnation_of(peer)),
                            Event::Message(_) => 0,
                        };
                        if data.is_idle() {
                            self.deliver_event(event, read_as, &mut data).await;
                        } else {
                            data.push(event, read_as);
                        }
                    }
                }
            }
            if !acks.is_empty() {
                // Sent from a task of their own: a sender that cannot be reached (a new
                // connection to dial, a full queue) must not hold up this loop. A lost
                // acknowledgement costs a resend, which is acknowledged again.
                let (po, batch) = (self.clone(), std::mem::take(&mut acks));
                let send = async move { po.inner.router.send_batch(batch).await };
                self.send_best_effort("acknowledgements not sent".into(), send);
            }
        }
        // What was read before the inbox ended is still delivered, in order.
        while !data.is_idle() {
            data.finish_waiting().await;
            self.deliver_backlog(&mut data).await;
        }
        debug!("postoffice inbox ended");
    }

    /// Delivers the queued data events in order, until one has to wait.
    async fn deliver_backlog(&self, data: &mut DataQueue) {
        while let Some((event, read_as)) = data.pop() {
            self.deliver_event(event, read_as, data).await;
        }
    }

    /// Delivers a data message (or holds it until its application registers), or tells of a
    /// lost peer (read while it was process `read_as`: [`Input::Lost`]); a delivery that
    /// cannot finish at once is left waiting in `data`.
    async fn deliver_event(&self, event: Event, read_as: u64, data: &mut DataQueue) {
        match event {
            Event::Message(msg) => {
                let (routed, unserved) = {
                    let mut customers = lock(&self.inner.customers);
                    let routed = customers.route(msg);
                    (routed, customers.take_unserved())
                };
                if let Some((customer, msg)) = routed {
                    data.start(customer, msg).await;
                }
                for key in unserved {
                    self.refuse_later(key);
                }
            }
            Event::PeerLost(lost) => {
                if let Some(peer) = lost.peer {
                    let reason = &lost.reason;
                    self.feed(Input::Lost {
                        peer,
                        reason,
                        read_as,
                    })
                    .await;
                }
            }
        }
    }

    /// Refuses the requests held for the application `key`, [`UNSERVED_GRACE`] from now,
    /// if nobody registered it meanwhile ([`Customer::refusal`]).
    fn refuse_later(&self, key: (i32, i32)) {
        let po = self.clone();
        self.spawn(async move {
            tokio::time::sleep(UNSERVED_GRACE).await;
            let (answers, again) = {
                let mut customers = lock(&po.inner.customers);
                let answers = customers.refuse(key);
                (answers, customers.take_unserved())
            };
            for key in again {
                po.refuse_later(key);
            }
            if !answers.is_empty() {
                let sender = po.clone();
                let what = format!("refusals of requests for application {}", key.0);
                let send = async move { sender.inner.router.send_batch(answers).await };
                po.send_best_effort(what, send);
            }
        });
    }

    /// Registers an application; messages that arrived for it earlier are delivered first,
    /// in order, before any that arrive from now on. Fails with
    /// [`NodeError::InvalidArgument`] when another application holds these ids on this node.
    pub async fn register_customer(
        &self,
        app_id: i32,
        customer_id: i32,
        customer: Arc<dyn Customer>,
    ) -> Result<()> {
        let key = (app_id, customer_id);
        if !lock(&self.inner.customers).register(key, Arc::clone(&customer)) {
            return Err(NodeError::InvalidArgument(format!(
                "app {app_id} customer {customer_id} is already registered on this node"
            )));
        }
        loop {
            let backlog = lock(&self.inner.customers).take_backlog(key);
            let Some(backlog) = backlog else {
                break;
            };
            for msg in backlog {
                if let Some(msg) = customer.try_deliver(msg) {
                    customer.deliver(msg).await;
                }
            }
        }
        Ok(())
    }

    /// Removes the application registered under these ids (a communicator that is dropped,
    /// or failed to start), so the ids can be registered again. Returns whether one was.
    pub fn unregister_customer(&self, app_id: i32, customer_id: i32) -> bool {
        lock(&self.inner.customers).unregister((app_id, customer_id))
    }

    /// A control message arrived (or the scheduler sent one to itself).
    async fn handle_control(&self, msg: Message) {
        let Some(control) = msg.meta.control.as_ref() else {
            return;
        };
        if msg.meta.request {
            if self.inner.scheduler.is_none() {
                warn!(
                    "control request {:?} from {:?} reached a non-scheduler",
                    control.cmd, msg.meta.sender
                );
                return;
            }
            let outputs = self.with_scheduler(|s| s.handle(Instant::now(), &msg));
            self.execute(outputs).await;
            if self.inner.role == Role::Scheduler && !*self.inner.ready.borrow() {
                self.scheduler_check_ready().await;
            }
            return;
        }
        if control.cmd == Command::Ack {
            if let (Some(resend), Some(from)) = (self.inner.router.resender(), msg.meta.sender) {
                resend.acked(from, control.msg_sig);
            }
        }
        self.feed(Input::Control(&msg)).await;
    }

    fn with_scheduler<T: Default>(&self, f: impl FnOnce(&mut Scheduler) -> T) -> T {
        match &self.inner.scheduler {
            Some(s) => f(&mut lock(s)),
            None => T::default(),
        }
    }

    /// Carries out what the scheduler state machine asked for.
    async fn execute(&self, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Connect(node) => match node.id {
                    Some(id) => self.post(id, Post::Connect(node)),
                    None => warn!("scheduler cannot connect to {node}: it has no id"),
                },
                Output::Send(msg) if msg.meta.recipient == Some(node_ids::SCHEDULER) => {
                    // Replies to the scheduler's own requests: handled here, not sent.
                    Box::pin(self.handle_control(msg)).await
                }
                Output::Send(msg)
                    if msg
                        .meta
                        .recipient
                        .is_some_and(|to| self.inner.router.is_failed(to)) =>
                {
                    // A notice to a node declared dead is best effort (one declared wrongly
                    // learns it): its route is gone with the verdict, and dialing a hung
                    // process again must not hold up what live nodes are told next.
                    let what = format!("scheduler cannot tell dead node {:?}", msg.meta.recipient);
                    let po = self.clone();
                    let send = async move { po.inner.router.send(msg).await };
                    self.send_best_effort(what, send);
                }
                Output::Send(msg) => match msg.meta.recipient {
                    Some(to) => self.post(to, Post::Send(msg)),
                    None => warn!("scheduler cannot send {}: no recipient", msg.summary()),
                },
            }
        }
    }

    /// Queues `post` in node `to`'s outbox ([`outbox`]), starting the task that carries out
    /// a new queue.
    fn post(&self, to: NodeId, post: Post) {
        let Some(queue) = self.inner.outboxes.post(to, post) else {
            return;
        };
        let po = self.clone();
        self.spawn(async move {
            let mut rx = queue.rx;
            while let Some(post) = rx.recv().await {
                if !po.inner.outboxes.is_current(to, queue.generation) {
                    debug!(
                        peer = to,
                        "{post:?} dropped: meant for a process replaced since"
                    );
                } else {
                    match post {
                        Post::Connect(node) => {
                            if let Err(e) = po.inner.router.connect(&node).await {
                                warn!("scheduler cannot connect to {node}: {e}");
                            }
                        }
                        Post::Send(msg) => {
                            if let Err(e) = po.inner.router.send(msg).await {
                                warn!("scheduler cannot send to {to}: {e}");
                            }
                        }
                    }
                }
                po.inner.outboxes.done();
            }
        });
    }

    /// Sends a control request to the scheduler (or handles it here, on the scheduler).
    async fn send_control(&self, mut msg: Message) -> Result<()> {
        msg.meta.sender = self.inner.my_id.get().copied();
        // Requests name the process that sends them (a registration names itself already):
        // the scheduler ignores one from a process that a new one replaced (a zombie's
        // heartbeat or barrier arrival, flushed late) instead of taking it for the new one's.
        if let Some(control) = msg.meta.control.as_mut() {
            if control.cmd != Command::AddNode && control.nodes.is_empty() {
                let mut me = Node::new(self.inner.role, "", 0);
                me.id = msg.meta.sender;
                me.incarnation = self.inner.incarnation;
                control.nodes = Arc::from([me]);
            }
        }
        if self.inner.role == Role::Scheduler {
            Box::pin(self.handle_control(msg)).await;
            Ok(())
        } else {
            self.inner.router.send(msg).await
        }
    }

    /// Waits until every node of `group` (a bitmask of [`node_ids`] groups; [`ALL_GROUPS`]
    /// for everyone) has called `barrier` with the same group. Fails if a member dies.
    pub async fn barrier(&self, group: i32) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        {
            // The waiter first: a release or a failure can come as soon as the request goes.
            let mut barriers = lock(&self.inner.barriers);
            if barriers.contains_key(&group) {
                return Err(NodeError::InvalidArgument(format!(
                    "a barrier on group {group} is already pending on this node"
                )));
            }
            barriers.insert(group, tx);
        }
        for action in self.decide(Input::Barrier(group)) {
            let sent = match action {
                Action::Send(msg) => self.send_control(msg).await,
                Action::RefuseBarrier(e) => Err(e),
                other => {
                    self.carry_out(vec![other]).await;
                    Ok(())
                }
            };
            if let Err(e) = sent {
                lock(&self.inner.barriers).remove(&group);
                return Err(e);
            }
        }
        rx.await.map_err(|_| NodeError::Stopped)?
    }

    /// Leaves the cluster in order: a barrier of every node, a goodbye to the scheduler, then
    /// stop. The scheduler waits (bounded) for everyone's goodbye before it stops.
    ///
    /// Idempotent: after a finalize that left in order, another returns `Ok` at once (ps-lite
    /// programs call `Finalize` by habit, under a runner that finalizes too). On a node
    /// stopped otherwise ([`stop`](Self::stop), a failure) it is [`NodeError::Stopped`], or
    /// the error of its eviction ([`stopped_error`](Self::stopped_error)).
    pub async fn finalize(&self) -> Result<()> {
        if self.is_stopped() {
            return match self.inner.finalized.load(Ordering::Acquire) {
                true => Ok(()),
                false => Err(self.stopped_error()),
            };
        }
        self.feed(Input::Finalize).await;
        let barrier = self.barrier(ALL_GROUPS).await;
        // The goodbye to the scheduler.
        self.feed(Input::Leave).await;
        // Also when the barrier failed (a node died): the survivors learn who died from the
        // scheduler, and would blame the scheduler instead if it left first (their lease on
        // it ends: a process hosting the scheduler beside a TensorFlow task is such a case,
        // where the others serve on).
        if self.inner.role == Role::Scheduler {
            let deadline = Instant::now() + FINISH_GRACE;
            while !self.with_scheduler(|s| s.is_finished()) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if barrier.is_ok() {
            self.inner.finalized.store(true, Ordering::Release);
        }
        self.stop().await;
        let hosted = lock(&self.inner.hosted_scheduler).take();
        if let Some(scheduler) = hosted {
            match tokio::time::timeout(FINISH_GRACE * 2, scheduler).await {
                Ok(Ok(Err(e))) => warn!("the scheduler hosted by this node failed: {e}"),
                Ok(Err(e)) => warn!("the scheduler hosted by this node panicked: {e}"),
                Ok(Ok(Ok(()))) => {}
                Err(_) => warn!("the scheduler hosted by this node did not finish in time"),
            }
        }
        barrier
    }

    /// Stops the vans and background tasks without a barrier (after a failure).
    pub async fn stop(&self) {
        if !self.decide(Input::Stop).is_empty() {
            self.shut_down("the local postoffice stopped").await;
        }
    }

    /// What stopping does, once.
    /// Stops the vans and the tasks; what still waits fails naming this node and `reason`.
    async fn shut_down(&self, reason: &str) {
        // Whoever waits for a change of membership (`stopped`, `wait_alive`) looks again.
        self.inner.membership.send_modify(|n| *n += 1);
        // What the scheduler queued goes to the vans first, which flush it as they stop.
        if !self.inner.outboxes.flushed(OUTBOX_FLUSH).await {
            warn!("the scheduler's messages to unreachable nodes not sent within {OUTBOX_FLUSH:?}; dropping them");
        }
        if let Err(e) = self.inner.router.stop().await {
            warn!("stopping the vans: {e}");
        }
        if !lock(&self.inner.member).is_finishing() {
            if let Some(scheduler) = lock(&self.inner.hosted_scheduler).take() {
                scheduler.abort();
            }
        }
        let tasks: Vec<_> = lock(&self.inner.tasks).drain(..).collect();
        for task in tasks {
            task.abort();
        }
        let waiters: Vec<_> = lock(&self.inner.barriers).drain().collect();
        for (_, waiter) in waiters {
            let _ = waiter.send(Err(self.stopped_error()));
        }
        self.tell_customers(self.my_id(), reason);
        // Applications hold the postoffice; dropping them here breaks that cycle, and their
        // shard tasks end when their queues close.
        lock(&self.inner.customers).clear();
    }

    /// Whether [`stop`](Self::stop) or [`finalize`](Self::finalize) ran.
    pub fn is_stopped(&self) -> bool {
        lock(&self.inner.member).is_stopped()
    }

    /// This node's id.
    pub fn my_id(&self) -> NodeId {
        self.inner.my_id.get().copied().unwrap_or_default()
    }

    /// This node's rank within its role.
    pub fn my_rank(&self) -> u32 {
        node_ids::id_to_rank(self.my_id())
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        self.inner.role
    }

    /// The configuration the node started with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Number of workers in the cluster.
    pub fn num_workers(&self) -> u32 {
        self.inner.config.num_workers
    }

    /// Number of servers in the cluster.
    pub fn num_servers(&self) -> u32 {
        self.inner.config.num_servers
    }

    /// The node table: scheduler, then servers and workers by id.
    pub fn nodes(&self) -> &[Node] {
        self.inner.table.get().map_or(&[], NodeTable::nodes)
    }

    /// The peers this node has a connection to, with the van of each.
    pub fn connected_peers(&self) -> Vec<(NodeId, VanKind)> {
        self.inner.router.connected()
    }

    /// The van carrying traffic to `peer` (for "what am I using?").
    pub fn van_for(&self, peer: NodeId) -> Option<VanKind> {
        self.inner.router.van_for(peer)
    }

    /// A buffer for values to push: in the IPC van's shared arena when that van is
    /// compiled in and has room (then a push to a co-located server moves no payload bytes:
    /// the server reads them where the worker wrote them), otherwise ordinary memory. Fill
    /// it, [`freeze`](SharedBuf::freeze) it and pass the `Bytes` as the values of
    /// `ps::KvWorker::zpush`. [`SharedBuf::van`] tells which memory
    /// it got; an arena that is full (peers still hold earlier buffers) is logged once and
    /// falls back to ordinary memory.
    pub fn alloc(&self, len: usize) -> SharedBuf {
        match self.inner.router.alloc(len) {
            Ok(Some(buf)) => return buf,
            Ok(None) => {}
            Err(e) => {
                if !self.inner.alloc_warned.swap(true, Ordering::Relaxed) {
                    warn!("zero-copy buffer unavailable, using ordinary memory: {e}");
                }
            }
        }
        SharedBuf::heap(len)
    }

    /// The memory [`alloc`](Self::alloc) takes its buffers from when they are in a van's
    /// shared memory (the IPC van's arena), as a co-located process can map it: the
    /// collective crate's shared-memory all-reduce reads such buffers where they lie, so a
    /// buffer from `alloc` is not copied in. `None` without such a van.
    pub fn shared_region(&self) -> Option<van_core::buf::SharedRegion> {
        self.inner.router.shared_region()
    }

    /// Sends a data message to its recipient (`msg.meta.recipient`) over the van the router
    /// picks for that peer, connecting first if needed, for applications registered with
    /// [`register_customer`](Self::register_customer). A broken connection is
    /// [`NodeError::NodeFailed`] naming the peer.
    pub async fn send(&self, msg: Message) -> Result<()> {
        let sent = self.inner.router.send(msg).await;
        sent.map_err(|e| self.or_evicted(e))
    }

    /// Sends many data messages (to any recipients) as [`send`](Self::send) does, one batch
    /// per van. Stops at the first error; earlier messages stay queued.
    pub async fn send_batch(&self, msgs: Vec<Message>) -> Result<()> {
        let sent = self.inner.router.send_batch(msgs).await;
        sent.map_err(|e| self.or_evicted(e))
    }

    /// The error for a call on this stopped node: [`NodeError::Stopped`], or, when the cluster
    /// went on without it (declared dead, or cut off from the scheduler), a
    /// [`NodeError::NodeFailed`] saying so, which names the scheduler when it went silent and
    /// this node when the scheduler declared it dead.
    pub fn stopped_error(&self) -> NodeError {
        match lock(&self.inner.member).eviction() {
            Some((node, reason)) => NodeError::node_failed(node, reason),
            None => NodeError::Stopped,
        }
    }

    /// Waits until this node stops, for whatever reason ([`stop`](Self::stop),
    /// [`finalize`](Self::finalize), or the cluster going on without it), and gives
    /// [`stopped_error`](Self::stopped_error). A server that only serves awaits this beside
    /// its own work, so that a node cut off and replaced (a zombie) ends instead of serving
    /// on.
    pub async fn stopped(&self) -> NodeError {
        let mut changes = self.inner.membership.subscribe();
        while !self.is_stopped() {
            if changes.changed().await.is_err() {
                break;
            }
        }
        self.stopped_error()
    }

    /// `e`, or the eviction's error if `e` only says the node stopped.
    fn or_evicted(&self, e: NodeError) -> NodeError {
        match e {
            NodeError::Stopped => self.stopped_error(),
            e => e,
        }
    }

    /// What this node resent, dropped as duplicates and still waits to have acknowledged;
    /// `None` unless `PS_RESEND` is on.
    pub fn resend_stats(&self) -> Option<crate::ResendStats> {
        self.inner.router.resender().map(|r| r.stats())
    }
}

/// Runs the cluster's scheduler inside this process (TF_CONFIG's chief, or worker 0 when
/// there is no chief): it joins like any scheduler and leaves after the final barrier.
fn host_scheduler(config: &Config) -> JoinHandle<Result<()>> {
    let config = Config {
        role: Some(Role::Scheduler),
        hosts_scheduler: false,
        ..config.clone()
    };
    info!(
        "this node also hosts the scheduler at {}:{}",
        config.root_uri, config.root_port
    );
    tokio::spawn(async move { Box::pin(Postoffice::start(config)).await?.finalize().await })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_best_effort_send_that_never_progresses_is_given_up_at_its_limit() {
        let started = tokio::time::Instant::now();
        let never = std::future::pending::<Result<()>>();
        let outcome = bounded_send(BEST_EFFORT_SEND, never).await;
        assert_eq!(started.elapsed(), BEST_EFFORT_SEND);
        assert!(
            outcome.as_ref().is_err_and(|e| e.contains("given up")),
            "{outcome:?}"
        );
        let failed = bounded_send(BEST_EFFORT_SEND, async { Err(NodeError::Stopped) }).await;
        assert!(failed.is_err());
        assert_eq!(
            bounded_send(BEST_EFFORT_SEND, async { Ok(()) }).await,
            Ok(())
        );
    }
}
