//! What the machine is: CPU, cores, memory, kernel, and the filesystem the
//! data directories are on. Read from /proc and `df`; a field that cannot
//! be read stays empty rather than failing the run.

use std::path::Path;
use std::process::Command;

use crate::report::Machine;

fn first_line_with(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find(|l| l.starts_with(key)).and_then(|l| {
        l.split_once([':', '='])
            .map(|(_, v)| v.trim().trim_matches('"').to_string())
    })
}

pub fn describe(data_dir: &Path) -> Machine {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get() as u32);
    let memory_bytes = first_line_with("/proc/meminfo", "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    let data_fs = Command::new("df")
        .args(["--output=source,fstype,size"])
        .arg(data_dir)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .nth(1)
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_default();
    Machine {
        cpu: first_line_with("/proc/cpuinfo", "model name").unwrap_or_default(),
        cores,
        memory_bytes,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        os: first_line_with("/etc/os-release", "PRETTY_NAME").unwrap_or_default(),
        data_fs,
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ..Machine::default()
    }
}
