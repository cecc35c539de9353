package inboxd

// Requests' arguments and replies, with their layouts (PROTOCOL.md
// section 4). Field names follow the protocol's; a field the protocol
// marks option<T> is a pointer here when zero is a value it can hold.

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"
)

// Request opcodes (PROTOCOL.md section 4). A reply is op|0x80.
const (
	opHello             byte = 0x01
	opPing              byte = 0x02
	opJoin              byte = 0x10
	opLeave             byte = 0x11
	opSend              byte = 0x12
	opRecall            byte = 0x13
	opEdit              byte = 0x14
	opRegisterDevice    byte = 0x20
	opRevokeDevice      byte = 0x21
	opDevices           byte = 0x22
	opSync              byte = 0x23
	opAck               byte = 0x24
	opFinishLease       byte = 0x25
	opPull              byte = 0x30
	opHistory           byte = 0x31
	opMarkRead          byte = 0x32
	opSetConvFlags      byte = 0x33
	opConvList          byte = 0x34
	opDirty             byte = 0x35
	opClearDirty        byte = 0x36
	opConvMode          byte = 0x37
	opBeginSnapshot     byte = 0x40
	opSnapshotInfo      byte = 0x41
	opSnapshotPage      byte = 0x42
	opAckSnapshot       byte = 0x43
	opSubscribe         byte = 0x50
	opUnsubscribe       byte = 0x51
	opSubscribeDirty    byte = 0x52
	opStats             byte = 0x60
	opExplain           byte = 0x61
	opExplainSegment    byte = 0x62
	opCompact           byte = 0x63
	opCheckpoint        byte = 0x64
	opMemory            byte = 0x65
	opClusterStatus     byte = 0x66
	opClusterAddNode    byte = 0x67
	opClusterRemoveNode byte = 0x68

	opHint      byte = 0xf0
	opDirtyHint byte = 0xf1
	opError     byte = 0xff
)

// ProtocolVersion is the newest version this client speaks, the one Dial
// asks for first.
const ProtocolVersion = 3

// protocolVersionMin is the oldest version this client speaks: version 1
// lays out EXPLAIN's fences without a length, which it does not read.
const protocolVersionMin = 2

// ServerInfo is HELLO_OK: the version the connection speaks and every
// limit the server holds its clients to. The limits never change while
// a server runs. A version 2 connection leaves the fields from
// MaxConnections on zero: that server does not announce them.
type ServerInfo struct {
	Version            uint16
	ServerName         string
	FrameBytesMax      uint32
	InFlightMax        uint32
	ReplyFrameBytesMax uint32
	PayloadBytesMax    uint32
	SummaryBytesMax    uint32
	SyncPageDefault    uint32
	SyncPageMax        uint32
	PullPerConvDefault uint32
	PullPerConvMax     uint32
	HistoryLimitMax    uint32
	ConvListLimitMax   uint32
	DevicesPerUserMax  uint32
	RatePerS           uint32
	RateBurst          uint32
	IdleTimeout        time.Duration
	BatchTokenTTL      time.Duration
	RecoveryLeaseTTL   time.Duration
	SnapshotTTL        time.Duration
	// MaxConnections is how many connections the server holds at once;
	// one more is refused UNAVAILABLE on accept.
	MaxConnections uint32
	// SubscribeUIDsMax is how many uids one connection may be subscribed
	// to; past it SUBSCRIBE is TOO_LARGE (detail: this count).
	SubscribeUIDsMax uint32
	// SubscriptionsMax is the subscriptions of all connections together;
	// past it SUBSCRIBE is RATE_LIMITED.
	SubscriptionsMax uint64
	// LargeGroupMembers is the member count above which a conversation
	// becomes a large group (0: never).
	LargeGroupMembers uint32
	// IdempotencyTTL is how long a (sender, ClientMsgID) names one write:
	// a retry later than this is a new message.
	IdempotencyTTL time.Duration
}

