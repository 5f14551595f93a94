//! The mesh: direct TCP connections between the ranks of a generation, for their
//! collectives' data, instead of the vans.
//!
//! Through a van, every slice of a collective is a message: queued to the van's writer task,
//! read by its reader task, dispatched to the communicator, which wakes the collective's task
//! — four hand-offs between threads or tasks, each a kernel wake-up on an idle core (most of
//! the time of a 4 KiB all-reduce over TCP on loopback went to `epoll_wait` wake-ups). Open
//! MPI's TCP transport instead polls its sockets from the thread that runs the collective.
//! The mesh does the same: the collective's own thread writes its slices and reads its
//! peers' without blocking, spinning for `VANS_COLLECTIVE_SPIN_US` (or yielding the core,
//! when this host's ranks outnumber its cores) before it sleeps in `poll(2)`. The
//! algorithms are the same ([`crate::ring`], [`crate::doubling`], [`crate::halving`]): only
//! [`Shared::send`](crate::comm::Shared) and `recv` change their path, so every rank gets
//! the same bits either way. Every collective of the generation takes the mesh, whatever its
//! size; point-to-point messages stay on the vans.
//!
//! **Copies.** A slice of the caller's buffer goes to the socket from where it lies: the
//! mesh copies only what the socket does not take at once (see [`Data`]). A frame its
//! receiver waits for, to copy into place, is read straight into place (`recv` with
//! `into`). Other frames are read into buffers that come back to a pool when the collective
//! has consumed them: a fresh
//! allocation per frame cost a page fault per 4 KiB written, and made the mesh three times
//! slower than the vans at 1 MiB (`allreduce-bench`, 2 ranks: 0.77–0.83 ms against
//! 0.21–0.38; with the pool 0.17, and 0.15 with sends from the caller's buffer).
//!
//! **Forming.** When a generation settles, its ranks (2 to [`MAX_RANKS`], not all on one
//! host, over the `tcp` or `uring` van, with `VANS_COLLECTIVE_MESH` on and no cluster secret)
//! each listen on their node's address, exchange address, port and rank 0's random token
//! over the vans, connect to every higher rank and accept every lower one. A connection opens
//! with the token and the dialer's rank; a wrong token is closed. All then vote, over the
//! vans; unless every rank connected to every other, the generation keeps the vans. A rank
//! on a current-thread tokio runtime votes against the mesh: its waits would stop its
//! vans' writers (see `spin::can_block`).
//!
//! **Frames** ([`peer`]): a header naming the collective, hop and slice, its kind, element
//! type and length, then the payload. The receiver keeps frames that come early by key, and
//! checks each against the collective it runs ([`Op::check_frame`]): a mismatch is an
//! error naming the rank, as over the vans.
//!
//! **Failures.** A connection that breaks fails the collective (a killed process's sockets
//! are closed by its kernel); a rank that leaves the generation shuts its connections, so the
//! others stop too. A broken connection alone does not say which rank failed: when rank 1 of
//! a ring of 3 dies, rank 2 (which receives from it) leaves, and rank 0 (which receives from
//! rank 2) sees rank 2's connection break first. So before it names the peer
//! ([`CollectiveError::RankFailed`]) a rank gives the generation up to [`BLAME_GRACE`] to
//! name a failure (the scheduler's notice, or this rank's own connection to the dead one,
//! come within milliseconds), and names that one instead. A waiter also checks the
//! generation every 10 ms.

pub(crate) mod form;
mod peer;

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use van_core::NodeId;

use crate::comm::p2p::{Op, OpKind};
use crate::error::{CollectiveError, Result};
use crate::spin::{Idle, Spin};
pub(crate) use peer::Data;
use peer::{Head, Peer, Target};
use rustix::event::{PollFd, PollFlags};

/// Largest generation that forms a mesh (each rank holds a connection to every other).
pub(crate) const MAX_RANKS: usize = 64;
/// Longest single sleep in `poll` before the generation is checked again.
const NAP: Duration = Duration::from_millis(10);
/// How long a rank whose collective connection broke waits for the generation to name a
/// failure before it names that connection's peer: a rank that leaves the generation because
/// another rank died shuts its connections too, and its neighbours must name the dead rank,
/// which the scheduler's notice (or this rank's own connection to it) names within
/// milliseconds. A killed peer is named either way.
const BLAME_GRACE: Duration = Duration::from_secs(1);

