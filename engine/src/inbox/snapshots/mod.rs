//! Snapshots for reset devices (R18).
//!
//! `begin_snapshot` is one sequencer step: it bumps the device's
//! generation, sets it RESETTING, and logs a snapshot row with a frozen
//! `base_sync_seq = S`, the user's sync head at that step. In the same step
//! the sequencer captures the *plan*: the conversation list (unread, read
//! cursor, flags, last message) and, per conversation, the positions of the
//! last N messages inside the user's membership periods, all read from the
//! in-memory state as it stands at S. Nothing later can leak in: events
//! after S are applied after the capture.
//!
//! Once the step is durable the completion stage hands the plan to the
//! snapshot-builder thread ([`run_builder`]), which builds the content
//! (reading message bodies, which never change), encodes it in pages, takes
//! the SHA-256 of the pages (the manifest digest), and writes it to
//! `snap/<uid>-<snapshot_id>.snap` (tmp, fsync, rename, fsync dir). The
//! snapshot is READY from then on and immutable; it is served from that file,
//! so an interrupted install can fetch the same pages again, also after a
//! restart. The caller's reply is sent after the build if it still waits;
//! a caller that went away does not stop the build, so the snapshot becomes
//! READY (and can be fetched and acknowledged) all the same.
//!
//! A snapshot whose build was cut short never becomes READY: by a crash, or
//! by shutdown, which lets the builder finish the build in hand and abandons
//! the queued ones (their callers get an error). It fences until it
//! expires, and the device begins a new one.
//!
//! Bodies: a message that is recalled or edited (at S, or by the time the
//! content is built) is a tombstone and its body is never written (R6);
//! one recalled after that is hidden when its page is served, as is the
//! body summary of a conversation whose last message it was.
//!
//!
//! Files: [`record`] (the snapshot row and its checkpoint section),
//! [`decide`] (the steps), [`build`] (the builder thread and reads),
//! [`store`] (the snapshot file and its cache).

pub(crate) mod build;
pub(crate) mod decide;
pub mod paging;
pub(crate) mod record;
pub(crate) mod rows;
pub(crate) mod store;

use std::sync::mpsc;

use super::pending::Reply;
use super::round::{fail_now, reply_with, Env, Fail, Sink, Tx};
use super::state::State;
use crate::api::*;
use crate::error::Error;

pub(crate) enum Command {
    Begin {
        uid: Uid,
        device: DeviceId,
        tx: Tx<SnapshotInfo>,
    },
    Ack {
        uid: Uid,
        device: DeviceId,
        snapshot_id: u64,
        generation: Generation,
        tx: Tx<DeviceInfo>,
    },
}

/// Answers a command with a failure without running it.
pub(crate) fn fail(cmd: Command, f: &Fail) {
    match cmd {
        Command::Begin { tx, .. } => fail_now(tx, f),
        Command::Ack { tx, .. } => fail_now(tx, f),
    }
}

/// Decides one command against `st` and hands the outcome to `sink`.
/// `jobs` is the snapshot builder's queue.
pub(crate) fn exec(
    cmd: Command,
    st: &mut State,
    env: &Env<'_>,
    sink: &mut dyn Sink,
    jobs: &mpsc::Sender<build::Job>,
) {
    let now = env.now;
    match cmd {
        Command::Begin { uid, device, tx } => {
            match decide::decide_begin(st, &env.shared.config, now, uid, device) {
                Err(e) => sink.reply(reply_with(tx, Err(e))),
                Ok((effects, plan)) => {
                    for e in effects {
                        sink.effect(st, e);
                    }
                    // The content is built from the plan captured at S, on
                    // the builder thread once the step is durable, whether
                    // or not the caller still waits.
                    let jobs = jobs.clone();
                    sink.reply(Box::new(move |fail| match fail {
                        Some(f) => drop(tx.send(Reply::Done(Err(f.to_error())))),
                        None => {
                            if let Err(mpsc::SendError(job)) = jobs.send(build::Job { plan, tx }) {
                                drop(job.tx.send(Reply::Done(Err(Error::ShuttingDown))));
                            }
                        }
                    }));
                }
            }
        }
        Command::Ack {
            uid,
            device,
            snapshot_id,
            generation,
            tx,
        } => {
            let result =
                decide::decide_ack(env.shared, st, now, uid, device, snapshot_id, generation).map(
                    |(effects, reply)| {
                        for e in effects {
                            sink.effect(st, e);
                        }
                        reply
                    },
                );
            sink.reply(reply_with(tx, result));
        }
    }
}
