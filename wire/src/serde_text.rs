//! How byte fields read in serialized bodies (feature `serde`): bodies
//! and summaries as text when they are printable UTF-8, else `0x…` hex;
//! opaque tokens, cursors and digests always as hex, so what a tool prints
//! can be handed back to it. Tokens in `HELLO` are never serialized.

use serde::Serializer;

fn hex_string(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        text.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    text
}

/// Bytes as text when they are printable UTF-8, else `0x` and hex.
pub fn text_or_hex_string(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!("0x{}", hex_string(bytes)),
    }
}

pub(crate) fn text_or_hex<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&text_or_hex_string(bytes))
}

pub(crate) fn hex<S: Serializer, B: AsRef<[u8]>>(bytes: &B, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex_string(bytes.as_ref()))
}

pub(crate) fn opt_hex<S: Serializer>(
    bytes: &Option<bytes::Bytes>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(bytes) => s.serialize_some(&hex_string(bytes)),
        None => s.serialize_none(),
    }
}
