package inboxd

// Errors: the server's ERROR frame as *Error, one sentinel per code for
// errors.Is, and the two things a caller reads out of an error's detail
// or message (a retry-after, the leader's address).

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Code is an ERROR frame's code (PROTOCOL.md section 3).
type Code uint16

// The error codes of PROTOCOL.md. A code this client does not know is
// still returned as an *Error, with its number.
const (
	CodeBadRequest      Code = 1
	CodeUnauthenticated Code = 2
	CodeForbidden       Code = 3
	CodeStaleGeneration Code = 4
	CodeResetRequired   Code = 5
	CodeDeviceRevoked   Code = 6
	CodeRateLimited     Code = 7
	CodeTooLarge        Code = 8
	CodeUnsupported     Code = 9
	CodeInternal        Code = 10
	CodeDeviceResetting Code = 11
	CodeNotFound        Code = 12
	CodeBadToken        Code = 13
	CodeAckBeyondHWM    Code = 14
	CodeConflict        Code = 15
	CodeNoSpace         Code = 16
	CodeUnavailable     Code = 17
	CodeMarkerMoved     Code = 18
	CodeNotLeader       Code = 19
)

var codeNames = map[Code]string{
	CodeBadRequest:      "BAD_REQUEST",
	CodeUnauthenticated: "UNAUTHENTICATED",
	CodeForbidden:       "FORBIDDEN",
	CodeStaleGeneration: "STALE_GENERATION",
	CodeResetRequired:   "RESET_REQUIRED",
	CodeDeviceRevoked:   "DEVICE_REVOKED",
	CodeRateLimited:     "RATE_LIMITED",
	CodeTooLarge:        "TOO_LARGE",
	CodeUnsupported:     "UNSUPPORTED",
	CodeInternal:        "INTERNAL",
	CodeDeviceResetting: "DEVICE_RESETTING",
	CodeNotFound:        "NOT_FOUND",
	CodeBadToken:        "BAD_TOKEN",
	CodeAckBeyondHWM:    "ACK_BEYOND_HWM",
	CodeConflict:        "CONFLICT",
	CodeNoSpace:         "NO_SPACE",
	CodeUnavailable:     "UNAVAILABLE",
	CodeMarkerMoved:     "MARKER_MOVED",
	CodeNotLeader:       "NOT_LEADER",
}

// String is the code's name in PROTOCOL.md, or CODE_n for an unknown one.
func (c Code) String() string {
	if name, ok := codeNames[c]; ok {
		return name
	}
	return fmt.Sprintf("CODE_%d", uint16(c))
}

// Error is a request the server refused (an ERROR frame). Detail's
// meaning depends on the code (PROTOCOL.md section 3): the current
// generation for STALE_GENERATION and RESET_REQUIRED, milliseconds to
// wait for RATE_LIMITED, the limit for TOO_LARGE (in bytes, except a
// count of uids for SUBSCRIBE: Server().SubscribeUIDsMax), and so on.
// Message is for humans.
//
// errors.Is(err, ErrConflict) matches any *Error of that code;
// errors.As(err, &e) gives the detail.
type Error struct {
	Code    Code
	Detail  uint64
	Message string

	// leaderAddr is the ERROR's leader_addr field; hasLeaderAddr says the
	// frame had the field (version 3 and on), absent or not.
	leaderAddr    string
	hasLeaderAddr bool
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("inboxd: %s (detail %d)", e.Code, e.Detail)
	}
	return fmt.Sprintf("inboxd: %s (detail %d): %s", e.Code, e.Detail, e.Message)
}

// Is matches the sentinel of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// RetryAfter is how long RATE_LIMITED asks the client to wait; 0 for
// other codes.
func (e *Error) RetryAfter() time.Duration {
	if e.Code != CodeRateLimited {
		return 0
	}
	return time.Duration(e.Detail) * time.Millisecond
}

// LeaderAddr is the leader's client address a NOT_LEADER names, or ""
// when the error is another one or the leader is not known (an election
// runs, or the leader pauses its writes for a membership change). From
// version 3 on it is the ERROR's leader_addr field, and only that: the
// message is for humans. A version 2 server has no such field and ends
// the message with `leader_addr=HOST:PORT` instead; this is the one place
// that reads it there.
func (e *Error) LeaderAddr() string {
	if e.Code != CodeNotLeader {
		return ""
	}
	if e.hasLeaderAddr {
		return e.leaderAddr
	}
	i := strings.LastIndex(e.Message, "leader_addr=")
	if i < 0 {
		return ""
	}
	addr := strings.TrimSpace(e.Message[i+len("leader_addr="):])
	if j := strings.LastIndexByte(addr, ':'); j <= 0 || j == len(addr)-1 {
		return ""
	}
	return addr
}

// Sentinels, one per code, for errors.Is.
var (
	ErrBadRequest      = &Error{Code: CodeBadRequest}
	ErrUnauthenticated = &Error{Code: CodeUnauthenticated}
	ErrForbidden       = &Error{Code: CodeForbidden}
	ErrStaleGeneration = &Error{Code: CodeStaleGeneration}
	ErrResetRequired   = &Error{Code: CodeResetRequired}
	ErrDeviceRevoked   = &Error{Code: CodeDeviceRevoked}
	ErrRateLimited     = &Error{Code: CodeRateLimited}
	ErrTooLarge        = &Error{Code: CodeTooLarge}
	ErrUnsupported     = &Error{Code: CodeUnsupported}
	ErrInternal        = &Error{Code: CodeInternal}
	ErrDeviceResetting = &Error{Code: CodeDeviceResetting}
	ErrNotFound        = &Error{Code: CodeNotFound}
	ErrBadToken        = &Error{Code: CodeBadToken}
	ErrAckBeyondHWM    = &Error{Code: CodeAckBeyondHWM}
	ErrConflict        = &Error{Code: CodeConflict}
	ErrNoSpace         = &Error{Code: CodeNoSpace}
	ErrUnavailable     = &Error{Code: CodeUnavailable}
	ErrMarkerMoved     = &Error{Code: CodeMarkerMoved}
	ErrNotLeader       = &Error{Code: CodeNotLeader}
)

// ErrClosed is returned by calls on a connection that is closed or broke;
// when it broke, the error wraps the cause too. A request in flight when
// the connection broke may or may not have taken effect.
var ErrClosed = errors.New("inboxd: connection closed")

// closedError is ErrClosed with its cause.
type closedError struct{ cause error }

func (e *closedError) Error() string {
	if e.cause == nil {
		return ErrClosed.Error()
	}
	return ErrClosed.Error() + ": " + e.cause.Error()
}
func (e *closedError) Is(target error) bool { return target == ErrClosed }
func (e *closedError) Unwrap() error        { return e.cause }
