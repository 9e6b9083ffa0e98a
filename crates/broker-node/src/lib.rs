//! raftmq broker-node (being built).
