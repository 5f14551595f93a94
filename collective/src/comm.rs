//! The communicator's shared state, what its handle, its background task and the postoffice
//! (as a [`Customer`]) hold in common: it joins the generation protocol (`generation`: who
//! the ranks are, and how the next generation forms when one fails) to point-to-point
//! messaging (`p2p`: the data messages between ranks, and the mailbox they wait in), under one
//! lock, so that a collective's wait for a message also ends when its generation does.
//!
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use node::postoffice::Customer;
use node::Postoffice;
use tokio::sync::{mpsc, Notify};
use tracing::debug;
use van_core::{Message, NodeId, VanKind};

use crate::element::Element;
use crate::error::{CollectiveError, Result};
pub use crate::options::CommOptions;
use generation::{Membership, Protocol, TICK};
use p2p::Mailbox;

mod generation;
pub(crate) mod p2p;

pub use generation::{Generation, APP_ID};
pub(crate) use p2p::{Op, OpKind};

/// What the lock guards: the membership and the messages of its current generation.
struct State {
    membership: Membership,
    mailbox: Mailbox,
    /// The shared-memory all-reduces of the current generation.
    #[cfg(all(feature = "ipc", target_os = "linux"))]
    shm: crate::shm::turns::Turns,
    /// The TCP mesh of a generation: its number and how far its forming got.
    mesh: (u64, MeshState),
}

/// What [`Shared::claim_mesh`] answers.
pub(crate) enum MeshClaim {
    /// The mesh is formed, or known not to be.
    Settled,
    /// This task forms it, with this op.
    Form(Op),
    /// Another task forms it (or the generation is over): wait for the outcome.
    Forming,
}

/// How far a generation's mesh got (see [`crate::mesh::form`]).
enum MeshState {
    /// A task of this rank is forming it.
    Forming,
    /// Formed, or not (the generation keeps the vans).
    Formed(Option<Arc<crate::mesh::Mesh>>),
}

impl State {
    /// The mailbox of the current generation.
    fn mailbox(&mut self) -> &mut Mailbox {
        self.mailbox.of(self.membership.generation().number)
    }
}

/// What a communicator's handle, its background task and the postoffice (as a
/// [`Customer`]) share.
pub(crate) struct Shared {
    pub(crate) po: Postoffice,
    pub(crate) me: NodeId,
    pub(crate) options: CommOptions,
    /// Send buffers for slices to peers over a stream van.
    pub(crate) pool: Arc<crate::pool::SendPool>,
    protocol: Protocol,
    state: Mutex<State>,
    /// Woken whenever a message arrives or the status changes.
    notify: Notify,
    /// One more than the last generation whose mesh settled as none (all ranks on one host,
    /// or none wanted): its collectives find that without the lock.
    no_mesh: std::sync::atomic::AtomicU64,
    /// The algorithm the last collective took ([`crate::Communicator::last_algorithm`]).
    /// One more than its position in `CollectiveAlgorithm::ALL`; 0 before the first.
    pub(crate) took: std::sync::atomic::AtomicU8,
}

