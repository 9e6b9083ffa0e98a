//! The RocketMQ 5 wire contract (`proto/apache/rocketmq/v2`) compiles with protox, the compiler
//! the workspace builds with, and declares what the official clients call. Field numbers and types
//! are compared with the official Python client's descriptors by `check_wire.py` (run by
//! `scripts/test`).

#[test]
fn the_rocketmq_v2_protos_compile_with_protox_and_declare_every_rpc() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let fds = protox::compile(
        [
            "apache/rocketmq/v2/definition.proto",
            "apache/rocketmq/v2/service.proto",
        ],
        [&root],
    )
    .expect("the v2 protos compile");
    let service = fds
        .file
        .iter()
        .filter(|f| f.package() == "apache.rocketmq.v2")
        .flat_map(|f| f.service.iter())
        .find(|s| s.name() == "MessagingService")
        .expect("MessagingService is declared");
    let mut methods: Vec<(&str, bool, bool)> = service
        .method
        .iter()
        .map(|m| (m.name(), m.client_streaming(), m.server_streaming()))
        .collect();
    methods.sort();
    assert_eq!(
        methods,
        vec![
            ("AckMessage", false, false),
            ("ChangeInvisibleDuration", false, false),
            ("EndTransaction", false, false),
            ("ForwardMessageToDeadLetterQueue", false, false),
            ("GetOffset", false, false),
            ("Heartbeat", false, false),
            ("NotifyClientTermination", false, false),
            ("PullMessage", false, true),
            ("QueryAssignment", false, false),
            ("QueryOffset", false, false),
            ("QueryRoute", false, false),
            ("RecallMessage", false, false),
            ("ReceiveMessage", false, true),
            ("SendMessage", false, false),
            ("SyncLiteSubscription", false, false),
            ("Telemetry", true, true),
            ("UpdateOffset", false, false),
        ]
    );
}
