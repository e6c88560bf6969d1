//! A failing store: a fallback never consulted beside its store, a dead
//! store costing one timeout per cool-down, and a breaker that recovers.

use super::*;

pub(crate) async fn fallback_never_double_counts(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn dead_store_costs_one_timeout(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn breaker_recovery(s: &Setup<'_>) -> ScenarioResult {
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
