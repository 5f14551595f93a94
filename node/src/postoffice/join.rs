//! Joining the cluster: reaching the scheduler (retried until the bootstrap deadline, except
//! for a refusal no retry can change), registering (re-sent until the node table arrives),
//! and what the bootstrap deadline's error says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};
use van_core::{node_ids, Command, Node, Role};

use super::{lock, Postoffice};
use crate::error::{NodeError, Result};

/// How often a node retries reaching the scheduler while bootstrapping.
const CONNECT_RETRY: Duration = Duration::from_millis(200);
/// How often a node re-sends its registration until the node table arrives.
const REGISTER_RETRY: Duration = Duration::from_secs(2);
/// How often a bootstrap that goes on says what it is waiting for: the scheduler's address
/// (a warning from the second time on, so that a node with no scheduler is not silent at the
/// default level), or, on the scheduler, who has joined.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

impl Postoffice {
    /// Connects to every other node of the table now (`VANS_EAGER_CONNECT`), so a peer that
    /// cannot be reached is an error at start rather than at first use.
    pub(super) async fn connect_all(&self) -> Result<()> {
        let me = self.my_id();
        let peers: Vec<Node> = self
            .nodes()
            .iter()
            .filter(|n| n.id.is_some_and(|id| id != me && id != node_ids::SCHEDULER))
            .cloned()
            .collect();
        for peer in peers {
            self.inner.router.connect(&peer).await?;
        }
        Ok(())
    }

    pub(super) fn scheduler_node(&self) -> Node {
        let c = &self.inner.config;
        Node::new(Role::Scheduler, c.root_uri.clone(), c.root_port).with_id(node_ids::SCHEDULER)
    }

    /// Registers with the scheduler and waits for the node table.
    pub(super) async fn bootstrap(&self) -> Result<()> {
        let mut ready = self.inner.ready.subscribe();
        let started = Instant::now();
        let deadline = self.inner.config.bootstrap_timeout;
        if self.inner.role == Role::Scheduler {
            // An empty cluster is ready at once.
            self.scheduler_check_ready().await;
            loop {
                match tokio::time::timeout(PROGRESS_EVERY, wait_ready(&mut ready)).await {
                    Ok(result) => return result,
                    Err(_) => {
                        let joined = self.bootstrap_summary();
                        info!(
                            "after {}s of the {}s bootstrap deadline: {joined}",
                            started.elapsed().as_secs(),
                            deadline.as_secs()
                        );
                    }
                }
            }
        } else {
            let scheduler = self.scheduler_node();
            let mut told: Option<Instant> = None;
            while let Err(e) = self.inner.router.connect(&scheduler).await {
                // A scheduler that refuses our secret will not accept it on a retry: say why
                // now instead of at the bootstrap deadline. A handshake that merely did not
                // finish (timeout, closed, busy) may succeed next time.
                if is_final_refusal(&e) {
                    return Err(e);
                }
                if told.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
                    let (host, port) = (&scheduler.host, scheduler.port);
                    if told.is_none() {
                        info!("waiting for the scheduler at {host}:{port}: {e}");
                    } else {
                        warn!(
                            "still waiting for the scheduler at {host}:{port} after {}s of the \
                             {}s bootstrap deadline (is it running, and is \
                             DMLC_PS_ROOT_URI/PORT right?): {e}",
                            started.elapsed().as_secs(),
                            deadline.as_secs()
                        );
                    }
                    told = Some(Instant::now());
                }
                tokio::time::sleep(CONNECT_RETRY).await;
            }
            let mut msg = crate::member::control_request(Command::AddNode);
            if let Some(control) = &mut msg.meta.control {
                control.nodes = Arc::from([self.inner.me.clone()]);
            }
            // The registration is re-sent until the table arrives: one lost with its
            // connection (a cut, a reset) would otherwise leave this node waiting until the
            // bootstrap deadline. The scheduler takes a re-sent one from the same process
            // (same incarnation) as a duplicate.
            loop {
                match self.inner.router.send(msg.clone()).await {
                    Ok(()) => {}
                    Err(e) if is_final_refusal(&e) => return Err(e),
                    Err(e) => debug!("registration not sent, will try again: {e}"),
                }
                match tokio::time::timeout(REGISTER_RETRY, wait_ready(&mut ready)).await {
                    Ok(result) => return result,
                    Err(_) => debug!("no node table yet; registering again"),
                }
                if told.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
                    told = Some(Instant::now());
                    info!(
                        "registered with the scheduler at {}:{} after {}s; it waits for all {} \
                         servers and {} workers to join (its log says who has)",
                        scheduler.host,
                        scheduler.port,
                        started.elapsed().as_secs(),
                        self.inner.config.num_servers,
                        self.inner.config.num_workers
                    );
                }
            }
        }
    }

    /// What the bootstrap deadline error says.
    pub(super) fn bootstrap_summary(&self) -> String {
        match &self.inner.scheduler {
            Some(s) => lock(s).summary(),
            None => format!(
                "no node table from the scheduler at {}:{} ({} servers and {} workers expected); \
                 is the scheduler running, and have all nodes started?",
                self.inner.config.root_uri,
                self.inner.config.root_port,
                self.inner.config.num_servers,
                self.inner.config.num_workers
            ),
        }
    }
}

/// Waits until the node table has arrived.
pub(super) async fn wait_ready(ready: &mut watch::Receiver<bool>) -> Result<()> {
    while !*ready.borrow_and_update() {
        ready.changed().await.map_err(|_| NodeError::Stopped)?;
    }
    Ok(())
}

/// Whether `e` is a handshake answer that no retry can change: the scheduler holds another
/// secret, speaks another handshake version, or does not authenticate at all. A handshake
/// cut short (timeout, closed connection, I/O error, too many pending from our address) is
/// not: the scheduler may be starting or busy, so bootstrap keeps trying.
pub(super) fn is_final_refusal(e: &NodeError) -> bool {
    use van_core::auth::AuthError;
    matches!(
        e,
        NodeError::Van(van_core::VanError::Unauthenticated {
            source: AuthError::WrongSecret | AuthError::Version(_) | AuthError::NotAuthenticating,
            ..
        })
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use van_core::auth::AuthError;
    use van_core::{VanError, VanKind};

    use super::*;

    fn refused(source: AuthError) -> NodeError {
        NodeError::Van(VanError::Unauthenticated {
            kind: VanKind::Tcp,
            peer: node_ids::SCHEDULER,
            address: "127.0.0.1:1".into(),
            source,
        })
    }

    #[test]
    fn only_final_handshake_answers_stop_bootstrap() {
        assert!(is_final_refusal(&refused(AuthError::WrongSecret)));
        assert!(is_final_refusal(&refused(AuthError::Version(2))));
        assert!(is_final_refusal(&refused(AuthError::NotAuthenticating)));
        for transient in [
            AuthError::Timeout(Duration::from_secs(10)),
            AuthError::Closed,
            AuthError::Io(std::io::ErrorKind::ConnectionReset.into()),
            AuthError::TooManyPending { count: 8, max: 8 },
        ] {
            assert!(!is_final_refusal(&refused(transient)));
        }
        assert!(!is_final_refusal(&NodeError::Stopped));
    }
}
