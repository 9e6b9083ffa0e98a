//! The log store on real files: openraft's storage conformance suite, and crash recovery.

use std::io::Write;

use bytes::Bytes;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use raftmq_raft_log::FlushMode;
use raftmq_raft_log::log_store::{LogStore, RecoveryReport, meta::Meta};
use raftmq_raft_log::state_machine::Adapter;
use raftmq_raft_log::testkit::NoState;
use raftmq_raft_log::types::{Entry, EntryPayload, Payload, TypeConfig, log_id};

/// The metadata store (vote, committed, purged) of the data dir `dir`.
fn meta_db(dir: &std::path::Path) -> sled::Db {
    sled::Config::new().path(dir.join("meta")).open().unwrap()
}

/// Opens (recovering) the log of the data dir `dir` with 1 MiB segments.
fn open_report(dir: &std::path::Path, db: &sled::Db) -> (LogStore, RecoveryReport) {
    open_with_window(dir, db, 64 << 10)
}

/// Opens the log with 1 MiB segments and this page-cache window.
fn open_with_window(
    dir: &std::path::Path,
    db: &sled::Db,
    window: u64,
) -> (LogStore, RecoveryReport) {
    let meta = Meta::new(db.open_tree("raft").unwrap());
    LogStore::open(&dir.join("log"), meta, 1 << 20, FlushMode::Fsync, window).unwrap()
}

fn open(dir: &std::path::Path, db: &sled::Db) -> LogStore {
    open_report(dir, db).0
}

/// A data dir whose log holds entries 1..=n (flushed) and a saved vote; the store is closed.
async fn written_log(n: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let db = meta_db(dir.path());
    let mut store = open(dir.path(), &db);
    append_durably(&mut store, [(1..=n).map(entry).collect()]).await;
    dir
}

/// Appends each batch, then saves a vote, which waits for every earlier append to be fsynced.
async fn append_durably(store: &mut LogStore, batches: impl IntoIterator<Item = Vec<Entry>>) {
    for b in batches {
        store.append(b, IOFlushed::noop()).await.unwrap();
    }
    store
        .save_vote(&openraft::impls::Vote::new(1, 1))
        .await
        .unwrap();
}

