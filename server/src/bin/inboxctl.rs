//! `inboxctl`: the inboxd command line for humans and scripts.
//!
//! Every subcommand is one or a few client calls; `--json` prints the
//! reply as one JSON object per line, otherwise a readable `key: value`
//! form of the same object. Exit code 1 on a server error, printed with
//! its code. Membership changes go to the group's leader: a follower's
//! `NOT_LEADER` names it, and the request is sent there.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use inbox_server::client::{
    leader_addr, CatchUpOptions, Client, ClientError, ClientTls, LEADER_HOPS_MAX,
};
use inbox_wire::*;
use serde_json::{json, Map, Value};

#[derive(Parser)]
#[command(name = "inboxctl", version, about = "Talk to an inboxd server")]
struct Cli {
    /// Server address.
    #[arg(
        long,
        env = "INBOXCTL_ADDR",
        default_value = "127.0.0.1:7070",
        global = true
    )]
    addr: SocketAddr,
    /// Shared secret (prefer --token-file).
    #[arg(long, env = "INBOXCTL_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// File holding the shared secret [default: ./data/token, or
    /// ./data/admin_token for stats, explain, compact, checkpoint and
    /// cluster].
    #[arg(long, env = "INBOXCTL_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// PEM CA certificate(s) to trust: connect over TLS.
    #[arg(long, env = "INBOXCTL_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,
    /// Name the server's certificate must carry [default: the address's IP].
    #[arg(
        long,
        env = "INBOXCTL_TLS_SERVER_NAME",
        global = true,
        requires = "tls_ca"
    )]
    tls_server_name: Option<String>,
    /// PEM client certificate, for servers that require mutual TLS.
    #[arg(long, env = "INBOXCTL_TLS_CERT", global = true, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "INBOXCTL_TLS_KEY", global = true, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Add a user to a conversation.
    Join {
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        uid: u64,
    },
    /// Remove a user from a conversation.
    Leave {
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        uid: u64,
    },
    /// Send a message; returns once it is durable.
    Send {
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        from: u64,
        /// Message text (sent as UTF-8 bytes).
        #[arg(long)]
        text: String,
        #[arg(long, default_value_t = 1)]
        msg_type: u16,
        /// Idempotency key (hex, up to 32 digits) [default: random].
        #[arg(long)]
        client_msg_id: Option<String>,
    },
    /// Recall a message.
    Recall {
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        msg_id: u64,
        #[arg(long)]
        client_msg_id: Option<String>,
    },
    /// Edit a message.
    Edit {
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        msg_id: u64,
        #[arg(long)]
        text: String,
        #[arg(long)]
        client_msg_id: Option<String>,
    },
    /// Register a device for a user.
    RegisterDevice {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        device: u64,
    },
    /// Revoke a device.
    RevokeDevice {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        device: u64,
    },
    /// List a user's devices.
    Devices {
        #[arg(long)]
        uid: u64,
    },
    /// Sync a device's event stream (every page of one batch).
    ///
    /// Without --generation the device's current generation and ACK are
    /// looked up and used, like a device that applied everything it ACKed.
    Sync {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        device: u64,
        #[arg(long)]
        generation: Option<u64>,
        /// The highest sync_seq the device applied [default: its ACK].
        #[arg(long)]
        local: Option<u64>,
        /// ACK what was applied, each ACK carried by the next page's SYNC
        /// and the last one on its own (and finish a recovery lease).
        #[arg(long)]
        ack: bool,
        /// With --ack: ACK after every this many pages and after the last
        /// [default: 1, every page: each ACK rides on the next SYNC].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        ack_every: Option<u32>,
        /// Ask for RESET_REQUIRED instead of replaying more than this many
        /// events (at least 1).
        #[arg(long)]
        max_replay: Option<u64>,
        /// Events without their summaries.
        #[arg(long)]
        without_summaries: bool,
        /// Events as their ids only, with no summary field on the wire.
        #[arg(long)]
        ids_only: bool,
    },
    /// ACK a sync_seq with the batch token a sync printed.
    Ack {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        device: u64,
        #[arg(long)]
        generation: u64,
        #[arg(long)]
        seq: u64,
        /// Hex, as printed by `sync`.
        #[arg(long)]
        batch_token: String,
    },
    /// Pull messages of conversations after cursors.
    Pull {
        #[arg(long)]
        uid: u64,
        /// CONV or CONV:AFTER_SEQ, repeatable.
        #[arg(long = "conv", required = true)]
        convs: Vec<String>,
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// Page a conversation's history backwards.
    History {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        before: Option<u64>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Mark a conversation read up to a msg_seq.
    Read {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        to: u64,
    },
    /// A user's conversation list, by last activity.
    ConvList {
        #[arg(long)]
        uid: u64,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// A conversation's mode (fan-out or large group), durable head and
    /// member count; with --uid, that member's dirty marker.
    Conv {
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        uid: Option<u64>,
    },
    /// A user's dirty large groups (marker target and version).
    Dirty {
        #[arg(long)]
        uid: u64,
    },
    /// Clear a large group's marker at the version read from `dirty`.
    ClearDirty {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        conv: u64,
        #[arg(long)]
        version: u64,
    },
    /// Start a snapshot for a device and print it (pages once ready).
    Snapshot {
        #[arg(long)]
        uid: u64,
        #[arg(long)]
        device: u64,
        /// Acknowledge the snapshot once its pages are read.
        #[arg(long)]
        ack: bool,
    },
    /// Server and engine counters.
    Stats {
        /// Also the daemon's memory by structure: bytes live (entries) and
        /// allocated (capacity and overhead), and the walk's cost.
        #[arg(long)]
        memory: bool,
    },
    /// What holds a user's events (or a segment) back from compaction.
    /// With --conv: which mode a conversation is in (as `conv`).
    Explain {
        #[arg(long, required_unless_present_any = ["segment", "conv"])]
        uid: Option<u64>,
        #[arg(long)]
        conv: Option<u64>,
        /// STREAM:SEGMENT_ID, e.g. evt:3.
        #[arg(long)]
        segment: Option<String>,
    },
    /// Run one compaction pass now.
    Compact,
    /// Write an index checkpoint now.
    Checkpoint,
    /// A replicated group, as the node asked sees it.
    Cluster {
        #[command(subcommand)]
        action: ClusterCommand,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Role, term, leader, log and applied index, and the members (on the
    /// leader: each one's matched index and lag). Any member answers.
    Status,
    /// Make a node a voter of the group (the leader runs it).
    ///
    /// The node is added as a learner, catches up (by snapshot if the
    /// leader's log no longer holds what it lacks), then votes (joint
    /// consensus). Start it first, on an empty data directory: `inboxd
    /// serve --node-id ID --raft-listen RAFT_ADDR --listen CLIENT_ADDR
    /// --peers ... --bootstrap=false`. Sent to the leader (a follower's
    /// NOT_LEADER is followed); waits up to 60 s and prints the leader's
    /// status. Adding a voter again at the same addresses changes nothing.
    #[command(name = "add-node")]
    AddNode {
        /// The new node's id (not 0, not a member's).
        #[arg(value_name = "ID")]
        id: u64,
        /// Where its raft port listens, as the other members reach it.
        #[arg(value_name = "RAFT_ADDR")]
        raft_addr: String,
        /// Where its clients reach it (what NOT_LEADER names).
        #[arg(value_name = "CLIENT_ADDR")]
        client_addr: String,
    },
    /// Take a member out of the group (the leader runs it).
    ///
    /// E.g. a dead machine, before adding its replacement. A voter is made
    /// a learner first, so that a removed member that still runs stops
    /// standing for election (it answers NOT_LEADER; stop it afterwards).
    /// Not the last voter, nor the leader itself (stop the leader; the
    /// next one can remove it). Sent to the leader (a follower's
    /// NOT_LEADER is followed); waits up to 60 s and prints the leader's
    /// status.
    #[command(name = "remove-node")]
    RemoveNode {
        /// The member's id.
        #[arg(value_name = "ID")]
        id: u64,
    },
}

/// What went wrong, for the exit message.
enum Failure {
    Usage(String),
    Client(ClientError),
}

impl From<ClientError> for Failure {
    fn from(err: ClientError) -> Self {
        Self::Client(err)
    }
}

fn parse_cmid(text: Option<&str>) -> Result<u128, Failure> {
    match text {
        None => Ok(rand::random()),
        Some(hex) => u128::from_str_radix(hex.trim_start_matches("0x"), 16)
            .map_err(|e| Failure::Usage(format!("--client-msg-id {hex:?}: {e}"))),
    }
}

fn unhex(text: &str) -> Result<Bytes, Failure> {
    if text.len() % 2 != 0 {
        return Err(Failure::Usage(
            "hex must have an even number of digits".into(),
        ));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map(Bytes::from)
        .map_err(|e| Failure::Usage(format!("bad hex: {e}")))
}

/// A reply as JSON, with the wire crate's field names.
fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", scalar(v)))
            .collect::<Vec<_>>()
            .join(" "),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(scalar).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// The text form: one `key: value` line per field; a list of objects gets
/// one indented line per item.
fn render_text(value: &Value) -> String {
    let Value::Object(map) = value else {
        return scalar(value);
    };
    let mut out = String::new();
    for (key, value) in map {
        match value {
            Value::Array(items) if items.iter().any(Value::is_object) => {
                out.push_str(&format!("{key}: {}\n", items.len()));
                for item in items {
                    out.push_str(&format!("  - {}\n", scalar(item)));
                }
            }
            other => out.push_str(&format!("{key}: {}\n", scalar(other))),
        }
    }
    out.trim_end().to_string()
}

/// How to open a connection: the token, and TLS as the flags say (the
/// server name is `--tls-server-name`, or the address's IP).
struct Dial<'a> {
    cli: &'a Cli,
    token: Bytes,
}

impl Dial<'_> {
    fn tls(&self, addr: SocketAddr) -> Result<Option<ClientTls>, String> {
        let Some(ca) = &self.cli.tls_ca else {
            return Ok(None);
        };
        let name = self
            .cli
            .tls_server_name
            .clone()
            .unwrap_or_else(|| addr.ip().to_string());
        let identity = self
            .cli
            .tls_cert
            .as_deref()
            .zip(self.cli.tls_key.as_deref());
        ClientTls::new(ca, &name, identity)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    async fn connect(&self, addr: SocketAddr) -> Result<Client, Failure> {
        let tls = self.tls(addr).map_err(Failure::Usage)?;
        Ok(Client::connect_with(addr, self.token.clone(), tls.as_ref()).await?)
    }
}

/// Sends `request` through `client`, and again to the leader a
/// `NOT_LEADER` names (at most [`LEADER_HOPS_MAX`] times).
async fn at_leader(
    dial: &Dial<'_>,
    client: &Client,
    request: Request,
) -> Result<Response, Failure> {
    let mut answer = client.call(request.clone()).await;
    for _ in 0..LEADER_HOPS_MAX {
        let Some(leader) = answer.as_ref().err().and_then(leader_addr) else {
            break;
        };
        answer = dial.connect(leader).await?.call(request.clone()).await;
    }
    Ok(answer?)
}

/// A `CLUSTER_STATUS` as JSON, with each member's lag on the leader.
fn status_json(status: &ClusterStatus) -> Value {
    let mut value = to_json(status);
    if let Some(members) = value["members"].as_array_mut() {
        for (json, member) in members.iter_mut().zip(&status.members) {
            if let Some(matched) = member.matched_index {
                json["lag"] = json!(status.last_log_index.saturating_sub(matched));
            }
        }
    }
    value
}

async fn run(cli: &Cli, dial: &Dial<'_>, client: &Client) -> Result<Value, Failure> {
    Ok(match &cli.command {
        Command::Join { conv, uid } => {
            let r = client
                .join(ConvMember {
                    conv: *conv,
                    uid: *uid,
                })
                .await?;
            let mut value = to_json(&r);
            value["conv"] = json!(conv);
            value["uid"] = json!(uid);
            value
        }
        Command::Leave { conv, uid } => {
            let r = client
                .leave(ConvMember {
                    conv: *conv,
                    uid: *uid,
                })
                .await?;
            let mut value = to_json(&r);
            value["conv"] = json!(conv);
            value["uid"] = json!(uid);
            value
        }
        Command::Send {
            conv,
            from,
            text,
            msg_type,
            client_msg_id,
        } => {
            let r = client
                .send(SendReq {
                    conv: *conv,
                    sender: *from,
                    client_msg_id: parse_cmid(client_msg_id.as_deref())?,
                    msg_type: *msg_type,
                    payload: Bytes::from(text.clone().into_bytes()),
                })
                .await?;
            to_json(&r)
        }
        Command::Recall {
            conv,
            from,
            msg_id,
            client_msg_id,
        } => {
            let r = client
                .recall(RecallReq {
                    conv: *conv,
                    sender: *from,
                    client_msg_id: parse_cmid(client_msg_id.as_deref())?,
                    target: *msg_id,
                })
                .await?;
            to_json(&r)
        }
        Command::Edit {
            conv,
            from,
            msg_id,
            text,
            client_msg_id,
        } => {
            let r = client
                .edit(EditReq {
                    conv: *conv,
                    sender: *from,
                    client_msg_id: parse_cmid(client_msg_id.as_deref())?,
                    target: *msg_id,
                    payload: Bytes::from(text.clone().into_bytes()),
                })
                .await?;
            to_json(&r)
        }
        Command::RegisterDevice { uid, device } => {
            let r = client
                .register_device(UserDevice {
                    uid: *uid,
                    device: *device,
                })
                .await?;
            to_json(&r)
        }
        Command::RevokeDevice { uid, device } => to_json(
            &client
                .revoke_device(UserDevice {
                    uid: *uid,
                    device: *device,
                })
                .await?,
        ),
        Command::Devices { uid } => {
            let r = client.devices(UserReq { uid: *uid }).await?;
            to_json(&r)
        }
        Command::Sync {
            uid,
            device,
            generation,
            local,
            ack,
            ack_every,
            max_replay,
            without_summaries,
            ids_only,
        } => {
            let (generation, local) = match generation {
                Some(generation) => (Some(*generation), local.unwrap_or(0)),
                None => {
                    let known = client.devices(UserReq { uid: *uid }).await?;
                    match known.devices.iter().find(|d| d.device == *device) {
                        Some(d) => (Some(d.generation), local.unwrap_or(d.acked_sync_seq)),
                        None => (None, local.unwrap_or(0)),
                    }
                }
            };
            let options = CatchUpOptions {
                limit: 0,
                ack_every: ack_every.unwrap_or(0),
                max_replay: *max_replay,
                without_summaries: *without_summaries,
                ids_only: *ids_only,
                // inboxctl ships with the daemon, which takes the field.
                ack_in_sync: true,
            };
            let run = client
                .catch_up(*uid, *device, generation, local, *ack, options)
                .await?;
            let mut value = json!({
                "events": to_json(&run.events),
                "pages": run.pages,
                "generation": run.generation,
                "batch_hwm": run.batch_hwm,
                "acked_sync_seq": run.acked_sync_seq,
                "acks": run.acks,
            });
            if let Some(lease) = run.lease {
                value["lease"] = to_json(&lease);
            }
            value
        }
        Command::Ack {
            uid,
            device,
            generation,
            seq,
            batch_token,
        } => {
            let r = client
                .ack(AckReq {
                    uid: *uid,
                    device: *device,
                    generation: *generation,
                    seq: *seq,
                    batch_token: unhex(batch_token)?,
                })
                .await?;
            to_json(&r)
        }
        Command::Pull { uid, convs, limit } => {
            let mut cursors = Vec::new();
            for text in convs {
                let (conv, after) = text.split_once(':').unwrap_or((text, "0"));
                let parse = |s: &str| {
                    s.parse::<u64>()
                        .map_err(|e| Failure::Usage(format!("--conv {text:?}: {e}")))
                };
                cursors.push(PullCursor {
                    conv: parse(conv)?,
                    after_seq: parse(after)?,
                });
            }
            let r = client
                .pull(PullReq {
                    uid: *uid,
                    per_conv_limit: *limit,
                    cursors,
                })
                .await?;
            to_json(&r)
        }
        Command::History {
            uid,
            conv,
            before,
            limit,
        } => {
            let r = client
                .history(HistoryReq {
                    uid: *uid,
                    conv: *conv,
                    before_seq: *before,
                    limit: *limit,
                })
                .await?;
            to_json(&r)
        }
        Command::Read { uid, conv, to } => {
            let r = client
                .mark_read(MarkReadReq {
                    uid: *uid,
                    conv: *conv,
                    read_to_seq: *to,
                })
                .await?;
            let mut value = to_json(&r);
            value["conv"] = json!(conv);
            value
        }
        Command::ConvList { uid, limit } => {
            let r = client
                .conv_list(ConvListReq {
                    uid: *uid,
                    limit: *limit,
                    cursor: None,
                })
                .await?;
            to_json(&r)
        }
        Command::Conv { conv, uid } => conv_mode(client, *conv, *uid).await?,
        Command::Dirty { uid } => to_json(&client.dirty(UserReq { uid: *uid }).await?),
        Command::ClearDirty { uid, conv, version } => to_json(
            &client
                .clear_dirty(ClearDirtyReq {
                    uid: *uid,
                    conv: *conv,
                    version: *version,
                })
                .await?,
        ),
        Command::Snapshot { uid, device, ack } => {
            let info = client
                .begin_snapshot(UserDevice {
                    uid: *uid,
                    device: *device,
                })
                .await?;
            let mut value = to_json(&info);
            if info.state == SnapshotState::Ready {
                let mut convs = Vec::new();
                let mut messages = Vec::new();
                for page in 0..info.pages {
                    let p = client
                        .snapshot_page(SnapshotPageReq {
                            uid: *uid,
                            snapshot_id: info.snapshot_id,
                            page,
                        })
                        .await?;
                    convs.extend(p.convs.iter().map(to_json));
                    messages.extend(p.messages.iter().map(to_json));
                }
                value["convs"] = json!(convs);
                value["messages"] = json!(messages);
                if *ack {
                    let d = client
                        .ack_snapshot(AckSnapshotReq {
                            uid: *uid,
                            device: *device,
                            snapshot_id: info.snapshot_id,
                            generation: info.generation,
                        })
                        .await?;
                    value["device"] = to_json(&d);
                }
            }
            value
        }
        Command::Stats { memory } => {
            let mut value = to_json(&client.stats(Empty {}).await?);
            if *memory {
                value["memory"] = to_json(&client.memory(Empty {}).await?);
            }
            value
        }
        Command::Explain { uid, conv, segment } => match (uid, segment) {
            (uid, None) if conv.is_some() => {
                conv_mode(client, conv.unwrap_or_default(), *uid).await?
            }
            (_, Some(text)) => {
                let (stream, id) = text
                    .split_once(':')
                    .ok_or_else(|| Failure::Usage("--segment wants STREAM:ID".into()))?;
                let id = id
                    .parse()
                    .map_err(|e| Failure::Usage(format!("--segment {text:?}: {e}")))?;
                let r = client
                    .explain_segment(SegmentReq {
                        stream: stream.to_string(),
                        segment: id,
                    })
                    .await?;
                to_json(&r)
            }
            (Some(uid), None) => to_json(&client.explain(UserReq { uid: *uid }).await?),
            (None, None) => return Err(Failure::Usage("give --uid or --segment".into())),
        },
        Command::Compact => to_json(&client.compact(Empty {}).await?),
        Command::Cluster { action } => cluster(dial, client, action).await?,
        Command::Checkpoint => {
            client.checkpoint(Empty {}).await?;
            Value::Object(Map::from_iter([(
                "checkpoint".to_string(),
                json!("written"),
            )]))
        }
    })
}

/// `inboxctl cluster ...`: the status from the member asked; membership
/// changes from the leader.
async fn cluster(
    dial: &Dial<'_>,
    client: &Client,
    action: &ClusterCommand,
) -> Result<Value, Failure> {
    let request = match action {
        ClusterCommand::Status => return Ok(status_json(&client.cluster_status(Empty {}).await?)),
        ClusterCommand::AddNode {
            id,
            raft_addr,
            client_addr,
        } => Request::ClusterAddNode(AddNodeReq {
            node_id: *id,
            raft_addr: raft_addr.clone(),
            client_addr: client_addr.clone(),
        }),
        ClusterCommand::RemoveNode { id } => {
            Request::ClusterRemoveNode(RemoveNodeReq { node_id: *id })
        }
    };
    match at_leader(dial, client, request).await? {
        Response::ClusterAddNode(status) | Response::ClusterRemoveNode(status) => {
            Ok(status_json(&status))
        }
        other => Err(Failure::Client(ClientError::Protocol(format!(
            "unexpected reply opcode 0x{:02x}",
            other.opcode()
        )))),
    }
}

/// `CONV_MODE` as JSON, with the mode named in words.
async fn conv_mode(client: &Client, conv: u64, uid: Option<u64>) -> Result<Value, Failure> {
    let r = client.conv_mode(ConvModeReq { conv, uid }).await?;
    let mut value = to_json(&r);
    value["mode"] = json!(match r.switch_seq {
        Some(seq) => format!("large group since msg_seq {seq}: no per-member events above it"),
        None => "fan-out: one event per member per message".to_string(),
    });
    Ok(value)
}

/// Commands the server runs only for the admin token.
fn is_admin(command: &Command) -> bool {
    matches!(
        command,
        Command::Stats { .. }
            | Command::Explain { .. }
            | Command::Compact
            | Command::Checkpoint
            | Command::Cluster { .. }
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let token = match (&cli.token, &cli.token_file) {
        (Some(token), _) => Bytes::from(token.clone().into_bytes()),
        (None, file) => {
            let default = if is_admin(&cli.command) {
                "./data/admin_token"
            } else {
                "./data/token"
            };
            let path = file.clone().unwrap_or_else(|| PathBuf::from(default));
            match inbox_server::config::read_token(&path) {
                Ok(token) => token,
                Err(err) => {
                    eprintln!("inboxctl: cannot read the token from {}: {err} (use --token or --token-file)", path.display());
                    return ExitCode::from(2);
                }
            }
        }
    };
    let dial = Dial { cli: &cli, token };
    if let Err(err) = dial.tls(cli.addr) {
        eprintln!("inboxctl: {err}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("inboxctl: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let client = dial.connect(cli.addr).await?;
        run(&cli, &dial, &client).await
    });
    match result {
        Ok(value) => {
            if cli.json {
                println!("{value}");
            } else {
                println!("{}", render_text(&value));
            }
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(message)) => {
            eprintln!("inboxctl: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Client(err)) => {
            if cli.json {
                let (code, detail, leader_addr) = match &err {
                    ClientError::Server {
                        code,
                        detail,
                        leader_addr,
                        ..
                    } => (code.to_string(), *detail, leader_addr.clone()),
                    _ => ("CLIENT".to_string(), 0, None),
                };
                println!(
                    "{}",
                    json!({ "error": code, "detail": detail, "message": err.to_string(), "leader_addr": leader_addr })
                );
            } else {
                eprintln!("inboxctl: {err}");
            }
            ExitCode::FAILURE
        }
    }
}
