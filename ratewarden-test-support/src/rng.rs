//! [`Rng`]: a xorshift generator for schedules that must be the same on
//! every run, and cheap enough that drawing a key costs nothing beside what
//! is measured.

/// A xorshift64 generator; the same seed gives the same sequence. The seed
/// must not be zero (zero stays zero).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next number of the sequence.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next number, reduced to `0..n`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
