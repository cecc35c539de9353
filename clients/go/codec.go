package inboxd

// The wire encoding of docs/PROTOCOL.md, sections 1 and 2: frames, and
// the little-endian fixed-width fields bodies are made of. No IO here;
// conn.go moves the frames.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// frameHeaderLen is what follows frame_len in every frame: opcode u8 and
// request_id u64.
const frameHeaderLen = 9

// errShortBody and friends are decode failures of a reply: the server
// sent something this client cannot read. They surface as *ProtocolError.
var errShortBody = errors.New("body ends early")

// ProtocolError is a reply this client could not decode: a server bug, or
// a server newer than this client in a way the protocol does not allow.
type ProtocolError struct {
	Op     byte
	Reason string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("inboxd: reply to opcode %#02x: %s", e.Op, e.Reason)
}

// encoder appends fields to a frame under construction. The frame's
// first 13 bytes are the header, filled in by finish.
type encoder struct{ b []byte }

func newFrame(op byte, sizeHint int) *encoder {
	e := &encoder{b: make([]byte, 4+frameHeaderLen, 4+frameHeaderLen+sizeHint)}
	e.b[4] = op
	return e
}

// finish writes frame_len and the request id, and returns the frame.
func (e *encoder) finish(requestID uint64) []byte {
	binary.LittleEndian.PutUint32(e.b[0:4], uint32(len(e.b)-4))
	binary.LittleEndian.PutUint64(e.b[5:13], requestID)
	return e.b
}

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) u128(v ClientMsgID) {
	e.u64(v.Lo)
	e.u64(v.Hi)
}
func (e *encoder) boolean(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}
func (e *encoder) bytes(v []byte) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}
func (e *encoder) str(v string) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}
func (e *encoder) optU64(v uint64, present bool) {
	e.boolean(present)
	if present {
		e.u64(v)
	}
}
func (e *encoder) u64s(v []uint64) {
	e.u32(uint32(len(v)))
	for _, x := range v {
		e.u64(x)
	}
}

// decoder reads a reply body strictly: a short body, a bad tag or bad
// UTF-8 is an error, and end checks that nothing is left over. version
// is the protocol version the body is laid out in, for the few layouts
// that differ (0: not known, the handshake's).
type decoder struct {
	b       []byte
	err     error
	version uint16
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail(errShortBody)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}
func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}
func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}
func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}
func (d *decoder) boolean() bool {
	switch d.u8() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail(errors.New("bool is neither 00 nor 01"))
		return false
	}
}
func (d *decoder) present() bool {
	switch d.u8() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail(errors.New("option tag is neither 00 nor 01"))
		return false
	}
}

// bytes copies, so that a reply never aliases the connection's buffer.
func (d *decoder) bytes() []byte {
	n := d.u32()
	v := d.take(int(n))
	if v == nil {
		return nil
	}
	return append([]byte{}, v...)
}
func (d *decoder) str() string {
	n := d.u32()
	v := d.take(int(n))
	if !utf8.Valid(v) {
		d.fail(errors.New("string is not UTF-8"))
	}
	return string(v)
}
func (d *decoder) optStr() (string, bool) {
	if !d.present() {
		return "", false
	}
	return d.str(), true
}
func (d *decoder) optU64() *uint64 {
	if !d.present() {
		return nil
	}
	v := d.u64()
	return &v
}

// count reads a list's length and checks that at least min bytes per item
// follow, so that a bad count cannot make the client allocate much.
func (d *decoder) count(itemBytesMin int) int {
	n := int(d.u32())
	if d.err == nil && n*itemBytesMin > len(d.b) {
		d.fail(errShortBody)
		return 0
	}
	return n
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Errorf("%d trailing bytes", len(d.b)))
	}
	return d.err
}
