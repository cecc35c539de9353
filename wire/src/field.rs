//! Primitive field encodings shared by every typed body.
//!
//! Invariants:
//! - integers are fixed-width little-endian;
//! - `bool` is one byte, exactly 0 or 1;
//! - `Option<T>` is a one-byte tag (0 = none, 1 = some) then `T`;
//! - `Bytes` and `String` are a `u32` length then that many bytes (a string
//!   must be UTF-8);
//! - `Vec<T>` is a `u32` count then the items.
//!
//! Decoding is strict (any other tag, a length past the end, invalid UTF-8
//! is an error) so that every accepted body re-encodes to the same bytes.
//! Lengths and counts are checked against the bytes actually remaining
//! before anything is allocated, and no decoder calls itself: nesting depth
//! is fixed by the types, never by the input.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::WireError;

/// A reader over one frame body. Every `get_*` checks the remaining length
/// first, so a short body is an error and never a panic.
#[derive(Debug)]
pub struct Reader {
    buf: Bytes,
}

impl Reader {
    pub fn new(buf: Bytes) -> Self {
        Self { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.remaining()
    }

    fn need(&self, n: usize, what: &'static str) -> Result<(), WireError> {
        if self.buf.remaining() < n {
            return Err(WireError::Malformed(format!(
                "body ends inside {what}: need {n} bytes, {} left",
                self.buf.remaining()
            )));
        }
        Ok(())
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1, "u8")?;
        Ok(self.buf.get_u8())
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        self.need(2, "u16")?;
        Ok(self.buf.get_u16_le())
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4, "u32")?;
        Ok(self.buf.get_u32_le())
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8, "u64")?;
        Ok(self.buf.get_u64_le())
    }
    pub fn u128(&mut self) -> Result<u128, WireError> {
        self.need(16, "u128")?;
        Ok(self.buf.get_u128_le())
    }

    /// Takes exactly `n` bytes without copying.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, WireError> {
        self.need(n, what)?;
        Ok(self.buf.split_to(n))
    }

    /// A body must be consumed exactly: trailing bytes would not re-encode.
    pub fn finish(self) -> Result<(), WireError> {
        if self.buf.has_remaining() {
            return Err(WireError::Malformed(format!(
                "{} trailing bytes after the body",
                self.buf.remaining()
            )));
        }
        Ok(())
    }
}

/// A value with one canonical encoding.
pub trait Field: Sized {
    /// The fewest bytes an encoding of `Self` can take; bounds the capacity
    /// reserved for a list before its items are read.
    const MIN_BYTES: usize;
    fn put(&self, out: &mut BytesMut);
    fn get(r: &mut Reader) -> Result<Self, WireError>;
}

macro_rules! int_field {
    ($t:ty, $bytes:expr, $put:ident, $get:ident) => {
        impl Field for $t {
            const MIN_BYTES: usize = $bytes;
            fn put(&self, out: &mut BytesMut) {
                out.$put(*self);
            }
            fn get(r: &mut Reader) -> Result<Self, WireError> {
                r.$get()
            }
        }
    };
}

int_field!(u8, 1, put_u8, u8);
int_field!(u16, 2, put_u16_le, u16);
int_field!(u32, 4, put_u32_le, u32);
int_field!(u64, 8, put_u64_le, u64);
int_field!(u128, 16, put_u128_le, u128);

impl Field for bool {
    const MIN_BYTES: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(u8::from(*self));
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        match r.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(WireError::Malformed(format!(
                "bool byte is {other}, not 0 or 1"
            ))),
        }
    }
}

/// Writes a `u32` length prefix.
fn put_len(out: &mut BytesMut, len: usize) {
    out.put_u32_le(len_u32(len));
}

/// A length as its `u32` prefix. Lengths above `u32::MAX` cannot occur: a
/// frame is itself limited to a `u32` length, and the frame encoder refuses
/// a body that does not fit.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Writes what `put` writes behind a `u32` length prefix, in place: the
/// prefix is reserved first and filled in afterwards, so the value is never
/// built in a buffer of its own and copied.
pub(crate) fn put_prefixed(out: &mut BytesMut, put: impl FnOnce(&mut BytesMut)) {
    let at = out.len();
    out.put_u32_le(0);
    put(out);
    let len = len_u32(out.len() - at - 4);
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

impl Field for Bytes {
    const MIN_BYTES: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        put_len(out, self.len());
        out.put_slice(self);
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let len = r.u32()? as usize;
        r.take(len, "a byte string")
    }
}

impl Field for String {
    const MIN_BYTES: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        put_len(out, self.len());
        out.put_slice(self.as_bytes());
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let len = r.u32()? as usize;
        let raw = r.take(len, "a string")?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| WireError::Malformed("string is not UTF-8".into()))
    }
}

impl Field for [u8; 32] {
    const MIN_BYTES: usize = 32;
    fn put(&self, out: &mut BytesMut) {
        out.put_slice(self);
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let raw = r.take(32, "a 32-byte digest")?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&raw);
        Ok(digest)
    }
}

impl<T: Field> Field for Option<T> {
    const MIN_BYTES: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        match self {
            None => out.put_u8(0),
            Some(value) => {
                out.put_u8(1);
                value.put(out);
            }
        }
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        match r.u8()? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            other => Err(WireError::Malformed(format!(
                "option tag is {other}, not 0 or 1"
            ))),
        }
    }
}

