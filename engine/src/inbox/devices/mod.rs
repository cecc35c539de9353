//! Devices: the registry and its cap (R17), sync batches and tokens (R9,
//! R10), ACKs (R11) and recovery leases.
//!
//! - [`Command`] and [`exec`]: the mutations, decided by [`decide`]'s
//!   pure functions (state + request → effects + answer);
//! - [`record`]: the device record (the row after the change) and `apply`;
//! - [`read`]: sync pages and the device list, outside the sequencer.

pub(crate) mod ack_view;
pub(crate) mod decide;
pub(crate) mod read;
pub(crate) mod record;
pub(crate) mod rows;
pub(crate) mod touches;

use std::sync::Arc;

use self::decide::SyncOutcome;
use super::pending::Reply;
use super::round::{fail_now, reply_with, Env, Fail, Sink, Tx};
use super::state::State;
use super::token::TokenClaims;
use crate::api::*;
use crate::error::{Error, Result};

pub(crate) enum Command {
    Register {
        uid: Uid,
        device: DeviceId,
        tx: Tx<RegisterReply>,
    },
    Revoke {
        uid: Uid,
        device: DeviceId,
        tx: Tx<DeviceInfo>,
    },
    Sync {
        req: SyncRequest,
        options: SyncOptions,
        claims: Option<TokenClaims>,
        tx: Tx<SyncPage>,
    },
    Ack {
        req: AckRequest,
        claims: TokenClaims,
        tx: Tx<AckReply>,
    },
    FinishLease {
        uid: Uid,
        device: DeviceId,
        lease_id: u64,
        generation: Generation,
        tx: Tx<DeviceInfo>,
    },
    /// The `last_seen` refresh of a sync answered from durable state.
    Touch {
        uid: Uid,
        device: DeviceId,
        generation: Generation,
        tx: Tx<()>,
        /// Makes the user's device list wait until this refresh is decided.
        pending: touches::TouchGuard,
    },
}

/// The `ACK` a later page's sync carries ([`SyncOptions::ack_through`]),
/// as the request it stands for: this sync's generation and batch token.
/// A sync without a token (the first page of a batch) cannot carry one.
pub(crate) fn carried_ack(req: &SyncRequest, options: &SyncOptions) -> Result<Option<AckRequest>> {
    let Some(seq) = options.ack_through else {
        return Ok(None);
    };
    let (Some(generation), Some(batch_token)) = (req.generation, req.batch_token.clone()) else {
        return Err(Error::BadRequest(
            "an ACK carried by SYNC needs the batch token and generation of a page after the \
             first of its batch"
                .into(),
        ));
    };
    Ok(Some(AckRequest {
        uid: req.uid,
        device: req.device,
        generation,
        seq,
        batch_token,
    }))
}

/// Answers a command with a failure without running it.
pub(crate) fn fail(cmd: Command, f: &Fail) {
    match cmd {
        Command::Register { tx, .. } => fail_now(tx, f),
        Command::Revoke { tx, .. } | Command::FinishLease { tx, .. } => fail_now(tx, f),
        Command::Sync { tx, .. } => fail_now(tx, f),
        Command::Ack { tx, .. } => fail_now(tx, f),
        Command::Touch { tx, .. } => fail_now(tx, f),
    }
}

/// Hands a decision's effects to the round and answers with `result`.
fn finish<T: Send + 'static>(
    st: &mut State,
    sink: &mut dyn Sink,
    tx: Tx<T>,
    result: Result<(Vec<crate::inbox::effect::Effect>, T)>,
) {
    let result = result.map(|(effects, reply)| {
        for e in effects {
            sink.effect(st, e);
        }
        reply
    });
    sink.reply(reply_with(tx, result));
}

/// Decides one command against `st` and hands the outcome to `sink`.
pub(crate) fn exec(cmd: Command, st: &mut State, env: &Env<'_>, sink: &mut dyn Sink) {
    let now = env.now;
    let cfg = &env.shared.config;
    match cmd {
        Command::Register { uid, device, tx } => {
            let decided = decide::decide_register(st, cfg, now, uid, device);
            finish(st, sink, tx, Ok(decided));
        }
        Command::Revoke { uid, device, tx } => {
            let decided = decide::decide_revoke(st, uid, device);
            finish(st, sink, tx, decided);
        }
        Command::Sync {
            req,
            options,
            claims,
            tx,
        } => {
            match decide::decide_sync(st, cfg, now, &req, &options, claims.as_ref()) {
                Err(e) => sink.reply(reply_with(tx, Err(e))),
                Ok((effects, outcome)) => {
                    for e in effects {
                        sink.effect(st, e);
                    }
                    match outcome {
                        SyncOutcome::Reset(generation) => {
                            sink.reply(reply_with(tx, Err(Error::ResetRequired { generation })));
                        }
                        SyncOutcome::Page(plan) => {
                            // The page is served, so its carried ACK is
                            // made, decided again on the state as it is
                            // now; a device that changed since the request
                            // came drops it, as nobody waits for it.
                            if let (Ok(Some(ack)), Some(claims)) =
                                (carried_ack(&req, &options), claims.as_ref())
                            {
                                if let Ok((effects, _)) = decide::decide_ack(st, now, &ack, claims)
                                {
                                    for e in effects {
                                        sink.effect(st, e);
                                    }
                                }
                            }
                            let shared = Arc::clone(env.shared);
                            // Same generation: the sync wrote at most its
                            // last_seen refresh, whose loss is harmless, so
                            // a full disk must not keep the page from the
                            // device (the page reads durable events).
                            let keeps_generation = req.generation == Some(plan.generation);
                            sink.reply(Box::new(move |fail| {
                                let reply = match fail {
                                    Some(Fail::NoSpace(_)) if keeps_generation => {
                                        read::page_reply(shared, plan)
                                    }
                                    Some(f) => Reply::Done(Err(f.to_error())),
                                    None => read::page_reply(shared, plan),
                                };
                                let _ = tx.send(reply);
                            }));
                        }
                    }
                }
            }
        }
        Command::Touch {
            uid,
            device,
            generation,
            tx,
            pending,
        } => {
            let decided = decide::decide_touch(st, now, uid, device, generation);
            finish(st, sink, tx, decided);
            // The refresh is in the state now, stamped with this round: a
            // device list waits for the round through the row's stamp.
            drop(pending);
        }
        Command::Ack { req, claims, tx } => {
            let decided = decide::decide_ack(st, now, &req, &claims);
            finish(st, sink, tx, decided);
        }
        Command::FinishLease {
            uid,
            device,
            lease_id,
            generation,
            tx,
        } => {
            let decided = decide::decide_finish_lease(st, now, uid, device, lease_id, generation);
            finish(st, sink, tx, decided);
        }
    }
}
