//! Local state in front of a shared store (refusal caches, leases, local
//! tiers, fallback, escalation, breaker): a refused client costs no round
//! trip, and every give-back, reset and penalty reaches that state.

use super::*;

pub(crate) async fn refused_offender_costs_no_round_trip(s: &Setup<'_>) -> ScenarioResult {
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

/// A local layer a give-back or a reset must reach, in front of a shared
/// tier "login" (5 per 15 min, fixed window) with a refusal cache.
struct Layer {
    name: &'static str,
    tiers: Vec<TierSpec>,
    /// The shared store fails while the layer is attacked, so that its
    /// fallback counts the key.
    outage: bool,
}

impl Layer {
    /// The layer's composition, with the shared `store` failing while the
    /// layer needs an outage and answering otherwise.
    fn compose(
        &self,
        s: &Setup<'_>,
        store: &Switch<dyn Store>,
    ) -> Result<Box<dyn Composition>, Failure> {
        store.set(if self.outage {
            Health::Failing
        } else {
            Health::Up
        });
        s.compose(self.tiers.clone())
    }
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

pub(crate) async fn give_back_reaches_local_state(s: &Setup<'_>) -> ScenarioResult {
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
        let c = l.compose(s, &store)?;
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

pub(crate) async fn reset_reaches_local_state(s: &Setup<'_>) -> ScenarioResult {
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
        let c = l.compose(s, &store)?;
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

pub(crate) async fn penalty_reaches_local_state(s: &Setup<'_>) -> ScenarioResult {
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
        let c = l.compose(s, &store)?;
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

pub(crate) async fn refusal_racing_a_give_back_not_cached(s: &Setup<'_>) -> ScenarioResult {
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