func decodeServerInfo(d *decoder) ServerInfo {
	ms := func() time.Duration { return time.Duration(d.u64()) * time.Millisecond }
	s := ServerInfo{Version: d.u16(), ServerName: d.str(), FrameBytesMax: d.u32(), InFlightMax: d.u32()}
	if s.Version < 2 {
		return s
	}
	s.ReplyFrameBytesMax, s.PayloadBytesMax, s.SummaryBytesMax = d.u32(), d.u32(), d.u32()
	s.SyncPageDefault, s.SyncPageMax = d.u32(), d.u32()
	s.PullPerConvDefault, s.PullPerConvMax = d.u32(), d.u32()
	s.HistoryLimitMax, s.ConvListLimitMax = d.u32(), d.u32()
	s.DevicesPerUserMax, s.RatePerS, s.RateBurst = d.u32(), d.u32(), d.u32()
	s.IdleTimeout, s.BatchTokenTTL, s.RecoveryLeaseTTL, s.SnapshotTTL = ms(), ms(), ms(), ms()
	if s.Version < 3 {
		return s
	}
	s.MaxConnections, s.SubscribeUIDsMax, s.SubscriptionsMax = d.u32(), d.u32(), d.u64()
	s.LargeGroupMembers, s.IdempotencyTTL = d.u32(), ms()
	return s
}

// ClientMsgID is a write's idempotency key, a u128 on the wire: with the
// sender, it names one SEND, RECALL or EDIT for days, so that a retry is
// answered with the original ids instead of writing twice.
type ClientMsgID struct{ Hi, Lo uint64 }

// NewClientMsgID is a random key.
func NewClientMsgID() ClientMsgID {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("inboxd: no randomness for an idempotency key: %v", err))
	}
	return ClientMsgID{Hi: binary.LittleEndian.Uint64(b[8:]), Lo: binary.LittleEndian.Uint64(b[:8])}
}

// IsZero says whether the key is unset.
func (id ClientMsgID) IsZero() bool { return id == ClientMsgID{} }

// orNew is id, or a fresh key when it is unset.
func (id ClientMsgID) orNew() ClientMsgID {
	if id.IsZero() {
		return NewClientMsgID()
	}
	return id
}

// Membership is the reply to JOIN and LEAVE: the entry written and the
// membership period it opened or closed.
type Membership struct {
	MsgSeq   uint64
	PeriodID uint32
}

func decodeMembership(d *decoder) Membership { return Membership{MsgSeq: d.u64(), PeriodID: d.u32()} }

// SendRequest is a SEND. A zero ClientMsgID is replaced by a random key
// before the first attempt, and every retry the client makes reuses it;
// a caller that retries on its own sets its own key.
type SendRequest struct {
	Conv        uint64
	Sender      uint64
	ClientMsgID ClientMsgID
	MsgType     uint16
	Payload     []byte
}

// RecallRequest is a RECALL of the message Target (a msg_id).
type RecallRequest struct {
	Conv        uint64
	Sender      uint64
	ClientMsgID ClientMsgID
	Target      uint64
}

// EditRequest is an EDIT: Payload is Target's new body.
type EditRequest struct {
	Conv        uint64
	Sender      uint64
	ClientMsgID ClientMsgID
	Target      uint64
	Payload     []byte
}

// SendReply is the reply to SEND, RECALL and EDIT. Duplicate says the key
// named an earlier request, whose ids these are; nothing was written.
type SendReply struct {
	MsgID     uint64
	MsgSeq    uint64
	Duplicate bool
}

func decodeSendReply(d *decoder) SendReply {
	return SendReply{MsgID: d.u64(), MsgSeq: d.u64(), Duplicate: d.boolean()}
}

// MessageKind is a Message's kind.
type MessageKind uint8

const (
	KindNormal MessageKind = 1
	KindJoin   MessageKind = 2
	KindLeave  MessageKind = 3
	KindRecall MessageKind = 4
	KindEdit   MessageKind = 5
)

// Message is one entry of a conversation's log. Target is the recalled
// or edited msg_id (0 for other kinds). A tombstone (recalled or edited)
// has an empty payload.
type Message struct {
	Conv      uint64
	MsgSeq    uint64
	MsgID     uint64
	Sender    uint64
	Kind      MessageKind
	MsgType   uint16
	Target    uint64
	SentAtMS  uint64
	Tombstone bool
	Payload   []byte
}

// messageBytesMin is the shortest encoded Message.
const messageBytesMin = 8*4 + 1 + 2 + 1 + 8 + 1 + 4

