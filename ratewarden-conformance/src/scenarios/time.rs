//! `refused_hammering`, `window_renewal` and `clock_regression`: what the
//! passage of time, forward and backward, does to a key.

use ratewarden_core::{Algorithm, Policy};

use crate::support::{
    MS, Probe, S, T0, admit, check, dur, evidence, fail, micros, num, policy, refuse, rel,
};
use crate::{Failure, ScenarioResult, StoreFactory};

/// Admits `n` requests at the current time, failing on the first refusal.
async fn admit_all(probe: &Probe, key: &[u8], p: &Policy, n: u32) -> Result<(), Failure> {
    for i in 0..n {
        let d = probe.hit(key, p, 1).await?;
        if !d.allowed {
            return fail(format!(
                "{}: request {} of {} on a fresh key at {} was refused",
                p.algorithm(),
                i + 1,
                p.limit(),
                rel(probe.now())
            ));
        }
    }
    Ok(())
}

/// One run of a scenario here: the algorithm, its policy and its key.
type Case = (Algorithm, Policy, Vec<u8>);

/// Each scenario here runs once per algorithm on L = 5, W = 10 s, on a key
/// of its own: for each of `algorithms` that the store supports, the
/// algorithm, that policy and the key `{prefix}/{algorithm}`; and the note
/// of those skipped.
fn five_per_ten_seconds(
    probe: &Probe,
    algorithms: &[Algorithm],
    prefix: &str,
) -> Result<(Vec<Case>, Option<String>), Failure> {
    let (algorithms, skipped) = probe.supported(algorithms);
    let cases = algorithms
        .into_iter()
        .map(|a| {
            Ok((
                a,
                policy(a, 5, 10 * S)?,
                format!("{prefix}/{a}").into_bytes(),
            ))
        })
        .collect::<Result<_, Failure>>()?;
    Ok((cases, skipped))
}

