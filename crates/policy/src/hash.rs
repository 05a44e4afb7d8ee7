//! Stable hashing for ring points and target keys: the same on every platform and release, so
//! that switches, simulators and tests agree on where a target lives.

/// 64-bit FNV-1a over `bytes`, continuing from `h`.
pub(crate) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// FNV-1a offset basis.
pub(crate) const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The SplitMix64 finalizer: spreads the bits of `x` over the whole word.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hash of a target key (optional host, then target).
pub(crate) fn key_hash(host: Option<&str>, target: &str) -> u64 {
    let mut h = FNV_START;
    if let Some(host) = host {
        for b in host.bytes() {
            h = fnv1a(h, &[b.to_ascii_lowercase()]);
        }
        h = fnv1a(h, b"\0");
    }
    mix(fnv1a(h, target.as_bytes()))
}

/// Position of the `k`-th ring point of node `id`.
pub(crate) fn point_hash(id: u32, k: u32) -> u64 {
    mix(mix(id as u64) ^ (k as u64).wrapping_mul(0x2545_f491_4f6c_dd1d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_values() {
        // Fixed values: a change here moves every target of every deployed ring.
        assert_eq!(fnv1a(FNV_START, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(key_hash(None, "/x"), key_hash(None, "/x"));
        assert_eq!(
            key_hash(Some("A.example"), "/x"),
            key_hash(Some("a.example"), "/x")
        );
        assert_ne!(key_hash(Some("a"), "/x"), key_hash(None, "/x"));
        assert_ne!(point_hash(1, 0), point_hash(0, 1));
    }
}
