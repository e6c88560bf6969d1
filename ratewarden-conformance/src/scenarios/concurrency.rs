//! `concurrent_exactness`: no lost updates, no over-admission.

use std::sync::Arc;

use ratewarden_core::{Algorithm, Clock, Decision, StoreError};
use tokio::sync::Barrier;

use crate::support::{Path, Probe, S, decide_preferring, evidence, fail, panic_message, policy};
use crate::{ScenarioResult, StoreFactory};

const TASKS: usize = 64;
const PER_TASK: usize = 4;
const LIMIT: u32 = 50;

pub(crate) async fn concurrent_exactness(factory: &dyn StoreFactory) -> ScenarioResult {
    if tokio::runtime::Handle::try_current().is_err() {
        return fail(
            "concurrent_exactness must run inside a tokio runtime (multi-thread for real \
             parallelism): it spawns its callers as tasks",
        );
    }
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, LIMIT, 60 * S)?;
        let key: Arc<[u8]> = format!("concurrent/{algorithm}").into_bytes().into();
        probe.at(0);
        let now = probe.clock.now();
        // All callers start together, so their requests overlap as much as
        // the runtime allows.
        let barrier = Arc::new(Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let store = Arc::clone(&probe.store);
                let key = Arc::clone(&key);
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut out: Vec<(Path, Result<Decision, StoreError>)> =
                        Vec::with_capacity(PER_TASK);
                    // Every other request inline, where the store answers
                    // there: that path must be as atomic as the awaited one.
                    for i in 0..PER_TASK {
                        let path = if i % 2 == 1 {
                            Path::Inline
                        } else {
                            Path::Awaited
                        };
                        out.push(decide_preferring(&*store, path, &key, &p, 1, now).await);
                    }
                    out
                })
            })
            .collect();
        let mut remaining = Vec::new();
        let mut inline = 0;
        for task in tasks {
            let results = match task.await {
                Ok(r) => r,
                Err(e) if e.is_panic() => {
                    return fail(format!(
                        "{algorithm}: the store panicked under concurrent calls: {}",
                        panic_message(e.into_panic().as_ref())
                    ));
                }
                Err(e) => return fail(format!("{algorithm}: a caller task failed: {e}")),
            };
            for (path, r) in results {
                inline += usize::from(path == Path::Inline);
                match r {
                    Ok(d) if d.allowed => remaining.push(d.remaining),
                    Ok(_) => {}
                    Err(e) => {
                        return fail(format!(
                            "{algorithm}: a concurrent request returned an error: {e}"
                        ));
                    }
                }
            }
        }
        let total = TASKS * PER_TASK;
        if remaining.len() != LIMIT as usize {
            return fail(format!(
                "{algorithm}: {} of {total} concurrent requests ({TASKS} tasks × {PER_TASK}) at one \
                 instant were admitted; the limit is exactly {LIMIT}{}",
                remaining.len(),
                if remaining.len() > LIMIT as usize {
                    ": lost updates (read-then-write without atomicity)"
                } else {
                    ""
                }
            ));
        }
        remaining.sort_unstable();
        if remaining != (0..LIMIT).collect::<Vec<_>>() {
            return fail(format!(
                "{algorithm}: the {LIMIT} admitted requests must report remaining 49, 48, …, 0 \
                 once each (each saw the one before it); they reported {remaining:?}"
            ));
        }
        parts.push(format!(
            "{algorithm}: exactly {LIMIT} of {total} concurrent requests admitted \
             ({TASKS} tasks × {PER_TASK}, {inline} answered inline), remaining 49..=0 each once"
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}
