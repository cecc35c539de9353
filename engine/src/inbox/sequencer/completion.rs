//! The completion stage: finishes rounds strictly in order. Once a round
//! is durable (and, for a leader's round, committed by the consensus
//! layer) it advances the committed watermarks, releases every reply of
//! the round (errors too, so no answer ever reflects a change that is not
//! durable) and publishes one coalesced hint per user.
//!
//! The stage has no thread of its own. Rounds wait in a queue, and
//! whoever makes one ready finishes every ready round at the front:
//! - the sequencer, as it queues a round (a round with nothing to write,
//!   or one that failed, is ready at once);
//! - the thread that wrote the `evt` batches, after each pass that made
//!   some durable or poisoned the log (the log's durable hook, installed
//!   at open): the sequencer, which commits its own rounds while the
//!   log's writer thread is idle, or that thread;
//! - the consensus layer, when it commits a leader's rounds or the
//!   leadership ends.
//!
//! So the common send crosses no thread after its fdatasync but the one
//! that answers the client. Replies are sent after the queue's lock is
//! released, so a slow reply never holds up the next round's finish.

use std::sync::Arc;

use super::completion_queue::{Outcome, RoundDone};
use crate::inbox::round::{Fail, ReplyFn};
use crate::inbox::shared::{Hint, LargeGroupHint, Shared};

/// Folds `marks` to one entry per key, its highest value, in key order.
/// A round pushes an entry per change, which is cheaper than keeping a map
/// up to date on every event: a sort of a few hundred pairs once a round.
fn highest_per_key<K: Ord + Copy, V: Ord + Copy>(marks: &mut Vec<(K, V)>) {
    marks.sort_unstable();
    // Sorted by key, then value: the last of each run of a key is its
    // highest; `dedup_by` keeps the first of a run, so it is handed on.
    marks.dedup_by(|later, kept| {
        if later.0 == kept.0 {
            kept.1 = later.1;
            true
        } else {
            false
        }
    });
}

/// Queues `done` behind the rounds before it and finishes what is ready.
pub(crate) fn submit(shared: &Shared, done: RoundDone) {
    shared.completions.lock().rounds.push_back(done);
    pump(shared);
}

/// Finishes every ready round at the front of the queue, in order, then
/// sends their replies. Called by whoever may have made a round ready.
pub(crate) fn pump(shared: &Shared) {
    let mut answers: Vec<(Vec<ReplyFn>, Option<Fail>)> = Vec::new();
    {
        let mut q = shared.completions.lock();
        while q.rounds.front().is_some_and(RoundDone::is_ready) {
            let done = q.rounds.pop_front().expect("a front round");
            answers.push(finish(shared, &mut q.poisoned, done));
        }
    }
    for (replies, fail) in answers {
        release(replies, fail);
    }
}

/// Sends a finished round's replies: its failure, or durable.
fn release(replies: Vec<ReplyFn>, fail: Option<Fail>) {
    for reply in replies {
        reply(fail.as_ref());
    }
}

/// Finishes the rounds left once the sequencer has stopped, blocking on
/// each until its outcome is known (the log's writer still runs).
pub(crate) fn finish_all(shared: &Shared) {
    loop {
        let Some(done) = shared.completions.lock().rounds.pop_front() else {
            return;
        };
        if let Outcome::Ticket(t) = &done.outcome {
            let _ = t.wait_durable();
        }
        if let Some((link, index)) = &done.replica {
            let _ = link.wait_committed(*index);
        }
        let (replies, fail) = {
            let mut q = shared.completions.lock();
            finish(shared, &mut q.poisoned, done)
        };
        release(replies, fail);
    }
}

/// Finishes one round whose outcome is known: watermarks, poison, the
/// settled round and hints. Returns its replies and the failure they get.
fn finish(
    shared: &Shared,
    poisoned: &mut Option<Fail>,
    mut done: RoundDone,
) -> (Vec<ReplyFn>, Option<Fail>) {
    let result: std::result::Result<(), Fail> = match (&*poisoned, done.outcome) {
        (Some(f), _) => Err(f.clone()),
        (None, Outcome::Ticket(t)) => t
            .wait()
            .map_err(|e| Fail::Poisoned(e.to_string()))
            .and_then(|_| match shared.check_msg_log() {
                // A failure of the other log while the round was in
                // flight fails it too: nothing is answered after one.
                Some(m) => Err(Fail::Poisoned(m)),
                None => Ok(()),
            })
            .and_then(|()| match &done.replica {
                // Decided already (see `is_ready`): does not block.
                Some((link, index)) => link.wait_committed(*index),
                None => Ok(()),
            }),
        (None, Outcome::Nothing) => match &done.replica {
            // Decided already (see `is_ready`): does not block.
            Some((link, index)) => link.wait_committed(*index),
            None => Ok(()),
        },
        (None, Outcome::Failed(f)) => Err(f),
    };
    let mut hints = Vec::new();
    let mut large_group_hints = Vec::new();
    match &result {
        Ok(()) => {
            highest_per_key(&mut done.user_marks);
            highest_per_key(&mut done.conv_marks);
            let mut st = shared.state.write();
            for &(uid, seq) in &done.user_marks {
                if let Some(u) = st.users.get_mut(&uid).map(Arc::make_mut) {
                    u.committed_seq = u.committed_seq.max(seq);
                    hints.push(Hint {
                        uid,
                        committed_sync_seq: u.committed_seq,
                    });
                }
            }
            for &(conv, seq) in &done.conv_marks {
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
            *poisoned = Some(f.clone());
        }
        // The state keeps the round until the consensus layer's
        // rollback rebuilds it (`Inbox::discard_from`).
        Err(Fail::NoSpace(_) | Fail::NotLeader(_)) => {}
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
    (done.replies, result.err())
}

#[cfg(test)]
mod tests {
    use super::highest_per_key;

    #[test]
    fn marks_fold_to_the_highest_value_of_each_key_in_key_order() {
        let mut marks = vec![(7u64, 3u64), (2, 9), (7, 5), (2, 1), (4, 4), (7, 4)];
        highest_per_key(&mut marks);
        assert_eq!(marks, vec![(2, 9), (4, 4), (7, 5)]);
        let mut none: Vec<(u64, u64)> = Vec::new();
        highest_per_key(&mut none);
        assert!(none.is_empty());
    }
}
