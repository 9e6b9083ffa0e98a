//! One module per command family; each takes parsed arguments and does the work.

pub mod admin_ops;
pub mod bench;
pub mod bench_delay;
pub mod bench_hops;
pub mod bench_lookup;
pub mod bench_pop;
pub mod catchup;
pub mod cert;
pub mod cluster;
pub mod console;
pub mod consume;
pub mod demo;
pub mod group;
pub mod msg;
pub mod node_status;
pub mod playground;
pub mod produce;
pub mod restart_bench;
pub mod topic;
pub mod txn;
pub mod users;
