//! `last_seen` refreshes on their way to the log.
//!
//! A sync answered from durable state logs its `last_seen` refresh on its
//! own (`Command::Touch`), so that the page never waits for a round's
//! fsync. Until that refresh is durable, `DEVICES` would still show the
//! older `last_seen_ms`, though the sync that moved it came first on the
//! connection. Requests of one connection take effect in the order they
//! arrived (PROTOCOL.md, section 1), so a device list waits for the
//! refreshes of its user that were queued before it was read: this module
//! counts them per user, from the moment the sync queues one until the
//! sequencer has decided it (or it was dropped). From then on the refresh
//! is in the device's row, whose stamp makes the list wait until its round
//! has settled, as for any change.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::api::Uid;

/// Refreshes queued and not yet decided, per user.
#[derive(Default)]
pub(crate) struct PendingTouches {
    counts: Mutex<HashMap<Uid, u32>>,
}

impl PendingTouches {
    /// Counts a refresh of `uid` until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>, uid: Uid) -> TouchGuard {
        *self.counts.lock().entry(uid).or_insert(0) += 1;
        TouchGuard {
            touches: Arc::clone(self),
            uid,
        }
    }

    /// Whether a refresh of `uid` is queued and not yet decided.
    pub(crate) fn pending(&self, uid: Uid) -> bool {
        self.counts.lock().contains_key(&uid)
    }
}

/// Held by a queued refresh until the sequencer has decided it.
pub(crate) struct TouchGuard {
    touches: Arc<PendingTouches>,
    uid: Uid,
}

impl Drop for TouchGuard {
    fn drop(&mut self) {
        let mut counts = self.touches.counts.lock();
        if let Some(n) = counts.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_has_a_pending_refresh_until_every_guard_is_dropped() {
        let touches = Arc::new(PendingTouches::default());
        let first = touches.begin(Uid(1));
        let second = touches.begin(Uid(1));
        assert!(touches.pending(Uid(1)));
        assert!(!touches.pending(Uid(2)));
        drop(first);
        assert!(touches.pending(Uid(1)));
        drop(second);
        assert!(!touches.pending(Uid(1)));
    }
}
