//! Interruption: SIGINT (Ctrl-C) or SIGTERM.

/// Resolves when the process is asked to stop. If a handler cannot be installed, that signal
/// keeps its default disposition (ending the process) and this future does not resolve for it.
pub async fn interrupted() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            if let Ok(mut s) = signal(SignalKind::terminate()) {
                s.recv().await;
                return;
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
