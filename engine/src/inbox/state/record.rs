//! The one interface every logged record implements: its kind code, its
//! codec, its `apply`, and what tools need to know of its kind (a name and
//! a one-line description for `inboxd dump`, whether it may append events
//! for salvage). Nothing else lists record kinds: `dump` and `salvage`
//! read them from here through each set's [`RecordSet::TABLE`]. Each subsystem implements [`Record`] for the
//! records it owns, next to the commands that decide them, and lists them
//! once with [`record_set!`], which makes the subsystem's enum of records
//! (a [`RecordSet`]); the `Effect` enum (`inbox/effect.rs`) holds one
//! variant per subsystem and knows no record kind.
//!
//! `apply` is the only code that changes the state. The sequencer calls it
//! live, right after deciding a command; recovery calls it on replay. It
//! must be a pure function of (state, record, record location): no clock,
//! no configuration, no IO.

use super::loc::PackedLoc;
use super::State;
use crate::api::{ConvId, MsgSeq, SyncEvent, SyncSeq, TimestampMs, Uid};
use crate::inbox::codec::{DecodeResult, Reader, Writer};

/// What an `apply` touched: the sequencer uses it to patch record
/// locations and to advance committed watermarks once durable.
#[derive(Default)]
pub(crate) struct Touched {
    pub events: Vec<(Uid, SyncSeq)>,
    pub conv: Option<(ConvId, MsgSeq)>,
    /// The message whose body is in the applied record itself: its index
    /// entry points at the record, so it learns the record's location
    /// when the batch is placed, like the events do.
    pub body: Option<(ConvId, MsgSeq)>,
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
    /// The kind's name, one word as `inboxd dump` prints it before the
    /// record's fields (`read`, `trim-messages`); distinct across kinds.
    const NAME: &'static str;
    /// Whether applying a record of this kind may append events to a
    /// user's stream or change whom later messages reach. Salvage reads it:
    /// a record of such a kind that is lost, or skipped, may have taken
    /// `sync_seq`s with it; one of any other kind cannot.
    const MAY_APPEND_EVENTS: bool;
    /// Writes the body (after the format byte).
    fn encode_body(&self, w: &mut Writer);
    /// Reads the body (after the format byte).
    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self>;
    /// The record's fields in one line, for `inboxd dump` (after
    /// [`Record::NAME`]): what locates it (conversation and `msg_seq`,
    /// user and `sync_seq`, device), never a message's text.
    fn describe(&self) -> String;
    /// Changes the state as the record says.
    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError>;
    /// The sync event the record is, for a user that holds it at
    /// `sync_seq`; `None` for records that are no event.
    fn to_event(&self, _sync_seq: SyncSeq) -> Option<SyncEvent> {
        None
    }
    /// Reads the body (after the format byte) only as far as its sync
    /// event needs: what a sync page does with each record. The default
    /// decodes the whole record; a record that carries data no event shows
    /// (a message's body) skips it without copying.
    fn decode_event(r: &mut Reader<'_>, sync_seq: SyncSeq) -> DecodeResult<Option<SyncEvent>> {
        Ok(Self::decode_body(r)?.to_event(sync_seq))
    }
    /// The time the record was stamped with, for the records that carry
    /// one (compaction's retention reads it).
    fn at_ms(&self) -> Option<TimestampMs> {
        None
    }
}

/// What the tools know of a record kind without a record of it: the
/// [`Record`] constants of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordKind {
    /// [`Record::KIND`].
    pub code: u8,
    /// [`Record::NAME`].
    pub name: &'static str,
    /// [`Record::MAY_APPEND_EVENTS`].
    pub may_append_events: bool,
}

impl RecordKind {
    /// The entry of record type `R`.
    pub(crate) const fn of<R: Record>() -> RecordKind {
        RecordKind {
            code: R::KIND,
            name: R::NAME,
            may_append_events: R::MAY_APPEND_EVENTS,
        }
    }
}

