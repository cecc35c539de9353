//! Membership changes on the leader: `CLUSTER_ADD_NODE` and
//! `CLUSTER_REMOVE_NODE` (see `docs/CLUSTER.md`, "Membership changes").
//!
//! **Adding** a node: raft's `add_learner` (the node receives the log, or
//! a snapshot when the leader's log no longer holds what it lacks), a wait
//! until it has caught up, then `change_membership` makes it a voter
//! through a joint configuration. The wait is openraft's blocking
//! `add_learner`'s, done here after a non-blocking call: blocking would
//! hold the pause below, and so the leader's writes, for the whole
//! catch-up.
//!
//! **Removing** a voter: `change_membership` with `retain` makes it a
//! learner (joint consensus), so that the leader goes on replicating to it
//! until it holds the configuration that no longer counts it as a voter: a
//! removed member that still runs then never stands for election. Then the
//! learner is dropped from the membership (`RemoveNodes`).
//!
//! **Indexes.** The engine gives each of the leader's rounds its raft
//! index itself, ahead of raft (the hand-off proposes them in order), so
//! raft's own membership entries would collide with rounds the engine has
//! made but not handed over. Each membership step therefore runs in a
//! *pause*: the hand-off stops proposing; the rounds already proposed are
//! left to commit (a short, bounded wait); the engine follows (replies of
//! rounds not committed fail with `NOT_LEADER`, as on any loss of
//! leadership, and clients retry them by their idempotency keys), and its
//! rounds that were never proposed are discarded; raft then writes its
//! entries, which the engine stores as empty rounds at the same indexes,
//! like every other member; once the step is committed the engine leads
//! again under the same term, from the next index. The catch-up of a new
//! node runs outside any pause: writes go on meanwhile.
//!
//! A change runs in a task of its own, holding the group's change lock: a
//! pause always ends, even when the operator's request gives up waiting.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use inbox_wire::{AddNodeReq, ClusterStatus, ErrorCode, ErrorReply, RemoveNodeReq};
use openraft::async_runtime::WatchReceiver as _;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::{ChangeMembers, ServerState};

use super::{Glue, GroupHandle, InboxRaft, LeaderId, Membership, Peer, TypeConfig};

/// How long an operator's request waits for its membership change.
pub const CHANGE_WITHIN: Duration = Duration::from_secs(60);

/// How long a new node may take to catch up: the rest of
/// [`CHANGE_WITHIN`] is left to make it a voter, so that a node that does
/// not catch up is reported as such rather than as a timeout.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(50);

/// How long a pause waits for the rounds already proposed to commit
/// before the engine follows (those still pending then fail with
/// `NOT_LEADER`, and are retried by their clients).
const SETTLE_WITHIN: Duration = Duration::from_secs(2);

/// How long a removal waits for the removed member, if it runs, to hold
/// the configuration that makes it a learner. A member that is down is
/// not waited for longer: it never hears of the change, and stays down.
const TELL_REMOVED_WITHIN: Duration = Duration::from_secs(3);

type RaftChangeError = RaftError<TypeConfig, ClientWriteError<TypeConfig>>;
type Change = Result<ClientWriteResponse<TypeConfig>, RaftChangeError>;

fn refusal(code: ErrorCode, message: String) -> ErrorReply {
    ErrorReply::new(code, 0, message)
}

fn bad_request(message: String) -> ErrorReply {
    refusal(ErrorCode::BadRequest, message)
}

/// The answer of a node that is not in a group.
pub fn not_in_a_group() -> ErrorReply {
    bad_request(
        "this node is not in a replicated group (it was started without --node-id, \
         --raft-listen and --peers): there is no membership to change"
            .into(),
    )
}

/// `HOST:PORT`, with a port number.
fn check_addr(what: &str, addr: &str) -> Result<(), ErrorReply> {
    let well_formed = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if addr.is_empty() || addr.trim() != addr || !well_formed {
        return Err(bad_request(format!("{what} {addr:?} is not HOST:PORT")));
    }
    Ok(())
}