struct Builder;
impl openraft::testing::log::StoreBuilder<TypeConfig, LogStore, Adapter<NoState>, tempfile::TempDir>
    for Builder
{
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, Adapter<NoState>), openraft::StorageError<TypeConfig>>
    {
        let dir = tempfile::tempdir().unwrap();
        let db = meta_db(dir.path());
        let store = open(dir.path(), &db);
        let (sm, _) = Adapter::new(NoState, &dir.path().join("sm"), 1024, 0).unwrap();
        Ok((dir, store, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_openraft_storage_conformance_suite() {
    openraft::testing::log::Suite::test_all(Builder)
        .await
        .unwrap();
}

fn entry(i: u64) -> Entry {
    Entry {
        log_id: log_id(1, 1, i),
        payload: EntryPayload::Normal(Payload(Bytes::from(format!("entry-{i}").repeat(50)))),
    }
}

/// Everything not fsynced is lost, and the last record is torn: recovery keeps a valid prefix that
/// holds every entry that was flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_power_loss_and_torn_tail_recover_to_a_valid_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let durable_len;
    {
        let db = meta_db(dir.path());
        let mut store = open(dir.path(), &db);
        store
            .append((1..=100).map(entry), IOFlushed::noop())
            .await
            .unwrap();
        // save_vote waits for every earlier append to be on disk.
        store
            .save_vote(&openraft::impls::Vote::new(1, 1))
            .await
            .unwrap();
        let seg = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        // What was written: the segment is preallocated, zeros past its records.
        let bytes = std::fs::read(&seg).unwrap();
        durable_len = bytes.iter().rposition(|b| *b != 0).unwrap() as u64 + 1;
        assert!(
            (bytes.len() as u64) > durable_len,
            "the active segment is preallocated past its records"
        );
        store
            .append((101..=150).map(entry), IOFlushed::noop())
            .await
            .unwrap();
        // Power loss: what was not synced is gone, and half a record was being written.
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(durable_len + 37).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&[0xAB; 11]).unwrap();
    }
    let db = meta_db(dir.path());
    let (mut store, report) = open_report(dir.path(), &db);
    assert_eq!(report.entries, 100);
    assert_eq!(report.truncated_bytes, 48);
    let mut r = store.get_log_reader().await;
    let got = r.try_get_log_entries(1..=100).await.unwrap();
    assert_eq!(got, (1..=100).map(entry).collect::<Vec<_>>());
    // The log goes on from the recovered tail.
    store.append([entry(101)], IOFlushed::noop()).await.unwrap();
    assert_eq!(
        r.try_get_log_entries(101..102).await.unwrap(),
        vec![entry(101)]
    );
}

/// A flipped bit inside a sealed segment is caught by the CRC.
///
/// With the segment's index file (written when it was sealed) the segment is not read at start:
/// the damaged record is caught when it is read, and the read fails naming it rather than serving
/// it. Without an index file (an older build's log, a lost index) recovery reads it: that segment
/// is cut there and every later segment is dropped, so the member never serves a damaged entry.
/// Recovery also reports how far the member had stored (`repair_floor`), and the member refuses to
/// vote or campaign until replication has brought its log back there (regression for bug E: a
/// node whose log was cut voted and led with it, and the group diverged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t22_flipped_bit_is_detected_by_crc() {
    // 1 MiB segments: about 3,000 entries of ~350 bytes spread over several segments.
    let dir = written_log(6000).await;
    let files = |ext: &str| {
        let mut v: Vec<_> = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        v.sort();
        v
    };
    let segs = files("log");
    assert!(segs.len() >= 2, "test needs several segments");
    assert_eq!(
        files("idx").len(),
        segs.len() - 1,
        "every sealed segment indexed"
    );
    let mut bytes = std::fs::read(&segs[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x04;
    std::fs::write(&segs[0], &bytes).unwrap();
    {
        let db = meta_db(dir.path());
        let (mut store, report) = open_report(dir.path(), &db);
        assert_eq!(
            report.truncated_bytes, 0,
            "an indexed segment is not read at start"
        );
        let mut r = store.get_log_reader().await;
        let e = r.try_get_log_entries(1..=6000).await.unwrap_err();
        assert!(e.to_string().contains("00000000000000000001.log"), "{e}");
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.unwrap().index, 6000);
    }
    for idx in files("idx") {
        std::fs::remove_file(idx).unwrap();
    }
    let db = meta_db(dir.path());
    let (mut store, report) = open_report(dir.path(), &db);
    assert!(report.truncated_bytes > 0);
    assert_eq!(report.dropped_segments, segs.len() - 1);
    let state = store.get_log_state().await.unwrap();
    let last = state.last_log_id.unwrap().index;
    assert!(last < 6000 && last > 0);
    // The later segments' names alone show it held entries past the cut.
    assert!(
        report.repair_floor > last,
        "repair floor {} above the cut log's last index {last}",
        report.repair_floor
    );
    assert_eq!(
        store.reader().repairing(),
        Some((last, report.repair_floor))
    );
    let mut r = store.get_log_reader().await;
    assert_eq!(
        r.try_get_log_entries(1..=last).await.unwrap(),
        (1..=last).map(entry).collect::<Vec<_>>()
    );
}

/// A flipped bit inside one payload of the newest segment: recovery cuts the log before that
/// record, yet follows the intact records after it and reports the last of them as the repair
/// floor, so the member knows it had stored (and may have acknowledged) up to there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t23_repair_floor_sees_past_a_damaged_payload() {
    let dir = written_log(100).await;
    let seg = std::fs::read_dir(dir.path().join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    // Walk the record headers (format in record.rs) to the record of index 40.
    let mut pos = 0usize;
    loop {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let index = u64::from_le_bytes(bytes[pos + 8..pos + 16].try_into().unwrap());
        if index == 40 {
            bytes[pos + 32 + len / 2] ^= 0x10;
            break;
        }
        pos += 32 + len;
    }
    std::fs::write(&seg, &bytes).unwrap();
    let db = meta_db(dir.path());
    let (store, report) = open_report(dir.path(), &db);
    assert_eq!(report.repair_floor, 100, "{report:?}");
    assert_eq!(store.reader().repairing(), Some((39, 100)));
}

/// The in-memory tail the store serves recent reads from says exactly what the files say: after
/// appends across segment rolls, a truncation and a re-append in a new term, and a purge, every
/// read of the open store equals the same read after reopening from disk (where the tail is empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t24_recent_reads_from_memory_match_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let db = meta_db(dir.path());
    let mut store = open(dir.path(), &db);
    let big = |term: u64, i: u64| Entry {
        log_id: log_id(term, 1, i),
        payload: EntryPayload::Normal(Payload(Bytes::from(vec![
            (i % 251) as u8 + term as u8;
            20_000
        ]))),
    };
    // 300 entries of 20 KB: several 1 MiB segments.
    store
        .append((1..=300).map(|i| big(1, i)), IOFlushed::noop())
        .await
        .unwrap();
    // A new leader cuts 251.. and writes other entries there.
    store.truncate_after(Some(log_id(1, 1, 250))).await.unwrap();
    let cut = store
        .get_log_reader()
        .await
        .try_get_log_entries(240..300)
        .await
        .unwrap();
    assert_eq!(
        cut.last().map(|e| e.log_id.index),
        Some(250),
        "nothing past the cut"
    );
    store
        .append((251..=320).map(|i| big(2, i)), IOFlushed::noop())
        .await
        .unwrap();
    store.purge(log_id(1, 1, 40)).await.unwrap();
    store
        .save_vote(&openraft::impls::Vote::new(2, 1))
        .await
        .unwrap();
    let ranges = [(1, 400), (35, 60), (240, 260), (300, 321), (319, 330)];
    let mut reader = store.get_log_reader().await;
    let mut live = Vec::new();
    for (a, b) in ranges {
        live.push(reader.try_get_log_entries(a..b).await.unwrap());
    }
    assert_eq!(live[0].len(), 280, "41..=320 held");
    assert_eq!(live[0][0].log_id.index, 41);
    assert_eq!(live[2][10].log_id, log_id(1, 1, 250));
    assert_eq!(live[2][11].log_id, log_id(2, 1, 251));
    drop((store, reader));
    let mut store = open(dir.path(), &db);
    let mut reader = store.get_log_reader().await;
    for ((a, b), want) in ranges.into_iter().zip(live) {
        let got = reader.try_get_log_entries(a..b).await.unwrap();
        assert_eq!(got, want, "entries {a}..{b} from the files");
    }
}

