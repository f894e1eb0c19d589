//! A tiny pseudo-random source for jitter (backoff spread, consul's wait
//! stagger in the dev KV). Not for anything that needs unpredictability.

/// xorshift64*: a few instructions a draw, never zero state.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Any seed; zero is replaced by a fixed non-zero one.
    pub fn new(seed: u64) -> Jitter {
        Jitter(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_seed_still_moves_and_draws_stay_below_the_bound() {
        let mut j = Jitter::new(0);
        let draws: Vec<u64> = (0..100).map(|_| j.below(10)).collect();
        assert!(draws.iter().all(|&d| d < 10));
        assert!(draws.iter().any(|&d| d != draws[0]), "not constant");
    }

    #[test]
    fn same_seed_same_sequence() {
        let (mut a, mut b) = (Jitter::new(7), Jitter::new(7));
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }
}
