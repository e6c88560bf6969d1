//! `concurrent_exactness`: no lost updates, no over-admission.

use ratewarden_core::{Algorithm, Clock};

use crate::support::{Probe, S, crowd, evidence, fail, num, policy};
use crate::{ScenarioResult, StoreFactory};

/// How hard the scenario crowds one key.
struct Size {
    tasks: usize,
    per_task: usize,
    limit: u32,
    /// Crowds per algorithm, each on a key of its own.
    rounds: usize,
}

/// For a store in the process (not [`shared`](ratewarden_core::Capabilities::shared)),
/// which answers in microseconds on its caller's thread. A read-then-write
/// with nothing between the two loses an update only when another thread
/// decides between them: when two workers run at the same instant, or when
/// the system suspends a caller there while another decides. On a loaded
/// machine the first is rare and the second takes many decisions, so each
/// crowd admits a thousand and there are eight per algorithm: a fraction of
/// a second for an in-process store.
const IN_PROCESS: Size = Size {
    tasks: 64,
    per_task: 16,
    limit: 1_000,
    rounds: 8,
};

/// For a shared store: every request is a round trip, long enough for all
/// the callers to be in flight at once, and too dear for more of them.
const SHARED: Size = Size {
    tasks: 64,
    per_task: 4,
    limit: 50,
    rounds: 1,
};

pub(crate) async fn concurrent_exactness(factory: &dyn StoreFactory) -> ScenarioResult {
    if tokio::runtime::Handle::try_current().is_err() {
        return fail(
            "concurrent_exactness must run inside a tokio runtime (multi-thread for real \
             parallelism): it spawns its callers as tasks",
        );
    }
    let probe = Probe::new(factory).await?;
    let size = if probe.store.capabilities().shared {
        SHARED
    } else {
        IN_PROCESS
    };
    let Size {
        tasks,
        per_task,
        limit,
        rounds,
    } = size;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let total = tasks * per_task;
    let crowds = format!(
        "{} concurrent requests ({tasks} tasks × {per_task}) at one instant",
        num(total as u64)
    );
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, limit, 60 * S)?;
        probe.at(0);
        let now = probe.clock.now();
        let mut inline = 0;
        for round in 1..=rounds {
            let key = format!("concurrent/{algorithm}/{round}").into_bytes();
            let answered = crowd(&probe.store, &key, &p, now, tasks, per_task).await?;
            inline += answered.inline;
            let remaining = answered.remaining;
            if remaining.len() != limit as usize {
                return fail(format!(
                    "{algorithm}: {} of {crowds} were admitted on the key of crowd {round} of \
                     {rounds}; the limit is exactly {}{}",
                    num(remaining.len() as u64),
                    num(limit.into()),
                    if remaining.len() > limit as usize {
                        ": lost updates (read-then-write without atomicity)"
                    } else {
                        ""
                    }
                ));
            }
            if remaining != (0..limit).collect::<Vec<_>>() {
                let repeated: Vec<u32> = remaining
                    .windows(2)
                    .filter(|w| w[0] == w[1])
                    .map(|w| w[0])
                    .collect();
                return fail(format!(
                    "{algorithm}: the {} admitted requests of crowd {round} of {rounds} must \
                     report remaining {}..=0 once each (each saw the one before it); {}",
                    num(limit.into()),
                    limit - 1,
                    if repeated.is_empty() {
                        format!("they reported {remaining:?}")
                    } else {
                        format!("remaining {repeated:?} were reported more than once: lost updates")
                    }
                ));
            }
        }
        parts.push(format!(
            "{algorithm}: exactly {} of {crowds} admitted, remaining {}..=0 each once, in each \
             of {rounds} crowds on keys of their own ({inline} answered inline)",
            num(limit.into()),
            limit - 1
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}
