//! `refund_exactness`: a refund undoes exactly one admission, and a refund
//! of units the store no longer holds never makes a key more permissive.
//!
//! A `Limiter` refunds an earlier rule's admission when a later rule refuses
//! the request (invariant 1 across tiers). A store that ignores refunds
//! keeps honest clients locked out by requests nobody served; a store that
//! refunds blindly (decrements whatever it holds) hands an attacker units
//! from a window the refunded request never counted in. Every expected
//! value is worked out by hand from `ratewarden_core::algorithm`.

use ratewarden_core::{Algorithm, Decision, Policy};

use crate::support::{
    Expect, Path, Probe, S, admit, check, dur, evidence, fail, policy, refuse, show_key,
};
use crate::{Failure, ScenarioResult, StoreFactory};

/// One step of a table, at `T0 + at`.
enum Step {
    /// A request of `cost`, answered `want`.
    Hit { at: u64, cost: u32, want: Expect },
    /// Refunds the admission made by step number `step` (0-based), at the
    /// time and cost that admission had.
    Refund { step: usize },
}

use Step::{Hit, Refund};

const fn hit(at: u64, cost: u32, want: Expect) -> Step {
    Hit { at, cost, want }
}

/// Per algorithm: (limit, window, steps, what the table attacks).
fn table(algorithm: Algorithm) -> (u32, u64, Vec<Step>, &'static str) {
    match algorithm {
        // L = 3, W = 10 s.
        Algorithm::SlidingLog => (
            3,
            10 * S,
            vec![
                hit(0, 1, admit(2, 10 * S)),
                // Log [0, 2, 2]: full.
                hit(2 * S, 2, admit(0, 10 * S)),
                Refund { step: 1 },
                // Back to [0]: the same cost-2 request fits again.
                hit(2 * S, 2, admit(0, 10 * S)),
                Refund { step: 3 },
                // [0]: cost 3 needs the entry at 0 gone: retry 10 − 3 = 7 s,
                // reset when the newest (0) expires, 7 s away.
                hit(3 * S, 3, refuse(2, 7 * S, 7 * S)),
                // The refund removed the entries at 2 s, not the one at 0:
                // [0, 4]; one unit left.
                hit(4 * S, 1, admit(1, 10 * S)),
                // A late refund of the first admission (its entry at 0 is
                // still live) frees exactly that entry: [4].
                Refund { step: 0 },
                hit(4 * S, 2, admit(0, 10 * S)),
                // [4, 4, 4]: the next unit frees at 14 s. A store that had
                // removed the newest entry instead would hold [0, 4, 4] and
                // say 6 s.
                hit(4 * S, 1, refuse(0, 10 * S, 10 * S)),
            ],
            "entries refunded by time, not the newest or the oldest",
        ),
        // L = 3, W = 10 s.
        Algorithm::FixedWindow => (
            3,
            10 * S,
            vec![
                hit(0, 1, admit(2, 10 * S)),
                hit(S, 2, admit(0, 9 * S)),
                Refund { step: 1 },
                hit(2 * S, 2, admit(0, 8 * S)),
                // A new window opens at 10 s and is filled.
                hit(10 * S, 3, admit(0, 10 * S)),
                // Refunds of units counted in the closed window must not
                // touch the new one.
                Refund { step: 0 },
                Refund { step: 3 },
                hit(10 * S, 1, refuse(0, 10 * S, 10 * S)),
                // A window opened at 20 s by a request that is refunded
                // holds nothing: without that request the next one opens
                // its own window, ending 10 s after it, not at 30 s.
                hit(20 * S, 1, admit(2, 10 * S)),
                Refund { step: 8 },
                hit(25 * S, 3, admit(0, 10 * S)),
            ],
            "a refund from a closed window leaking into the next one",
        ),
        // L = 10, W = 10 s, epoch-aligned windows.
        Algorithm::SlidingWindow => (
            10,
            10 * S,
            vec![
                // Window [0, 10): current = 10.
                hit(0, 10, admit(0, 20 * S)),
                // At 19 s: previous = 10 weighs 10·1/10 = 1 unit, so 9 fit.
                hit(19 * S, 9, admit(0, 11 * S)),
                // The first admission now sits in `previous`: refunding it
                // leaves previous = 0, current = 9: one unit fits.
                Refund { step: 0 },
                hit(19 * S, 1, admit(0, 11 * S)),
                // Window [20, 30) starts empty (previous = 10 from [10, 20)):
                // at 25 s it weighs 10·5/10 = 5, so 5 fit.
                hit(25 * S, 5, admit(0, 15 * S)),
                // Step 1 counted in [10, 20), now `previous`: refund 9 → 1.
                Refund { step: 1 },
                // 1·5/10 + 5 = 5.5: four more fit, the fifth does not
                // (1·5 + 10·10 > 100 at e = 5 s).
                hit(25 * S, 4, admit(0, 15 * S)),
                hit(25 * S, 1, refuse(0, 15 * S, 5 * S)),
                // Step 0 counted in [0, 10), two windows ago: nothing to
                // refund; a store that decrements what it holds would
                // hand out units here.
                Refund { step: 0 },
                hit(25 * S, 1, refuse(0, 15 * S, 5 * S)),
            ],
            "a refund landing in a window the request never counted in",
        ),
        // L = 4, W = 8 s: T = 2 s, burst 8 s.
        Algorithm::Gcra => (
            4,
            8 * S,
            vec![
                hit(0, 1, admit(3, 2 * S)),
                hit(0, 2, admit(1, 6 * S)),
                // tat 6 s → 2 s.
                Refund { step: 1 },
                hit(0, 1, admit(2, 4 * S)),
                // At 9 s the bucket restarts from now: tat = 11 s.
                hit(9 * S, 1, admit(3, 2 * S)),
                // Step 3's units were absorbed by the restart: its refund
                // must change nothing (subtracting would give tat 9 s).
                Refund { step: 3 },
                hit(9 * S, 1, admit(2, 4 * S)),
            ],
            "a refund after the bucket restarted handing out free units",
        ),
    }
}