/// Bytes of `path` in the page cache, as util-linux `fincore` reports them.
fn resident_bytes(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("run fincore (util-linux)");
    assert!(out.status.success(), "fincore: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("fincore output {out:?}: {e}"))
}

/// Once durable, sealed segments leave the page cache whole and the active one keeps only its
/// window; with the window at 0 the kernel keeps everything (which shows the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t25_durable_log_pages_leave_the_page_cache() {
    for window in [0u64, 128 << 10] {
        let dir = tempfile::tempdir().unwrap();
        let db = meta_db(dir.path());
        let (mut store, _) = open_with_window(dir.path(), &db, window);
        // 400 entries of 8 KB, appended 20 at a time: 3+ segments of 1 MiB.
        let body = |i: u64| Entry {
            log_id: log_id(1, 1, i),
            payload: EntryPayload::Normal(Payload(Bytes::from(vec![(i % 251) as u8; 8_000]))),
        };
        // The vote waits for every earlier append to be fsynced (and so dropped).
        append_durably(
            &mut store,
            (0..20).map(|c| (c * 20 + 1..=c * 20 + 20).map(body).collect()),
        )
        .await;
        let mut segments: Vec<_> = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        segments.sort();
        assert!(segments.len() >= 3, "{segments:?}");
        let (active, sealed) = segments.split_last().unwrap();
        for s in sealed {
            let (len, res) = (std::fs::metadata(s).unwrap().len(), resident_bytes(s));
            if window == 0 {
                assert!(res * 2 > len, "{s:?}: only {res} of {len} bytes cached");
            } else {
                assert!(
                    res <= 4096,
                    "{s:?}: sealed, still {res} of {len} bytes cached"
                );
            }
        }
        let (len, res) = (
            std::fs::metadata(active).unwrap().len(),
            resident_bytes(active),
        );
        if window > 0 && len > window + (1 << 20) {
            assert!(
                res <= window + (1 << 20) + 4096,
                "active: {res} of {len} cached"
            );
        }
        // Everything still reads back (from the tail cache or the file).
        let got = store
            .get_log_reader()
            .await
            .try_get_log_entries(1..401)
            .await
            .unwrap();
        assert_eq!(got.len(), 400);
        assert!(got.iter().all(|e| e == &body(e.log_id.index)));
    }
}