/// `broken`, the error of a broken connection, unless the generation names a failure within
/// [`BLAME_GRACE`] (`alive` fails): then that one, whose rank left first. Blocks the thread.
pub(crate) fn unless_told(
    broken: CollectiveError,
    alive: &dyn Fn() -> Result<()>,
) -> CollectiveError {
    let until = Instant::now() + BLAME_GRACE;
    loop {
        if let Err(e) = alive() {
            return e;
        }
        if Instant::now() >= until {
            return broken;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The header of slice `slice` of hop `hop` of `op`, `len` bytes: what a sender writes and
/// what a receiver expects, to the bit.
fn frame_head(op: &Op, (hop, slice): (usize, usize), len: usize) -> Head {
    Head {
        number: op.number,
        hop: hop as u32,
        slice: slice as u32,
        kind: op.kind as i32,
        tag: op.tag as u32,
        total: op.total as u64,
        len: len as u64,
    }
}

/// A generation's connections, by rank, and the frames that came before they were asked for.
pub(crate) struct Mesh {
    members: Vec<NodeId>,
    generation: u64,
    spin: Spin,
    /// The largest payload a frame may carry (a slice).
    max_payload: usize,
    links: Mutex<Links>,
    /// A duplicate of each connection's descriptor, by rank, to sleep on without the lock.
    watch: Vec<(usize, TcpStream)>,
    /// Frame buffers, reused.
    pool: std::sync::Arc<crate::pool::SendPool>,
}

/// A frame's key: sender's rank, collective number, hop, slice.
type Key = (usize, u64, u32, u32);

struct Links {
    peers: Vec<Option<Peer>>,
    /// Frames that arrived before their collective asked, by key.
    early: HashMap<Key, (Head, Vec<u8>)>,
}

impl Mesh {
    fn lock(&self) -> MutexGuard<'_, Links> {
        // Critical sections only move bytes between sockets and maps: a poisoned lock still
        // holds consistent data.
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, for a call from a task of the runtime: a call that holds it may keep it
    /// while a frame lands, so a wait moves this thread's other tasks elsewhere.
    fn lock_in_task(&self) -> MutexGuard<'_, Links> {
        match self.links.try_lock() {
            Ok(links) => links,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => crate::spin::blocking(|| self.lock()),
        }
    }

    /// What a wait does before it sleeps.
    pub(crate) fn spin(&self) -> Spin {
        self.spin
    }

    /// The error of a broken connection to rank `q`, unless the generation names a failure
    /// first ([`unless_told`]).
    fn broken_unless_told(
        &self,
        q: usize,
        why: &str,
        alive: &dyn Fn() -> Result<()>,
    ) -> CollectiveError {
        unless_told(self.broken(q, why), alive)
    }

    /// The error of a broken connection to rank `q`.
    fn broken(&self, q: usize, why: &str) -> CollectiveError {
        CollectiveError::RankFailed {
            node: self.members[q],
            rank: q,
            generation: self.generation,
            reason: format!("its collective connection broke: {why}"),
        }
    }

    /// Sends `data` to `op`'s member `to` as slice `slice` of hop `hop` of `op`: writes what
    /// the socket takes at once and queues the rest (see [`Peer::send`]).
    pub(crate) fn send(
        &self,
        op: &Op,
        to: usize,
        hop: usize,
        slice: usize,
        data: Data<'_>,
    ) -> Result<()> {
        let head = frame_head(op, (hop, slice), data.bytes().len());
        // The connections are by generation rank; an op among some ranks names its own.
        let to = op.ranks[to];
        let mut links = self.lock_in_task();
        let Some(peer) = links.peers.get_mut(to).and_then(Option::as_mut) else {
            return Err(self.broken(to, "no connection"));
        };
        if let Some(why) = &peer.broken {
            return Err(self.broken(to, why));
        }
        if let Err(e) = peer.send(&head, data, |bytes| self.pool.copy(bytes)) {
            peer.broken = Some(e.to_string());
            return Err(self.broken(to, &e.to_string()));
        }
        Ok(())
    }

    /// Receives slice `slice` of hop `hop` of `op` from its member `member` (checked to be
    /// `len` bytes of the collective), driving every connection meanwhile; waits until
    /// `deadline`, asking `alive` between sleeps. With `into` (`len` bytes), a frame that
    /// has not come yet is read straight into it (`Ok(None)`); one that came before it was
    /// asked for is returned (`Ok(Some)`), as are all without `into`.
    ///
    /// A frame landing in `into` holds the mesh until it is whole: only this call may write
    /// to `into`. This rank's other collectives wait for it; its waits meanwhile still drive
    /// every connection (reading the others' frames into buffers, writing what is queued), so
    /// no other rank waits on this one's lock, and the rest of the frame is on its way from a
    /// peer that queues what its socket does not take at once.
    pub(crate) fn recv(
        &self,
        op: &Op,
        member: usize,
        (hop, slice, len): (usize, usize, usize),
        into: Option<&mut [u8]>,
        deadline: Instant,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<Option<Bytes>> {
        let from = op.ranks[member];
        let key = (from, op.number, hop as u32, slice as u32);
        // A frame lands only if its header is exactly what this rank expects: a mismatch
        // comes in a buffer of its own, and fails the check below without touching `into`.
        let expected = frame_head(op, (hop, slice), len);
        let mut target = into.filter(|buf| buf.len() == len).map(|buf| Target {
            head: expected,
            buf,
        });
        let mut idle = Idle::new(self.spin);
        let mut held = None;
        let came = |(head, data): (Head, Vec<u8>)| {
            let data = self.pool.wrap(data);
            op.check_frame(member, len, head.kind, head.tag, head.total, data)
                .map(Some)
        };
        loop {
            let mut links = held.take().unwrap_or_else(|| self.lock());
            if let Some(frame) = links.early.remove(&key) {
                return came(frame);
            }
            let mut landed = None;
            let progressed = self.drive(&mut links, from, target.as_mut(), &mut landed);
            // It landed because its header was `expected`: nothing is left to check.
            if landed.is_some() {
                return Ok(None);
            }
            if let Some(frame) = links.early.remove(&key) {
                return came(frame);
            }
            let peer = links.peers.get(from).and_then(Option::as_ref);
            if let Some(why) = peer.and_then(|p| p.broken.clone()) {
                drop(links);
                return Err(self.broken_unless_told(from, &why, alive));
            }
            let landing = peer.is_some_and(Peer::landing);
            // Once the wait sleeps: a rank that runs something else as this call says so
            // with its frames (at most one look per sleep).
            if !progressed && idle.spent() {
                if let Some(e) = self.stray(&links, op) {
                    return Err(e);
                }
            }
            if progressed {
                idle.reset();
                held = landing.then_some(links);
                continue;
            }
            let timed_out = || CollectiveError::RankFailed {
                node: self.members[from],
                rank: from,
                generation: self.generation,
                reason: format!(
                    "no message of {} #{} within its timeout (VANS_COLLECTIVE_TIMEOUT)",
                    op.kind.name(),
                    crate::comm::p2p::call_of(op.number).unwrap_or(op.number)
                ),
            };
            if !landing {
                drop(links);
                self.rest(&mut idle, deadline, alive, None, timed_out)?;
                continue;
            }
            if let Err(e) = self.rest(&mut idle, deadline, alive, Some(&links), timed_out) {
                // The frame's end can land nowhere now: the connection is out of step.
                if let Some(peer) = links.peers.get_mut(from).and_then(Option::as_mut) {
                    peer.broken = Some(format!("a frame was cut short by this rank: {e}"));
                }
                return Err(e);
            }
            held = Some(links);
        }
    }

    /// Writes every frame still queued (reading meanwhile, so two ranks flushing to each
    /// other both finish): a collective ends with this, so no frame of its is left behind
    /// when its rank moves on, or exits.
    pub(crate) fn flush(&self, deadline: Instant, alive: &dyn Fn() -> Result<()>) -> Result<()> {
        let mut idle = Idle::new(self.spin);
        loop {
            let slow = {
                let mut links = self.lock();
                // The common case, a collective whose frames are all written (or one that
                // went over the vans): no system call.
                if !links.peers.iter().flatten().any(Peer::has_output) {
                    return Ok(());
                }
                let progressed = self.drive(&mut links, usize::MAX, None, &mut None);
                let waiting = links.peers.iter().enumerate().find_map(|(q, p)| {
                    let p = p.as_ref()?;
                    p.has_output().then(|| (q, p.broken.clone()))
                });
                match waiting {
                    None => return Ok(()),
                    Some((q, Some(why))) => {
                        drop(links);
                        return Err(self.broken_unless_told(q, &why, alive));
                    }
                    Some(_) if progressed => {
                        idle.reset();
                        continue;
                    }
                    Some((q, None)) => q,
                }
            };
            self.rest(&mut idle, deadline, alive, None, || {
                CollectiveError::RankFailed {
                    node: self.members[slow],
                    rank: slow,
                    generation: self.generation,
                    reason: "it read none of this rank's collective frames within the timeout \
                         (VANS_COLLECTIVE_TIMEOUT)"
                        .into(),
                }
            })?;
        }
    }

    /// A frame that came for the same call as `op` but of another collective, kind, element
    /// type or length, as a [`CollectiveError::Mismatch`] naming its sender. Within a host
    /// the shared segment's signatures catch such ranks; between hosts, a rank whose
    /// all-reduce goes hierarchically sends its share's exchange under another number than
    /// a rank that runs another collective as the same call, and each would otherwise wait
    /// for the other's frames until the timeout.
    fn stray(&self, links: &Links, op: &Op) -> Option<CollectiveError> {
        let call = crate::comm::p2p::call_of(op.number)?;
        let expected = frame_head(op, (0, 0), 0);
        let (&(q, ..), (head, _)) = links.early.iter().find(|(_, (head, _))| {
            let same = (head.number, head.kind, head.tag, head.total)
                == (expected.number, expected.kind, expected.tag, expected.total);
            crate::comm::p2p::call_of(head.number) == Some(call) && !same
        })?;
        let what = |number: u64, kind: i32, tag: u32, total: u64| {
            let kind = OpKind::from_frame(kind).map_or("an unknown collective", OpKind::name);
            let place = match number == call {
                true => "",
                false => " (a hierarchical all-reduce's exchange between hosts)",
            };
            let element = crate::element::tag_name(tag.into());
            format!("{kind}{place} of {total} elements of {element}")
        };
        Some(CollectiveError::Mismatch {
            rank: q,
            node: self.members[q],
            reason: format!(
                "it runs {} as collective #{call}, where this rank runs {}",
                what(head.number, head.kind, head.tag, head.total),
                what(op.number, expected.kind, expected.tag, expected.total)
            ),
        })
    }

    /// A wait's turn when nothing moved: spin or yield while the budget lasts, then check
    /// the generation and sleep in `poll` (failing with `timed_out` past `deadline`).
    /// `held`: the connections, when the caller holds them (else `sleep` looks).
    fn rest(
        &self,
        idle: &mut Idle,
        deadline: Instant,
        alive: &dyn Fn() -> Result<()>,
        held: Option<&Links>,
        timed_out: impl FnOnce() -> CollectiveError,
    ) -> Result<()> {
        if idle.turn() {
            return Ok(());
        }
        alive()?;
        let now = Instant::now();
        if now >= deadline {
            return Err(timed_out());
        }
        let nap = (deadline - now).min(NAP);
        // Unless the caller holds the connections (a frame is landing in its memory), the
        // sleep is on the duplicates in `watch`, without the lock, so the rank's other
        // collectives (the embedded API runs several) go on meanwhile.
        match held {
            Some(links) => self.poll(&Self::wanted(links), nap),
            None => {
                let links = self.lock();
                let wanted = Self::wanted(&links);
                drop(links);
                self.poll(&wanted, nap);
            }
        }
        Ok(())
    }

    /// One pass over every connection: write what waits, read what came (into `early`;
    /// from rank `from`, the frame `target` waits for into its memory, its head then in
    /// `landed`). Whether anything moved. A connection that fails is marked broken.
    fn drive(
        &self,
        links: &mut Links,
        from: usize,
        mut target: Option<&mut Target<'_>>,
        landed: &mut Option<Head>,
    ) -> bool {
        let Links { peers, early } = links;
        let mut progressed = false;
        for (q, slot) in peers.iter_mut().enumerate() {
            let Some(peer) = slot.as_mut().filter(|p| p.broken.is_none()) else {
                continue;
            };
            let target = match q == from {
                true => target.as_deref_mut(),
                false => None,
            };
            let result = peer.flush().and_then(|wrote| {
                let mut fresh = || self.pool.take();
                let read = peer.read(
                    self.max_payload,
                    &mut fresh,
                    target,
                    |head, data| match data {
                        Some(data) => {
                            early.insert((q, head.number, head.hop, head.slice), (head, data));
                        }
                        None => *landed = Some(head),
                    },
                )?;
                Ok(wrote || read)
            });
            match result {
                Ok(moved) => progressed |= moved,
                Err(e) => {
                    peer.broken = Some(e.to_string());
                    progressed = true;
                }
            }
        }
        progressed
    }

    /// What to wait for on each connection, by rank: reading, and writing where frames
    /// wait (none for a broken one).
    fn wanted(links: &Links) -> Vec<Option<PollFlags>> {
        links
            .peers
            .iter()
            .map(|p| {
                let p = p.as_ref().filter(|p| p.broken.is_none())?;
                Some(match p.has_output() {
                    true => PollFlags::IN | PollFlags::OUT,
                    false => PollFlags::IN,
                })
            })
            .collect()
    }

    /// Sleeps in `poll` on the duplicates in `watch` until a connection can do what `wanted`
    /// says, or `nap` passes.
    fn poll(&self, wanted: &[Option<PollFlags>], nap: Duration) {
        let mut fds: Vec<PollFd<'_>> = self
            .watch
            .iter()
            .filter_map(|(q, stream)| Some(PollFd::new(stream, wanted.get(*q).copied()??)))
            .collect();
        let timeout = rustix::event::Timespec {
            tv_sec: nap.as_secs() as i64,
            tv_nsec: i64::from(nap.subsec_nanos()),
        };
        // Woken early or not, the caller looks again; an error is a short nap.
        let _ = rustix::event::poll(&mut fds, Some(&timeout));
    }

    /// Shuts every connection: the peers' waits end with this rank named (it left). Through
    /// the duplicates in `watch`, without the lock: a call that holds it (a frame landing)
    /// asks the generation, whose lock the caller of this one holds.
    pub(crate) fn shut(&self) {
        for (_, stream) in &self.watch {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests;
