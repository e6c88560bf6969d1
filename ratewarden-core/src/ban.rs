//! Bans: after `after` refusals of one key within `within`, the key is
//! refused outright for `block`, longer on each repeat offence (times
//! `factor`, up to `max`). Part of a [`Policy`](crate::Policy)
//! ([`Policy::with_ban`](crate::Policy::with_ban)), applied by the store in
//! the same atomic step as the policy's algorithm, so that a ban costs no
//! round trip of its own.
//!
//! What a store keeps for a key's ban is a [`BanState`], beside (not
//! inside) the algorithm's state, and these functions are the semantics
//! every backend transcribes, as [`algorithm`](crate::algorithm) is:
//!
//! * A key is **banned** while `now < until`: every request is refused with
//!   `retry_after = until − now`, and nothing is recorded, neither a breach
//!   nor a unit: a ban never extends itself, however hard the key hammers.
//! * Otherwise the policy's algorithm decides. An admission touches no ban
//!   state. A **refusal is a breach**: the first opens a breach window of
//!   `within`; the `after`-th inside it bans the key for
//!   `min(block × factor^offences, max)` and clears the breaches.
//! * `offences` (bans given) are **forgiven** once the key has gone `max`
//!   past its last ban's end; breaches once their window ends. A state with
//!   neither is no state ([`BanState::expires_at`]).
//! * A peek reports a ban and records nothing; a penalty and a refund never
//!   touch a ban; a [reset](crate::Store::reset) forgets it with the key's
//!   state.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::algorithm::Verdict;
use crate::error::ConfigError;
use crate::policy::{MAX_WINDOW, MIN_WINDOW};
use crate::time::duration_to_micros;

/// The most offences a state counts: far past any growth that `max` does
/// not cap, and small enough that every backend's loop over them is short.
pub const MAX_OFFENCES: u32 = 64;

/// The most refusals a ban may wait for.
pub const MAX_BAN_AFTER: u32 = 1_000_000;

/// The largest growth factor of a ban.
pub const MAX_BAN_FACTOR: u32 = 1_000;

/// "After `after` refusals within `within`, refuse the key for `block`,
/// times `factor` on each repeat offence, up to `max`": validated once, at
/// construction.
///
/// ```
/// use std::time::Duration;
/// use ratewarden_core::{Ban, Policy};
///
/// let min = Duration::from_secs(60);
/// // Five failed logins a minute; the third refusal in ten minutes bans
/// // for 15 minutes, then 30, 60, … up to a day.
/// let ban = Ban::new(3, 10 * min, 15 * min)?.growing(2, 24 * 60 * min)?;
/// let login = Policy::fixed_window(5, min)?.with_ban(ban);
/// assert_eq!(login.to_string(), "fixed_window 5/min ban after 3 in 10min for 15min growing x2 up to 1d");
/// assert_eq!(ban.length(0), 15 * min);
/// assert_eq!(ban.length(3), 120 * min);
/// assert_eq!(ban.length(9), 24 * 60 * min);
/// # Ok::<(), ratewarden_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ban {
    // Never zero: `Option<Ban>` then needs no tag of its own, and a
    // policy without a ban is told by one comparison.
    after: NonZeroU32,
    within_us: u64,
    block_us: u64,
    factor: u32,
    max_us: u64,
}

impl Ban {
    /// Bans a key for `block` once it has been refused `after` times within
    /// `within`; the same length on every offence (see
    /// [`growing`](Self::growing)).
    ///
    /// Refuses `after` of 0 or above [`MAX_BAN_AFTER`], and durations under
    /// [`MIN_WINDOW`], over [`MAX_WINDOW`] or with a sub-microsecond part.
    pub fn new(after: u32, within: Duration, block: Duration) -> Result<Ban, ConfigError> {
        let refusals = NonZeroU32::new(after).filter(|n| n.get() <= MAX_BAN_AFTER);
        let Some(after) = refusals else {
            return Err(ConfigError::Invalid(format!(
                "a ban's refusal count must be from 1 to {MAX_BAN_AFTER}, not {after}"
            )));
        };
        let within_us = ban_duration("a ban's breach window", within)?;
        let block_us = ban_duration("a ban's length", block)?;
        Ok(Ban {
            after,
            within_us,
            block_us,
            factor: 1,
            max_us: block_us,
        })
    }

    /// The same ban, multiplied by `factor` on each repeat offence, never
    /// longer than `max`. Refuses a factor of 0 or above
    /// [`MAX_BAN_FACTOR`], and a `max` shorter than the ban or over
    /// [`MAX_WINDOW`].
    pub fn growing(self, factor: u32, max: Duration) -> Result<Ban, ConfigError> {
        if !(1..=MAX_BAN_FACTOR).contains(&factor) {
            return Err(ConfigError::Invalid(format!(
                "a ban's growth factor must be from 1 to {MAX_BAN_FACTOR}, not {factor}"
            )));
        }
        let max_us = ban_duration("a ban's longest length", max)?;
        if max_us < self.block_us {
            return Err(ConfigError::Invalid(format!(
                "a ban's longest length ({max:?}) must be at least its first ({:?})",
                self.block()
            )));
        }
        Ok(Ban {
            factor,
            max_us,
            ..self
        })
    }

