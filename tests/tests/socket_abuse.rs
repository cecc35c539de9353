//! Abuse at the socket, against the real inboxd: thousands of random and
//! mutated frames, slowloris connections, connection floods and oversized
//! payloads (R24 in docs/SEMANTICS.md).
//!
//! Every test pins the same three things:
//! - each abusive connection gets the error reply the protocol promises, or
//!   is closed, and never hangs the daemon;
//! - the daemon's memory stays bounded (VmRSS / VmHWM from
//!   `/proc/<pid>/status`, printed before and after);
//! - a well-behaved client ([`Canary`]: ping, then a send that a second
//!   user's device syncs and ACKs) is served the whole time.
//!
//! The mutated-frame test runs the server's own framing rules over the bytes
//! it sends ([`expect_from_stream`]) to know exactly which replies must come
//! back. Set `ABUSE_SEED` to replay a run; the seed is printed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use inbox_server::client::Client;
use inbox_tests::{hello, msg_refs, Daemon, TOKEN};
use inbox_wire::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Growth of the daemon's resident memory that fails a test. Generous: the
/// point is "bounded", not a budget.
const MEMORY_GROWTH_BYTES_MAX: u64 = 200 << 20;

/// Uids and conversation of the well-behaved client, far from the small
/// ids the abusive frames use, so no mutation can touch its state.
const CANARY_SENDER: u64 = 0xC0FF_EE00_0001;
const CANARY_READER: u64 = 0xC0FF_EE00_0002;
const CANARY_DEVICE: u64 = 1;
const CANARY_CONV: u64 = 0xC0FF_EE00_0003;

// ---------------------------------------------------------------------------
// Memory

#[derive(Clone, Copy, Debug)]
struct Memory {
    rss_bytes: u64,
    hwm_bytes: u64,
}

