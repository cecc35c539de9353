//! The engine's commands: one variant per subsystem, each handed to the
//! subsystem that owns it. This is the only place that ties the generic
//! sequencer (`sequencer/`, which runs any [`Exec`]) to the subsystems, and
//! it holds what a subsystem's commands need besides the state (the
//! snapshot builder's queue) as the sequencer's opaque [`Services`].
//!
//! A new subsystem is one variant here, its arm in `exec` and `fail`, and
//! its `From`; a new command of an existing subsystem does not touch this
//! file.

use std::sync::mpsc;

use super::config::InboxConfig;
use super::messaging::record::MESSAGE_OVERHEAD_MAX;
use super::round::{Env, Exec, Fail, Sink};
use super::state::State;
use super::{compaction, devices, fanout, messaging, snapshots};

/// A command of one subsystem.
pub(crate) enum Command {
    Messaging(messaging::Command),
    Devices(devices::Command),
    Snapshots(snapshots::Command),
    Compaction(compaction::Command),
    Fanout(fanout::Command),
}

/// What the engine's commands need besides the state and the [`Env`].
pub(crate) struct Services {
    /// The snapshot builder's queue, cloned into each begin step's reply.
    /// Dropped with the sequencer, which (with the completion stage's
    /// clones) lets the builder stop.
    pub snapshot_jobs: mpsc::Sender<snapshots::build::Job>,
}

impl Exec for Command {
    type Services = Services;

    fn exec(self, st: &mut State, sink: &mut dyn Sink, env: &Env<'_>, services: &Services) {
        match self {
            Command::Messaging(c) => messaging::exec(c, st, env, sink),
            Command::Devices(c) => devices::exec(c, st, env, sink),
            Command::Snapshots(c) => snapshots::exec(c, st, env, sink, &services.snapshot_jobs),
            Command::Compaction(c) => compaction::exec(c, st, env, sink),
            Command::Fanout(c) => fanout::exec(c, st, sink),
        }
    }

    /// A client's command adds at most one message's records (its payload
    /// and their overhead) plus a few small ones. Compaction's commands
    /// have no small bound, and they are what frees a full disk, so they
    /// are not refused ahead (see the sequencer's failure rules).
    fn record_bytes_max(&self, config: &InboxConfig) -> Option<u64> {
        match self {
            Command::Messaging(_) | Command::Devices(_) | Command::Snapshots(_) => {
                Some(u64::from(config.payload_bytes_max) + 4 * MESSAGE_OVERHEAD_MAX)
            }
            Command::Compaction(_) => None,
            Command::Fanout(c) => Some(fanout::record_bytes_max(c)),
        }
    }

    fn fail(self, f: &Fail) {
        match self {
            Command::Messaging(c) => messaging::fail(c, f),
            Command::Devices(c) => devices::fail(c, f),
            Command::Snapshots(c) => snapshots::fail(c, f),
            Command::Compaction(c) => compaction::fail(c, f),
            Command::Fanout(c) => fanout::fail(c, f),
        }
    }
}

macro_rules! command_from {
    ($($variant:ident($ty:ty)),+) => {
        $(impl From<$ty> for Command {
            fn from(c: $ty) -> Command {
                Command::$variant(c)
            }
        })+
    };
}

command_from!(
    Messaging(messaging::Command),
    Devices(devices::Command),
    Snapshots(snapshots::Command),
    Compaction(compaction::Command),
    Fanout(fanout::Command)
);
