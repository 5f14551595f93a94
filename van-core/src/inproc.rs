//! An in-process van: nodes in one process exchange messages through channels, no sockets.
//!
//! Used for tests, for simulations of many nodes, and for running a whole cluster inside one
//! process. Vans that should see each other share a [`Hub`], which plays the role of the
//! network: `bind` registers an address in it, `connect` looks one up.
//!
//! Messages are moved, never encoded or copied: the receiver gets the sender's `Bytes`.
//!
//! ```
//! use van_core::inproc::{Hub, InProcessVan};
//! use van_core::{inbox, Message, Node, Role, Van};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let hub = Hub::new();
//! let (a, b) = (InProcessVan::new(&hub), InProcessVan::new(&hub));
//! let (a_tx, _a_inbox) = inbox(16);
//! let (b_tx, mut b_inbox) = inbox(16);
//! a.bind("node-a", 0, a_tx).await?;
//! let b_endpoint = b.bind("node-b", 0, b_tx).await?;
//! let mut b_node = Node::new(Role::Server, "node-b", 0).with_id(8);
//! b_node.endpoints.push(b_endpoint);
//! a.connect(&b_node).await?;
//! a.send(Message::to(8, vec![bytes::Bytes::from_static(b"hi")])).await?;
//! let got = b_inbox.recv_message().await.unwrap().unwrap();
//! assert_eq!(&got.data[0][..], b"hi");
//! # Ok::<(), van_core::VanError>(())
//! # }).unwrap();
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::message::{Endpoint, Message, Node, NodeId};
use crate::van::{
    address_for, recipient_of, Event, InboxSender, PeerLost, Van, VanError, VanKind,
    WeakInboxSender,
};

/// The in-process network: addresses of bound [`InProcessVan`]s. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Hub {
    inner: Arc<Mutex<HubInner>>,
}

#[derive(Debug, Default)]
struct HubInner {
    /// Last port handed out for `port = 0` binds, per host (the search for a free one starts
    /// after it).
    last_port: HashMap<String, u16>,
    /// Bound addresses and how to reach them.
    bound: HashMap<String, WeakInboxSender>,
    /// Per bound address, who connected to it, so they hear of it when it stops (as a
    /// socket's peer sees the connection close).
    watchers: HashMap<String, Watchers>,
}

/// The vans connected to one address: keyed by the connecting van and the id it knows the
/// address by, so that a connect costs the same with 10 or 10,000 watchers and reconnects
/// neither pile up entries nor duplicate lost-peer events.
#[derive(Debug, Default)]
struct Watchers {
    by_van: HashMap<(u64, NodeId), WeakInboxSender>,
    /// Entries of stopped vans are swept when the map reaches this size (then twice the
    /// live size): amortised constant work per connect.
    sweep_at: usize,
}

impl Watchers {
    fn insert(&mut self, van: u64, peer: NodeId, inbox: WeakInboxSender) {
        self.by_van.insert((van, peer), inbox);
        if self.by_van.len() >= self.sweep_at {
            self.by_van.retain(|_, w| w.upgrade().is_some());
            self.sweep_at = (2 * self.by_van.len()).max(64);
        }
    }
}

/// Tells vans apart in [`Watchers`].
static NEXT_VAN: AtomicU64 = AtomicU64::new(0);

impl Hub {
    /// An empty network.
    pub fn new() -> Hub {
        Hub::default()
    }

    fn lock(&self) -> MutexGuard<'_, HubInner> {
        // A panic while holding this lock cannot leave the maps inconsistent (every update
        // is a single insert or remove), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A van whose peers live in the same process; see the [module docs](self).
#[derive(Debug)]
pub struct InProcessVan {
    hub: Hub,
    id: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Our address and the strong handle that keeps our inbox open.
    bound: Option<(String, InboxSender)>,
    routes: HashMap<NodeId, WeakInboxSender>,
    stopped: bool,
}

impl InProcessVan {
    /// A van on `hub`, not yet bound.
    pub fn new(hub: &Hub) -> InProcessVan {
        InProcessVan {
            hub: hub.clone(),
            id: NEXT_VAN.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Same reasoning as `Hub::lock`: single inserts and removes only.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The peer's inbox, or why there is none.
    fn route(&self, peer: NodeId) -> Result<InboxSender, VanError> {
        let state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(VanKind::InProcess));
        }
        let weak = state
            .routes
            .get(&peer)
            .ok_or(VanError::UnknownPeer { peer })?;
        weak.upgrade().ok_or_else(|| VanError::PeerGone {
            peer,
            reason: "the peer's van stopped".into(),
        })
    }
}

#[async_trait]
impl Van for InProcessVan {
    fn kind(&self) -> VanKind {
        VanKind::InProcess
    }

