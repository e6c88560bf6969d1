//! The composition scenarios. Each builds its compositions through the
//! [`Composer`] it is given, with local tiers on the reference store and
//! shared tiers from the factory, and checks hand-derived numbers.
//!
//! One scenario after another, about 1,000 lines: each is self-contained, with
//! its hand-derived numbers in its own comments.

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

pub(super) async fn later_tier_refusal_not_charged(s: &Setup<'_>) -> ScenarioResult {
    // Tiers: "day" 12 per day in a local store, then "minute" 10 per minute
    // in the shared store. 110 requests at t0: the minute tier admits 10 and
    // refuses 100; if those refusals stayed counted in "day" (10 + 2 before
    // "day" itself refused), the client would be locked out for a day.
    let day = policy(Algorithm::FixedWindow, 12, 86_400 * S)?;
    let shared = s.shared().await?;
    let minute = windowed(&*shared, 10, 60)?;
    let c = s.compose(vec![
        TierSpec::new("day", local(), day),
        TierSpec::new("minute", shared, minute),
    ])?;
    s.at(0);
    let mut admitted = 0;
    for i in 1..=110 {
        let d = c.check(b"client").await;
        if d.allowed {
            admitted += 1;
            continue;
        }
        if d.source.rule != Some("minute") || d.retry_after != Duration::from_secs(60) {
            return fail(format!(
                "request #{i} at t0: must be refused by \"minute\" with retry_after 60 s (its \
                 10 entries at t0); got {}",
                show(&d)
            ));
        }
    }
    if admitted != 10 {
        return fail(format!(
            "110 requests at t0: 10 must be admitted, got {admitted}"
        ));
    }
    // At t0+61 s the minute window has passed; "day" has counted 10.
    s.at(61 * S);
    for (i, left) in [(1, 1), (2, 0)] {
        let d = c.check(b"client").await;
        if !d.allowed || d.source.rule != Some("day") || d.remaining != left {
            return fail(format!(
                "request {i} at t0+61 s: \"day\" has counted the 10 served requests only, so it \
                 must be admitted with {left} left in \"day\"; got {}",
                show(&d)
            ));
        }
    }
    let d = c.check(b"client").await;
    if d.allowed
        || d.source.rule != Some("day")
        || d.retry_after != Duration::from_secs(86_400 - 61)
    {
        return fail(format!(
            "the 13th served request: must be refused by \"day\" until its window ends, \
             retry_after 86,339 s; got {}",
            show(&d)
        ));
    }
    evidence(vec![
        "110 requests at t0: 10 admitted, 100 refused by the shared tier and refunded by \"day\""
            .into(),
        "at t0+61 s exactly 2 more served before \"day\" (12/day) refused with retry 86,339 s"
            .into(),
    ])
}

pub(super) async fn shared_retry_after_honoured(s: &Setup<'_>) -> ScenarioResult {
    // Two instances, each a local tier of 10 per minute in front of one
    // shared tier of 5 per minute. Instance A serves 5 at t0, then refuses 20
    // at t0+1 s with retry_after 59 s. A client that waits exactly that long
    // must be served by A and by B: A's local tier must not hold the 20
    // refused requests.
    let store = s.shared().await?;
    let tiers = |store: &Arc<dyn Store>| -> Result<Vec<TierSpec>, Failure> {
        Ok(vec![
            TierSpec::new("local", local(), log(10, 60)?),
            TierSpec::new("shared", store.clone(), windowed(&**store, 5, 60)?),
        ])
    };
    let a = s.compose(tiers(&store)?)?;
    let b = s.compose(tiers(&store)?)?;
    s.at(0);
    admit_each(&*a, b"client", 5, |i| format!("request {i} at t0 on A:")).await?;
    s.at(S);
    for i in 1..=20 {
        let d = a.check(b"client").await;
        if d.allowed || d.source.rule != Some("shared") || d.retry_after != Duration::from_secs(59)
        {
            return fail(format!(
                "refused request {i} at t0+1 s on A: must be refused by \"shared\" with \
                 retry_after 59 s; got {}",
                show(&d)
            ));
        }
    }
    s.at(60 * S);
    for (name, c, left) in [("A", &a, 4), ("B", &b, 3)] {
        let d = c.check(b"client").await;
        if !d.allowed || d.remaining != left {
            return fail(format!(
                "at t0+60 s, exactly the Retry-After later, instance {name}: must be admitted \
                 with {left} left in the shared tier; got {}",
                show(&d)
            ));
        }
    }
    evidence(vec![
        "20 refusals by the shared tier left nothing in A's local tier".into(),
        "a client waiting the 59 s Retry-After was served by both instances".into(),
    ])
}

pub(super) async fn fallback_never_double_counts(s: &Setup<'_>) -> ScenarioResult {
    // One rule, 5 per minute, on the shared store with a local fallback.
    // While the shared store answers, the fallback counts nothing; when it
    // fails, the fallback serves a full quota of its own. (No request is
    // refused while the store is up: a refusal would stand, through the
    // rule's refusal cache, until its retry time, outage or not.)
    let store = Switch::<dyn Store>::new(s.shared().await?);
    let shared_name = store.name();
    let mut tier = TierSpec::new("search", store.clone(), windowed(&*store, 5, 60)?);
    tier.fallback = Some(local());
    tier.on_failure = FailurePolicy::Closed;
    let c = s.compose(vec![tier])?;
    s.at(0);
    for i in 1..=5 {
        let d = c.check(b"client").await;
        if !d.allowed || d.source.fallback || d.source.store != shared_name {
            return fail(format!(
                "request {i} at t0, shared store up: must be admitted by the {shared_name} store; \
                 got {}",
                show(&d)
            ));
        }
    }
    store.set(Health::Failing);
    s.at(S);
    for i in 1..=6 {
        let d = c.check(b"client").await;
        let ok = d.allowed == (i <= 5) && d.source.fallback && !d.source.degraded;
        if !ok {
            return fail(format!(
                "request {i} at t0+1 s, shared store failing: must be {} by the fallback, which \
                 has counted nothing so far; got {}",
                if i <= 5 { "admitted" } else { "refused" },
                show(&d)
            ));
        }
    }
    evidence(vec![
        "5 served by the shared store, none counted by the fallback".into(),
        "during the outage the fallback served its own 5 and refused the 6th".into(),
    ])
}

