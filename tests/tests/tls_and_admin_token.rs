//! TLS on every listener (plain and mutual), the admin token, and the
//! refusal to start on a token file others can read.
//!
//! Certificates are made here with rcgen: a CA, a server certificate for
//! `127.0.0.1` and `localhost`, and a client certificate, all signed by
//! the CA, plus a second, unrelated CA.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use inbox_server::client::{Client, ClientTls};
use inbox_tests::{inboxd_binary, Daemon, ADMIN_TOKEN, TOKEN};
use inbox_wire::{Empty, ErrorCode, UserReq};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// PEM files for one test: `ca.pem`, `server.pem`/`server.key`,
/// `client.pem`/`client.key`, and `other-ca.pem` (trusts nothing here).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, ca_key) = make_ca("inboxd test CA");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        let (other, _) = make_ca("unrelated CA");
        std::fs::write(dir.path().join("other-ca.pem"), other.pem()).unwrap();
        for (name, sans, usage) in [
            (
                "server",
                vec!["127.0.0.1".to_string(), "localhost".to_string()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            (
                "client",
                vec!["device-gateway".to_string()],
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
        ] {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(sans).expect("params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca, &ca_key).expect("sign");
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn client(&self, ca: &str, identity: bool) -> ClientTls {
        let (cert, key) = (self.path("client.pem"), self.path("client.key"));
        let identity = identity.then_some((cert.as_path(), key.as_path()));
        ClientTls::new(&self.path(ca), "127.0.0.1", identity).expect("client TLS config")
    }
}

fn make_ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("self-sign CA");
    (cert, key)
}

fn start_tls(pki: &Pki, data: &Path, mutual: bool) -> Daemon {
    let (cert, key, ca) = (
        pki.arg("server.pem"),
        pki.arg("server.key"),
        pki.arg("ca.pem"),
    );
    let mut flags = vec!["--tls-cert", &cert, "--tls-key", &key];
    if mutual {
        flags.extend(["--tls-client-ca", &ca]);
    }
    Daemon::start_with(data, &flags)
}

#[tokio::test]
async fn tls_client_round_trips_and_plain_tcp_is_not_served() {
    let pki = Pki::new();
    let data = inbox_tests::data_dir();
    let daemon = start_tls(&pki, data.path(), false);

    let client = Client::connect_with(daemon.addr, TOKEN, Some(&pki.client("ca.pem", false)))
        .await
        .expect("TLS connect");
    client.ping(Empty {}).await.expect("ping over TLS");
    let uid = 7;
    let generation = inbox_tests::register(&client, uid, 1).await;
    assert!(generation > 0);

    let plain = Client::connect(daemon.addr, TOKEN).await;
    assert!(
        plain.is_err(),
        "a plain-TCP HELLO on a TLS port is not served"
    );

    let untrusted =
        Client::connect_with(daemon.addr, TOKEN, Some(&pki.client("other-ca.pem", false))).await;
    let err = untrusted
        .err()
        .expect("a client that does not trust the server's CA stops");
    assert!(err.to_string().contains("TLS handshake"), "{err}");
}

#[tokio::test]
async fn mutual_tls_needs_a_client_certificate_from_the_ca() {
    let pki = Pki::new();
    let data = inbox_tests::data_dir();
    let daemon = start_tls(&pki, data.path(), true);

    let with_cert = Client::connect_with(daemon.addr, TOKEN, Some(&pki.client("ca.pem", true)))
        .await
        .expect("client with a certificate from the CA");
    with_cert
        .ping(Empty {})
        .await
        .expect("ping over mutual TLS");

    // TLS 1.3 finishes the client's side of the handshake before the server
    // checks the certificate, so the refusal shows at the HELLO.
    let without =
        Client::connect_with(daemon.addr, TOKEN, Some(&pki.client("ca.pem", false))).await;
    assert!(without.is_err(), "no client certificate, no service");
}

#[tokio::test]
async fn metrics_port_speaks_tls_too() {
    let pki = Pki::new();
    let data = inbox_tests::data_dir();
    let daemon = start_tls(&pki, data.path(), false);

    let tcp = tokio::net::TcpStream::connect(daemon.metrics_addr)
        .await
        .unwrap();
    let mut tls = pki
        .client("ca.pem", false)
        .connect(tcp)
        .await
        .expect("TLS to the metrics port");
    tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    let _ = tls.read_to_string(&mut text).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("inboxd_connections_open"), "{text}");
}

#[tokio::test]
async fn admin_requests_need_the_admin_token() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let user = daemon.user_client().await;
    let admin = daemon.client().await;

    let refusals = [
        user.stats(Empty {}).await.err(),
        user.compact(Empty {}).await.err(),
        user.checkpoint(Empty {}).await.err(),
        user.explain(UserReq { uid: 1 }).await.err(),
    ];
    for refusal in refusals {
        let err = refusal.expect("admin request with the client token");
        assert_eq!(err.code(), Some(ErrorCode::Forbidden), "{err}");
    }
    // The ordinary connection goes on serving ordinary requests.
    user.ping(Empty {}).await.expect("still connected");
    inbox_tests::register(&user, 1, 1).await;

    admin
        .stats(Empty {})
        .await
        .expect("stats with the admin token");
    admin
        .checkpoint(Empty {})
        .await
        .expect("checkpoint with the admin token");
    admin
        .explain(UserReq { uid: 1 })
        .await
        .expect("explain with the admin token");
    inbox_tests::register(&admin, 2, 1).await;
}

/// Runs `inboxd serve` expecting it to refuse to start; returns stderr.
fn refused_start(data: &Path, extra: &[&str]) -> String {
    let output = Command::new(inboxd_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(extra)
        .env("INBOXD_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run inboxd");
    assert!(!output.status.success(), "inboxd started: {output:?}");
    assert!(
        output.stdout.is_empty(),
        "inboxd said it listens: {output:?}"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_token_file_others_can_read_is_refused_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let data = inbox_tests::data_dir();
    let token = data.path().join("client.token");
    std::fs::write(&token, "open-secret\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let token_arg = token.display().to_string();
    let stderr = refused_start(data.path(), &["--token-file", &token_arg]);
    assert!(stderr.contains(&token_arg), "names the file: {stderr}");
    assert!(stderr.contains("chmod 600"), "says the fix: {stderr}");

    // The generated admin token, loosened after the fact, is refused too.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let admin = data.path().join("admin_token");
    std::fs::write(&admin, "admin-secret\n").unwrap();
    std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o640)).unwrap();
    let stderr = refused_start(data.path(), &["--token-file", &token_arg]);
    assert!(
        stderr.contains("admin_token"),
        "names the admin file: {stderr}"
    );
}

#[test]
fn the_same_secret_for_both_tokens_is_refused() {
    let data = inbox_tests::data_dir();
    let stderr = refused_start(data.path(), &["--token", "same", "--admin-token", "same"]);
    assert!(stderr.contains("admin token must differ"), "{stderr}");
}

#[test]
fn inboxctl_speaks_tls_and_reads_the_admin_token() {
    let pki = Pki::new();
    let data = inbox_tests::data_dir();
    let daemon = start_tls(&pki, data.path(), true);
    let inboxctl = inboxd_binary().with_file_name("inboxctl");
    let run = |args: &[&str], token: &str| {
        Command::new(&inboxctl)
            .args([
                "--addr",
                &daemon.addr.to_string(),
                "--token",
                token,
                "--json",
            ])
            .args(["--tls-ca", &pki.arg("ca.pem")])
            .args([
                "--tls-cert",
                &pki.arg("client.pem"),
                "--tls-key",
                &pki.arg("client.key"),
            ])
            .args(args)
            .output()
            .expect("run inboxctl")
    };
    let stats = run(&["stats"], ADMIN_TOKEN);
    assert!(stats.status.success(), "{stats:?}");
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(text.contains("\"messages\""), "{text}");
    let memory = run(&["stats", "--memory"], ADMIN_TOKEN);
    assert!(memory.status.success(), "{memory:?}");
    let text = String::from_utf8_lossy(&memory.stdout);
    assert!(
        text.contains("\"idempotency\"") && text.contains("\"allocated\""),
        "{text}"
    );

    let forbidden = run(&["stats"], TOKEN);
    assert!(!forbidden.status.success());
    let text = String::from_utf8_lossy(&forbidden.stdout);
    assert!(text.contains("FORBIDDEN"), "{text}");
}