impl Shared {
    /// The shared state and the receiver of its control queue (for the background task).
    pub(crate) fn new(
        po: Postoffice,
        options: CommOptions,
    ) -> (Arc<Shared>, mpsc::Receiver<Message>) {
        let (protocol, queue) =
            Protocol::new(po.clone(), options.customer_id, options.settle_window);
        let shared = Arc::new(Shared {
            me: po.my_id(),
            po,
            options,
            pool: Arc::default(),
            protocol,
            state: Mutex::new(State {
                membership: Membership::new(),
                mailbox: Mailbox::default(),
                #[cfg(all(feature = "ipc", target_os = "linux"))]
                shm: Default::default(),
                mesh: (0, MeshState::Formed(None)),
            }),
            notify: Notify::new(),
            no_mesh: Default::default(),
            took: Default::default(),
        });
        (shared, queue)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few map operations with no await and no call out, so
        // a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `change` on the membership under the lock, then wakes every waiter.
    fn update<T>(&self, change: impl FnOnce(&Protocol, &mut Membership) -> T) -> T {
        let mut st = self.lock();
        let answer = change(&self.protocol, &mut st.membership);
        Self::changed(&mut st);
        drop(st);
        self.notify.notify_waiters();
        answer
    }

    /// After the membership changed: a shared-memory group of a generation that ended stops
    /// its waiters (on every rank of the host: the abort word is shared).
    fn changed(st: &mut State) {
        // A mesh whose generation ended shuts its connections: the peers stop at once.
        if let (generation, MeshState::Formed(Some(mesh))) = &st.mesh {
            if st.membership.still(*generation).is_err() {
                mesh.shut();
                st.mesh.1 = MeshState::Formed(None);
            }
        }
        #[cfg(all(feature = "ipc", target_os = "linux"))]
        {
            let State {
                membership, shm, ..
            } = st;
            let generation = membership.generation().number;
            if let Some(group) = shm.of(generation).group(generation) {
                match membership.still(generation) {
                    Err(CollectiveError::RankFailed { rank, .. }) => group.abort(Some(rank)),
                    Err(_) => group.abort(None),
                    Ok(()) => {}
                }
            }
        }
        let _ = st;
    }

    /// Fails unless `generation` is still going on.
    pub(crate) fn still(&self, generation: u64) -> Result<()> {
        self.lock().membership.still(generation)
    }

    /// Waits until `ready` has an answer (asked under the lock, at once and whenever a
    /// message arrives or the status changes), or `timeout` passes (`None`).
    async fn wait_until<T>(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&mut State) -> Option<T>,
    ) -> Option<T> {
        // Most waits are over at once (a collective's turn through shared memory, its
        // mesh): no waiter is registered for those, and the clock is not read.
        if let Some(answer) = ready(&mut self.lock()) {
            return Some(answer);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let answer = ready(&mut self.lock());
            if answer.is_some() {
                return answer;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// The current generation.
    pub(crate) fn generation(&self) -> Generation {
        self.lock().membership.generation().clone()
    }

    /// One turn of the background task: re-send a stale `JOIN`, close a settle window.
    pub(crate) fn tick(&self) {
        self.update(|protocol, m| protocol.tick(m, Instant::now()));
    }

    /// Starts a collective of `kind`: fails unless the generation is active and `valid`
    /// accepts its size and this node's rank (a refused call takes no collective number, so
    /// the ranks stay in step).
    pub(crate) fn begin(
        &self,
        kind: OpKind,
        valid: impl FnOnce(usize, usize) -> Result<()>,
    ) -> Result<Op> {
        Self::begin_in(&mut self.lock(), self.me, kind, valid)
    }

    /// [`begin`](Self::begin) under the lock held as `st`.
    fn begin_in(
        st: &mut State,
        me: NodeId,
        kind: OpKind,
        valid: impl FnOnce(usize, usize) -> Result<()>,
    ) -> Result<Op> {
        let rank = st.membership.active_rank(me)?;
        valid(st.membership.generation().size(), rank)?;
        let number = st.mailbox().begin_collective();
        Ok(Op::new(kind, st.membership.generation(), rank, number))
    }

    /// Starts a collective of `kind` on `len` elements of `T` (as [`begin`](Self::begin));
    /// when it goes through shared memory (`Turns::ticket` says which do), it gets its
    /// shared-memory ticket in the same critical section, so tickets follow the
    /// collectives' numbering.
    pub(crate) fn begin_carrying<T: crate::Element>(
        &self,
        kind: OpKind,
        len: usize,
        valid: impl FnOnce(usize, usize) -> Result<()>,
    ) -> Result<Op> {
        let mut st = self.lock();
        #[allow(unused_mut)]
        let mut op = Self::begin_in(&mut st, self.me, kind, valid)?.carrying::<T>(len);
        #[cfg(all(feature = "ipc", target_os = "linux"))]
        if len > 0 {
            let turns = st.shm.of(op.generation);
            let bytes = len.saturating_mul(std::mem::size_of::<T>());
            if let Some((ticket, hosts)) =
                turns.ticket(&self.po, &op.members, kind, &self.options, bytes)
            {
                op.shm_ticket = Some(ticket);
                op.hosts = hosts;
            }
        }
        Ok(op)
    }

    /// Starts a point-to-point message with the rank `peer` under `tag` (sending or
    /// receiving): numbered by the pair's own count, not the collectives', since the other
    /// ranks take no part.
    pub(crate) fn begin_p2p(&self, peer: usize, tag: i32, sending: bool) -> Result<Op> {
        let mut st = self.lock();
        let me = st.membership.active_rank(self.me)?;
        let generation = st.membership.generation();
        let size = generation.size();
        let Some(&node) = generation.members.get(peer) else {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {peer} is not in a generation of {size} ranks"
            )));
        };
        if peer == me {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {me} cannot send to or receive from itself"
            )));
        }
        let number = st.mailbox().begin_p2p(node, tag, sending);
        let op = Op::new(OpKind::PointToPoint, st.membership.generation(), me, number);
        Ok(op)
    }

    /// Waits for the next generation this node is a member of (or returns the current one
    /// when it is active).
    pub(crate) async fn settle(&self, timeout: Duration) -> Result<Generation> {
        self.protocol
            .rejoin(&mut self.lock().membership, Instant::now());
        let settled = self.wait_until(timeout, |st| st.membership.settled()).await;
        let generation = settled.unwrap_or_else(|| {
            Err(CollectiveError::SettleTimeout {
                waited: timeout,
                detail: self.protocol.describe(&self.lock().membership),
            })
        })?;
        Ok(generation)
    }

    /// Where the mesh of `generation` stands for a collective about to run: settled (the
    /// common case, answered under one lock), to be formed by the caller (the first task
    /// of this rank to ask, given the op to form it with), or being formed by another task.
    pub(crate) fn claim_mesh(&self, generation: u64) -> MeshClaim {
        if self.no_mesh.load(std::sync::atomic::Ordering::Relaxed) == generation + 1 {
            return MeshClaim::Settled;
        }
        let mut st = self.lock();
        match st.mesh {
            (g, MeshState::Formed(_)) if g >= generation => return MeshClaim::Settled,
            (g, MeshState::Forming) if g >= generation => return MeshClaim::Forming,
            _ => {}
        }
        let current = st.membership.generation();
        let Ok(rank) = st.membership.active_rank(self.me) else {
            return MeshClaim::Forming;
        };
        if current.number != generation {
            return MeshClaim::Forming;
        }
        let op = Op::new(OpKind::AllReduce, current, rank, 0);
        st.mesh = (generation, MeshState::Forming);
        MeshClaim::Form(op)
    }

    /// Records how forming the mesh of `generation` ended (a generation that ended
    /// meanwhile keeps none), and wakes the collectives waiting for it.
    pub(crate) fn set_mesh(&self, generation: u64, mesh: Option<Arc<crate::mesh::Mesh>>) {
        let mut st = self.lock();
        if st.mesh.0 == generation {
            let mesh = mesh.filter(|_| st.membership.still(generation).is_ok());
            if mesh.is_none() {
                // A generation's mesh, once settled, is never formed again.
                self.no_mesh
                    .store(generation + 1, std::sync::atomic::Ordering::Relaxed);
            }
            st.mesh.1 = MeshState::Formed(mesh);
        }
        drop(st);
        self.notify.notify_waiters();
    }

    /// Waits until the mesh of `generation` is formed (or not) by another task of this
    /// rank, or the generation ends.
    pub(crate) async fn mesh_settled(&self, generation: u64) -> Result<()> {
        let settled = self.wait_until(self.options.timeout, |st| {
            if let Err(e) = st.membership.still(generation) {
                return Some(Err(e));
            }
            match st.mesh {
                (g, MeshState::Formed(_)) if g >= generation => Some(Ok(())),
                _ => None,
            }
        });
        settled.await.unwrap_or_else(|| {
            Err(CollectiveError::MembershipChanged {
                generation,
                reason: "the ranks' connections did not form within the timeout".into(),
            })
        })
    }

    /// Ends a collective of `generation` that went over its mesh: writes what is still
    /// queued (see [`Mesh::flush`](crate::mesh::Mesh::flush)).
    pub(crate) fn flush_mesh(&self, generation: u64) -> Result<()> {
        let Some(mesh) = self.mesh(generation) else {
            return Ok(());
        };
        let deadline = Instant::now() + self.options.timeout;
        let alive = || self.still(generation);
        crate::spin::blocking(|| mesh.flush(deadline, &alive))
    }

    /// The mesh `op` goes over: its generation's, for a collective (point-to-point messages
    /// stay on the vans, so a send never waits for its receiver).
    fn mesh_for(&self, op: &Op) -> Option<Arc<crate::mesh::Mesh>> {
        (op.kind != OpKind::PointToPoint)
            .then(|| self.mesh(op.generation))
            .flatten()
    }

    /// How the waits of `op` go, when it goes over its generation's mesh (`None`: over the
    /// vans): spinning, when every rank of the machine has a core, or yielding.
    pub(crate) fn mesh_waits(&self, op: &Op) -> Option<crate::spin::Spin> {
        self.mesh_for(op).map(|mesh| mesh.spin())
    }

    /// A send's error over the mesh (a broken connection), unless the generation names a
    /// failure first: the peer may have left because another rank died
    /// ([`crate::mesh::unless_told`]).
    fn unless_told(&self, op: &Op, error: CollectiveError) -> CollectiveError {
        let alive = || self.still(op.generation);
        crate::spin::blocking(|| crate::mesh::unless_told(error, &alive))
    }

    /// The mesh of `generation`, if it has one.
    fn mesh(&self, generation: u64) -> Option<Arc<crate::mesh::Mesh>> {
        if self.no_mesh.load(std::sync::atomic::Ordering::Relaxed) == generation + 1 {
            return None;
        }
        match &self.lock().mesh {
            (g, MeshState::Formed(Some(mesh))) if *g == generation => Some(Arc::clone(mesh)),
            _ => None,
        }
    }

    /// Sends one slice of collective `op` to the member of rank `to`: bytes already in a
    /// message (a slice received, forwarded as it came).
    pub(crate) async fn send(
        &self,
        op: &Op,
        to: usize,
        hop: usize,
        slice: usize,
        data: Bytes,
    ) -> Result<()> {
        if let Some(mesh) = self.mesh_for(op) {
            let sent = mesh.send(op, to, hop, slice, crate::mesh::Data::Owned(data));
            return sent.map_err(|e| self.unless_told(op, e));
        }
        let msg = op.message(self.me, self.options.customer_id, to, hop, slice, data);
        self.po.send(msg).await.map_err(|e| op.send_failed(to, e))
    }

    /// Sends one slice of collective `op`, `values`, to the member of rank `to`. Over the
    /// mesh the socket takes them from the caller's memory (copied only if it cannot take
    /// them all at once); to a van, a copy (see [`to_bytes`]).
    pub(crate) async fn send_values<T: Element>(
        &self,
        op: &Op,
        to: usize,
        hop: usize,
        slice: usize,
        values: &[T],
    ) -> Result<()> {
        if let Some(mesh) = self.mesh_for(op) {
            let data = crate::mesh::Data::Borrowed(bytemuck::cast_slice(values));
            let sent = mesh.send(op, to, hop, slice, data);
            return sent.map_err(|e| self.unless_told(op, e));
        }
        let data = to_bytes(self, op, to, values);
        self.send(op, to, hop, slice, data).await
    }

    /// Receives one slice of collective `op` from the member of rank `from` into `out` (as
    /// [`recv`](Self::recv) checks it). Over the mesh a slice that has not come yet is read
    /// straight into `out`; one that came as a message (over a van, or before it was asked
    /// for) is copied, and its bytes returned, for a caller that forwards them as they are.
    pub(crate) async fn recv_into<T: Element>(
        &self,
        op: &Op,
        from: usize,
        hop: usize,
        slice: usize,
        out: &mut [T],
    ) -> Result<Option<Bytes>> {
        let len = std::mem::size_of_val(out);
        let data = match self.mesh_for(op) {
            Some(mesh) => {
                let deadline = Instant::now() + self.options.timeout;
                let alive = || self.still(op.generation);
                let into = bytemuck::cast_slice_mut::<T, u8>(out);
                crate::spin::blocking(|| {
                    mesh.recv(op, from, (hop, slice, len), Some(into), deadline, &alive)
                })?
            }
            None => Some(self.recv(op, from, hop, slice, len).await?),
        };
        if let Some(data) = &data {
            crate::element::copy_into(out, data);
        }
        Ok(data)
    }

    /// Receives one slice of collective `op` from the member of rank `from`: its bytes,
    /// checked to be `len` bytes of the collective's element type and total. Fails when the
    /// generation ends first, or after the timeout.
    pub(crate) async fn recv(
        &self,
        op: &Op,
        from: usize,
        hop: usize,
        slice: usize,
        len: usize,
    ) -> Result<Bytes> {
        if let Some(mesh) = self.mesh_for(op) {
            let deadline = Instant::now() + self.options.timeout;
            let alive = || self.still(op.generation);
            // Without memory to land in, every frame comes back in a buffer.
            return crate::spin::blocking(|| {
                mesh.recv(op, from, (hop, slice, len), None, deadline, &alive)
            })
            .map(Option::unwrap_or_default);
        }
        let key = op.key(from, hop, slice);
        let arrived = self.wait_until(self.options.timeout, |st| match st.mailbox().take(&key) {
            Some(msg) => Some(Ok(msg)),
            None => st.membership.still(op.generation).err().map(Err),
        });
        match arrived.await {
            Some(Ok(msg)) => op.check(from, len, msg),
            Some(Err(e)) => Err(e),
            None => Err(op.timed_out(from, self.options.timeout)),
        }
    }

    /// Takes a message from the postoffice: a control message moves the protocol on, a data
    /// message waits in the mailbox.
    fn accept(&self, msg: Message) {
        let Some(from) = msg.meta.sender else {
            debug!("collective message without a sender; dropped");
            return;
        };
        let mut st = self.lock();
        if generation::is_control(msg.meta.head) {
            self.protocol.handle_control(&mut st.membership, msg);
            Self::changed(&mut st);
        } else {
            st.mailbox().put(from, msg);
        }
        drop(st);
        self.notify.notify_waiters();
    }

    /// This rank's part in a collective of `generation` ended with `error` (or the call was
    /// dropped): the generation is over for it, and it asks for the next at once, so the
    /// coordinator stops the others instead of their waiting out their timeout.
    pub(crate) fn abandon(&self, generation: u64, error: &CollectiveError) {
        self.update(|protocol, m| protocol.abandon(m, generation, error));
    }

    /// Waits until it is `ticket`'s turn among the generation's shared-memory all-reduces
    /// (or the generation ends); the turn passes on when the returned guard drops.
    #[cfg(all(feature = "ipc", target_os = "linux"))]
    pub(crate) async fn shm_turn(&self, op: &Op, ticket: u64) -> Result<ShmTurn<'_>> {
        let turn = self.wait_until(self.options.timeout, |st| {
            if let Err(e) = st.membership.still(op.generation) {
                return Some(Err(e));
            }
            st.shm.of(op.generation).is_turn(ticket).then_some(Ok(()))
        });
        match turn.await {
            Some(Ok(())) => Ok(ShmTurn {
                shared: self,
                generation: op.generation,
                ticket,
            }),
            Some(Err(e)) => Err(e),
            None => Err(CollectiveError::MembershipChanged {
                generation: op.generation,
                reason: format!(
                    "all-reduce #{} waited {:?} for the one before it on this rank",
                    op.number, self.options.timeout
                ),
            }),
        }
    }

    /// The shared-memory group of `generation`, as far as it is formed.
    #[cfg(all(feature = "ipc", target_os = "linux"))]
    pub(crate) fn shm_group(&self, generation: u64) -> crate::shm::turns::Formed {
        match self.lock().shm.exactly(generation) {
            Some(turns) => turns.group.clone(),
            None => {
                crate::shm::turns::Formed::Unavailable(format!("generation {generation} is over"))
            }
        }
    }

    /// Records how forming `generation`'s group ended.
    #[cfg(all(feature = "ipc", target_os = "linux"))]
    pub(crate) fn set_shm_group(
        &self,
        generation: u64,
        formed: &std::result::Result<Arc<crate::shm::group::Group>, String>,
    ) {
        let mut st = self.lock();
        let Some(turns) = st.shm.exactly(generation) else {
            // A later generation replaced it: its group is not this one's to set.
            if let Ok(group) = formed {
                group.abort(None);
            }
            return;
        };
        turns.group = match formed {
            Ok(group) => crate::shm::turns::Formed::Ready(Arc::clone(group)),
            Err(why) => crate::shm::turns::Formed::Unavailable(why.clone()),
        };
        // A generation that ended while the group formed stops it at once.
        Self::changed(&mut st);
    }

    fn failed(&self, node: NodeId, error: &str) {
        self.update(|protocol, m| protocol.failed(m, node, error));
    }
}

