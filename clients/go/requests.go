package inboxd

// Every request of PROTOCOL.md section 4 as a method, written once and
// shared by Client (one connection) and Pool (a group's members) through
// the roundTripper each of them is.

import "context"

// roundTripper sends one request and returns a decoder of its reply
// body, set to the protocol version of the connection that answered (a
// Pool's members may speak different ones during an upgrade), or the
// error. Encoding may run more than once (a Pool's retries): it must
// write the same bytes each time.
type roundTripper interface {
	roundTrip(ctx context.Context, op byte, encode func(*encoder)) (decoder, error)
}

// requests holds the request methods Client and Pool both have.
type requests struct{ rt roundTripper }

func do[T any](ctx context.Context, r requests, op byte, encode func(*encoder), decode func(*decoder) T) (T, error) {
	var zero T
	d, err := r.rt.roundTrip(ctx, op, encode)
	if err != nil {
		return zero, err
	}
	v := decode(&d)
	if err := d.end(); err != nil {
		return zero, &ProtocolError{Op: op, Reason: err.Error()}
	}
	return v, nil
}

func empty(*decoder) struct{} { return struct{}{} }

func doEmpty(ctx context.Context, r requests, op byte, encode func(*encoder)) error {
	_, err := do(ctx, r, op, encode, empty)
	return err
}

func decodeU64(d *decoder) uint64 { return d.u64() }

// Ping checks the connection (and keeps an idle one open).
func (r requests) Ping(ctx context.Context) error { return doEmpty(ctx, r, opPing, nil) }

// Join makes uid a member of conv.
func (r requests) Join(ctx context.Context, conv, uid uint64) (Membership, error) {
	return do(ctx, r, opJoin, func(e *encoder) { e.u64(conv); e.u64(uid) }, decodeMembership)
}

// Leave ends uid's membership of conv.
func (r requests) Leave(ctx context.Context, conv, uid uint64) (Membership, error) {
	return do(ctx, r, opLeave, func(e *encoder) { e.u64(conv); e.u64(uid) }, decodeMembership)
}

// Send writes a message; the reply means it and its fan-out are durable.
func (r requests) Send(ctx context.Context, req SendRequest) (SendReply, error) {
	req.ClientMsgID = req.ClientMsgID.orNew()
	return do(ctx, r, opSend, func(e *encoder) {
		e.u64(req.Conv)
		e.u64(req.Sender)
		e.u128(req.ClientMsgID)
		e.u16(req.MsgType)
		e.bytes(req.Payload)
	}, decodeSendReply)
}

// Recall turns a message of the sender's into a tombstone.
func (r requests) Recall(ctx context.Context, req RecallRequest) (SendReply, error) {
	req.ClientMsgID = req.ClientMsgID.orNew()
	return do(ctx, r, opRecall, func(e *encoder) {
		e.u64(req.Conv)
		e.u64(req.Sender)
		e.u128(req.ClientMsgID)
		e.u64(req.Target)
	}, decodeSendReply)
}

// Edit gives a message of the sender's a new body.
func (r requests) Edit(ctx context.Context, req EditRequest) (SendReply, error) {
	req.ClientMsgID = req.ClientMsgID.orNew()
	return do(ctx, r, opEdit, func(e *encoder) {
		e.u64(req.Conv)
		e.u64(req.Sender)
		e.u128(req.ClientMsgID)
		e.u64(req.Target)
		e.bytes(req.Payload)
	}, decodeSendReply)
}

// Pull reads up to perConvLimit messages after each cursor, oldest first
// (0 is the server's default).
func (r requests) Pull(ctx context.Context, uid uint64, perConvLimit uint32, cursors []PullCursor) ([]ConvPull, error) {
	return do(ctx, r, opPull, func(e *encoder) {
		e.u64(uid)
		e.u32(perConvLimit)
		e.u32(uint32(len(cursors)))
		for _, c := range cursors {
			e.u64(c.Conv)
			e.u64(c.AfterSeq)
		}
	}, func(d *decoder) []ConvPull {
		n := d.count(8 + 4 + 1 + 8)
		out := make([]ConvPull, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			out = append(out, ConvPull{Conv: d.u64(), Messages: decodeMessages(d), HasMore: d.boolean(), MaxSeq: d.u64()})
		}
		return out
	})
}

// History pages backwards through a conversation, newest first.
func (r requests) History(ctx context.Context, req HistoryRequest) (HistoryPage, error) {
	return do(ctx, r, opHistory, func(e *encoder) {
		e.u64(req.UID)
		e.u64(req.Conv)
		e.optU64(req.BeforeSeq, req.BeforeSeq != 0)
		e.u32(req.Limit)
	}, func(d *decoder) HistoryPage {
		return HistoryPage{Messages: decodeMessages(d), HasMore: d.boolean()}
	})
}

// MarkRead moves uid's read position in conv.
func (r requests) MarkRead(ctx context.Context, uid, conv, readToSeq uint64) (ReadState, error) {
	return do(ctx, r, opMarkRead, func(e *encoder) { e.u64(uid); e.u64(conv); e.u64(readToSeq) },
		func(d *decoder) ReadState { return ReadState{ReadSeq: d.u64(), Unread: d.u32()} })
}

