//! One request in, one [`Inbox`] call, one reply out.
//!
//! This is the whole of what the daemon does with a request: translate it
//! (see [`crate::convert`]), call the engine, translate the answer. It
//! holds no state and makes no decision; connection-level requests
//! (`HELLO`, `PING`, `SUBSCRIBE`) are handled by the connection itself.

use std::sync::Arc;

use inbox_engine::{ConvFlags, Error, Inbox};
use inbox_wire::{Empty, Request, Response};

use crate::convert;
use crate::metrics::Metrics;

/// Runs `request` against the engine. Reads are synchronous and fast and
/// run in place; compaction and checkpoints can take a while and run on
/// the blocking pool.
pub async fn execute(inbox: &Arc<Inbox>, metrics: &Metrics, request: Request) -> Response {
    match call(inbox, metrics, request).await {
        Ok(response) => response,
        Err(err) => Response::Error(convert::error_reply(&err)),
    }
}

async fn blocking<T: Send + 'static>(
    inbox: &Arc<Inbox>,
    f: impl FnOnce(&Inbox) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let inbox = Arc::clone(inbox);
    tokio::task::spawn_blocking(move || f(&inbox))
        .await
        .unwrap_or_else(|join| Err(Error::Internal(format!("task failed: {join}"))))
}

async fn call(inbox: &Arc<Inbox>, metrics: &Metrics, request: Request) -> Result<Response, Error> {
    Ok(match request {
        Request::Join(r) => Response::Join(convert::membership(inbox.join(r.conv, r.uid).await?)),
        Request::Leave(r) => {
            Response::Leave(convert::membership(inbox.leave(r.conv, r.uid).await?))
        }
        Request::Send(r) => {
            Response::Send(convert::send_reply(inbox.send(convert::send_req(r)).await?))
        }
        Request::Recall(r) => Response::Recall(convert::send_reply(
            inbox.recall(convert::recall_req(r)).await?,
        )),
        Request::Edit(r) => {
            Response::Edit(convert::send_reply(inbox.edit(convert::edit_req(r)).await?))
        }
        Request::RegisterDevice(r) => Response::RegisterDevice(convert::register_reply(
            inbox.register_device(r.uid, r.device).await?,
        )),
        Request::RevokeDevice(r) => Response::RevokeDevice(convert::device_info(
            inbox.revoke_device(r.uid, r.device).await?,
        )),
        Request::Devices(r) => Response::Devices(inbox_wire::DeviceList {
            devices: inbox
                .devices(r.uid)?
                .into_iter()
                .map(convert::device_info)
                .collect(),
        }),
        Request::Sync(r) => {
            let page = inbox.sync(convert::sync_req(r)).await?;
            metrics.observe_sync_page(&page);
            Response::Sync(convert::sync_page(page))
        }
        Request::Ack(r) => Response::Ack(inbox_wire::AckReply {
            acked_sync_seq: inbox.ack(convert::ack_req(r)).await?.acked_sync_seq,
        }),
        Request::FinishLease(r) => Response::FinishLease(convert::device_info(
            inbox
                .finish_lease(r.uid, r.device, r.lease_id, r.generation)
                .await?,
        )),
        Request::Pull(r) => {
            let cursors: Vec<_> = r.cursors.iter().map(|c| (c.conv, c.after_seq)).collect();
            let pulled = inbox.pull(r.uid, &cursors, r.per_conv_limit)?;
            metrics.observe_pull(&pulled);
            Response::Pull(inbox_wire::PullReply {
                convs: pulled.into_iter().map(convert::conv_pull).collect(),
            })
        }
        Request::History(r) => Response::History(convert::history_page(inbox.history(
            r.uid,
            r.conv,
            r.before_seq,
            r.limit,
        )?)),
        Request::MarkRead(r) => Response::MarkRead(convert::read_reply(
            inbox.mark_read(r.uid, r.conv, r.read_to_seq).await?,
        )),
        Request::SetConvFlags(r) => {
            let flags = ConvFlags {
                muted: r.muted,
                pinned: r.pinned,
            };
            inbox.set_conv_flags(r.uid, r.conv, flags).await?;
            Response::SetConvFlags(Empty {})
        }
        Request::ConvList(r) => Response::ConvList(convert::conv_list_page(
            inbox.conv_list(r.uid, r.limit, r.cursor)?,
        )),
        Request::BeginSnapshot(r) => Response::BeginSnapshot(convert::snapshot_info(
            inbox.begin_snapshot(r.uid, r.device).await?,
        )),
        Request::SnapshotInfo(r) => Response::SnapshotInfo(convert::snapshot_info(
            inbox.snapshot_info(r.uid, r.snapshot_id)?,
        )),
        Request::SnapshotPage(r) => Response::SnapshotPage(convert::snapshot_page(
            inbox.snapshot_page(r.uid, r.snapshot_id, r.page)?,
        )),
        Request::AckSnapshot(r) => Response::AckSnapshot(convert::device_info(
            inbox
                .ack_snapshot(r.uid, r.device, r.snapshot_id, r.generation)
                .await?,
        )),
        Request::Stats(_) => Response::Stats(convert::stats(&inbox.stats())),
        Request::Explain(r) => Response::Explain(convert::user_explain(inbox.explain(r.uid)?)),
        Request::ExplainSegment(r) => Response::ExplainSegment(convert::segment_explain(
            inbox.explain_segment(&r.stream, r.segment)?,
        )),
        Request::Compact(_) => {
            Response::Compact(convert::compaction(blocking(inbox, Inbox::compact).await?))
        }
        Request::Checkpoint(_) => {
            blocking(inbox, Inbox::checkpoint).await?;
            Response::Checkpoint(Empty {})
        }
        Request::Hello(_) | Request::Ping(_) | Request::Subscribe(_) | Request::Unsubscribe(_) => {
            return Err(Error::Internal(
                "connection-level request reached the engine dispatcher".into(),
            ))
        }
    })
}
