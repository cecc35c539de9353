//! Every kind of `evt` record, in one enum, and the one `apply` that both
//! the sequencer (live) and recovery (replay) call.
//!
//! Each subsystem owns its records: the struct, its [`Record`] impl (kind
//! code, codec, `apply`, sync event) and its layout, next to the commands
//! that decide it. This file only lists them; adding a record kind is one
//! struct and impl in its subsystem, one line in [`records!`] below, and
//! its layout in `docs/FORMAT.md`.
//!
//! An effect is the *outcome* of a command as decided by the sequencer
//! (ids, seqs, the row after the change, the stamped time), never the
//! request itself: replay applies effects and never re-decides, so it
//! rebuilds exactly the state the sequencer had even if configuration or
//! the clock differ at restart.

use super::codec::{DecodeError, DecodeResult, Reader, Writer};
use super::compaction::record::{RelocateEffect, TrimEffect, TrimMsgsEffect};
use super::devices::record::DeviceEffect;
use super::messaging::record::{FlagsEffect, MsgEffect, ReadEffect};
use super::snapshots::record::SnapshotEffect;
use super::state::record::{ApplyAt, ApplyError, Record, Touched, EFFECT_FORMAT_VERSION};
use super::state::{PackedLoc, State};
use crate::api::{SyncEvent, SyncSeq};

/// Set on the kind of a record copied forward by a segment rewrite.
pub(crate) const COPY_FLAG: u8 = 0x80;

