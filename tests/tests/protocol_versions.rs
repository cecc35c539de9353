//! The handshake across protocol versions, the limits `HELLO_OK`
//! announces, and request id 0.

use bytes::{Bytes, BytesMut};
use inbox_tests::{hello, Daemon, RawConn, ADMIN_TOKEN, TOKEN};
use inbox_wire::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client that speaks protocol version 1 byte for byte: it knows only
/// the version 1 layouts of `HELLO_OK` and `EXPLAIN`.
struct V1Client {
    stream: TcpStream,
    buf: BytesMut,
    codec: FrameCodec,
}

impl V1Client {
    async fn connect(daemon: &Daemon) -> (V1Client, v1::HelloOk1) {
        let mut client = V1Client {
            stream: TcpStream::connect(daemon.addr).await.unwrap(),
            buf: BytesMut::new(),
            codec: FrameCodec::new(u32::MAX),
        };
        let hello = Request::Hello(Hello {
            version: 1,
            client_name: "v1-client".into(),
            // The admin token: the test reads EXPLAIN, an admin request.
            token: Bytes::from_static(ADMIN_TOKEN.as_bytes()),
        });
        client.send(&hello.to_frame(1)).await;
        let frame = client.recv().await;
        assert_eq!(frame.opcode, v1::HELLO_OK, "{frame:?}");
        let ok = v1::decode_hello_ok(frame.body).expect("a version 1 HELLO_OK");
        (client, ok)
    }

    async fn send(&mut self, frame: &Frame) {
        let mut out = BytesMut::new();
        self.codec.encode(frame, &mut out).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    async fn recv(&mut self) -> Frame {
        loop {
            if let Some(frame) = self.codec.decode(&mut self.buf).unwrap() {
                return frame;
            }
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                self.stream.read_buf(&mut self.buf),
            )
            .await
            .expect("server answered within 10 s")
            .unwrap();
            assert!(read > 0, "server closed the connection");
        }
    }
}

#[tokio::test]
async fn a_version_1_client_is_served_in_the_version_1_layouts() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let (mut client, ok) = V1Client::connect(&daemon).await;
    assert_eq!(ok.version, 1);
    assert_eq!(ok.frame_bytes_max, 1 << 20);

    // Ordinary requests are the same in both versions.
    let join = Request::Join(ConvMember { conv: 5, uid: 1 });
    client.send(&join.to_frame(2)).await;
    let register = Request::RegisterDevice(UserDevice { uid: 1, device: 9 });
    client.send(&register.to_frame(3)).await;
    let send = Request::Send(SendReq {
        conv: 5,
        sender: 1,
        client_msg_id: 1,
        msg_type: 1,
        payload: Bytes::from_static(b"hello from 2019"),
    });
    client.send(&send.to_frame(4)).await;
    let mut seen = 0;
    while seen < 3 {
        let frame = client.recv().await;
        let reply = Response::decode(frame.opcode, frame.body).unwrap();
        assert!(!matches!(reply, Response::Error(_)), "{reply:?}");
        seen += 1;
    }

    // EXPLAIN, whose fences changed layout, comes in the version 1 layout.
    client
        .send(&Request::Explain(UserReq { uid: 1 }).to_frame(5))
        .await;
    let frame = client.recv().await;
    assert_eq!(frame.opcode, v1::EXPLAIN_OK);
    let explain = v1::decode_explain(frame.body).expect("a version 1 EXPLAIN reply");
    assert_eq!(explain.uid, 1);
    assert!(
        explain
            .fences
            .iter()
            .any(|f| matches!(f.0, Fence::DeviceAck { device: 9, .. })),
        "{explain:?}"
    );
}

#[tokio::test]
async fn a_version_the_server_does_not_speak_is_refused_at_hello_with_the_newest_it_speaks() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    for version in [0u16, PROTOCOL_VERSION + 1] {
        let mut conn = RawConn::connect(daemon.addr).await;
        conn.send(
            &Request::Hello(Hello {
                version,
                client_name: "other".into(),
                token: Bytes::from_static(TOKEN.as_bytes()),
            })
            .to_frame(1),
        )
        .await;
        match conn.recv().await {
            Some((1, Response::Error(err))) => {
                assert_eq!(err.code, ErrorCode::Unsupported);
                assert_eq!(err.detail, u64::from(PROTOCOL_VERSION));
            }
            other => panic!("version {version}: {other:?}"),
        }
        assert!(conn.closed().await);
    }
}

#[tokio::test]
async fn hello_ok_announces_the_payload_limit_and_the_other_limits() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let ok = client.server().clone();
    assert_eq!(ok.version, PROTOCOL_VERSION);
    assert_eq!(ok.payload_bytes_max, 65_536);
    assert_eq!(ok.frame_bytes_max, 1 << 20);
    assert_eq!(ok.summary_bytes_max, 64);
    assert_eq!((ok.sync_page_default, ok.sync_page_max), (100, 500));
    assert_eq!((ok.pull_per_conv_default, ok.pull_per_conv_max), (50, 500));
    assert_eq!(ok.devices_per_user_max, 5);

    // The announced payload limit is the one enforced.
    client.join(ConvMember { conv: 1, uid: 1 }).await.unwrap();
    let send = |len: usize, key: u128| SendReq {
        conv: 1,
        sender: 1,
        client_msg_id: key,
        msg_type: 1,
        payload: Bytes::from(vec![b'x'; len]),
    };
    client
        .send(send(ok.payload_bytes_max as usize, 1))
        .await
        .expect("a payload of exactly the limit is accepted");
    let err = client
        .send(send(ok.payload_bytes_max as usize + 1, 2))
        .await
        .expect_err("one byte over is refused");
    assert_eq!(err.code(), Some(ErrorCode::TooLarge));

    // The announced limits are the ones enforced.
    for (limit, ok_expected) in [
        (ok.history_limit_max, true),
        (ok.history_limit_max + 1, false),
    ] {
        let reply = client
            .history(HistoryReq {
                uid: 1,
                conv: 1,
                before_seq: None,
                limit,
            })
            .await;
        assert_eq!(reply.is_ok(), ok_expected, "history limit {limit}");
    }
}

#[tokio::test]
async fn a_request_with_id_0_is_refused_and_the_connection_closes() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());

    // After the handshake.
    let mut conn = RawConn::authenticated(daemon.addr).await;
    conn.send(&Request::Ping(Empty {}).to_frame(0)).await;
    match conn.recv().await {
        Some((0, Response::Error(err))) => assert_eq!(err.code, ErrorCode::BadRequest),
        other => panic!("{other:?}"),
    }
    assert!(conn.closed().await);

    // As the handshake itself.
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.send(&hello(TOKEN).to_frame(0)).await;
    match conn.recv().await {
        Some((0, Response::Error(err))) => assert_eq!(err.code, ErrorCode::BadRequest),
        other => panic!("{other:?}"),
    }
    assert!(conn.closed().await);

    // The daemon serves others as before.
    let client = daemon.client().await;
    client.ping(Empty {}).await.unwrap();
}
