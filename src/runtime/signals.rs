//! SIGTERM and SIGINT: the first drains the process, a second exits at once.
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Blocks until SIGTERM or SIGINT, then cancels; a second signal exits at once.
pub fn handle(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    error!(error = %e, "cannot install the SIGTERM handler");
                    return;
                }
            };
        for n in 0..2 {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            if n == 0 {
                info!("shutting down: draining work, releasing the lease (signal again to abort)");
                shutdown.cancel();
            } else {
                warn!("second signal: exiting now");
                std::process::exit(130);
            }
        }
    });
}