impl Memory {
    fn of(pid: i32) -> Memory {
        let field = |name: &str| -> u64 {
            inbox_tests::proc_status_bytes(pid, name)
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        };
        Memory {
            rss_bytes: field("VmRSS:"),
            hwm_bytes: field("VmHWM:"),
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// Prints the figures and fails if memory grew past the bound.
fn assert_memory_bounded(test: &str, before: Memory, after: Memory) {
    println!(
        "{test}: daemon VmRSS {:.1} MiB -> {:.1} MiB, VmHWM {:.1} MiB -> {:.1} MiB",
        mib(before.rss_bytes),
        mib(after.rss_bytes),
        mib(before.hwm_bytes),
        mib(after.hwm_bytes)
    );
    let rss_growth = after.rss_bytes.saturating_sub(before.rss_bytes);
    let hwm_growth = after.hwm_bytes.saturating_sub(before.hwm_bytes);
    assert!(
        rss_growth < MEMORY_GROWTH_BYTES_MAX && hwm_growth < MEMORY_GROWTH_BYTES_MAX,
        "{test}: daemon memory grew by {:.1} MiB resident, {:.1} MiB peak",
        mib(rss_growth),
        mib(hwm_growth)
    );
}

// ---------------------------------------------------------------------------
// The well-behaved client

/// A client that keeps doing real work while a test abuses the daemon:
/// ping, a send from one user, and a sync + ACK by the other user's device
/// that must show exactly that message.
struct Canary {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<u64, String>>,
}

impl Canary {
    async fn start(daemon: &Daemon) -> Canary {
        let client = daemon.client().await;
        for uid in [CANARY_SENDER, CANARY_READER] {
            client
                .join(ConvMember {
                    conv: CANARY_CONV,
                    uid,
                })
                .await
                .expect("canary join");
        }
        let generation = inbox_tests::register(&client, CANARY_READER, CANARY_DEVICE).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut state = (generation, 0u64);
            let mut rounds = 0u64;
            while !flag.load(Ordering::Relaxed) {
                state = canary_round(&client, state)
                    .await
                    .map_err(|e| format!("round {rounds}: {e}"))?;
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(rounds)
        });
        Canary { stop, task }
    }

    /// Stops the loop; fails the test if any round failed or none ran.
    async fn finish(self, test: &str) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let rounds = self
            .task
            .await
            .expect("canary task")
            .unwrap_or_else(|e| panic!("{test}: the well-behaved client was not served: {e}"));
        assert!(
            rounds > 0,
            "{test}: the well-behaved client never finished a round"
        );
        println!("{test}: well-behaved client served {rounds} rounds (ping + send + sync + ack)");
        rounds
    }
}

/// One canary round: returns the reader device's new (generation, ACK).
async fn canary_round(
    client: &Client,
    (generation, acked): (u64, u64),
) -> Result<(u64, u64), String> {
    let deadline = Duration::from_secs(10);
    let round = async {
        client
            .ping(Empty {})
            .await
            .map_err(|e| format!("ping: {e}"))?;
        let sent = client
            .send(SendReq {
                conv: CANARY_CONV,
                sender: CANARY_SENDER,
                client_msg_id: rand::random(),
                msg_type: 1,
                payload: Bytes::from_static(b"still here"),
            })
            .await
            .map_err(|e| format!("send: {e}"))?;
        let run = client
            .sync_to_end(CANARY_READER, CANARY_DEVICE, Some(generation), acked, true)
            .await
            .map_err(|e| format!("sync: {e}"))?;
        if !msg_refs(&run.events).contains(&(CANARY_CONV, sent.msg_seq)) {
            return Err(format!(
                "sync after the send did not show msg_seq {} (events {:?})",
                sent.msg_seq,
                msg_refs(&run.events)
            ));
        }
        Ok((run.generation, run.acked_sync_seq))
    };
    tokio::time::timeout(deadline, round)
        .await
        .map_err(|_| format!("no answer within {deadline:?}"))?
}

// ---------------------------------------------------------------------------
// Raw connections

/// What came back on one raw connection before the server closed it.
#[derive(Debug, Default)]
struct Transcript {
    /// Replies (hint pushes left out), in arrival order.
    replies: Vec<(u64, Response)>,
    /// The server closed the connection (EOF or reset) before the deadline.
    closed: bool,
}

/// Writes `bytes` (then half-closes, if `half_close`) while reading every
/// frame the server sends until it closes, or `limit` passes.
async fn exchange(
    addr: SocketAddr,
    bytes: Vec<u8>,
    half_close: bool,
    limit: Duration,
) -> Transcript {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let write = tokio::spawn(async move {
        // The server may close first (that is what most of these frames
        // earn); a failed write then shows up as EOF on the read side.
        let _ = writer.write_all(&bytes).await;
        if half_close {
            let _ = writer.shutdown().await;
        }
        // Keep the write half (and so the socket) open until the reader is
        // done, unless half-closed above.
        writer
    });
    let transcript = read_until_closed(&mut reader, limit).await;
    drop(write.await);
    transcript
}

async fn read_until_closed<R: AsyncReadExt + Unpin>(reader: &mut R, limit: Duration) -> Transcript {
    let codec = FrameCodec::new(u32::MAX);
    let mut buf = BytesMut::new();
    let mut transcript = Transcript::default();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        while let Some(frame) = codec
            .decode(&mut buf)
            .expect("server frames are well formed")
        {
            let response = Response::decode(frame.opcode, frame.body)
                .unwrap_or_else(|e| panic!("server sent an undecodable reply: {e}"));
            if !matches!(response, Response::Hint(_)) {
                transcript.replies.push((frame.request_id, response));
            }
        }
        match tokio::time::timeout_at(deadline, reader.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                transcript.closed = true;
                return transcript;
            }
            Ok(Ok(_)) => {}
            Err(_) => return transcript,
        }
    }
}

fn frame_bytes(frame: &Frame) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(frame, &mut out).expect("encode");
    out.to_vec()
}

// ---------------------------------------------------------------------------
// (a) random and mutated frames

/// How the server must end a connection, by its own framing rules.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Every frame was whole: it answers each and closes after our EOF.
    Clean,
    /// The stream broke framing: an error with request id 0, then close.
    StreamError(ErrorCode),
    /// The first frame was not a valid HELLO: its error, then close.
    HandshakeRefused,
}

/// What the server must answer to a byte stream.
#[derive(Debug)]
struct Expected {
    /// Request ids of the frames that get a reply (HELLO included).
    reply_ids: Vec<u64>,
    end: End,
    /// Bytes worth sending: the server stops reading at the first fatal
    /// point, and bytes it never reads would turn its close into a reset
    /// that can discard the error reply before we read it.
    send_len: usize,
    /// Whole frames the server decodes.
    frames_decoded: usize,
}

