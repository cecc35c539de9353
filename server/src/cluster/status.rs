//! What `CLUSTER_STATUS` and the raft metrics report: one node's view of
//! its group, read from raft's own metrics (no round trip to the others).

use inbox_wire::{ClusterMember, ClusterStatus};
use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;

use super::GroupHandle;

/// The role as `CLUSTER_STATUS` names it.
pub fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

impl GroupHandle {
    /// This node's view of the group.
    pub fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let replication = m.replication.as_ref();
        let members = m
            .membership_config
            .membership()
            .nodes()
            .map(|(&node_id, peer)| ClusterMember {
                node_id,
                raft_addr: peer.raft_addr.clone(),
                client_addr: peer.client_addr.clone(),
                matched_index: replication.map(|r| {
                    if node_id == m.id {
                        m.last_log_index.unwrap_or(0)
                    } else {
                        r.get(&node_id)
                            .and_then(|log_id| log_id.as_ref())
                            .map_or(0, |log_id| log_id.index)
                    }
                }),
            })
            .collect();
        ClusterStatus {
            node_id: m.id,
            role: role_name(m.state).into(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied_index: m.last_applied.map_or(0, |log_id| log_id.index),
            millis_since_quorum_ack: m.last_quorum_acked.map(|at| {
                use openraft::Instant as _;
                at.elapsed().as_millis() as u64
            }),
            members,
        }
    }
}

impl std::fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.status();
        f.debug_struct("GroupHandle")
            .field("node_id", &status.node_id)
            .field("role", &status.role)
            .field("term", &status.term)
            .finish()
    }
}
