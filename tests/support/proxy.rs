//! A fault-injecting TCP proxy in front of a real API server. It works below TLS, so the daemon's
//! certificate checks and credentials are those of a real connection; only the network between
//! them misbehaves on command:
//! - `Refuse`: the listening socket is closed (connection refused) and every open connection is
//!   cut, as when an API server process dies;
//! - `Hang`: connections stay open but no byte moves either way, and new ones are accepted and
//!   then ignored, as with a black-holed route;
//! - `Delay(d)`: every chunk waits `d` before it is forwarded;
//! - `Pass`: bytes flow (held ones too).
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    Pass,
    Refuse,
    Hang,
    Delay(Duration),
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Fault>,
    /// bumped to cut every open connection
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let s = TcpSocket::new_v4()?;
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(128)
}

impl Proxy {
    /// A proxy on a free local port forwarding to `upstream` (host:port).
    pub async fn start(upstream: &str) -> Proxy {
        let upstream = upstream.to_string();
        let listener = bind("127.0.0.1:0".parse().expect("addr")).expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, mut mode_rx) = watch::channel(Fault::Pass);
        let (cut, cut_rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut listener = Some(listener);
            loop {
                let Some(l) = listener.as_ref() else {
                    // refused: no socket until the mode changes
                    if mode_rx.wait_for(|m| *m != Fault::Refuse).await.is_err() {
                        return;
                    }
                    listener = bind(addr).ok();
                    if listener.is_none() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                };
                tokio::select! {
                    accepted = l.accept() => {
                        let Ok((down, _)) = accepted else { continue };
                        if *mode_rx.borrow() == Fault::Refuse {
                            // accepted in the instant the socket was being closed: refused too
                            continue;
                        }
                        let (mode_rx, cut_rx, upstream) = (mode_rx.clone(), cut_rx.clone(), upstream.clone());
                        tokio::spawn(async move {
                            let Ok(up) = TcpStream::connect(&upstream).await else { return };
                            relay(down, up, mode_rx, cut_rx).await;
                        });
                    }
                    changed = mode_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if *mode_rx.borrow() == Fault::Refuse {
                            listener = None;
                        }
                    }
                }
            }
        });
        Proxy {
            port: addr.port(),
            mode,
            cut,
            task,
        }
    }

    pub fn set(&self, fault: Fault) {
        if fault == Fault::Refuse {
            self.cut.send_modify(|n| *n += 1);
        }
        self.mode.send_replace(fault);
    }

    /// Cuts every open connection (new ones are accepted as the mode says).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

async fn relay(
    down: TcpStream,
    up: TcpStream,
    mode: watch::Receiver<Fault>,
    mut cut: watch::Receiver<u64>,
) {
    let (dr, dw) = down.into_split();
    let (ur, uw) = up.into_split();
    cut.mark_unchanged();
    tokio::select! {
        _ = pump(dr, uw, mode.clone()) => {}
        _ = pump(ur, dw, mode) => {}
        _ = cut.changed() => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // a hanging link moves nothing, not even what is already on its way
        if mode.wait_for(|m| *m != Fault::Hang).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let fault = match mode.wait_for(|m| *m != Fault::Hang).await {
            Ok(m) => *m,
            Err(_) => return,
        };
        if let Fault::Delay(d) = fault {
            tokio::time::sleep(d).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