/// The records one subsystem owns, as one enum, dispatching to each
/// record's [`Record`] impl. Made by [`record_set!`].
pub(crate) trait RecordSet: Sized {
    /// Every kind code of the set, in declaration order.
    const KINDS: &'static [u8];
    /// Every kind of the set, in declaration order.
    const TABLE: &'static [RecordKind];
    fn kind(&self) -> u8;
    /// `NAME`, then [`Record::describe`], of the record.
    fn describe(&self) -> String;
    /// [`Record::MAY_APPEND_EVENTS`] of the record's kind.
    fn may_append_events(&self) -> bool;
    fn encode_body(&self, w: &mut Writer);
    /// Reads a body of kind `kind`, or `None` if the kind is not one of
    /// this set's.
    fn decode_body(kind: u8, r: &mut Reader<'_>) -> Option<DecodeResult<Self>>;
    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError>;
    #[cfg(test)]
    fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent>;
    /// [`Record::decode_event`] of the set's record of kind `kind`, or
    /// `None` if the kind is not one of this set's.
    fn decode_event(
        kind: u8,
        r: &mut Reader<'_>,
        sync_seq: SyncSeq,
    ) -> Option<DecodeResult<Option<SyncEvent>>>;
    fn at_ms(&self) -> Option<TimestampMs>;
}

/// True if no two of `sets` share a kind code and none uses bit 7 (which
/// marks a copy): the check that two subsystems never claim one kind.
pub(crate) const fn kinds_are_distinct(sets: &[&[u8]]) -> bool {
    let mut a = 0;
    while a < sets.len() {
        let mut i = 0;
        while i < sets[a].len() {
            let k = sets[a][i];
            if k & 0x80 != 0 {
                return false;
            }
            // Later codes of the same set, then every code of later sets.
            let mut b = a;
            let mut j = i + 1;
            while b < sets.len() {
                while j < sets[b].len() {
                    if sets[b][j] == k {
                        return false;
                    }
                    j += 1;
                }
                b += 1;
                j = 0;
            }
            i += 1;
        }
        a += 1;
    }
    true
}

/// A record type's set: the subsystem enum that holds it. Written by
/// [`record_set!`]; `effect.rs` makes `From<R> for Effect` of it.
pub(crate) trait InSet: Into<Self::Set> {
    type Set;
}

/// Declares a subsystem's enum of records from the list of its record
/// types, so a kind is listed exactly once, in the subsystem that owns it:
///
/// ```ignore
/// record_set! {
///     /// The records messaging owns.
///     pub(crate) enum Records in Effect::Messaging {
///         Msg(MsgEffect),
///         Read(ReadEffect),
///     }
/// }
/// ```
///
/// It makes the enum, its [`RecordSet`] impl, a compile-time check that
/// the set's kind codes are distinct, `From` each record type for the
/// enum, and [`InSet`] for each record type. `effect.rs` turns a record
/// into an `Effect` through [`InSet`], so this file names no `Effect`;
/// `in Effect::Variant` documents which variant holds the set.
macro_rules! record_set {
    (
        $(#[$doc:meta])*
        $vis:vis enum $set:ident in Effect::$_effect:ident {
            $($variant:ident($ty:ty)),+ $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        $vis enum $set {
            $($variant($ty),)+
        }

        impl $crate::inbox::state::record::RecordSet for $set {
            const KINDS: &'static [u8] = &[$(<$ty as $crate::inbox::state::record::Record>::KIND),+];

            const TABLE: &'static [$crate::inbox::state::record::RecordKind] =
                &[$($crate::inbox::state::record::RecordKind::of::<$ty>()),+];

            fn kind(&self) -> u8 {
                match self {
                    $($set::$variant(_) => <$ty as $crate::inbox::state::record::Record>::KIND,)+
                }
            }

            fn describe(&self) -> String {
                use $crate::inbox::state::record::Record;
                match self {
                    $($set::$variant(r) => format!("{} {}", <$ty as Record>::NAME, r.describe()),)+
                }
            }

            fn may_append_events(&self) -> bool {
                use $crate::inbox::state::record::Record;
                match self {
                    $($set::$variant(_) => <$ty as Record>::MAY_APPEND_EVENTS,)+
                }
            }

            fn encode_body(&self, w: &mut $crate::inbox::codec::Writer) {
                use $crate::inbox::state::record::Record as _;
                match self {
                    $($set::$variant(r) => r.encode_body(w),)+
                }
            }

            fn decode_body(
                kind: u8,
                r: &mut $crate::inbox::codec::Reader<'_>,
            ) -> Option<$crate::inbox::codec::DecodeResult<Self>> {
                $(
                    if kind == <$ty as $crate::inbox::state::record::Record>::KIND {
                        return Some(
                            <$ty as $crate::inbox::state::record::Record>::decode_body(r)
                                .map($set::$variant),
                        );
                    }
                )+
                None
            }

            fn apply(
                &self,
                st: &mut $crate::inbox::state::State,
                at: $crate::inbox::state::record::ApplyAt<'_>,
            ) -> Result<(), $crate::inbox::state::record::ApplyError> {
                use $crate::inbox::state::record::Record as _;
                match self {
                    $($set::$variant(r) => r.apply(st, at),)+
                }
            }

            #[cfg(test)]
            fn to_event(&self, sync_seq: $crate::api::SyncSeq) -> Option<$crate::api::SyncEvent> {
                use $crate::inbox::state::record::Record as _;
                match self {
                    $($set::$variant(r) => r.to_event(sync_seq),)+
                }
            }

            fn decode_event(
                kind: u8,
                r: &mut $crate::inbox::codec::Reader<'_>,
                sync_seq: $crate::api::SyncSeq,
            ) -> Option<$crate::inbox::codec::DecodeResult<Option<$crate::api::SyncEvent>>> {
                $(
                    if kind == <$ty as $crate::inbox::state::record::Record>::KIND {
                        return Some(
                            <$ty as $crate::inbox::state::record::Record>::decode_event(r, sync_seq),
                        );
                    }
                )+
                None
            }

            fn at_ms(&self) -> Option<$crate::api::TimestampMs> {
                use $crate::inbox::state::record::Record as _;
                match self {
                    $($set::$variant(r) => r.at_ms(),)+
                }
            }
        }

        // The set's kind codes are distinct and leave bit 7 to copies.
        const _: () = assert!($crate::inbox::state::record::kinds_are_distinct(&[
            <$set as $crate::inbox::state::record::RecordSet>::KINDS
        ]));

        $(
            impl From<$ty> for $set {
                fn from(r: $ty) -> $set {
                    $set::$variant(r)
                }
            }

            impl $crate::inbox::state::record::InSet for $ty {
                type Set = $set;
            }
        )+
    };
}

pub(crate) use record_set;

/// The first byte of every `evt` record payload.
pub(crate) const EFFECT_FORMAT_VERSION: u8 = 1;
