//! Tiers: a request refused by a later tier is recorded by no tier, and a
//! shared tier's `Retry-After` is honoured by the local tiers before it.

use super::*;

pub(crate) async fn later_tier_refusal_not_charged(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn shared_retry_after_honoured(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn shadow_rule_counts_and_never_refuses(s: &Setup<'_>) -> ScenarioResult {
    // Tiers on the shared store: "trial", 3 per minute in shadow mode, then
    // "gate", 10 per minute. 8 requests at t0: "gate" admits all 8; "trial"
    // admits 3 and would refuse the next 5, which it must not, and says so
    // on each. Then "trial" is switched on (a composition of the same
    // rules, none in shadow mode, on the same store): at t0+1 s it refuses
    // with retry 59 s, since it counted its 3 admissions and none of its
    // would-be refusals; at t0+60 s it admits 3 and refuses the 4th.
    let shared = s.shared().await?;
    let trial = windowed(&*shared, 3, 60)?;
    let gate = windowed(&*shared, 10, 60)?;
    let tiers = |shadow: bool| {
        let mut trial = TierSpec::new("trial", shared.clone(), trial);
        trial.shadow = shadow;
        vec![trial, TierSpec::new("gate", shared.clone(), gate)]
    };
    let watching = s.compose(tiers(true))?;
    s.at(0);
    // Who answers is checked after the counts: a refusal is the worse bug.
    let mut shown_shadow = None;
    for i in 1..=8u32 {
        let d = watching.check(b"client").await;
        let flagged = i > 3;
        if !d.allowed || d.source.shadow_refused != flagged {
            return fail(format!(
                "request {i} at t0 with \"trial\" (3/min) in shadow mode: must be admitted by \
                 \"gate\" (10/min), {} a shadow refusal; got {}{}",
                if flagged {
                    "marked as"
                } else {
                    "not marked as"
                },
                show(&d),
                if d.source.shadow_refused {
                    ", marked as a shadow refusal"
                } else {
                    ""
                }
            ));
        }
        if d.source.rule != Some("gate") && shown_shadow.is_none() {
            shown_shadow = Some((i, show(&d)));
        }
    }
    if let Some((i, got)) = shown_shadow {
        return fail(format!(
            "request {i} at t0: a client must be shown the enforcing rule's quota (\"gate\"), \
             not the shadow rule's; got {got}"
        ));
    }
    let enforcing = s.compose(tiers(false))?;
    s.at(S);
    let d = enforcing.check(b"client").await;
    if d.allowed || d.source.rule != Some("trial") || d.retry_after != Duration::from_secs(59) {
        return fail(format!(
            "after the switch, at t0+1 s: \"trial\" counted 3 admissions in shadow mode, so it \
             must refuse with retry_after 59 s; got {}",
            show(&d)
        ));
    }
    s.at(60 * S);
    for i in 1..=4u32 {
        let d = enforcing.check(b"client").await;
        let want = i <= 3;
        if d.allowed != want || (!want && d.source.rule != Some("trial")) {
            return fail(format!(
                "request {i} at t0+60 s, \"trial\" switched on: must be {}; got {}",
                if want {
                    "admitted"
                } else {
                    "refused by \"trial\""
                },
                show(&d)
            ));
        }
    }
    evidence(vec![
        "8 requests at t0, \"trial\" (3/min) in shadow mode before \"gate\" (10/min): all \
         admitted, 5 marked as shadow refusals"
            .into(),
        "switched on: refused at t0+1 s with retry 59 s, 3 admitted at t0+60 s".into(),
    ])
}
