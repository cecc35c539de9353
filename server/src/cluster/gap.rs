//! The network as the leader's replication sees it, with one refusal: an
//! empty append to a follower whose next entries the engine's compaction
//! deleted fails as a network error. raft's replication to that follower
//! then starts over instead of holding the range it found empty, raft can
//! purge its log past the deleted rounds (see `Glue::compacted_away`),
//! and sends that follower the snapshot. Also here: `Glue::compacted_away`,
//! which asks raft for that snapshot and purge.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};

use std::time::Duration;

use super::{Glue, InboxRaft, Peer, TypeConfig};

/// Wraps a network factory.
pub(crate) struct Factory<N> {
    pub inner: N,
    pub glue: Arc<Glue>,
}

/// Wraps one connection.
pub struct Conn<C> {
    inner: C,
    glue: Arc<Glue>,
}

impl<N: RaftNetworkFactory<TypeConfig>> RaftNetworkFactory<TypeConfig> for Factory<N> {
    type Network = Conn<N::Network>;

    async fn new_client(&mut self, target: u64, node: &Peer) -> Self::Network {
        Conn {
            inner: self.inner.new_client(target, node).await,
            glue: Arc::clone(&self.glue),
        }
    }
}

impl<C: RaftNetwork<TypeConfig>> RaftNetwork<TypeConfig> for Conn<C> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        let next = rpc.prev_log_id.map_or(0, |p| p.index + 1);
        if rpc.entries.is_empty() && next < self.glue.gone_below.load(Ordering::Acquire) {
            let why = std::io::Error::other(format!(
                "this follower needs round {next}, which compaction deleted here; it is to be sent a snapshot"
            ));
            return Err(RPCError::Network(NetworkError::new(&why)));
        }
        self.inner.append_entries(rpc, option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, Peer, RaftError<u64, InstallSnapshotError>>,
    > {
        self.inner.install_snapshot(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        self.inner.vote(rpc, option).await
    }

    fn backoff(&self) -> Backoff {
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
                    .borrow()
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