/// Declares [`Effect`] from the list of record types and generates the
/// dispatch by kind code, so a kind is listed exactly once.
macro_rules! records {
    ($($variant:ident($ty:ty)),+ $(,)?) => {
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub(crate) enum Effect {
            $($variant($ty),)+
            /// A live record copied forward by a segment rewrite: data for
            /// the events that point at it; applying it changes nothing.
            Copied(Box<Effect>),
        }

        /// Every kind code, in declaration order.
        const KINDS: &[u8] = &[$(<$ty as Record>::KIND),+];

        impl Effect {
            /// The `evt` log record kind.
            pub fn record_kind(&self) -> u8 {
                match self {
                    $(Effect::$variant(_) => <$ty as Record>::KIND,)+
                    Effect::Copied(inner) => inner.record_kind() | COPY_FLAG,
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
                    if kind == <$ty as Record>::KIND {
                        return Ok(Effect::$variant(<$ty as Record>::decode_body(r)?));
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

            /// Tells an encoded record of kind `kind`, and the index, where
            /// the body that goes with it was placed ([`Record::place_body`]).
            pub fn place_body(kind: u8, record: &mut [u8], st: &mut State, loc: PackedLoc) {
                $(
                    if kind == <$ty as Record>::KIND {
                        return <$ty as Record>::place_body(record, st, loc);
                    }
                )+
            }

            /// The sync event a user sees for this effect, at `sync_seq`.
            pub fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
                match self {
                    $(Effect::$variant(r) => r.to_event(sync_seq),)+
                    Effect::Copied(inner) => inner.to_event(sync_seq),
                }
            }
        }

        $(
            impl From<$ty> for Effect {
                fn from(r: $ty) -> Effect {
                    Effect::$variant(r)
                }
            }
        )+
    };
}

records! {
    Msg(MsgEffect),
    Read(ReadEffect),
    Flags(FlagsEffect),
    Device(DeviceEffect),
    Snapshot(SnapshotEffect),
    Trim(TrimEffect),
    Relocate(RelocateEffect),
    TrimMsgs(TrimMsgsEffect),
}

// Kind codes are distinct and leave bit 7 to copies.
const _: () = {
    let mut i = 0;
    while i < KINDS.len() {
        assert!(KINDS[i] & COPY_FLAG == 0);
        let mut j = i + 1;
        while j < KINDS.len() {
            assert!(KINDS[i] != KINDS[j]);
            j += 1;
        }
        i += 1;
    }
};

impl Effect {
    /// The record's payload: the format byte, then the kind's body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(96);
        w.u8(EFFECT_FORMAT_VERSION);
        self.encode_body(&mut w);
        w.buf
    }

    pub fn decode(record_kind: u8, buf: &[u8]) -> DecodeResult<Effect> {
        if record_kind & COPY_FLAG != 0 {
            let inner = Effect::decode(record_kind & !COPY_FLAG, buf)?;
            return Ok(Effect::Copied(Box::new(inner)));
        }
        let mut r = Reader::new(buf);
        if r.u8()? != EFFECT_FORMAT_VERSION {
            return Err(DecodeError("unknown effect record version"));
        }
        let effect = Effect::decode_body(record_kind, &mut r)?;
        if !r.is_empty() {
            return Err(DecodeError("trailing bytes in effect record"));
        }
        Ok(effect)
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::*;
    use crate::inbox::compaction::record::Relocation;
    use crate::inbox::state::{pack, DeviceRow, SnapshotPhase, SnapshotRow};
    use bytes::Bytes;

    #[test]
    fn effects_round_trip_through_their_encoding() {
        let effects = [
            Effect::Msg(MsgEffect {
                conv: 7,
                msg_seq: 3,
                msg_id: 99,
                sender: 1,
                kind: MessageKind::Edit,
                msg_type: 12,
                target_seq: 2,
                at_ms: 1000,
                msg_loc: pack(crate::log::RecordLoc {
                    segment: 4,
                    offset: 512,
                }),
                client_msg_id: u128::MAX - 5,
                summary: Bytes::from_static(b"hello"),
            }),
            Effect::Read(ReadEffect {
                uid: 1,
                conv: 2,
                read_seq: 3,
                at_ms: 4,
            }),
            Effect::Flags(FlagsEffect {
                uid: 1,
                conv: 2,
                flags: ConvFlags {
                    muted: true,
                    pinned: false,
                },
                at_ms: 4,
            }),
            Effect::Device(DeviceEffect {
                uid: 5,
                row: DeviceRow {
                    device: 6,
                    generation: 7,
                    acked_sync_seq: 8,
                    state: DeviceState::Recovering,
                    last_seen_ms: 9,
                    lease: Some(LeaseInfo {
                        lease_id: 1,
                        resume_from: 2,
                        hwm: 3,
                        expires_at_ms: 4,
                    }),
                },
            }),
        ];
        assert_round_trips(&effects);
    }

    #[test]
    fn compaction_and_snapshot_records_round_trip_and_reject_every_prefix() {
        let effects = [
            Effect::Snapshot(SnapshotEffect {
                uid: 9,
                row: SnapshotRow {
                    snapshot_id: 3,
                    device: 2,
                    generation: 7,
                    base_sync_seq: 120,
                    created_at_ms: 1_000,
                    expires_at_ms: 2_000,
                    phase: SnapshotPhase::Installed,
                },
            }),
            Effect::Trim(TrimEffect {
                uid: 9,
                events_base: 77,
            }),
            Effect::TrimMsgs(TrimMsgsEffect {
                conv: 4,
                msgs_base: 31,
            }),
            Effect::Relocate(RelocateEffect(vec![Relocation {
                uid: 9,
                sync_seq: 80,
                from: 1 << 32 | 64,
                to: 5 << 32 | 128,
            }])),
            Effect::Copied(Box::new(Effect::Read(ReadEffect {
                uid: 1,
                conv: 2,
                read_seq: 3,
                at_ms: 4,
            }))),
        ];
        assert_round_trips(&effects);
    }

    /// Each effect decodes back to itself, and every strict prefix of its
    /// encoding is rejected, never misread.
    pub(crate) fn assert_round_trips(effects: &[Effect]) {
        for e in effects {
            let bytes = e.encode();
            assert_eq!(Effect::decode(e.record_kind(), &bytes), Ok(e.clone()));
            for cut in 0..bytes.len() {
                assert!(Effect::decode(e.record_kind(), &bytes[..cut]).is_err());
            }
        }
    }
}
