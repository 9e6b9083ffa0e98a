//! Feature levels of a mixed-version group: which commands every member can apply.
//!
//! A build applies the command tags `0..COMMAND_TAGS` and stops at a tag it does not know (see
//! `command`'s module doc), so during a rolling upgrade a leader must not propose a command that
//! some member's older build cannot apply. Each node reports its `COMMAND_TAGS` in its node status
//! (`command_tags`; builds before the field report nothing, read as the first release's five
//! commands) and asks every other member for theirs every [`POLL`]. What it learnt is kept in
//! `<data_dir>/member-features`, so a node that becomes leader while a member is down still
//! knows what that member runs. A member never heard from counts as the first release.
//!
//! The group's level is the lowest over its members; `Broker::propose` refuses a command whose
//! tag is at or above it (UNAVAILABLE, naming the member to upgrade). Commands of the first
//! release (`CreateTopic`, `DeleteTopic`, `Send`, `CommitOffset`, `Trim`) are never held back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftmq_proto::v1::NodeStatusRequest;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;

use crate::command::COMMAND_TAGS;
use crate::node::Node;

/// The commands of the first release (819deb4, tagged v0.1.0): tags 0..5.
pub const FIRST_RELEASE_COMMAND_TAGS: u32 = 5;

/// How often each node asks the other members which commands they apply.
pub const POLL: Duration = Duration::from_secs(2);

const _: () = assert!(FIRST_RELEASE_COMMAND_TAGS <= COMMAND_TAGS);

/// What this node knows of every member's command tags.
pub struct Features {
    path: PathBuf,
    known: Mutex<BTreeMap<u64, u32>>,
}

impl Features {
    /// Loads what was learnt before (nothing when the file is missing or unreadable).
    pub fn load(data_dir: &std::path::Path) -> Features {
        let path = data_dir.join("member-features");
        // One line per member: `node_id command_tags`.
        let known = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (id, tags) = l.split_once(' ')?;
                Some((id.parse().ok()?, tags.trim().parse().ok()?))
            })
            .collect();
        Features {
            path,
            known: Mutex::new(known),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u32>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what `node` reported (`0`: a build before the field); saved when it changed.
    pub fn record(&self, node: u64, reported: u32) {
        let tags = if reported == 0 {
            FIRST_RELEASE_COMMAND_TAGS
        } else {
            reported
        };
        let mut known = self.lock();
        if known.insert(node, tags) != Some(tags) {
            tracing::info!(node, command_tags = tags, "member's build learnt");
            let text: String = known.iter().map(|(id, t)| format!("{id} {t}\n")).collect();
            let tmp = self.path.with_extension("tmp");
            let _ = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &self.path));
        }
    }

    /// The command tags `node` applies, as last heard (the first release when never heard).
    pub fn of(&self, node: u64) -> Option<u32> {
        self.lock().get(&node).copied()
    }

    /// The lowest command tags over `members` (this node counts as [`COMMAND_TAGS`]), with the
    /// member that has them when it is not this node.
    pub fn group(&self, me: u64, members: impl IntoIterator<Item = u64>) -> (u32, Option<u64>) {
        let known = self.lock();
        members
            .into_iter()
            .filter(|m| *m != me)
            .map(|m| {
                (
                    known.get(&m).copied().unwrap_or(FIRST_RELEASE_COMMAND_TAGS),
                    Some(m),
                )
            })
            .fold((COMMAND_TAGS, None), |a, b| if b.0 < a.0 { b } else { a })
    }
}

/// The tag of an encoded command: its first varint (commands are written bare, see `command`).
pub fn tag_of(encoded: &[u8]) -> Option<u32> {
    postcard::take_from_bytes::<u32>(encoded)
        .ok()
        .map(|(t, _)| t)
}

fn channel(node: &Node, addr: &str) -> Option<tonic::transport::Channel> {
    let ep = node.endpoint(addr)?;
    Some(
        ep.connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(1))
            .connect_lazy(),
    )
}

/// Asks the members `ids` (other than this node) for their command tags, at once and together.
pub async fn ask(node: &Node, ids: &[u64]) {
    let st = node.member.status();
    let calls = ids
        .iter()
        .filter(|id| **id != node.cfg.node_id)
        .filter_map(|id| Some((*id, channel(node, st.addresses.get(id)?)?)))
        .map(|(id, ch)| async move {
            let r = BrokerServiceClient::with_interceptor(ch, node.signer())
                .node_status(NodeStatusRequest {})
                .await
                .ok()?
                .into_inner();
            (r.node_id == id).then_some((id, r.command_tags))
        });
    for (id, tags) in futures::future::join_all(calls).await.into_iter().flatten() {
        node.features.record(id, tags);
    }
}

/// Asks every other member for its command tags every [`POLL`] (every 200 ms while the
/// membership is not known yet or some member was never heard from).
pub fn spawn(node: Arc<Node>) {
    tokio::spawn(async move {
        loop {
            let st = node.member.status();
            let members: Vec<u64> = st.members().collect();
            ask(&node, &members).await;
            // Until the membership is known (a fresh group forms within a second or two) and
            // every other member has answered, ask again soon: a member killed early must be
            // heard before it goes, or it holds the group's level down while it is away.
            let unknown = members.iter().all(|m| *m == node.cfg.node_id)
                || members
                    .iter()
                    .any(|m| *m != node.cfg.node_id && node.features.of(*m).is_none());
            tokio::time::sleep(if unknown {
                Duration::from_millis(200)
            } else {
                POLL
            })
            .await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 60. The group's level is its lowest member's; a member never heard from counts as the
    ///     first release; an old build's missing field reads as the first release; what was
    ///     learnt survives a restart.
    #[test]
    fn t60_the_group_applies_what_its_oldest_member_applies() {
        let dir = tempfile::tempdir().unwrap();
        let f = Features::load(dir.path());
        assert_eq!(f.group(1, [1, 2, 3]), (FIRST_RELEASE_COMMAND_TAGS, Some(2)));
        f.record(2, COMMAND_TAGS);
        f.record(3, 0);
        assert_eq!(f.group(1, [1, 2, 3]), (FIRST_RELEASE_COMMAND_TAGS, Some(3)));
        f.record(3, COMMAND_TAGS);
        assert_eq!(f.group(1, [1, 2, 3]), (COMMAND_TAGS, None));
        let again = Features::load(dir.path());
        assert_eq!(again.of(3), Some(COMMAND_TAGS));
        assert_eq!(again.group(1, [1, 2, 3]), (COMMAND_TAGS, None));
        assert_eq!(tag_of(&[8, 1, 2]), Some(8));
    }
}
