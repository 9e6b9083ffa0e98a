//! raftmq client (being built).
