//! The four algorithms as pure state transitions: the normative semantics
//! every backend must reproduce exactly.
//!
//! All arithmetic is on integer microseconds (`W` is the window, `L` the
//! limit, `c` the cost, `now` the caller's time). Every algorithm obeys the
//! same three rules, which the conformance suite attacks:
//!
//! * **A refused request changes nothing.** Hammering after a refusal never
//!   moves the moment access returns.
//! * **Expiry is fixed when a window opens**, never moved by later hits.
//! * **Time that goes backwards is clamped**, per key, to the latest time the
//!   key has seen, so a clock stepped back can make a decision stricter but
//!   never admit more than the limit. A clock stepped forward is believed:
//!   the windows it skips are over, so a host whose wall clock jumps ahead
//!   admits up to one more window's limit in real time.
//!
//! Backends written in another language (Lua, SQL) transcribe these
//! functions; products are bounded by [`MAX_EXACT`](crate::policy::MAX_EXACT)
//! by [`Policy`]'s validation so doubles compute them exactly.
//!
//! | algorithm | state | admitted when |
//! |---|---|---|
//! | sliding log | timestamps `t` of admitted units, oldest first | `#{t : t + W > now} + c ≤ L` |
//! | fixed window | `(start, count)`, reopened at `now` once `now ≥ start + W` | `count + c ≤ L` |
//! | sliding window | `(start, current, previous)` with `start = now − now mod W` | `previous·(W − (now − start)) + (current + c)·W ≤ L·W` |
//! | GCRA | theoretical arrival time `tat`, `T = ⌊W / L⌋` | `max(tat, now) + c·T − now ≤ L·T` |
//!
//! Over 500 lines with its unit tests; the algorithms themselves are about
//! 460 with the [`Algorithm`] names, kept in one file because they are the
//! normative text every backend transcribes.

use std::collections::VecDeque;

use crate::policy::Policy;

/// The algorithm a [`Policy`] applies. Its exact semantics are the
/// functions of this module, and every backend must match them decision for
/// decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Exact: a log of the admitted requests' timestamps, at most `limit`
    /// entries per key. A request is admitted when fewer than `limit` units
    /// were admitted in the last `window`.
    SlidingLog,
    /// A counter per key; the window opens at the first request and its end
    /// is fixed then, never moved by later hits.
    FixedWindow,
    /// Two epoch-aligned fixed windows, the previous one weighted by how much
    /// of it still overlaps the sliding window. O(1) per key, approximate.
    SlidingWindow,
    /// The generic cell rate algorithm (a token bucket of `limit` tokens
    /// refilled evenly over `window`). O(1) per key, smooth.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ];

    /// A short, stable, lowercase name, usable in storage keys and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one request, in microseconds; see
/// [`Decision`](crate::Decision) for the meaning of each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The request is admitted.
    pub allowed: bool,
    /// Units still admissible now.
    pub remaining: u32,
    /// Microseconds until the key holds no counted units.
    pub reset_after_us: u64,
    /// Zero when admitted; otherwise microseconds until the same request
    /// would be admitted.
    pub retry_after_us: u64,
}

/// The state one key holds under one algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// Timestamps of admitted units, oldest first, at most `limit` of them.
    SlidingLog(VecDeque<u64>),
    /// The window's opening time and the units admitted in it.
    FixedWindow {
        /// When the window opened; it closes at `start + W`.
        start: u64,
        /// Units admitted in this window.
        count: u64,
    },
    /// The current epoch-aligned window and the counts of it and the one
    /// before it.
    SlidingWindow {
        /// Start of the current window, a multiple of `W`.
        start: u64,
        /// Units admitted in the current window.
        current: u64,
        /// Units admitted in the window before it.
        previous: u64,
    },
    /// GCRA's theoretical arrival time.
    Gcra {
        /// The time at which the bucket would be full again.
        tat: u64,
    },
}

impl KeyState {
    /// The moment after which this state is equivalent to no state at all,
    /// so a store may forget it: garbage collection, never a decision.
    pub fn expires_at(&self, policy: &Policy) -> u64 {
        let w = policy.window_micros();
        match self {
            KeyState::SlidingLog(log) => log.back().map_or(0, |t| t.saturating_add(w)),
            KeyState::FixedWindow { start, .. } => start.saturating_add(w),
            KeyState::SlidingWindow { start, .. } => start.saturating_add(2 * w),
            KeyState::Gcra { tat } => *tat,
        }
    }

