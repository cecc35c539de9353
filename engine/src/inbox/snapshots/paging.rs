//! How snapshot pages are cut so that every page fits one reply frame.
//!
//! A page is served as one `SNAPSHOT_PAGE` reply, whose frame may not pass
//! the server's reply limit (`InboxConfig::snapshot_page_bytes_max`, set
//! to the server's `reply_frame_bytes_max`). Its request names only a page
//! number, so a page too large for that limit could never be fetched and
//! the device could never finish its reset. The builder therefore cuts
//! pages by bytes, measured in the protocol's layout (`docs/PROTOCOL.md`,
//! section 4.4), as well as by conversation count: a page is closed before
//! the conversation or message that would take it past the limit, and a
//! conversation's messages may continue on the next pages.
//!
//! A message whose reply would pass the limit on its own is *elided*: its
//! page carries it with its payload cut to its summary
//! ([`SUMMARY_BYTES_MAX`] bytes) and names it in the reply's `elided`
//! list. No reply of that server could carry its body.
//!
//! The sizes here mirror the wire layout field for field; a test of the
//! server checks them against the codec.

use crate::api::*;

/// `frame_len` of an empty `SNAPSHOT_PAGE` reply: the frame header after
/// `frame_len` (opcode 1, request id 8), `snapshot_id` 8, `page` 4,
/// `pages` 4, and the counts of `convs`, `messages` and `elided` (4 each).
pub const PAGE_REPLY_FIXED_BYTES: u64 = 9 + 8 + 4 + 4 + 4 + 4 + 4;

/// Bytes of one entry of `elided` (conv u64, msg_seq u64).
pub const ELIDED_ENTRY_BYTES: u64 = 16;

/// Bytes of a `ConvSummary` on the wire.
pub fn conv_wire_bytes(c: &ConvSummary) -> u64 {
    // conv, last_msg_seq, last_msg_id, last_sender; last_summary (u32
    // length + bytes); unread u32; read_seq, last_activity_ms; muted, pinned.
    8 * 4 + 4 + c.last_summary.len() as u64 + 4 + 8 * 2 + 2
}

/// Bytes of a `Message` on the wire.
pub fn message_wire_bytes(m: &Message) -> u64 {
    // conv, msg_seq, msg_id, sender; kind u8; msg_type u16; target
    // option<u64>; sent_at_ms; tombstone bool; payload (u32 length + bytes).
    let target = if m.target.is_some() { 9 } else { 1 };
    8 * 4 + 1 + 2 + target + 8 + 1 + 4 + m.payload.len() as u64
}

/// Whether `m` is too large for any page under `page_bytes_max`: it is
/// then served elided.
pub fn must_elide(m: &Message, page_bytes_max: u64) -> bool {
    PAGE_REPLY_FIXED_BYTES + ELIDED_ENTRY_BYTES + message_wire_bytes(m) > page_bytes_max
}

/// `m` as an elided message: its payload cut to its summary.
pub fn elide(m: &mut Message) {
    m.payload = m.payload.slice(..m.payload.len().min(SUMMARY_BYTES_MAX));
}

/// The bytes `m` adds to a page, as it will be served.
fn served_bytes(m: &Message, page_bytes_max: u64) -> u64 {
    if must_elide(m, page_bytes_max) {
        let cut = m.payload.len().min(SUMMARY_BYTES_MAX) as u64;
        message_wire_bytes(m) - m.payload.len() as u64 + cut + ELIDED_ENTRY_BYTES
    } else {
        message_wire_bytes(m)
    }
}

/// One page being filled.
#[derive(Default)]
pub(crate) struct Page {
    pub convs: Vec<ConvSummary>,
    pub messages: Vec<Message>,
    bytes: u64,
}

/// Cuts conversations and their messages into pages of at most
/// `convs_per_page` conversations whose replies fit `page_bytes_max`.
/// Order is kept: conversations as given, each followed by its messages.
pub(crate) struct Pager {
    page_bytes_max: u64,
    convs_per_page: usize,
    current: Page,
    done: Vec<Page>,
}

