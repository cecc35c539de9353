//! Batch tokens (R9): an opaque, tamper-proof binding of a sync batch to
//! `(uid, device, generation, resume_from, hwm, expiry)`.
//!
//! Layout (81 bytes, little-endian):
//! ```text
//! 0  u8   version (1)
//! 1  u64  uid
//! 9  u64  device
//! 17 u64  generation
//! 25 u64  resume_from
//! 33 u64  batch_hwm
//! 41 u64  expires_at_ms
//! 49 [32] HMAC-SHA256(server key, bytes 0..49)
//! ```
//! Verification is constant-time (`hmac`'s `verify_slice`). Tokens are
//! stateless: nothing is stored per batch, and a generation bump kills
//! every older token because the generation no longer matches.

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::codec::{Reader, Writer};
use crate::api::*;
use crate::error::{Error, Result};

const VERSION: u8 = 1;
const BODY_BYTES: usize = 49;
pub(crate) const TOKEN_BYTES: usize = BODY_BYTES + 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TokenClaims {
    pub uid: Uid,
    pub device: DeviceId,
    pub generation: Generation,
    pub resume_from: SyncSeq,
    pub hwm: SyncSeq,
    pub expires_at_ms: TimestampMs,
}

fn mac(key: &[u8; 32]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this cannot fail.
    <Hmac<Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("hmac takes any key length"))
}

pub(crate) fn sign(key: &[u8; 32], c: &TokenClaims) -> Bytes {
    let mut w = Writer::with_capacity(TOKEN_BYTES);
    w.u8(VERSION);
    w.u64(c.uid);
    w.u64(c.device);
    w.u64(c.generation);
    w.u64(c.resume_from);
    w.u64(c.hwm);
    w.u64(c.expires_at_ms);
    let mut m = mac(key);
    m.update(&w.buf);
    let tag = m.finalize().into_bytes();
    w.buf.extend_from_slice(&tag);
    Bytes::from(w.buf)
}

/// Checks the tag and the expiry; any failure is [`Error::BadToken`].
pub(crate) fn verify(key: &[u8; 32], token: &[u8], now_ms: TimestampMs) -> Result<TokenClaims> {
    if token.len() != TOKEN_BYTES {
        return Err(Error::BadToken);
    }
    let (body, tag) = token.split_at(BODY_BYTES);
    let mut m = mac(key);
    m.update(body);
    m.verify_slice(tag).map_err(|_| Error::BadToken)?;
    let mut r = Reader::new(body);
    let bad = |_| Error::BadToken;
    if r.u8().map_err(bad)? != VERSION {
        return Err(Error::BadToken);
    }
    let claims = TokenClaims {
        uid: r.id().map_err(bad)?,
        device: r.id().map_err(bad)?,
        generation: r.id().map_err(bad)?,
        resume_from: r.id().map_err(bad)?,
        hwm: r.id().map_err(bad)?,
        expires_at_ms: r.u64().map_err(bad)?,
    };
    if now_ms > claims.expires_at_ms {
        return Err(Error::BadToken);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> TokenClaims {
        TokenClaims {
            uid: Uid(1),
            device: DeviceId(2),
            generation: Generation(3),
            resume_from: SyncSeq(4),
            hwm: SyncSeq(5),
            expires_at_ms: 1_000,
        }
    }

    #[test]
    fn token_verifies_with_its_key_until_expiry() {
        let key = [7u8; 32];
        let t = sign(&key, &claims());
        assert_eq!(verify(&key, &t, 1_000).unwrap(), claims());
        assert!(matches!(verify(&key, &t, 1_001), Err(Error::BadToken)));
        assert!(matches!(verify(&[8u8; 32], &t, 0), Err(Error::BadToken)));
    }

    #[test]
    fn any_flipped_bit_makes_the_token_bad() {
        let key = [7u8; 32];
        let t = sign(&key, &claims());
        for i in 0..t.len() * 8 {
            let mut bad = t.to_vec();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(
                matches!(verify(&key, &bad, 0), Err(Error::BadToken)),
                "bit {i}"
            );
        }
        assert!(matches!(verify(&key, &t[..40], 0), Err(Error::BadToken)));
    }
}