/// What adding a node takes, given the current membership.
#[derive(Debug, PartialEq, Eq)]
enum AddPlan {
    /// A voter at these addresses already: nothing to do.
    Done,
    /// A learner at these addresses (an add that did not finish): catch
    /// it up and make it a voter.
    Promote,
    /// New: add it as a learner first.
    Learner,
}

fn plan_add(m: &Membership, id: u64, peer: &Peer) -> Result<AddPlan, ErrorReply> {
    if id == 0 {
        return Err(bad_request("node id 0 is not a node id".into()));
    }
    check_addr("raft_addr", &peer.raft_addr)?;
    check_addr("client_addr", &peer.client_addr)?;
    if let Some(known) = m.get_node(&id) {
        if known != peer {
            return Err(bad_request(format!(
                "node {id} is already a member at {known}; remove it first to give it other addresses"
            )));
        }
        let voter = m.get_joint_config().iter().all(|c| c.contains(&id));
        return Ok(if voter {
            AddPlan::Done
        } else {
            AddPlan::Promote
        });
    }
    for (other, known) in m.nodes() {
        if known.raft_addr == peer.raft_addr || known.client_addr == peer.client_addr {
            return Err(bad_request(format!(
                "node {other} is already a member at {known}, which {peer} shares"
            )));
        }
    }
    Ok(AddPlan::Learner)
}

/// What removing a node takes, given the current membership.
#[derive(Debug, PartialEq, Eq)]
enum RemovePlan {
    /// A voter: make it a learner first, then drop it.
    Voter,
    /// A learner: drop it.
    Learner,
}

fn plan_remove(m: &Membership, id: u64, leader: u64) -> Result<RemovePlan, ErrorReply> {
    if id == 0 {
        return Err(bad_request("node id 0 is not a node id".into()));
    }
    if m.get_node(&id).is_none() {
        let members: Vec<String> = m.nodes().map(|(n, _)| n.to_string()).collect();
        return Err(bad_request(format!(
            "node {id} is not a member of the group (members: {})",
            members.join(", ")
        )));
    }
    let voters: BTreeSet<u64> = m.voter_ids().collect();
    if !voters.contains(&id) {
        return Ok(RemovePlan::Learner);
    }
    if voters.len() == 1 {
        return Err(bad_request(format!(
            "node {id} is the group's last voter: a group cannot remove its last voter"
        )));
    }
    if id == leader {
        return Err(bad_request(format!(
            "node {id} leads the group and cannot remove itself: stop it (another member takes \
             over) and ask the new leader to remove it"
        )));
    }
    Ok(RemovePlan::Voter)
}

/// raft's refusal of a change, as the wire says it.
fn raft_refusal(handle: &GroupHandle, e: RaftChangeError) -> ErrorReply {
    match e {
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(_) | ClientWriteError::LogEntryDiscarded(_),
        ) => {
            handle.not_leader("not the leader: the leadership changed during the membership change")
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(p),
        )) => refusal(
            ErrorCode::Conflict,
            format!("an earlier membership change is not committed yet: {p}"),
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            bad_request(format!("membership change refused: {e}"))
        }
        RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => refusal(
            ErrorCode::Conflict,
            format!("membership change refused: {e}"),
        ),
        RaftError::Fatal(e) => refusal(
            ErrorCode::Unavailable,
            format!("raft stopped on this node: {e}"),
        ),
    }
}

impl Glue {
    /// Starts a pause (see the module documentation): the hand-off stops
    /// proposing. Returns this leadership.
    fn pause(&self) -> Option<LeaderId> {
        let mut role = self.role();
        let leader_id = role.leading.as_ref()?.leader_id;
        role.paused = true;
        Some(leader_id)
    }

