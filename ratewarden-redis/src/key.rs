//! The Redis key layout (documented in the [crate docs](crate#keys)).
//!
//! `<prefix>{<16 hex digits>}:<algorithm>:<storage key>`: every part but the
//! last is printable ASCII chosen by the operator or by this crate, and the
//! caller's bytes come last, so no byte of theirs can be mistaken for a
//! separator and the key is printable whenever the storage key is.

use ratewarden_core::{Algorithm, ConfigError};

/// The part of the key that names the algorithm, so that one storage key
/// under two policies of different algorithms never shares state.
pub(crate) fn algorithm_tag(algorithm: Algorithm) -> &'static [u8] {
    match algorithm {
        Algorithm::SlidingLog => b"log",
        Algorithm::FixedWindow => b"fw",
        Algorithm::SlidingWindow => b"sw",
        Algorithm::Gcra => b"gcra",
    }
}

/// FNV-1a, 64 bits: stable across Rust releases and platforms, unlike
/// `std`'s hasher, so every process of a fleet maps a key to the same slot.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The part of the key that names a ban record under `algorithm`: no
/// algorithm's tag has a `-`, so a ban record never shares a key with a
/// state.
pub(crate) fn ban_tag(algorithm: Algorithm) -> &'static [u8] {
    match algorithm {
        Algorithm::SlidingLog => b"ban-log",
        Algorithm::FixedWindow => b"ban-fw",
        Algorithm::SlidingWindow => b"ban-sw",
        Algorithm::Gcra => b"ban-gcra",
    }
}

/// The Redis key of `key` under `algorithm`.
pub(crate) fn redis_key(prefix: &[u8], key: &[u8], algorithm: Algorithm) -> Vec<u8> {
    tagged_key(prefix, key, algorithm_tag(algorithm))
}

/// The Redis key of `key`'s ban record under `algorithm`, in the same
/// cluster slot as its state (the hash tag is the storage key's).
pub(crate) fn ban_key(prefix: &[u8], key: &[u8], algorithm: Algorithm) -> Vec<u8> {
    tagged_key(prefix, key, ban_tag(algorithm))
}

fn tagged_key(prefix: &[u8], key: &[u8], tag: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 20 + tag.len() + key.len());
    out.extend_from_slice(prefix);
    // The tag holds a hash of the caller's key, not the key, so that a `{`
    // or `}` in it cannot choose the Redis Cluster slot.
    out.push(b'{');
    out.extend_from_slice(format!("{:016x}", fnv1a(key)).as_bytes());
    out.extend_from_slice(b"}:");
    out.extend_from_slice(tag);
    out.push(b':');
    out.extend_from_slice(key);
    out
}

/// Refuses a prefix that would make keys unprintable (so that an operator
/// could not copy one from `redis-cli` output) or move the hash tag.
pub(crate) fn check_prefix(prefix: &[u8]) -> Result<(), ConfigError> {
    if prefix.iter().any(|b| *b == b'{' || *b == b'}') {
        return Err(ConfigError::Invalid(
            "redis key prefix may not contain '{' or '}': they would break the cluster hash tag"
                .into(),
        ));
    }
    if let Some(b) = prefix.iter().find(|b| !b.is_ascii_graphic()) {
        return Err(ConfigError::Invalid(format!(
            "redis key prefix may hold only printable ASCII without spaces (! to ~), so that \
             keys can be listed and deleted with redis-cli; found byte 0x{b:02x}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_the_hash_tag_whatever_the_user_key() {
        for key in [&b""[..], b"}", b"{", b"{a}", b"x}{y", &[0xff; 3]] {
            let k = redis_key(b"ratewarden:", key, Algorithm::Gcra);
            let open = k.iter().position(|b| *b == b'{').unwrap();
            let close = k.iter().position(|b| *b == b'}').unwrap();
            assert_eq!(close - open, 17, "{k:?}");
            assert!(k.ends_with(key));
        }
        assert_ne!(
            redis_key(b"", b"a", Algorithm::Gcra),
            redis_key(b"", b"a", Algorithm::FixedWindow)
        );
    }

    /// The example of the crate docs, byte for byte.
    #[test]
    fn the_documented_example_is_the_key() {
        let key = redis_key(
            b"ratewarden:",
            b"search:0123456789abcdef0123456789abcdef",
            Algorithm::SlidingLog,
        );
        assert_eq!(
            String::from_utf8(key).unwrap(),
            "ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef"
        );
    }

    #[test]
    fn printable_storage_keys_make_printable_redis_keys() {
        for algorithm in Algorithm::ALL {
            let k = redis_key(b"myapp:rl:", b"contact:ffee", algorithm);
            assert!(k.iter().all(u8::is_ascii_graphic), "{k:?}");
        }
    }

    #[test]
    fn fnv_is_the_published_function() {
        // Test vectors of FNV-1a 64.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn prefixes_that_break_the_layout_are_refused() {
        for bad in [
            &b"a{b"[..],
            b"a}b",
            b"a b:",
            b"tab\t",
            b"nul\0",
            "é:".as_bytes(),
        ] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
        for good in [&b""[..], b"ratewarden:", b"t:1:", b"my-app/rl_1.2:"] {
            assert!(check_prefix(good).is_ok(), "{good:?}");
        }
    }
}
