//! The broker's restart images (`raftmq_raft_log::state_machine::restart`): what lets a
//! restarted node skip re-applying its retained log.
//!
//! An image holds the whole small state as of its entry (the snapshot bytes, plus the timer and the
//! status-only fields snapshots leave out) and, per queue, what apply built for the entries after
//! the previous image: the consume-queue runs, their per-message tag and group hashes, and the
//! id and key fingerprints of their messages. Loading a chain takes the small state of the newest
//! image and the runs of all of them in order, then keeps, per queue, the runs its state still
//! serves: above the retention point, contiguous, ending at the queue's next offset. A queue whose
//! runs do not add up refuses the whole chain (the node then re-applies its log, as before images).
//!
//! ## Bytes, format version 2
//!
//! The envelope of `raftmq_raft_log::state_machine::format` (version 2) around the postcard
//! encoding of [`Image`]. Version 1 (written bare) had runs without their position in the entry
//! ([`Run::position`], from `SendMany`); it is not read: an image is a cache, so a node upgraded
//! from version 1 re-applies its log once at start and writes version 2 from then on.

use std::collections::{BTreeMap, HashMap};
use std::io;

use raftmq_raft_log::StateMachine;
use raftmq_raft_log::encoding::postcard_extend;
use raftmq_raft_log::state_machine::format;
use serde::{Deserialize, Serialize};

use crate::state::{BrokerState, Run};
use crate::timer::{Timer, TimerImage};

/// The format version of the broker's restart image bytes this build writes and reads.
pub const RESTART_IMAGE_FORMAT_VERSION: u32 = 2;

/// Field order is the order on disk: never reorder or change the fields.
#[derive(Debug, Serialize, Deserialize)]
struct Image {
    /// The snapshot bytes (`BrokerState::snapshot`) as of the image's entry: one byte string.
    #[serde(with = "serde_bytes")]
    snapshot: Vec<u8>,
    timer: TimerImage,
    stamped_ms: u64,
    offset_times: BTreeMap<(String, String, u32), u64>,
    /// What apply built per queue since the previous image.
    queues: Vec<QueueDelta>,
}

/// Field order is the order on disk: never reorder or change the fields.
#[derive(Debug, Serialize, Deserialize)]
struct QueueDelta {
    topic: String,
    queue: u32,
    runs: Vec<Run>,
    mixed_tags: Vec<(u64, Box<[u32]>)>,
    groups: Vec<(u64, Box<[u32]>)>,
    ids: Vec<(u64, u32)>,
    keys: Vec<(u64, u32)>,
}

impl QueueDelta {
    /// The offset after its last run.
    fn end(&self) -> Option<u64> {
        self.runs.last().map(|r| r.first_offset + r.count as u64)
    }
}

/// The image of `s` as of now, but for its snapshot (what `s.snapshot()` gives, which
/// [`Taken::encode`] adds), copied out of the state: the timer, the status-only fields and what
/// apply built for the entries after `since`. Apply waits while this is taken and no longer: the
/// image writer's thread encodes it.
pub fn take(s: &BrokerState, since: u64) -> Taken {
    let mut queues = Vec::new();
    // What the body will take, about (varints at their widest for runs): a buffer of megabytes
    // grown by doubling cost its copies and fresh pages.
    let mut estimate = 4096 + s.offset_times.len() * 64;
    for (name, t) in s.topics.unordered() {
        for (qi, q) in t.queues.iter().enumerate() {
            let runs = q.runs_after(since);
            let Some(first) = runs.first().map(|r| r.first_offset) else {
                continue;
            };
            let since_first = |m: &BTreeMap<u64, Box<[u32]>>| -> Vec<(u64, Box<[u32]>)> {
                m.range(first..).map(|(o, h)| (*o, h.clone())).collect()
            };
            let d = QueueDelta {
                topic: name.clone(),
                queue: qi as u32,
                runs: runs.iter().copied().collect(),
                mixed_tags: since_first(&q.mixed_tags),
                groups: since_first(&q.groups),
                ids: q.ids.since(first),
                keys: q.keys.since(first),
            };
            estimate += name.len()
                + 16
                + d.runs.len() * 48
                + (d.ids.len() + d.keys.len()) * 15
                + (d.mixed_tags.len() + d.groups.len()) * 16;
            queues.push(d);
        }
    }
    Taken {
        timer: s.timer.image(),
        stamped_ms: s.stamped_ms,
        offset_times: s.offset_times.clone(),
        queues,
        estimate,
    }
}