pub(crate) async fn refused_hammering(factory: &dyn StoreFactory) -> ScenarioResult {
    const HAMMER_EVERY: u64 = 3 * MS;
    let probe = Probe::new(factory).await?;
    let (cases, skipped) = five_per_ten_seconds(&probe, &Algorithm::ALL, "hammer")?;
    let mut parts = Vec::new();
    for (algorithm, p, key) in cases {
        // Five admitted at t0, first refusal at t1 = t0 + 1 s.
        let key = key.as_slice();
        probe.at(0);
        admit_all(&probe, key, &p, 5).await?;
        let t1 = S;
        probe.at(t1);
        let first = probe.hit(key, &p, 1).await?;
        if first.allowed {
            return fail(format!(
                "{algorithm}: a 6th request at t0+1 s was admitted; the limit is 5 per 10 s"
            ));
        }
        let r = micros(first.retry_after);
        // Hand-derived: the log and the fixed window free up one window
        // after t0 (9 s after t1); the sliding window once 5·(W − e) ≤ 4·W
        // in the next window, e = 2 s (11 s after t1); GCRA when its
        // theoretical arrival time 10 s + 2 s is within the 10 s burst of
        // now (1 s after t1).
        let want = match algorithm {
            Algorithm::SlidingLog | Algorithm::FixedWindow => 9 * S,
            Algorithm::SlidingWindow => 11 * S,
            Algorithm::Gcra => S,
        };
        if r != want {
            return fail(format!(
                "{algorithm}: the first refusal at t0+1 s must say retry_after {}, it said {}",
                dur(want),
                dur(r)
            ));
        }
        let access = t1 + r;
        if matches!(algorithm, Algorithm::SlidingLog | Algorithm::FixedWindow) && access != 10 * S {
            return fail(format!(
                "{algorithm}: access must return at t0 + window = t0+10 s, the store says {}",
                rel(T0 + access)
            ));
        }
        // Hammer: every request until just before access must be refused,
        // and none may move the moment access returns.
        let mut hammered = 0u64;
        let mut at = t1 + HAMMER_EVERY;
        while at < access - 1 {
            probe.at(at);
            let d = probe.hit(key, &p, 1).await?;
            hammered += 1;
            if d.allowed {
                return fail(format!(
                    "{algorithm}: hammering request #{hammered} at {} was admitted, {} before \
                     the retry_after of the first refusal (t0+{}): refused state was forgotten",
                    rel(T0 + at),
                    dur(access - at),
                    dur(access)
                ));
            }
            at += HAMMER_EVERY;
        }
        probe.at(access - 1);
        let d = probe.hit(key, &p, 1).await?;
        if d.allowed {
            return fail(format!(
                "{algorithm}: admitted at {}, 1 µs before the reported retry_after",
                rel(T0 + access - 1)
            ));
        }
        probe.at(access);
        let d = probe.hit(key, &p, 1).await?;
        if !d.allowed {
            return fail(format!(
                "{algorithm}: refused at {} after {} refused requests every 3 ms, although the \
                 first refusal said retry_after {} (at {}): refused requests were recorded, or \
                 renewed the window, and pushed access later; now it says retry_after {}",
                rel(T0 + access),
                num(hammered + 1),
                dur(r),
                rel(T0 + access),
                dur(micros(d.retry_after))
            ));
        }
        parts.push(format!(
            "{algorithm}: {} requests hammered every 3 ms after the first refusal, all refused; \
             access returned exactly at {} (retry_after {}), not 1 µs earlier",
            num(hammered + 1),
            rel(T0 + access),
            dur(r)
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

pub(crate) async fn window_renewal(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let wanted = [Algorithm::FixedWindow, Algorithm::SlidingLog];
    let (cases, skipped) = five_per_ten_seconds(&probe, &wanted, "renewal")?;
    let mut parts = Vec::new();
    for (algorithm, p, key) in cases {
        // One hit every second from t0 to t0+15 s.
        let mut refused = 0;
        for k in 0..16u64 {
            let at = k * S;
            let want = match algorithm {
                // The window opened at t0 ends at 10 s, whatever the hits;
                // the next opens at 10 s and ends at 20 s.
                Algorithm::FixedWindow => match k {
                    0..=4 => admit(4 - k as u32, (10 - k) * S),
                    5..=9 => refuse(0, (10 - k) * S, (10 - k) * S),
                    10..=14 => admit(14 - k as u32, (20 - k) * S),
                    _ => refuse(0, (20 - k) * S, (20 - k) * S),
                },
                // Admitted at 0..4 s; refusals at 5..9 s leave the log alone:
                // reset when the newest admitted (4 s) expires at 14 s, retry
                // when the oldest (0 s) does at 10 s. From 10 s one entry
                // expires each second, making room for that second's hit;
                // at 15 s the log is [10..14] again.
                _ => match k {
                    0..=4 => admit(4 - k as u32, 10 * S),
                    5..=9 => refuse(0, (14 - k) * S, (10 - k) * S),
                    10..=14 => admit(0, 10 * S),
                    _ => refuse(0, 9 * S, 5 * S),
                },
            };
            probe.at(at);
            let d = probe.hit(&key, &p, 1).await?;
            let what = match algorithm {
                Algorithm::FixedWindow => format!(
                    "hit at t0+{k} s (the window that opened at t0+{} s must end at t0+{} s)",
                    k / 10 * 10,
                    k / 10 * 10 + 10
                ),
                _ => format!("hit at t0+{k} s (admitted so far: one per second from t0)"),
            };
            check(&d, want, &p, &what)?;
            refused += usize::from(!d.allowed);
        }
        parts.push(match algorithm {
            Algorithm::FixedWindow => format!(
                "fixed_window: 16 hits 1 s apart ({refused} refused) never moved the window's \
                 end from t0+10 s; 5 admitted again from t0+10 s"
            ),
            _ => format!(
                "sliding_log: 16 hits 1 s apart ({refused} refused): reset and retry followed \
                 the admitted entries only"
            ),
        });
    }
    parts.extend(skipped);
    evidence(parts)
}

pub(crate) async fn clock_regression(factory: &dyn StoreFactory) -> ScenarioResult {
    const REQUESTS: u64 = 90;
    const STEP: u64 = 100 * MS;
    let probe = Probe::new(factory).await?;
    let (cases, skipped) = five_per_ten_seconds(&probe, &Algorithm::ALL, "regression")?;
    let mut parts = Vec::new();
    for (algorithm, p, key) in cases {
        // The forward clock runs from t0 to t0+8.9 s, shorter than the
        // window; each `now` passed is that or earlier.
        let key = key.as_slice();
        // What a forward-only clock admits over 8.9 s: the limit, or for
        // GCRA the burst plus one unit per emission interval of 2 s:
        // 5 + ⌊8.9 / 2⌋ = 9.
        let bound = match algorithm {
            Algorithm::Gcra => 9,
            _ => 5,
        };
        let mut admitted = 0;
        let mut earliest = u64::MAX;
        for i in 0..REQUESTS {
            let forward = T0 + i * STEP;
            let now = match i % 5 {
                0 => forward,
                1 => forward - 3 * S,
                2 => forward - 25 * S,
                3 => forward - 10 * S,
                _ if i == 4 => 0,
                _ => forward - 1,
            };
            earliest = earliest.min(now);
            probe.set(now);
            let d = probe.hit(key, &p, 1).await?;
            if i == 0 && !d.allowed {
                return fail(format!(
                    "{algorithm}: the first request on a fresh key was refused"
                ));
            }
            admitted += usize::from(d.allowed);
            if admitted > bound {
                return fail(format!(
                    "{algorithm}: {admitted} requests admitted over a forward span of {} \
                     (limit 5 per 10 s; at most {bound} on a forward clock) while now went \
                     back as far as {}: going back in time bought a fresh quota",
                    dur(i * STEP),
                    rel(earliest)
                ));
            }
        }
        // Two windows after the forward clock's start everything has expired.
        probe.at(20 * S);
        let d = probe.hit(key, &p, 1).await?;
        check(
            &d,
            admit(4, recovery_reset(algorithm)),
            &p,
            "first request at t0+20 s, two windows after the regressions",
        )?;
        parts.push(format!(
            "{algorithm}: {admitted} of {REQUESTS} admitted (at most {bound}) while now jumped \
             back by 3 s, 10 s, 25 s and to the epoch; fresh again at t0+20 s"
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

/// `reset_after` of a first request on an otherwise empty key, L = 5,
/// W = 10 s, at a window-aligned time.
fn recovery_reset(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::SlidingLog | Algorithm::FixedWindow => 10 * S,
        // The count sits in [20 s, 30 s) and weighs until 40 s.
        Algorithm::SlidingWindow => 20 * S,
        // One unit: T = 2 s.
        Algorithm::Gcra => 2 * S,
    }
}
