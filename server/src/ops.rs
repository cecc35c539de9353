//! What the daemon knows about each request opcode, in one table.
//!
//! [`describe`] answers, for every [`Op`] of the protocol: how the request
//! is ordered against the others of its connection ([`Order`]), whether it
//! reads the state only when its reply is awaited, whether it reads the
//! replicated state (so a group's leader must settle the read), whether it
//! is about this node alone (every member of a group answers it for
//! itself), whether it needs the admin token, and who answers it
//! ([`Handler`]). The connection ([`crate::conn`]), the routing
//! ([`crate::route`]) and the engine dispatcher ([`crate::service`]) all
//! read this table and keep no list of their own.
//!
//! The match in [`describe`] has no catch-all arm, so an opcode added to
//! `inbox_wire` does not compile until it is described here. [`Key::of`]
//! is the one other per-op fact, and the only one that needs the request's
//! body: which user or conversation the request is about.

use inbox_wire::{Op, Request};

/// How a request is ordered against the others of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Goes to the sequencer: queued in arrival order, its reply comes once
    /// it is durable. Later reads wait for it.
    Write,
    /// Reads state: runs once every earlier write of the connection is
    /// durable, and before any later write is queued.
    Read,
    /// `SYNC`: decided against state like a read, and may bump the
    /// device's generation like a write.
    ReadWrite,
}

/// Who answers a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// The connection itself, with no engine call: `HELLO` (only valid as
    /// the first frame), `PING`, the subscriptions.
    Connection,
    /// The routing layer: `CLUSTER_STATUS` and membership changes.
    Cluster,
    /// One engine call through [`crate::service::start`], ordered by
    /// [`OpInfo::order`] and routed by [`crate::route::Route`].
    Engine,
}

/// Everything the daemon needs to know about an opcode before it looks at
/// the request's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    pub order: Order,
    /// The engine reads the state when the reply future is polled rather
    /// than inside [`crate::service::start`]: the connection holds later
    /// writes back until that future is done.
    pub reads_when_awaited: bool,
    /// Answers from the replicated state, which a group's leader applies
    /// before it commits: the read is settled
    /// ([`crate::route::Route::after_read`]) before it is answered.
    pub reads_replicated_state: bool,
    /// About this node's own store and files: every member of a group
    /// answers it for itself, followers included, with no read-index.
    pub about_this_node: bool,
    /// Inspects or steers the whole store rather than one user's data:
    /// needs the admin token.
    pub admin: bool,
    pub handler: Handler,
}

impl OpInfo {
    /// A write of one user's or conversation's data.
    const fn write() -> OpInfo {
        OpInfo {
            order: Order::Write,
            reads_when_awaited: false,
            reads_replicated_state: false,
            about_this_node: false,
            admin: false,
            handler: Handler::Engine,
        }
    }

    /// A read of the replicated state, decided inside `start` (it waits
    /// for a round to settle, or needs no wait at all).
    const fn read() -> OpInfo {
        OpInfo {
            order: Order::Read,
            reads_replicated_state: true,
            ..OpInfo::write()
        }
    }

    /// A read of the replicated state that runs when awaited.
    const fn read_when_awaited() -> OpInfo {
        OpInfo {
            reads_when_awaited: true,
            ..OpInfo::read()
        }
    }

    /// An operator's request: admin token, ordered like a read, and not a
    /// read of the replicated state.
    const fn admin(about_this_node: bool, reads_when_awaited: bool) -> OpInfo {
        OpInfo {
            order: Order::Read,
            reads_when_awaited,
            reads_replicated_state: false,
            about_this_node,
            admin: true,
            handler: Handler::Engine,
        }
    }

    /// A request the connection answers itself.
    const fn connection() -> OpInfo {
        OpInfo {
            order: Order::Read,
            handler: Handler::Connection,
            ..OpInfo::write()
        }
    }

    /// A cluster request (admin token, answered by the routing layer).
    const fn cluster() -> OpInfo {
        OpInfo {
            admin: true,
            handler: Handler::Cluster,
            ..OpInfo::connection()
        }
    }
}

/// The description of `op`.
pub const fn describe(op: Op) -> OpInfo {
    match op {
        Op::Join
        | Op::Leave
        | Op::Send
        | Op::Recall
        | Op::Edit
        | Op::RegisterDevice
        | Op::RevokeDevice
        | Op::Ack
        | Op::FinishLease
        | Op::MarkRead
        | Op::ClearDirty
        | Op::SetConvFlags
        | Op::BeginSnapshot
        | Op::AckSnapshot => OpInfo::write(),
        Op::Sync => OpInfo {
            order: Order::ReadWrite,
            ..OpInfo::read()
        },
        Op::Dirty | Op::ConvMode => OpInfo::read(),
        Op::Devices
        | Op::Pull
        | Op::History
        | Op::ConvList
        | Op::SnapshotInfo
        | Op::SnapshotPage => OpInfo::read_when_awaited(),
        Op::Stats | Op::Memory => OpInfo::admin(true, false),
        Op::ExplainSegment => OpInfo::admin(true, true),
        Op::Explain => OpInfo::admin(false, true),
        Op::Compact | Op::Checkpoint => OpInfo::admin(false, false),
        Op::ClusterStatus | Op::ClusterAddNode | Op::ClusterRemoveNode => OpInfo::cluster(),
        Op::Hello | Op::Ping | Op::Subscribe | Op::SubscribeDirty | Op::Unsubscribe => {
            OpInfo::connection()
        }
    }
}

