//! Typed error codes (R24) carried by the `ERROR` reply.
//!
//! Codes are `u16` on the wire. A code this build does not know decodes to
//! [`ErrorCode::Other`] and re-encodes unchanged, so a newer server never
//! breaks an older client.

use std::fmt;

macro_rules! codes {
    ($( $(#[$meta:meta])* $name:ident = $code:expr, $text:expr; )*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $( $(#[$meta])* $name, )*
            /// A code this build does not know.
            Other(u16),
        }

        impl ErrorCode {
            pub fn as_u16(self) -> u16 {
                match self {
                    $( Self::$name => $code, )*
                    Self::Other(code) => code,
                }
            }
            pub fn from_u16(code: u16) -> Self {
                match code {
                    $( $code => Self::$name, )*
                    other => Self::Other(other),
                }
            }
            /// The upper-case name used in docs and logs.
            pub fn name(self) -> &'static str {
                match self {
                    $( Self::$name => $text, )*
                    Self::Other(_) => "OTHER",
                }
            }
            /// Every known code, in numeric order.
            pub const ALL: &'static [ErrorCode] = &[ $( Self::$name ),* ];
        }
    };
}

codes! {
    /// The request is well framed but its fields are invalid.
    BadRequest = 1, "BAD_REQUEST";
    /// No successful HELLO on this connection, or a wrong token. Closes.
    Unauthenticated = 2, "UNAUTHENTICATED";
    /// Outside the user's membership periods (R12, R13).
    Forbidden = 3, "FORBIDDEN";
    /// `detail` = the device's current generation.
    StaleGeneration = 4, "STALE_GENERATION";
    /// `detail` = the device's new generation; install a snapshot.
    ResetRequired = 5, "RESET_REQUIRED";
    DeviceRevoked = 6, "DEVICE_REVOKED";
    /// `detail` = milliseconds to wait before retrying.
    RateLimited = 7, "RATE_LIMITED";
    /// `detail` = the limit that was exceeded (bytes).
    TooLarge = 8, "TOO_LARGE";
    /// Unknown opcode or protocol version.
    Unsupported = 9, "UNSUPPORTED";
    #[default]
    Internal = 10, "INTERNAL";
    /// The device is installing a snapshot; finish it first.
    DeviceResetting = 11, "DEVICE_RESETTING";
    NotFound = 12, "NOT_FOUND";
    /// A `batch_token` that is forged, expired or for another batch.
    BadToken = 13, "BAD_TOKEN";
    /// `detail` = the batch high watermark the ACK went past.
    AckBeyondHwm = 14, "ACK_BEYOND_HWM";
    Conflict = 15, "CONFLICT";
    NoSpace = 16, "NO_SPACE";
    /// The server is shutting down or its log is poisoned; retry elsewhere
    /// or later.
    Unavailable = 17, "UNAVAILABLE";
    /// A large group's marker moved past the version a `CLEAR_DIRTY`
    /// observed; `detail` = the current version.
    MarkerMoved = 18, "MARKER_MOVED";
    /// This node of a replicated group does not lead, or lost the
    /// leadership before the request's round committed (it may or may not
    /// be kept: retry at the leader with the same idempotency key). The
    /// error's `leader_addr` names the leader when it is known (version 3;
    /// older clients find it at the end of the message).
    NotLeader = 19, "NOT_LEADER";
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(code) => write!(f, "ERROR_{code}"),
            known => f.write_str(known.name()),
        }
    }
}

impl crate::field::Field for ErrorCode {
    const MIN_BYTES: usize = 2;
    fn put(&self, out: &mut bytes::BytesMut) {
        bytes::BufMut::put_u16_le(out, self.as_u16());
    }
    fn get(r: &mut crate::field::Reader) -> Result<Self, crate::WireError> {
        Ok(Self::from_u16(r.u16()?))
    }
}

/// An error code serializes as its name (`"RATE_LIMITED"`, `"OTHER(99)"`
/// style names included), as it prints.
#[cfg(feature = "serde")]
impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_maps_to_its_number_and_back() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u16(code.as_u16()), *code);
            assert!(!matches!(code, ErrorCode::Other(_)));
        }
        assert_eq!(ErrorCode::from_u16(999), ErrorCode::Other(999));
        assert_eq!(ErrorCode::Other(999).as_u16(), 999);
    }
}
