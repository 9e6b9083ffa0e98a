//! raftmq cli (being built).
