//! `policy_semantics` and `cost_accounting`: exact numbers at the edges.
//!
//! Every expected value below is worked out by hand from the formulas in
//! `ratewarden_core::algorithm` (the comments show the arithmetic), so that a
//! backend and the core cannot share a bug unnoticed.

use ratewarden_core::{Algorithm, Policy};

use crate::support::{Expect, MS, Probe, S, admit, check, dur, evidence, list, policy, refuse};
use crate::{Failure, ScenarioResult, StoreFactory};

/// One request of a table: at `T0 + at`, of `cost`, must be answered `want`.
struct Step {
    at: u64,
    cost: u32,
    want: Expect,
}

const fn step(at: u64, cost: u32, want: Expect) -> Step {
    Step { at, cost, want }
}

/// Runs a table of requests on one key; returns how many were admitted.
async fn run_table(
    probe: &Probe,
    key: &[u8],
    p: &Policy,
    steps: &[Step],
) -> Result<usize, Failure> {
    let mut admitted = 0;
    for (i, s) in steps.iter().enumerate() {
        probe.at(s.at);
        let d = probe.hit(key, p, s.cost).await?;
        let what = format!("request #{} (cost {}) at t0+{}", i + 1, s.cost, dur(s.at));
        check(&d, s.want, p, &what)?;
        admitted += usize::from(d.allowed);
    }
    Ok(admitted)
}

/// The boundary tables, one per algorithm: (limit, window, steps).
fn boundary_table(algorithm: Algorithm) -> (u32, u64, Vec<Step>) {
    match algorithm {
        // L = 3, W = 10 s. Admitted at 0, 1, 2 s; the log [0, 1, 2] frees
        // its oldest entry at 0 + 10 s, and resets when its newest (2 s)
        // expires at 12 s.
        Algorithm::SlidingLog => (
            3,
            10 * S,
            vec![
                step(0, 1, admit(2, 10 * S)),
                step(S, 1, admit(1, 10 * S)),
                step(2 * S, 1, admit(0, 10 * S)),
                // retry 10 − 5 = 5 s; reset 12 − 5 = 7 s.
                step(5 * S, 1, refuse(0, 7 * S, 5 * S)),
                // One µs before 5 + 5 s: still three entries.
                step(10 * S - 1, 1, refuse(0, 2 * S + 1, 1)),
                // Exactly at 5 + 5 s: the entry at 0 expired (0 + 10 ≤ 10).
                step(10 * S, 1, admit(0, 10 * S)),
                // Log [1, 2, 10]: the entry at 1 s frees a unit at 11 s.
                step(10 * S, 1, refuse(0, 10 * S, S)),
            ],
        ),
        // L = 3, W = 10 s. The window opens at 0 and ends at 10 s whatever
        // happens inside it.
        Algorithm::FixedWindow => (
            3,
            10 * S,
            vec![
                step(0, 1, admit(2, 10 * S)),
                step(4 * S, 1, admit(1, 6 * S)),
                step(9 * S, 1, admit(0, S)),
                step(9 * S + 500 * MS, 1, refuse(0, 500 * MS, 500 * MS)),
                step(10 * S - 1, 1, refuse(0, 1, 1)),
                // A new window opens at 10 s and ends at 20 s.
                step(10 * S, 1, admit(2, 10 * S)),
                step(10 * S, 1, admit(1, 10 * S)),
                step(10 * S, 1, admit(0, 10 * S)),
                step(10 * S, 1, refuse(0, 10 * S, 10 * S)),
            ],
        ),
        // L = 4, W = 10 s, windows aligned to the epoch (T0 is day-aligned).
        // remaining = (L·W − prev·(W − e) − cur·W) / W; reset at the end of
        // the window after the last one with a count.
        Algorithm::SlidingWindow => (
            4,
            10 * S,
            vec![
                step(0, 1, admit(3, 20 * S)),
                step(2 * S, 1, admit(2, 18 * S)),
                step(4 * S, 1, admit(1, 16 * S)),
                step(6 * S, 1, admit(0, 14 * S)),
                // cur = 4, prev = 0: in the next window, 4·(W − e) ≤ 3·W
                // gives e = 2.5 s, so retry at 12.5 s, 4.5 s from now.
                step(8 * S, 1, refuse(0, 12 * S, 4_500 * MS)),
                // At 12.5 s − 1 µs: 4·7.500001 s + 1·10 s > 4·10 s.
                step(12_500 * MS - 1, 1, refuse(0, 7_500 * MS + 1, 1)),
                // At 12.5 s: 4·7.5 + 10 = 40 ≤ 40. Counts now in the window
                // starting at 10 s, so reset at 30 s.
                step(12_500 * MS, 1, admit(0, 17_500 * MS)),
                // At 15 s: 4·5 + 2·10 = 40 ≤ 40.
                step(15 * S, 1, admit(0, 15 * S)),
                // cur = 2: 4·(W − e) ≤ (4 − 2 − 1)·W gives e = 7.5 s: 17.5 s.
                step(15 * S, 1, refuse(0, 15 * S, 2_500 * MS)),
                step(17_500 * MS - 1, 1, refuse(0, 12_500 * MS + 1, 1)),
                step(17_500 * MS, 1, admit(0, 12_500 * MS)),
            ],
        ),
        // L = 4, W = 8 s: emission interval T = 2 s, burst L·T = 8 s.
        Algorithm::Gcra => (
            4,
            8 * S,
            vec![
                // tat goes 2, 4, 6, 8 s; remaining = (8 − (tat − now)) / 2.
                step(0, 1, admit(3, 2 * S)),
                step(0, 1, admit(2, 4 * S)),
                step(0, 1, admit(1, 6 * S)),
                step(0, 1, admit(0, 8 * S)),
                // tat 8 s; would be 10 s > 8 s: retry 10 − 8 − 0 = 2 s.
                step(0, 1, refuse(0, 8 * S, 2 * S)),
                step(2 * S - 1, 1, refuse(0, 6 * S + 1, 1)),
                step(2 * S, 1, admit(0, 8 * S)),
                // tat 10 s < 20 s: a full bucket again.
                step(20 * S, 1, admit(3, 2 * S)),
            ],
        ),
    }
}

