//! `MEMORY` (`inboxctl stats --memory`) and `inboxd_memory_bytes`: the
//! daemon's memory by structure follows what the structures hold.

use inbox_tests::Daemon;
use inbox_wire::{ConvMember, Empty, MemoryReport};

fn live(r: &MemoryReport, structure: &str) -> u64 {
    r.structures
        .iter()
        .find(|m| m.structure == structure)
        .unwrap_or_else(|| panic!("{structure} missing from {r:?}"))
        .live
}

#[tokio::test]
async fn sends_with_keys_grow_the_idempotency_bytes_the_memory_request_reports() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(ConvMember { conv: 1, uid: 1 }).await.unwrap();
    let before = client.memory(Empty {}).await.unwrap();
    for i in 0..200 {
        inbox_tests::send_text(&client, 1, 1, &format!("m{i}")).await;
    }
    let after = client.memory(Empty {}).await.unwrap();
    assert_eq!(
        live(&after, "idempotency") - live(&before, "idempotency"),
        200 * 24
    );
    let index = |r: &MemoryReport| live(r, "message_metadata") + live(r, "message_metadata_file");
    // The join, then 200 sends: a full chunk of 157 entries at 26 bytes
    // each, and the conversation's tail packed to 10 bytes an entry after
    // its 45-byte header (the join alone was the header and one entry).
    assert_eq!(index(&before), 45 + 10);
    assert_eq!(index(&after), 157 * 26 + 45 + 44 * 10);
    for m in &after.structures {
        assert!(m.allocated >= m.live, "{m:?}");
    }
    assert!(after.longest_hold_us <= after.walk_us);
}

/// `heap` is the daemon's allocations as its allocator counts them, and
/// `anonymous` its resident anonymous memory: process totals beside the
/// structures, which live inside the heap.
#[tokio::test]
async fn the_memory_request_counts_the_whole_heap_beside_the_structures_in_it() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(ConvMember { conv: 1, uid: 1 }).await.unwrap();
    let before = live(&client.memory(Empty {}).await.unwrap(), "heap");
    // 500 sends of 2 KiB bodies: each body passes through the heap (the
    // request, the round's record) and stays only in the log.
    let body = "x".repeat(2048);
    for i in 0..500 {
        inbox_tests::send_text(&client, 1, 1, &format!("{i} {body}")).await;
    }
    let r = client.memory(Empty {}).await.unwrap();
    let (heap, anonymous) = (live(&r, "heap"), live(&r, "anonymous"));
    // Frees are counted: what stayed is the sends' metadata, not the
    // megabyte of bodies that went through.
    assert!(
        heap.saturating_sub(before) < 500 * 2048 / 2,
        "the heap grew from {before} to {heap} B over 500 sends"
    );
    let in_structures: u64 = r
        .structures
        .iter()
        .filter(|m| inbox_server::heap::on_heap(&m.structure))
        .map(|m| m.live)
        .sum();
    assert!(in_structures > 0, "{r:?}");
    assert!(
        heap >= in_structures,
        "the heap ({heap} B) holds the structures' entries ({in_structures} B)"
    );
    assert!(anonymous > 0, "{r:?}");
}

#[tokio::test]
async fn the_memory_request_is_for_the_admin_token_only() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let user = daemon.user_client().await;
    let err = user.memory(Empty {}).await.expect_err("admin only");
    assert!(
        format!("{err:?}").contains("Forbidden") || format!("{err}").contains("FORBIDDEN"),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_memory_family_is_exported_by_structure_and_kind() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let text = daemon.scrape().await;
    for line in [
        "# TYPE inboxd_memory_bytes gauge",
        "inboxd_memory_bytes{structure=\"idempotency\",kind=\"live\"} ",
        "inboxd_memory_bytes{structure=\"message_metadata\",kind=\"allocated\"} ",
        "inboxd_memory_bytes{structure=\"log_mmaps\",kind=\"live\"} ",
        "inboxd_memory_bytes{structure=\"heap\",kind=\"live\"} ",
        "inboxd_memory_bytes{structure=\"anonymous\",kind=\"live\"} ",
    ] {
        assert!(text.contains(line), "{line:?} missing from {text}");
    }
}

/// A field of `/proc/<pid>/status`, if the kernel reports it.
fn status_field(pid: i32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// mimalloc asks for transparent huge pages on what it reserves, and an
/// idle daemon then held 12 MiB of heap for under 2 MiB of allocations;
/// `inboxd serve` turns them off for itself unless `MIMALLOC_ALLOW_THP`
/// says otherwise.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_daemon_runs_without_transparent_huge_pages() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(ConvMember { conv: 1, uid: 1 }).await.unwrap();
    let Some(thp) = status_field(daemon.pid(), "THP_enabled") else {
        // Older kernels do not report the flag; this test then has
        // nothing to read.
        eprintln!("this kernel's /proc/<pid>/status has no THP_enabled; nothing checked");
        return;
    };
    assert_eq!(thp, "0", "the daemon may still map transparent huge pages");
}
