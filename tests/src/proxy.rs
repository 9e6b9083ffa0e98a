//! A fault proxy for the Raft links between nodes: one TCP forwarder per directed link
//! (`from` → `to`), each of which can be cut and healed.
//!
//! Every broker-node is started with `--peer-routes` pointing its outgoing Raft traffic at the
//! proxies in front of its peers, so the harness decides which node hears which. Clients still
//! reach every node directly: an isolated leader keeps receiving sends it cannot commit.
//!
//! A cut link behaves like a network that drops packets, not like one that refuses them: bytes in
//! flight stop moving (the kernel buffers fill and writers block), new connections are accepted
//! but not forwarded, so the sender sees timeouts rather than quick errors. Healing resumes the
//! same connections where they stopped, as TCP would after its retransmissions, so no byte is
//! lost or reordered by the proxy itself.

use std::collections::BTreeMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One directed link's forwarder.
struct Link {
    addr: String,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Forwarders for every ordered pair of nodes.
pub struct FaultProxy {
    links: BTreeMap<(u64, u64), Link>,
}

impl FaultProxy {
    /// Starts a forwarder for every ordered pair of `nodes` (id → the node's real address).
    pub async fn start(nodes: &BTreeMap<u64, String>) -> FaultProxy {
        let mut links = BTreeMap::new();
        for (from, _) in nodes.iter() {
            for (to, target) in nodes.iter() {
                if from == to {
                    continue;
                }
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
                let addr = listener.local_addr().unwrap().to_string();
                let (cut, rx) = watch::channel(false);
                let task = tokio::spawn(accept_loop(listener, target.clone(), rx));
                links.insert((*from, *to), Link { addr, cut, task });
            }
        }
        FaultProxy { links }
    }

    /// `--peer-routes` of node `from`: `to=proxy-address,...` for each of its peers.
    pub fn routes_of(&self, from: u64) -> String {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .map(|((_, to), l)| format!("{to}={}", l.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Cuts (or heals) the one-way link `from` → `to`.
    pub fn set_link(&self, from: u64, to: u64, cut: bool) {
        if let Some(l) = self.links.get(&(from, to)) {
            l.cut.send_replace(cut);
        }
    }

    /// Cuts both directions between `a` and `b`.
    pub fn cut_pair(&self, a: u64, b: u64) {
        self.set_link(a, b, true);
        self.set_link(b, a, true);
    }

    /// Isolates `id` from every other node, both directions.
    pub fn isolate(&self, id: u64) {
        let others: Vec<u64> = self
            .links
            .keys()
            .filter(|(f, _)| *f == id)
            .map(|(_, t)| *t)
            .collect();
        for o in others {
            self.cut_pair(id, o);
        }
    }

    /// Heals every link.
    pub fn heal(&self) {
        for l in self.links.values() {
            l.cut.send_replace(false);
        }
    }

    /// The links cut now, as (from, to).
    pub fn cut_links(&self) -> Vec<(u64, u64)> {
        self.links
            .iter()
            .filter(|(_, l)| *l.cut.borrow())
            .map(|(k, _)| *k)
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        for l in self.links.values() {
            l.task.abort();
        }
    }
}

/// Waits while the link is cut; false once the proxy is gone.
async fn wait_open(rx: &mut watch::Receiver<bool>) -> bool {
    rx.wait_for(|cut| !*cut).await.is_ok()
}

async fn accept_loop(listener: TcpListener, target: String, rx: watch::Receiver<bool>) {
    // Owned here, so aborting this task (the proxy dropped) aborts every connection too.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            return;
        };
        let _ = inbound.set_nodelay(true);
        let target = target.clone();
        let mut rx = rx.clone();
        conns.spawn(async move {
            // A cut link forwards no new connection either: hold it until healed.
            if !wait_open(&mut rx).await {
                return;
            }
            let Ok(outbound) = TcpStream::connect(&target).await else {
                return;
            };
            let _ = outbound.set_nodelay(true);
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            // When either side closes, the connection is over both ways (both halves dropped).
            tokio::select! {
                _ = pump(ri, wo, rx.clone()) => {}
                _ = pump(ro, wi, rx) => {}
            }
        });
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut rx: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if !wait_open(&mut rx).await {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just as the link was cut are held until it heals, like packets in flight.
        if !wait_open(&mut rx).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