// SetConvFlags sets uid's muted and pinned flags of conv.
func (r requests) SetConvFlags(ctx context.Context, uid, conv uint64, muted, pinned bool) error {
	return doEmpty(ctx, r, opSetConvFlags, func(e *encoder) {
		e.u64(uid)
		e.u64(conv)
		e.boolean(muted)
		e.boolean(pinned)
	})
}

// ConvList is a page of uid's conversations; cursor nil starts at the
// top, else it is the previous page's NextCursor. Limit 0 is the
// server's default.
func (r requests) ConvList(ctx context.Context, uid uint64, limit uint32, cursor []byte) (ConvListPage, error) {
	return do(ctx, r, opConvList, func(e *encoder) {
		e.u64(uid)
		e.u32(limit)
		e.boolean(cursor != nil)
		if cursor != nil {
			e.bytes(cursor)
		}
	}, func(d *decoder) ConvListPage {
		p := ConvListPage{Convs: decodeConvSummaries(d)}
		if d.present() {
			p.NextCursor = d.bytes()
		}
		return p
	})
}

// Dirty lists uid's dirty large groups.
func (r requests) Dirty(ctx context.Context, uid uint64) ([]DirtyMarker, error) {
	return do(ctx, r, opDirty, func(e *encoder) { e.u64(uid) }, decodeDirtyMarkers)
}

// ClearDirty clears uid's marker of a large group at the version Dirty
// showed, once the group is pulled; it returns the cleared position.
// ErrMarkerMoved (Detail: the current version) says to pull again.
func (r requests) ClearDirty(ctx context.Context, uid, conv, version uint64) (uint64, error) {
	return do(ctx, r, opClearDirty, func(e *encoder) { e.u64(uid); e.u64(conv); e.u64(version) }, decodeU64)
}

// ConvMode says whether conv is a large group; with member set, it also
// gives that member's marker.
func (r requests) ConvMode(ctx context.Context, conv uint64, member *uint64) (ConvMode, error) {
	return do(ctx, r, opConvMode, func(e *encoder) {
		e.u64(conv)
		if member != nil {
			e.optU64(*member, true)
		} else {
			e.optU64(0, false)
		}
	}, func(d *decoder) ConvMode {
		m := ConvMode{Conv: d.u64(), Large: d.boolean(), SwitchSeq: d.optU64(), Head: d.u64(), Members: d.u64()}
		if d.present() {
			m.Marker = &MemberMarker{UID: d.u64(), TargetMsgSeq: d.u64(), Version: d.u64(), ClearedSeq: d.u64(), Dirty: d.boolean()}
		}
		return m
	})
}

// RegisterDevice registers (or re-registers) a device of uid.
func (r requests) RegisterDevice(ctx context.Context, uid, device uint64) (Registration, error) {
	return do(ctx, r, opRegisterDevice, func(e *encoder) { e.u64(uid); e.u64(device) },
		func(d *decoder) Registration { return Registration{Device: decodeDeviceInfo(d), Evicted: d.optU64()} })
}

// RevokeDevice revokes a device of uid.
func (r requests) RevokeDevice(ctx context.Context, uid, device uint64) (DeviceInfo, error) {
	return do(ctx, r, opRevokeDevice, func(e *encoder) { e.u64(uid); e.u64(device) }, decodeDeviceInfo)
}

// Devices lists uid's devices.
func (r requests) Devices(ctx context.Context, uid uint64) ([]DeviceInfo, error) {
	return do(ctx, r, opDevices, func(e *encoder) { e.u64(uid) }, func(d *decoder) []DeviceInfo {
		n := d.count(33)
		out := make([]DeviceInfo, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			out = append(out, decodeDeviceInfo(d))
		}
		return out
	})
}

// Sync reads one page of a device's events. CatchUp runs the whole loop.
func (r requests) Sync(ctx context.Context, req SyncRequest) (SyncPage, error) {
	return do(ctx, r, opSync, req.encode, decodeSyncPage)
}

// Ack acknowledges a device's events through req.Seq and returns the
// device's acked_sync_seq.
func (r requests) Ack(ctx context.Context, req AckRequest) (uint64, error) {
	return do(ctx, r, opAck, req.encode, decodeU64)
}

func (r *AckRequest) encode(e *encoder) {
	e.u64(r.UID)
	e.u64(r.Device)
	e.u64(r.Generation)
	e.u64(r.Seq)
	e.bytes(r.BatchToken)
}

// FinishLease ends a recovery lease once its pages are applied and ACKed.
func (r requests) FinishLease(ctx context.Context, uid, device, leaseID, generation uint64) (DeviceInfo, error) {
	return do(ctx, r, opFinishLease, func(e *encoder) {
		e.u64(uid)
		e.u64(device)
		e.u64(leaseID)
		e.u64(generation)
	}, decodeDeviceInfo)
}

