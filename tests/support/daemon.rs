//! The real daemon binary, started as a user would: `--devmode` with contexts of the test bed.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{LOCAL, REMOTE, bed, eventually};

pub const BIN: &str = env!("CARGO_BIN_EXE_cross-cluster-controller");

pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
    pub admin: u16,
    _dir: tempfile::TempDir,
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Arguments for a daemon that reads REMOTE and writes LOCAL, confined to one namespace (so
/// tests running in parallel never see each other's objects), with its Lease there too.
pub fn args_for(ns: &str) -> Vec<String> {
    [
        "--devmode",
        "--local-context",
        LOCAL,
        "--remote-context",
        REMOTE,
        "--namespace",
        ns,
        "--watch-namespace",
        ns,
        "--lease-duration-seconds",
        "6",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The arguments with one flag's value replaced (the flag must be there).
pub fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} not in {args:?}"));
    args[i + 1] = value.to_string();
    args
}

/// The arguments with more appended.
pub fn with_args(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

impl Daemon {
    /// Starts the binary with `args` plus `--admin-bind` (and the bed's `--kubeconfig` unless
    /// `args` name one); KUBECONFIG points at
    /// the bed (dev mode reads the local cluster from it).
    pub async fn start(args: &[String]) -> Daemon {
        Self::start_with_env(args, &[]).await
    }

    pub async fn start_with_env(args: &[String], env: &[(&str, &str)]) -> Daemon {
        Self::spawn(args, env, true).await
    }

    /// Starts the binary with no static remote (no `--kubeconfig` added): its remotes come from
    /// Secrets only.
    pub async fn start_secrets_only(args: &[String]) -> Daemon {
        Self::spawn(args, &[], false).await
    }

    async fn spawn(args: &[String], env: &[(&str, &str)], static_remote: bool) -> Daemon {
        let bed = bed().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("daemon.log");
        let admin = free_port();
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        if static_remote && !args.iter().any(|a| a == "--kubeconfig") {
            cmd.arg("--kubeconfig").arg(&bed.kubeconfig);
        }
        cmd.arg("--admin-bind")
            .arg(format!("127.0.0.1:{admin}"))
            .env("KUBECONFIG", &bed.kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("ENV")
            .env_remove("SENTRY_DSN")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start the daemon binary");
        let d = Daemon {
            child: Some(child),
            log,
            admin,
            _dir: dir,
        };
        d.wait_serving().await;
        d
    }

    /// Waits until the admin server answers (or the process has exited, which the caller may
    /// expect), so that a metric read afterwards is a read of a running daemon's page.
    async fn wait_serving(&self) {
        eventually(
            "the daemon's admin server to answer /healthz",
            Duration::from_secs(30),
            || async {
                if self.exited().is_some() {
                    return Ok(());
                }
                match self.get("/healthz") {
                    Ok((200, _)) => Ok(()),
                    Ok((code, body)) => Err(format!("{code} {body}")),
                    Err(e) => Err(format!("{e}\n{}", self.logs())),
                }
            },
        )
        .await
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.admin, path, Duration::from_secs(5))
    }

    /// The /metrics page; a failed scrape is an error, never an empty page (which would read
    /// every counter as 0).
    pub fn try_metrics(&self) -> Result<String, String> {
        match self.get("/metrics") {
            Ok((200, body)) => Ok(body),
            Ok((code, body)) => Err(format!("scrape of /metrics answered {code}: {body}")),
            Err(e) => Err(format!("scrape of /metrics failed: {e}")),
        }
    }

    /// The /metrics page; panics when the scrape fails.
    pub fn metrics(&self) -> String {
        self.try_metrics()
            .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()))
    }

    pub fn readyz(&self) -> Result<(u16, String), String> {
        self.get("/readyz")
    }

    /// Sum of the samples of a metric whose line contains every one of `filters`. Panics when the
    /// scrape fails or the daemon publishes no such metric family (a renamed metric must not
    /// read as 0).
    pub fn metric(&self, name: &str, filters: &[&str]) -> f64 {
        metric_value(&self.metrics(), name, filters).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes of followers (Services, EndpointSlices, Endpoints) whose line holds every filter:
    /// what "no write" means for mirroring (`xcc_writes_total` also counts the health Leases,
    /// renewed on a timer, Namespaces and Events).
    pub fn follower_writes(&self, filters: &[&str]) -> f64 {
        ["Service", "EndpointSlice", "Endpoints"]
            .iter()
            .map(|k| {
                let kind = format!("kind=\"{k}\"");
                let all: Vec<&str> = filters.iter().copied().chain([kind.as_str()]).collect();
                self.metric("xcc_writes_total", &all)
            })
            .sum()
    }

    /// Waits until a counter reaches `at_least` (the daemon counts a write just after the API
    /// server answers it, so a test that saw the write's effect must still wait for the count).
    pub async fn wait_metric(&self, name: &str, filters: &[&str], at_least: f64) -> f64 {
        eventually(
            &format!("{name}{filters:?} >= {at_least}"),
            Duration::from_secs(60),
            || async {
                let v = self
                    .try_metrics()
                    .and_then(|text| metric_value(&text, name, filters));
                match v {
                    Ok(v) if v >= at_least => Ok(v),
                    Ok(v) => Err(format!("{v}\n{}", self.logs())),
                    Err(e) => Err(format!("{e}\n{}", self.logs())),
                }
            },
        )
        .await
    }

    /// The value of a gauge, None while the daemon does not publish it.
    pub fn gauge(&self, name: &str, filters: &[&str]) -> Option<f64> {
        gauge_value(&self.metrics(), name, filters)
    }

    /// Waits until the daemon is leader with complete caches and has finished its first sweep.
    pub async fn wait_synced(&self) {
        eventually(
            "the daemon to lead, sync its caches and finish a first sweep",
            Duration::from_secs(30),
            || async {
                if let Some(status) = self.exited() {
                    return Err(format!("daemon exited ({status}):\n{}", self.logs()));
                }
                let logs = self.logs();
                if logs.contains("sweep done") && logs.contains("caches synced") {
                    Ok(())
                } else {
                    Err(logs)
                }
            },
        )
        .await
    }

    /// Waits until the daemon leads with its local caches complete (/readyz 200): what a
    /// daemon with no remote yet can show.
    pub async fn wait_leading(&self) {
        eventually(
            "the daemon to lead with its local caches synced",
            Duration::from_secs(30),
            || async {
                if let Some(status) = self.exited() {
                    return Err(format!("daemon exited ({status}):\n{}", self.logs()));
                }
                let leading = self.gauge("xcc_leader", &[]) == Some(1.0);
                match self.readyz()? {
                    (200, _) if leading => Ok(()),
                    (code, body) => Err(format!("leading {leading}, {code} {body}")),
                }
            },
        )
        .await
    }

    /// Some when the process has exited (it stays a zombie until waited for, which `kill` does).
    pub fn exited(&self) -> Option<String> {
        let pid = self.child.as_ref()?.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.contains(") Z ").then(|| "exited".to_string())
    }

    /// Peak resident memory (VmHWM) of the process, in MiB.
    pub fn peak_mib(&self) -> f64 {
        let pid = self.child.as_ref().map(|c| c.id()).unwrap_or(0);
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    }

    /// SIGKILL, no goodbye (a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit code.
    pub async fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        for _ in 0..200 {
            if let Ok(Some(status)) = c.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = c.kill();
        c.wait().ok().and_then(|s| s.code())
    }
}

/// A plain HTTP/1.0 GET on a loopback port: (status code, body).
pub fn http_get(port: u16, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    http_get_at("127.0.0.1", port, path, timeout)
}

/// A plain HTTP/1.0 GET on `ip`:`port` (a node's address, 127.0.0.I): (status code, body).
pub fn http_get_at(
    ip: &str,
    port: u16,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect((ip, port)).map_err(|e| format!("{ip}:{port}: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    let code = body
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let text = body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, text))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- daemon log ({}) ---\n{}",
                self.log.display(),
                self.logs()
            );
        }
    }
}

