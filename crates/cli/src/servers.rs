//! The hidden `run-nameserver` / `run-broker-node` subcommands: the servers run inside this
//! executable, so a local cluster works from a single `raftmq` binary. Each parses its own
//! flags exactly as the `nameserver` and `broker-node` binaries do (the libraries' `Args`).
//! Built without the `servers` feature, they fail with a clear message instead.

/// Whether the servers are compiled into this executable.
pub const BUILT_IN: bool = cfg!(feature = "servers");

#[cfg(not(feature = "servers"))]
pub async fn run_nameserver(_args: Vec<String>) -> anyhow::Result<()> {
    anyhow::bail!("this raftmq was built without the `servers` feature; use the nameserver binary")
}

#[cfg(not(feature = "servers"))]
pub async fn run_broker_node(_args: Vec<String>) -> anyhow::Result<()> {
    anyhow::bail!("this raftmq was built without the `servers` feature; use the broker-node binary")
}

#[cfg(feature = "servers")]
pub use built_in::{run_broker_node, run_nameserver};

#[cfg(feature = "servers")]
mod built_in {
    use anyhow::{Result, anyhow};
    use clap::Parser;

    #[derive(Debug, Parser)]
    #[command(name = "raftmq run-nameserver")]
    struct NameserverCli {
        #[command(flatten)]
        args: raftmq_nameserver::Args,
    }

    #[derive(Debug, Parser)]
    #[command(name = "raftmq run-broker-node")]
    struct BrokerNodeCli {
        #[command(flatten)]
        args: raftmq_broker_node::Args,
    }

    fn parse<T: Parser>(program: &str, args: Vec<String>) -> Result<T> {
        T::try_parse_from(std::iter::once(program.to_string()).chain(args))
            .map_err(|e| anyhow!("{}", e.render().to_string().trim_end()))
    }

    /// Runs a nameserver with `args` (its own command line, without the program name) until
    /// SIGINT or SIGTERM.
    pub async fn run_nameserver(args: Vec<String>) -> Result<()> {
        let cli: NameserverCli = parse("run-nameserver", args)?;
        raftmq_nameserver::run(cli.args).await
    }

    /// Runs a broker node with `args` (its own command line, without the program name) until
    /// SIGINT or SIGTERM.
    pub async fn run_broker_node(args: Vec<String>) -> Result<()> {
        let cli: BrokerNodeCli = parse("run-broker-node", args)?;
        raftmq_broker_node::run(cli.args).await
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn server_flags_parse_as_the_binaries_do() {
            let ns: NameserverCli = parse("x", vec!["--listen".into(), "127.0.0.1:1".into()])
                .expect("nameserver flags");
            let _ = ns;
            let bn: BrokerNodeCli = parse(
                "x",
                [
                    "--cluster",
                    "c",
                    "--broker",
                    "broker-a",
                    "--node-id",
                    "1",
                    "--listen",
                    "127.0.0.1:2",
                    "--peers",
                    "1=127.0.0.1:2",
                    "--nameservers",
                    "127.0.0.1:1",
                    "--data-dir",
                    "/tmp/x",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            )
            .expect("broker-node flags");
            assert_eq!(bn.args.node_id, Some(1));
            assert!(parse::<BrokerNodeCli>("x", vec!["--bogus".into()]).is_err());
        }
    }
}
