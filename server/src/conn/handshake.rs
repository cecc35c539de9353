//! The first frame of a connection: `HELLO`, its version and its token.
//!
//! Nothing reaches the engine before it succeeds. The token is compared
//! in constant time against both the client and the admin token, so the
//! time taken does not say which one came close.

use std::time::Duration;

use inbox_wire::{
    ErrorCode, Frame, Hello, HelloOk, Request, Response, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};
use subtle::ConstantTimeEq as _;

use super::{error_frame, reply_frame, Shared};

/// What the token presented in `HELLO` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Client,
    Admin,
}

/// What a successful handshake settled.
pub(super) struct Settled {
    pub role: Role,
    /// The protocol version the connection speaks.
    pub version: u16,
    /// The `HELLO_OK` to send.
    pub reply: Frame,
}

/// Checks the first frame: it must be a well-formed `HELLO` with a
/// supported version and the client or the admin token, and answers it.
/// On failure, the reply that says why (the connection then closes).
pub(super) fn handshake(shared: &Shared, frame: &Frame) -> Result<Settled, Frame> {
    let id = frame.request_id;
    if frame.opcode != inbox_wire::Op::Hello as u8 {
        return Err(error_frame(
            id,
            ErrorCode::Unauthenticated,
            0,
            "send HELLO with a token before anything else",
        ));
    }
    let hello: Hello = match Request::decode(frame.opcode, frame.body.clone()) {
        Ok(Request::Hello(hello)) => hello,
        Ok(_) | Err(_) => {
            return Err(error_frame(id, ErrorCode::BadRequest, 0, "malformed HELLO"));
        }
    };
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&hello.version) {
        return Err(error_frame(
            id,
            ErrorCode::Unsupported,
            u64::from(PROTOCOL_VERSION),
            format!(
                "protocol version {} is not supported; this server speaks \
                 {PROTOCOL_VERSION_MIN} to {PROTOCOL_VERSION}",
                hello.version
            ),
        ));
    }
    // Both comparisons always run, so the time taken does not say which
    // token came close.
    let client = token_matches(&shared.token, &hello.token);
    let admin = token_matches(&shared.admin_token, &hello.token);
    let role = match (admin, client) {
        (true, _) => Role::Admin,
        (false, true) => Role::Client,
        (false, false) => {
            return Err(error_frame(
                id,
                ErrorCode::Unauthenticated,
                0,
                "wrong token",
            ));
        }
    };
    tracing::debug!(client = %hello.client_name, version = hello.version, ?role, "client authenticated");
    let reply = Response::Hello(hello_ok(shared));
    Ok(Settled {
        role,
        version: hello.version,
        reply: reply_frame(hello.version, &reply, id),
    })
}

/// Compares tokens in time independent of where they differ (only the
/// length, which is not secret, ends the comparison early).
fn token_matches(expected: &[u8], presented: &[u8]) -> bool {
    bool::from(expected.ct_eq(presented))
}

/// Everything `HELLO_OK` announces: the connection's limits and the
/// engine's.
fn hello_ok(shared: &Shared) -> HelloOk {
    let inbox = shared.engine();
    let engine = inbox.config();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    HelloOk {
        version: PROTOCOL_VERSION,
        server_name: format!("inboxd/{}", env!("CARGO_PKG_VERSION")),
        frame_bytes_max: shared.limits.frame_bytes_max,
        in_flight_max: shared.limits.in_flight_max,
        reply_frame_bytes_max: shared.limits.reply_frame_bytes_max,
        payload_bytes_max: u32::try_from(inbox.payload_limit()).unwrap_or(u32::MAX),
        summary_bytes_max: u32::try_from(inbox_engine::SUMMARY_BYTES_MAX).unwrap_or(u32::MAX),
        sync_page_default: engine.sync_page_default,
        sync_page_max: engine.sync_page_max,
        pull_per_conv_default: engine.pull_per_conv_default,
        pull_per_conv_max: engine.pull_per_conv_max,
        history_limit_max: engine.pull_per_conv_max,
        conv_list_limit_max: engine.sync_page_max,
        devices_per_user_max: engine.devices_per_user_max,
        rate_per_s: shared.limits.rate_per_s,
        rate_burst: shared.limits.rate_burst,
        idle_timeout_ms: ms(shared.limits.idle_timeout),
        batch_token_ttl_ms: ms(engine.batch_token_ttl),
        recovery_lease_ttl_ms: ms(engine.recovery_lease_ttl),
        snapshot_ttl_ms: ms(engine.snapshot_ttl),
        max_connections: shared.limits.max_connections,
        subscribe_uids_max: shared.limits.subscribe_uids_max,
        subscriptions_max: shared.limits.subscriptions_max,
        large_group_members: engine.large_group_members,
        idempotency_ttl_ms: ms(engine.idempotency_ttl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"ab"));
        assert!(!token_matches(b"", b"x"));
    }
}
