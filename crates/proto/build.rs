//! Compiles `proto/` with protox (a pure-Rust protobuf compiler), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "raftmq/v1/broker.proto",
        "raftmq/v1/nameserver.proto",
        "raftmq/v1/raft.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("raftmq_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        // Message bodies as `Bytes`: a producer retrying a batch clones it without copying bodies,
        // and the broker takes them out of the request buffer without copying.
        .bytes(".raftmq.v1.Message.body")
        .bytes(".raftmq.v1.StoredMessage.body")
        // Properties as a `BTreeMap`: a message has a few, and a B-tree of a few needs no
        // hashing (SipHash and the table were a tenth of a send's instructions,
        // `scripts/instructions`) and keeps them in one order on every replica.
        .btree_map(".raftmq.v1.Message.properties")
        .btree_map(".raftmq.v1.StoredMessage.properties")
        // Encodes each message into a buffer reserved for all of it (see `src/codec.rs`).
        .codec_path("crate::codec::ReservingCodec")
        .skip_protoc_run()
        .compile_fds(fds)?;
    Ok(())
}