/// The data a request is about, which decides where it may be served.
///
/// Today every route serves every key; a node that owns only some of the
/// keys (a shard) answers a request for one it does not own with where to
/// find it instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// One user's state (devices, sync, per-user conversation state).
    User(u64),
    /// One conversation's state (membership, messages).
    Conv(u64),
    /// Not one user's or conversation's: the connection's own requests,
    /// the node's figures, the whole store.
    Node,
}

impl Key {
    /// The key `request` is about.
    pub fn of(request: &Request) -> Key {
        match request {
            Request::Join(r) | Request::Leave(r) => Key::Conv(r.conv),
            Request::Send(r) => Key::Conv(r.conv),
            Request::Recall(r) => Key::Conv(r.conv),
            Request::Edit(r) => Key::Conv(r.conv),
            Request::History(r) => Key::Conv(r.conv),
            Request::ConvMode(r) => Key::Conv(r.conv),
            Request::RegisterDevice(r) | Request::RevokeDevice(r) | Request::BeginSnapshot(r) => {
                Key::User(r.uid)
            }
            Request::Devices(r) | Request::Dirty(r) | Request::Explain(r) => Key::User(r.uid),
            Request::Sync(r) => Key::User(r.uid),
            Request::Ack(r) => Key::User(r.uid),
            Request::FinishLease(r) => Key::User(r.uid),
            Request::Pull(r) => Key::User(r.uid),
            Request::MarkRead(r) => Key::User(r.uid),
            Request::SetConvFlags(r) => Key::User(r.uid),
            Request::ConvList(r) => Key::User(r.uid),
            Request::ClearDirty(r) => Key::User(r.uid),
            Request::SnapshotInfo(r) => Key::User(r.uid),
            Request::SnapshotPage(r) => Key::User(r.uid),
            Request::AckSnapshot(r) => Key::User(r.uid),
            Request::Hello(_)
            | Request::Ping(_)
            | Request::Subscribe(_)
            | Request::SubscribeDirty(_)
            | Request::Unsubscribe(_)
            | Request::Stats(_)
            | Request::ExplainSegment(_)
            | Request::Compact(_)
            | Request::Checkpoint(_)
            | Request::Memory(_)
            | Request::ClusterStatus(_)
            | Request::ClusterAddNode(_)
            | Request::ClusterRemoveNode(_) => Key::Node,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_the_protocol_decodes_is_described() {
        let decoded: Vec<Op> = (0..=u8::MAX).filter_map(Op::from_u8).collect();
        assert_eq!(decoded.len(), Op::ALL.len());
        // `describe` has no catch-all arm, so each of these has an entry of
        // its own; the walk checks that `Op::ALL` (what the other tests
        // and the coherence checks walk) misses none of them.
        for op in decoded {
            assert!(Op::ALL.contains(&op), "{} missing from Op::ALL", op.name());
        }
        let hello = describe(Op::Hello);
        assert_eq!(hello.handler, Handler::Connection, "the handshake");
        assert!(!hello.admin, "a client must be able to say HELLO");
    }

    #[test]
    fn every_description_is_coherent() {
        for &op in Op::ALL {
            let info = describe(op);
            let name = op.name();
            if info.reads_when_awaited {
                assert_eq!(info.order, Order::Read, "{name} reads when awaited");
                assert_eq!(info.handler, Handler::Engine, "{name}");
            }
            if info.reads_replicated_state {
                assert_eq!(info.handler, Handler::Engine, "{name}");
                assert_ne!(info.order, Order::Write, "{name} is a read");
                assert!(!info.about_this_node, "{name} reads replicated state");
                assert!(!info.admin, "{name} is a client's read");
            }
            if info.order != Order::Read {
                assert_eq!(info.handler, Handler::Engine, "{name} is a write");
                assert!(!info.admin, "{name} writes one user's data");
            }
            if info.about_this_node {
                assert!(info.admin, "{name} is an operator's request");
            }
            if info.handler == Handler::Cluster {
                assert!(info.admin, "{name} steers the cluster");
            }
        }
    }

    #[test]
    fn a_client_request_is_keyed_by_its_user_or_conversation_and_an_operator_request_by_the_node() {
        let send = Request::Send(inbox_wire::SendReq {
            conv: 7,
            sender: 3,
            ..Default::default()
        });
        assert_eq!(Key::of(&send), Key::Conv(7));
        let sync = Request::Sync(inbox_wire::SyncReq {
            uid: 9,
            ..Default::default()
        });
        assert_eq!(Key::of(&sync), Key::User(9));
        assert_eq!(Key::of(&Request::Stats(inbox_wire::Empty {})), Key::Node);
    }
}
