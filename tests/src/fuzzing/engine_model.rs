//! `engine_model`: arbitrary operation sequences against the embedded
//! engine, with storage behind a fault-injecting IO layer, checked against
//! a ledger of everything the engine acknowledged.
//!
//! The input is read 4 bytes per operation: join, leave, send (with small
//! idempotency keys, so retries happen), recall, mark-read, register,
//! sync-and-ACK, restart, an fsync failure after a countdown, compaction
//! (with no safety window, so it reclaims whatever the fences allow) and
//! checkpoint. The model keeps what was acknowledged and the rules
//! every answer must follow:
//!
//! - no operation fails with an IO error unless a fault was injected, and
//!   after an fsync failure nothing is acknowledged any more (fail-stop);
//! - a retried `(sender, client_msg_id)` returns the original ids with
//!   `duplicate`, and a new message gets the next `msg_seq` of its
//!   conversation;
//! - after every restart, every acknowledged send is served at its seq
//!   with its body (a tombstone once its recall was acknowledged), every
//!   acknowledged read cursor and device ACK is still in place, and
//!   `msg_seq`s have no gap;
//! - after every operation, the per-segment reference counts compaction
//!   decides by equal a recount of the index.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use inbox_engine::log::{FaultyIo, SyncPolicy};
use inbox_engine::*;

const CONVS: u64 = 3;
const USERS: u64 = 4;
const DEVICES: u64 = 2;
const OPS_MAX: usize = 64;

#[derive(Clone, Copy, Debug)]
enum Op {
    Join(ConvId, Uid),
    Leave(ConvId, Uid),
    Send(ConvId, Uid, ClientMsgId),
    Recall(ConvId, Uid, usize),
    MarkRead(Uid, ConvId),
    Register(Uid, DeviceId),
    SyncAck(Uid, DeviceId),
    Restart,
    FailSyncAfter(u64),
    Compact,
    Checkpoint,
}

fn decode(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .take(OPS_MAX)
        .map(|c| {
            let conv = 1 + u64::from(c[1]) % CONVS;
            let uid = 1 + u64::from(c[2]) % USERS;
            let device = 1 + u64::from(c[3]) % DEVICES;
            match c[0] % 16 {
                0 | 1 => Op::Join(conv, uid),
                2 => Op::Leave(conv, uid),
                3..=6 => Op::Send(conv, uid, ClientMsgId::from(c[3] % 8)),
                7 => Op::Recall(conv, uid, usize::from(c[3])),
                8 => Op::MarkRead(uid, conv),
                9 => Op::Register(uid, device),
                10 | 11 => Op::SyncAck(uid, device),
                12 => Op::Restart,
                13 => Op::FailSyncAfter(1 + u64::from(c[1] % 4)),
                14 => Op::Compact,
                _ => Op::Checkpoint,
            }
        })
        .collect()
}

#[derive(Clone, Debug)]
struct AckedSend {
    conv: ConvId,
    sender: Uid,
    msg_id: MsgId,
    msg_seq: MsgSeq,
    payload: Bytes,
}

#[derive(Default)]
struct Ledger {
    sends: Vec<AckedSend>,
    by_key: HashMap<(Uid, ClientMsgId), (MsgId, MsgSeq)>,
    /// Sends that failed under an injected fault: they may or may not
    /// have reached the disk.
    uncertain: HashSet<(Uid, ClientMsgId)>,
    /// Highest acknowledged `msg_seq` per conversation (sends, joins,
    /// leaves and recalls all take one).
    head: BTreeMap<ConvId, MsgSeq>,
    recalled: HashSet<MsgId>,
    reads: HashMap<(Uid, ConvId), MsgSeq>,
    acks: HashMap<(Uid, DeviceId), SyncSeq>,
    generations: HashMap<(Uid, DeviceId), Generation>,
}

impl Ledger {
    fn acknowledge_send(
        &mut self,
        conv: ConvId,
        sender: Uid,
        client_msg_id: ClientMsgId,
        reply: SendReply,
        payload: Bytes,
    ) {
        self.by_key
            .insert((sender, client_msg_id), (reply.msg_id, reply.msg_seq));
        self.sends.push(AckedSend {
            conv,
            sender,
            msg_id: reply.msg_id,
            msg_seq: reply.msg_seq,
            payload,
        });
    }

    fn took_seq(&mut self, conv: ConvId, seq: MsgSeq) {
        let head = self.head.entry(conv).or_default();
        assert!(
            seq > *head,
            "conv {conv}: acknowledged msg_seq {seq} is not above the previous {head}"
        );
        *head = seq;
    }
}

fn config(dir: &Path) -> InboxConfig {
    let mut config = InboxConfig::new(dir);
    config.segment_bytes = 16 << 10;
    // Events go as soon as every fence allows, so compaction trims, drops
    // and rewrites segments within a short input.
    config.safety_window = std::time::Duration::ZERO;
    config.sync = SyncPolicy::Always;
    config.token_key = [7; 32];
    config
}

