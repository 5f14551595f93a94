//! Forming a generation's shared-memory group and running a collective through it (see the
//! [module docs](super)).

use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use tracing::{debug, info};
use van_core::buf::SharedRegion;
use van_ipc::Segment;

use super::group::{self, layout, Arenas, Group, Rounds, LINE};
use super::turns::Formed;
use super::{gather, reduce, signal, Collective};
use crate::comm::p2p::HIER_OP;
use crate::comm::{Op, OpKind, Shared};
use crate::element::{Element, ReduceOp};
use crate::error::{CollectiveError, Result};
use crate::hosts::Hosts;
use crate::ring::chunk;
use crate::select::{self, Algorithm};
use crate::spin::Spin;

/// The op numbers of the two exchanges that form a group: apart from the collectives' and
/// the point-to-point messages'.
const FORM_OP: u64 = 1 << 62;
/// Words per rank in the first exchange: pid, pid namespace, descriptor, token, length,
/// and the rank's arena's descriptor and length.
const ROW: usize = 7;

/// Slot size: the slice size, whole cache lines.
fn slot_bytes(shared: &Shared) -> usize {
    (shared.options.slice_bytes / LINE).max(1) * LINE
}

/// What this rank says in the first exchange.
struct Row {
    pid: i64,
    pid_namespace: i64,
    fd: i64,
    token: i64,
    len: i64,
    arena_fd: i64,
    arena_len: i64,
}

impl Row {
    fn mine(created: Option<&(Group, u64)>, arena: Option<SharedRegion>) -> Row {
        let (fd, token, len) = match created {
            Some((group, token)) => (
                i64::from(std::os::fd::AsRawFd::as_raw_fd(&group.segment.fd())),
                *token as i64,
                group.segment.len() as i64,
            ),
            None => (0, 0, 0),
        };
        Row {
            pid: i64::from(rustix::process::getpid().as_raw_nonzero().get()),
            pid_namespace: pid_namespace(),
            fd,
            token,
            len,
            // -1: no arena (0 is a descriptor like any other).
            arena_fd: arena.map_or(-1, |a| i64::from(a.fd)),
            arena_len: arena.map_or(0, |a| a.len as i64),
        }
    }

    fn words(&self) -> [i64; ROW] {
        [
            self.pid,
            self.pid_namespace,
            self.fd,
            self.token,
            self.len,
            self.arena_fd,
            self.arena_len,
        ]
    }

    fn read(table: &[i64], q: usize) -> Row {
        let w = &table[q * ROW..(q + 1) * ROW];
        Row {
            pid: w[0],
            pid_namespace: w[1],
            fd: w[2],
            token: w[3],
            len: w[4],
            arena_fd: w[5],
            arena_len: w[6],
        }
    }
}

fn clock_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// This process's pid namespace (its inode number), or 0 when `/proc` does not say.
fn pid_namespace() -> i64 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|link| {
            let link = link.to_string_lossy().into_owned();
            let inner = link.strip_prefix("pid:[")?.strip_suffix(']')?;
            inner.parse::<i64>().ok()
        })
        .unwrap_or(0)
}

