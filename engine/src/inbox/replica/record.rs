//! The round mark: the last record of every batch of a replicated round,
//! on the leader and on each follower. It carries the round's replication
//! index, so a node learns from its own log (replay, or its checkpoint)
//! which round it holds last, and replay refuses a gap.
//!
//! ## `evt` record (kind 14, after the format byte, little-endian)
//! ```text
//! index u64   the round's replication index: the previous one + 1
//! ```
//!
//! ## Checkpoint
//! `State::replica_index`, in the checkpoint section of tag
//! `REPLICA_INDEX` (0 on a store that never replicated).

use crate::inbox::codec::{DecodeResult, Reader, Writer};
use crate::inbox::state::record::{record_set, ApplyAt, ApplyError, Record};
use crate::inbox::state::State;

record_set! {
    /// The `evt` records replication owns.
    pub(crate) enum Records in Effect::Replica {
        Mark(RoundMark),
    }
}

/// Closes a replicated round's batch: the round's replication index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RoundMark {
    pub index: u64,
}

impl Record for RoundMark {
    const KIND: u8 = 14;
    const NAME: &'static str = "round-mark";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.index);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(RoundMark { index: r.u64()? })
    }

    fn describe(&self) -> String {
        format!("index {}", self.index)
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        // Rounds are applied in index order with no gap; anything else
        // means a lost or repeated round.
        if self.index != st.replica_index + 1 {
            return Err(ApplyError(format!(
                "round mark {} does not follow replication index {}",
                self.index, st.replica_index
            )));
        }
        st.replica_index = self.index;
        Ok(())
    }
}