    /// Refusals within [`within`](Self::within) that ban the key.
    pub fn after(&self) -> u32 {
        self.after.get()
    }

    /// The window in which refusals are counted.
    pub fn within(&self) -> Duration {
        Duration::from_micros(self.within_us)
    }

    /// The window in which refusals are counted, in microseconds.
    pub fn within_micros(&self) -> u64 {
        self.within_us
    }

    /// The first ban's length.
    pub fn block(&self) -> Duration {
        Duration::from_micros(self.block_us)
    }

    /// The first ban's length, in microseconds.
    pub fn block_micros(&self) -> u64 {
        self.block_us
    }

    /// What each repeat offence multiplies the ban by (1: no growth).
    pub fn factor(&self) -> u32 {
        self.factor
    }

    /// The longest ban, and how long after a ban's end its offences are
    /// remembered.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }

    /// [`max`](Self::max) in microseconds.
    pub fn max_micros(&self) -> u64 {
        self.max_us
    }

    /// The length of the ban that follows `offences` earlier ones.
    pub fn length(&self, offences: u32) -> Duration {
        Duration::from_micros(self.length_micros(offences))
    }

    /// [`length`](Self::length) in microseconds: `block × factor^offences`,
    /// capped at `max`, multiplied step by step so that it never
    /// overflows (every backend computes it the same way).
    pub fn length_micros(&self, offences: u32) -> u64 {
        let mut length = self.block_us;
        let mut n = 0;
        while n < offences && self.factor > 1 && length < self.max_us {
            length = length.saturating_mul(u64::from(self.factor));
            n += 1;
        }
        length.min(self.max_us)
    }
}

fn ban_duration(what: &str, d: Duration) -> Result<u64, ConfigError> {
    if d < MIN_WINDOW || d > MAX_WINDOW || !d.subsec_nanos().is_multiple_of(1_000) {
        return Err(ConfigError::Invalid(format!(
            "{what} must be whole microseconds from {MIN_WINDOW:?} to {MAX_WINDOW:?}, not {d:?}"
        )));
    }
    Ok(duration_to_micros(d))
}

/// What a store keeps of one key's ban, in microseconds; see the
/// [module](self) for what each field means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BanState {
    /// The key is banned until then (0: never banned, or forgiven).
    pub until: u64,
    /// Bans given so far, at most [`MAX_OFFENCES`].
    pub offences: u32,
    /// When the current breach window opened.
    pub start: u64,
    /// Refusals counted in the current breach window.
    pub breaches: u32,
}

impl BanState {
    /// After this moment the state is equivalent to none, and a store may
    /// forget it: garbage collection, never a decision.
    pub fn expires_at(&self, ban: &Ban) -> u64 {
        let breaches = if self.breaches > 0 {
            self.start.saturating_add(ban.within_us)
        } else {
            0
        };
        let offences = if self.offences > 0 || self.until > 0 {
            self.until.saturating_add(ban.max_us)
        } else {
            0
        };
        breaches.max(offences)
    }
}

/// The refusal a key banned at `now` gets; `None` when it is not banned.
pub fn banned(state: &Option<BanState>, now: u64) -> Option<Verdict> {
    match state {
        Some(s) if now < s.until => Some(refusal(s.until - now)),
        _ => None,
    }
}

/// Counts the algorithm's refusal `refused` as a breach of `ban` at `now`,
/// and returns what to answer: `refused` itself, or the refusal of the ban
/// it starts (`true`). The caller has checked that the key is not banned.
pub fn breach(
    state: &mut Option<BanState>,
    ban: &Ban,
    now: u64,
    refused: Verdict,
) -> (Verdict, bool) {
    let mut s = state.take().unwrap_or_default();
    if (s.offences > 0 || s.until > 0) && now >= s.until.saturating_add(ban.max_us) {
        s.offences = 0;
        s.until = 0;
    }
    if s.breaches > 0 && now >= s.start.saturating_add(ban.within_us) {
        s.breaches = 0;
    }
    if s.breaches == 0 {
        s.start = now;
    }
    s.breaches += 1;
    let answer = if s.breaches >= ban.after.get() {
        let length = ban.length_micros(s.offences);
        s.until = now.saturating_add(length);
        s.offences = (s.offences + 1).min(MAX_OFFENCES);
        s.breaches = 0;
        (refusal(length), true)
    } else {
        (refused, false)
    };
    *state = Some(s);
    answer
}

/// One decision under a ban: the ban's refusal while it lasts (nothing
/// recorded), else `apply`'s verdict, a refusal of which is a
/// [`breach`]. Returns whether the answer is a ban's.
pub fn decide(
    state: &mut Option<BanState>,
    ban: &Ban,
    now: u64,
    apply: impl FnOnce() -> Verdict,
) -> (Verdict, bool) {
    if let Some(refused) = banned(state, now) {
        return (refused, true);
    }
    let verdict = apply();
    if verdict.allowed {
        return (verdict, false);
    }
    breach(state, ban, now, verdict)
}