    /// Which algorithm this state belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            KeyState::SlidingLog(_) => Algorithm::SlidingLog,
            KeyState::FixedWindow { .. } => Algorithm::FixedWindow,
            KeyState::SlidingWindow { .. } => Algorithm::SlidingWindow,
            KeyState::Gcra { .. } => Algorithm::Gcra,
        }
    }
}

/// The verdict [`apply`] would give, leaving `state` as it is: what a
/// [`Store::peek`](crate::Store::peek) answers. Costs a copy of the state
/// (a sliding log's timestamps), which a peek, off the hot path, can
/// afford; a second transcription of every algorithm could drift from
/// `apply`, which this cannot.
pub fn peek(state: &Option<KeyState>, policy: &Policy, cost: u32, now: u64) -> Verdict {
    apply(&mut state.clone(), policy, cost, now)
}

/// Applies `policy` to one key's `state` for a request of `cost` units at
/// `now` (µs). `None` means the key holds nothing; state of another
/// algorithm is discarded. The caller must have checked `cost` with
/// [`Policy::validate_cost`]; an invalid cost is refused here rather than
/// panicking.
// Inlined into a store's decision as far as `apply_held`'s test; the rest
// (`apply_any`) out of line, so that the store's decision is not compiled
// around its registers.
#[inline]
pub fn apply(state: &mut Option<KeyState>, policy: &Policy, cost: u32, now: u64) -> Verdict {
    match apply_held(state, policy, cost, now) {
        Some(verdict) => verdict,
        None => apply_any(state, policy, cost, now),
    }
}

/// [`apply`] on the road most decisions take, or `None`, having changed
/// nothing: a GCRA policy and a valid cost on a key that already holds
/// GCRA state, which changes in place. Every other case (another
/// algorithm, a key's first request, another algorithm's state to drop)
/// is `apply`'s.
///
/// For a store's hot path: this road needs a few registers and no call,
/// while `apply` as a whole (a sliding log's `VecDeque`, state to drop)
/// would have the store's decision compiled around all of them. A store
/// that gets `None` calls `apply`; the verdicts are the same.
///
/// ```
/// use std::time::Duration;
/// use ratewarden_core::Policy;
/// use ratewarden_core::algorithm::{apply, apply_held};
///
/// let policy = Policy::gcra(10, Duration::from_secs(1))?;
/// let mut state = None;
/// // A key that holds nothing is not on this road.
/// assert_eq!(apply_held(&mut state, &policy, 1, 0), None);
/// assert!(apply(&mut state, &policy, 1, 0).allowed);
/// let mut copy = state.clone();
/// assert_eq!(apply_held(&mut state, &policy, 1, 0), Some(apply(&mut copy, &policy, 1, 0)));
/// assert_eq!(state, copy);
/// # Ok::<(), ratewarden_core::ConfigError>(())
/// ```
#[inline]
pub fn apply_held(
    state: &mut Option<KeyState>,
    policy: &Policy,
    cost: u32,
    now: u64,
) -> Option<Verdict> {
    match (policy.algorithm(), state) {
        (Algorithm::Gcra, Some(KeyState::Gcra { tat })) if policy.admits_cost(cost) => {
            let t = policy.emission_interval_micros();
            Some(gcra_step(
                tat,
                u64::from(policy.limit()) * t,
                t,
                u64::from(cost),
                now,
            ))
        }
        _ => None,
    }
}

/// [`apply`] for any state and any cost.
#[inline(never)]
fn apply_any(state: &mut Option<KeyState>, policy: &Policy, cost: u32, now: u64) -> Verdict {
    if !policy.admits_cost(cost) {
        return Verdict {
            allowed: false,
            remaining: 0,
            reset_after_us: 0,
            retry_after_us: u64::MAX,
        };
    }
    if state
        .as_ref()
        .is_some_and(|s| s.algorithm() != policy.algorithm())
    {
        *state = None;
    }
    let l = u64::from(policy.limit());
    let w = policy.window_micros();
    let c = u64::from(cost);
    match policy.algorithm() {
        Algorithm::SlidingLog => sliding_log(state, l, w, c, now),
        Algorithm::FixedWindow => fixed_window(state, l, w, c, now),
        Algorithm::SlidingWindow => sliding_window(state, l, w, c, now),
        Algorithm::Gcra => gcra(state, l, policy.emission_interval_micros(), c, now),
    }
}

