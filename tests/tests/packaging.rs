//! The files in `packaging/` stay valid: the example configuration is read
//! by the same code as `inboxd serve --config`, and the systemd unit passes
//! `systemd-analyze verify` where systemd is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use inbox_server::config::{Config, ServeArgs};

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

#[test]
fn example_config_resolves() {
    let args = ServeArgs {
        config: Some(packaging().join("inboxd.toml")),
        ..ServeArgs::default()
    };
    let config = Config::resolve(&args).expect("packaging/inboxd.toml");
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/inboxd"));
    assert!(config.tls.is_none());
}

#[test]
fn systemd_unit_verifies() {
    let Ok(output) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: unit not checked");
        return;
    };
    assert!(output.status.success());
    // The unit names the installed binary; check it against the built one.
    let unit = std::fs::read_to_string(packaging().join("inboxd.service")).unwrap();
    let binary = inbox_tests::inboxd_binary();
    let unit = unit.replace("/usr/local/bin/inboxd", &binary.display().to_string());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inboxd.service");
    std::fs::write(&path, unit).unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success(), "{stderr}");
    assert!(
        !stderr.contains("inboxd.service:"),
        "warnings about the unit: {stderr}"
    );
}
