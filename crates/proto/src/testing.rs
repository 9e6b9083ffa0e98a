//! Test aids (feature `testing`).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// A peer that goes silent without a close: a real gRPC server (it knows no service, so every call
/// gets `UNIMPLEMENTED`) behind a proxy that relays its first connection until [`Self::silence`],
/// then relays nothing and answers nothing while it keeps both sockets open.
pub struct SilentPeer {
    /// Where to dial: the proxy.
    pub addr: SocketAddr,
    silence: Arc<Notify>,
    closed: oneshot::Receiver<Instant>,
}

impl SilentPeer {
    pub async fn start() -> SilentPeer {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(server)),
        );
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let silence = Arc::new(Notify::new());
        let (closed_tx, closed) = oneshot::channel();
        let go_silent = silence.clone();
        tokio::spawn(async move {
            let (mut client, _) = proxy.accept().await.unwrap();
            let mut upstream = TcpStream::connect(server_addr).await.unwrap();
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = go_silent.notified() => {}
            }
            // Silent: what the client sends is read and dropped, nothing goes back.
            let _ = tokio::io::copy(&mut client, &mut tokio::io::sink()).await;
            let _ = closed_tx.send(Instant::now());
        });
        SilentPeer {
            addr,
            silence,
            closed,
        }
    }

    /// From now on the peer relays nothing; returns when the client closed its connection, or
    /// panics after `bound`. The seconds it took.
    pub async fn silence_until_closed(self, bound: std::time::Duration) -> f64 {
        self.silence.notify_one();
        let since = Instant::now();
        let closed = tokio::time::timeout(bound, self.closed)
            .await
            .unwrap_or_else(|_| panic!("the idle connection was still open after {bound:?}"))
            .unwrap();
        closed.duration_since(since).as_secs_f64()
    }
}
