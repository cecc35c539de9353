//! Where a request may be served: every decision the daemon makes about
//! the cluster, behind one interface.
//!
//! A connection asks its [`Route`], for each request that reaches the
//! engine:
//! - [`Route::admit`], before the engine sees it: whether this node serves
//!   it at all. A single node serves everything; a group's member that
//!   does not lead answers `NOT_LEADER` (with the leader's address) except
//!   for requests about this node alone;
//! - [`Route::before_read`], before a read runs: a group's leader confirms
//!   it still leads (read-index) and, for a read of the replicated state,
//!   notes the leadership the read runs in;
//! - [`Route::after_read`], before the read is answered: the leader waits
//!   until what the read saw is committed, under that same leadership;
//! - [`Route::name_leader`], on every reply: a write whose round lost its
//!   leadership answers `NOT_LEADER` naming the new leader.
//!
//! Every call is given the request's [`OpInfo`] and its [`Key`] (the user
//! or conversation it is about, see [`Key::of`]). Neither route here looks
//! at the key; it is there for a node that owns only part of the keys: a
//! sharded node (a set of hash slots of uids and conversation ids) will be
//! a third variant, whose `admit` answers `WRONG_SHARD` with the owner's
//! address and the shard map's version for a key it does not own, and
//! whose reads and replies go through the group that owns the key's slot.
//!
//! `Route` is an enum, not a trait object: the single node's checks
//! compile to nothing, so a send's path gains no call through a pointer
//! and no allocation.

use std::borrow::Cow;
use std::sync::Arc;

use inbox_engine::inbox::Leader;
use inbox_engine::Inbox;
use inbox_wire::{ErrorCode, ErrorReply, Request, Response};

use crate::cluster::GroupHandle;
use crate::ops::{Key, OpInfo};

/// How this node serves requests.
#[derive(Clone)]
pub enum Route {
    /// A node on its own: it serves every request from its engine.
    Single,
    /// A member of a replicated group: only the leader serves, except
    /// requests about this node alone.
    Group(GroupHandle),
}

/// What a read noted before it ran, for [`Route::after_read`].
#[must_use = "a read of the replicated state is settled before it is answered"]
pub struct ReadTicket {
    leadership: Option<Arc<Leader>>,
}

impl Route {
    /// The route of a node with `group` (`None`: a single node).
    pub fn new(group: Option<GroupHandle>) -> Route {
        match group {
            Some(group) => Route::Group(group),
            None => Route::Single,
        }
    }

    /// The group this node is a member of, if any.
    pub fn group(&self) -> Option<&GroupHandle> {
        match self {
            Route::Single => None,
            Route::Group(group) => Some(group),
        }
    }

    /// The engine requests go to: a group's current one (a snapshot
    /// install replaces it), else the node's own `inbox`, borrowed at no
    /// cost.
    pub fn engine<'a>(&self, inbox: &'a Arc<Inbox>) -> Cow<'a, Arc<Inbox>> {
        match self {
            Route::Single => Cow::Borrowed(inbox),
            Route::Group(group) => Cow::Owned(group.inbox()),
        }
    }

    /// Whether this node serves a request described by `info`, about
    /// `key`; the refusal to answer if not.
    #[inline]
    pub fn admit(&self, info: &OpInfo, _key: Key) -> Result<(), ErrorReply> {
        match self {
            Route::Single => Ok(()),
            Route::Group(group) if !info.about_this_node && !group.is_leading() => {
                Err(group.not_leader("not the leader"))
            }
            Route::Group(_) => Ok(()),
        }
    }

    /// Before a read described by `info` runs: a group's leader confirms
    /// it still leads and has applied everything committed when the read
    /// arrived (read-index), then, for a read of the replicated state,
    /// notes the leadership it reads in. `NOT_LEADER` if it cannot.
    pub async fn before_read(&self, info: &OpInfo, _key: Key) -> Result<ReadTicket, ErrorReply> {
        let none = ReadTicket { leadership: None };
        let group = match self {
            Route::Group(group) if !info.about_this_node => group,
            _ => return Ok(none),
        };
        group.read_index().await?;
        if !info.reads_replicated_state {
            return Ok(none);
        }
        match group.leadership() {
            Some(leadership) => Ok(ReadTicket {
                leadership: Some(leadership),
            }),
            None => Err(group.not_leader("not the leader")),
        }
    }

    /// After a read ran, before it is answered: waits until what it read
    /// is committed under the leadership it began in. `NOT_LEADER` if that
    /// leadership ends first.
    pub async fn after_read(&self, ticket: ReadTicket) -> Result<(), ErrorReply> {
        match (self, ticket.leadership) {
            (Route::Group(group), Some(leadership)) => group.settle_read(&leadership).await,
            _ => Ok(()),
        }
    }

    /// Names the leader in a `NOT_LEADER` reply that does not yet (a round
    /// that lost its leadership fails inside the engine, which does not
    /// know who leads now).
    #[inline]
    pub fn name_leader(&self, response: &mut Response) {
        if let (Route::Group(group), Response::Error(err)) = (self, response) {
            if err.code == ErrorCode::NotLeader && err.leader_addr.is_none() {
                *err = group.not_leader(&err.message);
            }
        }
    }

    /// `CLUSTER_STATUS`: every member answers for itself; a single node
    /// says it is one.
    pub fn status(&self) -> inbox_wire::ClusterStatus {
        match self {
            Route::Group(group) => group.status(),
            Route::Single => inbox_wire::ClusterStatus {
                role: "single".into(),
                ..inbox_wire::ClusterStatus::default()
            },
        }
    }

    /// `CLUSTER_ADD_NODE` or `CLUSTER_REMOVE_NODE`, run by the group (a
    /// follower answers `NOT_LEADER`); a node without a group says so.
    pub async fn change_membership(&self, request: Request) -> Response {
        let Route::Group(group) = self else {
            return Response::Error(crate::cluster::not_in_a_group());
        };
        let done = match request {
            Request::ClusterAddNode(req) => group.add_node(req).await.map(Response::ClusterAddNode),
            Request::ClusterRemoveNode(req) => group
                .remove_node(req)
                .await
                .map(Response::ClusterRemoveNode),
            other => Err(ErrorReply::new(
                ErrorCode::Internal,
                0,
                format!("{} is not a membership change", other.op().name()),
            )),
        };
        done.unwrap_or_else(Response::Error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::describe;
    use inbox_wire::Op;

    #[tokio::test]
    async fn a_single_node_serves_every_request_and_settles_reads_at_once() {
        let route = Route::Single;
        for &op in Op::ALL {
            let info = describe(op);
            assert!(route.admit(&info, Key::Node).is_ok(), "{}", op.name());
            let ticket = route.before_read(&info, Key::User(1)).await;
            let ticket = ticket.unwrap_or_else(|e| panic!("{}: {e:?}", op.name()));
            assert!(ticket.leadership.is_none());
            assert!(route.after_read(ticket).await.is_ok());
        }
        let mut refusal = Response::Error(ErrorReply::new(ErrorCode::NotLeader, 0, "lost"));
        route.name_leader(&mut refusal);
        match refusal {
            Response::Error(err) => assert_eq!(err.leader_addr, None),
            other => panic!("{other:?}"),
        }
        assert_eq!(route.status().role, "single");
        let change = Request::ClusterRemoveNode(Default::default());
        match route.change_membership(change).await {
            Response::Error(err) => assert_eq!(err.code, ErrorCode::BadRequest),
            other => panic!("{other:?}"),
        }
    }
}
