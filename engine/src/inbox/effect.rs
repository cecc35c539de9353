//! Every `evt` record, as one enum with one variant per subsystem, and the
//! one `apply` that both the sequencer (live) and recovery (replay) call.
//!
//! Each subsystem owns its records: the struct, its [`Record`] impl (kind
//! code, codec, `apply`, sync event), its layout, and the one list of them
//! ([`record_set!`](super::state::record::record_set)) that makes the
//! subsystem's enum of records, next to the commands that decide them.
//! This file knows the subsystems, not their records: adding a record kind
//! touches the subsystem's folder and `docs/FORMAT.md` only. Decoding asks
//! each subsystem in turn whether the kind is one of its own; the kind
//! codes of all subsystems are checked to be distinct at compile time.
//!
//! An effect is the *outcome* of a command as decided by the sequencer
//! (ids, seqs, the row after the change, the stamped time), never the
//! request itself: replay applies effects and never re-decides, so it
//! rebuilds exactly the state the sequencer had even if configuration or
//! the clock differ at restart.

use bytes::BytesMut;

use super::codec::{DecodeError, DecodeResult, Reader, Writer};
use super::compaction::record::Records as CompactionRecords;
use super::devices::ack_view::Before;
use super::devices::record::Records as DevicesRecords;
use super::fanout::record::Records as FanoutRecords;
use super::messaging::record::Records as MessagingRecords;
use super::replica::record::Records as ReplicaRecords;
use super::snapshots::record::Records as SnapshotsRecords;
#[cfg(doc)]
use super::state::record::Record;
use super::state::record::{
    kinds_are_distinct, ApplyAt, ApplyError, InSet, RecordKind, RecordSet, Touched,
    EFFECT_FORMAT_VERSION,
};
use super::state::{PackedLoc, State};
use crate::api::{DeviceId, SyncEvent, SyncSeq, TimestampMs, Uid};

/// Set on the kind of a record copied forward by a segment rewrite.
pub(crate) const COPY_FLAG: u8 = 0x80;

/// Declares [`Effect`] from the list of subsystems and generates the
/// dispatch to each subsystem's [`RecordSet`].
macro_rules! subsystems {
    ($($variant:ident($set:ty)),+ $(,)?) => {
        /// One `evt` record: a subsystem's record, or a copy.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub(crate) enum Effect {
            $($variant($set),)+
            /// A live record copied forward by a segment rewrite: data for
            /// the events that point at it; applying it changes nothing.
            Copied(Box<Effect>),
        }

        /// Each subsystem's kind codes.
        pub(crate) const KIND_SETS: &[&[u8]] = &[$(<$set as RecordSet>::KINDS),+];
        /// Each subsystem's kinds, as their [`Record`] impls define them.
        pub(crate) const KIND_TABLES: &[&[RecordKind]] = &[$(<$set as RecordSet>::TABLE),+];

        /// A record becomes an effect through its subsystem's set (the
/// `record_set!` of its `record.rs`), so `sink.effect(record.into())`
/// needs no list of record types here.
impl<R> From<R> for Effect
where
    R: InSet,
    Effect: From<R::Set>,
{
    fn from(r: R) -> Effect {
        Effect::from(r.into())
    }
}

impl From<MessagingRecords> for Effect {
    fn from(r: MessagingRecords) -> Effect {
        Effect::Messaging(r)
    }
}

impl From<DevicesRecords> for Effect {
    fn from(r: DevicesRecords) -> Effect {
        Effect::Devices(r)
    }
}

impl From<SnapshotsRecords> for Effect {
    fn from(r: SnapshotsRecords) -> Effect {
        Effect::Snapshots(r)
    }
}

impl From<CompactionRecords> for Effect {
    fn from(r: CompactionRecords) -> Effect {
        Effect::Compaction(r)
    }
}

impl From<ReplicaRecords> for Effect {
    fn from(r: ReplicaRecords) -> Effect {
        Effect::Replica(r)
    }
}

impl From<FanoutRecords> for Effect {
    fn from(r: FanoutRecords) -> Effect {
        Effect::Fanout(r)
    }
}

impl Effect {
    /// The device row this effect changes, as it is before the change: what
    /// [`super::devices::ack_view::AckViews::changed`] compares the change
    /// with. `None` for every effect but a device row's. The sequencer
    /// asks before it applies the effect, and names no subsystem to do so.
    pub fn device_row_before(&self, st: &State) -> Option<(Uid, DeviceId, Option<Before>)> {
        let Effect::Devices(DevicesRecords::Device(change)) = self else {
            return None;
        };
        let device = change.row.device;
        let before = (st.users.get(&change.uid))
            .and_then(|u| u.device(device))
            .map(|d| Before::of(&d.row, d.stamp, &change.row));
        Some((change.uid, device, before))
    }

            /// The `evt` log record kind.
            pub fn record_kind(&self) -> u8 {
                match self {
                    $(Effect::$variant(r) => r.kind(),)+
                    Effect::Copied(inner) => inner.record_kind() | COPY_FLAG,
                }
            }

            /// The record in one line for `inboxd dump`: its kind's name,
            /// then its fields.
            pub fn describe(&self) -> String {
                match self {
                    $(Effect::$variant(r) => r.describe(),)+
                    Effect::Copied(inner) => format!("copy of {}", inner.describe()),
                }
            }

            /// Whether the record may append events or change whom later
            /// messages reach (a copy: what it copies).
            pub fn may_append_events(&self) -> bool {
                match self {
                    $(Effect::$variant(r) => r.may_append_events(),)+
                    Effect::Copied(inner) => inner.may_append_events(),
                }
            }

            fn encode_body(&self, w: &mut Writer) {
                match self {
                    $(Effect::$variant(r) => r.encode_body(w),)+
                    Effect::Copied(inner) => inner.encode_body(w),
                }
            }

            fn decode_body(kind: u8, r: &mut Reader<'_>) -> DecodeResult<Effect> {
                $(
                    if let Some(set) = <$set as RecordSet>::decode_body(kind, r) {
                        return set.map(Effect::$variant);
                    }
                )+
                Err(DecodeError("unknown effect record kind"))
            }

            fn decode_event_body(
                kind: u8,
                r: &mut Reader<'_>,
                sync_seq: SyncSeq,
            ) -> DecodeResult<Option<SyncEvent>> {
                $(
                    if let Some(ev) = <$set as RecordSet>::decode_event(kind, r, sync_seq) {
                        return ev;
                    }
                )+
                Err(DecodeError("unknown effect record kind"))
            }

            fn apply_inner(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
                match self {
                    $(Effect::$variant(r) => r.apply(st, at),)+
                    // A copy is data for the events that will point at it;
                    // the original record already made its change.
                    Effect::Copied(_) => Ok(()),
                }
            }

            /// The sync event a user sees for this effect, at `sync_seq`
            /// (reads use [`Effect::decode_event`], which must agree).
            #[cfg(test)]
            pub fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
                match self {
                    $(Effect::$variant(r) => r.to_event(sync_seq),)+
                    Effect::Copied(inner) => inner.to_event(sync_seq),
                }
            }

            /// The time the record was stamped with, if it carries one (a
            /// copy carries its original's).
            pub fn at_ms(&self) -> Option<TimestampMs> {
                match self {
                    $(Effect::$variant(r) => r.at_ms(),)+
                    Effect::Copied(inner) => inner.at_ms(),
                }
            }
        }
    };
}

