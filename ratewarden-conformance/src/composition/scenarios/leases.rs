//! Leased quotas: a fleet never over the limit, units never spent outside
//! the window that counted them, handed back at shutdown, and a dead shared
//! store answered by the failure policy.

use super::*;

fn fixed(limit: u32, window_s: u64) -> Result<Policy, Failure> {
    policy(Algorithm::FixedWindow, limit, window_s * S)
}

pub(crate) async fn leased_fleet_never_over_admits(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn leased_units_never_outlive_their_window(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn leased_units_returned(s: &Setup<'_>) -> ScenarioResult {
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

pub(crate) async fn leased_dead_store_follows_failure_policy(s: &Setup<'_>) -> ScenarioResult {
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
