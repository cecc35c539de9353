//! The record kinds of the logs, for the tools that read a data directory
//! without opening it (`inboxd dump`): every `evt` kind as its [`Record`]
//! impl defines it, and one line of text per record. Nothing here keeps a
//! list of its own: the kinds come from each subsystem's `record_set!`,
//! the text from each record's [`Record::describe`].
//!
//! [`Record`]: super::state::record::Record
//! [`Record::describe`]: super::state::record::Record::describe

use super::effect::{Effect, KIND_TABLES};
use super::messaging::record::{describe_msg_record, MSG_RECORD};

pub use super::state::record::RecordKind;

/// Every `evt` record kind, subsystem by subsystem.
pub fn evt_kinds() -> impl Iterator<Item = RecordKind> {
    KIND_TABLES.iter().flat_map(|set| set.iter().copied())
}

/// The `evt` record of kind `kind` (bit 7 set for a copy) in one line:
/// `effect`, the kind's name, its fields. `Err` says why the payload does
/// not decode as that kind (an unknown kind, a short or damaged payload).
pub fn describe_evt(kind: u8, payload: &[u8]) -> Result<String, &'static str> {
    Effect::decode(kind, payload)
        .map(|e| format!("effect {}", e.describe()))
        .map_err(|e| e.0)
}

/// The `msg` log record of kind `kind` in one line (see [`describe_evt`]).
pub fn describe_msg(kind: u8, payload: &[u8]) -> Result<String, &'static str> {
    if kind != MSG_RECORD {
        return Err("unknown msg record kind");
    }
    describe_msg_record(payload).map_err(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::effect::{COPY_FLAG, KIND_SETS};
    use crate::inbox::state::record::EFFECT_FORMAT_VERSION;
    use std::collections::HashMap;

    /// Whether the decoder knows `code` at all: an empty body of a known
    /// kind is short, of an unknown kind refused as unknown.
    fn decoder_knows(code: u8) -> bool {
        match Effect::decode(code, &[EFFECT_FORMAT_VERSION]) {
            Ok(_) => true,
            Err(e) => e.0 != "unknown effect record kind",
        }
    }

    #[test]
    fn every_kind_code_in_use_has_one_entry_with_a_name_and_a_classification() {
        let kinds: Vec<RecordKind> = evt_kinds().collect();
        let mut by_code: HashMap<u8, Vec<RecordKind>> = HashMap::new();
        for k in &kinds {
            by_code.entry(k.code).or_default().push(*k);
        }
        for code in 0..COPY_FLAG {
            let entries = by_code.get(&code).map_or(&[][..], |v| &v[..]);
            assert!(
                entries.len() <= 1,
                "kind {code} is claimed twice: {entries:?}"
            );
            assert_eq!(
                decoder_knows(code),
                entries.len() == 1,
                "kind {code}: the decoder and the kinds table disagree"
            );
        }
        for code in COPY_FLAG..=u8::MAX {
            assert!(
                !by_code.contains_key(&code),
                "kind {code} uses the copy bit"
            );
        }
        let mut names: HashMap<&str, u8> = HashMap::new();
        for k in &kinds {
            assert!(
                !k.name.is_empty() && k.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "kind {} has no one-word name: {:?}",
                k.code,
                k.name
            );
            if let Some(other) = names.insert(k.name, k.code) {
                panic!("kinds {other} and {} are both named {}", k.code, k.name);
            }
        }
        // Both classifications are in use, and each kind has exactly one:
        // the table and the sets list the same codes.
        assert!(kinds.iter().any(|k| k.may_append_events));
        assert!(kinds.iter().any(|k| !k.may_append_events));
        let mut from_sets: Vec<u8> = KIND_SETS.iter().flat_map(|s| s.iter().copied()).collect();
        let mut from_table: Vec<u8> = kinds.iter().map(|k| k.code).collect();
        from_sets.sort_unstable();
        from_table.sort_unstable();
        assert_eq!(from_sets, from_table);
    }

    #[test]
    fn a_record_is_described_by_its_kinds_name_and_a_copy_as_a_copy() {
        let trim = [
            &[EFFECT_FORMAT_VERSION][..],
            &7u64.to_le_bytes(),
            &40u64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(
            describe_evt(6, &trim).unwrap(),
            "effect trim uid 7 events_base 40"
        );
        assert_eq!(
            describe_evt(6 | COPY_FLAG, &trim).unwrap(),
            "effect copy of trim uid 7 events_base 40"
        );
        assert!(describe_evt(6, &trim[..9]).is_err());
        assert_eq!(describe_evt(99, &trim), Err("unknown effect record kind"));
        assert_eq!(describe_msg(2, &trim), Err("unknown msg record kind"));
    }
}
