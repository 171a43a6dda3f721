use clap::Parser;
use cross_cluster_controller::args::{Cli, Command};
use cross_cluster_controller::{Error, app, remote_access, status, telemetry};

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

fn main() {
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
    let args = cli.run;
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let _telemetry = telemetry::init();
    if let Err(e) = runtime().block_on(app::run(args)) {
        // bad configuration is the user's to fix: one line on stderr; anything else is also
        // reported through tracing (and so Sentry)
        if !matches!(e, Error::Config(_)) {
            tracing::error!(category = e.category(), "{e}");
        }
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