subsystems! {
    Messaging(MessagingRecords),
    Devices(DevicesRecords),
    Snapshots(SnapshotsRecords),
    Compaction(CompactionRecords),
    Replica(ReplicaRecords),
    Fanout(FanoutRecords),
}

// No two subsystems claim one kind code, and bit 7 is left to copies.
const _: () = assert!(kinds_are_distinct(KIND_SETS));

impl Effect {
    /// The record's payload: the format byte, then the kind's body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        self.encode_into(&mut out);
        out
    }

    /// [`Effect::encode`] appended to `out`: a round encodes each effect
    /// straight into its batch's frame.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut w = Writer::appending(std::mem::take(out));
        w.u8(EFFECT_FORMAT_VERSION);
        self.encode_body(&mut w);
        *out = w.buf;
    }

    pub fn decode(record_kind: u8, buf: &[u8]) -> DecodeResult<Effect> {
        if record_kind & COPY_FLAG != 0 {
            let inner = Effect::decode(record_kind & !COPY_FLAG, buf)?;
            return Ok(Effect::Copied(Box::new(inner)));
        }
        decode_whole(buf, |r| Effect::decode_body(record_kind, r))
    }

    /// [`Effect::decode_event_in`] with an arena of its own.
    #[cfg(test)]
    pub fn decode_event(
        record_kind: u8,
        buf: &[u8],
        sync_seq: SyncSeq,
    ) -> DecodeResult<Option<SyncEvent>> {
        Effect::decode_event_in(record_kind, buf, sync_seq, &mut BytesMut::new())
    }

    /// The sync event of the record `(record_kind, buf)` at `sync_seq`,
    /// as `decode(..)?.to_event(sync_seq)` gives it, read without
    /// decoding (or copying) what no event shows. The record is checked
    /// the same way: its version, and no trailing bytes. The event's short
    /// byte strings (a message's summary) are copied into `arena`: a sync
    /// page decodes its events into one arena, one allocation for the page
    /// instead of one per event.
    pub fn decode_event_in(
        record_kind: u8,
        buf: &[u8],
        sync_seq: SyncSeq,
        arena: &mut BytesMut,
    ) -> DecodeResult<Option<SyncEvent>> {
        // A copy is its original's event.
        let kind = record_kind & !COPY_FLAG;
        let mut r = Reader::with_arena(buf, arena);
        decode_whole_from(&mut r, |r| Effect::decode_event_body(kind, r, sync_seq))
    }

    /// Applies the effect: the one function that changes the state, live
    /// and on replay. `evt_loc` is the location of the effect's own record
    /// (or [`super::state::PENDING_LOC`] while it is not known), `stamp`
    /// the round that made the change.
    pub fn apply(
        &self,
        st: &mut State,
        evt_loc: PackedLoc,
        stamp: u64,
        touched: &mut Touched,
    ) -> Result<(), ApplyError> {
        // Every event an effect appends points at the effect's own record.
        let before = touched.events.len();
        let result = self.apply_inner(
            st,
            ApplyAt {
                evt_loc,
                stamp,
                touched,
            },
        );
        let added = (touched.events.len() - before) as u64;
        st.evt_refs.add(evt_loc, added);
        st.totals.events += added;
        result?;
        st.check_touched(touched)
    }
}

