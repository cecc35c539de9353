//! Raw bad input against the real daemon: each is answered with its error
//! code, the connection closes exactly when the stream can no longer be
//! trusted, and the daemon keeps serving.

use bytes::{BufMut, Bytes, BytesMut};
use inbox_server::client::Client;
use inbox_tests::{hello, Daemon, RawConn, TOKEN};
use inbox_wire::*;

fn error_of(reply: Option<(u64, Response)>) -> (u64, ErrorReply) {
    match reply {
        Some((id, Response::Error(err))) => (id, err),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

/// The daemon still serves a well-behaved client afterwards.
async fn still_serves(daemon: &Daemon) {
    let client = daemon.client().await;
    client.ping(Empty {}).await.expect("ping after bad input");
}

#[tokio::test]
async fn garbage_bytes_get_an_error_and_the_connection_closes() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::connect(daemon.addr).await;
    // "GET / HTTP/1.1" read as a frame header declares ~542 MB.
    conn.write_raw(b"GET / HTTP/1.1\r\nHost: inboxd\r\n\r\n")
        .await;
    let (id, err) = error_of(conn.recv().await);
    assert_eq!(id, 0, "stream-level errors carry request id 0");
    assert_eq!(err.code, ErrorCode::TooLarge);
    assert!(conn.closed().await);

    let mut conn = RawConn::connect(daemon.addr).await;
    conn.write_raw(&[3, 0, 0, 0, 0xde, 0xad, 0xbe]).await;
    let (_, err) = error_of(conn.recv().await);
    assert_eq!(
        err.code,
        ErrorCode::BadRequest,
        "a 3-byte frame cannot hold a header"
    );
    assert!(conn.closed().await);
    still_serves(&daemon).await;
}

#[tokio::test]
async fn frame_declaring_4_gib_gets_too_large_and_the_connection_closes() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::authenticated(daemon.addr).await;
    let mut bytes = BytesMut::new();
    bytes.put_u32_le(u32::MAX);
    bytes.put_u8(Op::Send as u8);
    bytes.put_u64_le(5);
    conn.write_raw(&bytes).await;
    let (_, err) = error_of(conn.recv().await);
    assert_eq!(err.code, ErrorCode::TooLarge);
    assert_eq!(
        err.detail,
        u64::from(frame::FRAME_BYTES_MAX_DEFAULT),
        "detail is the limit"
    );
    assert!(conn.closed().await);
    still_serves(&daemon).await;
}

#[tokio::test]
async fn truncated_frame_gets_bad_request_when_the_stream_ends() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::authenticated(daemon.addr).await;
    let frame = Request::Ping(Empty {}).to_frame(2);
    let mut bytes = BytesMut::new();
    encode(&frame, &mut bytes).unwrap();
    conn.write_raw(&bytes[..bytes.len() - 3]).await;
    // Only half-close: the answer can still be read.
    conn.shutdown_write().await;
    let (_, err) = error_of(conn.recv().await);
    assert_eq!(err.code, ErrorCode::BadRequest);
    assert!(err.message.contains("inside a frame"), "{}", err.message);
    assert!(conn.closed().await);
}

#[tokio::test]
async fn unknown_opcode_gets_unsupported_and_the_connection_stays_open() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::authenticated(daemon.addr).await;
    conn.send(&Frame {
        opcode: 0x7e,
        request_id: 41,
        body: Bytes::from_static(b"from the future"),
    })
    .await;
    let (id, err) = error_of(conn.recv().await);
    assert_eq!((id, err.code), (41, ErrorCode::Unsupported));
    conn.send(&Request::Ping(Empty {}).to_frame(42)).await;
    assert_eq!(conn.recv().await, Some((42, Response::Ping(Empty {}))));
}

#[tokio::test]
async fn malformed_body_gets_bad_request_and_the_connection_stays_open() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::authenticated(daemon.addr).await;
    conn.send(&Frame {
        opcode: Op::Send as u8,
        request_id: 7,
        body: Bytes::from_static(&[1, 2, 3]),
    })
    .await;
    let (id, err) = error_of(conn.recv().await);
    assert_eq!((id, err.code), (7, ErrorCode::BadRequest));
    conn.send(&Request::Ping(Empty {}).to_frame(8)).await;
    assert_eq!(conn.recv().await, Some((8, Response::Ping(Empty {}))));
}

