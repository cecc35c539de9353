//! inbox-server: the inboxd daemon, its async Rust client, and inboxctl.
//!
//! - [`server::run`]: the daemon's lifecycle (bind, accept, drain, sync);
//! - [`conn`]: one connection: handshake, limits, pipelining, hint pushes;
//! - [`ops`]: what the daemon knows of each opcode (ordering, reads,
//!   admin, who answers), in one table;
//! - [`route`]: where a request may be served (single node, group leader);
//! - [`service`]: one request → one `Inbox` call → one reply, with the
//!   field-for-field translation in [`convert`]. No inbox logic lives here;
//! - [`metrics`]: Prometheus text exposition;
//! - [`config`]: flags > `INBOXD_*` env > TOML file > defaults;
//! - [`client`]: the pipelined async client used by inboxctl and the tests;
//! - [`tls`]: rustls setup for every listener and for the client;
//! - [`dump`]: the records of a data directory in readable form;
//! - [`salvage`]: the report of `inboxd salvage`, readable or as JSON;
//! - [`disk_space`]: a new store's segments sized to its disk;
//! - [`heap`]: the daemon's counting allocator, and the process's memory
//!   beside the engine's structures.

pub mod alone;
pub mod client;
pub mod cluster;
pub mod config;
pub mod conn;
pub mod convert;
pub mod disk_space;
pub mod dump;
pub mod heap;
pub mod hints;
pub mod metrics;
pub mod ops;
pub mod page_cache;
pub mod read_pool;
pub mod route;
pub mod salvage;
pub mod server;
pub mod service;
pub mod tls;