/// Records `cost` units on one key's `state` at `now` whether or not they
/// fit: an application's late charge ([`Store::penalize`](crate::Store::penalize)),
/// such as a failed payment costing 5. The units are counted as an
/// admission at `now` would count them, so that the key waits longer, even
/// when it is already over its limit. Bounded, so that memory per key and
/// the backends' exact arithmetic stay bounded and no run of penalties
/// locks a key out for more than about one window:
///
/// | algorithm | penalty | longest wait it can cause |
/// |---|---|---|
/// | sliding log | `c` entries at `now`; the oldest beyond `L` entries are dropped | `W` |
/// | fixed window | `count = min(count + c, L)` in the open window, or a window opened at `now` | the window's end |
/// | sliding window | `current = min(current + c, L)`, after the roll-over `apply` makes | the window's end, then `W / L` |
/// | GCRA | `tat = min(max(tat, now) + c·T, now + L·T + W − T)` | `W` |
///
/// A penalty never makes a key more permissive: each bound keeps what was
/// already there when that is more (a clock behind the key's time). An
/// invalid cost changes nothing; the caller checks it with
/// [`Policy::validate_cost`] and answers an error.
pub fn penalize(state: &mut Option<KeyState>, policy: &Policy, cost: u32, now: u64) {
    if !policy.admits_cost(cost) {
        return;
    }
    if state
        .as_ref()
        .is_some_and(|s| s.algorithm() != policy.algorithm())
    {
        *state = None;
    }
    let l = u64::from(policy.limit());
    let w = policy.window_micros();
    let c = u64::from(cost);
    match policy.algorithm() {
        Algorithm::SlidingLog => {
            let (log, t) = live_log(state, w, now);
            log.extend(std::iter::repeat_n(t, c as usize));
            while log.len() as u64 > l {
                log.pop_front();
            }
        }
        Algorithm::FixedWindow => {
            let (start, count) = open_window(state, w, now);
            let count = count.max((count + c).min(l));
            *state = Some(KeyState::FixedWindow { start, count });
        }
        Algorithm::SlidingWindow => {
            let (start, current, previous) = rolled_window(state, w, now);
            let current = current.max((current + c).min(l));
            *state = Some(KeyState::SlidingWindow {
                start,
                current,
                previous,
            });
        }
        Algorithm::Gcra => {
            let t = policy.emission_interval_micros();
            let tat = match *state {
                Some(KeyState::Gcra { tat }) => tat.max(now),
                _ => now,
            };
            // A full bucket (`now + L·T`) and one window more, less the
            // unit a request asks for: a wait of at most `W`.
            let tat = tat.max((tat + c * t).min(now + l * t + w - t));
            *state = Some(KeyState::Gcra { tat });
        }
    }
}

fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A sliding log's live entries at `now`, what has expired dropped, and
/// the time they were judged at.
fn live_log(state: &mut Option<KeyState>, w: u64, now: u64) -> (&mut VecDeque<u64>, u64) {
    let log = match state.get_or_insert_with(|| KeyState::SlidingLog(VecDeque::new())) {
        KeyState::SlidingLog(log) => log,
        _ => unreachable!("state was reset to this algorithm above"),
    };
    // Clamp a clock that went backwards to the newest entry: the log stays
    // sorted and nothing admitted can expire early.
    let t = now.max(log.back().copied().unwrap_or(0));
    while log.front().is_some_and(|&e| e.saturating_add(w) <= t) {
        log.pop_front();
    }
    (log, t)
}

/// The fixed window open at `now`, `(start, count)`: the stored one, or
/// one opening now.
fn open_window(state: &Option<KeyState>, w: u64, now: u64) -> (u64, u64) {
    match *state {
        // A clock behind `start` stays inside the open window.
        Some(KeyState::FixedWindow { start, count }) if now < start.saturating_add(w) => {
            (start, count)
        }
        _ => (now, 0),
    }
}

