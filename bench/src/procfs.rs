//! What the harness reads from `/proc` about the processes it measures:
//! CPU time (`/proc/<pid>/stat`), anonymous resident memory
//! (`/proc/<pid>/status`), and which process listens on a loopback port
//! (`/proc/net/tcp{,6}` → socket inode → `/proc/*/fd`).
//!
//! Parsing is kept apart from reading so it can be tested on fixed text.
//! A value that cannot be read is `None`, never a failed run: a figure the
//! harness could not take is left out of the report, not invented.

use std::path::Path;

/// Which process a CPU or memory figure is taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measured {
    /// The system's own server process.
    Server(u32),
    /// The harness itself: an embedded system runs inside it, so its
    /// figures include the harness's client threads.
    #[cfg_attr(
        not(feature = "rocksdb"),
        allow(
            dead_code,
            reason = "only the embedded RocksDB runs inside the harness"
        )
    )]
    Harness,
}

impl Measured {
    pub fn pid(self) -> u32 {
        match self {
            Self::Server(pid) => pid,
            Self::Harness => std::process::id(),
        }
    }

    /// The label in the report's `cpu_of` field.
    pub fn label(self) -> &'static str {
        match self {
            Self::Server(_) => "server",
            Self::Harness => "harness",
        }
    }

    pub fn cpu_ticks(self) -> Option<u64> {
        cpu_ticks(self.pid())
    }

    pub fn rss_anon_bytes(self) -> Option<u64> {
        rss_anon_bytes(self.pid())
    }
}

/// `utime + stime` of the whole process (every thread, live or exited),
/// in clock ticks, from the text of `/proc/<pid>/stat`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may itself hold
    // spaces and parentheses: the fields that follow start after the last
    // ')'. There, index 0 is field 3 (state), so utime (field 14) is
    // index 11 and stime (field 15) index 12.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

pub fn cpu_ticks(pid: u32) -> Option<u64> {
    parse_stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Clock ticks per second, the unit of `/proc/<pid>/stat`'s times.
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf takes no pointers and only reads configuration.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// CPU microseconds per operation from two tick samples taken at the start
/// and the end of a measured window; `None` without operations or when the
/// counter went backwards (a restarted process).
pub fn cpu_us_per_op(ticks_start: u64, ticks_end: u64, ticks_per_s: u64, ops: u64) -> Option<f64> {
    let ticks = ticks_end.checked_sub(ticks_start)?;
    if ops == 0 || ticks_per_s == 0 {
        return None;
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "tick and op counts are far below 2^52"
    )]
    let us = ticks as f64 * 1e6 / ticks_per_s as f64 / ops as f64;
    Some(us)
}

/// `RssAnon` of `/proc/<pid>/status`, in bytes: the process's private
/// memory that is resident (heap, stacks), without mapped files, read as
/// the daemon reads its own.
pub fn rss_anon_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    inbox_server::heap::rss_anon_of_status(&status)
}

/// TCP state `LISTEN` in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// The socket inodes listening on `port` in the text of `/proc/net/tcp`
/// or `/proc/net/tcp6` (any local address).
pub fn parse_listen_inodes(net_tcp: &str, port: u16) -> Vec<u64> {
    net_tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl, local_address, rem_address, st, tx:rx, tr:when,
            // retrnsmt, uid, timeout, inode.
            let local = fields.get(1)?;
            let (_, hex_port) = local.rsplit_once(':')?;
            let local_port = u16::from_str_radix(hex_port, 16).ok()?;
            (local_port == port && *fields.get(3)? == TCP_LISTEN)
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .filter(|&inode| inode != 0)
        .collect()
}

/// The process that holds a socket listening on `port`: the server behind
/// it, whoever started it (a wrapper script, a service manager). Scans the
/// fds of every process this user may read; `None` when none is found.
pub fn listener_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(parse_listen_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if wanted.iter().any(|w| Path::new(w) == target) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The pid a server wrote to its pid file, if that process still exists.
pub fn pid_from_file(path: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// The server process to measure, most trusted source first: the process
/// listening on the server's port; else the pid in its pid file; else the
/// process the harness started (which may be a wrapper that forked it).
pub fn server_pid(port: Option<u16>, pid_file: Option<&Path>, child: Option<u32>) -> Option<u32> {
    port.and_then(listener_pid)
        .or_else(|| pid_file.and_then(pid_from_file))
        .or(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime_even_with_parentheses_in_the_name() {
        let stat = "4242 (inbox d) (x)) S 1 4242 4242 0 -1 4194560 3000 0 0 0 \
                    1234 567 8 9 20 0 12 0 100 123456 789 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(1234 + 567));
        assert_eq!(parse_stat_cpu_ticks("1 (short) S 1 2"), None);
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_has_a_readable_cpu_counter_that_grows_with_work() {
        let before = cpu_ticks(std::process::id()).expect("own /proc/<pid>/stat");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(60) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = cpu_ticks(std::process::id()).expect("own /proc/<pid>/stat");
        assert!(after >= before);
        assert!(clock_ticks_per_s() >= 1);
    }

    #[test]
    fn cpu_per_op_divides_the_window_by_the_operations() {
        // 250 ticks at 100/s = 2.5 s of CPU over 10,000 ops = 250 µs/op.
        assert_eq!(cpu_us_per_op(1_000, 1_250, 100, 10_000), Some(250.0));
        assert_eq!(cpu_us_per_op(5, 5, 100, 7), Some(0.0));
        assert_eq!(cpu_us_per_op(0, 10, 100, 0), None, "no ops, no figure");
        assert_eq!(
            cpu_us_per_op(10, 5, 100, 1),
            None,
            "a counter that went back is another process"
        );
    }

    #[test]
    fn rss_anon_of_another_process_is_read_from_its_status_file() {
        assert!(rss_anon_bytes(std::process::id()).expect("own status") > 0);
        assert_eq!(rss_anon_bytes(u32::MAX), None, "no such process");
    }

    #[test]
    fn listen_inodes_match_the_port_in_listen_state_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4711 1 0 100 0 0 10 0\n\
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4712 1 0 20 4 30 10 -1\n\
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4713 1 0 100 0 0 10 0\n";
        assert_eq!(parse_listen_inodes(table, 0x1F90), vec![4711]);
        assert_eq!(parse_listen_inodes(table, 0x1F91), vec![4713]);
        assert!(parse_listen_inodes(table, 80).is_empty());
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0 100 0 0 10 0\n";
        assert_eq!(parse_listen_inodes(v6, 0x1F90), vec![99]);
    }

    #[test]
    fn the_listener_of_a_port_is_found_through_its_socket_inode() {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
        assert_eq!(
            server_pid(Some(port), None, Some(1)),
            Some(std::process::id()),
            "the listener wins over the child the harness started"
        );
        drop(listener);
        assert_eq!(server_pid(Some(port), None, Some(7)), Some(7));
    }

    #[test]
    fn a_pid_file_names_a_live_process_or_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("server.pid");
        std::fs::write(&path, format!("{}\n", std::process::id())).expect("write");
        assert_eq!(pid_from_file(&path), Some(std::process::id()));
        std::fs::write(&path, "4294967295\n").expect("write");
        assert_eq!(pid_from_file(&path), None);
        assert_eq!(pid_from_file(&dir.path().join("missing")), None);
    }
}
