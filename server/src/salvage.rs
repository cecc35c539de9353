//! `inboxd salvage`: the engine's salvage report, printed for a person or
//! as one JSON object (`--json`). Both forms carry the same facts; the
//! JSON field names are stable for scripts (`docs/OPERATIONS.md`).

use std::fmt::Write as _;

use inbox_engine::inbox::{Damage, SalvageReport};
use serde_json::{json, Value};

/// The report in readable form, one fact per line.
pub fn render_text(report: &SalvageReport) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(match report.checkpoint_lsn {
        Some(lsn) => format!("checkpoint: started from the checkpoint at evt LSN {lsn}"),
        None => "checkpoint: none verified; state rebuilt from the evt log alone".into(),
    });
    for (name, reason) in &report.checkpoints_skipped {
        line(format!("checkpoint: skipped {name}: {reason}"));
    }
    line(format!(
        "evt: {} records applied, {} records damaged, {} records skipped",
        report.records_applied,
        report.records_lost,
        report.records_skipped.len()
    ));
    for d in &report.damage {
        line(format!("damage: {}", damage_text(d)));
    }
    for d in &report.records_skipped {
        line(format!("skipped: {}", damage_text(d)));
    }
    if let Some((segment, offset, bytes)) = report.torn_tail {
        line(format!(
            "torn tail: evt segment {segment} offset {offset}, {bytes} bytes never acknowledged (not a loss)"
        ));
    }
    if let Some(why) = &report.uncertain {
        line(format!(
            "uncertain: {why}; no user's sync_seq numbering after it can be trusted, so every \
             user's events were dropped and {} devices will get RESET_REQUIRED",
            report.devices_reset
        ));
    }
    for l in &report.lost_messages {
        line(format!(
            "lost messages: conv {} msg_seq {}..={} (served as tombstones)",
            l.conv, l.first, l.last
        ));
    }
    for l in &report.lost_events {
        line(format!(
            "lost events: uid {} sync_seq {}..={}",
            l.uid, l.first, l.last
        ));
    }
    for f in &report.raised_floors {
        line(format!(
            "floor raised: uid {} events now start after sync_seq {}; devices behind it get RESET_REQUIRED",
            f.uid, f.floor
        ));
    }
    let mut summary = String::new();
    let _ = write!(
        summary,
        "salvaged: {} messages, {} events, {} other files copied; ",
        report.messages_copied, report.events_copied, report.files_copied
    );
    summary.push_str(if report.is_lossless() {
        "nothing was lost"
    } else {
        "losses listed above"
    });
    line(summary);
    out
}

fn damage_text(d: &Damage) -> String {
    if d.segment == 0 {
        return format!("{}: {}", d.log, d.reason);
    }
    format!(
        "{} segment {} offset {}: {}",
        d.log, d.segment, d.offset, d.reason
    )
}

fn damage_json(d: &Damage) -> Value {
    json!({
        "log": d.log,
        "segment": d.segment,
        "offset": d.offset,
        "reason": d.reason,
    })
}

/// The report as one JSON object.
pub fn to_json(report: &SalvageReport) -> Value {
    json!({
        "lossless": report.is_lossless(),
        "checkpoint_lsn": report.checkpoint_lsn,
        "checkpoints_skipped": report.checkpoints_skipped.iter()
            .map(|(file, reason)| json!({"file": file, "reason": reason}))
            .collect::<Vec<_>>(),
        "records_applied": report.records_applied,
        "records_damaged": report.records_lost,
        "records_skipped": report.records_skipped.iter().map(damage_json).collect::<Vec<_>>(),
        "damage": report.damage.iter().map(damage_json).collect::<Vec<_>>(),
        "torn_tail": report.torn_tail.map(|(segment, offset, bytes)| {
            json!({"segment": segment, "offset": offset, "bytes": bytes})
        }),
        "uncertain": report.uncertain,
        "devices_reset": report.devices_reset,
        "lost_messages": report.lost_messages.iter()
            .map(|l| json!({"conv": l.conv.0, "first_msg_seq": l.first.0, "last_msg_seq": l.last.0}))
            .collect::<Vec<_>>(),
        "lost_events": report.lost_events.iter()
            .map(|l| json!({"uid": l.uid.0, "first_sync_seq": l.first.0, "last_sync_seq": l.last.0}))
            .collect::<Vec<_>>(),
        "raised_floors": report.raised_floors.iter()
            .map(|f| json!({"uid": f.uid.0, "floor": f.floor.0}))
            .collect::<Vec<_>>(),
        "messages_copied": report.messages_copied,
        "events_copied": report.events_copied,
        "files_copied": report.files_copied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use inbox_engine::inbox::{LostEvents, LostMessages};
    use inbox_engine::{ConvId, MsgSeq, SyncSeq, Uid};

    #[test]
    fn both_forms_name_every_lost_range() {
        let report = SalvageReport {
            lost_messages: vec![LostMessages {
                conv: ConvId(10),
                first: MsgSeq(4),
                last: MsgSeq(6),
            }],
            lost_events: vec![LostEvents {
                uid: Uid(2),
                first: SyncSeq(7),
                last: SyncSeq(7),
            }],
            ..SalvageReport::default()
        };
        let text = render_text(&report);
        assert!(text.contains("conv 10 msg_seq 4..=6"), "{text}");
        assert!(text.contains("uid 2 sync_seq 7..=7"), "{text}");
        let v = to_json(&report);
        assert_eq!(v["lossless"], false);
        assert_eq!(v["lost_messages"][0]["last_msg_seq"], 6);
        assert_eq!(v["lost_events"][0]["uid"], 2);
        assert!(to_json(&SalvageReport::default())["lossless"]
            .as_bool()
            .unwrap());
    }
}
