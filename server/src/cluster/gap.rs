//! The network as the leader's replication sees it, with one refusal: an
//! empty append to a follower whose next entries the engine's compaction
//! deleted fails as a network error. raft's replication to that follower
//! then starts over instead of holding the range it found empty, raft can
//! purge its log past the deleted rounds (see `Glue::compacted_away`),
//! and sends that follower the snapshot. Also here: `Glue::compacted_away`,
//! which asks raft for that snapshot and purge.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver as _;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::RaftNetworkFactory;

use std::time::Duration;

use super::{Glue, InboxRaft, Peer, Snapshot, TypeConfig, Vote};

/// The network factory raft is given: [`Conn`]s around the inner one's.
pub(crate) struct Factory<N> {
    pub inner: N,
    pub glue: Arc<Glue>,
}

/// A connection with the refusal of the module documentation.
pub struct Conn<C> {
    inner: C,
    glue: Arc<Glue>,
}

impl<N> RaftNetworkFactory<TypeConfig> for Factory<N>
where
    N: RaftNetworkFactory<TypeConfig>,
    N::Network: RaftNetworkV2<TypeConfig, SnapshotData = tokio::fs::File>,
{
    type Network = Conn<N::Network>;

    async fn new_client(&mut self, target: u64, node: &Peer) -> Self::Network {
        Conn {
            inner: self.inner.new_client(target, node).await,
            glue: Arc::clone(&self.glue),
        }
    }
}

impl<C> RaftNetworkV2<TypeConfig> for Conn<C>
where
    C: RaftNetworkV2<TypeConfig, SnapshotData = tokio::fs::File>,
{
    type SnapshotData = tokio::fs::File;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let next = rpc.prev_log_id.map_or(0, |p| p.index + 1);
        if rpc.entries.is_empty() && next < self.glue.gone_below.load(Ordering::Acquire) {
            let why = std::io::Error::other(format!(
                "this follower needs round {next}, which compaction deleted here; it is to be sent a snapshot"
            ));
            return Err(RPCError::Network(NetworkError::new(&why)));
        }
        self.inner.append_entries(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.vote(rpc, option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.pre_vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.inner
            .full_snapshot(vote, snapshot, cancel, option)
            .await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.inner.backoff()
    }
}

impl Glue {
    /// The engine's compaction deleted the rounds below `held` (their
    /// batches' segments held nothing live any more). raft is asked for a
    /// snapshot covering them, if the last one does not, and to purge its
    /// log up to `held - 1`, so that a follower that needs them is sent
    /// the snapshot. raft purges only while no replication uses the range:
    /// the network refuses that follower's empty appends meanwhile
    /// (`gap.rs`), so its replication lets go of it.
    pub(crate) fn compacted_away(&self, held: u64) {
        if self.gone_below.fetch_max(held, Ordering::AcqRel) >= held {
            return;
        }
        let Some(raft) = self.role().raft.clone() else {
            return;
        };
        let upto = held - 1;
        tracing::warn!(
            node = self.id,
            upto,
            "rounds compacted away; purging raft's log past them"
        );
        tokio::spawn(async move {
            let covered = |raft: &InboxRaft| {
                raft.metrics()
                    .borrow_watched()
                    .snapshot
                    .is_some_and(|s| s.index >= upto)
            };
            if !covered(&raft) && raft.trigger().snapshot().await.is_err() {
                return;
            }
            let start = std::time::Instant::now();
            while !covered(&raft) && start.elapsed() < Duration::from_secs(60) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = raft.trigger().purge_log(upto).await;
        });
    }
}
