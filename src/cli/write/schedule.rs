//! A ramp's schedule, pure: the weight of each step and when it is
//! written.
//!
//! In: `-from` (per key), `-to`, `-over`, `-steps`. Out: the steps. Always
//! holds: `n` steps are written at `0, over/n, 2·over/n, …` (the first at
//! once, the last at `over − over/n`, so `-then` falls at `over`); never
//! more than one write a second (each is a raft commit on every consul
//! server); even steps are rounded to the nearest whole percent and the
//! last is exactly `-to`.

use std::time::Duration;

use crate::contract::Desired;

/// The fastest a ramp writes.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// `-steps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steps {
    /// `N` steps spaced evenly from each key's `-from` to `-to`.
    Even(usize),
    /// The weights, exactly.
    List(Vec<u16>),
}

impl Steps {
    pub fn parse(text: &str) -> Result<Steps, String> {
        if !text.contains(',') {
            if let Ok(n) = text.parse::<usize>() {
                return match n {
                    1..=10_000 => Ok(Steps::Even(n)),
                    _ => Err(format!("-steps {n}: give 1 to 10000 steps")),
                };
            }
        }
        let list = text
            .split(',')
            .map(|w| parse_pct(w.trim()).map_err(|e| format!("-steps {text}: {e}")))
            .collect::<Result<Vec<u16>, String>>()?;
        Ok(Steps::List(list))
    }

    pub fn count(&self) -> usize {
        match self {
            Steps::Even(n) => *n,
            Steps::List(l) => l.len(),
        }
    }

    /// The weight of step `k` (1-based) for a key ramping from `from`.
    pub fn weight(&self, from: u16, to: u16, k: usize) -> u16 {
        match self {
            Steps::List(l) => l[k - 1],
            Steps::Even(n) => {
                let (from, to, k, n) = (i64::from(from), i64::from(to), k as i64, *n as i64);
                // Nearest whole percent, halves away from `from`.
                let num = (to - from) * k;
                let step = (2 * num + n * num.signum()) / (2 * n);
                (from + step) as u16
            }
        }
    }
}

/// `N%` (or `N`), 0 to 256.
pub fn parse_pct(text: &str) -> Result<u16, String> {
    let digits = text.strip_suffix('%').unwrap_or(text);
    match digits.parse::<u16>() {
        Ok(n) if n <= Desired::MAX_WEIGHT_PCT && !digits.starts_with('+') => Ok(n),
        _ => Err(format!("{text:?} is not a weight (0% to 256%)")),
    }
}

/// When step `k` (1-based) of `n` is written, from the start.
pub fn offset(over: Duration, n: usize, k: usize) -> Duration {
    over * (k as u32 - 1) / n as u32
}

/// Refuses a schedule that writes more than once a second, naming the
/// shortest `-over` that fits: `n` steps `over/n` apart (and a `-then`
/// write, `then`, `over/n` after the last).
pub fn check_rate(over: Duration, n: usize, then: bool) -> Result<(), String> {
    if (n <= 1 && !then) || over / n as u32 >= MIN_INTERVAL {
        return Ok(());
    }
    Err(format!(
        "{n} steps over {} is more than one write a second: use -over {}s or more, or fewer -steps",
        secs(over),
        n
    ))
}

/// A duration as `-over` takes it back: `90s`, `1.500s`.
pub fn secs(d: Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{}s", d.as_secs()),
        _ => format!("{:.3}s", d.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_steps_round_to_the_nearest_percent_and_end_exactly_at_to() {
        let s = Steps::Even(3);
        assert_eq!(
            (1..=3).map(|k| s.weight(0, 100, k)).collect::<Vec<_>>(),
            [33, 67, 100]
        );
        assert_eq!(
            (1..=3).map(|k| s.weight(100, 0, k)).collect::<Vec<_>>(),
            [67, 33, 0]
        );
        let s = Steps::Even(10);
        assert_eq!(
            (1..=10).map(|k| s.weight(0, 100, k)).collect::<Vec<_>>(),
            [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
        );
        assert_eq!(
            Steps::Even(8).weight(0, 100, 1),
            13,
            "12.5 rounds away from -from"
        );
        assert_eq!(Steps::Even(8).weight(100, 0, 1), 87);
        assert_eq!(Steps::Even(4).weight(50, 50, 2), 50);
        for n in 1..40 {
            assert_eq!(Steps::Even(n).weight(7, 93, n), 93);
        }
    }

    #[test]
    fn lists_are_taken_exactly_and_checked() {
        let s = Steps::parse("1,5,25,50,100").unwrap();
        assert_eq!(s, Steps::List(vec![1, 5, 25, 50, 100]));
        assert_eq!((s.count(), s.weight(90, 0, 2)), (5, 5));
        assert_eq!(Steps::parse("25%,50%").unwrap(), Steps::List(vec![25, 50]));
        assert_eq!(Steps::parse("10").unwrap(), Steps::Even(10));
        assert_eq!(
            Steps::parse("50,").unwrap_err(),
            "-steps 50,: \"\" is not a weight (0% to 256%)"
        );
        assert!(Steps::parse("257%").is_err());
        assert!(Steps::parse("10001").is_err());
        assert!(Steps::parse("0").is_err());
        assert!(Steps::parse("1,300").is_err());
    }

    #[test]
    fn steps_are_even_over_the_duration_at_most_one_write_a_second() {
        let over = Duration::from_secs(600);
        let at: Vec<u64> = (1..=10).map(|k| offset(over, 10, k).as_secs()).collect();
        assert_eq!(at, [0, 60, 120, 180, 240, 300, 360, 420, 480, 540]);
        assert_eq!(offset(Duration::from_secs(3), 3, 3), Duration::from_secs(2));
        assert!(check_rate(Duration::from_secs(3), 3, false).is_ok());
        assert!(
            check_rate(Duration::from_secs(2), 2, true).is_ok(),
            "-then at -over"
        );
        assert!(check_rate(Duration::from_secs(10), 1, false).is_ok());
        assert!(check_rate(Duration::ZERO, 1, false).is_ok());
        assert!(check_rate(Duration::from_millis(500), 1, true).is_err());
        assert_eq!(
            check_rate(Duration::from_secs(5), 10, false).unwrap_err(),
            "10 steps over 5s is more than one write a second: use -over 10s or more, or fewer -steps"
        );
        assert!(check_rate(Duration::from_millis(9_999), 10, false).is_err());
    }
}
