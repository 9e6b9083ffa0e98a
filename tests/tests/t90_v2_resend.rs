//! A RocketMQ 5 client's retry of a send (a new SendMessage call with the same message id, as
//! every official client makes when a call times out) is stored once, on a real three-node group
//! through `apache.rocketmq.v2.MessagingService`, with the calls made by hand so each retry is
//! exactly the one the test means.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use raftmq_rocketmq_v2::pb;
use raftmq_rocketmq_v2::pb::messaging_service_client::MessagingServiceClient;
use raftmq_tests::*;
use tonic::transport::Channel;

const QUEUES: u32 = 4;

fn v2_client(addr: &str) -> MessagingServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    MessagingServiceClient::new(ch)
}

fn message(topic: &str, id: &str) -> pb::Message {
    pb::Message {
        topic: Some(pb::Resource {
            resource_namespace: String::new(),
            name: topic.into(),
        }),
        user_properties: Default::default(),
        system_properties: Some(pb::SystemProperties {
            message_id: id.into(),
            body_encoding: pb::Encoding::Identity as i32,
            message_type: pb::MessageType::Normal as i32,
            born_host: "t90".into(),
            ..Default::default()
        }),
        body: format!("body of {id}").into_bytes(),
    }
}

/// One SendMessage call of `id` with a `deadline` (as the clients set it): the stored offset, or
/// what failed.
async fn send(
    c: &mut MessagingServiceClient<Channel>,
    topic: &str,
    id: &str,
    deadline: Duration,
) -> Result<i64, String> {
    let mut req = tonic::Request::new(pb::SendMessageRequest {
        messages: vec![message(topic, id)],
    });
    req.set_timeout(deadline);
    req.metadata_mut()
        .insert("x-mq-client-id", "t90-producer".parse().unwrap());
    let r = c
        .send_message(req)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    let st = r.status.unwrap_or_default();
    if st.code != pb::Code::Ok as i32 {
        return Err(format!("{} {}", st.code, st.message));
    }
    Ok(r.entries[0].offset)
}

/// How many times each body is stored, over every queue of `topic`, read from `addr`.
async fn stored(addr: &str, topic: &str) -> Result<BTreeMap<String, usize>, String> {
    let mut n = BTreeMap::new();
    for q in 0..QUEUES {
        for (_, body) in read_queue(addr, topic, q).await? {
            *n.entry(String::from_utf8_lossy(&body).into_owned())
                .or_default() += 1;
        }
    }
    Ok(n)
}

/// 91. A send stored whose reply was lost, sent again: the retry gets the first one's offset
///     and the message is stored once; a message with a new id is stored as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_retry_of_a_stored_send_gets_the_same_offset() {
    let topic = "v2-resend";
    let c = Cluster::start(3, &[]).await;
    c.create_topic(topic, QUEUES).await;
    let leader = c.leader().await;
    let follower = *c.nodes.keys().find(|id| **id != leader).unwrap();
    let mut v2 = v2_client(&c.nodes[&follower].addr);
    let long = Duration::from_secs(10);

    let first = send(&mut v2, topic, "ID-A", long).await.unwrap();
    let again = send(&mut v2, topic, "ID-A", long).await.unwrap();
    assert_eq!(again, first, "the retry answers with the stored offset");
    send(&mut v2, topic, "ID-B", long).await.unwrap();

    let n = stored(&c.nodes[&leader].addr, topic).await.unwrap();
    assert_eq!(n.get("body of ID-A"), Some(&1), "stored: {n:?}");
    assert_eq!(n.get("body of ID-B"), Some(&1), "stored: {n:?}");
    assert_eq!(n.values().sum::<usize>(), 2, "stored: {n:?}");
}

