//! The command line: the daemon's flags and the `status` and `remote-access` subcommands.
use clap::{Parser, Subcommand};

pub mod args;
pub mod containment;
pub mod profiles;
pub mod remote_access;
pub mod status;

pub use args::Args;

/// The command line: the daemon's flags, or a subcommand.
#[derive(Parser, Debug, Clone)]
#[command(name = "cross-cluster-controller", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: Args,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run against the cluster to be READ: create (or reuse) its read-only ServiceAccount, mint a
    /// token through TokenRequest, print a kubeconfig or Secret for the other cluster's daemon.
    RemoteAccess(remote_access::RemoteAccessArgs),
    /// Health of every remote, read from the LOCAL cluster only (the health Leases the leader
    /// keeps, the followers, the Events): a table, or JSON with -o json. Exit 0: all connected
    /// and a leader renewing; 1: something needs a look; 2: the local cluster could not be read;
    /// 3: all is well but a remote's credential expires within --credential-expiry-threshold.
    Status(status::StatusArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_subcommand_and_the_daemon_flags_parse() {
        let c = Cli::try_parse_from([
            "ccc",
            "remote-access",
            "--context",
            "east",
            "--output",
            "secret",
        ])
        .unwrap();
        assert!(matches!(c.command, Some(Command::RemoteAccess(_))));
        let c = Cli::try_parse_from(["ccc", "--devmode", "--label-key", "a.b/c"]).unwrap();
        assert!(c.command.is_none() && c.run.devmode);
    }
}
