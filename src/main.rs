use clap::Parser;
use cross_cluster_controller::cli::{Cli, Command, remote_access, status};
use cross_cluster_controller::runtime::telemetry;
use cross_cluster_controller::{Error, daemon};

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// glibc's malloc raises its mmap threshold to the largest block freed so far: listing pages
/// and response bodies freed early would make later ones come from the heap, leaving holes
/// between long-lived cache entries. A fixed threshold of 128 KiB keeps such short-lived buffers
/// in their own mappings, returned when freed (measured: docs/benchmarks.md, "Memory: what the
/// design choices saved").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    // SAFETY: mallopt only sets a malloc parameter; it is called first thing in main, before
    // any other thread exists. A refusal (0) leaves glibc's default, which works too.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}

fn main() {
    tune_malloc();
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::new_heap();
    let cli = Cli::parse();
    if let Some(Command::Status(args)) = cli.command {
        let code = runtime().block_on(status::run(args));
        std::process::exit(code);
    }
    if let Some(Command::RemoteAccess(args)) = cli.command {
        match runtime().block_on(remote_access::run(args)) {
            Ok(text) => print!("{text}"),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let config = match cli.run.config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let _telemetry = telemetry::init();
    if let Err(e) = runtime().block_on(daemon::run(config)) {
        // bad configuration is the user's to fix: one line on stderr; anything else is also
        // reported through tracing (and so Sentry)
        if !matches!(e, Error::Config(_)) {
            tracing::error!(category = e.category(), "{e}");
        }
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
