//! `raftmq cluster status [--watch] [--json]`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use crate::connect::Target;
use crate::output::{StatusJson, json_line, status_table};
use crate::signals::interrupted;

pub async fn status(target: &Target, json: bool, watch: bool) -> Result<()> {
    let admin = target.admin()?;
    if !watch {
        let s = admin.cluster_status().await?;
        if json {
            println!("{}", json_line(&StatusJson::from(&s)));
        } else {
            print!("{}", status_table(&s));
        }
        return Ok(());
    }
    let redraw = std::io::stdout().is_terminal() && !json;
    loop {
        let tick = Instant::now();
        let result = admin.cluster_status().await;
        let mut out = std::io::stdout().lock();
        match (&result, json) {
            (Ok(s), true) => writeln!(out, "{}", json_line(&StatusJson::from(s)))?,
            (Ok(s), false) => {
                if redraw {
                    // Clear the screen and go home, so the table redraws in place.
                    write!(out, "\x1b[2J\x1b[H")?;
                }
                writeln!(
                    out,
                    "raftmq cluster status  {}  (nameserver {}; every 1 s, Ctrl-C to stop)\n",
                    clock(),
                    target.nameserver
                )?;
                write!(out, "{}", status_table(s))?;
                if !redraw {
                    writeln!(out)?;
                }
            }
            (Err(e), true) => writeln!(
                out,
                "{}",
                json_line(&serde_json::json!({"error": e.to_string()}))
            )?,
            (Err(e), false) => writeln!(out, "{}  cannot read the cluster: {e}", clock())?,
        }
        out.flush()?;
        drop(out);
        tokio::select! {
            _ = tokio::time::sleep_until(tick + Duration::from_secs(1)) => {}
            _ = interrupted() => return Ok(()),
        }
    }
}

/// Wall-clock time of day (UTC) as `HH:MM:SS`.
pub fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}
