//! The completion stage: finishes rounds strictly in order. It waits for
//! durability, advances the committed watermarks, releases every reply of
//! the round (errors too, so no answer ever reflects a change that is not
//! durable) and publishes one coalesced hint per user.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Arc;

use crate::api::*;
use crate::inbox::round::{Fail, ReplyFn};
use crate::inbox::shared::{Hint, LargeGroupHint, Shared};
use crate::log::AppendTicket;

pub(crate) enum Outcome {
    Ticket(AppendTicket),
    Nothing,
    Failed(Fail),
}

/// A round handed from the sequencer to the completion stage.
pub(crate) struct RoundDone {
    pub id: u64,
    pub outcome: Outcome,
    pub replies: Vec<ReplyFn>,
    pub user_marks: BTreeMap<Uid, SyncSeq>,
    pub conv_marks: BTreeMap<ConvId, MsgSeq>,
}

/// The completion stage's thread.
pub(crate) fn run_completion(shared: Arc<Shared>, rx: mpsc::Receiver<RoundDone>) {
    let mut poisoned: Option<Fail> = None;
    while let Ok(done) = rx.recv() {
        let result: std::result::Result<(), Fail> = match (&poisoned, done.outcome) {
            (Some(f), _) => Err(f.clone()),
            (None, Outcome::Ticket(t)) => t
                .wait()
                .map_err(|e| Fail::Poisoned(e.to_string()))
                .and_then(|_| match shared.check_msg_log() {
                    // A failure of the other log while the round was in
                    // flight fails it too: nothing is answered after one.
                    Some(m) => Err(Fail::Poisoned(m)),
                    None => Ok(()),
                }),
            (None, Outcome::Nothing) => Ok(()),
            (None, Outcome::Failed(f)) => Err(f),
        };
        let mut hints = Vec::new();
        let mut large_group_hints = Vec::new();
        match &result {
            Ok(()) => {
                let mut st = shared.state.write();
                for (&uid, &seq) in &done.user_marks {
                    if let Some(u) = st.users.get_mut(&uid).map(Arc::make_mut) {
                        u.committed_seq = u.committed_seq.max(seq);
                        hints.push(Hint {
                            uid,
                            committed_sync_seq: u.committed_seq,
                        });
                    }
                }
                for (&conv, &seq) in &done.conv_marks {
                    if let Some(c) = st.convs.get_mut(&conv).map(Arc::make_mut) {
                        c.committed_seq = c.committed_seq.max(seq);
                        if c.large.is_some() {
                            large_group_hints.push(LargeGroupHint {
                                conv,
                                head: c.committed_seq,
                            });
                        }
                    }
                }
            }
            Err(f @ Fail::Poisoned(m)) => {
                shared.poison(m.clone());
                poisoned = Some(f.clone());
            }
            Err(Fail::NoSpace(_)) => {}
        }
        shared
            .rounds_written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.settle(done.id);
        // Hints go out before the replies, so a writer that got its reply
        // knows its readers' subscribers have been told.
        if !hints.is_empty() {
            // No receiver is fine: hints are best effort (R16).
            let _ = shared.hints.send(hints);
        }
        if !large_group_hints.is_empty() {
            let _ = shared.large_group_hints.send(large_group_hints);
        }
        let fail = result.err();
        for reply in done.replies {
            reply(fail.as_ref());
        }
    }
}
