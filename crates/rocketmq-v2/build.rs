//! Compiles the RocketMQ 5 protos (`proto/apache/rocketmq/v2`) with protox (a pure-Rust protobuf
//! compiler), so no system `protoc` is needed. The generated types stay inside this crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "apache/rocketmq/v2/definition.proto",
        "apache/rocketmq/v2/service.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_protoc_run()
        .compile_fds(fds)?;
    Ok(())
}
