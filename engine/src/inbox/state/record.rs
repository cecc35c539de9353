//! The one interface every logged record implements: its kind code, its
//! codec and its `apply`. Each subsystem implements [`Record`] for the
//! records it owns, next to the commands that decide them; the `Effect`
//! enum (`inbox/effect.rs`) lists them and dispatches.
//!
//! `apply` is the only code that changes the state. The sequencer calls it
//! live, right after deciding a command; recovery calls it on replay. It
//! must be a pure function of (state, record, record location): no clock,
//! no configuration, no IO.

use super::loc::PackedLoc;
use super::State;
use crate::api::{ConvId, MsgSeq, SyncEvent, SyncSeq, Uid};
use crate::inbox::codec::{DecodeResult, Reader, Writer};

/// What an `apply` touched: the sequencer uses it to patch record
/// locations and to advance committed watermarks once durable.
#[derive(Default)]
pub(crate) struct Touched {
    pub events: Vec<(Uid, SyncSeq)>,
    pub conv: Option<(ConvId, MsgSeq)>,
}

/// Where and when a record is applied.
pub(crate) struct ApplyAt<'a> {
    /// The location of the record itself (or [`super::loc::PENDING_LOC`]
    /// while its batch is not placed): every event the record appends
    /// points at it.
    pub evt_loc: PackedLoc,
    /// The sequencer round that made the change (0 on replay); not state,
    /// readers use it to hold back rows that are not durable yet.
    pub stamp: u64,
    pub touched: &'a mut Touched,
}

/// A record that does not apply to the state it was decided on or
/// replayed onto: a bug, or a log that does not belong to this state.
#[derive(Debug)]
pub(crate) struct ApplyError(pub String);

/// A kind of `evt` record.
///
/// Layout rule shared by all kinds: the record's payload is one format
/// byte (see [`EFFECT_FORMAT_VERSION`]), then [`Record::encode_body`]; a
/// decoder refuses trailing bytes.
pub(crate) trait Record: Sized {
    /// The log record kind (bit 7 is reserved for copies).
    const KIND: u8;
    /// Writes the body (after the format byte).
    fn encode_body(&self, w: &mut Writer);
    /// Reads the body (after the format byte).
    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self>;
    /// Changes the state as the record says.
    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError>;
    /// The sync event the record is, for a user that holds it at
    /// `sync_seq`; `None` for records that are no event.
    fn to_event(&self, _sync_seq: SyncSeq) -> Option<SyncEvent> {
        None
    }
    /// For a record whose body went to the `msg` log: writes the body's
    /// location into the encoded record (the whole payload, format byte
    /// included) and into the index, once the `msg` batch is placed.
    fn place_body(_record: &mut [u8], _st: &mut State, _loc: PackedLoc) {}
}

/// The first byte of every `evt` record payload.
pub(crate) const EFFECT_FORMAT_VERSION: u8 = 1;