/// A sliding window rolled over to `now`'s window, `(start, current,
/// previous)`.
fn rolled_window(state: &Option<KeyState>, w: u64, now: u64) -> (u64, u64, u64) {
    let aligned = now - now % w;
    match *state {
        // A clock behind the stored window is clamped to its start.
        Some(KeyState::SlidingWindow {
            start,
            current,
            previous,
        }) if start >= aligned => (start, current, previous),
        Some(KeyState::SlidingWindow { start, current, .. }) if start + w == aligned => {
            (aligned, 0, current)
        }
        _ => (aligned, 0, 0),
    }
}

fn sliding_log(state: &mut Option<KeyState>, l: u64, w: u64, c: u64, now: u64) -> Verdict {
    let (log, t) = live_log(state, w, now);
    let count = log.len() as u64;
    if count + c <= l {
        log.extend(std::iter::repeat_n(t, c as usize));
        Verdict {
            allowed: true,
            remaining: to_u32(l - count - c),
            reset_after_us: (t + w).saturating_sub(now),
            retry_after_us: 0,
        }
    } else {
        // The (count + c - l)-th oldest entry must expire first.
        let freeing = log[(count + c - l - 1) as usize];
        let newest = log.back().copied().unwrap_or(t);
        Verdict {
            allowed: false,
            remaining: to_u32(l.saturating_sub(count)),
            reset_after_us: newest.saturating_add(w).saturating_sub(now),
            retry_after_us: freeing.saturating_add(w).saturating_sub(now),
        }
    }
}

fn fixed_window(state: &mut Option<KeyState>, l: u64, w: u64, c: u64, now: u64) -> Verdict {
    let (start, count) = open_window(state, w, now);
    let end = start.saturating_add(w);
    if count + c <= l {
        *state = Some(KeyState::FixedWindow {
            start,
            count: count + c,
        });
        Verdict {
            allowed: true,
            remaining: to_u32(l - count - c),
            reset_after_us: end.saturating_sub(now),
            retry_after_us: 0,
        }
    } else {
        Verdict {
            allowed: false,
            remaining: to_u32(l.saturating_sub(count)),
            reset_after_us: end.saturating_sub(now),
            retry_after_us: end.saturating_sub(now),
        }
    }
}

fn sliding_window(state: &mut Option<KeyState>, l: u64, w: u64, c: u64, now: u64) -> Verdict {
    let (start, current, previous) = rolled_window(state, w, now);
    let t = now.max(start);
    let elapsed = t - start;
    let weighted = previous * (w - elapsed);
    let allowed = weighted + (current + c) * w <= l * w;
    let current = if allowed { current + c } else { current };
    let remaining = (l * w).saturating_sub(weighted + current * w) / w;
    let end_of_current = start + w;
    let reset_at = if current > 0 {
        end_of_current + w
    } else if previous > 0 {
        end_of_current
    } else {
        t
    };
    let retry_at = if allowed {
        now
    } else {
        sliding_window_retry_at(l, w, c, start, elapsed, current, previous)
    };
    // A refusal writes nothing, not even the roll-over to a new window: the
    // stored state and `now` determine that again on the next call.
    if allowed {
        *state = Some(KeyState::SlidingWindow {
            start,
            current,
            previous,
        });
    }
    Verdict {
        allowed,
        remaining: to_u32(remaining),
        reset_after_us: reset_at.saturating_sub(now),
        retry_after_us: retry_at.saturating_sub(now),
    }
}

/// The earliest time at which a request of `c` units would pass, given that
/// nothing else is admitted meanwhile.
fn sliding_window_retry_at(
    l: u64,
    w: u64,
    c: u64,
    start: u64,
    elapsed: u64,
    current: u64,
    previous: u64,
) -> u64 {
    // Later in this window, as the previous window's weight decays:
    // previous·(W − e) ≤ (L − current − c)·W.
    if previous > 0 && current + c <= l {
        let e = w - ((l - current - c) * w / previous).min(w);
        if e < w {
            return start + e.max(elapsed);
        }
    }
    // In the next window, the current count becomes the previous one:
    // current·(W − e) ≤ (L − c)·W.
    let e = ((l - c) * w)
        .checked_div(current)
        .map_or(0, |fits| w - fits.min(w));
    start + w + e
}