async fn run(probe: &Probe, p: &Policy, key: &[u8], steps: &[Step]) -> Result<u32, Failure> {
    // Each hit's (time, cost, decision), by step index.
    let mut done: Vec<Option<(u64, u32, Decision)>> = Vec::with_capacity(steps.len());
    let mut refunds = 0;
    // The refunds since the last hit, and which method answered each: the
    // refunds alternate between `refund` and `refund_inline`, and a hit
    // that shows one of them wrong says which.
    let mut since_hit: Vec<String> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        match *s {
            Hit { at, cost, want } => {
                probe.at(at);
                let d = probe.hit(key, p, cost).await?;
                let after = if since_hit.is_empty() {
                    String::new()
                } else {
                    format!(", after {}", since_hit.join(" and "))
                };
                let what = format!("step {} (cost {cost} at t0+{}{after})", i + 1, dur(at));
                check(&d, want, p, &what)?;
                since_hit.clear();
                done.push(Some((at, cost, d)));
            }
            Refund { step } => {
                let Some(Some((at, cost, admitted))) = done.get(step).cloned() else {
                    return fail(format!("scenario bug: step {} refunds a non-hit", i + 1));
                };
                probe.at(at);
                let (path, answer) = probe.refund(key, p, cost, &admitted).await;
                if let Err(e) = answer {
                    return fail(format!(
                        "{} step {}: refunding the admission of step {} (cost {cost} at t0+{}) \
                         returned an error from {}: {e}",
                        p.algorithm(),
                        i + 1,
                        step + 1,
                        dur(at),
                        path.refund()
                    ));
                }
                since_hit.push(format!("{} of step {}", path.refund(), step + 1));
                refunds += 1;
                done.push(None);
            }
        }
    }
    Ok(refunds)
}

pub(crate) async fn refund_exactness(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let (limit, window, steps, attacks) = table(algorithm);
        let p = policy(algorithm, limit, window)?;
        let key = format!("refund/{algorithm}");
        let refunds = run(&probe, &p, key.as_bytes(), &steps).await?;
        parts.push(format!("{algorithm}: {refunds} refunds exact ({attacks})"));

        // An admission to refund where nothing is held.
        let key = format!("refund-full/{algorithm}");
        probe.at(0);
        let full = probe.hit(key.as_bytes(), &p, limit).await?;
        if !full.allowed {
            return fail(format!(
                "{algorithm}: a first full-cost request must be admitted; got {full:?}"
            ));
        }
        // A refund for a key the store never saw (evicted, expired) is a
        // no-op, not an error, and creates nothing: a key of its own per
        // path, so that each path's refund is seen alone.
        for path in Path::BOTH {
            let method = path.refund();
            let ghost = format!("refund-ghost/{algorithm}/{method}");
            match probe.refund_by(path, ghost.as_bytes(), &p, 1, &full).await {
                None => continue,
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    return fail(format!(
                        "{algorithm}: {method} on key {} that holds nothing returned an error: \
                         {e}",
                        show_key(ghost.as_bytes())
                    ));
                }
            }
            let d = probe.hit(ghost.as_bytes(), &p, limit).await?;
            if !d.allowed || d.remaining != 0 {
                return fail(format!(
                    "{algorithm}: after a refund ({method}) on an empty key, a full-cost \
                     request must be admitted with nothing left; got {d:?}"
                ));
            }
        }
    }
    parts.push(format!(
        "refunds of empty keys create nothing, for {}",
        probe.refunded_by()
    ));
    parts.extend(skipped);
    evidence(parts)
}
