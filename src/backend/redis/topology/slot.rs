//! The hash slot of a key, as Redis Cluster computes it: CRC16 (XMODEM) of the hash tag (the
//! bytes between the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
//! Every key of one lock shares the tag `{<encoded name>}`, so one lock has one slot.

/// Slots in a Redis Cluster.
pub(in crate::backend::redis) const SLOTS: u16 = 16384;

/// The slot of `key`.
pub(in crate::backend::redis) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from CLUSTER KEYSLOT on Redis 7.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"dlock:{a}:fence"), slot_of(b"a"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot_of(b"{}x"), crc16(b"{}x") % SLOTS);
        assert_eq!(slot_of(b"x{y"), crc16(b"x{y") % SLOTS);
    }
}