fn samples<'a>(
    text: &'a str,
    name: &'a str,
    filters: &'a [&str],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(move |l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}

/// The family a sample name belongs to (prometheus-client exposes a counter `x` as samples
/// `x_total`; the API server names the family `x_total` itself).
fn family_of(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

/// Sum of a metric's samples. A labelled counter never incremented has no sample and counts as 0,
/// but only when its family is published (`# TYPE <family> ...`); an absent family is an error.
pub fn metric_value(text: &str, name: &str, filters: &[&str]) -> Result<f64, String> {
    let family = family_of(name);
    let published = text.lines().any(|l| {
        l.strip_prefix("# TYPE ")
            .and_then(|rest| rest.split(' ').next())
            .is_some_and(|f| f == family || f == name)
    });
    if !published {
        return Err(format!(
            "the daemon publishes no metric family {family} (renamed, or a page that is not the daemon's):\n{text}"
        ));
    }
    Ok(samples(text, name, filters).fold(0.0, |a, b| a + b))
}

/// One gauge sample; absence is not zero.
pub fn gauge_value(text: &str, name: &str, filters: &[&str]) -> Option<f64> {
    samples(text, name, filters).next()
}

/// Runs the binary to completion (for start-up failures) and returns (exit code, output).
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("ENV")
        .env_remove("KUBECONFIG_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the daemon binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}