pub(crate) async fn policy_semantics(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let (limit, window, steps) = boundary_table(algorithm);
        let p = policy(algorithm, limit, window)?;
        let key = format!("semantics/{algorithm}");
        // The first `limit` requests are admitted and the next is refused:
        // every table starts by reaching the limit exactly.
        let admitted = run_table(&probe, key.as_bytes(), &p, &steps).await?;
        parts.push(format!(
            "{algorithm}: {} decisions exact to the µs ({admitted} admitted, limit {limit} per {})",
            steps.len(),
            dur(window)
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

/// Expected answers to the common cost sequence, per algorithm, for
/// L = 5, W = 10 s, everything at T0: (cost 3 admitted, cost 3 refused,
/// cost 2 admitted, cost 1 refused).
fn cost_table(algorithm: Algorithm) -> [Expect; 4] {
    match algorithm {
        // The log's (count + c − L)-th oldest entry, at T0, frees at 10 s.
        Algorithm::SlidingLog | Algorithm::FixedWindow => [
            admit(2, 10 * S),
            refuse(2, 10 * S, 10 * S),
            admit(0, 10 * S),
            refuse(0, 10 * S, 10 * S),
        ],
        // Counts in the window [0, 10 s) reset at 20 s. Refused cost 3 with
        // cur = 3: 3·(W − e) ≤ (5 − 3)·W, e = W/3 rounded up in µs:
        // 10 s + 3.333334 s. Refused cost 1 with cur = 5: 5·(W − e) ≤ 4·W,
        // e = 2 s.
        Algorithm::SlidingWindow => [
            admit(2, 20 * S),
            refuse(2, 20 * S, 13_333_334),
            admit(0, 20 * S),
            refuse(0, 20 * S, 12 * S),
        ],
        // T = 2 s, burst 10 s. Cost 3: tat 6 s. Cost 3 more would be 12 s:
        // retry 12 − 10 = 2 s. Cost 2: tat 10 s. Cost 1: 12 − 10 = 2 s.
        Algorithm::Gcra => [
            admit(2, 6 * S),
            refuse(2, 6 * S, 2 * S),
            admit(0, 10 * S),
            refuse(0, 10 * S, 2 * S),
        ],
    }
}

pub(crate) async fn cost_accounting(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for &algorithm in &algorithms {
        let p = policy(algorithm, 5, 10 * S)?;
        let key = format!("cost/{algorithm}");
        let key = key.as_bytes();
        probe.at(0);
        let [first, over, fill, full] = cost_table(algorithm);
        let steps = [
            // 3 of 5 fit.
            step(0, 3, first),
            // 3 + 3 > 5: all or nothing, so refused, and nothing consumed...
            step(0, 3, over),
            // ...which asking again shows, and which the 2 that still fit show.
            step(0, 3, over),
            step(0, 2, fill),
            step(0, 1, full),
        ];
        run_table(&probe, key, &p, &steps).await?;
    }
    if algorithms.contains(&Algorithm::SlidingLog) {
        // A partial fit is refused and the wait is for enough units to free:
        // L = 5, W = 10 s, 3 units at 0 and 2 at 1 s.
        let p = policy(Algorithm::SlidingLog, 5, 10 * S)?;
        let steps = [
            step(0, 3, admit(2, 10 * S)),
            step(S, 2, admit(0, 10 * S)),
            // 4 units need the (5 + 4 − 5)-th oldest entry, at 1 s, to
            // expire: at 11 s, 9 s from now.
            step(2 * S, 4, refuse(0, 9 * S, 9 * S)),
            // At 10 s the three at 0 expired: 3 free, 4 asked: refused.
            step(10 * S, 4, refuse(3, S, S)),
            step(11 * S - 1, 4, refuse(3, 1, 1)),
            step(11 * S, 4, admit(1, 10 * S)),
        ];
        run_table(&probe, b"cost/partial", &p, &steps).await?;
        parts.push(
            "sliding_log: cost 4 refused with 3 units free, admitted exactly when the 4th frees at t0+11 s"
                .to_string(),
        );
    }
    if !algorithms.is_empty() {
        parts.insert(
            0,
            format!(
                "{}: cost 3 + 3 refused whole, then 3 + 2 fills the limit exactly, for {}",
                list(&algorithms),
                probe.decided_by()
            ),
        );
    }
    parts.extend(skipped);
    evidence(parts)
}