/// 92. The leader is SIGSTOPped under a send, so the client's calls time out (1 s deadline) and
///     it sends the same message again and again, as the official clients do, until one call
///     answers after the group elected another leader: the message is stored exactly once, and
///     every answer names the same offset. The stopped node is then resumed and agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t92_retries_through_a_frozen_leader_store_one_copy() {
    let topic = "v2-resend-freeze";
    let mut c = Cluster::start(3, &[]).await;
    c.create_topic(topic, QUEUES).await;
    // A settled group (every member has heard from the others), so the leader found next is
    // still the leader when it is frozen: a boot-time election that moved it after the lookup
    // once let the first call succeed at once.
    c.wait_feature_levels(Duration::from_secs(20))
        .await
        .unwrap();
    let leader = c.leader().await;
    let follower = *c.nodes.keys().find(|id| **id != leader).unwrap();
    let mut v2 = v2_client(&c.nodes[&follower].addr);
    // A warm-up send, so the front knows its route and the leader.
    send(&mut v2, topic, "ID-WARM", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        c.leader().await,
        leader,
        "the leader moved during the warm-up"
    );

    c.pause(leader);
    let t0 = Instant::now();
    let mut attempts = Vec::new();
    let offset = loop {
        let r = send(&mut v2, topic, "ID-FROZEN", Duration::from_secs(1)).await;
        attempts.push((t0.elapsed(), r.clone()));
        match r {
            Ok(o) => break o,
            Err(_) if t0.elapsed() < Duration::from_secs(40) => {}
            Err(e) => panic!("no attempt succeeded in 40 s; the last: {e}; {attempts:?}"),
        }
    };
    eprintln!("attempts of the send while the leader was frozen:");
    for (at, r) in &attempts {
        eprintln!("  {:>6} ms  {r:?}", at.as_millis());
    }
    assert!(
        attempts.len() >= 2,
        "the first call should time out while the leader is frozen: {attempts:?}"
    );
    // One more retry after success: the same offset again.
    let again = send(&mut v2, topic, "ID-FROZEN", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(again, offset);

    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);
    let n = stored(&c.nodes[&new_leader].addr, topic).await.unwrap();
    assert_eq!(n.get("body of ID-FROZEN"), Some(&1), "stored: {n:?}");

    c.resume(leader);
    wait_for(
        "the resumed node holds the same messages",
        Duration::from_secs(20),
        || {
            let addr = c.nodes[&leader].addr.clone();
            let want = n.clone();
            async move {
                match stored(&addr, topic).await {
                    Ok(got) if got == want => Ok(()),
                    Ok(got) => Err(format!("holds {got:?}")),
                    Err(e) => Err(e),
                }
            }
        },
    )
    .await;
}

/// 93. A retry through another node (the official clients send to any node of the route, and
///     retry elsewhere when one does not answer) is stored once as well: the group remembers
///     the ids it stored, as replicated state. A call of two messages, one of them stored
///     before, stores only the new one and answers the first copy's offset for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t93_retry_through_another_node_is_stored_once() {
    let topic = "v2-resend-elsewhere";
    let c = Cluster::start(3, &[]).await;
    c.create_topic(topic, QUEUES).await;
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let long = Duration::from_secs(10);
    let mut fronts = Vec::new();
    for id in &ids {
        fronts.push(v2_client(&c.nodes[id].addr));
    }
    // Every member must be known to apply the command first (the group's feature level).
    c.wait_feature_levels(Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let mut offsets = Vec::new();
    for f in fronts.iter_mut() {
        offsets.push(send(f, topic, "ID-X", long).await.unwrap());
    }
    assert!(
        offsets.iter().all(|o| *o == offsets[0]),
        "every node answers the first copy's offset: {offsets:?}"
    );

    let mut two = tonic::Request::new(pb::SendMessageRequest {
        messages: vec![message(topic, "ID-Y"), message(topic, "ID-X")],
    });
    two.set_timeout(long);
    let r = fronts[1].send_message(two).await.unwrap().into_inner();
    assert_eq!(r.status.unwrap_or_default().code, pb::Code::Ok as i32);
    assert_eq!(
        r.entries[1].offset, offsets[0],
        "ID-X: the first copy's offset"
    );

    let leader = c.leader().await;
    let n = stored(&c.nodes[&leader].addr, topic).await.unwrap();
    assert_eq!(n.get("body of ID-X"), Some(&1), "stored: {n:?}");
    assert_eq!(n.get("body of ID-Y"), Some(&1), "stored: {n:?}");
    assert_eq!(n.values().sum::<usize>(), 2, "stored: {n:?}");
}
