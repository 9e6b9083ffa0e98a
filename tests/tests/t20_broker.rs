//! Multi-process tests of a three-node broker group: real `broker-node` processes on 127.0.0.1,
//! killed with SIGKILL, paused with SIGSTOP, restarted from their data dirs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::*;
use raftmq_tests::*;

const TOPIC: &str = "orders";
const QUEUES: u32 = 4;

async fn create_topic(c: &Cluster) {
    c.create_topic(TOPIC, QUEUES).await;
}

/// Every acknowledged (queue, offset, body) is on every node, and no body is stored twice.
/// Group `group` commits `offset` for queue `queue` of the topic at node `id`, which accepts it.
async fn commit_ok(c: &Cluster, id: u64, group: &str, queue: u32, offset: u64) {
    let r = c
        .client(id)
        .await
        .commit_offset(CommitOffsetRequest {
            group: group.into(),
            topic: TOPIC.into(),
            queue,
            offset,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok);
}

/// Waits up to 20 s until node `id` is a follower that has applied everything `leader` had
/// committed when called.
async fn caught_up_as_follower(c: &Cluster, id: u64, leader: u64, what: &str) {
    let target = c.status(leader).await.unwrap().committed;
    wait_for(what, Duration::from_secs(20), || async {
        let st = c.status(id).await?;
        (st.role == "follower" && st.applied >= target).then_some(())
    })
    .await;
}

/// Node `id`'s status of the topic's queue 0.
async fn queue0(c: &Cluster, id: u64) -> QueueStatus {
    c.status(id)
        .await
        .unwrap()
        .queues
        .into_iter()
        .find(|q| q.topic == TOPIC && q.queue == 0)
        .unwrap()
}

/// Node `id`'s answer to group `group`'s fetch of its offset in queue `queue` of the topic.
async fn fetch(c: &Cluster, id: u64, group: &str, queue: u32) -> FetchOffsetResponse {
    c.client(id)
        .await
        .fetch_offset(FetchOffsetRequest {
            group: group.into(),
            topic: TOPIC.into(),
            queue,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Waits up to `secs` seconds until node `id` has applied `target`.
async fn wait_applied(c: &Cluster, id: u64, target: u64, what: &str, secs: u64) {
    wait_for(what, Duration::from_secs(secs), || async {
        let st = c.status(id).await?;
        (st.applied >= target).then_some(())
    })
    .await;
}

/// One pull of up to `max_messages` from `offset` of the topic's queue 0.
async fn pull0(
    cl: &mut BrokerServiceClient<tonic::transport::Channel>,
    offset: u64,
    max_messages: u32,
) -> PullResponse {
    cl.pull(PullRequest {
        topic: TOPIC.into(),
        queue: 0,
        offset,
        max_messages,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Three nodes started with `args`, the topic created; and the leader.
async fn start_with_topic(args: &[&str]) -> (Cluster, u64) {
    let c = Cluster::start(3, args).await;
    create_topic(&c).await;
    let leader = c.leader().await;
    (c, leader)
}

async fn check_everywhere(c: &Cluster, acked: &BTreeMap<(u32, u64), Vec<u8>>) {
    for id in c.nodes.keys() {
        let addr = &c.nodes[id].addr;
        let mut bodies = BTreeSet::new();
        let mut held = BTreeMap::new();
        for q in 0..QUEUES {
            for (off, body) in read_queue(addr, TOPIC, q).await.unwrap() {
                assert!(
                    bodies.insert(body.clone()),
                    "node {id}: body {:?} stored twice",
                    String::from_utf8_lossy(&body)
                );
                held.insert((q, off), body);
            }
        }
        for (k, body) in acked {
            assert_eq!(
                held.get(k),
                Some(body),
                "node {id}: acknowledged message at {k:?} missing or different"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t21_leader_sigkill_under_load_loses_nothing_and_offsets_survive() {
    let (mut c, leader) = start_with_topic(&[]).await;
    // A consumer group commits an offset before the failover.
    commit_ok(&c, leader, "g1", 2, 0).await;

    let mut p = TestProducer::new(42, c.addrs());
    let mut acked = BTreeMap::new();
    let mut outage = Duration::ZERO;
    let mut killed_at = None;
    for i in 0..120u32 {
        if i == 60 {
            c.kill(leader);
            killed_at = Some(Instant::now());
        }
        let q = i % QUEUES;
        let bodies: Vec<Vec<u8>> = (0..5)
            .map(|j| format!("p42-{i}-{j}").into_bytes())
            .collect();
        match p
            .send(TOPIC, q, bodies.clone(), Duration::from_secs(15))
            .await
        {
            SendOutcome::Acked(r) => {
                if let Some(t) = killed_at.take() {
                    outage = t.elapsed();
                }
                for (res, body) in r.results.iter().zip(bodies) {
                    assert_eq!(res.queue, q);
                    acked.insert((q, res.offset), body);
                }
            }
            SendOutcome::Failed(e) => panic!("send {i} failed: {e}"),
        }
    }
    eprintln!("producer outage after leader SIGKILL: {outage:?}");
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);
    let r = fetch(&c, new_leader, "g1", 2).await;
    assert!(r.found, "consumer-group offset survived the failover");

    // The old leader restarts from its data dir, rejoins as follower and converges.
    c.spawn(leader);
    caught_up_as_follower(
        &c,
        leader,
        new_leader,
        "the old leader catches up as follower",
    )
    .await;
    check_everywhere(&c, &acked).await;
    assert_eq!(acked.len(), 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t22_follower_sigkill_sends_and_pulls_go_on_and_it_catches_up() {
    let (mut c, leader) = start_with_topic(&[]).await;
    let follower = *c.nodes.keys().find(|id| **id != leader).unwrap();
    c.kill(follower);
    let mut p = TestProducer::new(7, vec![c.nodes[&leader].addr.clone()]);
    let mut acked = BTreeMap::new();
    for i in 0..40u32 {
        let body = format!("f-{i}").into_bytes();
        match p
            .send(
                TOPIC,
                i % QUEUES,
                vec![body.clone()],
                Duration::from_secs(10),
            )
            .await
        {
            SendOutcome::Acked(r) => {
                acked.insert((i % QUEUES, r.results[0].offset), body);
            }
            SendOutcome::Failed(e) => panic!("send with one follower down failed: {e}"),
        }
    }
    let got = read_queue(&c.nodes[&leader].addr, TOPIC, 0).await.unwrap();
    assert_eq!(got.len(), 10, "pulls go on with a follower down");
    c.spawn(follower);
    let target = c.status(leader).await.unwrap().committed;
    wait_applied(&c, follower, target, "the follower catches up", 20).await;
    check_everywhere(&c, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t23_bad_input_gets_clear_errors_and_loses_nothing() {
    let c = Cluster::start(3, &[]).await;
    create_topic(&c).await;
    let leader = c.leader().await;
    let mut cl = c.client(leader).await;
    let send = |topic: &str, queue: u32, messages: Vec<Message>| SendRequest {
        topic: topic.into(),
        queue,
        messages,
        ..Default::default()
    };
    let ok = cl
        .send(send(
            TOPIC,
            0,
            vec![Message {
                body: b"keep me".to_vec().into(),
                ..Default::default()
            }],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&ok.error), ErrorCode::Ok);

    let cases: Vec<(SendRequest, ErrorCode)> = vec![
        (
            send("bad topic!", 0, vec![Message::default()]),
            ErrorCode::InvalidArgument,
        ),
        (
            send("nope", 0, vec![Message::default()]),
            ErrorCode::TopicNotFound,
        ),
        (
            send(TOPIC, 99, vec![Message::default()]),
            ErrorCode::InvalidArgument,
        ),
        (send(TOPIC, 0, vec![]), ErrorCode::InvalidArgument),
        (
            send(
                TOPIC,
                0,
                vec![Message {
                    body: vec![0; (4 << 20) + 1].into(),
                    ..Default::default()
                }],
            ),
            ErrorCode::MessageTooLarge,
        ),
        (
            send(TOPIC, 0, vec![Message::default(); 1001]),
            ErrorCode::MessageTooLarge,
        ),
        (
            send(
                TOPIC,
                0,
                vec![
                    Message {
                        body: vec![0; 1 << 20].into(),
                        ..Default::default()
                    };
                    5
                ],
            ),
            ErrorCode::MessageTooLarge,
        ),
    ];
    for (req, want) in cases {
        let r = cl.send(req).await.unwrap().into_inner();
        assert_eq!(code(&r.error), want, "{:?}", r.error);
        assert!(!r.error.as_ref().unwrap().message.is_empty());
    }
    let r = pull0(&mut cl, 50, 10).await;
    assert_eq!(code(&r.error), ErrorCode::OffsetOutOfRange);
    let r = cl
        .create_topic(CreateTopicRequest {
            name: "x".into(),
            queues: 5000,
            update: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::InvalidArgument);
    let follower = *c.nodes.keys().find(|id| **id != leader).unwrap();
    let r = c
        .client(follower)
        .await
        .send(send(TOPIC, 0, vec![Message::default()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::NotLeader);
    assert_eq!(r.error.unwrap().leader.unwrap().node_id, leader);

    // Garbage bytes on the port: the node keeps serving.
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xffu8; 4096][..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04garbage",
    ] {
        if let Ok(mut s) = std::net::TcpStream::connect(&c.nodes[&leader].addr) {
            let _ = s.write_all(junk);
        }
    }
    let got = read_queue(&c.nodes[&leader].addr, TOPIC, 0).await.unwrap();
    assert_eq!(got, vec![(0, b"keep me".to_vec())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t24_all_nodes_killed_and_restarted_keep_every_message_and_offset() {
    let (mut c, leader) = start_with_topic(&[]).await;
    let mut p = TestProducer::new(9, c.addrs());
    let mut acked = BTreeMap::new();
    for i in 0..30u32 {
        let bodies: Vec<Vec<u8>> = (0..3).map(|j| format!("r-{i}-{j}").into_bytes()).collect();
        let SendOutcome::Acked(r) = p
            .send(TOPIC, i % QUEUES, bodies.clone(), Duration::from_secs(10))
            .await
        else {
            panic!("send failed")
        };
        for (res, b) in r.results.iter().zip(bodies) {
            acked.insert((i % QUEUES, res.offset), b);
        }
    }
    commit_ok(&c, leader, "g", 1, 17).await;
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        c.spawn(id);
    }
    let leader = c.leader().await;
    let applied_all = c.status(leader).await.unwrap().committed;
    for id in 1..=3u64 {
        wait_applied(&c, id, applied_all, "every node re-applies its log", 20).await;
    }
    check_everywhere(&c, &acked).await;
    for id in 1..=3u64 {
        let r = fetch(&c, id, "g", 1).await;
        assert_eq!((r.found, r.offset), (true, 17), "node {id}");
    }
}

/// t25's pull from the start of queue 0 as consumer `consumer`.
fn hint_pull(consumer: &str) -> PullRequest {
    PullRequest {
        topic: TOPIC.into(),
        queue: 0,
        offset: 0,
        max_messages: 10,
        consumer_id: consumer.into(),
        ..Default::default()
    }
}

/// t25's round: 50 messages acknowledged in queue 0 (the leader stays loaded), then 8 pulls from
/// `leader` as consumers `{prefix}0` to `{prefix}7`.
async fn load_and_pull(
    c: &Cluster,
    p: &mut TestProducer,
    leader: u64,
    prefix: &str,
) -> Vec<PullResponse> {
    let SendOutcome::Acked(_) = p
        .send(TOPIC, 0, vec![b"load".to_vec(); 50], Duration::from_secs(5))
        .await
    else {
        panic!()
    };
    let mut replies = Vec::new();
    for i in 0..8 {
        replies.push(
            c.client(leader)
                .await
                .pull(hint_pull(&format!("{prefix}{i}")))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t25_read_hint_sends_consumers_to_caught_up_followers_only() {
    // A threshold of 1 msg/s makes the leader count as loaded as soon as anything is produced.
    let (mut c, leader) = start_with_topic(&["--leader-busy-msgs-per-sec", "1"]).await;
    let mut p = TestProducer::new(5, vec![c.nodes[&leader].addr.clone()]);
    // Keep the leader loaded until a pull from it is redirected.
    let followers: BTreeSet<u64> = c.nodes.keys().copied().filter(|id| *id != leader).collect();
    let mut suggested = BTreeSet::new();
    let t = Instant::now();
    while suggested.len() < 2 && t.elapsed() < Duration::from_secs(20) {
        for r in load_and_pull(&c, &mut p, leader, "c").await {
            assert_eq!(r.served_by.as_ref().unwrap().node_id, leader);
            let s = r.suggested.unwrap().node_id;
            if s != leader {
                suggested.insert(s);
            }
        }
    }
    assert_eq!(
        suggested, followers,
        "a loaded leader spreads consumers over both caught-up followers"
    );

    // A paused follower is never suggested once it has been silent for an election timeout.
    let paused = *followers.iter().next().unwrap();
    c.pause(paused);
    // Wait until the leader itself sees the paused follower silent past the election timeout.
    wait_for(
        "the leader sees the paused follower silent",
        Duration::from_secs(10),
        || async {
            let st = c.status(leader).await?;
            let timeout = st.read_hint.as_ref()?.election_timeout_ms;
            let peer = st.peers.iter().find(|p| p.node_id == paused)?;
            peer.last_ack_ms.is_none_or(|ms| ms > timeout).then_some(())
        },
    )
    .await;
    for round in 0..5 {
        for r in load_and_pull(&c, &mut p, leader, &format!("c{round}-")).await {
            assert_ne!(
                r.suggested.unwrap().node_id,
                paused,
                "paused follower suggested"
            );
        }
    }
    c.resume(paused);

    // A follower that lost its leader sends consumers back to... no leader; one with a leader that is
    // cut off (the leader paused) suggests the leader only while it still believes in it. Here: a
    // follower serving a consumer at its end with nothing pending suggests itself.
    let other = *followers.iter().nth(1).unwrap();
    let end = queue0(&c, other).await.max_offset;
    let r = c
        .client(other)
        .await
        .pull(PullRequest {
            offset: end,
            ..hint_pull("tail")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.served_by.unwrap().node_id, other);
    assert_eq!(r.suggested.unwrap().node_id, other, "{}", r.suggest_reason);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t26_wiped_follower_rejoins_and_holds_every_message() {
    let (mut c, leader) = start_with_topic(&[]).await;
    let mut p = TestProducer::new(11, c.addrs());
    let mut acked = BTreeMap::new();
    for i in 0..40u32 {
        let body = format!("w-{i}").into_bytes();
        let SendOutcome::Acked(r) = p
            .send(
                TOPIC,
                i % QUEUES,
                vec![body.clone()],
                Duration::from_secs(10),
            )
            .await
        else {
            panic!("send failed")
        };
        acked.insert((i % QUEUES, r.results[0].offset), body);
    }
    let follower = *c.nodes.keys().find(|id| **id != leader).unwrap();
    c.kill(follower);
    std::fs::remove_dir_all(c.data_dir(follower)).unwrap();
    c.spawn(follower);
    caught_up_as_follower(&c, follower, leader, "the wiped follower catches up").await;
    check_everywhere(&c, &acked).await;
}

/// On a failed wait, prints what the node logged about retention.
struct Diag<'a>(&'a Cluster, u64);
impl Drop for Diag<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for l in self.0.node_log(self.1).lines().filter(|l| {
                l.contains("retention") || l.contains("compaction") || l.contains("ERROR")
            }) {
                eprintln!("node {}: {l}", self.1);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t27_retention_trims_old_segments_everywhere_and_a_wiped_follower_still_rejoins() {
    // 1 MiB segments, a one-second maximum age, checked every 300 ms.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("node.toml");
    std::fs::write(
        &conf,
        "[raft]\nsegment_bytes_max = 1048576\ncheckpoint_every_entries = 4\n[retention]\nmax_age_secs = 1\ncheck_interval_ms = 300\n",
    )
    .unwrap();
    let mut c = Cluster::start(3, &["--config", conf.to_str().unwrap()]).await;
    create_topic(&c).await;
    let mut p = TestProducer::new(13, c.addrs());
    let mut acked = BTreeMap::new();
    for i in 0..40u32 {
        let bodies: Vec<Vec<u8>> = (0..10)
            .map(|j| format!("{i:04}-{j:02}-").repeat(800).into_bytes())
            .collect();
        let r = match p
            .send(TOPIC, 0, bodies.clone(), Duration::from_secs(10))
            .await
        {
            SendOutcome::Acked(r) => r,
            SendOutcome::Failed(e) => panic!("send {i} failed: {e}"),
        };
        for (res, b) in r.results.iter().zip(bodies) {
            acked.insert(res.offset, b);
        }
    }
    // Every node trims: the queue's min offset rises and old segment files are deleted.
    for id in 1..=3u64 {
        let _diag = Diag(&c, id);
        wait_for(
            "retention trims every node",
            Duration::from_secs(30),
            || async {
                let st = c.status(id).await?;
                let q = st
                    .queues
                    .iter()
                    .find(|q| q.topic == TOPIC && q.queue == 0)?;
                // Segment files are named by their first index: the oldest one must be gone.
                let oldest = std::fs::read_dir(c.data_dir(id).join("log"))
                    .ok()?
                    .filter_map(|e| {
                        e.ok()?
                            .file_name()
                            .to_str()?
                            .strip_suffix(".log")?
                            .parse::<u64>()
                            .ok()
                    })
                    .min()?;
                (q.min_offset > 0 && oldest > 1).then_some(())
            },
        )
        .await;
    }
    let leader = c.leader().await;
    let min = queue0(&c, leader).await.min_offset;
    let r = pull0(&mut c.client(leader).await, 0, 1).await;
    assert_eq!(
        code(&r.error),
        ErrorCode::OffsetOutOfRange,
        "trimmed offsets are out of range"
    );
    for id in 1..=3u64 {
        let mut cl = c.client(id).await;
        let r = pull0(&mut cl, min, 5).await;
        if code(&r.error) == ErrorCode::OffsetOutOfRange && r.min_offset > min {
            continue; // trimmed further meanwhile (max age 1 s)
        }
        assert_eq!(code(&r.error), ErrorCode::Ok, "node {id}: {:?}", r.error);
        for m in &r.messages {
            assert_eq!(
                Some(&m.body.to_vec()),
                acked.get(&m.offset),
                "node {id} offset {}",
                m.offset
            );
        }
    }
    // A wiped follower installs the snapshot (a checkpoint at or below the trim point) and then
    // replicates every retained entry, so it serves every retained message itself.
    let follower = *c.nodes.keys().find(|id| **id != leader).unwrap();
    c.kill(follower);
    std::fs::remove_dir_all(c.data_dir(follower)).unwrap();
    c.spawn(follower);
    let target = c.status(leader).await.unwrap().committed;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        if c.status(follower)
            .await
            .is_some_and(|st| st.applied >= target)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if t.elapsed() >= Duration::from_secs(15) {
        eprintln!(
            "LEADER LOG\n{}\nFOLLOWER LOG\n{}",
            c.node_log(leader),
            c.node_log(follower)
        );
        eprintln!("{:?}", c.status(follower).await);
    }
    wait_applied(&c, follower, target, "the wiped follower catches up", 30).await;
    let mut cl = c.client(follower).await;
    let mut offset = min;
    let end = *acked.keys().last().unwrap() + 1;
    while offset < end {
        let r = pull0(&mut cl, offset, 50).await;
        // Retention keeps trimming as segments age (max age 1 s): skip what it trimmed meanwhile.
        if code(&r.error) == ErrorCode::OffsetOutOfRange && r.min_offset > offset {
            offset = r.min_offset;
            continue;
        }
        assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
        assert!(
            !r.messages.is_empty(),
            "the wiped follower holds every retained message (offset {offset})"
        );
        for m in &r.messages {
            assert_eq!(Some(&m.body.to_vec()), acked.get(&m.offset));
        }
        offset = r.next_offset;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t28_preferred_leader_takes_leadership_back_once_caught_up() {
    async fn until_leader_is(c: &Cluster, want: u64) {
        wait_for(
            "the preferred node leads",
            Duration::from_secs(20),
            || async { (c.leader().await == want).then_some(()) },
        )
        .await
    }
    let mut c = Cluster::start(3, &["--preferred-leader", "2"]).await;
    until_leader_is(&c, 2).await;
    c.kill(2);
    let other = c.leader().await;
    assert_ne!(other, 2);
    c.spawn(2);
    until_leader_is(&c, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t29_paused_leader_steps_down_and_acknowledges_nothing_it_cannot_commit() {
    let mut c = Cluster::start(3, &[]).await;
    create_topic(&c).await;
    let old = c.leader().await;
    let old_addr = c.nodes[&old].addr.clone();
    c.pause(old);
    // A send to the paused leader waits in its socket while the others elect a new leader.
    let stale = tokio::spawn(async move {
        let mut cl = connect(&old_addr).await;
        let req = SendRequest {
            topic: TOPIC.into(),
            queue: 0,
            messages: vec![Message {
                body: b"to-the-paused-leader".to_vec().into(),
                ..Default::default()
            }],
            producer_id: 77,
            sequence: 1,
            ..Default::default()
        };
        cl.send(req).await.map(|r| r.into_inner())
    });
    let new = c.leader().await;
    assert_ne!(new, old);
    let mut p = TestProducer::new(78, vec![c.nodes[&new].addr.clone()]);
    let mut acked = BTreeMap::new();
    for i in 0..10u32 {
        let body = format!("new-{i}").into_bytes();
        let SendOutcome::Acked(r) = p
            .send(TOPIC, 0, vec![body.clone()], Duration::from_secs(10))
            .await
        else {
            panic!("the new leader does not acknowledge")
        };
        acked.insert((0, r.results[0].offset), body);
    }
    c.resume(old);
    wait_for(
        "the old leader steps down",
        Duration::from_secs(10),
        || async { (c.status(old).await?.role == "follower").then_some(()) },
    )
    .await;
    // Whatever the paused leader answered, it acknowledged nothing the group did not commit.
    if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(10), stale)
        .await
        .map(|j| j.unwrap())
        && code(&r.error) == ErrorCode::Ok
    {
        acked.insert((0, r.results[0].offset), b"to-the-paused-leader".to_vec());
    }
    let target = c.status(new).await.unwrap().committed;
    wait_applied(&c, old, target, "the old leader converges", 10).await;
    check_everywhere(&c, &acked).await;
}

/// 210. A producer spreading over many topics sends each round's batches to the group in one call,
///     stored by one log entry (`SendMany`): every message is read back from every node at the
///     offset and under the id its receipt named, a message in the middle of such an entry is
///     found by its id, and all of it holds after the leader is killed with SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t210_batches_to_many_topics_in_one_entry_read_back_everywhere() {
    let mut c = Cluster::start(3, &[]).await;
    let topics: Vec<String> = (0..40).map(|i| format!("many-{i}")).collect();
    for t in &topics {
        c.create_topic(t, 2).await;
    }
    let producer = raftmq_client::Producer::builder(&c.nameserver)
        .build()
        .unwrap();
    // 1,200 sends in flight at once, round robin over the topics.
    let producer = std::sync::Arc::new(producer);
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..1200 {
        let topic = topics[i % topics.len()].clone();
        let p = producer.clone();
        sends.spawn(async move {
            let body = format!("many-{i}");
            let r = p
                .send(&topic, raftmq_client::Message::new(body.clone()))
                .await
                .unwrap_or_else(|e| panic!("send {i} to {topic}: {e}"));
            (topic, body, r)
        });
    }
    let receipts = sends.join_all().await;
    // Entries that hold more than one topic's messages: the calls were folded.
    // A raftmq id is `BROKER-INDEX-POSITION`.
    let index_position = |id: &str| {
        let mut it = id.rsplitn(3, '-');
        let position = it.next().unwrap().to_string();
        (it.next().unwrap().to_string(), position)
    };
    let mut topics_of_entry: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (topic, _, r) in &receipts {
        let (index, _) = index_position(&r.msg_id);
        topics_of_entry
            .entry(index)
            .or_default()
            .insert(topic.clone());
    }
    let shared = topics_of_entry.values().filter(|t| t.len() > 1).count();
    assert!(
        shared > 0,
        "no entry holds more than one topic's messages ({} entries)",
        topics_of_entry.len()
    );
    println!(
        "1,200 messages over {} topics in {} entries, {shared} of them holding several topics",
        topics.len(),
        topics_of_entry.len()
    );
    // A message after the first of an entry that holds several topics.
    let (probe_topic, probe_body, probe) = receipts
        .iter()
        .find(|(_, _, r)| {
            let (index, position) = index_position(&r.msg_id);
            position != "0000" && topics_of_entry[&index].len() > 1
        })
        .cloned()
        .expect("a message after the first of a shared entry");

    let check = |c: &Cluster, killed: Option<u64>, what: &'static str| {
        let ids: Vec<u64> = c
            .nodes
            .keys()
            .copied()
            .filter(|id| Some(*id) != killed)
            .collect();
        let addrs: Vec<String> = ids.iter().map(|id| c.nodes[id].addr.clone()).collect();
        let receipts = &receipts;
        async move {
            for addr in &addrs {
                let mut held = BTreeMap::new();
                for t in 0..40 {
                    let topic = format!("many-{t}");
                    for q in 0..2 {
                        for m in read_stored(addr, &topic, q).await.unwrap() {
                            held.insert((topic.clone(), q, m.offset), (m.body.to_vec(), m.msg_id));
                        }
                    }
                }
                assert_eq!(
                    held.len(),
                    receipts.len(),
                    "{what}: {addr} holds {} messages",
                    held.len()
                );
                for (topic, body, r) in receipts {
                    let got = held.get(&(topic.clone(), r.queue, r.offset));
                    assert_eq!(
                        got,
                        Some(&(body.as_bytes().to_vec(), r.msg_id.clone())),
                        "{what}: {addr}: {topic} queue {} offset {}",
                        r.queue,
                        r.offset
                    );
                }
            }
        }
    };
    check(&c, None, "before the kill").await;

    let find = |addr: String| {
        let (topic, id) = (probe_topic.clone(), probe.msg_id.clone());
        async move {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy();
            raftmq_proto::v1::inspect_service_client::InspectServiceClient::new(ch)
                .find_messages(FindMessagesRequest {
                    topic,
                    by: Some(find_messages_request::By::MsgId(id)),
                    limit: 0,
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let leader = c.leader().await;
    let found = find(c.nodes[&leader].addr.clone()).await;
    assert_eq!(found.messages.len(), 1, "{found:?}");
    assert_eq!(found.messages[0].body, probe_body.as_bytes());
    assert_eq!(
        (found.messages[0].queue, found.messages[0].offset),
        (probe.queue, probe.offset)
    );

    c.kill(leader);
    let next = c.new_leader_after(leader).await;
    let found = find(c.nodes[&next].addr.clone()).await;
    assert_eq!(found.messages.len(), 1, "after the kill: {found:?}");
    assert_eq!(found.messages[0].msg_id, probe.msg_id);
    check(&c, Some(leader), "after the leader's SIGKILL").await;
}

/// One send at a time with `raft.commit_notice_hold_us = 2000`: the leader folds each send's
/// commit notice into the next send's append (`raftmq_raft_commit_notices_folded_total` grows),
/// the hop histograms behind `bench produce --inflight 1` move on the leader and on both
/// followers, and both followers still apply the last send, whose notice has no append to ride
/// on, and hold every message. The followers flush such lone appends inline, on the Raft task
/// (`raftmq_log_inline_flush_rounds_total` grows), the leader never its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t211_one_at_a_time_commit_notices_ride_on_the_next_append_and_followers_apply_all() {
    const SENDS: u32 = 200;
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("node.toml");
    std::fs::write(&conf, "[raft]\ncommit_notice_hold_us = 2000\n").unwrap();
    let (c, leader) = start_with_topic(&["--config", conf.to_str().unwrap()]).await;
    let addr = |id: u64| c.nodes[&id].addr.clone();
    let count = |text: &str, name: &str| metric(text, name).unwrap_or(0.0);
    let before = metrics(&addr(leader)).await;
    let mut cl = c.client(leader).await;
    let mut acked = BTreeMap::new();
    for i in 0..SENDS {
        let body = format!("one-{i}").into_bytes();
        let req = send_request(11, i as u64 + 1, TOPIC, 0, vec![body.clone()]);
        let r = cl.send(req).await.unwrap().into_inner();
        assert_eq!(code(&r.error), ErrorCode::Ok, "send {i}: {:?}", r.error);
        acked.insert((0, r.results[0].offset), body);
    }
    let after = metrics(&addr(leader)).await;
    let inline = "raftmq_log_inline_flush_rounds_total";
    assert_eq!(
        count(&after, inline) - count(&before, inline),
        0.0,
        "the leader flushed its own appends inline (they must run alongside replication)"
    );
    let folded = count(&after, "raftmq_raft_commit_notices_folded_total")
        - count(&before, "raftmq_raft_commit_notices_folded_total");
    // Each of two followers could fold up to SENDS - 1 notices; a slow machine lets some holds
    // run out, so ask for a tenth.
    assert!(
        folded >= (SENDS / 10) as f64,
        "only {folded} commit notices folded over {SENDS} sends one at a time"
    );
    let replicated = count(&after, "raftmq_raft_replicate_seconds_count")
        - count(&before, "raftmq_raft_replicate_seconds_count");
    // An ack waits for one follower: the other's answers to the last appends may still be on
    // their way.
    assert!(
        replicated >= (SENDS + SENDS / 2) as f64,
        "{replicated} appends timed"
    );
    for id in c.nodes.keys().copied().filter(|id| *id != leader) {
        caught_up_as_follower(&c, id, leader, "a follower applies the last send").await;
        let text = metrics(&addr(id)).await;
        let appended = count(&text, "raftmq_raft_append_seconds_count");
        // A follower that falls behind for a moment gets two sends' entries in one append (a full
        // run saw 182 for 200 sends), so ask for half.
        assert!(
            appended >= (SENDS / 2) as f64,
            "follower {id}: {appended} appends timed"
        );
        // One at a time, a follower's appends come far enough apart to be flushed inline; a slow
        // moment may send some to the flusher thread, so ask for a tenth.
        let inlined = count(&text, inline);
        assert!(
            inlined >= (SENDS / 10) as f64,
            "follower {id}: only {inlined} of {SENDS} lone appends flushed inline"
        );
    }
    check_everywhere(&c, &acked).await;
}
