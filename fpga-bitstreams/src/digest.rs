//! sha256 as lower-case hex (FIPS 180-4 through the `sha2` crate).

use sha2::{Digest, Sha256};

/// Lower-case hex of the sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> [u8; 64] {
    let sum = Sha256::digest(bytes);
    let mut out = [0u8; 64];
    for (i, b) in sum.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // FIPS 180-4 examples (NIST CSRC "SHA256.pdf"): "abc" and the empty string.
        assert_eq!(
            &sha256_hex(b"abc"),
            b"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            &sha256_hex(b""),
            b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
