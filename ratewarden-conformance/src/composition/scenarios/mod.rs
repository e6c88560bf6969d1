//! The composition scenarios. Each builds its compositions through the
//! [`Composer`] it is given, with local tiers on the reference store and
//! shared tiers from the factory, and checks hand-derived numbers; each is
//! self-contained, with its numbers derived in its own comments. This file
//! holds what they share; the scenarios are grouped by what they attack.

mod escalation;
mod failure;
mod leases;
mod local_state;
mod tiers;

pub(super) use escalation::*;
pub(super) use failure::*;
pub(super) use leases::*;
pub(super) use local_state::*;
pub(super) use tiers::*;

use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::lease::LEASE_ALGORITHMS;
use ratewarden_core::{
    AbuseSink, Algorithm, BreakerConfig, Decision, FailurePolicy, ManualClock, Policy, Store,
    Timestamp,
};

use super::support::{Events, Health, Late, Ledger, Switch};
use super::{Composer, Composition, EscalationSpec, TierSpec};
use crate::broken::ReferenceStore;
use crate::support::{MS, S, T0, dur, evidence, fail, num, policy};
use crate::{Failure, ScenarioResult, StoreFactory};

/// A short timeout for tiers whose store is made to hang: what a dead
/// store costs, once per cool-down.
const DEAD: Duration = Duration::from_millis(20);

fn local() -> Arc<dyn Store> {
    Arc::new(ReferenceStore::new(10_000))
}

/// What a scenario is given: the factory of its shared tiers, the composer
/// under test, and the manual clock every composition it builds runs on.
pub(super) struct Setup<'a> {
    factory: &'a dyn StoreFactory,
    composer: &'a dyn Composer,
    clock: ManualClock,
}

impl<'a> Setup<'a> {
    pub(super) fn new(factory: &'a dyn StoreFactory, composer: &'a dyn Composer) -> Self {
        Setup {
            factory,
            composer,
            clock: ManualClock::new(),
        }
    }

    async fn shared(&self) -> Result<Arc<dyn Store>, Failure> {
        let store = self.factory.fresh().await;
        if store.capabilities().server_clock {
            return fail(format!(
                "the {} store decides with its server's clock, so the suite cannot drive time; \
                 the factory must return a store in client-clock mode",
                store.name()
            ));
        }
        let supported = store.capabilities().algorithms;
        if !supported.contains(&Algorithm::FixedWindow) {
            return fail(format!(
                "the composition scenarios need a shared store that supports the fixed window, \
                 the algorithm their hand-derived numbers are written for; the {} store \
                 supports {supported:?}",
                store.name()
            ));
        }
        Ok(store)
    }

    fn compose(&self, tiers: Vec<TierSpec>) -> Result<Box<dyn Composition>, Failure> {
        self.composer
            .compose(tiers, self.clock.clone())
            .map_err(|e| Failure(format!("scenario bug: the composition was refused: {e}")))
    }

    fn at(&self, offset_us: u64) {
        self.clock.set(Timestamp::from_micros(T0 + offset_us));
    }

    /// An escalation that is there to report refusals to `sink`: it samples
    /// one admitted request in 10,000 into a shared tier of 10,000 per hour,
    /// which never refuses here.
    async fn reporting_to(&self, sink: Arc<dyn AbuseSink>) -> Result<EscalationSpec, Failure> {
        let store = self.shared().await?;
        Ok(EscalationSpec {
            policy: windowed(&*store, 10_000, 3_600)?,
            store,
            every: 10_000,
            sink: Some(sink),
        })
    }

    /// `n` instances, each a composition of one tier leasing from `store`
    /// in batches of at most `units`.
    fn fleet(
        &self,
        n: usize,
        store: &Arc<dyn Store>,
        p: Policy,
        units: u32,
        on_failure: FailurePolicy,
    ) -> Result<Vec<Box<dyn Composition>>, Failure> {
        (0..n)
            .map(|_| {
                let mut tier = TierSpec::new("quota", store.clone(), p);
                tier.lease = Some(units);
                tier.on_failure = on_failure;
                self.compose(vec![tier])
            })
            .collect()
    }
}

fn log(limit: u32, window_s: u64) -> Result<Policy, Failure> {
    policy(Algorithm::SlidingLog, limit, window_s * S)
}

/// `limit` per `window_s` seconds on the shared `store`: a sliding log,
/// else a fixed window (which [`Setup::shared`] requires). Every
/// composition scenario's numbers hold for both: its shared tiers are spent
/// within one window that starts at `T0`, a whole minute, hour and day.
fn windowed(store: &dyn Store, limit: u32, window_s: u64) -> Result<Policy, Failure> {
    let algorithm = if store
        .capabilities()
        .algorithms
        .contains(&Algorithm::SlidingLog)
    {
        Algorithm::SlidingLog
    } else {
        Algorithm::FixedWindow
    };
    policy(algorithm, limit, window_s * S)
}

fn show(d: &Decision) -> String {
    format!(
        "{} by rule {:?} (store {}{}{}), remaining {}, retry_after {}",
        if d.allowed { "admitted" } else { "refused" },
        d.source.rule.unwrap_or("?"),
        d.source.store,
        if d.source.fallback { ", fallback" } else { "" },
        if d.source.degraded { ", degraded" } else { "" },
        d.remaining,
        dur(d.retry_after.as_micros() as u64)
    )
}

/// Fails unless `n` requests for `key` through `c` are all admitted;
/// `request(i)` names the `i`th (from 1) in the failure.
async fn admit_each(
    c: &dyn Composition,
    key: &[u8],
    n: u32,
    request: impl Fn(u32) -> String,
) -> Result<(), Failure> {
    for i in 1..=n {
        let d = c.check(key).await;
        if !d.allowed {
            return fail(format!("{} must be admitted; got {}", request(i), show(&d)));
        }
    }
    Ok(())
}

fn breaker(failures: u32, cool_down_s: u64) -> Result<BreakerConfig, Failure> {
    BreakerConfig::new(failures, Duration::from_secs(cool_down_s))
        .map_err(|e| Failure(format!("scenario bug: {e}")))
}
