//! Child processes the harness starts (database servers, inboxd): a guard
//! that stops them when dropped, free loopback ports, and readiness polling.
//!
//! Invariant: a server started by the harness never outlives it; a guard's
//! drop sends SIGTERM, waits, then SIGKILLs.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Result;

#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    pub fn spawn(name: &str, command: &mut Command) -> Result<Self> {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
        })
    }
    /// Like [`ChildGuard::spawn`], with the child's stdout handed back (a
    /// server that prints where it listens).
    pub fn spawn_with_stdout(
        name: &str,
        command: &mut Command,
    ) -> Result<(Self, std::process::ChildStdout)> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        Ok((
            Self {
                name: name.to_string(),
                child: Some(child),
            },
            stdout,
        ))
    }

    /// The child's pid while the harness holds it.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fails when the process has already exited (it could not start).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                return Err(format!("{} exited at start: {status}", self.name).into());
            }
        }
        Ok(())
    }

    /// SIGKILL, as a crash would: no shutdown work runs.
    pub fn kill_hard(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL if the process is still there after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: `kill` only sends a signal; the pid is our own child,
            // which has not been reaped yet (we hold its `Child`), so the pid
            // cannot have been reused by another process.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(20));
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Calls `probe` until it succeeds or `timeout` passes; returns the time it
/// took. `alive` is checked between tries so a server that died is
/// reported at once instead of after the timeout.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<()>,
    mut probe: impl FnMut() -> Result<T>,
) -> Result<(T, Duration)> {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(value) => return Ok((value, start.elapsed())),
            Err(e) if start.elapsed() > timeout => {
                return Err(format!("{what} not ready after {timeout:?}: {e}").into());
            }
            Err(_) => {
                alive()?;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// The first of `candidates` that exists as a file, or is found on PATH.
pub fn find_binary(candidates: &[&str]) -> Option<std::path::PathBuf> {
    for candidate in candidates {
        let path = std::path::Path::new(candidate);
        if path.is_absolute() {
            if path.is_file() {
                return Some(path.to_path_buf());
            }
            continue;
        }
        let paths = std::env::var_os("PATH").unwrap_or_default();
        for dir in std::env::split_paths(&paths).chain(["/usr/sbin".into(), "/sbin".into()]) {
            let full = dir.join(candidate);
            if full.is_file() {
                return Some(full);
            }
        }
    }
    None
}