fn handshake_accepted(frame: &Frame) -> bool {
    match Request::decode(frame.opcode, frame.body.clone()) {
        Ok(Request::Hello(h)) => h.version == PROTOCOL_VERSION && h.token == TOKEN.as_bytes(),
        _ => false,
    }
}

/// Runs the server's framing and handshake rules over `stream`.
fn expect_from_stream(stream: &[u8], frame_bytes_max: u32) -> Expected {
    let codec = FrameCodec::new(frame_bytes_max);
    let mut buf = BytesMut::from(stream);
    let mut reply_ids = Vec::new();
    let mut authenticated = false;
    let mut frames_decoded = 0;
    loop {
        let consumed = stream.len() - buf.len();
        match codec.decode(&mut buf) {
            Ok(Some(frame)) => {
                frames_decoded += 1;
                if frame.request_id == 0 {
                    // Id 0 is the server's own: refused (its error, with id
                    // 0, is the stream error) and the connection closes.
                    return Expected {
                        reply_ids,
                        end: End::StreamError(ErrorCode::BadRequest),
                        send_len: stream.len() - buf.len(),
                        frames_decoded,
                    };
                }
                reply_ids.push(frame.request_id);
                if !authenticated {
                    if !handshake_accepted(&frame) {
                        return Expected {
                            reply_ids,
                            end: End::HandshakeRefused,
                            send_len: stream.len() - buf.len(),
                            frames_decoded,
                        };
                    }
                    authenticated = true;
                }
            }
            Ok(None) => {
                let end = if buf.is_empty() {
                    End::Clean
                } else {
                    End::StreamError(ErrorCode::BadRequest)
                };
                return Expected {
                    reply_ids,
                    end,
                    send_len: stream.len(),
                    frames_decoded,
                };
            }
            Err(err) => {
                assert!(err.is_stream_fatal(), "decode only fails on framing: {err}");
                return Expected {
                    reply_ids,
                    end: End::StreamError(err.code()),
                    send_len: (consumed + frame::LEN_BYTES).min(stream.len()),
                    frames_decoded,
                };
            }
        }
    }
}

/// A valid request with small random fields (uids and convs below 100).
fn random_request(rng: &mut StdRng) -> Request {
    let uid = rng.gen_range(1..100);
    let conv = rng.gen_range(1..100);
    let payload_len = rng.gen_range(0..64);
    let payload: Vec<u8> = (0..payload_len).map(|_| rng.gen()).collect();
    match rng.gen_range(0..12) {
        0 => Request::Ping(Empty {}),
        1 => Request::Join(ConvMember { conv, uid }),
        2 => Request::Send(SendReq {
            conv,
            sender: uid,
            client_msg_id: rng.gen(),
            msg_type: rng.gen(),
            payload: Bytes::from(payload),
        }),
        3 => Request::Sync(SyncReq {
            uid,
            device: rng.gen_range(1..4),
            generation: rng.gen::<bool>().then(|| rng.gen_range(0..4)),
            local_applied_seq: rng.gen_range(0..10),
            limit: rng.gen_range(0..600),
            batch_token: rng.gen::<bool>().then(|| Bytes::from(payload.clone())),
            ..SyncReq::default()
        }),
        4 => Request::Ack(AckReq {
            uid,
            device: rng.gen_range(1..4),
            generation: rng.gen_range(0..4),
            seq: rng.gen_range(0..10),
            batch_token: Bytes::from(payload),
        }),
        5 => Request::RegisterDevice(UserDevice {
            uid,
            device: rng.gen_range(1..4),
        }),
        6 => Request::Pull(PullReq {
            uid,
            per_conv_limit: rng.gen_range(0..600),
            cursors: (0..rng.gen_range(0..4))
                .map(|_| PullCursor {
                    conv: rng.gen_range(1..100),
                    after_seq: rng.gen_range(0..10),
                })
                .collect(),
        }),
        7 => Request::History(HistoryReq {
            uid,
            conv,
            before_seq: rng.gen::<bool>().then(|| rng.gen_range(0..10)),
            limit: rng.gen_range(0..300),
        }),
        8 => Request::MarkRead(MarkReadReq {
            uid,
            conv,
            read_to_seq: rng.gen_range(0..10),
        }),
        9 => Request::ConvList(ConvListReq {
            uid,
            limit: rng.gen_range(0..300),
            cursor: None,
        }),
        10 => Request::Recall(RecallReq {
            conv,
            sender: uid,
            client_msg_id: rng.gen(),
            target: rng.gen_range(0..1000),
        }),
        _ => Request::Stats(Empty {}),
    }
}

