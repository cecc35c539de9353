//! One request in, one [`Inbox`] call, one reply out.
//!
//! This is the whole of what the daemon does with a request: translate it
//! (see [`crate::convert`]), call the engine, translate the answer. It
//! holds no state and makes no decision; connection-level requests
//! (`HELLO`, `PING`, `SUBSCRIBE`) are handled by the connection itself, and
//! the cluster's by [`crate::route`].
//!
//! Which requests come here, and how each is ordered, is in
//! [`crate::ops`].
//!
//! [`start`] is split in two on purpose: the engine call happens when
//! `start` returns (a write is queued on the sequencer then, a read has been
//! answered), and the returned future only waits for the reply. The
//! connection calls `start` in the order requests arrived, which is what
//! makes pipelined requests take effect in order (see [`crate::conn`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use inbox_engine::inbox::Read;
use inbox_engine::{ConvFlags, ConvId, DeviceId, Error, Generation, Inbox, MsgSeq, Uid};
use inbox_wire::{Empty, Request, Response};

use crate::convert;
use crate::metrics::Metrics;
use crate::read_pool::ReadPool;

/// The rest of a started request: waits for the engine's reply.
pub type Started = Pin<Box<dyn Future<Output = Response> + Send>>;

/// Makes the engine call for `request` now and returns what waits for its
/// reply. A write is queued here; a read is prepared here and runs when the
/// returned future is polled: waits for a round to settle are awaited, and
/// attempts that may read the disk run on `pool` (see [`ReadPool`]), so no
/// worker thread ever blocks. Compaction and checkpoints run on the
/// blocking pool.
pub fn start(
    inbox: &Arc<Inbox>,
    metrics: &Arc<Metrics>,
    pool: &ReadPool,
    request: Request,
    here: Here,
) -> Started {
    match call(inbox, metrics, pool, request, here) {
        Ok(Call::Ready(response)) => Box::pin(std::future::ready(response)),
        Ok(Call::Later(later)) => Box::pin(async move {
            later
                .await
                .unwrap_or_else(|err| Response::Error(convert::error_reply(&err)))
        }),
        Err(err) => Box::pin(std::future::ready(Response::Error(convert::error_reply(
            &err,
        )))),
    }
}

/// Where a send is decided and committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Here {
    /// Queued for the sequencer's thread.
    Never,
    /// On the calling thread if the sequencer is idle
    /// ([`Inbox::send_here`]): the caller is the only connection making
    /// requests ([`crate::alone`]).
    IfIdle,
}

type Later = Pin<Box<dyn Future<Output = Result<Response, Error>> + Send>>;

enum Call {
    Ready(Response),
    Later(Later),
}

/// Wraps a queued engine call: `pending` is already submitted.
fn later<T: Send + 'static>(
    pending: impl Future<Output = Result<T, Error>> + Send + 'static,
    reply: impl FnOnce(T) -> Response + Send + 'static,
) -> Call {
    Call::Later(Box::pin(async move { pending.await.map(reply) }))
}

/// Runs a prepared engine read on `pool`.
fn read<T: Send + 'static>(
    pool: &ReadPool,
    read: Read<T>,
    reply: impl FnOnce(T) -> Response + Send + 'static,
) -> Call {
    let pool = pool.clone();
    later(async move { pool.run(read).await }, reply)
}

fn blocking<T: Send + 'static>(
    inbox: &Arc<Inbox>,
    f: impl FnOnce(&Inbox) -> Result<T, Error> + Send + 'static,
    reply: impl FnOnce(T) -> Response + Send + 'static,
) -> Call {
    let inbox = Arc::clone(inbox);
    let task = tokio::task::spawn_blocking(move || f(&inbox));
    later(
        async move {
            task.await
                .unwrap_or_else(|join| Err(Error::Internal(format!("task failed: {join}"))))
        },
        reply,
    )
}

