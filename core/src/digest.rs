//! The one stable digest of kata-topo's own names and fingerprints (a hashed state file name,
//! the topology's fingerprint): FNV-1a, 64 bit, the same across builds and platforms, which
//! `DefaultHasher` is not. Not for anything an attacker must not collide.

/// FNV-1a, 64 bit, of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