func decodeMessage(d *decoder) Message {
	m := Message{Conv: d.u64(), MsgSeq: d.u64(), MsgID: d.u64(), Sender: d.u64()}
	m.Kind = MessageKind(d.u8())
	if m.Kind < KindNormal || m.Kind > KindEdit {
		d.fail(fmt.Errorf("message kind %d", m.Kind))
	}
	m.MsgType = d.u16()
	if t := d.optU64(); t != nil {
		m.Target = *t
	}
	m.SentAtMS, m.Tombstone, m.Payload = d.u64(), d.boolean(), d.bytes()
	return m
}

func decodeMessages(d *decoder) []Message {
	n := d.count(messageBytesMin)
	out := make([]Message, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, decodeMessage(d))
	}
	return out
}

// PullCursor asks PULL for a conversation's messages after AfterSeq.
type PullCursor struct {
	Conv     uint64
	AfterSeq uint64
}

// ConvPull is one conversation of a PULL reply. MaxSeq is the head of the
// conversation inside the user's membership periods.
type ConvPull struct {
	Conv     uint64
	Messages []Message
	HasMore  bool
	MaxSeq   uint64
}

// HistoryRequest pages backwards through a conversation from BeforeSeq
// (exclusive; 0 means from the newest). Limit 0 is the server's default.
type HistoryRequest struct {
	UID       uint64
	Conv      uint64
	BeforeSeq uint64
	Limit     uint32
}

// HistoryPage is newest first.
type HistoryPage struct {
	Messages []Message
	HasMore  bool
}

// ReadState is MARK_READ's reply.
type ReadState struct {
	ReadSeq uint64
	Unread  uint32
}

// ConvSummary is one conversation of a user's list.
type ConvSummary struct {
	Conv           uint64
	LastMsgSeq     uint64
	LastMsgID      uint64
	LastSender     uint64
	LastSummary    []byte
	Unread         uint32
	ReadSeq        uint64
	LastActivityMS uint64
	Muted          bool
	Pinned         bool
}

const convSummaryBytesMin = 8*4 + 4 + 4 + 8 + 8 + 2

func decodeConvSummaries(d *decoder) []ConvSummary {
	n := d.count(convSummaryBytesMin)
	out := make([]ConvSummary, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, ConvSummary{
			Conv: d.u64(), LastMsgSeq: d.u64(), LastMsgID: d.u64(), LastSender: d.u64(),
			LastSummary: d.bytes(), Unread: d.u32(), ReadSeq: d.u64(), LastActivityMS: d.u64(),
			Muted: d.boolean(), Pinned: d.boolean(),
		})
	}
	return out
}

// ConvListPage is CONV_LIST's reply; NextCursor is nil on the last page.
type ConvListPage struct {
	Convs      []ConvSummary
	NextCursor []byte
}

// DirtyMarker names a large group with entries the user has not pulled.
type DirtyMarker struct {
	Conv         uint64
	TargetMsgSeq uint64
	Version      uint64
}

func decodeDirtyMarkers(d *decoder) []DirtyMarker {
	n := d.count(24)
	out := make([]DirtyMarker, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, DirtyMarker{Conv: d.u64(), TargetMsgSeq: d.u64(), Version: d.u64()})
	}
	return out
}

// ConvMode says whether a conversation is a large group, and the
// member's marker when CONV_MODE named a member with state in it.
type ConvMode struct {
	Conv      uint64
	Large     bool
	SwitchSeq *uint64
	Head      uint64
	Members   uint64
	Marker    *MemberMarker
}

// MemberMarker is one member's dirty marker in a large group.
type MemberMarker struct {
	UID          uint64
	TargetMsgSeq uint64
	Version      uint64
	ClearedSeq   uint64
	Dirty        bool
}

// DeviceState is a device's state.
type DeviceState uint8

const (
	DeviceActive     DeviceState = 1
	DeviceRecovering DeviceState = 2
	DeviceResetting  DeviceState = 3
	DeviceRevoked    DeviceState = 4
)

// DeviceInfo is a device as the server holds it.
type DeviceInfo struct {
	Device       uint64
	Generation   uint64
	AckedSyncSeq uint64
	State        DeviceState
	LastSeenMS   uint64
}

func decodeDeviceInfo(d *decoder) DeviceInfo {
	di := DeviceInfo{Device: d.u64(), Generation: d.u64(), AckedSyncSeq: d.u64(), State: DeviceState(d.u8())}
	if di.State < DeviceActive || di.State > DeviceRevoked {
		d.fail(fmt.Errorf("device state %d", di.State))
	}
	di.LastSeenMS = d.u64()
	return di
}

