//! A local group of members for tests and benchmarks: each member has its own tokio runtime, so
//! dropping it ends every task and closes every socket at once, as a killed process would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::{Member, MemberConfig, RaftConfig, Role, StateMachine};

pub use crate::state_machine::NoState;

/// A state machine that records every payload it applied, in order.
#[derive(Default)]
pub struct Recorder {
    pub applied: Vec<(u64, Vec<u8>)>,
    /// Keep only the count (benchmarks), not the payloads.
    pub count_only: bool,
    pub count: u64,
}

impl StateMachine for Recorder {
    fn apply(&mut self, index: u64, _term: u64, payload: &[u8]) -> Bytes {
        self.count += 1;
        if !self.count_only {
            self.applied.push((index, payload.to_vec()));
        }
        Bytes::from(index.to_le_bytes().to_vec())
    }
    fn snapshot(&self) -> Vec<u8> {
        postcard::to_stdvec(&(&self.applied, self.count)).unwrap_or_default()
    }
    fn restore(&mut self, data: &[u8]) -> std::io::Result<()> {
        (self.applied, self.count) = postcard::from_bytes(data).map_err(std::io::Error::other)?;
        Ok(())
    }
}

pub struct LocalMember {
    pub member: Member<Recorder>,
    rt: Option<tokio::runtime::Runtime>,
}

impl LocalMember {
    /// Drops the member's runtime: every task stops and every socket closes with no hand-off.
    pub fn kill(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

pub struct LocalGroup {
    pub dir: PathBuf,
    pub addrs: BTreeMap<u64, String>,
    pub members: BTreeMap<u64, LocalMember>,
    pub raft: RaftConfig,
    pub count_only: bool,
}

impl LocalGroup {
    /// Starts `n` members on 127.0.0.1 with their data under `dir`.
    pub async fn start(n: u64, dir: &Path, raft: RaftConfig, count_only: bool) -> LocalGroup {
        let mut listeners = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        for id in 1..=n {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            addrs.insert(id, l.local_addr().expect("addr").to_string());
            listeners.insert(id, l);
        }
        let mut g = LocalGroup {
            dir: dir.to_path_buf(),
            addrs,
            members: BTreeMap::new(),
            raft,
            count_only,
        };
        for id in 1..=n {
            let l = listeners.remove(&id);
            g.spawn(id, l).await;
        }
        g
    }

    /// Starts (or restarts from its data dir) member `id`.
    pub async fn spawn(&mut self, id: u64, listener: Option<std::net::TcpListener>) {
        let cfg = MemberConfig {
            cluster: "DefaultCluster".into(),
            broker: "broker-a".into(),
            node_id: id,
            initial_members: self.addrs.clone(),
            peer_routes: Default::default(),
            data_dir: self.dir.join(format!("n{id}")),
            raft: self.raft.clone(),
            tls: None,
        };
        let listener = listener
            .unwrap_or_else(|| std::net::TcpListener::bind(&self.addrs[&id]).expect("rebind"));
        listener.set_nonblocking(true).expect("nonblocking");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let count_only = self.count_only;
        let member = rt
            .spawn(async move {
                // A killed member's runtime drops its tasks in the background; wait until its
                // metadata store lock is released before reopening the same data dir.
                let mut tries = 0;
                let member = loop {
                    let sm = Recorder {
                        count_only,
                        ..Recorder::default()
                    };
                    match Member::start(cfg.clone(), sm).await {
                        Ok(m) => break m,
                        Err(e) if tries < 100 && e.chain().contains("lock") => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("start member: {}", e.chain()),
                    }
                };
                let svc = member.peer_service();
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                tokio::spawn(async move {
                    let _ = tonic::transport::Server::builder()
                        .add_service(svc)
                        .serve_with_incoming(crate::network::incoming_nodelay(listener))
                        .await;
                });
                member
            })
            .await
            .expect("member task");
        self.members.insert(
            id,
            LocalMember {
                member,
                rt: Some(rt),
            },
        );
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(m) = self.members.remove(&id) {
            m.kill();
        }
    }

    /// The one member that leads, when exactly one does.
    pub fn leader(&self) -> Option<u64> {
        let l: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, m)| m.member.status().role == Role::Leader)
            .map(|(id, _)| *id)
            .collect();
        (l.len() == 1).then(|| l[0])
    }

    pub async fn wait_leader(&self, timeout: Duration) -> Option<u64> {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// Proposes on whichever member leads, retrying through elections for up to `timeout`.
    pub async fn propose(
        &self,
        data: Bytes,
        timeout: Duration,
    ) -> Result<(u64, u64, Bytes), String> {
        let t = Instant::now();
        let mut last = String::from("no leader");
        while t.elapsed() < timeout {
            if let Some(l) = self.leader() {
                match self.members[&l].member.propose(data.clone()).await {
                    Ok((idx, r)) => return Ok((l, idx, r)),
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(last)
    }

    pub fn kill_all(&mut self) {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for id in ids {
            self.kill(id);
        }
    }
}

/// What a forger would send a group's members, for tests that check the peer service refuses
/// strangers: the payload of a vote request for `candidate` at `term` claiming a log up to
/// (`last_term`, `last_index`), which a member would grant (and so depose its leader) if it read
/// it.
pub fn forged_vote(term: u64, candidate: u64, last_term: u64, last_index: u64) -> Vec<u8> {
    let vote = crate::types::Vote::new(term, candidate);
    let last = crate::types::log_id(last_term, candidate, last_index);
    let req = openraft::raft::VoteRequest::<crate::types::TypeConfig>::new(vote, Some(last));
    crate::network::encode(&req).expect("a vote request encodes")
}

/// The payload of an append from a self-declared leader `leader` at `term` carrying one entry
/// (`payload`) after (`prev_term`, `prev_index`) and committing it.
pub fn forged_append(
    term: u64,
    leader: u64,
    prev_term: u64,
    prev_index: u64,
    payload: Vec<u8>,
) -> Vec<u8> {
    let vote = crate::types::Vote::new_committed(term, leader);
    let entry = crate::types::Entry {
        log_id: crate::types::log_id(term, leader, prev_index + 1),
        payload: crate::types::EntryPayload::Normal(crate::types::Payload(payload.into())),
    };
    let req = openraft::raft::AppendEntriesRequest::<crate::types::TypeConfig> {
        vote,
        prev_log_id: Some(crate::types::log_id(prev_term, leader, prev_index)),
        leader_commit: Some(crate::types::log_id(term, leader, prev_index + 1)),
        entries: vec![entry],
    };
    crate::network::encode(&req).expect("an append request encodes")
}