fn gcra(state: &mut Option<KeyState>, l: u64, t: u64, c: u64, now: u64) -> Verdict {
    if let Some(KeyState::Gcra { tat }) = state {
        return gcra_step(tat, l * t, t, c, now);
    }
    // A key that holds nothing is a key whose bucket is full at `now`.
    let mut tat = now;
    let verdict = gcra_step(&mut tat, l * t, t, c, now);
    if verdict.allowed {
        *state = Some(KeyState::Gcra { tat });
    }
    verdict
}

/// GCRA on a key's theoretical arrival time `tat`, changed only by an
/// admission; `burst` is `L·T`.
#[inline(always)]
fn gcra_step(tat: &mut u64, burst: u64, t: u64, c: u64, now: u64) -> Verdict {
    let from = (*tat).max(now);
    let new_tat = from + c * t;
    if new_tat - now <= burst {
        *tat = new_tat;
        Verdict {
            allowed: true,
            remaining: to_u32((burst - (new_tat - now)) / t),
            reset_after_us: new_tat - now,
            retry_after_us: 0,
        }
    } else {
        // Refused, so fewer than `c` units are free now: none at the usual
        // cost of 1, which spares the division.
        let remaining = if c == 1 {
            0
        } else {
            to_u32(burst.saturating_sub(from - now) / t)
        };
        Verdict {
            allowed: false,
            remaining,
            reset_after_us: from - now,
            retry_after_us: new_tat - burst - now,
        }
    }
}