// Registration is REGISTER_DEVICE's reply; Evicted names the device that
// made room, if one did.
type Registration struct {
	Device  DeviceInfo
	Evicted *uint64
}

// SyncRequest is a SYNC. Generation 0 means absent (a device that does
// not know its generation, e.g. after a reinstall; generations start at
// 1); a nil BatchToken starts a batch. The options are sent only when
// set: MaxReplay 0 and AckThrough 0 are unset.
type SyncRequest struct {
	UID             uint64
	Device          uint64
	Generation      uint64
	LocalAppliedSeq uint64
	Limit           uint32
	BatchToken      []byte

	MaxReplay        uint64
	WithoutSummaries bool
	IDsOnly          bool
	AckThrough       uint64
}

func (r *SyncRequest) encode(e *encoder) {
	e.u64(r.UID)
	e.u64(r.Device)
	e.optU64(r.Generation, r.Generation != 0)
	e.u64(r.LocalAppliedSeq)
	e.u32(r.Limit)
	e.boolean(r.BatchToken != nil)
	if r.BatchToken != nil {
		e.bytes(r.BatchToken)
	}
	// Optional fields: tag u8, value bytes, in ascending tag order.
	if r.MaxReplay != 0 {
		e.u8(1)
		e.u32(8)
		e.u64(r.MaxReplay)
	}
	if r.WithoutSummaries {
		e.u8(2)
		e.u32(0)
	}
	if r.IDsOnly {
		e.u8(3)
		e.u32(0)
	}
	if r.AckThrough != 0 {
		e.u8(4)
		e.u32(8)
		e.u64(r.AckThrough)
	}
}

// EventKind is an Event's kind. A kind this client does not know keeps
// its raw body in Event.Body; the event still counts for ACKs.
type EventKind uint8

const (
	EventMsg    EventKind = 1
	EventRead   EventKind = 2
	EventRecall EventKind = 3
	EventEdit   EventKind = 4
	EventConv   EventKind = 5
	EventMember EventKind = 6
	EventDirty  EventKind = 7
)

// Event is one entry of a user's sync stream. For kinds 1 to 7 the ids
// are decoded (Summary is nil in an ids_only page); for any other kind
// only Body is set.
type Event struct {
	SyncSeq uint64
	Kind    EventKind
	Conv    uint64
	MsgSeq  uint64
	MsgID   uint64
	AtMS    uint64
	Summary []byte
	Body    []byte
}

const eventBytesMin = 8 + 1 + 4

func decodeEvent(d *decoder) Event {
	ev := Event{SyncSeq: d.u64(), Kind: EventKind(d.u8())}
	body := d.take(int(d.u32()))
	if d.err != nil {
		return ev
	}
	if ev.Kind < EventMsg || ev.Kind > EventDirty {
		ev.Body = append([]byte{}, body...)
		return ev
	}
	b := decoder{b: body}
	ev.Conv, ev.MsgSeq, ev.MsgID, ev.AtMS = b.u64(), b.u64(), b.u64(), b.u64()
	if len(body) != 32 { // 32 bytes: an ids_only event, without a summary
		ev.Summary = b.bytes()
	}
	if err := b.end(); err != nil {
		d.fail(fmt.Errorf("event %d: %w", ev.SyncSeq, err))
	}
	return ev
}

// LeaseInfo is a recovery lease: the events after ResumeFrom up to HWM
// are kept for the device until ExpiresAtMS.
type LeaseInfo struct {
	LeaseID     uint64
	ResumeFrom  uint64
	HWM         uint64
	ExpiresAtMS uint64
}

// SyncPage is one page of a batch. Send the next SYNC with NextCursor,
// BatchToken and Generation while HasMore.
type SyncPage struct {
	Events       []Event
	NextCursor   uint64
	HasMore      bool
	AckedSyncSeq uint64
	BatchHWM     uint64
	BatchToken   []byte
	Generation   uint64
	Lease        *LeaseInfo
}

