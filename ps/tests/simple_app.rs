//! `SimpleApp` in whole in-process clusters: group requests, handler errors, bad recipients,
//! dead servers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use node::local::LocalCluster;
use ps::simple_app::SimpleApp;
use ps::{node_ids, NodeError, Role};
use tokio::sync::Notify;
use van_core::NodeId;

/// Bounds every cluster run, so a bug fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(60);

/// Command whose answer is the requester's id, as the handler saw it.
const WHO_ASKS: i32 = 100;

/// Answers `head + 1` and the body reversed; [`WHO_ASKS`] with the sender's id.
fn echo(sender: NodeId, head: i32, body: Bytes) -> Result<(i32, Bytes), String> {
    if head == WHO_ASKS {
        return Ok((head, Bytes::from(sender.to_string())));
    }
    let mut reversed = body.to_vec();
    reversed.reverse();
    Ok((head + 1, reversed.into()))
}

type Answers = Vec<(NodeId, i32, Bytes)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_the_server_group_gets_every_servers_answer() {
    let cluster = LocalCluster::new(2, 2);
    let run = cluster.run(|po| async move {
        let app = SimpleApp::new(&po, 3, 1, echo).await?;
        let mut seen: Option<(NodeId, Answers, Answers, Answers)> = None;
        if po.role() == Role::Worker {
            let to_servers = app.request(node_ids::SERVER_GROUP, 7, "abc".into()).await?;
            let who = app
                .request(node_ids::SERVER_GROUP, WHO_ASKS, Bytes::new())
                .await?;
            let to_workers = app.request(node_ids::WORKER_GROUP, 1, "xy".into()).await?;
            // Waits in any order: answers are kept until waited for.
            let workers = app.wait(to_workers).await?;
            let servers = app.wait(to_servers).await?;
            let who = app.wait(who).await?;
            assert_eq!(app.pending(), 0);
            seen = Some((po.my_id(), servers, who, workers));
        }
        po.finalize().await?;
        Ok(seen)
    });
    let results = tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    let seen: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(seen.len(), 2);
    for (me, servers, who, workers) in seen {
        assert_eq!(
            servers,
            vec![(8, 8, Bytes::from("cba")), (10, 8, Bytes::from("cba"))]
        );
        let me_text = Bytes::from(me.to_string());
        assert_eq!(
            who,
            vec![(8, WHO_ASKS, me_text.clone()), (10, WHO_ASKS, me_text)]
        );
        // A group means every member but the requester.
        let other = if me == 9 { 11 } else { 9 };
        assert_eq!(workers, vec![(other, 2, Bytes::from("yx"))]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_names_the_server_whose_handler_failed() {
    let cluster = LocalCluster::new(2, 2);
    let run = cluster.run(|po| async move {
        let me = po.my_id();
        // Server 10 knows no command 13 and panics on 14; server 8 answers everything.
        let app = SimpleApp::new(&po, 0, 0, move |sender, head, body| match (me, head) {
            (10, 13) => Err(format!("no command {head}")),
            (10, 14) => panic!("command 14 is a bug"),
            _ => echo(sender, head, body),
        })
        .await?;
        let mut outcomes = Vec::new();
        if po.role() == Role::Worker {
            for head in [13, 14] {
                let id = app
                    .request(node_ids::SERVER_GROUP, head, Bytes::new())
                    .await?;
                outcomes.push(app.wait(id).await);
            }
            // The handler task survives both.
            let id = app.request(10, 1, "ok".into()).await?;
            outcomes.push(app.wait(id).await);
        }
        po.finalize().await?;
        Ok(outcomes)
    });
    let results = tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    let workers: Vec<_> = results.into_iter().filter(|o| !o.is_empty()).collect();
    assert_eq!(workers.len(), 2);
    for outcomes in workers {
        let mut outcomes = outcomes.into_iter();
        for expected in ["no command 13", "the handler panicked"] {
            match outcomes.next().unwrap() {
                Err(e @ NodeError::Protocol { from: Some(10), .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("handler failed on server 10"), "{text}");
                    assert!(text.contains(expected), "{text}");
                }
                other => panic!("expected server 10's handler error, got {other:?}"),
            }
        }
        assert_eq!(
            outcomes.next().unwrap().unwrap(),
            vec![(10, 2, Bytes::from("ko"))]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_recipients_and_request_ids_fail_cleanly() {
    let cluster = LocalCluster::new(2, 2);
    let run = cluster.run(|po| async move {
        let app = SimpleApp::new(&po, 0, 0, echo).await?;
        let mut errors = Vec::new();
        match po.role() {
            Role::Worker => {
                for recipient in [99, 0, -4, po.my_id()] {
                    let outcome = app.request(recipient, 1, Bytes::new()).await;
                    errors.push((recipient, outcome.map(|_| ())));
                }
                errors.push((-1, app.wait(12_345).await.map(|_| ())));
            }
            Role::Scheduler => {
                // The scheduler's group has no member but itself: done at once, no answers.
                let id = app.request(node_ids::SCHEDULER, 1, Bytes::new()).await?;
                assert_eq!(app.wait(id).await?, vec![]);
            }
            Role::Server => {}
        }
        assert_eq!(app.pending(), 0);
        po.finalize().await?;
        Ok(errors)
    });
    let results = tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    let errors: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(errors.len(), 10);
    for (recipient, outcome) in errors {
        match outcome {
            Err(NodeError::InvalidArgument(text)) => {
                assert!(text.contains(&format!("node {recipient} ")), "{text}");
            }
            Err(NodeError::UnknownRequest(12_345)) if recipient == -1 => {}
            other => panic!("request to {recipient}: expected an error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_a_dead_server_fail_with_its_name() {
    let cluster = LocalCluster::new(1, 1);
    let run = cluster.run(|po| async move {
        match po.role() {
            Role::Server => {
                let die = Arc::new(Notify::new());
                let signal = Arc::clone(&die);
                let _app = SimpleApp::new(&po, 0, 0, move |_, _, _| {
                    // Wake the node from another thread (this runtime thread is blocked),
                    // and answer too late.
                    let die = Arc::clone(&signal);
                    std::thread::spawn(move || die.notify_one());
                    std::thread::sleep(Duration::from_millis(500));
                    Ok((0, Bytes::new()))
                })
                .await?;
                die.notified().await;
                po.stop().await; // the server dies with the request pending
                Ok(Vec::new())
            }
            Role::Worker => {
                let app = SimpleApp::new(&po, 0, 0, echo).await?;
                let id = app.request(8, 1, Bytes::new()).await?;
                let pending = app.wait(id).await.map(|_| ());
                let later = app.request(8, 1, Bytes::new()).await.map(|_| ());
                po.stop().await;
                Ok(vec![pending, later])
            }
            Role::Scheduler => {
                // The scheduler sees the server go too; its finalize barrier then fails.
                let _ = tokio::time::timeout(Duration::from_secs(20), po.finalize()).await;
                Ok(Vec::new())
            }
        }
    });
    let results = tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    let outcomes: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(outcomes.len(), 2);
    for outcome in outcomes {
        match outcome {
            Err(NodeError::NodeFailed { node: 8, role, .. }) => assert_eq!(role, "server"),
            other => panic!("expected server 8 to be reported dead, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_on_does_not_block_the_next_wait() {
    let outcome = LocalCluster::new(1, 1)
        .run(|po| async move {
            // The server answers after 300 ms.
            let app = SimpleApp::new(&po, 0, 0, |_, head, body| {
                std::thread::sleep(Duration::from_millis(300));
                Ok((head, body))
            })
            .await?;
            let mut outcome = None;
            if po.role() == Role::Worker {
                let id = app.request(8, 1, Bytes::from_static(b"x")).await?;
                let early = tokio::time::timeout(Duration::from_millis(20), app.wait(id)).await;
                assert!(early.is_err(), "the answer cannot be there yet");
                // The dropped wait must not count as a waiter any more.
                outcome = Some(app.wait(id).await?);
            }
            po.finalize().await?;
            Ok(outcome)
        })
        .await
        .unwrap();
    let answers = outcome.into_iter().flatten().next().unwrap();
    assert_eq!(answers, vec![(8, 1, Bytes::from_static(b"x"))]);
}
