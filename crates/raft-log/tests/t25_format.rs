//! Format versions at start: a data dir or a snapshot file written by a newer format stops the
//! member with a message that says so, instead of being misread.

use raftmq_raft_log::testkit::NoState;
use raftmq_raft_log::{Member, MemberConfig, RaftConfig};

fn config(data_dir: &std::path::Path) -> MemberConfig {
    MemberConfig {
        cluster: "DefaultCluster".into(),
        broker: "broker-a".into(),
        node_id: 1,
        initial_members: [(1, "127.0.0.1:1".to_string())].into(),
        peer_routes: Default::default(),
        data_dir: data_dir.to_path_buf(),
        raft: RaftConfig::default(),
        tls: None,
    }
}

#[tokio::test]
async fn t01_a_data_dir_of_a_newer_format_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    {
        // What a build of data-dir format version 3 would have recorded.
        let db = sled::Config::new()
            .path(dir.path().join("meta"))
            .open()
            .unwrap();
        let tree = db.open_tree("raft").unwrap();
        tree.insert(b"format_version", postcard::to_stdvec(&3u32).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    let Err(e) = Member::start(config(dir.path()), NoState).await else {
        panic!("a member started on a data dir of a newer format");
    };
    assert_eq!(
        e.chain(),
        format!(
            "cannot open the metadata store {}: the data dir was written by format version 3; \
             this broker-node reads up to version 1: upgrade the binary",
            dir.path().join("meta").display()
        )
    );
    // Nothing else was created: the log was not opened.
    assert!(!dir.path().join("log").exists());
}