/// The turn of a shared-memory all-reduce: the next ticket's begins when this drops.
#[cfg(all(feature = "ipc", target_os = "linux"))]
pub(crate) struct ShmTurn<'a> {
    shared: &'a Shared,
    generation: u64,
    ticket: u64,
}

#[cfg(all(feature = "ipc", target_os = "linux"))]
impl Drop for ShmTurn<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.shm
            .of(self.generation)
            .done(self.generation, self.ticket);
        drop(st);
        self.shared.notify.notify_waiters();
    }
}

/// The postoffice delivers the communicator's messages here.
pub(crate) struct CommCustomer(pub(crate) Arc<Shared>);

#[async_trait::async_trait]
impl Customer for CommCustomer {
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        self.0.accept(msg);
        None
    }

    async fn deliver(&self, msg: Message) {
        self.0.accept(msg);
    }

    fn node_failed(&self, node: NodeId, error: &str) {
        self.0.failed(node, error);
    }

    fn node_recovered(&self, node: NodeId) {
        // A new process in a member's place holds nothing of the collective in progress.
        self.0
            .failed(node, "replaced by a new process (its old one is gone)");
    }
}

/// The background task: sends control messages in order and ticks.
pub(crate) async fn run(shared: Arc<Shared>, mut queue: mpsc::Receiver<Message>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = queue.recv() => {
                let Some(msg) = msg else { return };
                shared.protocol.send_control(msg).await;
            }
            _ = tick.tick() => {
                shared.tick();
                if shared.po.is_stopped() {
                    return;
                }
            }
        }
    }
}

/// A copy of `values` as message bytes for the member of rank `to`: in memory its van sends
/// without another copy when it has some (the shared-memory arena, registered RDMA memory),
/// else in a reused buffer.
fn to_bytes<T: Element>(shared: &Shared, op: &Op, to: usize, values: &[T]) -> Bytes {
    let bytes: &[u8] = bytemuck::cast_slice(values);
    let zero_copy = matches!(
        shared.po.van_for(op.members[to]),
        Some(VanKind::Ipc | VanKind::Rdma)
    );
    if !zero_copy {
        return shared.pool.copy(bytes);
    }
    let mut buf = shared.po.alloc(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    buf.freeze()
}