func decodeSyncPage(d *decoder) SyncPage {
	n := d.count(eventBytesMin)
	p := SyncPage{Events: make([]Event, 0, n)}
	for i := 0; i < n && d.err == nil; i++ {
		p.Events = append(p.Events, decodeEvent(d))
	}
	p.NextCursor, p.HasMore, p.AckedSyncSeq, p.BatchHWM = d.u64(), d.boolean(), d.u64(), d.u64()
	p.BatchToken, p.Generation = d.bytes(), d.u64()
	if d.present() {
		p.Lease = &LeaseInfo{LeaseID: d.u64(), ResumeFrom: d.u64(), HWM: d.u64(), ExpiresAtMS: d.u64()}
	}
	return p
}

// AckRequest acknowledges a device's events through Seq, with the
// token of the batch they came in.
type AckRequest struct {
	UID        uint64
	Device     uint64
	Generation uint64
	Seq        uint64
	BatchToken []byte
}

// SnapshotState is a snapshot's state.
type SnapshotState uint8

const (
	SnapshotBuilding  SnapshotState = 1
	SnapshotReady     SnapshotState = 2
	SnapshotInstalled SnapshotState = 3
	SnapshotExpired   SnapshotState = 4
)

// SnapshotInfo describes a snapshot; Generation is the device's
// generation to acknowledge it with.
type SnapshotInfo struct {
	SnapshotID     uint64
	BaseSyncSeq    uint64
	Generation     uint64
	State          SnapshotState
	Pages          uint32
	ManifestDigest [32]byte
}

func decodeSnapshotInfo(d *decoder) SnapshotInfo {
	s := SnapshotInfo{SnapshotID: d.u64(), BaseSyncSeq: d.u64(), Generation: d.u64(), State: SnapshotState(d.u8())}
	if s.State < SnapshotBuilding || s.State > SnapshotExpired {
		d.fail(fmt.Errorf("snapshot state %d", s.State))
	}
	s.Pages = d.u32()
	copy(s.ManifestDigest[:], d.take(32))
	return s
}

// SnapshotPage is one page of a snapshot. A conversation's messages may
// go on over the next pages: install the union of all pages.
type SnapshotPage struct {
	SnapshotID uint64
	Page       uint32
	Pages      uint32
	Convs      []ConvSummary
	Messages   []Message
	// Elided names the messages of this page too large for any reply of
	// the server: each is in Messages with its payload cut to its
	// summary, and no request can fetch its whole body, so show it as a
	// partial message. Always empty on a version 2 connection, whose
	// server cuts those payloads all the same without saying so.
	Elided []MsgRef
}

// MsgRef names one message: its conversation and msg_seq.
type MsgRef struct {
	Conv   uint64
	MsgSeq uint64
}

func decodeSnapshotPage(d *decoder) SnapshotPage {
	p := SnapshotPage{SnapshotID: d.u64(), Page: d.u32(), Pages: d.u32(),
		Convs: decodeConvSummaries(d), Messages: decodeMessages(d)}
	if d.version < 3 {
		return p
	}
	n := d.count(16)
	for i := 0; i < n && d.err == nil; i++ {
		p.Elided = append(p.Elided, MsgRef{Conv: d.u64(), MsgSeq: d.u64()})
	}
	return p
}

// Hint says a subscribed user's committed sync head moved: sync now.
type Hint struct {
	UID              uint64
	CommittedSyncSeq uint64
}

// DirtyHint says a subscribed member's dirty marker in a large group
// moved: pull the group, then CLEAR_DIRTY with Version.
type DirtyHint struct {
	UID          uint64
	Conv         uint64
	TargetMsgSeq uint64
	Version      uint64
}

// CompactionReport is what a compaction reclaimed.
type CompactionReport struct {
	EventsReclaimed   uint64
	BytesReclaimed    uint64
	BytesRewritten    uint64
	SegmentsDropped   uint64
	SegmentsRewritten uint64
}

func decodeCompactionReport(d *decoder) CompactionReport {
	return CompactionReport{d.u64(), d.u64(), d.u64(), d.u64(), d.u64()}
}

// Stats is STATS's reply.
type Stats struct {
	Users             uint64
	Conversations     uint64
	Devices           uint64
	Messages          uint64
	EventsLive        uint64
	WriteBatches      uint64
	Fsyncs            uint64
	FsyncLatencyUSSum uint64
	BytesOnDisk       uint64
	IndexBytes        uint64
	Compaction        CompactionReport
}

// FenceKind is what holds a user's events back from compaction.
type FenceKind uint8

