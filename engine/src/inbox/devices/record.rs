//! The device record: a device row after a change (register, revoke,
//! eviction by the device cap, sync generation bumps, leases, ACKs,
//! `last_seen` refreshes). Replay upserts the row.
//!
//! ## `evt` record (kind 4, after the format byte, little-endian)
//! ```text
//! uid u64, device u64, generation u64, acked_sync_seq u64,
//! state u8 (0 active, 1 recovering, 2 resetting, 3 revoked),
//! last_seen_ms u64,
//! lease tag u8 (0 none, 1 lease), then if 1:
//!   lease_id u64, resume_from u64, hwm u64, expires_at_ms u64
//! ```
//! The same row layout (from `device` on) is used in checkpoints, where
//! each user's entry carries `next_lease_id` u64, then its device rows
//! (count u64, rows in registration order).

use std::sync::Arc;

use crate::api::*;
use crate::inbox::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::state::record::{record_set, ApplyAt, ApplyError, Record};
use crate::inbox::state::{grow_for_one, Device, DeviceRow, State, User};

record_set! {
    /// The `evt` records the devices subsystem owns.
    pub(crate) enum Records in Effect::Devices {
        Device(DeviceEffect),
    }
}

/// A device row after a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceEffect {
    pub uid: Uid,
    pub row: DeviceRow,
}

impl Record for DeviceEffect {
    const KIND: u8 = 4;
    const NAME: &'static str = "device";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.uid);
        put_device_row(w, &self.row);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(DeviceEffect {
            uid: r.id()?,
            row: get_device_row(r)?,
        })
    }

    fn describe(&self) -> String {
        let r = &self.row;
        format!(
            "uid {} device {} generation {} acked_sync_seq {} state {:?} last_seen_ms {}{}",
            self.uid,
            r.device,
            r.generation,
            r.acked_sync_seq,
            r.state,
            r.last_seen_ms,
            match &r.lease {
                Some(l) => format!(" lease {} resume_from {}", l.lease_id, l.resume_from),
                None => String::new(),
            }
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let stamp = at.stamp;
        let user = Arc::make_mut(st.users.entry(self.uid).or_default());
        if let Some(lease) = &self.row.lease {
            user.raise_next_lease_id(lease.lease_id + 1);
        }
        match user
            .devices
            .iter_mut()
            .find(|d| d.row.device == self.row.device)
        {
            Some(d) => {
                d.row = self.row.clone();
                d.stamp = stamp;
            }
            None => {
                // Most users have one to three devices: room for one more
                // at a time (a quarter more on a long list), not the four
                // a first `Vec` allocation makes.
                grow_for_one(&mut user.devices, 4, 1);
                user.devices.push(Device {
                    row: self.row.clone(),
                    stamp,
                });
                st.totals.devices += 1;
            }
        }
        Ok(())
    }
}

pub(crate) fn state_code(s: DeviceState) -> u8 {
    match s {
        DeviceState::Active => 0,
        DeviceState::Recovering => 1,
        DeviceState::Resetting => 2,
        DeviceState::Revoked => 3,
    }
}

pub(crate) fn state_from_code(c: u8) -> DecodeResult<DeviceState> {
    Ok(match c {
        0 => DeviceState::Active,
        1 => DeviceState::Recovering,
        2 => DeviceState::Resetting,
        3 => DeviceState::Revoked,
        _ => return Err(DecodeError("unknown device state")),
    })
}

pub(crate) fn put_device_row(w: &mut Writer, row: &DeviceRow) {
    w.u64(row.device);
    w.u64(row.generation);
    w.u64(row.acked_sync_seq);
    w.u8(state_code(row.state));
    w.u64(row.last_seen_ms);
    match &row.lease {
        None => w.u8(0),
        Some(l) => {
            w.u8(1);
            w.u64(l.lease_id);
            w.u64(l.resume_from);
            w.u64(l.hwm);
            w.u64(l.expires_at_ms);
        }
    }
}

pub(crate) fn get_device_row(r: &mut Reader<'_>) -> DecodeResult<DeviceRow> {
    let device = r.id()?;
    let generation = r.id()?;
    let acked_sync_seq = r.id()?;
    let state = state_from_code(r.u8()?)?;
    let last_seen_ms = r.u64()?;
    let lease = match r.u8()? {
        0 => None,
        1 => Some(LeaseInfo {
            lease_id: r.u64()?,
            resume_from: r.id()?,
            hwm: r.id()?,
            expires_at_ms: r.u64()?,
        }),
        _ => return Err(DecodeError("bad lease tag")),
    };
    Ok(DeviceRow {
        device,
        generation,
        acked_sync_seq,
        state,
        last_seen_ms,
        lease: lease.map(Box::new),
    })
}

/// A user's devices in a checkpoint: the lease counter, then the rows.
pub(crate) fn put_user_devices(w: &mut Writer, u: &User) {
    w.u64(u.next_lease_id());
    w.u64(u.devices.len() as u64);
    for d in &u.devices {
        put_device_row(w, &d.row);
    }
}

pub(crate) fn get_user_devices(r: &mut Reader<'_>, u: &mut User) -> DecodeResult<()> {
    u.raise_next_lease_id(r.u64()?);
    let count = r.count(34)?;
    u.devices.reserve_exact(count);
    for _ in 0..count {
        u.devices.push(Device {
            row: get_device_row(r)?,
            stamp: 0,
        });
    }
    Ok(())
}