/// The log's segment files, oldest first, with their lengths on disk.
fn segment_files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p, len)
        })
        .collect();
    v.sort();
    v
}

/// The active segment is preallocated to the segment size and its zeros are unused space, not a
/// torn tail: a clean reopen cuts nothing, and appends go on right after the last record (not
/// after the preallocation), across reopens. A sealed segment is exactly its records, so it opens
/// from its index file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_preallocated_segments_reopen_without_a_cut_and_seal_to_their_records() {
    let dir = written_log(100).await;
    let files = segment_files(dir.path());
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].1, 1 << 20, "the active segment is preallocated");
    for round in 0..2u64 {
        let db = meta_db(dir.path());
        let (mut store, report) = open_report(dir.path(), &db);
        let n = 100 + round * 100;
        assert_eq!(report.entries, n, "round {round}");
        assert_eq!(
            report.truncated_bytes, 0,
            "round {round}: zeros are no torn tail"
        );
        append_durably(&mut store, [(n + 1..=n + 100).map(entry).collect()]).await;
        let got = store
            .get_log_reader()
            .await
            .try_get_log_entries(1..n + 101)
            .await
            .unwrap();
        assert_eq!(got, (1..=n + 100).map(entry).collect::<Vec<_>>());
    }
    // Entries of ~400 bytes: 300 fit one 1 MiB segment. Fill past it.
    {
        let db = meta_db(dir.path());
        let (mut store, _) = open_report(dir.path(), &db);
        append_durably(
            &mut store,
            (0..30).map(|c| (301 + c * 100..=400 + c * 100).map(entry).collect()),
        )
        .await;
    }
    let files = segment_files(dir.path());
    assert!(files.len() >= 2, "{files:?}");
    for (p, len) in &files[..files.len() - 1] {
        let bytes = std::fs::read(p).unwrap();
        assert_eq!(
            bytes.iter().rposition(|b| *b != 0).map(|i| i as u64 + 1),
            Some(*len),
            "{p:?}: a sealed segment ends at its last record"
        );
        assert!(p.with_extension("idx").exists(), "{p:?} has its index file");
    }
    let db = meta_db(dir.path());
    let (mut store, report) = open_report(dir.path(), &db);
    assert_eq!(report.entries, 3300);
    assert_eq!(report.truncated_bytes, 0);
    let got = store
        .get_log_reader()
        .await
        .try_get_log_entries(1..3301)
        .await
        .unwrap();
    assert_eq!(got, (1..=3300).map(entry).collect::<Vec<_>>());
}