fn open(dir: &Path) -> (Inbox, Arc<FaultyIo>) {
    let io = Arc::new(FaultyIo::new());
    let inbox = Inbox::open_with_io(config(dir), io.clone())
        .unwrap_or_else(|e| panic!("reopening after acknowledged writes failed: {e}"));
    (inbox, io)
}

/// An error a healthy engine may answer with: the request was refused by
/// the rules, not by storage.
fn refused_by_rules(error: &Error) -> bool {
    !matches!(
        error,
        Error::Log(_) | Error::Internal(_) | Error::NoSpace(_)
    )
}

/// Checks a result: with no fault armed, only rule refusals are allowed.
fn allowed<T>(result: &Result<T>, faulted: bool, what: &str) {
    if let Err(error) = result {
        assert!(
            faulted || refused_by_rules(error),
            "{what} failed with a storage error while no fault was injected: {error}"
        );
    }
}

fn sync_and_ack(inbox: &Inbox, ledger: &mut Ledger, uid: Uid, device: DeviceId, faulted: bool) {
    let key = (uid, device);
    let Some(&generation) = ledger.generations.get(&key) else {
        return;
    };
    let acked = ledger.acks.get(&key).copied().unwrap_or(0);
    let mut request = SyncRequest {
        uid,
        device,
        generation: Some(generation),
        local_applied_seq: acked,
        limit: 7,
        batch_token: None,
    };
    loop {
        let page = inbox.sync(request.clone()).wait();
        allowed(&page, faulted, "sync");
        let Ok(page) = page else {
            return;
        };
        ledger.generations.insert(key, page.generation);
        if page.has_more {
            request.generation = Some(page.generation);
            request.local_applied_seq = page.next_cursor;
            request.batch_token = Some(page.batch_token);
            continue;
        }
        if page.next_cursor > page.acked_sync_seq {
            let reply = inbox
                .ack(AckRequest {
                    uid,
                    device,
                    generation: page.generation,
                    seq: page.next_cursor,
                    batch_token: page.batch_token.clone(),
                })
                .wait();
            allowed(&reply, faulted, "ack");
            if let Ok(reply) = reply {
                assert!(
                    reply.acked_sync_seq >= acked,
                    "ack moved device {key:?} back from {acked} to {}",
                    reply.acked_sync_seq
                );
                ledger.acks.insert(key, reply.acked_sync_seq);
            }
        }
        if let Some(lease) = page.lease {
            let finished = inbox
                .finish_lease(uid, device, lease.lease_id, page.generation)
                .wait();
            allowed(&finished, faulted, "finish_lease");
        }
        return;
    }
}

/// Everything acknowledged is served after a restart.
fn check_durable(inbox: &Inbox, ledger: &Ledger) {
    for send in &ledger.sends {
        let page = inbox
            .history(send.sender, send.conv, Some(send.msg_seq + 1), 1)
            .unwrap_or_else(|e| panic!("history for acknowledged {send:?}: {e}"));
        let Some(message) = page.messages.first() else {
            panic!("acknowledged send {send:?} is missing");
        };
        assert_eq!(
            (message.msg_seq, message.msg_id),
            (send.msg_seq, send.msg_id),
            "acknowledged send is not at its seq"
        );
        if ledger.recalled.contains(&send.msg_id) {
            assert!(
                message.tombstone && message.payload.is_empty(),
                "recalled {send:?} is served with a body"
            );
        } else if !message.tombstone && !send.payload.is_empty() {
            assert_eq!(message.payload, send.payload, "body of {send:?} changed");
        }
    }
    for (&(uid, conv), &read_seq) in &ledger.reads {
        let list = inbox.conv_list(uid, 100, None).expect("conv_list");
        let row = list.convs.iter().find(|c| c.conv == conv);
        assert!(
            row.is_some_and(|c| c.read_seq >= read_seq),
            "read cursor ({uid}, {conv}) was acknowledged at {read_seq}, now {row:?}"
        );
    }
    for (&(uid, device), &acked) in &ledger.acks {
        let devices = inbox.devices(uid).expect("devices");
        let row = devices.iter().find(|d| d.device == device);
        // A device evicted by the cap keeps no cursor to compare.
        if let Some(row) = row.filter(|d| d.state != DeviceState::Revoked) {
            assert!(
                row.acked_sync_seq >= acked,
                "device ({uid}, {device}) ACK was acknowledged at {acked}, now {}",
                row.acked_sync_seq
            );
        }
    }
}