pub(super) async fn escalation_rate_independent_of_pace(s: &Setup<'_>) -> ScenarioResult {
    // A local tier of 60 per minute escalates one admitted request in 10 to
    // the shared store (10,000 per hour: it never refuses here). A client
    // pacing itself at 1/s and one bursting 60 at the top of each minute are
    // each admitted 600 times and must each be sampled exactly 60 times, one
    // in every run of 10 admitted requests.
    let durable = Switch::<dyn Store>::new(s.shared().await?);
    let tier = |durable: Arc<dyn Store>| -> Result<TierSpec, Failure> {
        let mut t = TierSpec::new("search", local(), log(60, 60)?);
        t.escalation = Some(EscalationSpec {
            policy: windowed(&*durable, 10_000, 3_600)?,
            store: durable,
            every: 10,
            sink: None,
        });
        Ok(t)
    };
    let c = s.compose(vec![tier(durable.clone())?])?;
    let mut parts = Vec::new();
    let mut sampled_positions = Vec::new();
    for (client, offsets) in [
        ("paced", (0..600).map(|i| i * S).collect::<Vec<_>>()),
        (
            "bursty",
            (0..600).map(|i| 600 * S + (i / 60) * 60 * S).collect(),
        ),
    ] {
        let before = durable.calls();
        let mut sampled = Vec::new();
        for (i, &offset) in offsets.iter().enumerate() {
            s.at(offset);
            let d = c.check(client.as_bytes()).await;
            if !d.allowed {
                return fail(format!(
                    "{client} request {} at t0+{}: within the local limit, must be admitted; got {}",
                    i + 1,
                    dur(offset),
                    show(&d)
                ));
            }
            if d.source.escalated {
                sampled.push(i);
            }
        }
        let calls = durable.calls() - before;
        if calls != 60 || sampled.len() != 60 {
            return fail(format!(
                "{client} client, 600 admitted requests: the durable store must be consulted \
                 exactly 60 times (one in 10), got {calls} calls and {} escalated decisions",
                sampled.len()
            ));
        }
        for run in 0..60 {
            let n = sampled.iter().filter(|&&i| i / 10 == run).count();
            if n != 1 {
                return fail(format!(
                    "{client} client: admitted requests {}..={} must contain exactly one sample, \
                     got {n}",
                    run * 10 + 1,
                    run * 10 + 10
                ));
            }
        }
        parts.push(format!(
            "{client}: 60 samples in 600 admitted, one per run of 10"
        ));
        sampled_positions.push(sampled.iter().map(|i| i % 10).collect::<Vec<_>>());
    }
    // The same traffic through a second composition samples other positions:
    // a client cannot learn which of its requests will be checked.
    let durable2 = Switch::<dyn Store>::new(s.shared().await?);
    let c2 = s.compose(vec![tier(durable2)?])?;
    let mut again = Vec::new();
    for i in 0..600 {
        s.at(7_200 * S + i * S);
        if c2.check(b"paced-again").await.source.escalated {
            again.push((i % 10) as usize);
        }
    }
    if again == sampled_positions[0] {
        return fail(
            "two compositions sampled the same 60 positions in the same traffic: the sample \
             is predictable from a client's own count",
        );
    }
    parts.push("a second composition sampled different positions".into());
    evidence(parts)
}

pub(super) async fn abuse_writes_bounded(s: &Setup<'_>) -> ScenarioResult {
    // 20 keys, each 100 requests in each of 3 windows against 5 per minute:
    // 5,700 refusals. The sink gets one write per key per window (60), each
    // carrying the refusals held back since the key's last one, and a flush
    // writes what the last window held (20 more): 5,700 refusals in 80 writes.
    let sink = Switch::<dyn AbuseSink>::new(Arc::new(Events::default()));
    let mut tier = TierSpec::new("form", local(), log(5, 60)?);
    tier.escalation = Some(s.reporting_to(sink.clone()).await?);
    let c = s.compose(vec![tier])?;
    for window in 0..3u64 {
        s.at(window * 60 * S);
        for k in 0..20 {
            let key = format!("bot-{k}");
            let admitted = {
                let mut n = 0;
                for _ in 0..100 {
                    n += u32::from(c.check(key.as_bytes()).await.allowed);
                }
                n
            };
            if admitted != 5 {
                return fail(format!(
                    "{key} in window {window}: 5 of 100 must be admitted, got {admitted}"
                ));
            }
        }
        let want = 20 * (window + 1);
        if sink.calls() != want {
            return fail(format!(
                "after {} windows of 20 refused keys: the sink must have been written {want} \
                 times (one per key per window), got {}",
                window + 1,
                num(sink.calls())
            ));
        }
    }
    let flushed = c.flush_abuse_events().await;
    if flushed != 20 || sink.calls() != 80 || sink.refusals() != 5_700 {
        return fail(format!(
            "a flush must write the 20 keys' held-back refusals: 80 writes standing for 5,700 \
             refusals in all; got {flushed} flushed, {} writes, {} refusals",
            sink.calls(),
            num(sink.refusals())
        ));
    }
    evidence(vec![
        "5,700 refusals from 20 keys over 3 windows: 60 writes, then 20 at the flush".into(),
        "every refusal counted in the events' totals".into(),
    ])
}