/// Undoes one admission of `cost` units that [`apply`] made at `now` and
/// answered with `reset_after_us`: the compensation a
/// [`Limiter`](crate::Limiter) makes when a later rule refuses a request
/// that an earlier one admitted.
///
/// The admitted verdict's `now + reset_after_us` locates exactly what the
/// admission wrote (the log entries' time, the window it counted in, the
/// theoretical arrival time it set), so the refund removes those units and
/// nothing else. When the state no longer holds them as written — the
/// window has rolled past, the entries expired or were evicted, or (GCRA
/// only) another admission has moved the arrival time since — the refund
/// removes less or nothing. A refund therefore leaves the key exactly as if
/// the request had never been admitted, or stricter; never more permissive,
/// with one exception under concurrency: a fixed window keeps its opening
/// time when the request that opened it is refunded after another request
/// was admitted into it, so it ends up to the gap between those two
/// requests earlier than it would have. Applied in order (each refund
/// before the next request of the key), as a [`Limiter`](crate::Limiter)
/// applies a single client's sequential requests, refunds are exact for
/// every algorithm when time moves forward.
///
/// | algorithm | anchor `a = now + reset_after` | refund |
/// |---|---|---|
/// | sliding log | entries at `t = a − W` | remove up to `c` entries equal to `t` |
/// | fixed window | window start `a − W` | `count −= c` if the window is still that one; the window is dropped when its count reaches 0 |
/// | sliding window | window start `s = a − 2W` | `current −= c` if the window is `s`; `previous −= c` if it rolled once to `s + W` |
/// | GCRA | arrival time `a` | `tat −= c·T` only if `tat = a` (no admission since) |
///
/// Each admission must be refunded at most once: the counters cannot tell
/// a second refund of the same request from the refund of another.
/// Returns whether anything changed. An invalid cost changes nothing.
pub fn refund(
    state: &mut Option<KeyState>,
    policy: &Policy,
    cost: u32,
    now: u64,
    reset_after_us: u64,
) -> bool {
    if !policy.admits_cost(cost) {
        return false;
    }
    let Some(anchor) = now.checked_add(reset_after_us) else {
        return false;
    };
    let w = policy.window_micros();
    let c = u64::from(cost);
    match (state.as_mut(), policy.algorithm()) {
        (Some(KeyState::SlidingLog(log)), Algorithm::SlidingLog) => {
            let Some(t) = anchor.checked_sub(w) else {
                return false;
            };
            // The log is sorted, so the entries equal to `t` are one run.
            let end = log.partition_point(|&e| e <= t);
            let start = log.partition_point(|&e| e < t);
            let n = (end - start).min(c as usize);
            if n == 0 {
                return false;
            }
            log.drain(end - n..end);
            if log.is_empty() {
                *state = None;
            }
            true
        }
        (Some(KeyState::FixedWindow { start, count }), Algorithm::FixedWindow) => {
            if anchor.checked_sub(w) != Some(*start) || *count == 0 {
                return false;
            }
            *count -= c.min(*count);
            // A window holding nothing was opened by refunded requests
            // only: without them it would open at the next admission, not
            // end early at `start + W`.
            if *count == 0 {
                *state = None;
            }
            true
        }
        (
            Some(KeyState::SlidingWindow {
                start,
                current,
                previous,
            }),
            Algorithm::SlidingWindow,
        ) => {
            let Some(counted_in) = anchor.checked_sub(2 * w) else {
                return false;
            };
            // Units counted in window `s` are `current` while it lasts and
            // `previous` for one window after it rolls over.
            let units = if *start == counted_in {
                current
            } else if *start == counted_in + w {
                previous
            } else {
                return false;
            };
            if *units == 0 {
                return false;
            }
            *units -= c.min(*units);
            true
        }
        (Some(KeyState::Gcra { tat }), Algorithm::Gcra) => {
            // Another admission since has moved `tat` from the anchor, and
            // may have restarted the bucket from its own `now` (absorbing
            // this request's units): subtracting then could admit more than
            // if this request had never come. Leave it stricter.
            if *tat != anchor {
                return false;
            }
            *tat -= c * policy.emission_interval_micros();
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: u64 = 1_000_000;
    const T0: u64 = 1_767_225_600 * S;

    fn run(policy: &Policy, state: &mut Option<KeyState>, cost: u32, now: u64) -> Verdict {
        apply(state, policy, cost, now)
    }

    #[test]
    fn sliding_log_boundaries() {
        let p = Policy::sliding_log(3, Duration::from_secs(10)).unwrap();
        let mut s = None;
        for (i, at) in [0, 1, 2].iter().enumerate() {
            let v = run(&p, &mut s, 1, T0 + at * S);
            assert!(v.allowed);
            assert_eq!(v.remaining, 2 - i as u32);
            assert_eq!(v.reset_after_us, 10 * S);
        }
        let v = run(&p, &mut s, 1, T0 + 5 * S);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.retry_after_us, 5 * S);
        assert_eq!(v.reset_after_us, 7 * S);
        assert!(!run(&p, &mut s, 1, T0 + 10 * S - 1).allowed);
        assert!(run(&p, &mut s, 1, T0 + 10 * S).allowed);
        // Cost 2 needs the two oldest of (1, 2, 10) gone: at 12 s.
        let v = run(&p, &mut s, 2, T0 + 10 * S);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 2 * S);
        assert!(run(&p, &mut s, 2, T0 + 12 * S).allowed);
        match &s {
            Some(KeyState::SlidingLog(log)) => assert_eq!(log.len(), 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fixed_window_expiry_is_fixed_at_open() {
        let p = Policy::fixed_window(2, Duration::from_secs(10)).unwrap();
        let mut s = None;
        assert!(run(&p, &mut s, 1, T0).allowed);
        let v = run(&p, &mut s, 1, T0 + 9 * S);
        assert!(v.allowed);
        assert_eq!(v.reset_after_us, S);
        let v = run(&p, &mut s, 1, T0 + 9 * S + 1);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, S - 1);
        let v = run(&p, &mut s, 1, T0 + 10 * S);
        assert!(v.allowed);
        assert_eq!(v.reset_after_us, 10 * S);
    }

    #[test]
    fn sliding_window_weights_previous_window() {
        let p = Policy::sliding_window(10, Duration::from_secs(10)).unwrap();
        let mut s = None;
        assert!(run(&p, &mut s, 10, T0).allowed);
        let v = run(&p, &mut s, 1, T0 + 5 * S);
        assert!(!v.allowed);
        // Next window at T0+10 s: previous = 10, weight must drop to 9/10.
        assert_eq!(v.retry_after_us, 6 * S);
        assert!(!run(&p, &mut s, 1, T0 + 11 * S - 1).allowed);
        let v = run(&p, &mut s, 1, T0 + 11 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        // At 15 s: 10·5/10 + 1 = 6, so 4 remain.
        let v = run(&p, &mut s, 4, T0 + 15 * S);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        let v = run(&p, &mut s, 1, T0 + 15 * S);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, S);
    }

    #[test]
    fn gcra_bursts_then_refills_evenly() {
        let p = Policy::gcra(4, Duration::from_secs(8)).unwrap();
        let mut s = None;
        for left in (0..4).rev() {
            let v = run(&p, &mut s, 1, T0);
            assert!(v.allowed);
            assert_eq!(v.remaining, left);
        }
        let v = run(&p, &mut s, 1, T0);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 2 * S);
        assert_eq!(v.reset_after_us, 8 * S);
        assert!(!run(&p, &mut s, 1, T0 + 2 * S - 1).allowed);
        assert!(run(&p, &mut s, 1, T0 + 2 * S).allowed);
    }

    /// A refusal still reports the whole units left: none while the bucket
    /// is empty, one when exactly one interval has refilled.
    #[test]
    fn gcra_refusal_counts_the_units_left() {
        let p = Policy::gcra(4, Duration::from_secs(8)).unwrap();
        let mut s = None;
        assert!(run(&p, &mut s, 3, T0).allowed);
        let v = run(&p, &mut s, 2, T0);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 1);
        assert!(run(&p, &mut s, 1, T0).allowed);
        let v = run(&p, &mut s, 1, T0 + 2 * S - 1);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        // Two refilled intervals, one unit short of the three asked for.
        let v = run(&p, &mut s, 3, T0 + 4 * S);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 2);
    }

    /// `apply`'s in-place road for a key holding GCRA state gives what the
    /// general road gives, verdict and state, admitted or refused, with
    /// the clock ahead of the key's time and behind it.
    #[test]
    fn gcra_in_place_road_matches_the_general_one() {
        for (limit, window_ms) in [(1, 1_000), (4, 8_000), (10, 11), (1_000, 60_000)] {
            let p = Policy::gcra(limit, Duration::from_millis(window_ms)).unwrap();
            let (mut fast, mut general) = (None, None);
            let mut step = 0u64;
            for i in 0..200u64 {
                step = (step * 31 + i * 17) % 997;
                let now = T0 + step * window_ms * 1_000 / 500;
                let cost = 1 + (i % 3) as u32 % limit;
                let held = fast.is_some();
                let a = apply(&mut fast, &p, cost, now);
                let b = apply_any(&mut general, &p, cost, now);
                assert_eq!(a, b, "limit {limit}, request {i}, in place: {held}");
                assert_eq!(fast, general, "limit {limit}, request {i}");
            }
        }
        // State of another algorithm under a GCRA policy takes the general
        // road: discarded, and the bucket full.
        let p = Policy::gcra(2, Duration::from_secs(1)).unwrap();
        let mut s = Some(KeyState::FixedWindow {
            start: T0,
            count: 9,
        });
        assert!(apply(&mut s, &p, 2, T0).allowed);
        assert!(matches!(s, Some(KeyState::Gcra { .. })));
    }

    #[test]
    fn gcra_never_bursts_past_limit_with_uneven_interval() {
        // 11 µs / 10 rounds the interval down to 1 µs; the burst is 10, not 11.
        let p = Policy::gcra(10, Duration::from_micros(1_000 * 11)).unwrap();
        let mut s = None;
        let admitted = (0..20).filter(|_| run(&p, &mut s, 1, T0).allowed).count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn refusals_change_nothing() {
        for algorithm in Algorithm::ALL {
            let p = Policy::new(algorithm, 3, Duration::from_secs(10)).unwrap();
            let mut s = None;
            while run(&p, &mut s, 1, T0).allowed {}
            let snapshot = s.clone();
            let first = run(&p, &mut s, 1, T0 + 1);
            for i in 0..100 {
                run(&p, &mut s, 1, T0 + 1 + i * 1000);
            }
            assert_eq!(s, snapshot, "{algorithm}");
            let again = run(&p, &mut s, 1, T0 + 1);
            assert_eq!(first, again, "{algorithm}");
        }
    }

    #[test]
    fn clock_regression_never_over_admits() {
        for algorithm in Algorithm::ALL {
            let p = Policy::new(algorithm, 5, Duration::from_secs(10)).unwrap();
            let mut s = None;
            let mut admitted = 0;
            for i in 0..50u64 {
                // Alternate between a clock 9 s ahead and the true one.
                let now = if i % 2 == 0 { T0 + 9 * S } else { T0 };
                admitted += u32::from(run(&p, &mut s, 1, now).allowed);
            }
            assert!(admitted <= 5, "{algorithm} admitted {admitted}");
        }
    }

    #[test]
    fn invalid_cost_is_refused_without_panicking() {
        let p = Policy::gcra(2, Duration::from_secs(1)).unwrap();
        let mut s = None;
        assert!(!run(&p, &mut s, 0, T0).allowed);
        assert!(!run(&p, &mut s, 3, T0).allowed);
        assert_eq!(s, None);
    }

    fn admit(p: &Policy, s: &mut Option<KeyState>, cost: u32, now: u64) -> Verdict {
        let v = apply(s, p, cost, now);
        assert!(v.allowed, "setup admission refused: {v:?}");
        v
    }

    #[test]
    fn refund_restores_the_state_before_the_admission() {
        for algorithm in Algorithm::ALL {
            let p = Policy::new(algorithm, 4, Duration::from_secs(10)).unwrap();
            let mut s = None;
            admit(&p, &mut s, 1, T0);
            admit(&p, &mut s, 1, T0 + 3 * S);
            let before = s.clone();
            let v = admit(&p, &mut s, 2, T0 + 5 * S);
            assert!(
                refund(&mut s, &p, 2, T0 + 5 * S, v.reset_after_us),
                "{algorithm}"
            );
            // Same future as if the refunded request had never come.
            let exact = before;
            for at in [5, 6, 9, 13, 15, 21] {
                let now = T0 + at * S;
                assert_eq!(
                    apply(&mut s.clone(), &p, 2, now),
                    apply(&mut exact.clone(), &p, 2, now),
                    "{algorithm} at +{at}s"
                );
            }
        }
    }

    #[test]
    fn refund_of_a_rolled_over_window_is_never_more_permissive() {
        // Fixed window: the window that counted the request has closed and
        // a new one opened; its count is not touched.
        let p = Policy::fixed_window(2, Duration::from_secs(10)).unwrap();
        let mut s = None;
        let v = admit(&p, &mut s, 1, T0);
        admit(&p, &mut s, 2, T0 + 10 * S);
        assert!(!refund(&mut s, &p, 1, T0, v.reset_after_us));
        assert!(!apply(&mut s, &p, 1, T0 + 10 * S).allowed);
        // Sliding window: one roll-over moves the units to `previous`,
        // where the refund finds them.
        let p = Policy::sliding_window(10, Duration::from_secs(10)).unwrap();
        let mut s = None;
        let v = admit(&p, &mut s, 10, T0);
        admit(&p, &mut s, 1, T0 + 19 * S);
        assert!(refund(&mut s, &p, 10, T0, v.reset_after_us));
        assert_eq!(
            s,
            Some(KeyState::SlidingWindow {
                start: T0 + 10 * S,
                current: 1,
                previous: 0
            })
        );
        // GCRA: a later admission moved the arrival time; no refund.
        let p = Policy::gcra(4, Duration::from_secs(8)).unwrap();
        let mut s = None;
        let v = admit(&p, &mut s, 1, T0);
        admit(&p, &mut s, 1, T0 + 5 * S);
        let held = s.clone();
        assert!(!refund(&mut s, &p, 1, T0, v.reset_after_us));
        assert_eq!(s, held);
    }

    #[test]
    fn refund_of_a_sliding_log_removes_only_its_own_entries() {
        let p = Policy::sliding_log(5, Duration::from_secs(10)).unwrap();
        let mut s = None;
        admit(&p, &mut s, 1, T0);
        let v = admit(&p, &mut s, 2, T0 + S);
        admit(&p, &mut s, 1, T0 + 2 * S);
        assert!(refund(&mut s, &p, 2, T0 + S, v.reset_after_us));
        assert_eq!(s, Some(KeyState::SlidingLog([T0, T0 + 2 * S].into())));
        // Nothing at that time any more: nothing to remove.
        assert!(!refund(&mut s, &p, 2, T0 + S, v.reset_after_us));
    }

    #[test]
    fn refund_with_an_invalid_cost_or_no_state_changes_nothing() {
        let p = Policy::gcra(2, Duration::from_secs(1)).unwrap();
        let mut s = None;
        assert!(!refund(&mut s, &p, 1, T0, 500_000));
        let v = admit(&p, &mut s, 1, T0);
        let held = s.clone();
        assert!(!refund(&mut s, &p, 0, T0, v.reset_after_us));
        assert!(!refund(&mut s, &p, 3, T0, v.reset_after_us));
        assert!(!refund(&mut s, &p, 1, u64::MAX, 1));
        assert_eq!(s, held);
    }
}