    /// The last index raft took from the hand-off, once a proposal in
    /// flight when the pause began is taken or refused (which raft's core
    /// does in a moment); `None` if the leadership ended meanwhile.
    async fn settled_proposals(&self, leader_id: LeaderId) -> Option<u64> {
        loop {
            {
                let role = self.role();
                let ours = role
                    .leading
                    .as_ref()
                    .is_some_and(|l| l.leader_id == leader_id);
                if !ours {
                    return None;
                }
                if !role.proposing {
                    return Some(role.proposed);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// The engine follows, and its rounds past `proposed` (never handed to
    /// raft) are discarded, so that raft's next entry takes the engine's
    /// next index. `false` if the leadership ended meanwhile or the engine
    /// failed (it then steps down).
    fn stop_rounds(&self, leader_id: LeaderId, proposed: u64) -> bool {
        let mut role = self.role();
        let ours = role.paused
            && role
                .leading
                .as_ref()
                .is_some_and(|l| l.leader_id == leader_id);
        if !ours {
            return false;
        }
        let inbox = self.inbox();
        let stopped = inbox.follow().and_then(|()| {
            if inbox.replica_index() > proposed {
                self.discard_from(proposed + 1)
            } else {
                Ok(())
            }
        });
        if let Err(e) = stopped {
            tracing::error!(error = %e, "the engine cannot pause for a membership change");
            if let Err(e) = self.step_down(&mut role) {
                tracing::error!(error = %e, "stepping down");
            }
            return false;
        }
        true
    }

    /// Ends a pause: if this leadership lasts, the engine leads again from
    /// the index after the last entry raft wrote (or the last round
    /// proposed, if raft has not appended it yet).
    fn resume(self: &Arc<Self>, leader_id: LeaderId, proposed: u64) {
        let mut role = self.role();
        if !role.paused {
            return;
        }
        role.paused = false;
        let ours = role
            .leading
            .as_ref()
            .is_some_and(|l| l.leader_id == leader_id);
        if ours {
            let after = role.raft_last.unwrap_or(0).max(proposed);
            self.become_leader(&mut role, leader_id, after);
        }
    }
}

impl GroupHandle {
    /// `CLUSTER_ADD_NODE`: makes `node_id` a voter (a learner first,
    /// caught up, then joint consensus); answers this leader's view once
    /// done, or why not within [`CHANGE_WITHIN`].
    pub async fn add_node(&self, req: AddNodeReq) -> Result<ClusterStatus, ErrorReply> {
        let peer = Peer {
            raft_addr: req.raft_addr,
            client_addr: req.client_addr,
        };
        let id = req.node_id;
        self.run_change(move |this, m| {
            let plan = plan_add(m, id, &peer)?;
            Ok(async move {
                if plan == AddPlan::Learner {
                    this.paused(|raft| async move { raft.add_learner(id, peer, false).await })
                        .await?;
                }
                if plan != AddPlan::Done {
                    this.wait_caught_up(id).await?;
                    let voters = BTreeSet::from([id]);
                    this.paused(|raft| async move {
                        raft.change_membership(ChangeMembers::AddVoterIds(voters), false)
                            .await
                    })
                    .await?;
                    tracing::info!(node = id, "node added to the group as a voter");
                }
                Ok(this.status())
            })
        })
        .await
    }

    /// `CLUSTER_REMOVE_NODE`: takes `node_id` out of the group (a voter is
    /// made a learner first, so that it stops standing for election);
    /// answers this leader's view once done, or why not within
    /// [`CHANGE_WITHIN`].
    pub async fn remove_node(&self, req: RemoveNodeReq) -> Result<ClusterStatus, ErrorReply> {
        let id = req.node_id;
        let leader = self.glue.id;
        self.run_change(move |this, m| {
            let plan = plan_remove(m, id, leader)?;
            Ok(async move {
                if plan == RemovePlan::Voter {
                    let voters = BTreeSet::from([id]);
                    let learner = this
                        .paused(|raft| async move {
                            raft.change_membership(ChangeMembers::RemoveVoters(voters), true)
                                .await
                        })
                        .await?;
                    this.tell_removed(id, learner.log_id.index).await;
                }
                let nodes = BTreeSet::from([id]);
                this.paused(|raft| async move {
                    raft.change_membership(ChangeMembers::RemoveNodes(nodes), false)
                        .await
                })
                .await?;
                tracing::info!(node = id, "node removed from the group");
                Ok(this.status())
            })
        })
        .await
    }

    /// Runs one change: on the leader only, one at a time, checked against
    /// the current membership by `plan` (which refuses bad input before
    /// anything changes), in a task of its own that the request waits for
    /// at most [`CHANGE_WITHIN`].
    async fn run_change<P, F>(&self, plan: P) -> Result<ClusterStatus, ErrorReply>
    where
        P: FnOnce(GroupHandle, &Membership) -> Result<F, ErrorReply>,
        F: Future<Output = Result<ClusterStatus, ErrorReply>> + Send + 'static,
    {
        if !self.raft_leads() {
            return Err(self.not_leader("not the leader"));
        }
        let Ok(lock) = Arc::clone(&self.glue.changing).try_lock_owned() else {
            return Err(refusal(
                ErrorCode::Conflict,
                "another membership change is in progress on this leader; retry once it is done"
                    .into(),
            ));
        };
        let membership = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .clone();
        let change = plan(self.clone(), &membership)?;
        let task = tokio::spawn(async move {
            let done = change.await;
            drop(lock);
            done
        });
        match tokio::time::timeout(CHANGE_WITHIN, task).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => Err(refusal(
                ErrorCode::Internal,
                format!("the membership change failed: {e}"),
            )),
            Err(_) => Err(refusal(
                ErrorCode::Unavailable,
                format!(
                    "the membership change did not finish within {}s; it goes on while the \
                     group can commit it: check cluster status",
                    CHANGE_WITHIN.as_secs()
                ),
            )),
        }
    }

    /// Whether raft holds this node to lead (writes may be paused).
    fn raft_leads(&self) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        m.state == ServerState::Leader && self.glue.role().leading.is_some()
    }

    /// Runs one membership step of raft's in a pause (see the module
    /// documentation); the pause ends however the step ends.
    async fn paused<S, Fut>(&self, step: S) -> Result<ClientWriteResponse<TypeConfig>, ErrorReply>
    where
        S: FnOnce(InboxRaft) -> Fut,
        Fut: Future<Output = Change>,
    {
        let Some(leader_id) = self.glue.pause() else {
            return Err(self.not_leader("not the leader"));
        };
        let Some(proposed) = self.glue.settled_proposals(leader_id).await else {
            self.glue.resume(leader_id, 0);
            return Err(self
                .not_leader("not the leader: the leadership ended before the membership change"));
        };
        // Best effort: what is still pending after it fails and is retried.
        let _ = self
            .raft
            .wait(Some(SETTLE_WITHIN))
            .applied_index_at_least(Some(proposed), "rounds proposed before a membership change")
            .await;
        let done = if self.glue.stop_rounds(leader_id, proposed) {
            step(self.raft.clone())
                .await
                .map_err(|e| raft_refusal(self, e))
        } else {
            Err(self
                .not_leader("not the leader: the leadership ended before the membership change"))
        };
        self.glue.resume(leader_id, proposed);
        done
    }

    /// Waits until learner `id` holds what this leader held when it was
    /// added, and is within raft's replication lag threshold of its log
    /// (what openraft's blocking `add_learner` waits for), at most
    /// [`CATCH_UP_WITHIN`]; writes go on meanwhile.
    async fn wait_caught_up(&self, id: u64) -> Result<(), ErrorReply> {
        let since = self
            .raft
            .metrics()
            .borrow_watched()
            .last_log_index
            .unwrap_or(0);
        let threshold = self.raft.config().replication_lag_threshold;
        let caught_up = |m: &openraft::RaftMetrics<TypeConfig>| {
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|log_id| log_id.index);
            let last = m.last_log_index.unwrap_or(0);
            m.state != ServerState::Leader
                || matched.is_some_and(|i| i >= since && last.saturating_sub(i) <= threshold)
        };
        let waited = self
            .raft
            .wait(Some(CATCH_UP_WITHIN))
            .metrics(caught_up, "the new node catches up")
            .await;
        match waited {
            Ok(m) if m.state == ServerState::Leader => Ok(()),
            Ok(_) => Err(self
                .not_leader("not the leader: the leadership changed while the new node caught up")),
            Err(_) => {
                let m = self.raft.metrics().borrow_watched().clone();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map_or(0, |log_id| log_id.index);
                Err(refusal(
                    ErrorCode::Unavailable,
                    format!(
                        "node {id} did not catch up within {}s (it holds up to index {matched} of \
                         {}): it stays a learner; check that it runs and that its raft address is \
                         reachable, then add it again, or remove it",
                        CATCH_UP_WITHIN.as_secs(),
                        m.last_log_index.unwrap_or(0)
                    ),
                ))
            }
        }
    }

    /// Gives a removed voter, if it runs, a moment to receive the
    /// configuration that makes it a learner (at `index`).
    async fn tell_removed(&self, id: u64, index: u64) {
        let told = self
            .raft
            .wait(Some(TELL_REMOVED_WITHIN))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id).cloned().flatten())
                        .is_some_and(|log_id| log_id.index >= index)
                },
                "the removed member holds its removal",
            )
            .await;
        if told.is_err() {
            tracing::info!(
                node = id,
                "the removed member did not acknowledge its removal (down or unreachable): it is dropped anyway"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn peer(n: u64) -> Peer {
        Peer {
            raft_addr: format!("10.0.0.{n}:7080"),
            client_addr: format!("10.0.0.{n}:7070"),
        }
    }

    fn three() -> Membership {
        let nodes: BTreeMap<u64, Peer> = (1..=3).map(|n| (n, peer(n))).collect();
        Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).expect("a valid membership")
    }

    #[test]
    fn an_add_is_planned_from_the_membership_and_bad_input_is_refused() {
        let m = three();
        assert_eq!(plan_add(&m, 4, &peer(4)), Ok(AddPlan::Learner));
        assert_eq!(plan_add(&m, 2, &peer(2)), Ok(AddPlan::Done));
        let with_learner = Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            (1..=4).map(|n| (n, peer(n))).collect::<BTreeMap<_, _>>(),
        )
        .expect("a valid membership");
        assert_eq!(plan_add(&with_learner, 4, &peer(4)), Ok(AddPlan::Promote));
        let refused = |id, p: Peer| plan_add(&m, id, &p).expect_err("refused").message;
        assert!(refused(0, peer(4)).contains("node id 0"));
        assert!(refused(2, peer(4)).contains("already a member"));
        assert!(refused(4, peer(2)).contains("shares"));
        for bad in ["", "host", "host:", ":7080", "host:x", "host:0", " host:1"] {
            let p = Peer {
                raft_addr: bad.into(),
                ..peer(4)
            };
            assert!(refused(4, p).contains("HOST:PORT"), "{bad:?}");
        }
    }

    #[test]
    fn a_removal_is_planned_from_the_membership_and_bad_input_is_refused() {
        let m = three();
        assert_eq!(plan_remove(&m, 3, 1), Ok(RemovePlan::Voter));
        let refused =
            |m: &Membership, id, leader| plan_remove(m, id, leader).expect_err("refused").message;
        assert!(refused(&m, 9, 1).contains("not a member"));
        assert!(refused(&m, 0, 1).contains("node id 0"));
        assert!(refused(&m, 1, 1).contains("leads the group"));
        let alone = Membership::new(
            vec![BTreeSet::from([1])],
            BTreeMap::from([(1, peer(1)), (2, peer(2))]),
        )
        .expect("a valid membership");
        assert!(refused(&alone, 1, 1).contains("last voter"));
        assert_eq!(plan_remove(&alone, 2, 1), Ok(RemovePlan::Learner));
    }
}