impl Pager {
    pub(crate) fn new(page_bytes_max: u64, convs_per_page: usize) -> Self {
        Self {
            page_bytes_max,
            convs_per_page,
            current: Page::default(),
            done: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.current.convs.is_empty() && self.current.messages.is_empty()
    }

    /// Closes the current page if `bytes` more would take it past the limit.
    fn make_room(&mut self, bytes: u64) {
        let used = PAGE_REPLY_FIXED_BYTES + self.current.bytes;
        if !self.is_empty() && used + bytes > self.page_bytes_max {
            self.done.push(std::mem::take(&mut self.current));
        }
    }

    pub(crate) fn push_conv(&mut self, c: ConvSummary) {
        if self.current.convs.len() >= self.convs_per_page {
            self.done.push(std::mem::take(&mut self.current));
        }
        let bytes = conv_wire_bytes(&c);
        self.make_room(bytes);
        self.current.bytes += bytes;
        self.current.convs.push(c);
    }

    pub(crate) fn push_message(&mut self, m: Message) {
        let bytes = served_bytes(&m, self.page_bytes_max);
        self.make_room(bytes);
        self.current.bytes += bytes;
        self.current.messages.push(m);
    }

    /// The pages; at least one, empty when there was nothing.
    pub(crate) fn finish(mut self) -> Vec<Page> {
        if !self.is_empty() || self.done.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn conv(id: u64) -> ConvSummary {
        ConvSummary {
            conv: ConvId(id),
            last_msg_seq: MsgSeq(1),
            last_msg_id: MsgId(1),
            last_sender: Uid(1),
            last_summary: Bytes::from_static(b"hi"),
            unread: 0,
            read_seq: MsgSeq(0),
            last_activity_ms: 0,
            muted: false,
            pinned: false,
        }
    }

    fn message(conv: u64, seq: u64, payload_bytes: usize) -> Message {
        Message {
            conv: ConvId(conv),
            msg_seq: MsgSeq(seq),
            msg_id: MsgId(seq),
            sender: Uid(1),
            kind: MessageKind::Normal,
            msg_type: 1,
            target: None,
            sent_at_ms: 0,
            tombstone: false,
            payload: Bytes::from(vec![b'x'; payload_bytes]),
        }
    }

    fn page_bytes(p: &Page, limit: u64) -> u64 {
        PAGE_REPLY_FIXED_BYTES
            + p.convs.iter().map(conv_wire_bytes).sum::<u64>()
            + p.messages
                .iter()
                .map(|m| served_bytes(m, limit))
                .sum::<u64>()
    }

    #[test]
    fn pages_are_cut_by_bytes_and_every_item_is_kept_in_order() {
        let limit = 200_000;
        let mut pager = Pager::new(limit, 64);
        for c in 0..4 {
            pager.push_conv(conv(c));
            for s in 0..5 {
                pager.push_message(message(c, s, 60_000));
            }
        }
        let pages = pager.finish();
        assert!(pages.len() > 1, "20 messages of 60 kB need several pages");
        for p in &pages {
            assert!(page_bytes(p, limit) <= limit, "{}", page_bytes(p, limit));
        }
        let order: Vec<(u64, u64)> = pages
            .iter()
            .flat_map(|p| p.messages.iter().map(|m| (m.conv.0, m.msg_seq.0)))
            .collect();
        let expected: Vec<(u64, u64)> = (0..4).flat_map(|c| (0..5).map(move |s| (c, s))).collect();
        assert_eq!(order, expected);
        let convs: Vec<u64> = pages
            .iter()
            .flat_map(|p| p.convs.iter().map(|c| c.conv.0))
            .collect();
        assert_eq!(convs, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_page_holds_at_most_the_conversation_count() {
        let mut pager = Pager::new(u64::from(u32::MAX), 64);
        for c in 0..130 {
            pager.push_conv(conv(c));
        }
        let counts: Vec<usize> = pager.finish().iter().map(|p| p.convs.len()).collect();
        assert_eq!(counts, vec![64, 64, 2]);
    }

    #[test]
    fn a_message_larger_than_a_page_is_elided_and_every_page_still_fits() {
        let limit = 10_000;
        let big = message(1, 2, 50_000);
        assert!(must_elide(&big, limit));
        assert!(!must_elide(&message(1, 1, 100), limit));
        let mut pager = Pager::new(limit, 64);
        pager.push_conv(conv(1));
        // Leaves less room than the elided message takes: it goes on.
        pager.push_message(message(1, 1, 9_800));
        pager.push_message(big);
        let pages = pager.finish();
        assert_eq!(pages.len(), 2);
        assert_eq!(pages[1].messages.len(), 1);
        let mut last = pages[1].messages[0].clone();
        elide(&mut last);
        assert_eq!(last.payload.len(), SUMMARY_BYTES_MAX);
        for p in &pages {
            assert!(page_bytes(p, limit) <= limit);
        }
    }

    #[test]
    fn nothing_to_page_is_one_empty_page() {
        let pages = Pager::new(1 << 20, 64).finish();
        assert_eq!(pages.len(), 1);
        assert!(pages[0].convs.is_empty() && pages[0].messages.is_empty());
    }
}