const (
	FenceDeviceAck     FenceKind = 1
	FenceRecoveryLease FenceKind = 2
	FenceSnapshot      FenceKind = 3
	FenceSafetyWindow  FenceKind = 4
)

// Fence is one entry of EXPLAIN. The fields its kind has are set; a kind
// this client does not know keeps its raw body in Body.
type Fence struct {
	Kind         FenceKind
	Device       uint64
	AckedSyncSeq uint64
	LeaseID      uint64
	ResumeFrom   uint64
	SnapshotID   uint64
	BaseSyncSeq  uint64
	OldestKept   uint64
	Body         []byte
}

func decodeFence(d *decoder) Fence {
	f := Fence{Kind: FenceKind(d.u8())}
	body := d.take(int(d.u32()))
	if d.err != nil {
		return f
	}
	b := decoder{b: body}
	switch f.Kind {
	case FenceDeviceAck:
		f.Device, f.AckedSyncSeq = b.u64(), b.u64()
	case FenceRecoveryLease:
		f.Device, f.LeaseID, f.ResumeFrom = b.u64(), b.u64(), b.u64()
	case FenceSnapshot:
		f.SnapshotID, f.BaseSyncSeq = b.u64(), b.u64()
	case FenceSafetyWindow:
		f.OldestKept = b.u64()
	default:
		f.Body = append([]byte{}, body...)
		return f
	}
	if err := b.end(); err != nil {
		d.fail(fmt.Errorf("fence %d: %w", f.Kind, err))
	}
	return f
}

// UserExplain says what holds a user's events back from compaction.
type UserExplain struct {
	UID              uint64
	OldestRetained   uint64
	CommittedSyncSeq uint64
	Floor            uint64
	Fences           []Fence
}

func decodeUserExplain(d *decoder) UserExplain {
	x := UserExplain{UID: d.u64(), OldestRetained: d.u64(), CommittedSyncSeq: d.u64(), Floor: d.u64()}
	n := d.count(5)
	for i := 0; i < n && d.err == nil; i++ {
		x.Fences = append(x.Fences, decodeFence(d))
	}
	return x
}

// SegmentExplain says what a log segment holds and who keeps it.
type SegmentExplain struct {
	Stream      string
	Segment     uint32
	Bytes       uint64
	LiveBytes   uint64
	LiveRecords uint64
	HeldBy      []string
}

// MemoryUse is one structure of MEMORY's reply.
type MemoryUse struct {
	Structure string
	Live      uint64
	Allocated uint64
}

// MemoryReport is MEMORY's reply.
type MemoryReport struct {
	WalkUS        uint64
	LongestHoldUS uint64
	Structures    []MemoryUse
}

func decodeMemoryReport(d *decoder) MemoryReport {
	m := MemoryReport{WalkUS: d.u64(), LongestHoldUS: d.u64()}
	n := d.count(20)
	for i := 0; i < n && d.err == nil; i++ {
		m.Structures = append(m.Structures, MemoryUse{Structure: d.str(), Live: d.u64(), Allocated: d.u64()})
	}
	return m
}

// ClusterMember is one member of a replicated group; MatchedIndex is set
// on the leader only.
type ClusterMember struct {
	NodeID       uint64
	RaftAddr     string
	ClientAddr   string
	MatchedIndex *uint64
}

// ClusterStatus is a node's view of its group ("single" Role, node 0, for
// a daemon without one).
type ClusterStatus struct {
	NodeID               uint64
	Role                 string
	Term                 uint64
	Leader               *uint64
	LastLogIndex         uint64
	LastAppliedIndex     uint64
	MillisSinceQuorumAck *uint64
	Members              []ClusterMember
}

func decodeClusterStatus(d *decoder) ClusterStatus {
	s := ClusterStatus{NodeID: d.u64(), Role: d.str(), Term: d.u64(), Leader: d.optU64()}
	s.LastLogIndex, s.LastAppliedIndex, s.MillisSinceQuorumAck = d.u64(), d.u64(), d.optU64()
	n := d.count(8 + 4 + 4 + 1)
	for i := 0; i < n && d.err == nil; i++ {
		s.Members = append(s.Members, ClusterMember{
			NodeID: d.u64(), RaftAddr: d.str(), ClientAddr: d.str(), MatchedIndex: d.optU64(),
		})
	}
	return s
}