/// Runs one fuzz case; panics on any disagreement.
pub fn check(data: &[u8]) {
    let ops = decode(data);
    let dir = super::scratch_dir();
    let (mut inbox, mut io) = open(dir.path());
    let mut ledger = Ledger::default();
    // Set once an injected fsync failure may have fired: from then on
    // storage errors are expected, and the engine must be fail-stop.
    let mut faulted = false;
    let mut poisoned = false;

    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Join(conv, uid) | Op::Leave(conv, uid) => {
                let reply = if matches!(op, Op::Join(..)) {
                    inbox.join(conv, uid).wait()
                } else {
                    inbox.leave(conv, uid).wait()
                };
                allowed(&reply, faulted, "join/leave");
                if let Ok(reply) = reply {
                    // Joining as a member answers with the open period's
                    // join seq (idempotent); only a new record takes a seq.
                    let head = ledger.head.get(&conv).copied().unwrap_or(0);
                    if reply.msg_seq > head {
                        assert!(!poisoned, "join/leave acknowledged after an fsync failure");
                        ledger.took_seq(conv, reply.msg_seq);
                    }
                }
            }
            Op::Send(conv, sender, client_msg_id) => {
                // One body per key, so that a retry is the same request (a
                // different body under a used key is CONFLICT).
                let payload = Bytes::from(
                    format!("m-{sender}-{client_msg_id}").repeat(1 + (client_msg_id % 5) as usize),
                );
                let reply = inbox
                    .send(SendRequest {
                        conv,
                        sender,
                        client_msg_id,
                        msg_type: 1,
                        payload: payload.clone(),
                    })
                    .wait();
                allowed(&reply, faulted, "send");
                if reply.is_err() && faulted {
                    ledger.uncertain.insert((sender, client_msg_id));
                }
                if let Ok(reply) = reply {
                    let earlier = ledger.by_key.get(&(sender, client_msg_id)).copied();
                    match earlier {
                        Some(ids) => {
                            assert!(reply.duplicate, "a retried send made a second message");
                            assert_eq!((reply.msg_id, reply.msg_seq), ids, "retry changed ids");
                        }
                        None if reply.duplicate => {
                            // Only a first attempt that failed under a
                            // fault may have reached the disk unacknowledged;
                            // this reply acknowledges it now.
                            assert!(
                                faulted || ledger.uncertain.contains(&(sender, client_msg_id)),
                                "duplicate reported for a key never sent"
                            );
                            // Its body is unknown to the ledger: empty
                            // means "any".
                            ledger.acknowledge_send(
                                conv,
                                sender,
                                client_msg_id,
                                reply,
                                Bytes::new(),
                            );
                        }
                        None => {
                            assert!(!poisoned, "send acknowledged after an fsync failure");
                            ledger.took_seq(conv, reply.msg_seq);
                            ledger.acknowledge_send(conv, sender, client_msg_id, reply, payload);
                        }
                    }
                }
            }
            Op::Recall(conv, sender, pick) => {
                let own: Vec<MsgId> = ledger
                    .sends
                    .iter()
                    .filter(|s| s.conv == conv && s.sender == sender)
                    .map(|s| s.msg_id)
                    .collect();
                if own.is_empty() {
                    continue;
                }
                let target = own[pick % own.len()];
                let reply = inbox
                    .recall(RecallRequest {
                        conv,
                        sender,
                        client_msg_id: 1_000_000 + i as u128,
                        target,
                    })
                    .wait();
                allowed(&reply, faulted, "recall");
                if let Ok(reply) = reply {
                    assert!(!poisoned, "recall acknowledged after an fsync failure");
                    ledger.took_seq(conv, reply.msg_seq);
                    ledger.recalled.insert(target);
                }
            }
            Op::MarkRead(uid, conv) => {
                let head = ledger.head.get(&conv).copied().unwrap_or(0);
                let reply = inbox.mark_read(uid, conv, head).wait();
                allowed(&reply, faulted, "mark_read");
                if let Ok(reply) = reply {
                    let before = ledger.reads.get(&(uid, conv)).copied().unwrap_or(0);
                    assert!(reply.read_seq >= before, "read cursor moved back");
                    ledger.reads.insert((uid, conv), reply.read_seq);
                }
            }
            Op::Register(uid, device) => {
                let reply = inbox.register_device(uid, device).wait();
                allowed(&reply, faulted, "register");
                if let Ok(reply) = reply {
                    ledger
                        .generations
                        .insert((uid, device), reply.device.generation);
                    if let Some(evicted) = reply.evicted {
                        ledger.generations.remove(&(uid, evicted));
                    }
                }
            }
            Op::SyncAck(uid, device) => sync_and_ack(&inbox, &mut ledger, uid, device, faulted),
            Op::FailSyncAfter(n) => {
                io.fail_nth_sync(n);
                faulted = true;
            }
            Op::Compact => {
                let report = inbox.compact();
                allowed(&report, faulted, "compact");
            }
            Op::Checkpoint => {
                let done = inbox.checkpoint();
                allowed(&done, faulted, "checkpoint");
            }
            Op::Restart => {
                drop(inbox);
                (inbox, io) = open(dir.path());
                faulted = false;
                poisoned = false;
                check_durable(&inbox, &ledger);
            }
        }
        // Once the armed sync has fired, the engine must stay stopped.
        if faulted && inbox.join(CONVS + 1, 1).wait().is_err() {
            poisoned = true;
        }
        // The per-segment counts compaction decides by match the index.
        if let Err(e) = inbox.check_segment_refs() {
            panic!("segment reference counts drifted: {e}");
        }
    }
    drop(inbox);
    let (inbox, _io) = open(dir.path());
    check_durable(&inbox, &ledger);
}