pub(super) async fn dead_store_costs_one_timeout(s: &Setup<'_>) -> ScenarioResult {
    let store = Switch::<dyn Store>::new(s.shared().await?);
    store.set(Health::Hanging);
    let mut tier = TierSpec::new("search", store.clone(), windowed(&*store, 10, 60)?);
    tier.timeout = DEAD;
    tier.breaker = breaker(1, 30)?;
    let c = s.compose(vec![tier])?;
    s.at(0);
    for round in 0..2u64 {
        for i in 1..=100 {
            let d = c.check(b"client").await;
            if !d.allowed || !d.source.degraded {
                return fail(format!(
                    "request {i} with the store hanging: must be admitted by the fail-open \
                     policy; got {}",
                    show(&d)
                ));
            }
        }
        if store.calls() != round + 1 {
            return fail(format!(
                "{} requests with the store hanging{}: it must be called {} time(s), once per \
                 cool-down; it was called {}",
                100 * (round + 1),
                if round == 0 {
                    ""
                } else {
                    " and one cool-down passed"
                },
                round + 1,
                store.calls()
            ));
        }
        s.clock.advance(Duration::from_secs(30));
    }

    // A dead abuse sink: 50 keys refused once each cost one sink call, and
    // nothing is lost: the counts are written once it is back.
    let sink = Switch::<dyn AbuseSink>::new(Arc::new(Events::default()));
    sink.set(Health::Hanging);
    let mut tier = TierSpec::new("form", local(), log(1, 60)?);
    tier.timeout = DEAD;
    tier.breaker = breaker(1, 30)?;
    tier.escalation = Some(s.reporting_to(sink.clone()).await?);
    let c = s.compose(vec![tier])?;
    for k in 0..50 {
        let key = format!("bot-{k}");
        let first = c.check(key.as_bytes()).await;
        let second = c.check(key.as_bytes()).await;
        if !first.allowed || second.allowed {
            return fail(format!(
                "{key}: the first request must be admitted and the second refused; got {} then {}",
                show(&first),
                show(&second)
            ));
        }
    }
    if sink.calls() != 1 {
        return fail(format!(
            "50 refusals with the abuse sink hanging: it must be called once (then its breaker \
             opens), it was called {} times",
            sink.calls()
        ));
    }
    sink.set(Health::Up);
    s.clock.advance(Duration::from_secs(30));
    let flushed = c.flush_abuse_events().await;
    if flushed != 50 || sink.refusals() != 50 {
        return fail(format!(
            "with the sink back after its cool-down, a flush must write the 50 held refusals; \
             wrote {flushed} events standing for {}",
            sink.refusals()
        ));
    }
    evidence(vec![
        format!(
            "a hanging store was called once per 30 s cool-down over 200 requests ({} ms timeout)",
            DEAD.as_millis()
        ),
        "a hanging abuse sink was called once for 50 refusals, all 50 written when it came back"
            .into(),
    ])
}