fn call(
    inbox: &Arc<Inbox>,
    metrics: &Arc<Metrics>,
    pool: &ReadPool,
    request: Request,
    here: Here,
) -> Result<Call, Error> {
    Ok(match request {
        Request::Join(r) => later(inbox.join(Uid(r.uid), ConvId(r.conv)), |m| {
            Response::Join(convert::membership(m))
        }),
        Request::Leave(r) => later(inbox.leave(Uid(r.uid), ConvId(r.conv)), |m| {
            Response::Leave(convert::membership(m))
        }),
        Request::Send(r) => {
            let req = convert::send_req(r);
            let pending = match here {
                Here::Never => inbox.send(req),
                Here::IfIdle => {
                    let pending = inbox.send_here(req);
                    if pending.is_released() {
                        metrics.sends_on_worker.inc();
                    }
                    pending
                }
            };
            later(pending, |s| Response::Send(convert::send_reply(s)))
        }
        Request::Recall(r) => later(inbox.recall(convert::recall_req(r)), |s| {
            Response::Recall(convert::send_reply(s))
        }),
        Request::Edit(r) => later(inbox.edit(convert::edit_req(r)), |s| {
            Response::Edit(convert::send_reply(s))
        }),
        Request::RegisterDevice(r) => {
            later(inbox.register_device(Uid(r.uid), DeviceId(r.device)), |d| {
                Response::RegisterDevice(convert::register_reply(d))
            })
        }
        Request::RevokeDevice(r) => {
            later(inbox.revoke_device(Uid(r.uid), DeviceId(r.device)), |d| {
                Response::RevokeDevice(convert::device_info(d))
            })
        }
        Request::Devices(r) => read(pool, inbox.read_devices(Uid(r.uid)), |devices| {
            Response::Devices(inbox_wire::DeviceList {
                devices: devices.into_iter().map(convert::device_info).collect(),
            })
        }),
        Request::Sync(r) => {
            let metrics = Arc::clone(metrics);
            let options = convert::sync_options(&r);
            let bare = r.ids_only;
            let pending = inbox.sync_with(convert::sync_req(r), options);
            let pool = pool.clone();
            // Released once durable; the page's events are read on the
            // pool, not inside this future's poll.
            later(
                async move { pool.run(pending.released().await).await },
                move |page| {
                    metrics.observe_sync_page(&page);
                    Response::Sync(convert::sync_page(page, bare))
                },
            )
        }
        Request::Ack(r) => later(inbox.ack(convert::ack_req(r)), |a| {
            Response::Ack(inbox_wire::AckReply {
                acked_sync_seq: a.acked_sync_seq.get(),
            })
        }),
        Request::FinishLease(r) => later(
            inbox.finish_lease(
                Uid(r.uid),
                DeviceId(r.device),
                r.lease_id,
                Generation(r.generation),
            ),
            |d| Response::FinishLease(convert::device_info(d)),
        ),
        Request::Pull(r) => {
            let cursors: Vec<_> = r
                .cursors
                .iter()
                .map(|c| (ConvId(c.conv), MsgSeq(c.after_seq)))
                .collect();
            let metrics = Arc::clone(metrics);
            read(
                pool,
                inbox.read_pull(Uid(r.uid), cursors, r.per_conv_limit),
                move |pulled| {
                    metrics.observe_pull(&pulled);
                    Response::Pull(inbox_wire::PullReply {
                        convs: pulled.into_iter().map(convert::conv_pull).collect(),
                    })
                },
            )
        }
        Request::History(r) => read(
            pool,
            inbox.read_history(
                Uid(r.uid),
                ConvId(r.conv),
                r.before_seq.map(MsgSeq),
                r.limit,
            ),
            |page| Response::History(convert::history_page(page)),
        ),
        Request::MarkRead(r) => later(
            inbox.mark_read(Uid(r.uid), ConvId(r.conv), MsgSeq(r.read_to_seq)),
            |m| Response::MarkRead(convert::read_reply(m)),
        ),
        Request::SetConvFlags(r) => {
            let flags = ConvFlags {
                muted: r.muted,
                pinned: r.pinned,
            };
            later(
                inbox.set_conv_flags(Uid(r.uid), ConvId(r.conv), flags),
                |()| Response::SetConvFlags(Empty {}),
            )
        }
        Request::ConvList(r) => read(
            pool,
            inbox.read_conv_list(Uid(r.uid), r.limit, r.cursor),
            |p| Response::ConvList(convert::conv_list_page(p)),
        ),
        Request::Dirty(r) => read(pool, inbox.read_dirty_markers(Uid(r.uid)), |m| {
            Response::Dirty(convert::dirty_list(m))
        }),
        Request::ClearDirty(r) => later(
            inbox.clear_dirty(Uid(r.uid), ConvId(r.conv), r.version),
            |seq| Response::ClearDirty(inbox_wire::ClearDirtyReply { cleared_seq: seq.0 }),
        ),
        Request::ConvMode(r) => Call::Ready(Response::ConvMode(convert::conv_mode(
            inbox.conv_mode(ConvId(r.conv), r.uid.map(Uid))?,
        ))),
        Request::BeginSnapshot(r) => {
            later(inbox.begin_snapshot(Uid(r.uid), DeviceId(r.device)), |s| {
                Response::BeginSnapshot(convert::snapshot_info(s))
            })
        }
        Request::SnapshotInfo(r) => read(
            pool,
            inbox.read_snapshot_info(Uid(r.uid), r.snapshot_id),
            |s| Response::SnapshotInfo(convert::snapshot_info(s)),
        ),
        Request::SnapshotPage(r) => read(
            pool,
            inbox.read_snapshot_page(Uid(r.uid), r.snapshot_id, r.page),
            |p| Response::SnapshotPage(convert::snapshot_page(p)),
        ),
        Request::AckSnapshot(r) => later(
            inbox.ack_snapshot(
                Uid(r.uid),
                DeviceId(r.device),
                r.snapshot_id,
                Generation(r.generation),
            ),
            |d| Response::AckSnapshot(convert::device_info(d)),
        ),
        Request::Stats(_) => Call::Ready(Response::Stats(convert::stats(&inbox.stats()))),
        // Both read log records: off the workers, like compaction.
        Request::Explain(r) => blocking(
            inbox,
            move |inbox| inbox.explain(Uid(r.uid)),
            |e| Response::Explain(convert::user_explain(e)),
        ),
        Request::ExplainSegment(r) => blocking(
            inbox,
            move |inbox| inbox.explain_segment(&r.stream, r.segment),
            |e| Response::ExplainSegment(convert::segment_explain(e)),
        ),
        Request::Compact(_) => blocking(inbox, Inbox::compact, |c| {
            Response::Compact(convert::compaction(c))
        }),
        Request::Checkpoint(_) => blocking(inbox, Inbox::checkpoint, |()| {
            Response::Checkpoint(Empty {})
        }),
        // O(state) in chunks of the state lock: off the workers.
        Request::Memory(_) => blocking(
            inbox,
            |inbox| Ok(crate::heap::with_process_memory(inbox.memory())),
            |m| Response::Memory(convert::memory(m)),
        ),
        other @ (Request::Hello(_)
        | Request::Ping(_)
        | Request::ClusterStatus(_)
        | Request::ClusterAddNode(_)
        | Request::ClusterRemoveNode(_)
        | Request::Subscribe(_)
        | Request::SubscribeDirty(_)
        | Request::Unsubscribe(_)) => {
            return Err(Error::Internal(format!(
                "{} is not answered by the engine (see ops::describe)",
                other.op().name()
            )))
        }
    })
}
