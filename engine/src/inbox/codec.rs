//! Little-endian byte writer and bounds-checked reader shared by every
//! on-disk encoding of the inbox (log records, checkpoints, batch tokens).
//!
//! Invariant: the reader never panics and never allocates more than the
//! bytes it was given; a short or malformed input is a [`DecodeError`].

use bytes::{Bytes, BytesMut};

/// A record or checkpoint that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub &'static str);

pub(crate) type DecodeResult<T> = std::result::Result<T, DecodeError>;

/// What is encoded as eight little-endian bytes: `u64` and the identifier
/// newtypes of [`crate::api`], which encode exactly as the bare number.
pub(crate) trait Word64: Copy {
    fn to_word(self) -> u64;
    fn from_word(v: u64) -> Self;
}

impl Word64 for u64 {
    fn to_word(self) -> u64 {
        self
    }
    fn from_word(v: u64) -> Self {
        v
    }
}

macro_rules! word64 {
    ($($t:ident),+) => {
        $(impl Word64 for crate::api::$t {
            fn to_word(self) -> u64 {
                self.0
            }
            fn from_word(v: u64) -> Self {
                crate::api::$t(v)
            }
        })+
    };
}

word64!(Uid, ConvId, DeviceId, MsgId, MsgSeq, SyncSeq, Generation);

/// Where a streaming [`Writer`] hands its bytes, a chunk at a time.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

/// Encodes into `buf`. A streaming writer ([`Writer::streaming`]) hands
/// `buf` to its sink whenever it holds a chunk, so encoding a state of any
/// size holds one chunk in memory.
#[derive(Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
    sink: Option<(Box<dyn Sink>, usize)>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            buf: Vec::with_capacity(n),
            sink: None,
        }
    }
    /// A writer that appends to `buf`.
    pub fn appending(buf: Vec<u8>) -> Self {
        Self { buf, sink: None }
    }
    /// A writer that hands `sink` its bytes in chunks of about `chunk`.
    pub fn streaming(sink: Box<dyn Sink>, chunk: usize) -> Self {
        Self {
            buf: Vec::with_capacity(chunk + chunk / 8),
            sink: Some((sink, chunk)),
        }
    }
    /// Hands the sink what is left.
    pub fn finish(mut self) {
        if let Some((sink, _)) = &mut self.sink {
            if !self.buf.is_empty() {
                sink.put(&self.buf);
            }
        }
    }
    fn wrote(&mut self) {
        if let Some((sink, chunk)) = &mut self.sink {
            if self.buf.len() >= *chunk {
                sink.put(&self.buf);
                self.buf.clear();
            }
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
        self.wrote();
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self.wrote();
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self.wrote();
    }
    /// A `u64`, or an identifier newtype as its bare `u64`.
    pub fn u64(&mut self, v: impl Word64) {
        self.buf.extend_from_slice(&v.to_word().to_le_bytes());
        self.wrote();
    }
    pub fn u128(&mut self, v: u128) {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self.wrote();
    }
    pub fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
        self.wrote();
    }
    /// Length-prefixed (u32) bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        let len = u32::try_from(v.len()).unwrap_or(u32::MAX);
        self.u32(len);
        self.buf.extend_from_slice(&v[..len as usize]);
        self.wrote();
    }
    /// Length-prefixed (u8) short bytes; callers keep them under 256.
    pub fn short_bytes(&mut self, v: &[u8]) {
        let len = u8::try_from(v.len()).unwrap_or(u8::MAX);
        self.u8(len);
        self.buf.extend_from_slice(&v[..len as usize]);
        self.wrote();
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    /// Where [`Reader::short_bytes`] copies to, when given: a caller that
    /// decodes many records at once (a sync page) shares one allocation
    /// among all their short strings instead of making one each.
    arena: Option<&'a mut BytesMut>,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, arena: None }
    }
    /// A reader whose short byte strings are copied into `arena`.
    pub fn with_arena(buf: &'a [u8], arena: &'a mut BytesMut) -> Self {
        Self {
            buf,
            arena: Some(arena),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn take(&mut self, n: usize) -> DecodeResult<&'a [u8]> {
        if self.buf.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> DecodeResult<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    pub fn u8(&mut self) -> DecodeResult<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> DecodeResult<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> DecodeResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> DecodeResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// The next u64, left unread.
    pub fn peek_u64(&self) -> DecodeResult<u64> {
        Reader::new(self.buf).u64()
    }
    /// An identifier newtype, stored as its bare `u64`.
    pub fn id<T: Word64>(&mut self) -> DecodeResult<T> {
        Ok(T::from_word(self.u64()?))
    }
    pub fn u128(&mut self) -> DecodeResult<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }
    pub fn bool(&mut self) -> DecodeResult<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError("bad bool")),
        }
    }
    pub fn bytes(&mut self) -> DecodeResult<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }
    pub fn short_bytes(&mut self) -> DecodeResult<Bytes> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        Ok(match self.arena.as_deref_mut() {
            Some(arena) => {
                arena.extend_from_slice(bytes);
                arena.split().freeze()
            }
            None => Bytes::copy_from_slice(bytes),
        })
    }
    /// A collection length, checked against the bytes left so that a
    /// corrupt count cannot make the caller reserve huge memory.
    pub fn count(&mut self, min_item_bytes: usize) -> DecodeResult<usize> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| DecodeError("count overflows"))?;
        if n.saturating_mul(min_item_bytes.max(1)) > self.buf.len() {
            return Err(DecodeError("count exceeds input"));
        }
        Ok(n)
    }
}

/// A map's entries in key order, for a canonical encoding.
pub(crate) fn sorted<K: Ord + Copy, V, S>(m: &std::collections::HashMap<K, V, S>) -> Vec<(K, &V)> {
    let mut v: Vec<(K, &V)> = m.iter().map(|(k, v)| (*k, v)).collect();
    v.sort_unstable_by_key(|(k, _)| *k);
    v
}