/// Forms the group of `call`'s generation (see the [module docs](self)): `Ok(Err(why))`
/// when the ranks cannot share memory, `Err` when the exchange itself failed. With
/// `in_place` (a one-host group, whose all-reduces read buffers in the ranks' arenas), the
/// ranks also map each other's arenas.
pub(crate) async fn form(
    shared: &Shared,
    call: &Op,
    spin: Spin,
    in_place: bool,
) -> Result<std::result::Result<Arc<Group>, String>> {
    let (n, r) = (call.size(), call.rank);
    let slot = slot_bytes(shared);
    // Rank 0's group, its header written before anyone can open it.
    let created = match (r, layout(n, slot)) {
        (0, Some((_, total))) => {
            // Positive as an `i64`; without the kernel's randomness, the clock's.
            let token = getrandom::u64().unwrap_or_else(|_| clock_nanos()) >> 1;
            let made = Segment::create("collective", total)
                .map_err(|e| e.to_string())
                .and_then(|segment| Group::new(segment, 0, n, slot, Vec::new(), spin));
            match made {
                Ok(group) => {
                    group.write_header(token);
                    Some((group, token))
                }
                Err(e) => {
                    debug!("shared-memory collectives: no segment: {e}");
                    None
                }
            }
        }
        _ => None,
    };
    let mut table = vec![0i64; ROW * n];
    let arena = shared.po.shared_region();
    table[r * ROW..(r + 1) * ROW].copy_from_slice(&Row::mine(created.as_ref(), arena).words());
    let exchange = call.internal(FORM_OP).carrying::<i64>(table.len());
    crate::ring::direct(shared, &exchange, &mut table, ReduceOp::Sum).await?;
    let attached = match crate::spin::can_block() {
        true => attach(shared, call, &table, created, spin),
        false => Err("this rank runs on a current-thread runtime, which must not block".into()),
    };
    // Whether this rank mapped every other rank's arena (see `attach_arenas`).
    let arenas = match &attached {
        Ok(_) if in_place => attach_arenas(call, &table, arena),
        _ => None,
    };
    let mut agree = vec![i32::from(attached.is_ok()), i32::from(arenas.is_some())];
    let vote = call.internal(FORM_OP + 1).carrying::<i32>(2);
    crate::ring::direct(shared, &vote, &mut agree, ReduceOp::Min).await?;
    Ok(match (attached, agree[0]) {
        (Ok(mut group), 1) => {
            // Buffers are read in the ranks' arenas only when every rank mapped every arena.
            let reads = match (agree[1], arenas) {
                (1, Some(arenas)) => {
                    let any = arenas.mine.is_some() || arenas.theirs.iter().any(Option::is_some);
                    group.arenas = arenas;
                    match any {
                        true => "; all-reduce buffers in a rank's shared arena are read in place",
                        false => "",
                    }
                }
                _ => "",
            };
            info!(
                "collectives of generation {} go through shared memory ({n} ranks, slots of \
                 {slot} bytes, spinning {:?}){reads}",
                call.generation, group.spin
            );
            Ok(Arc::new(group))
        }
        (Ok(_), _) => Err("another rank could not map the shared segment".into()),
        (Err(why), _) => Err(why),
    })
}

/// Maps rank 0's segment (rank 0: keeps its own) and checks it against the table.
fn attach(
    shared: &Shared,
    call: &Op,
    table: &[i64],
    created: Option<(Group, u64)>,
    spin: Spin,
) -> std::result::Result<Group, String> {
    let (n, r) = (call.size(), call.rank);
    let slot = slot_bytes(shared);
    let (_, total) = layout(n, slot).ok_or("the segment would be too large")?;
    let rows: Vec<Row> = (0..n).map(|q| Row::read(table, q)).collect();
    let first = &rows[0];
    if let Some(q) = (0..n).find(|&q| rows[q].pid_namespace != rows[r].pid_namespace) {
        return Err(format!(
            "ranks {} and {} are in different pid namespaces, so cannot open each other's \
             memory through /proc",
            call.ranks[r], call.ranks[q]
        ));
    }
    if first.fd <= 0 || first.len != total as i64 {
        return Err("rank 0 could not create the shared segment".into());
    }
    let mut group = match created {
        Some((group, _)) => group,
        None => {
            let segment = open_peer(first.pid, first.fd, "rank 0's segment")?;
            let group = Group::new(segment, r, n, slot, Vec::new(), spin)?;
            group.check_header(first.token as u64)?;
            group
        }
    };
    group.pids = rows.iter().map(|row| row.pid as i32).collect();
    Ok(group)
}

/// Maps every other rank's shared arena (the memory `Postoffice::alloc` hands out, which
/// its all-reduces then read in place), checking each is a sealed memfd of the length its
/// rank said. `None` when one cannot be mapped: then no rank's arena is used. Ranks without
/// an arena are `None` in the list, as is this rank.
fn attach_arenas(call: &Op, table: &[i64], mine: Option<SharedRegion>) -> Option<Arenas> {
    let (n, r) = (call.size(), call.rank);
    let mut theirs = Vec::with_capacity(n);
    for q in 0..n {
        let row = Row::read(table, q);
        if q == r || row.arena_fd < 0 || row.arena_len <= 0 {
            theirs.push(None);
            continue;
        }
        let mapped = open_peer(row.pid, row.arena_fd, "arena").and_then(|arena| {
            match arena.len() as i64 == row.arena_len {
                true => Ok(arena),
                false => Err(format!(
                    "its arena is {} bytes, not {}",
                    arena.len(),
                    row.arena_len
                )),
            }
        });
        match mapped {
            Ok(arena) => theirs.push(Some(arena)),
            Err(why) => {
                debug!(
                    "generation {}: rank {}'s shared arena is not read in place: {why}",
                    call.generation, call.ranks[q]
                );
                return None;
            }
        }
    }
    Some(Arenas { mine, theirs })
}