/// An image taken from the state ([`take`]) and not yet encoded: it owns what it holds, so the
/// state may change meanwhile.
pub struct Taken {
    timer: TimerImage,
    stamped_ms: u64,
    offset_times: BTreeMap<(String, String, u32), u64>,
    queues: Vec<QueueDelta>,
    /// About what the encoded body will take.
    estimate: usize,
}

impl Taken {
    /// The image's bytes, holding `snapshot`: the state's snapshot at the entry it was taken at.
    pub fn encode(self, snapshot: &[u8]) -> Vec<u8> {
        let image = ImageOut {
            snapshot,
            timer: &self.timer,
            stamped_ms: self.stamped_ms,
            offset_times: &self.offset_times,
            queues: &self.queues,
        };
        let out =
            format::envelope_to_fill(RESTART_IMAGE_FORMAT_VERSION, snapshot.len() + self.estimate);
        postcard_extend(&image, out).expect("an image always encodes")
    }
}

/// [`Image`] as it is written, borrowing its snapshot and its parts: the same fields in the same
/// order, so the same bytes.
#[derive(Serialize)]
struct ImageOut<'a> {
    #[serde(with = "serde_bytes")]
    snapshot: &'a [u8],
    timer: &'a TimerImage,
    stamped_ms: u64,
    offset_times: &'a BTreeMap<(String, String, u32), u64>,
    queues: &'a [QueueDelta],
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// The state a chain of images (oldest first) describes.
pub fn load(images: &[Vec<u8>]) -> io::Result<BrokerState> {
    let mut decoded = Vec::with_capacity(images.len());
    for (i, bytes) in images.iter().enumerate() {
        let what = || format!("restart image {} of {}", i + 1, images.len());
        let (v, body) = format::versioned(what, bytes, RESTART_IMAGE_FORMAT_VERSION)?;
        // Version 1's runs had no position: its bytes do not decode as today's. An image is a
        // cache, so an older one is not read: the start falls back to a full re-apply.
        if v != RESTART_IMAGE_FORMAT_VERSION {
            return Err(invalid(format!(
                "{} is of format {v}, this build reads only {RESTART_IMAGE_FORMAT_VERSION}",
                what()
            )));
        }
        decoded.push(postcard::from_bytes::<Image>(body).map_err(invalid)?);
    }
    let Some(last) = decoded.pop() else {
        return Err(invalid("no restart image"));
    };
    let mut acc: HashMap<(String, u32), QueueDelta> = HashMap::new();
    for d in decoded
        .into_iter()
        .flat_map(|i| i.queues)
        .chain(last.queues)
    {
        match acc.get_mut(&(d.topic.clone(), d.queue)) {
            Some(a) if a.end() == d.runs.first().map(|r| r.first_offset) => {
                a.runs.extend(d.runs);
                a.mixed_tags.extend(d.mixed_tags);
                a.groups.extend(d.groups);
                a.ids.extend(d.ids);
                a.keys.extend(d.keys);
            }
            // First seen, or a new queue under the same name (the topic was deleted and made
            // again, or its queues shrunk and grew): what came before is not this queue's.
            _ => {
                acc.insert((d.topic.clone(), d.queue), d);
            }
        }
    }
    let mut s = BrokerState::default();
    s.restore(&last.snapshot)?;
    s.timer = Timer::from_image(last.timer);
    s.stamped_ms = last.stamped_ms;
    s.offset_times = last.offset_times;
    let trimmed = s.trimmed_index;
    for (name, t) in s.topics.unordered_mut() {
        for (qi, q) in t.queues.iter_mut().enumerate() {
            let d = acc.remove(&(name.clone(), qi as u32));
            // A queue that serves nothing has no runs; what was gathered under its name is of
            // an earlier queue (deleted, or shrunk away, since it last had a message).
            if let Some(d) = d.filter(|_| q.next_offset > q.min_offset) {
                let from = d.runs.partition_point(|r| r.log_index <= trimmed);
                q.runs = d.runs[from..].iter().copied().collect();
                let first = q.runs.first().map_or(q.next_offset, |r| r.first_offset);
                q.bytes = q.runs.iter().map(|r| r.bytes as u64).sum();
                q.mixed_tags = d.mixed_tags.into_iter().filter(|e| e.0 >= first).collect();
                q.groups = d.groups.into_iter().filter(|e| e.0 >= first).collect();
                for (o, f) in d.ids.into_iter().filter(|e| e.0 >= first) {
                    q.ids.add_fingerprint(o, f);
                }
                for (o, f) in d.keys.into_iter().filter(|e| e.0 >= first) {
                    q.keys.add_fingerprint(o, f);
                }
            }
            let runs_add_up = q.runs.iter().zip(q.runs.iter().skip(1)).all(|(a, b)| {
                a.first_offset + a.count as u64 == b.first_offset && a.log_index <= b.log_index
            });
            let (start, end) = match (q.runs.first(), q.runs.last()) {
                (Some(a), Some(b)) => (a.first_offset, b.first_offset + b.count as u64),
                _ => (q.next_offset, q.next_offset),
            };
            if !runs_add_up || end != q.next_offset || start > q.min_offset {
                return Err(invalid(format!(
                    "queue {name}/{qi}: the images' runs cover offsets {start}..{end}, its \
                     state serves {}..{}",
                    q.min_offset, q.next_offset
                )));
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, StoredBody};
    use crate::state::{QueueState, TYPE_DELAY};
    use raftmq_rocketmq_v2::convert::P_MSGID;

    /// A small deterministic generator (xorshift), so a failure names its seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn message(r: &mut Rng, i: u64) -> StoredBody {
        let mut properties = vec![(P_MSGID.to_string(), format!("id-{i}"))];
        if r.below(3) == 0 {
            properties.push((
                raftmq_proto::MESSAGE_GROUP_PROPERTY.to_string(),
                format!("g{}", r.below(4)),
            ));
        }
        StoredBody {
            key: if r.below(2) == 0 {
                format!("k{}", i % 50)
            } else {
                String::new()
            },
            tag: ["", "a", "b"][r.below(3) as usize].to_string(),
            body: vec![b'x'; 1 + r.below(40) as usize].into(),
            properties,
        }
    }

    /// Applies a random history to `st` from index `from`, taking images along the way; returns
    /// the images and the next index.
    fn history(st: &mut BrokerState, seed: u64, entries: u64) -> Vec<Vec<u8>> {
        let mut r = Rng(seed);
        let mut images = Vec::new();
        let mut since = 0;
        let mut i = 0;
        let topics = ["a", "b", "d"];
        for index in 1..=entries {
            let cmd = match r.below(40) {
                _ if index <= 3 => Command::ConfigureTopic {
                    name: topics[index as usize - 1].into(),
                    queues: 3,
                    update: false,
                    message_type: if index == 3 { TYPE_DELAY } else { 0 },
                },
                0 => Command::DeleteTopic { name: "b".into() },
                1 => Command::ConfigureTopic {
                    name: "b".into(),
                    queues: 2 + r.below(3) as u32,
                    update: true,
                    message_type: 0,
                },
                2 => Command::Trim {
                    upto_log_index: index.saturating_sub(1 + r.below(30)),
                },
                3 => Command::Schedule {
                    topic: "d".into(),
                    queue: r.below(3) as u32,
                    producer_id: 0,
                    sequence: 0,
                    timestamp_ms: index,
                    id_property: P_MSGID.into(),
                    deliver_at_ms: vec![index + 1_000_000],
                    replaces: vec![],
                    messages: vec![message(&mut r, 1_000_000 + index)],
                },
                _ => Command::Send {
                    topic: topics[r.below(2) as usize].into(),
                    queue: r.below(3) as u32,
                    producer_id: 0,
                    sequence: 0,
                    timestamp_ms: index * 10,
                    messages: (0..1 + r.below(5))
                        .map(|_| {
                            i += 1;
                            message(&mut r, i)
                        })
                        .collect(),
                },
            };
            st.apply(index, 1, &cmd.encode());
            if r.below(25) == 0 || index == entries {
                images.push((take(st, since), st.snapshot()));
                since = index;
            }
        }
        // Encoded after the whole history, as the image writer may: an image holds what it
        // took, whatever apply did since.
        images
            .into_iter()
            .map(|(taken, snapshot)| taken.encode(&snapshot))
            .collect()
    }

    fn same_queue(name: &str, qi: usize, a: &QueueState, b: &QueueState) {
        let at = format!("{name}/{qi}");
        assert_eq!(a.runs, b.runs, "runs of {at}");
        assert_eq!(
            (a.min_offset, a.next_offset, a.bytes),
            (b.min_offset, b.next_offset, b.bytes),
            "{at}"
        );
        assert_eq!(a.mixed_tags, b.mixed_tags, "tags of {at}");
        assert_eq!(a.groups, b.groups, "groups of {at}");
        for i in 0..200 {
            for text in [format!("id-{i}"), format!("k{}", i % 50)] {
                assert_eq!(
                    a.ids.candidates(&text, a.min_offset),
                    b.ids.candidates(&text, b.min_offset),
                    "ids of {at}"
                );
                assert_eq!(
                    a.keys.candidates(&text, a.min_offset),
                    b.keys.candidates(&text, b.min_offset),
                    "keys of {at}"
                );
            }
        }
    }

    /// 1. A chain of images loads to the state apply built: the small state, the timer and, per
    ///    queue, the runs, hashes and lookups, through deletes, re-creations, resizes and trims.
    #[test]
    fn t1_a_chain_of_images_loads_to_the_state_apply_built() {
        for seed in 1..=40u64 {
            let mut live = BrokerState::default();
            let images = history(&mut live, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 400);
            let mut back = load(&images).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // Loading bumps it (as a restore does), so registration tells the nameserver again.
            assert_eq!(back.topic_version, live.topic_version + 1);
            back.topic_version -= 1;
            assert_eq!(back.snapshot(), live.snapshot(), "seed {seed}");
            assert_eq!(back.timer.image(), live.timer.image(), "seed {seed}");
            assert_eq!(back.stamped_ms, live.stamped_ms);
            assert_eq!(back.topics.len(), live.topics.len());
            for (name, t) in live.topics.unordered() {
                for (qi, q) in t.queues.iter().enumerate() {
                    same_queue(name, qi, &back.topics[name].queues[qi], q);
                }
            }
        }
    }

    /// 2. A chain with an image missing in the middle is refused, naming the queue, rather than
    ///    loaded with a hole in a queue; an image from a newer build is refused by name.
    #[test]
    fn t2_a_chain_with_a_hole_or_a_newer_image_is_refused() {
        let mut refused = 0;
        for seed in 1..=20u64 {
            let mut live = BrokerState::default();
            let mut images = history(&mut live, seed * 7919, 400);
            if images.len() < 4 {
                continue;
            }
            images.remove(images.len() / 2);
            if let Err(e) = load(&images) {
                assert!(e.to_string().starts_with("queue "), "{e}");
                refused += 1;
            }
        }
        assert!(refused >= 15, "only {refused} of 20 holes were noticed");
        let newer = format::envelope(RESTART_IMAGE_FORMAT_VERSION + 1, b"");
        let e = load(&[newer]).unwrap_err();
        assert!(e.to_string().contains("restart image 1 of 1"), "{e}");
        // Version 1 was written bare: its runs have no position, so it is not read.
        let e = load(&[b"\x00".to_vec()]).unwrap_err();
        assert!(
            e.to_string()
                .contains("restart image 1 of 1 is of format 1"),
            "{e}"
        );
    }

    /// 3. An image is written through borrowed fields ([`ImageOut`]) into a buffer sized ahead: its
    ///    bytes are those of the owned [`Image`] it reads back as, so the format is unchanged.
    #[test]
    fn t3_an_image_is_the_bytes_of_the_image_it_reads_back_as() {
        let mut images = 0;
        for seed in 1..=20u64 {
            let mut live = BrokerState::default();
            for bytes in history(&mut live, seed * 104_729, 400) {
                let (_, body) = format::versioned(String::new, &bytes, 2).unwrap();
                let owned: Image = postcard::from_bytes(body).unwrap();
                assert!(!owned.snapshot.is_empty());
                assert_eq!(postcard::to_stdvec(&owned).unwrap(), body, "seed {seed}");
                images += 1;
            }
        }
        assert!(images >= 40, "only {images} images made");
    }
}