/// A ban's refusal with `left` microseconds to go.
fn refusal(left: u64) -> Verdict {
    Verdict {
        allowed: false,
        remaining: 0,
        reset_after_us: left,
        retry_after_us: left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn ban() -> Ban {
        Ban::new(3, Duration::from_secs(60), Duration::from_secs(10))
            .unwrap()
            .growing(2, Duration::from_secs(100))
            .unwrap()
    }

    fn refused() -> Verdict {
        Verdict {
            allowed: false,
            remaining: 0,
            reset_after_us: 5 * S,
            retry_after_us: 5 * S,
        }
    }

    #[test]
    fn the_third_refusal_bans_and_the_ban_grows_up_to_its_cap() {
        let b = ban();
        let mut st = None;
        let mut t = 1_000 * S;
        for (offence, expected) in [10, 20, 40, 80, 100, 100].into_iter().enumerate() {
            assert_eq!(breach(&mut st, &b, t, refused()), (refused(), false));
            assert_eq!(breach(&mut st, &b, t + 1, refused()), (refused(), false));
            let (v, is_ban) = breach(&mut st, &b, t + 2, refused());
            assert!(is_ban, "offence {offence}");
            assert_eq!(v.retry_after_us, expected * S, "offence {offence}");
            // While banned, nothing is recorded, however often asked.
            let held = st;
            for i in 0..5 {
                let (v, is_ban) = decide(&mut st, &b, t + 3 + i, || panic!("not applied"));
                assert!(is_ban && !v.allowed);
                assert_eq!(v.retry_after_us, expected * S - 1 - i);
            }
            assert_eq!(st, held);
            t += 2 + expected * S;
        }
    }

    #[test]
    fn breaches_outside_their_window_and_offences_past_max_are_forgotten() {
        let b = ban();
        let mut st = None;
        breach(&mut st, &b, 0, refused());
        breach(&mut st, &b, 59 * S, refused());
        // The window opened at 0 closed at 60 s: this one opens a new one.
        assert!(!breach(&mut st, &b, 60 * S, refused()).1);
        assert_eq!(st.unwrap().breaches, 1);
        breach(&mut st, &b, 61 * S, refused());
        assert!(breach(&mut st, &b, 62 * S, refused()).1);
        let until = st.unwrap().until;
        assert_eq!(st.unwrap().expires_at(&b), until + 100 * S);
        // A second offence within `max` of the first ban's end doubles...
        let mut again = st;
        for i in 0..3 {
            breach(&mut again, &b, until + 99 * S + i, refused());
        }
        assert_eq!(again.unwrap().until - (until + 99 * S + 2), 20 * S);
        // ...and one after it is a first offence again.
        for i in 0..3 {
            breach(&mut st, &b, until + 100 * S + i, refused());
        }
        assert_eq!(st.unwrap().until - (until + 100 * S + 2), 10 * S);
    }

    #[test]
    fn admissions_touch_nothing_and_a_ban_ends_exactly_on_time() {
        let b = Ban::new(1, Duration::from_secs(1), Duration::from_secs(10)).unwrap();
        let mut st = None;
        let admitted = Verdict {
            allowed: true,
            remaining: 1,
            reset_after_us: S,
            retry_after_us: 0,
        };
        assert_eq!(decide(&mut st, &b, 0, || admitted), (admitted, false));
        assert_eq!(st, None);
        assert!(decide(&mut st, &b, 0, refused).1);
        assert!(banned(&st, 10 * S - 1).is_some());
        assert_eq!(banned(&st, 10 * S), None);
        assert_eq!(decide(&mut st, &b, 10 * S, || admitted), (admitted, false));
    }

    #[test]
    fn bad_bans_are_refused() {
        let s = Duration::from_secs(1);
        assert!(Ban::new(0, s, s).is_err());
        assert!(Ban::new(MAX_BAN_AFTER + 1, s, s).is_err());
        assert!(Ban::new(1, Duration::ZERO, s).is_err());
        assert!(Ban::new(1, s, MAX_WINDOW + s).is_err());
        assert!(Ban::new(1, s, Duration::from_nanos(1_000_000_500)).is_err());
        let b = Ban::new(1, s, 10 * s).unwrap();
        assert!(b.growing(0, 10 * s).is_err());
        assert!(b.growing(MAX_BAN_FACTOR + 1, 10 * s).is_err());
        assert!(b.growing(2, 9 * s).is_err());
        assert_eq!(b.growing(2, 10 * s).unwrap().length(5), 10 * s);
        // The largest growth never overflows.
        let big = Ban::new(1, s, MAX_WINDOW)
            .unwrap()
            .growing(MAX_BAN_FACTOR, MAX_WINDOW)
            .unwrap();
        assert_eq!(big.length(MAX_OFFENCES), MAX_WINDOW);
    }
}
