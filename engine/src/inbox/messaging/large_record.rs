//! The records of large groups (R7): the switch of a conversation to a
//! large group ([`ModeEffect`]) and a member's clear of its dirty marker
//! ([`ClearEffect`]). Kept apart from `large.rs`, whose commands and reads
//! sit above the round, so that messaging's record set (`record.rs`) can
//! hold them; `large.rs` says how the mode works.

use std::sync::Arc;

use crate::api::*;
use crate::inbox::codec::{DecodeResult, Reader, Writer};
use crate::inbox::state::record::{ApplyAt, ApplyError, Record};
use crate::inbox::state::{LargeMode, LastEntry, State};

/// A conversation becomes a large group at `switch_seq` (its head).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModeEffect {
    pub conv: ConvId,
    pub switch_seq: MsgSeq,
}

impl Record for ModeEffect {
    const KIND: u8 = 12;
    const NAME: &'static str = "large-group";
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.conv);
        w.u64(self.switch_seq);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(Self {
            conv: r.id()?,
            switch_seq: r.id()?,
        })
    }

    fn describe(&self) -> String {
        format!("conv {} switch_seq {}", self.conv, self.switch_seq)
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let c = st
            .convs
            .get_mut(&self.conv)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError(format!("switch of unknown conv {}", self.conv)))?;
        if c.large.is_some() || self.switch_seq != c.head() {
            return Err(ApplyError(format!(
                "conv {} switches at {} but is large already or its head is {}",
                self.conv,
                self.switch_seq,
                c.head()
            )));
        }
        // Every member holds the switch entry in its own row (it was fanned
        // out), so `last` is only a placeholder until the next entry.
        c.large = Some(Box::new(LargeMode {
            switch_seq: self.switch_seq,
            last: LastEntry {
                msg_seq: self.switch_seq,
                ..LastEntry::default()
            },
            stamp: at.stamp,
        }));
        Ok(())
    }
}

/// A member cleared its dirty marker up to `cleared_seq` (R7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClearEffect {
    pub uid: Uid,
    pub conv: ConvId,
    pub cleared_seq: MsgSeq,
}

impl Record for ClearEffect {
    const KIND: u8 = 13;
    const NAME: &'static str = "clear-marker";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.uid);
        w.u64(self.conv);
        w.u64(self.cleared_seq);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(Self {
            uid: r.id()?,
            conv: r.id()?,
            cleared_seq: r.id()?,
        })
    }

    fn describe(&self) -> String {
        format!(
            "uid {} conv {} cleared_seq {}",
            self.uid, self.conv, self.cleared_seq
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let uc = st
            .users
            .get_mut(&self.uid)
            .map(Arc::make_mut)
            .and_then(|u| u.convs.get_mut(&self.conv))
            .ok_or_else(|| {
                ApplyError(format!(
                    "clear of conv {} by non-member {}",
                    self.conv, self.uid
                ))
            })?;
        uc.cleared_seq = uc.cleared_seq.max(self.cleared_seq);
        uc.stamp = at.stamp;
        Ok(())
    }
}
