//! What a salvage found, kept and lost: the report the operator reads
//! (`inboxd salvage` prints it, readable or as JSON).

use crate::api::*;

/// One place in the source that was damaged or skipped, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// `"evt"`, `"msg"` or `"checkpoint"`.
    pub log: &'static str,
    /// 0 when the damage has no single place (segment ids start at 1).
    pub segment: u32,
    pub offset: u64,
    pub reason: String,
}

impl Damage {
    pub(crate) fn new(log: &'static str, segment: u32, offset: u64, reason: String) -> Self {
        Damage {
            log,
            segment,
            offset,
            reason,
        }
    }
}

/// Messages of one conversation that are lost: `first..=last` (`msg_seq`).
/// The conversation keeps its numbering; each is served as a tombstone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostMessages {
    pub conv: ConvId,
    pub first: MsgSeq,
    pub last: MsgSeq,
}

/// Events of one user that are lost: `first..=last` (`sync_seq`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostEvents {
    pub uid: Uid,
    pub first: SyncSeq,
    pub last: SyncSeq,
}

/// A user whose retained events now start after `floor` (raised past the
/// last lost one): a device that has not ACKed up to it gets
/// `RESET_REQUIRED` on its next sync; one past it syncs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaisedFloor {
    pub uid: Uid,
    pub floor: SyncSeq,
}

/// The whole account of a salvage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SalvageReport {
    /// The evt LSN of the checkpoint the state started from (`None`:
    /// none verified, the state was rebuilt from the log alone).
    pub checkpoint_lsn: Option<u64>,
    /// Checkpoint files passed over (file name, why).
    pub checkpoints_skipped: Vec<(String, String)>,
    /// `evt` records applied after the checkpoint.
    pub records_applied: u64,
    /// `evt` records whose checksum failed.
    pub records_lost: u64,
    /// Records that verify but could not be applied (they depend on what
    /// was lost), and where.
    pub records_skipped: Vec<Damage>,
    /// Every damaged place met, in the order found.
    pub damage: Vec<Damage>,
    /// A torn tail of the last `evt` segment (segment, offset, bytes):
    /// never acknowledged, not a loss.
    pub torn_tail: Option<(u32, u64, u64)>,
    /// Set when something was lost whose events cannot be told (a batch
    /// whose records cannot be told apart, a damaged record that is not a
    /// readable message): every user's `sync_seq` numbering after it is
    /// uncertain, so every device resets and every user's events are
    /// dropped (listed in `lost_events`). Says why.
    pub uncertain: Option<String>,
    pub lost_messages: Vec<LostMessages>,
    pub lost_events: Vec<LostEvents>,
    pub raised_floors: Vec<RaisedFloor>,
    /// Devices set to reset by an uncertain salvage.
    pub devices_reset: u64,
    /// What the new directory holds.
    pub messages_copied: u64,
    pub events_copied: u64,
    pub files_copied: u64,
}

impl SalvageReport {
    /// True when the new directory holds everything the old one served.
    pub fn is_lossless(&self) -> bool {
        self.lost_messages.is_empty()
            && self.lost_events.is_empty()
            && self.uncertain.is_none()
            && self.records_lost == 0
            && self.records_skipped.is_empty()
    }

    pub(crate) fn make_uncertain(&mut self, why: &str) {
        self.uncertain.get_or_insert_with(|| why.to_string());
    }

    pub(crate) fn anything_lost(&self) -> bool {
        !self.damage.is_empty() || self.records_lost > 0 || self.uncertain.is_some()
    }
}

/// Sorted, distinct numbers as `(first, last)` runs.
pub(crate) fn runs(seqs: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for s in seqs {
        match out.last_mut() {
            Some((_, last)) if *last + 1 == s => *last = s,
            _ => out.push((s, s)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_join_consecutive_numbers_only() {
        assert_eq!(super::runs([1, 2, 3, 5, 7, 8]), [(1, 3), (5, 5), (7, 8)]);
        assert!(super::runs([]).is_empty());
    }
}