    async fn bind(&self, host: &str, port: u16, inbox: InboxSender) -> Result<Endpoint, VanError> {
        let mut state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(VanKind::InProcess));
        }
        if state.bound.is_some() {
            return Err(VanError::AlreadyBound(VanKind::InProcess));
        }
        let mut hub = self.hub.lock();
        let port = if port != 0 {
            port
        } else {
            // The next port on this host that no live van holds (wrapping once around).
            let start = hub.last_port.get(host).copied().unwrap_or(0);
            let free = (1..=u16::MAX)
                .map(|step| start.wrapping_add(step).max(1))
                .find(|candidate| {
                    let address = Endpoint::stream(VanKind::InProcess, host, *candidate).address;
                    hub.bound
                        .get(&address)
                        .is_none_or(|weak| weak.upgrade().is_none())
                })
                .ok_or_else(|| VanError::Bind {
                    kind: VanKind::InProcess,
                    address: format!("{host}:0"),
                    source: std::io::Error::new(
                        std::io::ErrorKind::AddrNotAvailable,
                        "no ephemeral in-process ports left on this host",
                    ),
                })?;
            hub.last_port.insert(host.to_owned(), free);
            free
        };
        let endpoint = Endpoint::stream(VanKind::InProcess, host, port);
        let live = hub
            .bound
            .get(&endpoint.address)
            .is_some_and(|weak| weak.upgrade().is_some());
        if live {
            return Err(VanError::Bind {
                kind: VanKind::InProcess,
                address: endpoint.address,
                source: std::io::ErrorKind::AddrInUse.into(),
            });
        }
        hub.bound
            .insert(endpoint.address.clone(), inbox.downgrade());
        state.bound = Some((endpoint.address.clone(), inbox));
        Ok(endpoint)
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        let (peer, address) = address_for(node, VanKind::InProcess)?;
        let target = self.hub.lock().bound.get(&address).cloned();
        let mut state = self.lock();
        if state.stopped {
            return Err(VanError::Stopped(VanKind::InProcess));
        }
        let Some(target) = target.filter(|weak| weak.upgrade().is_some()) else {
            return Err(VanError::Connect {
                kind: VanKind::InProcess,
                peer,
                address,
                source: std::io::ErrorKind::ConnectionRefused.into(),
            });
        };
        state.routes.insert(peer, target);
        if let Some((_, my_inbox)) = &state.bound {
            let mut hub = self.hub.lock();
            hub.watchers
                .entry(address)
                .or_default()
                .insert(self.id, peer, my_inbox.downgrade());
        }
        Ok(())
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        let peer = recipient_of(&msg)?;
        let inbox = self.route(peer)?;
        inbox
            .deliver(vec![Event::Message(msg)])
            .await
            .map_err(|_| VanError::PeerGone {
                peer,
                reason: "the peer's inbox is closed".into(),
            })
    }

    async fn send_batch(&self, msgs: Vec<Message>) -> Result<(), VanError> {
        // One delivery per run of messages to the same peer: one channel hop per batch.
        let mut run: Vec<Event> = Vec::new();
        let mut run_peer = None;
        for msg in msgs {
            let peer = recipient_of(&msg)?;
            if run_peer.is_some_and(|p| p != peer) {
                self.deliver_run(run_peer, std::mem::take(&mut run)).await?;
            }
            run_peer = Some(peer);
            run.push(Event::Message(msg));
        }
        self.deliver_run(run_peer, run).await
    }

    async fn stop(&self) -> Result<(), VanError> {
        let mut state = self.lock();
        state.stopped = true;
        state.routes.clear();
        let Some((address, _inbox)) = state.bound.take() else {
            return Ok(());
        };
        drop(state);
        let watchers = {
            let mut hub = self.hub.lock();
            hub.bound.remove(&address);
            hub.watchers.remove(&address).unwrap_or_default()
        };
        for ((_, peer), watcher) in watchers.by_van {
            if let Some(inbox) = watcher.upgrade() {
                let lost = PeerLost {
                    peer: Some(peer),
                    kind: VanKind::InProcess,
                    reason: "the peer's van stopped".into(),
                };
                // A full inbox must not hold up our stop: deliver in the background.
                tokio::spawn(async move { inbox.deliver(vec![Event::PeerLost(lost)]).await });
            }
        }
        Ok(())
    }
}

impl InProcessVan {
    async fn deliver_run(&self, peer: Option<NodeId>, run: Vec<Event>) -> Result<(), VanError> {
        let Some(peer) = peer else { return Ok(()) };
        self.route(peer)?
            .deliver(run)
            .await
            .map_err(|_| VanError::PeerGone {
                peer,
                reason: "the peer's inbox is closed".into(),
            })
    }
}