/// One frame's worth of abusive bytes.
fn abusive_frame(rng: &mut StdRng, request_id: u64) -> Vec<u8> {
    let roll = rng.gen_range(0..100);
    if roll < 10 {
        // A valid frame: the stream must go on after the bad ones.
        return frame_bytes(&random_request(rng).to_frame(request_id));
    }
    if roll < 35 {
        // Well framed, random opcode and body.
        let len = rng.gen_range(0..80);
        return frame_bytes(&Frame {
            opcode: rng.gen(),
            request_id,
            body: Bytes::from((0..len).map(|_| rng.gen()).collect::<Vec<u8>>()),
        });
    }
    if roll < 37 {
        // Raw garbage.
        let len = rng.gen_range(1..32);
        return (0..len).map(|_| rng.gen()).collect();
    }
    let mut bytes = frame_bytes(&random_request(rng).to_frame(request_id));
    for _ in 0..rng.gen_range(1..=2) {
        mutate(rng, &mut bytes);
    }
    bytes
}

/// Bit flips, truncation, length-field and opcode changes, id changes,
/// body replacement, trailing junk.
fn mutate(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    const BODY_AT: usize = frame::LEN_BYTES + 9;
    if bytes.len() < BODY_AT {
        // Already cut inside its header by an earlier mutation.
        let at = rng.gen_range(0..bytes.len());
        bytes[at] ^= 1 << rng.gen_range(0..8);
        return;
    }
    match rng.gen_range(0..100) {
        0..=44 if bytes.len() > BODY_AT => {
            let at = rng.gen_range(BODY_AT..bytes.len());
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        0..=49 => {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        50..=64 => bytes[frame::LEN_BYTES] = rng.gen(),
        65..=69 => {
            let id: u64 = rng.gen();
            bytes[frame::LEN_BYTES + 1..BODY_AT].copy_from_slice(&id.to_le_bytes());
        }
        70..=84 => {
            // A random body, length fixed up so framing stays intact.
            bytes.truncate(BODY_AT);
            let len = rng.gen_range(0..64);
            bytes.extend((0..len).map(|_| rng.gen::<u8>()));
            let frame_len = u32::try_from(bytes.len() - frame::LEN_BYTES).expect("small");
            bytes[..frame::LEN_BYTES].copy_from_slice(&frame_len.to_le_bytes());
        }
        85..=89 => {
            let at = rng.gen_range(0..bytes.len());
            bytes.truncate(at.max(1));
        }
        90..=95 => {
            let declared = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
            let new_len = match rng.gen_range(0..5) {
                0 => rng.gen_range(0..9),
                1 => declared.saturating_add(rng.gen_range(1..32)),
                2 => declared.saturating_sub(rng.gen_range(1..8)),
                3 => rng.gen_range(frame::FRAME_BYTES_MAX_DEFAULT..=u32::MAX),
                _ => rng.gen(),
            };
            bytes[..4].copy_from_slice(&new_len.to_le_bytes());
        }
        _ => {
            let len = rng.gen_range(1..8);
            bytes.extend((0..len).map(|_| rng.gen::<u8>()));
        }
    }
}

/// Checks one connection's transcript against what the server had to do.
fn check_transcript(expected: &Expected, transcript: &Transcript) -> Result<(), String> {
    if !transcript.closed {
        return Err(format!(
            "the server neither closed nor finished answering ({} of {} replies)",
            transcript.replies.len(),
            expected.reply_ids.len()
        ));
    }
    let mut want: HashMap<u64, usize> = HashMap::new();
    for id in &expected.reply_ids {
        *want.entry(*id).or_default() += 1;
    }
    if let End::StreamError(_) = expected.end {
        *want.entry(0).or_default() += 1;
    }
    let mut got: HashMap<u64, usize> = HashMap::new();
    for (id, _) in &transcript.replies {
        *got.entry(*id).or_default() += 1;
    }
    if want != got {
        return Err(format!(
            "reply ids differ: expected {want:?}, got {got:?} (end {:?})",
            expected.end
        ));
    }
    match &expected.end {
        End::Clean => {}
        End::StreamError(code) => {
            let found = transcript
                .replies
                .iter()
                .any(|(id, r)| *id == 0 && matches!(r, Response::Error(e) if e.code == *code));
            if !found {
                return Err(format!(
                    "no {code} error with request id 0 before the close"
                ));
            }
        }
        End::HandshakeRefused => match transcript.replies.last() {
            Some((_, Response::Error(e)))
                if matches!(
                    e.code,
                    ErrorCode::Unauthenticated | ErrorCode::BadRequest | ErrorCode::Unsupported
                ) => {}
            other => return Err(format!("handshake refusal expected, got {other:?}")),
        },
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_and_mutated_frames_get_their_errors_and_the_daemon_keeps_serving() {
    const FRAMES_MIN: usize = 10_000;
    const PARALLEL: usize = 16;
    let seed: u64 = std::env::var("ABUSE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("mutated frames: seed {seed} (replay with ABUSE_SEED={seed})");
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start_with(
        dir.path(),
        &[
            "--max-connections",
            "64",
            "--rate-per-s",
            "1000000",
            "--rate-burst",
            "1000000",
        ],
    );
    let canary = Canary::start(&daemon).await;
    let before = Memory::of(daemon.pid());
    let started = Instant::now();

    let mut rng = StdRng::seed_from_u64(seed);
    let (mut frames_sent, mut frames_decoded, mut connections) = (0usize, 0usize, 0usize);
    let mut ends: HashMap<&'static str, usize> = HashMap::new();
    // Until the server has had at least FRAMES_MIN whole frames to answer
    // (more are sent: a frame that breaks framing ends its connection).
    while frames_decoded < FRAMES_MIN {
        let mut wave = tokio::task::JoinSet::new();
        for _ in 0..PARALLEL {
            // One connection in ten skips the handshake.
            let mut stream = if rng.gen_range(0..10) == 0 {
                Vec::new()
            } else {
                frame_bytes(&hello(TOKEN).to_frame(1))
            };
            let mut frame_starts = Vec::new();
            for i in 0..rng.gen_range(1..80u64) {
                frame_starts.push(stream.len());
                stream.extend(abusive_frame(&mut rng, 2 + i));
            }
            let expected = expect_from_stream(&stream, frame::FRAME_BYTES_MAX_DEFAULT);
            stream.truncate(expected.send_len);
            // A frame counts as sent when at least its first byte is.
            frames_sent += frame_starts
                .iter()
                .filter(|start| **start < expected.send_len)
                .count();
            frames_decoded += expected.frames_decoded;
            connections += 1;
            let addr = daemon.addr;
            wave.spawn(async move {
                let transcript = exchange(addr, stream, true, Duration::from_secs(20)).await;
                (expected, transcript)
            });
        }
        while let Some(done) = wave.join_next().await {
            let (expected, transcript) = done.expect("connection task");
            if let Err(why) = check_transcript(&expected, &transcript) {
                panic!("seed {seed}: {why}");
            }
            let end = match expected.end {
                End::Clean => "clean",
                End::StreamError(_) => "stream error",
                End::HandshakeRefused => "handshake refused",
            };
            *ends.entry(end).or_default() += 1;
        }
    }

    let elapsed = started.elapsed();
    let after = Memory::of(daemon.pid());
    println!(
        "mutated frames: {frames_sent} frames sent ({frames_decoded} whole frames decoded by the server) \
         over {connections} connections in {:.1} s; connection ends {ends:?}",
        elapsed.as_secs_f64()
    );
    canary.finish("mutated frames").await;
    assert_memory_bounded("mutated frames", before, after);
    assert!(daemon.stop().success(), "clean shutdown after the abuse");
}

// ---------------------------------------------------------------------------
// (b) slowloris

/// Connects and, when `authenticate`, completes the handshake; then sends
/// `bytes` one byte a second until the server closes the connection.
/// Returns what came back, how long the trickle lasted, and the bytes sent.
async fn slowloris(
    addr: SocketAddr,
    authenticate: bool,
    bytes: Vec<u8>,
    limit: Duration,
) -> (Transcript, Duration, usize) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    if authenticate {
        writer
            .write_all(&frame_bytes(&hello(TOKEN).to_frame(1)))
            .await
            .expect("hello");
        let mut buf = BytesMut::new();
        let codec = FrameCodec::new(u32::MAX);
        loop {
            if let Some(frame) = codec.decode(&mut buf).expect("valid reply") {
                assert!(
                    matches!(
                        Response::decode(frame.opcode, frame.body),
                        Ok(Response::Hello(_))
                    ),
                    "handshake"
                );
                break;
            }
            assert!(
                reader.read_buf(&mut buf).await.expect("read") > 0,
                "closed during handshake"
            );
        }
    }
    let started = Instant::now();
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&sent);
    let trickle = tokio::spawn(async move {
        for byte in bytes {
            if writer.write_all(&[byte]).await.is_err() {
                break;
            }
            counter.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let transcript = read_until_closed(&mut reader, limit).await;
    let lasted = started.elapsed();
    trickle.abort();
    let sent = sent.load(Ordering::Relaxed);
    (transcript, lasted, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_sending_a_byte_a_second_are_cut_by_the_timeouts_while_others_are_served(
) {
    const IDLE_S: u64 = 2;
    const SLOW: usize = 8;
    let dir = inbox_tests::data_dir();
    // Exactly enough slots for the slow peers and the well-behaved client:
    // if they were never cut, nobody else could connect.
    let slots = (SLOW + 1).to_string();
    let daemon = Daemon::start_with(
        dir.path(),
        &[
            "--idle-timeout-s",
            &IDLE_S.to_string(),
            "--max-connections",
            &slots,
        ],
    );
    let canary = Canary::start(&daemon).await;
    let before = Memory::of(daemon.pid());
    let started = Instant::now();

    let mut slow = tokio::task::JoinSet::new();
    for i in 0..SLOW {
        // Half trickle their HELLO, half authenticate and trickle a PING.
        let authenticate = i % 2 == 1;
        let frame = if authenticate {
            Request::Ping(Empty {}).to_frame(2)
        } else {
            hello(TOKEN).to_frame(1)
        };
        let addr = daemon.addr;
        slow.spawn(async move {
            let result = slowloris(
                addr,
                authenticate,
                frame_bytes(&frame),
                Duration::from_secs(IDLE_S * 3 + 5),
            )
            .await;
            (authenticate, result)
        });
    }
    let mut trickled = 0;
    while let Some(done) = slow.join_next().await {
        let (authenticated, (transcript, lasted, sent)) = done.expect("slowloris task");
        trickled += sent;
        assert!(
            transcript.closed,
            "a slowloris connection (authenticated: {authenticated}) was still open after {lasted:?}"
        );
        assert!(
            lasted >= Duration::from_millis(IDLE_S * 1000 - 300)
                && lasted <= Duration::from_secs(IDLE_S + 4),
            "cut after {lasted:?}, expected about {IDLE_S} s"
        );
        match transcript.replies.as_slice() {
            [(0, Response::Error(e))] if e.code == ErrorCode::BadRequest => {}
            other => panic!("expected one BAD_REQUEST for the unfinished frame, got {other:?}"),
        }
    }
    let cut_after = started.elapsed();

    // The slots are free again: as many new clients as there were slow
    // peers get in and are served.
    let mut fresh = Vec::new();
    for _ in 0..SLOW {
        fresh.push(connect_with_retry(daemon.addr, Duration::from_secs(5)).await);
    }
    for client in &fresh {
        client.ping(Empty {}).await.expect("fresh client served");
    }
    let after = Memory::of(daemon.pid());
    println!(
        "slowloris: {SLOW} connections trickled {trickled} bytes, all cut within {:.1} s (idle timeout {IDLE_S} s); \
         {SLOW} fresh clients then served",
        cut_after.as_secs_f64()
    );
    drop(fresh);
    canary.finish("slowloris").await;
    assert_memory_bounded("slowloris", before, after);
}

/// Connects a client, retrying while the daemon is at its connection
/// limit (slots free up as closed connections are reaped).
async fn connect_with_retry(addr: SocketAddr, limit: Duration) -> Client {
    let deadline = Instant::now() + limit;
    loop {
        match Client::connect(addr, TOKEN).await {
            Ok(client) => return client,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("could not connect within {limit:?}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// (c) connection floods

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_flood_beyond_the_limit_is_refused_with_unavailable_and_the_daemon_recovers() {
    const SLOTS: usize = 16;
    const FLOOD: usize = 400;
    let dir = inbox_tests::data_dir();
    // Each refusal is logged as a warning; keep the test's output readable.
    let daemon = Daemon::start_binary(
        &inbox_tests::inboxd_binary(),
        dir.path(),
        &["--max-connections", &SLOTS.to_string()],
        &[("INBOXD_LOG", "error")],
    );
    let canary = Canary::start(&daemon).await;
    let before = Memory::of(daemon.pid());
    let started = Instant::now();

    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(TcpStream::connect(daemon.addr).await.expect("connect"));
    }
    // A refused connection gets UNAVAILABLE and is closed; an accepted one
    // hears nothing until it says HELLO. How long a refusal takes is not
    // the question (a loaded machine may be slow): the flood is read until
    // every connection beyond the free slots has been refused, then the
    // rest are told to stop. A deadline turns a daemon that refuses too
    // few into a failure, never a hang.
    let expected_refusals = FLOOD - (SLOTS - 1);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut waits = tokio::task::JoinSet::new();
    for (i, mut stream) in flood.into_iter().enumerate() {
        let mut stop = stop_rx.clone();
        waits.spawn(async move {
            let transcript = tokio::select! {
                transcript = read_until_closed(&mut stream, Duration::from_secs(60)) => transcript,
                _ = stop.wait_for(|stop| *stop) => Transcript::default(),
            };
            (i, stream, transcript)
        });
    }
    let (mut refused, mut accepted) = (0, Vec::new());
    while let Some(done) = waits.join_next().await {
        let (i, stream, transcript) = done.expect("flood task");
        if transcript.closed {
            match transcript.replies.as_slice() {
                [(0, Response::Error(e))] if e.code == ErrorCode::Unavailable => refused += 1,
                other => {
                    panic!("flood connection {i}: closed with {other:?}, expected UNAVAILABLE")
                }
            }
            if refused == expected_refusals {
                stop_tx.send_replace(true);
            }
        } else {
            assert!(
                transcript.replies.is_empty(),
                "accepted connections hear nothing before HELLO"
            );
            accepted.push(stream);
        }
    }
    assert_eq!(
        accepted.len(),
        SLOTS - 1,
        "every free slot (all but the well-behaved client's) is taken, and no more"
    );
    assert_eq!(refused + accepted.len(), FLOOD);

    // The accepted ones are real connections: they complete a handshake.
    for stream in &mut accepted {
        stream
            .write_all(&frame_bytes(&hello(TOKEN).to_frame(1)))
            .await
            .expect("hello");
        stream
            .write_all(&frame_bytes(&Request::Ping(Empty {}).to_frame(2)))
            .await
            .expect("ping");
        stream.shutdown().await.expect("half-close");
        let transcript = read_until_closed(stream, Duration::from_secs(5)).await;
        let ids: Vec<u64> = transcript.replies.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids,
            [1, 2],
            "hello and ping answered, then closed after our EOF"
        );
    }
    drop(accepted);

    // Recovery: once the flood is gone, every slot can be used again.
    let mut fresh = Vec::new();
    for _ in 0..SLOTS - 1 {
        fresh.push(connect_with_retry(daemon.addr, Duration::from_secs(5)).await);
    }
    for client in &fresh {
        client.ping(Empty {}).await.expect("served after the flood");
    }
    let elapsed = started.elapsed();
    let after = Memory::of(daemon.pid());
    println!(
        "connection flood: {FLOOD} connections at a limit of {SLOTS}: {refused} refused with UNAVAILABLE, \
         {} accepted; {} fresh clients served after it, {:.1} s",
        SLOTS - 1,
        fresh.len(),
        elapsed.as_secs_f64()
    );
    drop(fresh);
    canary.finish("connection flood").await;
    assert_memory_bounded("connection flood", before, after);
}

// ---------------------------------------------------------------------------
// (d) oversized payloads

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_over_the_limit_gets_too_large_changes_nothing_and_the_connection_goes_on() {
    const PAYLOAD_BYTES_MAX: usize = 64 << 10;
    const CONV: u64 = 7;
    const OVERSIZED: usize = 200;
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let canary = Canary::start(&daemon).await;
    let client = Arc::new(daemon.client().await);
    client
        .join(ConvMember { conv: CONV, uid: 1 })
        .await
        .expect("join");
    let first = inbox_tests::send_text(&client, CONV, 1, "before").await;
    let before = Memory::of(daemon.pid());
    let started = Instant::now();

    // Payloads from one byte over the limit up to what a 1 MiB frame holds,
    // many at once.
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..OVERSIZED {
        let client = Arc::clone(&client);
        let len = PAYLOAD_BYTES_MAX + 1 + i * ((900 << 10) / OVERSIZED);
        sends.spawn(async move {
            client
                .send(SendReq {
                    conv: CONV,
                    sender: 1,
                    client_msg_id: 1_000_000 + i as u128,
                    msg_type: 1,
                    payload: Bytes::from(vec![0xAB; len]),
                })
                .await
        });
    }
    while let Some(done) = sends.join_next().await {
        let err = done
            .expect("send task")
            .expect_err("an oversized payload is refused");
        assert_eq!(err.code(), Some(ErrorCode::TooLarge), "{err}");
        let inbox_server::client::ClientError::Server { detail, .. } = err else {
            unreachable!("checked above")
        };
        assert_eq!(detail, PAYLOAD_BYTES_MAX as u64, "detail is the limit");
    }

    // Nothing changed: the one message is all there is, and the next send
    // takes the very next msg_seq (no seq was burnt on a refusal).
    let history = inbox_tests::all_history(&client, 1, CONV).await;
    let payloads: Vec<&[u8]> = history
        .iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .map(|m| m.payload.as_ref())
        .collect();
    assert_eq!(payloads, [b"before".as_slice()]);
    let next = inbox_tests::send_text(&client, CONV, 1, "after").await;
    assert_eq!(
        next.msg_seq,
        first.msg_seq + 1,
        "the refusals allocated no msg_seq"
    );
    // The refusals never reached the log: a retry with one of their
    // idempotency keys is a fresh send, not a duplicate.
    let retried = client
        .send(SendReq {
            conv: CONV,
            sender: 1,
            client_msg_id: 1_000_000,
            msg_type: 1,
            payload: Bytes::from_static(b"small now"),
        })
        .await
        .expect("retry with a small payload");
    assert!(!retried.duplicate);
    assert_eq!(retried.msg_seq, next.msg_seq + 1);

    let after = Memory::of(daemon.pid());
    println!(
        "oversized payloads: {OVERSIZED} sends of {} KiB .. {} KiB refused with TOO_LARGE in {:.1} s",
        (PAYLOAD_BYTES_MAX + 1) >> 10,
        (PAYLOAD_BYTES_MAX + 1 + (OVERSIZED - 1) * ((900 << 10) / OVERSIZED)) >> 10,
        started.elapsed().as_secs_f64()
    );
    canary.finish("oversized payloads").await;
    assert_memory_bounded("oversized payloads", before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_over_the_frame_limit_gets_too_large_and_the_connection_closes() {
    const CONNECTIONS: usize = 64;
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let canary = Canary::start(&daemon).await;
    let before = Memory::of(daemon.pid());
    let limit = frame::FRAME_BYTES_MAX_DEFAULT;

    let mut conns = tokio::task::JoinSet::new();
    for i in 0..CONNECTIONS {
        let addr = daemon.addr;
        // From one byte over the limit to the largest u32.
        let declared = match i % 4 {
            0 => limit + 1,
            1 => limit * 2,
            2 => u32::MAX / 2 + i as u32,
            _ => u32::MAX,
        };
        conns.spawn(async move {
            // Only the header: the server must refuse on the declared length
            // alone, before buffering a byte of the body (and bytes it never
            // reads would turn its close into a reset).
            let mut stream = frame_bytes(&hello(TOKEN).to_frame(1));
            stream.extend_from_slice(&declared.to_le_bytes());
            stream.push(Op::Send as u8);
            stream.extend_from_slice(&9u64.to_le_bytes());
            let transcript = exchange(addr, stream, false, Duration::from_secs(10)).await;
            (declared, transcript)
        });
    }
    while let Some(done) = conns.join_next().await {
        let (declared, transcript) = done.expect("connection task");
        assert!(
            transcript.closed,
            "a {declared}-byte frame left the connection open"
        );
        match transcript.replies.as_slice() {
            [(1, Response::Hello(_)), (0, Response::Error(e))] => {
                assert_eq!(e.code, ErrorCode::TooLarge);
                assert_eq!(e.detail, u64::from(limit), "detail is the frame limit");
            }
            other => panic!("declared {declared}: expected HELLO then TOO_LARGE, got {other:?}"),
        }
    }
    let after = Memory::of(daemon.pid());
    println!("oversized frames: {CONNECTIONS} frames declaring {} .. {} bytes refused with TOO_LARGE, connections closed", limit + 1, u32::MAX);
    canary.finish("oversized frames").await;
    assert_memory_bounded("oversized frames", before, after);
}