// BeginSnapshot starts a snapshot for a device that must reset; it
// returns once the snapshot is READY. InstallSnapshot runs the whole
// install.
func (r requests) BeginSnapshot(ctx context.Context, uid, device uint64) (SnapshotInfo, error) {
	return do(ctx, r, opBeginSnapshot, func(e *encoder) { e.u64(uid); e.u64(device) }, decodeSnapshotInfo)
}

// SnapshotInfo asks where a snapshot stands.
func (r requests) SnapshotInfo(ctx context.Context, uid, snapshotID uint64) (SnapshotInfo, error) {
	return do(ctx, r, opSnapshotInfo, func(e *encoder) { e.u64(uid); e.u64(snapshotID) }, decodeSnapshotInfo)
}

// SnapshotPage reads page (0 .. Pages-1) of a snapshot.
func (r requests) SnapshotPage(ctx context.Context, uid, snapshotID uint64, page uint32) (SnapshotPage, error) {
	return do(ctx, r, opSnapshotPage, func(e *encoder) { e.u64(uid); e.u64(snapshotID); e.u32(page) },
		decodeSnapshotPage)
}

// AckSnapshot says the device installed the snapshot; it is ACTIVE again
// from the snapshot's base_sync_seq.
func (r requests) AckSnapshot(ctx context.Context, uid, device, snapshotID, generation uint64) (DeviceInfo, error) {
	return do(ctx, r, opAckSnapshot, func(e *encoder) {
		e.u64(uid)
		e.u64(device)
		e.u64(snapshotID)
		e.u64(generation)
	}, decodeDeviceInfo)
}

// Subscribe asks for HINT pushes of uids on this connection (Hints).
// Subscriptions belong to a connection, so they are Client's only.
func (cl *Client) Subscribe(ctx context.Context, uids ...uint64) error {
	return doEmpty(ctx, cl.requests, opSubscribe, func(e *encoder) { e.u64s(uids) })
}

// Unsubscribe stops the pushes of uids.
func (cl *Client) Unsubscribe(ctx context.Context, uids ...uint64) error {
	return doEmpty(ctx, cl.requests, opUnsubscribe, func(e *encoder) { e.u64s(uids) })
}

// SubscribeDirty asks for HINT and DIRTY_HINT pushes of uids (Hints,
// DirtyHints).
func (cl *Client) SubscribeDirty(ctx context.Context, uids ...uint64) error {
	return doEmpty(ctx, cl.requests, opSubscribeDirty, func(e *encoder) { e.u64s(uids) })
}

// Stats is the daemon's counters (admin token).
func (r requests) Stats(ctx context.Context) (Stats, error) {
	return do(ctx, r, opStats, nil, func(d *decoder) Stats {
		return Stats{d.u64(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(),
			decodeCompactionReport(d)}
	})
}

// Explain says what holds uid's events back from compaction (admin token).
func (r requests) Explain(ctx context.Context, uid uint64) (UserExplain, error) {
	return do(ctx, r, opExplain, func(e *encoder) { e.u64(uid) }, decodeUserExplain)
}

// ExplainSegment says what a log segment holds (admin token).
func (r requests) ExplainSegment(ctx context.Context, stream string, segment uint32) (SegmentExplain, error) {
	return do(ctx, r, opExplainSegment, func(e *encoder) { e.str(stream); e.u32(segment) },
		func(d *decoder) SegmentExplain {
			x := SegmentExplain{Stream: d.str(), Segment: d.u32(), Bytes: d.u64(), LiveBytes: d.u64(), LiveRecords: d.u64()}
			n := d.count(4)
			for i := 0; i < n && d.err == nil; i++ {
				x.HeldBy = append(x.HeldBy, d.str())
			}
			return x
		})
}

// Compact runs a compaction (admin token).
func (r requests) Compact(ctx context.Context) (CompactionReport, error) {
	return do(ctx, r, opCompact, nil, decodeCompactionReport)
}

// Checkpoint writes a checkpoint (admin token).
func (r requests) Checkpoint(ctx context.Context) error { return doEmpty(ctx, r, opCheckpoint, nil) }

// Memory reports the daemon's memory by structure (admin token).
func (r requests) Memory(ctx context.Context) (MemoryReport, error) {
	return do(ctx, r, opMemory, nil, decodeMemoryReport)
}

// ClusterStatus is this node's view of its group (admin token).
func (r requests) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	return do(ctx, r, opClusterStatus, nil, decodeClusterStatus)
}

// ClusterAddNode adds a node to the group and returns the leader's status
// once the change is committed (admin token).
func (r requests) ClusterAddNode(ctx context.Context, nodeID uint64, raftAddr, clientAddr string) (ClusterStatus, error) {
	return do(ctx, r, opClusterAddNode, func(e *encoder) { e.u64(nodeID); e.str(raftAddr); e.str(clientAddr) },
		decodeClusterStatus)
}

// ClusterRemoveNode takes a node out of the group (admin token).
func (r requests) ClusterRemoveNode(ctx context.Context, nodeID uint64) (ClusterStatus, error) {
	return do(ctx, r, opClusterRemoveNode, func(e *encoder) { e.u64(nodeID) }, decodeClusterStatus)
}
