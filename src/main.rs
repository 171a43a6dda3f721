use clap::Parser;
use cross_cluster_controller::{app, args::Args, telemetry};

fn main() {
    let args = Args::parse();
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let _telemetry = telemetry::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(app::run(args)) {
        // bad configuration is the user's to fix: one line on stderr; anything else is also
        // reported through tracing (and so Sentry)
        if !matches!(e, cross_cluster_controller::Error::Config(_)) {
            tracing::error!(category = e.category(), "{e}");
        }
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