/// Runs `body` on a record payload after its format byte, and refuses
/// an unknown version or bytes left over.
fn decode_whole<T>(
    buf: &[u8],
    body: impl FnOnce(&mut Reader<'_>) -> DecodeResult<T>,
) -> DecodeResult<T> {
    decode_whole_from(&mut Reader::new(buf), body)
}

/// [`decode_whole`] from a reader made by the caller.
fn decode_whole_from<'a, T>(
    r: &mut Reader<'a>,
    body: impl FnOnce(&mut Reader<'a>) -> DecodeResult<T>,
) -> DecodeResult<T> {
    if r.u8()? != EFFECT_FORMAT_VERSION {
        return Err(DecodeError("unknown effect record version"));
    }
    let out = body(r)?;
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes in effect record"));
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::*;
    use crate::inbox::compaction::record::{BodyMove, MoveBodiesEffect, Relocation};
    use crate::inbox::compaction::record::{RelocateEffect, TrimEffect, TrimMsgsEffect};
    use crate::inbox::devices::record::DeviceEffect;
    use crate::inbox::messaging::record::{FlagsEffect, MsgBodyEffect, MsgEffect, ReadEffect};
    use crate::inbox::snapshots::record::SnapshotEffect;
    use crate::inbox::state::{pack, DeviceRow, SnapshotPhase, SnapshotRow, PENDING_LOC};
    use bytes::Bytes;

    #[test]
    fn effects_round_trip_through_their_encoding() {
        let effects = [
            Effect::from(MsgEffect {
                conv: ConvId(7),
                msg_seq: MsgSeq(3),
                msg_id: MsgId(99),
                sender: Uid(1),
                kind: MessageKind::Edit,
                msg_type: 12,
                target_seq: MsgSeq(2),
                at_ms: 1000,
                msg_loc: pack(crate::log::RecordLoc {
                    segment: 4,
                    offset: 512,
                }),
                client_msg_id: u128::MAX - 5,
                summary: Bytes::from_static(b"hello"),
            }),
            Effect::from(MsgBodyEffect {
                msg: MsgEffect {
                    conv: ConvId(7),
                    msg_seq: MsgSeq(4),
                    msg_id: MsgId(100),
                    sender: Uid(1),
                    kind: MessageKind::Normal,
                    msg_type: 3,
                    target_seq: MsgSeq(0),
                    at_ms: 1001,
                    // Not encoded: the record's own location.
                    msg_loc: PENDING_LOC,
                    client_msg_id: 77,
                    summary: Bytes::from_static(b"hi"),
                },
                body: Bytes::from_static(b"the message record"),
            }),
            Effect::from(ReadEffect {
                uid: Uid(1),
                conv: ConvId(2),
                read_seq: MsgSeq(3),
                at_ms: 4,
            }),
            Effect::from(FlagsEffect {
                uid: Uid(1),
                conv: ConvId(2),
                flags: ConvFlags {
                    muted: true,
                    pinned: false,
                },
                at_ms: 4,
            }),
            Effect::from(DeviceEffect {
                uid: Uid(5),
                row: DeviceRow {
                    device: DeviceId(6),
                    generation: Generation(7),
                    acked_sync_seq: SyncSeq(8),
                    state: DeviceState::Recovering,
                    last_seen_ms: 9,
                    lease: Some(Box::new(LeaseInfo {
                        lease_id: 1,
                        resume_from: SyncSeq(2),
                        hwm: SyncSeq(3),
                        expires_at_ms: 4,
                    })),
                },
            }),
            Effect::from(crate::inbox::replica::record::RoundMark { index: 7 }),
        ];
        assert_round_trips(&effects);
    }

    #[test]
    fn compaction_and_snapshot_records_round_trip_and_reject_every_prefix() {
        let effects = [
            Effect::from(SnapshotEffect {
                uid: Uid(9),
                row: SnapshotRow {
                    snapshot_id: 3,
                    device: DeviceId(2),
                    generation: Generation(7),
                    base_sync_seq: SyncSeq(120),
                    created_at_ms: 1_000,
                    expires_at_ms: 2_000,
                    phase: SnapshotPhase::Installed,
                },
            }),
            Effect::from(TrimEffect {
                uid: Uid(9),
                events_base: SyncSeq(77),
            }),
            Effect::from(TrimMsgsEffect {
                conv: ConvId(4),
                msgs_base: MsgSeq(31),
            }),
            Effect::from(RelocateEffect(vec![Relocation {
                uid: Uid(9),
                sync_seq: SyncSeq(80),
                from: 1 << 32 | 64,
                to: 5 << 32 | 128,
            }])),
            Effect::from(MoveBodiesEffect(vec![BodyMove {
                conv: ConvId(4),
                msg_seq: MsgSeq(2),
                from: (1 << 63) | (3 << 32) | 64,
                to: 2 << 32 | 32,
            }])),
            Effect::Copied(Box::new(Effect::from(ReadEffect {
                uid: Uid(1),
                conv: ConvId(2),
                read_seq: MsgSeq(3),
                at_ms: 4,
            }))),
        ];
        assert_round_trips(&effects);
    }

    #[test]
    fn no_two_subsystems_claim_the_same_kind_code() {
        let mut seen = std::collections::BTreeMap::new();
        for (subsystem, kinds) in KIND_SETS.iter().enumerate() {
            for &kind in *kinds {
                assert_eq!(kind & COPY_FLAG, 0, "kind {kind} uses the copy bit");
                if let Some(other) = seen.insert(kind, subsystem) {
                    panic!("kind {kind} is claimed by subsystems {other} and {subsystem}");
                }
            }
        }
        // Every kind written before the records moved into their
        // subsystems keeps its code; 9 (message with its body) and 10
        // (body moves) came with the single commit log; 14 (the round
        // mark) with replication; 15 to 18 (the outbox, its trim, a
        // delivery and the dedup trim) with fan-out across groups; 19 and
        // 20 (what an open reserves past a cut tail) with the reservation.
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            [
                (1, 0),
                (2, 0),
                (3, 0),
                (4, 1),
                (5, 2),
                (6, 3),
                (7, 3),
                (8, 3),
                (9, 0),
                (10, 3),
                (12, 0),
                (13, 0),
                (14, 4),
                (15, 5),
                (16, 5),
                (17, 5),
                (18, 5),
                (19, 0),
                (20, 0),
            ]
        );
        // The same check the build runs refuses a kind claimed twice.
        assert!(!kinds_are_distinct(&[&[1, 2], &[3, 2]]));
        assert!(!kinds_are_distinct(&[&[1, 0x81]]));
        assert!(kinds_are_distinct(&[&[1, 2], &[3]]));
    }

    /// Each effect decodes back to itself, and every strict prefix of its
    /// encoding is rejected, never misread. The event-only decode a sync
    /// page uses gives the event of the whole decode, for the record and
    /// for its copy, alone and through an arena shared with the others,
    /// and refuses the same damaged encodings.
    pub(crate) fn assert_round_trips(effects: &[Effect]) {
        // One arena for all of them, as a sync page shares one among its
        // events; small, so that it fills and grows along the way.
        let mut arena = BytesMut::with_capacity(16);
        for e in effects {
            let bytes = e.encode();
            assert_eq!(
                Effect::decode_event_in(e.record_kind(), &bytes, SyncSeq(5), &mut arena),
                Ok(e.to_event(SyncSeq(5))),
                "{e:?} through a shared arena"
            );
            assert_eq!(Effect::decode(e.record_kind(), &bytes), Ok(e.clone()));
            for cut in 0..bytes.len() {
                assert!(Effect::decode(e.record_kind(), &bytes[..cut]).is_err());
                assert!(Effect::decode_event(e.record_kind(), &bytes[..cut], SyncSeq(1)).is_err());
            }
            let copy = Effect::Copied(Box::new(e.clone()));
            for kind in [e.record_kind(), copy.record_kind()] {
                assert_eq!(
                    Effect::decode_event(kind, &bytes, SyncSeq(77)),
                    Ok(e.to_event(SyncSeq(77))),
                    "{e:?}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Effect::decode_event(e.record_kind(), &longer, SyncSeq(1)).is_err());
            let mut other_version = bytes.clone();
            other_version[0] = EFFECT_FORMAT_VERSION + 1;
            assert!(Effect::decode_event(e.record_kind(), &other_version, SyncSeq(1)).is_err());
        }
    }
}