pub(super) async fn breaker_recovery(s: &Setup<'_>) -> ScenarioResult {
    let store = Switch::<dyn Store>::new(s.shared().await?);
    // A timeout no probe below reaches: the breaker is opened by a failing
    // store, and the probe is cancelled by dropping it, not by a timer, so
    // nothing here depends on how fast the machine is.
    let tier = |name: &'static str| -> Result<TierSpec, Failure> {
        let mut t = TierSpec::new(name, store.clone(), windowed(&*store, 10, 60)?);
        t.timeout = Duration::from_secs(60);
        t.breaker = breaker(1, 10)?;
        Ok(t)
    };
    s.at(0);

    // A probe whose caller goes away.
    let c = s.compose(vec![tier("cancelled")?])?;
    store.set(Health::Failing);
    c.check(b"client").await;
    s.clock.advance(Duration::from_secs(10));
    store.set(Health::Hanging);
    let calls = store.calls();
    {
        let mut probe = Box::pin(c.check(b"client"));
        // Polled until the probe waits on the hanging store, then dropped:
        // its caller went away.
        for _ in 0..1_000 {
            if futures::poll!(probe.as_mut()).is_ready() {
                return fail(
                    "scenario bug: the probe was answered although the store hangs and the \
                     timeout is a minute away",
                );
            }
            if store.calls() == calls + 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
    if store.calls() != calls + 1 {
        return fail("scenario bug: the probe never reached the hanging store");
    }
    store.set(Health::Up);
    let d = c.check(b"client").await;
    if !d.allowed || d.source.degraded || store.calls() != calls + 2 {
        return fail(format!(
            "after a cancelled probe, with the store back: the next request must probe the store \
             at once and be answered by it; got {} ({} store calls after the cancelled one)",
            show(&d),
            store.calls() - calls - 1
        ));
    }

    // A probe answered with InvalidRequest.
    let c = s.compose(vec![tier("invalid")?])?;
    store.set(Health::Failing);
    c.check(b"client").await;
    s.clock.advance(Duration::from_secs(10));
    store.set(Health::Invalid);
    c.check(b"client").await;
    store.set(Health::Up);
    let d = c.check(b"client").await;
    if !d.allowed || d.source.degraded {
        return fail(format!(
            "after a probe answered InvalidRequest, with the store up: the next request must be \
             answered by the store, the breaker neither half-open for ever nor re-opened; got {}",
            show(&d)
        ));
    }

    // A probe that fails: the breaker opens again for a full cool-down, in
    // which no request calls the store however many come (each would pay a
    // timeout on a hanging store); after it, with the store back, the next
    // request probes and closes the breaker.
    let c = s.compose(vec![tier("failed")?])?;
    store.set(Health::Failing);
    c.check(b"client").await;
    s.clock.advance(Duration::from_secs(10));
    let calls = store.calls();
    let d = c.check(b"client").await;
    if !d.source.degraded || store.calls() != calls + 1 {
        return fail(format!(
            "a cool-down after the breaker opened, with the store failing: the next request \
             must probe it, once, and be answered by the failure policy; got {} after {} store \
             calls",
            show(&d),
            store.calls() - calls
        ));
    }
    for i in 1..=50u64 {
        // 50 × 199 ms = 9.95 s: all inside the cool-down the failed probe began.
        s.clock.advance(Duration::from_millis(199));
        let d = c.check(b"client").await;
        if !d.source.degraded || store.calls() != calls + 1 {
            return fail(format!(
                "request {i}, {} ms after a failed probe, inside the 10 s cool-down it must \
                 begin: must be answered without calling the store; got {} with {} store calls \
                 since the probe",
                i * 199,
                show(&d),
                store.calls() - calls - 1
            ));
        }
    }
    store.set(Health::Up);
    s.clock.advance(Duration::from_millis(50));
    let d = c.check(b"client").await;
    if !d.allowed || d.source.degraded || store.calls() != calls + 2 {
        return fail(format!(
            "a full cool-down after a failed probe, with the store back: the next request must \
             probe the store and be answered by it; got {} with {} store calls since the \
             failed probe",
            show(&d),
            store.calls() - calls - 1
        ));
    }
    evidence(vec![
        "a cancelled probe released its slot: the next request probed and closed the breaker"
            .into(),
        "a probe answered InvalidRequest left the breaker able to probe again".into(),
        "a failed probe re-opened it for a full cool-down: 50 requests in it, no store call; \
         the probe after it closed the breaker"
            .into(),
    ])
}

pub(super) async fn refused_offender_costs_no_round_trip(s: &Setup<'_>) -> ScenarioResult {
    // A local tier (100/min) in front of a shared tier (5/min) with a
    // refusal cache. After 5 served at t0, 100 requests at t0+1 s are
    // refused with retry 59 s: the shared store is asked once, and the local
    // tier admits-and-refunds once, not 100 times.
    let store = Switch::<dyn Store>::new(s.shared().await?);
    let local = Switch::<dyn Store>::new(local());
    let mut shared_tier = TierSpec::new("shared", store.clone(), windowed(&*store, 5, 60)?);
    shared_tier.refusal_cache = Some(1_000);
    let c = s.compose(vec![
        TierSpec::new("local", local.clone(), log(100, 60)?),
        shared_tier,
    ])?;
    s.at(0);
    for i in 1..=5 {
        if !c.check(b"offender").await.allowed {
            return fail(format!("request {i} at t0 must be admitted"));
        }
    }
    s.at(S);
    let before = store.calls();
    for i in 1..=100 {
        let d = c.check(b"offender").await;
        if d.allowed || d.source.rule != Some("shared") || d.retry_after != Duration::from_secs(59)
        {
            return fail(format!(
                "request {i} at t0+1 s: must be refused by \"shared\" with retry_after 59 s; got {}",
                show(&d)
            ));
        }
    }
    let calls = store.calls() - before;
    if calls != 1 || local.refunds() != 1 {
        return fail(format!(
            "100 refused requests cost {calls} shared-store calls and {} refunds in the local              tier; a refusal standing until t0+60 s must cost one of each",
            local.refunds()
        ));
    }
    s.at(30 * S);
    let d = c.check(b"offender").await;
    if d.allowed || d.retry_after != Duration::from_secs(30) || store.calls() - before != 1 {
        return fail(format!(
            "at t0+30 s the standing refusal must answer with retry_after 30 s, still without a              store call; got {} after {} calls",
            show(&d),
            store.calls() - before
        ));
    }
    s.at(60 * S);
    let d = c.check(b"offender").await;
    if !d.allowed || store.calls() - before != 2 {
        return fail(format!(
            "at t0+60 s, when the refusal lapses, the store must be asked again and admit; got {}",
            show(&d)
        ));
    }
    evidence(vec![
        "101 refused requests over 30 s: 1 shared-store call, 1 local refund".into(),
        "asked again exactly when the refusal lapsed, and admitted".into(),
    ])
}

fn fixed(limit: u32, window_s: u64) -> Result<Policy, Failure> {
    policy(Algorithm::FixedWindow, limit, window_s * S)
}

pub(super) async fn leased_fleet_never_over_admits(s: &Setup<'_>) -> ScenarioResult {
    // Four instances lease from one shared fixed window of 20 per 10 s, in
    // batches of at most 4. Window 1 (opened at t0 by its first request):
    // 12 requests, 3 per instance (with the shipped lease, batches of 1 and
    // 2, all spent: what units in hand at a window's end do is
    // `leased_units_never_outlive_their_window`'s). Window 2 (opened at
    // t0+10 s): 60 requests, 15 per instance. The shared store counts every
    // leased unit, so each window admits at most 20; an instance strands at
    // most 3 units, so window 2 admits at least 20 − 4 × 3 = 8.
    let store = s.shared().await?;
    let p = fixed(20, 10)?;
    let fleet = s.fleet(4, &store, p, 4, FailurePolicy::Closed)?;
    let mut admitted = [0u32; 2];
    for (window, requests) in [(0u64, 12u64), (1, 60)] {
        for r in 0..requests {
            // Every 100 ms from the window's start: all inside it.
            s.at(window * 10 * S + r * 100_000);
            let d = fleet[(r % 4) as usize].check(b"tenant").await;
            if d.source.degraded {
                return fail(format!(
                    "window {}, request {}: the shared store must answer; got {}",
                    window + 1,
                    r + 1,
                    show(&d)
                ));
            }
            admitted[window as usize] += u32::from(d.allowed);
        }
    }
    if admitted[0] != 12 {
        return fail(format!(
            "window 1: 12 requests under a limit of 20 must all be admitted; {} were",
            admitted[0]
        ));
    }
    if admitted[1] > 20 {
        return fail(format!(
            "window 2: the fleet admitted {} requests against a limit of 20: leased units were \
             not counted by the shared store",
            admitted[1]
        ));
    }
    if admitted[1] < 8 {
        return fail(format!(
            "window 2: the fleet admitted only {} of 60 requests; at most 4 × 3 units can be \
             stranded, so at least 8 must be admitted",
            admitted[1]
        ));
    }
    evidence(vec![
        "window 1: 12 of 12 admitted".into(),
        format!(
            "window 2: {} of 60 admitted, at most the limit of 20",
            admitted[1]
        ),
    ])
}

pub(super) async fn leased_units_never_outlive_their_window(s: &Setup<'_>) -> ScenarioResult {
    // Four instances, each leasing in batches of at most 4 from one shared
    // window of 20 per 10 s, each through its own ledger around the shared
    // store, so the units the store counted in a window are known whatever
    // the instances say. Run for every algorithm a lease is sound for; the
    // windows start on the epoch grid, as a sliding window's always do, and
    // a fixed window's do here because its first request opens it there.
    //
    // Window 1: two requests per instance, 100 ms apart. Units counted and
    // not spent are in hand at the window's end (with the shipped lease,
    // batches of 1 then 2: 12 counted for 8 admitted, one in hand per
    // instance); the scenario proves nothing unless there are some.
    //
    // Window 2: a flood of 15 requests per instance at its first instant,
    // when a sliding window's weight of window 1 has not begun to fall, so
    // the store's room is fixed: 20 for a fixed window, 20 less window 1's
    // count for a sliding one. Each instance asks until the store refuses
    // it, so no unit is in hand at the end: the fleet must admit exactly
    // what the store counted in window 2. More is window 1's units spent
    // in window 2, which no window counted: with the 4 in hand above, 24
    // of a fixed window's 20. And each instance's first request in window
    // 2 must go to the shared store, having nothing it may spend.
    const INSTANCES: usize = 4;
    const LIMIT: u32 = 20;
    const W: u64 = 10 * S;
    const FLOOD: usize = 15;
    let names = ["A", "B", "C", "D"];
    let mut parts = Vec::new();
    let mut tested = 0;
    for (k, &algorithm) in (0u64..).zip(LEASE_ALGORITHMS.iter()) {
        let store = s.shared().await?;
        if !store.capabilities().algorithms.contains(&algorithm) {
            parts.push(format!(
                "{algorithm}: skipped, the {} store lacks it",
                store.name()
            ));
            continue;
        }
        tested += 1;
        let p = policy(algorithm, LIMIT, W)?;
        let ledgers: Vec<Arc<Ledger>> =
            (0..INSTANCES).map(|_| Ledger::new(store.clone())).collect();
        let fleet = ledgers
            .iter()
            .map(|ledger| {
                let mut tier = TierSpec::new("quota", ledger.clone(), p);
                tier.lease = Some(4);
                tier.on_failure = FailurePolicy::Closed;
                s.compose(vec![tier])
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A multiple of W after T0, itself on the grid.
        let base = k * 100 * S;
        let (w1, w2, w3) = (T0 + base, T0 + base + W, T0 + base + 2 * W);
        let counted = |from, to| ledgers.iter().map(|l| l.counted(from, to)).sum::<i64>();

        for r in 0..2 * INSTANCES {
            s.at(base + r as u64 * 100 * MS);
            let d = fleet[r % INSTANCES].check(b"tenant").await;
            if !d.allowed || d.source.degraded {
                return fail(format!(
                    "{algorithm}, window 1, request {} (instance {}): 8 requests under a limit \
                     of {LIMIT} must be admitted by the shared store; got {}",
                    r + 1,
                    names[r % INSTANCES],
                    show(&d)
                ));
            }
        }
        let counted1 = counted(w1, w2);
        let in_hand = counted1 - 2 * INSTANCES as i64;
        if in_hand <= 0 {
            return fail(format!(
                "{algorithm}: the scenario proves nothing: the shared store counted {counted1} \
                 units in window 1 for the fleet's 8 admissions, so no unit was in hand at the \
                 window's end to be spent after it"
            ));
        }

        s.at(base + W);
        let mut admitted = 0i64;
        let mut paid_from_hand = Vec::new();
        let mut last = Vec::new();
        for r in 0..FLOOD * INSTANCES {
            let i = r % INSTANCES;
            let before = ledgers[i].calls();
            let d = fleet[i].check(b"tenant").await;
            if d.source.degraded {
                return fail(format!(
                    "{algorithm}, window 2, request {}: the shared store must answer; got {}",
                    r + 1,
                    show(&d)
                ));
            }
            if r < INSTANCES && ledgers[i].calls() == before {
                paid_from_hand.push(names[i]);
            }
            admitted += i64::from(d.allowed);
            if r >= (FLOOD - 1) * INSTANCES {
                last.push((names[i], d));
            }
        }
        if let Some((name, d)) = last.iter().find(|(_, d)| d.allowed) {
            return fail(format!(
                "{algorithm}: the scenario proves nothing: instance {name}'s last request of the \
                 window 2 flood was admitted ({}), so units may still be in hand at its end",
                show(d)
            ));
        }
        let counted2 = counted(w2, w3);
        let room = match algorithm {
            Algorithm::SlidingWindow => i64::from(LIMIT) - counted1,
            _ => i64::from(LIMIT),
        };
        if counted2 != room {
            return fail(format!(
                "{algorithm}, window 2: a flood until every instance is refused must lease the \
                 store's whole room of {room} units (the limit{}), but it counted {counted2}",
                if algorithm == Algorithm::SlidingWindow {
                    format!(" less window 1's {counted1}")
                } else {
                    String::new()
                }
            ));
        }
        if admitted > counted2 {
            return fail(format!(
                "{algorithm}, window 2: the fleet spent {admitted} units but the shared store \
                 counted {counted2} in that window: {} units leased in window 1 (where {in_hand} \
                 were in hand at its end) were spent after the window that counted them",
                admitted - counted2
            ));
        }
        if !paid_from_hand.is_empty() {
            return fail(format!(
                "{algorithm}, window 2: the first request of instance(s) {} was paid from units \
                 leased in window 1 without asking the shared store",
                paid_from_hand.join(", ")
            ));
        }
        if admitted < counted2 {
            return fail(format!(
                "{algorithm}, window 2: the shared store counted {counted2} units but the fleet \
                 admitted only {admitted}, although every instance asked until it was refused: \
                 leased units were lost"
            ));
        }
        parts.push(format!(
            "{algorithm}: window 1 left {in_hand} of {counted1} counted units in hand; window 2 \
             admitted exactly the {counted2} it counted, every instance's first request asking \
             the shared store"
        ));
    }
    if tested == 0 {
        return fail(format!(
            "the scenario proves nothing: the shared store supports none of {LEASE_ALGORITHMS:?}"
        ));
    }
    evidence(parts)
}

pub(super) async fn leased_units_returned(s: &Setup<'_>) -> ScenarioResult {
    // A shared fixed window of 10 per 10 s; two instances leasing in
    // batches of at most 4. A serves 4 requests and then stops, holding
    // units it leased; released, they go back to the shared store, and B,
    // asking until refused, is admitted every unit A did not spend: 6.
    let store = s.shared().await?;
    let p = fixed(10, 10)?;
    let fleet = s.fleet(2, &store, p, 4, FailurePolicy::Closed)?;
    s.at(0);
    admit_each(&*fleet[0], b"tenant", 4, |i| {
        format!("A's request {i} of 4")
    })
    .await?;
    s.at(S);
    let released = fleet[0].release_leases().await;
    if released == 0 {
        return fail(
            "A served 4 requests from batches of up to 4 and holds units, but releasing its \
             leases handed none back",
        );
    }
    let mut b = 0;
    for _ in 0..20 {
        if fleet[1].check(b"tenant").await.allowed {
            b += 1;
        }
    }
    if b != 6 {
        return fail(format!(
            "after A (4 admitted) released {released} units, B must be admitted the other 6 of \
             the window's 10; it was admitted {b}: {} units left stranded",
            6i64 - i64::from(b)
        ));
    }
    evidence(vec![
        format!("A admitted 4 and released {released} unspent units"),
        "B was then admitted exactly the 6 units A did not spend".into(),
    ])
}

pub(super) async fn leased_dead_store_follows_failure_policy(s: &Setup<'_>) -> ScenarioResult {
    // One instance, fail closed, leasing in batches of at most 4 from a
    // shared fixed window of 1,000 per minute. After 4 requests it holds
    // units; then the shared store fails. The units in hand were counted
    // before the outage and may be spent (at most 3); after them every
    // request is refused by the failure policy.
    let store = Switch::<dyn Store>::new(s.shared().await?);
    let shared_store: Arc<dyn Store> = store.clone();
    let p = fixed(1_000, 60)?;
    let fleet = s.fleet(1, &shared_store, p, 4, FailurePolicy::Closed)?;
    s.at(0);
    admit_each(&*fleet[0], b"tenant", 4, |i| format!("request {i} of 4")).await?;
    store.set(Health::Failing);
    s.at(S);
    let mut from_hand = 0;
    for i in 1..=10 {
        let d = fleet[0].check(b"tenant").await;
        if d.allowed && !d.source.degraded && from_hand < 3 {
            from_hand += 1;
            continue;
        }
        if d.allowed || !d.source.degraded {
            return fail(format!(
                "request {i} with the shared store failing, after {from_hand} paid from units \
                 in hand (at most 3): must be refused by the failure policy (closed); got {}",
                show(&d)
            ));
        }
    }
    evidence(vec![
        format!("{from_hand} requests paid from units leased before the outage"),
        "every later request refused by the failure policy, degraded".into(),
    ])
}

/// A local layer a give-back or a reset must reach, in front of a shared
/// tier "login" (5 per 15 min, fixed window) with a refusal cache.
struct Layer {
    name: &'static str,
    tiers: Vec<TierSpec>,
    /// The shared store fails while the layer is attacked, so that its
    /// fallback counts the key.
    outage: bool,
}

/// The local layers of the give-back and reset scenarios: a refusal cache
/// alone, behind a local tier, leased in batches, with a fallback that
/// counts the key while the shared store is down (a breaker of one failure
/// keeps the dead store out of it), and escalating every admitted request
/// to a durable store (5 per hour) that counts it too.
fn local_layers(store: &Arc<dyn Store>) -> Result<Vec<Layer>, Failure> {
    let login = || -> Result<TierSpec, Failure> {
        let mut t = TierSpec::new(
            "login",
            store.clone(),
            policy(Algorithm::FixedWindow, 5, 900 * S)?,
        );
        t.refusal_cache = Some(100);
        Ok(t)
    };
    let layer = |name, tiers| Layer {
        name,
        tiers,
        outage: false,
    };
    let mut leased = login()?;
    leased.lease = Some(4);
    let mut fallback = login()?;
    fallback.fallback = Some(local());
    fallback.breaker = BreakerConfig::new(1, 3_600 * Duration::from_secs(1))
        .map_err(|e| Failure(format!("scenario bug: {e}")))?;
    let mut escalating = login()?;
    escalating.escalation = Some(EscalationSpec {
        store: local(),
        policy: policy(Algorithm::FixedWindow, 5, 3_600 * S)?,
        every: 1,
        sink: None,
    });
    Ok(vec![
        layer("a refusal cache", vec![login()?]),
        layer(
            "a local tier and a refusal cache",
            vec![TierSpec::new("burst", local(), log(100, 60)?), login()?],
        ),
        layer("a lease and a refusal cache", vec![leased]),
        Layer {
            name: "a fallback counting during an outage, and a refusal cache",
            tiers: vec![fallback],
            outage: true,
        },
        layer(
            "an escalation store sampling every admission, and a refusal cache",
            vec![escalating],
        ),
    ])
}

/// Fails unless a request for `key` through `c` is refused without a
/// store call: the state the scenario attacks is in play.
async fn refused_locally(
    c: &dyn Composition,
    store: &Switch<dyn Store>,
    key: &[u8],
    layer: &str,
) -> Result<(), Failure> {
    let before = store.calls();
    let d = c.check(key).await;
    if d.allowed || store.calls() != before {
        return fail(format!(
            "with {layer}: a request over the limit must be refused without a store call, from \
             local state, or this scenario proves nothing; got {} after {} store calls",
            show(&d),
            store.calls() - before
        ));
    }
    Ok(())
}

/// Fails unless, after a give-back or a reset, a peek admits and exactly 5
/// of 8 requests for `key` are.
async fn whole_limit_back(
    c: &dyn Composition,
    key: &[u8],
    layer: &str,
    after: &str,
) -> Result<(), Failure> {
    match c.peek(key).await {
        Some(d) if d.allowed => {}
        Some(d) => {
            return fail(format!(
                "with {layer}, after {after}: a peek must admit; got {}",
                show(&d)
            ));
        }
        None => return fail(format!("with {layer}: the composition cannot peek")),
    }
    let mut admitted = 0;
    for _ in 0..8 {
        admitted += u32::from(c.check(key).await.allowed);
    }
    if admitted != 5 {
        return fail(format!(
            "with {layer}, after {after}: 8 requests must admit exactly the limit, 5; {admitted} \
             were admitted"
        ));
    }
    Ok(())
}

pub(super) async fn give_back_reaches_local_state(s: &Setup<'_>) -> ScenarioResult {
    // Five logins held (counted while in flight), a sixth refused and a
    // seventh refused from local state; the five are given back (right
    // passwords, released permits): the store has the whole limit back, and
    // the instance must answer as the store would.
    let store = Switch::<dyn Store>::new(s.shared().await?);
    let shared: Arc<dyn Store> = store.clone();
    let layers = local_layers(&shared)?;
    s.at(0);
    for (i, l) in layers.iter().enumerate() {
        let layer = l.name;
        let c = s.compose(l.tiers.clone())?;
        store.set(if l.outage {
            Health::Failing
        } else {
            Health::Up
        });
        let key = format!("login-{i}");
        let key = key.as_bytes();
        let mut held = Vec::new();
        for n in 1..=5 {
            let Some(a) = c.check_admission(key).await else {
                return fail(format!(
                    "with {layer}: the composition cannot give requests back"
                ));
            };
            if !a.decision().allowed {
                return fail(format!(
                    "with {layer}: held request {n} must be admitted; got {}",
                    show(a.decision())
                ));
            }
            held.push(a);
        }
        let d = c.check(key).await;
        if d.allowed {
            return fail(format!("with {layer}: the sixth request must be refused"));
        }
        refused_locally(&*c, &store, key, layer).await?;
        for a in held {
            c.give_back(a).await;
        }
        whole_limit_back(&*c, key, layer, "five give-backs").await?;
    }
    store.set(Health::Up);
    evidence(vec![
        format!(
            "{} local layers: after 5 give-backs a peek admits and 5 of 8 are admitted",
            layers.len()
        ),
        "each refused the key from local state before the give-back".into(),
    ])
}

pub(super) async fn reset_reaches_local_state(s: &Setup<'_>) -> ScenarioResult {
    // The limit spent and a refusal held locally; support lifts it.
    let store = Switch::<dyn Store>::new(s.shared().await?);
    let shared: Arc<dyn Store> = store.clone();
    s.at(0);
    // A breaker open when support resets the key: the store answers again,
    // but the rule has not asked it since it failed. The reset must still
    // reach the store (a reset is rare and deliberate; one skipped while
    // reporting success leaves the customer locked out), so that once the
    // breaker closes the key has its whole limit.
    let layer = "an open breaker and a refusal cache";
    let mut tier = TierSpec::new(
        "login",
        shared.clone(),
        policy(Algorithm::FixedWindow, 5, 900 * S)?,
    );
    tier.refusal_cache = Some(100);
    tier.breaker = BreakerConfig::new(1, 10 * Duration::from_secs(1))
        .map_err(|e| Failure(format!("scenario bug: {e}")))?;
    let c = s.compose(vec![tier])?;
    spend_and_refuse(&*c, &store, b"reset-breaker", layer).await?;
    store.set(Health::Failing);
    let d = c.check(b"another-client").await;
    store.set(Health::Up);
    if !d.source.degraded {
        return fail(format!(
            "scenario bug: a request while the store fails must be answered by the failure \
             policy; got {}",
            show(&d)
        ));
    }
    let before = store.resets();
    match c.reset(b"reset-breaker").await {
        Some(Ok(())) if store.resets() > before => {}
        Some(Ok(())) => {
            return fail(format!(
                "with {layer}: the reset reported success without a call to the store"
            ));
        }
        Some(Err(e)) => return fail(format!("with {layer}: the reset failed: {e}")),
        None => return fail(format!("with {layer}: the composition cannot reset")),
    }
    s.at(11 * S);
    whole_limit_back(
        &*c,
        b"reset-breaker",
        layer,
        "a reset and the breaker's cool-down",
    )
    .await?;

    // Every other layer, the key's limit spent and refused locally.
    let layers = local_layers(&shared)?;
    for (i, l) in layers.iter().enumerate() {
        let layer = l.name;
        let c = s.compose(l.tiers.clone())?;
        store.set(if l.outage {
            Health::Failing
        } else {
            Health::Up
        });
        let key = format!("reset-{i}");
        let key = key.as_bytes();
        spend_and_refuse(&*c, &store, key, layer).await?;
        match (c.reset(key).await, l.outage) {
            (Some(Ok(())), false) | (Some(Err(_)), true) => {}
            (Some(Ok(())), true) => {
                return fail(format!(
                    "with {layer}: a reset while the shared store fails must report its error \
                     (the key is only partly reset), not success"
                ));
            }
            (Some(Err(e)), false) => {
                return fail(format!("with {layer}: the reset failed: {e}"));
            }
            (None, _) => return fail(format!("with {layer}: the composition cannot reset")),
        }
        whole_limit_back(&*c, key, layer, "a reset").await?;
    }
    store.set(Health::Up);

    evidence(vec![
        format!(
            "{} local layers: after a reset a peek admits and 5 of 8 are admitted",
            layers.len()
        ),
        "a reset while the shared store failed reported the error and reset the fallback".into(),
        "a reset while the breaker was open reached the store".into(),
    ])
}

/// Spends the limit of `key` (5) and has it refused, the last time from
/// local state.
async fn spend_and_refuse(
    c: &dyn Composition,
    store: &Switch<dyn Store>,
    key: &[u8],
    layer: &str,
) -> Result<(), Failure> {
    admit_each(c, key, 5, |n| format!("with {layer}: request {n}")).await?;
    let d = c.check(key).await;
    if d.allowed {
        return fail(format!("with {layer}: the sixth request must be refused"));
    }
    refused_locally(c, store, key, layer).await
}

pub(super) async fn penalty_reaches_local_state(s: &Setup<'_>) -> ScenarioResult {
    // A payment fails after two admitted requests and costs 3 more: the
    // shared tier has counted its 5, and the instance must not admit the
    // key from what it holds locally. The fallback is left out: a penalty
    // charges the rule's own store only.
    let store = Switch::<dyn Store>::new(s.shared().await?);
    let shared: Arc<dyn Store> = store.clone();
    let layers = local_layers(&shared)?;
    s.at(0);
    let mut tested = 0;
    for (i, l) in layers.iter().enumerate().filter(|(_, l)| !l.outage) {
        let layer = l.name;
        let c = s.compose(l.tiers.clone())?;
        let key = format!("penalty-{i}");
        let key = key.as_bytes();
        admit_each(&*c, key, 2, |n| format!("with {layer}: request {n}")).await?;
        match c.penalize(key, 3).await {
            Some(Ok(())) => {}
            Some(Err(e)) => return fail(format!("with {layer}: the penalty failed: {e}")),
            None => return fail(format!("with {layer}: the composition cannot penalize")),
        }
        for n in 1..=3 {
            let d = c.check(key).await;
            if d.allowed {
                return fail(format!(
                    "with {layer}: after 2 admitted and a penalty of 3 the limit of 5 is spent; \
                     request {n} after the penalty must be refused, got {}",
                    show(&d)
                ));
            }
        }
        tested += 1;
    }
    evidence(vec![format!(
        "{tested} local layers: after 2 admitted and a penalty of 3, 3 of 3 requests refused"
    )])
}

pub(super) async fn refusal_racing_a_give_back_not_cached(s: &Setup<'_>) -> ScenarioResult {
    // One unit per 10 s. A holds it; B is refused by the store, and its
    // reply is held up; A is given back; B's reply arrives. The refusal
    // predates the give-back: cached, it would refuse the unit the store
    // has back until its retry time.
    let store = Late::new(s.shared().await?);
    let mut tier = TierSpec::new(
        "partner",
        store.clone(),
        policy(Algorithm::FixedWindow, 1, 10 * S)?,
    );
    tier.refusal_cache = Some(100);
    let c: Arc<dyn Composition> = s.compose(vec![tier])?.into();
    s.at(0);
    let Some(a) = c.check_admission(b"api").await else {
        return fail("the composition cannot give requests back");
    };
    if !a.decision().allowed {
        return fail(format!("A must be admitted; got {}", show(a.decision())));
    }
    store.hold_next();
    let late = tokio::spawn({
        let c = c.clone();
        async move { c.check(b"api").await }
    });
    store.decided().await;
    c.give_back(a).await;
    store.release();
    let b = late
        .await
        .map_err(|e| Failure(format!("request B panicked: {e}")))?;
    if b.allowed {
        return fail(format!(
            "B, decided while A held the unit, must be refused; got {}",
            show(&b)
        ));
    }
    let d = c.check(b"api").await;
    if !d.allowed {
        return fail(format!(
            "after A's give-back, the next request must be admitted: a refusal made before the \
             give-back and arriving after it is stale; got {}",
            show(&d)
        ));
    }
    evidence(vec![
        "a refusal decided before a give-back and delivered after it was not kept".into(),
    ])
}