/// Opens the memfd `fd` of process `pid` (same user, same pid namespace): rank 0's group
/// `segment`, or a rank's `arena`.
pub(super) fn open_peer(pid: i64, fd: i64, what: &str) -> std::result::Result<Segment, String> {
    let path = format!("/proc/{pid}/fd/{fd}");
    // Non-blocking: if the descriptor were anything but the memfd, opening it must not
    // wait (a FIFO); `Segment::open` then refuses whatever is not a sealed memfd.
    let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let file = rustix::fs::open(&path, flags, Mode::empty())
        .map_err(|e| format!("cannot open the {what} at {path}: {e}"))?;
    Segment::open(file).map_err(|e| format!("the {what} at {path}: {e}"))
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
pub(super) fn process_gone(pid: i32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    if rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH) {
        return true;
    }
    // The state follows the command name, which may hold spaces and parentheses.
    std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero()))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after
                .split_whitespace()
                .next()
                .map(|s| s == "Z" || s == "X")
        })
        .unwrap_or(false)
}

/// The op number of the hosts' vote on their groups (see [`run`]).
const HOSTS_VOTE: u64 = FORM_OP + 2;
/// Marks the signatures of a hierarchical all-reduce's phases in shared memory.
const HIERARCHY: u64 = 1 << 16;

/// Runs collective `what` for `call`, which holds shared-memory `ticket`: waits its turn,
/// forms the group if this is the generation's first, and goes through it (with
/// `call.hosts`, an all-reduce goes hierarchically: see [`hierarchical`]). `Ok(false)` when
/// the ranks cannot share memory: the caller takes the message algorithms (it is an error
/// when `shm` or `hier` was asked for).
pub(crate) async fn run<T: Element>(
    shared: &Shared,
    call: &Op,
    ticket: u64,
    what: Collective<'_, T>,
) -> Result<bool> {
    let _turn = shared.shm_turn(call, ticket).await?;
    // The ranks that map the group: this host's, or (no copy) the generation's.
    let host_op = match &call.hosts {
        Some(hosts) => Some(
            call.among(hosts.local(call.rank), call.number)
                .ok_or_else(|| not_placed(call))?,
        ),
        None => None,
    };
    let local = host_op.as_ref().unwrap_or(call);
    let group = match shared.shm_group(call.generation) {
        Formed::Ready(group) => Ok(group),
        Formed::Unavailable(why) => Err(why),
        Formed::NotYet => {
            // Ranks on this machine but in other namespaces share its cores too.
            let machine = crate::hosts::on_this_machine(&shared.po, &call.members);
            let spin = crate::spin::policy(shared.options.spin, machine);
            let mut formed = form(shared, local, spin, call.hosts.is_none()).await?;
            // Each host voted on its own group; every rank of the generation must take the
            // same path (through the hosts' groups, or by messages), so the hosts vote too.
            if call.hosts.is_some() {
                let mut all = vec![i32::from(formed.is_ok())];
                let vote = call.internal(HOSTS_VOTE).carrying::<i32>(1);
                crate::ring::direct(shared, &vote, &mut all, ReduceOp::Min).await?;
                if all[0] == 0 && formed.is_ok() {
                    formed = Err("the ranks of another host could not share their memory".into());
                }
            }
            if let (Some(hosts), Ok(_)) = (&call.hosts, &formed) {
                info!(
                    "all-reduces of generation {} go hierarchically: {} hosts of {} ranks, \
                     through shared memory on each",
                    call.generation,
                    hosts.by_host.len(),
                    local.size()
                );
            }
            shared.set_shm_group(call.generation, &formed);
            formed
        }
    };
    let group = match group {
        Ok(group) => group,
        // A barrier carries no buffer to share: it goes by messages where it must.
        Err(why) if call.kind != OpKind::Barrier => match told(shared, call) {
            Some((collective, algorithm)) => {
                return Err(CollectiveError::InvalidArgument(format!(
                    "VANS_COLLECTIVE_ALGO tells {collective} to take {algorithm}, but the ranks \
                     cannot share memory: {why}"
                )));
            }
            None => {
                debug!("collectives by messages: {why}");
                return Ok(false);
            }
        },
        Err(why) => {
            debug!("collectives by messages: {why}");
            return Ok(false);
        }
    };
    let through = Through {
        shared,
        whole: call,
        local,
        group: &group,
    };
    match (what, &call.hosts) {
        (Collective::AllReduce(buf, op), Some(hosts)) => {
            hierarchical(&through, call, hosts, buf, op).await?;
        }
        (what, _) => {
            // A broadcast's root is part of it: ranks that disagree on it fail instead of
            // copying.
            let kind = match &what {
                Collective::Broadcast(_, root) => call.kind as u64 | (*root as u64 + 1) << 8,
                _ => call.kind as u64,
            };
            through.phase(kind, |rounds| match what {
                Collective::AllReduce(buf, op) => reduce::allreduce(rounds, buf, op),
                Collective::AllGather(input, out) => gather::all_gather(rounds, input, out),
                Collective::ReduceScatter(buf, op) => gather::reduce_scatter(rounds, buf, op),
                Collective::Broadcast(buf, root) => gather::broadcast(rounds, buf, root),
            })?;
        }
    }
    Ok(true)
}

