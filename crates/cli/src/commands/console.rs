//! `raftmq console`: a web page showing the cluster live.

use anyhow::Result;

use crate::args::ConsoleArgs;

pub async fn run(_nameserver: &str, _args: ConsoleArgs) -> Result<()> {
    anyhow::bail!("the console is being built")
}
