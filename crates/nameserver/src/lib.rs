//! raftmq nameserver (being built).