#[tokio::test]
async fn wrong_token_gets_unauthenticated_and_the_connection_closes() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.send(&hello("not-the-token").to_frame(1)).await;
    let (id, err) = error_of(conn.recv().await);
    assert_eq!((id, err.code), (1, ErrorCode::Unauthenticated));
    assert!(!err.message.contains(TOKEN), "the token is never echoed");
    assert!(conn.closed().await);

    let refused = Client::connect(daemon.addr, "nope")
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.code(), Some(ErrorCode::Unauthenticated));
}

#[tokio::test]
async fn requests_before_the_handshake_get_unauthenticated_and_the_connection_closes() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.send(&Request::Join(ConvMember { conv: 1, uid: 1 }).to_frame(3))
        .await;
    let (id, err) = error_of(conn.recv().await);
    assert_eq!((id, err.code), (3, ErrorCode::Unauthenticated));
    assert!(conn.closed().await);
}

#[tokio::test]
async fn unsupported_protocol_version_is_refused() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.send(
        &Request::Hello(Hello {
            version: 99,
            client_name: "future".into(),
            token: Bytes::from_static(TOKEN.as_bytes()),
        })
        .to_frame(1),
    )
    .await;
    let (_, err) = error_of(conn.recv().await);
    assert_eq!(err.code, ErrorCode::Unsupported);
    assert_eq!(err.detail, u64::from(PROTOCOL_VERSION));
    assert!(conn.closed().await);
}

#[tokio::test]
async fn request_rate_over_the_limit_gets_rate_limited_with_retry_after() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start_with(dir.path(), &["--rate-per-s", "1", "--rate-burst", "2"]);
    let client = daemon.client().await;
    client.ping(Empty {}).await.expect("within burst");
    client.ping(Empty {}).await.expect("within burst");
    let err = client.ping(Empty {}).await.expect_err("over the rate");
    assert_eq!(err.code(), Some(ErrorCode::RateLimited));
    let inbox_server::client::ClientError::Server { detail, .. } = err else {
        unreachable!("checked above")
    };
    assert!(detail > 0 && detail <= 1000, "retry-after {detail} ms");
}

#[tokio::test]
async fn connections_over_the_limit_are_refused_with_unavailable() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start_with(dir.path(), &["--max-connections", "1"]);
    let first = daemon.client().await;
    let mut second = RawConn::connect(daemon.addr).await;
    let (_, err) = error_of(second.recv().await);
    assert_eq!(err.code, ErrorCode::Unavailable);
    first
        .ping(Empty {})
        .await
        .expect("the first connection is unaffected");
}

#[tokio::test]
async fn metrics_endpoint_counts_requests_and_refusals() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let mut conn = RawConn::authenticated(daemon.addr).await;
    conn.send(&Request::Ping(Empty {}).to_frame(2)).await;
    conn.recv().await;
    conn.send(&Frame {
        opcode: 0x7d,
        request_id: 3,
        body: Bytes::new(),
    })
    .await;
    conn.recv().await;
    let text = daemon.scrape().await;
    assert!(
        text.contains("inboxd_requests_total{op=\"UNKNOWN\",result=\"UNSUPPORTED\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE inboxd_request_seconds histogram"),
        "{text}"
    );
    assert!(text.contains("inboxd_fsync_seconds_count"), "{text}");
    assert!(text.contains("inboxd_connections_open 1"), "{text}");
}

#[tokio::test]
async fn sigterm_with_no_load_exits_zero() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let _client = daemon.client().await;
    let status = daemon.stop();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn idle_connection_is_closed_after_the_idle_timeout() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start_with(dir.path(), &["--idle-timeout-s", "1"]);
    let mut idle = RawConn::authenticated(daemon.addr).await;
    let started = std::time::Instant::now();
    assert!(idle.closed().await);
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(900),
        "closed only once idle: {waited:?}"
    );
    still_serves(&daemon).await;
}