/// `call`'s collective and `Shm` or `Hier` when `VANS_COLLECTIVE_ALGO` tells it to take
/// that.
fn told(shared: &Shared, call: &Op) -> Option<(select::Collective, Algorithm)> {
    let collective = call.kind.collective()?;
    let told = shared.options.algorithm.of(collective);
    matches!(told, Algorithm::Shm | Algorithm::Hier).then_some((collective, told))
}

/// The error of a rank missing from its own host's ranks (the placement is worked out from
/// the node table alike on every rank, so only a table that changed under it gets here).
fn not_placed(call: &Op) -> CollectiveError {
    CollectiveError::MembershipChanged {
        generation: call.generation,
        reason: format!(
            "rank {} is not among its host's ranks in the node table",
            call.rank
        ),
    }
}

/// A hierarchical all-reduce of `buf` (the ranks on several hosts, the same number on each):
/// a reduce-scatter through this host's group leaves share `i` of the host's sum on its
/// rank `i`; the ranks with share `i` on every host all-reduce it between the hosts by
/// messages (over the mesh or the vans, by the algorithm [`crate::choose`] picks for the
/// hosts and the share), so every rank's link carries a share at once; an all-gather
/// through the group then copies every share to every rank of the host. Each element is
/// the host sums (each in host rank order) reduced in one order, the same on every rank, so
/// every rank gets the same bits. A mean sums in both phases and divides the share by the
/// generation's size once (dividing per phase would truncate integers twice).
async fn hierarchical<T: Element>(
    through: &Through<'_>,
    call: &Op,
    hosts: &Hosts,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (through.group.size, through.group.rank);
    let sum = match op {
        ReduceOp::Mean => ReduceOp::Sum,
        other => other,
    };
    through.phase(OpKind::ReduceScatter as u64 | HIERARCHY, |rounds| {
        gather::reduce_scatter(rounds, buf, sum)
    })?;
    let share = chunk(buf.len(), n, r);
    let across = call
        .among(&hosts.across(call.rank), HIER_OP | call.number)
        .ok_or_else(|| not_placed(call))?
        .carrying::<T>(share.len());
    let mine = &mut buf[share];
    let bytes = std::mem::size_of_val(mine);
    let options = &through.shared.options;
    let algorithm =
        select::by_messages(options, select::Collective::AllReduce, bytes, across.size());
    crate::messages::allreduce(through.shared, &across, mine, sum, algorithm).await?;
    if op == ReduceOp::Mean {
        mine.iter_mut().for_each(|v| *v = v.divide(call.size()));
    }
    through.phase(OpKind::AllGather as u64 | HIERARCHY, |rounds| {
        gather::gather_blocks(rounds, None, buf)
    })
}

/// What a rank that published `theirs` ([`group::call_word`]) runs against `call` (this
/// rank's, which published `said`), in the user's terms: both collectives, lengths and element
/// types, or that it runs another call.
fn mismatch(call: &Op, said: u64, theirs: u64) -> String {
    let name = |kind: u8| {
        OpKind::from_frame(i32::from(kind)).map_or("an unknown collective", OpKind::name)
    };
    // What this rank published, read back as the other rank's is.
    let mine = group::read_call_word(said).unwrap_or_default();
    let what = |(_, kind, tag, total): (u64, u8, u64, u64)| {
        format!(
            "{} of {total} elements of {}",
            name(kind),
            crate::element::tag_name(tag)
        )
    };
    match group::read_call_word(theirs) {
        // The word leaves out a broadcast's root and a hierarchical all-reduce's phase.
        Some(t) if t == mine => format!(
            "it runs {} as #{} through shared memory, as this rank does, but from another \
             root (a broadcast) or as another phase (a hierarchical all-reduce)",
            what(t),
            call.number
        ),
        Some(t) if t.1 == mine.1 && t.2 == mine.2 && t.3 == mine.3 && t.0 != mine.0 => format!(
            "it runs {} as another call (a collective more or fewer on one rank) where this \
             rank runs it as #{} through shared memory",
            what(t),
            call.number
        ),
        Some(t) => format!(
            "it runs {} as #{} through shared memory, where this rank runs {}",
            what(t),
            call.number,
            what(mine)
        ),
        None => format!(
            "it runs another collective, or another length or element type, as #{} through \
             shared memory, where this rank runs {}",
            call.number,
            what(mine)
        ),
    }
}

