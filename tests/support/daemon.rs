//! The real daemon binary, started as a user would: `--devmode` with contexts of the test bed.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::metrics::{
    FOLLOWER_KINDS, family_total, series_of_remote, series_text, series_value, sum_of, writes_of,
};
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

    /// The value of the series `name` with exactly `labels` (its whole label set). Panics when
    /// the scrape fails or the series is not on the page (a renamed metric or label must not
    /// read as 0).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        series_value(&self.metrics(), name, labels).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every write the daemon counted (`xcc_writes_total`, any kind and verb): for "nothing was
    /// written at all". Panics when the family is not published.
    pub fn writes_total(&self) -> f64 {
        self.family_total("xcc_writes_total")
    }

    /// Every series of `name` summed, whatever their labels: for "none at all" (every series
    /// counts, so a renamed label cannot hide one). Panics when the family is not published.
    pub fn family_total(&self, name: &str) -> f64 {
        family_total(&self.metrics(), name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes of followers (Services, EndpointSlices, Endpoints) with the given verbs, summed
    /// over the exact series `{kind, verb}`, each of which must be published: what "no write"
    /// means for mirroring (`xcc_writes_total` also counts the health Leases, renewed on a
    /// timer, Namespaces and Events).
    pub fn follower_writes(&self, verbs: &[&str]) -> f64 {
        self.writes(&FOLLOWER_KINDS, verbs)
    }

    /// Writes of `kinds` x `verbs`, summed over those exact series, each of which must be
    /// published.
    pub fn writes(&self, kinds: &[&str], verbs: &[&str]) -> f64 {
        sum_of(
            &self.metrics(),
            "xcc_writes_total",
            &writes_of(kinds, verbs),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until the series `name{labels}` reaches `at_least` (the daemon counts a write just
    /// after the API server answers it, so a test that saw the write's effect must still wait
    /// for the count). A series absent from the page never satisfies it.
    pub async fn wait_metric(&self, name: &str, labels: &[(&str, &str)], at_least: f64) -> f64 {
        eventually(
            &format!("{} >= {at_least}", series_text(name, labels)),
            Duration::from_secs(60),
            || async {
                let v = self
                    .try_metrics()
                    .and_then(|text| series_value(&text, name, labels));
                match v {
                    Ok(v) if v >= at_least => Ok(v),
                    Ok(v) => Err(format!("{v}\n{}", self.logs())),
                    Err(e) => Err(format!("{e}\n{}", self.logs())),
                }
            },
        )
        .await
    }

    /// Every series of the page that names `remote` (see [`series_of_remote`]); panics when
    /// the scrape fails.
    pub fn series_of(&self, remote: &str) -> Vec<String> {
        series_of_remote(&self.metrics(), remote).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The value of the series `name{labels}`, None while the daemon does not publish it (for a
    /// gauge whose absence means something: a remote not joined, an expiry not known).
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        series_value(&self.metrics(), name, labels).ok()
    }

    /// Waits until the daemon's caches of each of `remotes` and of the local followers are
    /// complete, judged from /readyz per remote (200, and a line `remote <name>: synced` for
    /// each), and each of them has finished a sweep (`xcc_sweeps_total{remote,outcome="done"}`
    /// at least 1: only the leader, or a dry run acting as one, sweeps). A remote that is not
    /// synced, or whose sweep listing failed, does not satisfy it for another.
    pub async fn wait_synced(&self, remotes: &[&str]) {
        assert!(
            !remotes.is_empty(),
            "wait_synced needs the remotes to wait for"
        );
        eventually(
            &format!("the daemon to sync {remotes:?} and the local followers and sweep each"),
            Duration::from_secs(30),
            || async {
                if let Some(status) = self.exited() {
                    return Err(format!("daemon exited ({status}):\n{}", self.logs()));
                }
                let (code, body) = self.readyz()?;
                let lines: Vec<&str> = body.lines().collect();
                let unsynced: Vec<&&str> = remotes
                    .iter()
                    .filter(|r| !lines.contains(&format!("remote {r}: synced").as_str()))
                    .collect();
                if code != 200 || !unsynced.is_empty() {
                    return Err(format!("/readyz {code}, not synced {unsynced:?}:\n{body}"));
                }
                let text = self.try_metrics()?;
                for r in remotes {
                    let done = series_value(
                        &text,
                        "xcc_sweeps_total",
                        &[("remote", r), ("outcome", "done")],
                    )?;
                    if done < 1.0 {
                        return Err(format!("no sweep of {r} done yet"));
                    }
                }
                Ok(())
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

    /// Peak resident memory (VmHWM) of the running process, in MiB; panics when it cannot be
    /// read (a bound on it must not pass on a 0 read from nowhere).
    pub fn peak_mib(&self) -> f64 {
        let pid = self.child.as_ref().expect("the daemon runs").id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status:\n{status}"))
    }

    /// Resident memory (VmRSS) of the running process now, in MiB.
    pub fn rss_mib(&self) -> f64 {
        let pid = self.child.as_ref().expect("the daemon runs").id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
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
        .ok_or_else(|| format!("{ip}:{port}{path}: no HTTP status in {body:?}"))?;
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