impl<T: Field> Field for Vec<T> {
    const MIN_BYTES: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        put_len(out, self.len());
        for item in self {
            item.put(out);
        }
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let count = r.u32()? as usize;
        // A peer-supplied count never sizes an allocation on its own: it is
        // first checked against what the remaining bytes could hold.
        let fits = r.remaining() / T::MIN_BYTES.max(1);
        if count > fits {
            return Err(WireError::Malformed(format!(
                "list claims {count} items but only {} bytes remain",
                r.remaining()
            )));
        }
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(T::get(r)?);
        }
        Ok(items)
    }
}

/// Declares a struct whose encoding is its fields in order, with no
/// header of its own.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub struct $name { $( $(#[$fmeta])* pub $field: $ty ),* }

        impl $crate::field::Field for $name {
            const MIN_BYTES: usize = 0 $( + <$ty as $crate::field::Field>::MIN_BYTES )*;
            #[allow(unused_variables)]
            fn put(&self, out: &mut bytes::BytesMut) {
                $( $crate::field::Field::put(&self.$field, out); )*
            }
            #[allow(unused_variables)]
            fn get(r: &mut $crate::field::Reader) -> Result<Self, $crate::WireError> {
                Ok(Self { $( $field: <$ty as $crate::field::Field>::get(r)? ),* })
            }
        }

        #[cfg(test)]
        impl $crate::field::sample::Sample for $name {
            #[allow(unused_variables)]
            fn sample(g: &mut $crate::field::sample::Gen) -> Self {
                Self { $( $field: $crate::field::sample::Sample::sample(g) ),* }
            }
        }
    };
}
pub(crate) use wire_struct;

/// Declares a fieldless enum encoded as one byte.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $code:expr ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[cfg_attr(feature = "serde", serde(rename_all = "SCREAMING_SNAKE_CASE"))]
        #[repr(u8)]
        pub enum $name {
            #[default]
            $( $(#[$vmeta])* $variant = $code ),*
        }

        impl $crate::field::Field for $name {
            const MIN_BYTES: usize = 1;
            fn put(&self, out: &mut bytes::BytesMut) {
                bytes::BufMut::put_u8(out, *self as u8);
            }
            fn get(r: &mut $crate::field::Reader) -> Result<Self, $crate::WireError> {
                match r.u8()? {
                    $( $code => Ok(Self::$variant), )*
                    other => Err($crate::WireError::Malformed(format!(
                        "{} code {other} is unknown", stringify!($name)
                    ))),
                }
            }
        }

        #[cfg(test)]
        impl $crate::field::sample::Sample for $name {
            fn sample(g: &mut $crate::field::sample::Gen) -> Self {
                const ALL: &[$name] = &[ $( $name::$variant ),* ];
                ALL[g.below(ALL.len())]
            }
        }
    };
}
pub(crate) use wire_enum;

/// Random values of every wire type, for round-trip property tests.
#[cfg(test)]
pub(crate) mod sample {
    use bytes::Bytes;

    /// A small deterministic generator (splitmix64), seeded by proptest so
    /// that failures shrink and replay.
    pub struct Gen(pub u64);

    impl Gen {
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    pub trait Sample {
        fn sample(g: &mut Gen) -> Self;
    }

    macro_rules! int_sample {
        ($($t:ty),*) => {$(
            impl Sample for $t {
                fn sample(g: &mut Gen) -> Self {
                    // Mix edge values in: 0, MAX, and small numbers.
                    match g.below(4) {
                        0 => 0,
                        1 => <$t>::MAX,
                        2 => (g.next() % 1000) as $t,
                        _ => g.next() as $t,
                    }
                }
            }
        )*};
    }
    int_sample!(u8, u16, u32, u64);

    impl Sample for u128 {
        fn sample(g: &mut Gen) -> Self {
            (u128::from(g.next()) << 64) | u128::from(g.next())
        }
    }
    impl Sample for bool {
        fn sample(g: &mut Gen) -> Self {
            g.next() & 1 == 1
        }
    }
    impl Sample for Bytes {
        fn sample(g: &mut Gen) -> Self {
            let len = g.below(40);
            (0..len).map(|_| g.next() as u8).collect::<Vec<u8>>().into()
        }
    }
    impl Sample for String {
        fn sample(g: &mut Gen) -> Self {
            const WORDS: &[&str] = &["", "a", "seg", "déjà", "消息", "held by device 7"];
            WORDS[g.below(WORDS.len())].to_string()
        }
    }
    impl Sample for [u8; 32] {
        fn sample(g: &mut Gen) -> Self {
            let mut out = [0u8; 32];
            for byte in &mut out {
                *byte = g.next() as u8;
            }
            out
        }
    }
    impl<T: Sample> Sample for Option<T> {
        fn sample(g: &mut Gen) -> Self {
            if g.next() & 1 == 0 {
                None
            } else {
                Some(T::sample(g))
            }
        }
    }
    impl<T: Sample> Sample for Vec<T> {
        fn sample(g: &mut Gen) -> Self {
            let len = g.below(4);
            (0..len).map(|_| T::sample(g)).collect()
        }
    }
}
