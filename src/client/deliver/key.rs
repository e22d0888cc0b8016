//! What a message is known by while it is deduplicated (§4, §7: a message surfaces once,
//! however many copies of it come): a 128-bit keyed digest of its (sender, `id`).
//!
//! Every copy of every message is looked up in the dedup window, and a live copy on a durable
//! channel again when its application handles it and when its durable copy or offer comes.
//! Kept as the text `"<sender> <id>"`, each of those lookups hashed some ninety bytes again and
//! each record allocated a copy of them (`docs/benchmarks.md`). The digest is taken once per
//! copy and is its own hash. It is keyed with a secret of the process (std's SipHash, two
//! domain-separated outputs), so a peer that chooses ids cannot aim one at another sender's
//! message; by chance, two of the window's 65,536 keys meet with a probability of about
//! 2⁻⁹⁷.

use std::hash::{BuildHasher, Hasher, RandomState};

/// A message's (sender, `id`), digested.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MessageKey(u128);

/// The secret the keys of one client are taken with.
#[derive(Default)]
pub(crate) struct Keying(RandomState);

impl Keying {
    /// The key of the message `id` of `sender`.
    pub(crate) fn key(&self, sender: &str, id: &str) -> MessageKey {
        let high = self.0.hash_one((0u8, sender, id));
        let low = self.0.hash_one((1u8, sender, id));
        MessageKey(u128::from(high) << 64 | u128::from(low))
    }
}

/// Hashes a [`MessageKey`] as itself: it is a keyed digest already.
#[derive(Clone, Copy, Default)]
pub(crate) struct Digested;

impl BuildHasher for Digested {
    type Hasher = DigestHasher;

    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(0)
    }
}

/// The hasher of [`Digested`].
pub(crate) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn write_u128(&mut self, digest: u128) {
        self.0 ^= digest as u64;
    }

    /// Only [`MessageKey`]s are hashed here; other input is folded in all the same.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_ne_bytes(word);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_its_sender_and_id_apart() {
        let keying = Keying::default();
        let key = keying.key("alice", "m1");
        assert_eq!(key, keying.key("alice", "m1"));
        assert_ne!(key, keying.key("bob", "m1"), "another sender, the same id");
        assert_ne!(key, keying.key("alice", "m2"));
        // The boundary between sender and id is part of what is digested.
        assert_ne!(keying.key("a b", "c"), keying.key("a", "b c"));
        assert_ne!(
            Keying::default().key("alice", "m1"),
            key,
            "each client keys with its own secret"
        );
    }
}
