//! `concurrent_exactness`: no lost updates, no over-admission.

use ratewarden_core::{Algorithm, Clock};

use crate::support::{Probe, S, crowd_of_tasks, crowd_of_threads, evidence, fail, num, policy};
use crate::{ScenarioResult, StoreFactory};

/// Who sends a crowd's requests.
#[derive(Clone, Copy)]
enum Callers {
    /// Threads of their own ([`crowd_of_threads`]).
    Threads,
    /// Tasks on the runtime ([`crowd_of_tasks`]).
    Tasks,
}

/// How hard the scenario crowds one key.
struct Size {
    callers: Callers,
    /// Threads or tasks.
    count: usize,
    /// Requests per caller.
    each: usize,
    limit: u32,
    /// Crowds per algorithm, each on a key of its own.
    rounds: usize,
}

/// For a store in the process (not [`shared`](ratewarden_core::Capabilities::shared)),
/// which answers in microseconds on its caller's thread: a read-then-write
/// with nothing between the two loses an update only when another thread
/// decides in that gap. Callers on threads of their own that keep waking
/// each other land there many times per crowd, on a loaded machine too;
/// the crowd admits a thousand, four times per algorithm, in a fraction of a
/// second.
const IN_PROCESS: Size = Size {
    callers: Callers::Threads,
    count: 8,
    each: 128,
    limit: 1_000,
    rounds: 4,
};

/// For a shared store: every request is a round trip, long enough for all
/// the callers to be in flight at once, and too dear for more of them.
const SHARED: Size = Size {
    callers: Callers::Tasks,
    count: 64,
    each: 4,
    limit: 50,
    rounds: 1,
};

pub(crate) async fn concurrent_exactness(factory: &dyn StoreFactory) -> ScenarioResult {
    if tokio::runtime::Handle::try_current().is_err() {
        return fail(
            "concurrent_exactness must run inside a tokio runtime: it spawns its callers as \
             tasks on it, or as threads that await the store on it",
        );
    }
    let probe = Probe::new(factory).await?;
    let size = if probe.store.capabilities().shared {
        SHARED
    } else {
        IN_PROCESS
    };
    let Size {
        callers,
        count,
        each,
        limit,
        rounds,
    } = size;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let crowds = format!(
        "{} concurrent requests ({count} {} × {each}) at one instant",
        num((count * each) as u64),
        match callers {
            Callers::Threads => "threads",
            Callers::Tasks => "tasks",
        }
    );
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, limit, 60 * S)?;
        probe.at(0);
        let now = probe.clock.now();
        let mut inline = 0;
        for round in 1..=rounds {
            let key = format!("concurrent/{algorithm}/{round}").into_bytes();
            let answered = match callers {
                Callers::Threads => {
                    crowd_of_threads(&probe.store, &key, &p, now, count, each).await?
                }
                Callers::Tasks => crowd_of_tasks(&probe.store, &key, &p, now, count, each).await?,
            };
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
             of {rounds} crowds on keys of their own ({} answered inline)",
            num(limit.into()),
            limit - 1,
            num(inline as u64)
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}
