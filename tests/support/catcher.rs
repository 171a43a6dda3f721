//! A TLS listener on 127.0.0.1 standing in for an API server that a remote Secret names, which
//! records what reached it: connections, the client certificates presented, and each request
//! head (decrypted, so a bearer token read from a file would show in it). It serves with a bed
//! cluster's own serving certificate (SAN 127.0.0.1), so a client that trusts that cluster's CA
//! completes the handshake and sends its request; it answers every request 401, or what an
//! [`Answer`] says (a small API server that behaves as a hostile remote would).
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

/// What reached a [`Catcher`].
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// TCP connections accepted
    pub connections: usize,
    /// DER of each client certificate presented (chain leaves)
    pub client_certs: Vec<Vec<u8>>,
    /// each request head, as text
    pub requests: Vec<String>,
}

pub struct Catcher {
    pub port: u16,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

/// What to answer a request (its head: request line and headers): a status code and a JSON body.
pub type Answer = Arc<dyn Fn(&str) -> (u16, String) + Send + Sync>;

const UNAUTHORIZED: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"catcher","reason":"Unauthorized","code":401}"#;

pub fn server_config(pki: &Path) -> ServerConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(pki.join("serving.crt"))
        .expect("serving.crt")
        .collect::<Result<_, _>>()
        .expect("serving.crt PEM");
    let key = PrivateKeyDer::from_pem_file(pki.join("serving.key")).expect("serving.key");
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("ca.crt") {
        roots.add(ca.expect("ca.crt PEM")).expect("CA");
    }
    // a client certificate is asked for (and recorded), not required
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .expect("client verifier");
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .expect("server certificate")
}

impl Catcher {
    /// Listens on 127.0.0.1 (a free port) with the certificates in `pki` (a bed cluster's
    /// `serving.crt`, `serving.key` and `ca.crt`).
    pub async fn start(pki: &Path) -> Catcher {
        Self::answering(pki, Arc::new(|_: &str| (401, UNAUTHORIZED.to_string()))).await
    }

    /// [`Catcher::start`], answering each request as `answer` says.
    pub async fn answering(pki: &Path, answer: Answer) -> Catcher {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(pki)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                record.lock().expect("lock").connections += 1;
                let answer = Arc::clone(&answer);
                tokio::spawn(serve(acceptor.clone(), tcp, Arc::clone(&record), answer));
            }
        });
        Catcher { port, seen, task }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("lock").clone()
    }
}

async fn serve(
    acceptor: TlsAcceptor,
    tcp: tokio::net::TcpStream,
    record: Arc<Mutex<Seen>>,
    answer: Answer,
) {
    let Ok(mut tls) = acceptor.accept(tcp).await else {
        return;
    };
    if let Some(certs) = tls.get_ref().1.peer_certificates() {
        let mut seen = record.lock().expect("lock");
        seen.client_certs
            .extend(certs.iter().take(1).map(|c| c.as_ref().to_vec()));
    }
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let end = |d: &[u8]| d.windows(4).position(|w| w == b"\r\n\r\n");
    while end(&data).is_none() && data.len() < 65536 {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
    let head_len = end(&data).map_or(data.len(), |e| e + 4);
    let head = String::from_utf8_lossy(&data[..head_len]).into_owned();
    // the body, read to its end before the answer (its length from the head)
    let body_len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0)
        .min(1 << 20);
    while data.len() < head_len + body_len {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
    record.lock().expect("lock").requests.push(head.clone());
    let (code, body) = answer(&head);
    let reply = format!(
        "HTTP/1.1 {code} Answer\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tls.write_all(reply.as_bytes()).await;
    let _ = tls.shutdown().await;
}

impl Drop for Catcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