/// A formed group, with the collective's op and the op of the ranks that map the group
/// (the same op unless the collective goes hierarchically).
struct Through<'a> {
    shared: &'a Shared,
    whole: &'a Op,
    local: &'a Op,
    group: &'a Group,
}

impl Through<'_> {
    /// Runs `work` on the group (blocking this thread) as a collective of `kind` (with the
    /// local op's number, element type and length: its signature), and names whoever
    /// stopped it. First writes what this rank still has queued on the mesh (the shares
    /// between hosts): the group's waits drive no sockets, and a rank of another host could
    /// wait for those frames while this rank waits for a rank of its own host that waits for
    /// that one.
    fn phase(
        &self,
        kind: u64,
        work: impl FnOnce(&mut Rounds<'_>) -> std::result::Result<(), signal::Stopped>,
    ) -> Result<()> {
        let (shared, call, group) = (self.shared, self.local, self.group);
        // Ranks all on one host have no mesh: their phases (the 1 µs path) skip the look.
        if self.whole.hosts.is_some() {
            shared.flush_mesh(call.generation)?;
        }
        let failed = |q: usize, reason: String| CollectiveError::RankFailed {
            node: call.members[q],
            rank: call.ranks[q],
            generation: call.generation,
            reason,
        };
        // A rank whose process is gone, named.
        let gone = || {
            let q = (0..group.size).find(|&q| q != group.rank && process_gone(group.pids[q]))?;
            Some(failed(
                q,
                format!("its process ({}) is gone", group.pids[q]),
            ))
        };
        let alive = || -> Result<()> {
            shared.still(call.generation)?;
            gone().map_or(Ok(()), Err)
        };
        let signature = group::signature(call.number, kind, call.tag, call.total as u64);
        let said = group::call_word(call.number, kind as u8, call.tag, call.total as u64);
        let result = crate::spin::blocking(|| {
            let rounds = Rounds::new(group, signature, shared.options.timeout, &alive);
            let mut rounds = rounds.saying(said);
            work(&mut rounds)
        });
        // Every failure but an abort (whose word is set) aborts the group before the caller
        // gets its buffer back: the others stop too, and one that read this rank's buffer
        // in place does not use what it read (see `reduce`).
        if let Err(stopped) = &result {
            match stopped {
                signal::Stopped::Aborted(_) => {}
                // Naming the rank that failed: by the time the others look, this one may
                // have exited as well, and a gone process would name itself.
                signal::Stopped::Failed(CollectiveError::RankFailed { rank, .. }) => {
                    group.abort(Some(*rank));
                }
                signal::Stopped::Corrupt(q) | signal::Stopped::TimedOut(q) => {
                    group.abort(Some(call.ranks[*q]));
                }
                signal::Stopped::Failed(_) | signal::Stopped::Mismatch(..) => group.abort(None),
            }
        }
        result.map_err(|stopped| match stopped {
            signal::Stopped::Failed(e) => e,
            // Why another rank gave up: the rank it saw fail (the abort word names a
            // generation rank, perhaps on another host); else a process gone; else what
            // this node's membership knows.
            signal::Stopped::Aborted(failed_rank) => {
                let named = failed_rank.filter(|&q| q < self.whole.size()).map(|q| {
                    CollectiveError::RankFailed {
                        node: self.whole.members[q],
                        rank: q,
                        generation: call.generation,
                        reason: "another rank on this host saw it fail".into(),
                    }
                });
                named
                    .or_else(gone)
                    .or_else(|| shared.still(call.generation).err())
                    .unwrap_or_else(|| CollectiveError::MembershipChanged {
                        generation: call.generation,
                        reason: "a rank on this host left the generation".into(),
                    })
            }
            signal::Stopped::Mismatch(q, theirs) => CollectiveError::Mismatch {
                rank: call.ranks[q],
                node: call.members[q],
                reason: mismatch(call, said, theirs),
            },
            signal::Stopped::Corrupt(q) => failed(
                q,
                "it published an all-reduce chunk outside its shared arena".into(),
            ),
            signal::Stopped::TimedOut(q) => failed(
                q,
                format!(
                    "no progress in shared memory within {:?} (VANS_COLLECTIVE_TIMEOUT)",
                    shared.options.timeout
                ),
            ),
        })
    }
}
