//! `peek_never_records`, `reset_is_exact`, `policy_change` and
//! `penalty_is_counted`: the operations beside a decision, and a key moved
//! between plans.

use crate::call;

use ratewarden_core::{Algorithm, Clock, Decision, Policy};
use std::time::Duration;

use crate::support::{MS, Probe, S, T0, crowd_of_tasks, dur, evidence, fail, policy};
use crate::{Failure, ScenarioResult, StoreFactory};

/// One step of the peek table: at `at` µs after t0, peek every cost on the
/// peeked key, then decide `cost` on it and on its twin, which is never
/// peeked; `cost` 0 peeks only.
struct Step {
    at: u64,
    cost: u32,
}

const PEEK_LIMIT: u32 = 5;
const PEEK_WINDOW: u64 = 10 * S;

/// Crosses each algorithm's boundaries: a fresh key peeked seconds before
/// its first request, admissions up to the limit, a refusal peeked and
/// hammered with peeks, the window's end, and a request of the whole limit.
const PEEK_TABLE: [Step; 10] = [
    Step { at: S, cost: 0 },
    Step { at: 4 * S, cost: 2 },
    Step {
        at: 4 * S + S / 2,
        cost: 2,
    },
    Step { at: 5 * S, cost: 2 },
    Step { at: 6 * S, cost: 0 },
    Step { at: 9 * S, cost: 1 },
    Step {
        at: 13 * S,
        cost: 1,
    },
    Step {
        at: 14 * S + S / 2,
        cost: 3,
    },
    Step {
        at: 20 * S,
        cost: 0,
    },
    Step {
        at: 40 * S,
        cost: PEEK_LIMIT,
    },
];

/// The numbers a client sees, for comparing a peek with a decision.
fn seen(d: &Decision) -> (bool, u32, u128, u128) {
    (
        d.allowed,
        d.remaining,
        d.reset_after.as_micros(),
        d.retry_after.as_micros(),
    )
}

fn show(d: &Decision) -> String {
    format!(
        "{}, remaining {}, reset_after {:?}, retry_after {:?}",
        if d.allowed { "admitted" } else { "refused" },
        d.remaining,
        d.reset_after,
        d.retry_after
    )
}

async fn peek(
    probe: &Probe,
    key: &[u8],
    p: &Policy,
    cost: u32,
    what: &str,
) -> Result<Decision, Failure> {
    let now = probe.clock.now();
    call::peek(&probe.store, key, p, cost, now)
        .await
        .map_err(|e| {
            Failure(format!(
                "{}: peek of cost {cost} ({what}) returned an error: {e}",
                p.algorithm()
            ))
        })
}

pub(crate) async fn peek_never_records(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, PEEK_LIMIT, PEEK_WINDOW)?;
        let peeked = format!("peek/{algorithm}/peeked").into_bytes();
        let twin = format!("peek/{algorithm}/twin").into_bytes();
        let mut peeks = 0;
        let mut decisions = 0;
        for (n, step) in PEEK_TABLE.iter().enumerate() {
            probe.at(step.at);
            let at = format!("step {n}, t0+{} ms", step.at / 1_000);
            let mut asked = Vec::new();
            // Every cost, several times: only the last may matter if peeks
            // leave no trace.
            for cost in 1..=PEEK_LIMIT {
                for _ in 0..3 {
                    asked.push((cost, peek(&probe, &peeked, &p, cost, &at).await?));
                    peeks += 1;
                }
            }
            if step.cost == 0 {
                continue;
            }
            let mine = probe.hit(&peeked, &p, step.cost).await?;
            let theirs = probe.hit(&twin, &p, step.cost).await?;
            decisions += 1;
            if seen(&mine) != seen(&theirs) {
                return fail(format!(
                    "{algorithm}: at {at}, a request of cost {} on a key peeked {peeks} times \
                     was {}, but on a key never peeked {}: the peeks changed the key's state",
                    step.cost,
                    show(&mine),
                    show(&theirs)
                ));
            }
            let Some((_, said)) = asked.iter().rev().find(|(c, _)| *c == step.cost) else {
                return fail("scenario bug: no peek of the step's cost");
            };
            if seen(said) != seen(&mine) {
                return fail(format!(
                    "{algorithm}: at {at}, a peek of cost {} answered {}, but the request that \
                     followed at the same instant was {}: a peek must answer exactly what \
                     decide would",
                    step.cost,
                    show(said),
                    show(&mine)
                ));
            }
        }
        parts.push(format!(
            "{algorithm}: {peeks} peeks around {decisions} requests each answered what the next \
             request got, and left the key deciding exactly as an unpeeked twin"
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

const RESET_LIMIT: u32 = 20;
const RESET_WINDOW: u64 = 60 * S;
const TASKS: usize = 32;
const PER_TASK: usize = 2;

/// Admits on `key` until refused; the count admitted.
async fn exhaust(probe: &Probe, key: &[u8], p: &Policy) -> Result<u32, Failure> {
    let mut admitted = 0;
    while probe.hit(key, p, 1).await?.allowed {
        admitted += 1;
        if admitted > 10 * RESET_LIMIT {
            return fail(format!(
                "{}: {admitted} requests at one instant were all admitted; the limit is \
                 {RESET_LIMIT}",
                p.algorithm()
            ));
        }
    }
    Ok(admitted)
}

async fn reset(probe: &Probe, key: &[u8], p: &Policy, what: &str) -> Result<(), Failure> {
    call::reset(&probe.store, key, p).await.map_err(|e| {
        Failure(format!(
            "{}: reset of {what} returned an error: {e}",
            p.algorithm()
        ))
    })
}

/// `TASKS × PER_TASK` concurrent requests on `key` at the clock's time: the
/// `remaining` of each admitted one.
async fn hammer(probe: &Probe, key: &[u8], p: &Policy) -> Result<Vec<u32>, Failure> {
    let now = probe.clock.now();
    Ok(crowd_of_tasks(&probe.store, key, p, now, TASKS, PER_TASK)
        .await?
        .remaining)
}

pub(crate) async fn reset_is_exact(factory: &dyn StoreFactory) -> ScenarioResult {
    if tokio::runtime::Handle::try_current().is_err() {
        return fail(
            "reset_is_exact must run inside a tokio runtime (multi-thread for real \
             parallelism): it spawns its callers as tasks",
        );
    }
    let probe = Probe::new(factory).await?;
    // A second store that sees the other key's traffic and no reset: what
    // the other key must answer.
    let control = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for &algorithm in &algorithms {
        let p = policy(algorithm, RESET_LIMIT, RESET_WINDOW)?;
        let key = format!("reset/{algorithm}").into_bytes();
        let other = format!("reset/{algorithm}/other").into_bytes();
        // Exhausted half-way through a window and again half-way through
        // the next, so that a sliding window's previous count still weighs
        // when the key is reset.
        probe.at(RESET_WINDOW / 2);
        control.at(RESET_WINDOW / 2);
        exhaust(&probe, &key, &p).await?;
        for _ in 0..5 {
            probe.hit(&other, &p, 1).await?;
            control.hit(&other, &p, 1).await?;
        }
        probe.at(RESET_WINDOW + RESET_WINDOW / 2);
        exhaust(&probe, &key, &p).await?;
        reset(&probe, &key, &p, "an exhausted key").await?;
        let remaining = hammer(&probe, &key, &p).await?;
        if remaining != (0..RESET_LIMIT).collect::<Vec<_>>() {
            return fail(format!(
                "{algorithm}: after a reset, {} of {} concurrent requests were admitted, \
                 reporting remaining {remaining:?}; a reset key must admit exactly its full \
                 limit of {RESET_LIMIT}, remaining {}..=0 once each",
                remaining.len(),
                TASKS * PER_TASK,
                RESET_LIMIT - 1
            ));
        }
        // A reset at the instant of the last request, then the same request
        // on the reset key and on a key never seen: the same numbers, so
        // the reset opened no window and kept nothing.
        let t = RESET_WINDOW + RESET_WINDOW / 2 + S;
        probe.at(t);
        control.at(t);
        exhaust(&probe, &key, &p).await?;
        reset(&probe, &key, &p, "a key exhausted at this instant").await?;
        let after = probe.hit(&key, &p, 3).await?;
        let fresh = probe
            .hit(format!("reset/{algorithm}/fresh").as_bytes(), &p, 3)
            .await?;
        if seen(&after) != seen(&fresh) {
            return fail(format!(
                "{algorithm}: a request of cost 3 just after a reset was {}, but on a key never \
                 seen {}: a reset must leave the key as if it had never been seen",
                show(&after),
                show(&fresh)
            ));
        }
        let untouched = probe.hit(&other, &p, 1).await?;
        let expected = control.hit(&other, &p, 1).await?;
        if seen(&untouched) != seen(&expected) {
            return fail(format!(
                "{algorithm}: another key answered {} after the reset, but {} in a store where \
                 nothing was reset: a reset must forget one key only",
                show(&untouched),
                show(&expected)
            ));
        }
        reset(&probe, b"reset/never-seen", &p, "a key never seen").await?;
        let never = probe.hit(b"reset/never-seen", &p, 1).await?;
        if !never.allowed || never.remaining != RESET_LIMIT - 1 {
            return fail(format!(
                "{algorithm}: a key reset before it was ever seen then answered {}; expected \
                 admitted with remaining {}",
                show(&never),
                RESET_LIMIT - 1
            ));
        }
        parts.push(format!(
            "{algorithm}: an exhausted key reset then admitted exactly {RESET_LIMIT} of {} \
             concurrent requests (remaining {}..=0 once each) and decided as a key never seen",
            TASKS * PER_TASK,
            RESET_LIMIT - 1
        ));
    }
    // The same bytes under another algorithm are another state: a reset
    // under one leaves the other exhausted.
    if let [first, second, ..] = algorithms[..] {
        let a = policy(first, RESET_LIMIT, RESET_WINDOW)?;
        let b = policy(second, RESET_LIMIT, RESET_WINDOW)?;
        probe.at(10 * RESET_WINDOW);
        exhaust(&probe, b"reset/shared-bytes", &a).await?;
        exhaust(&probe, b"reset/shared-bytes", &b).await?;
        reset(&probe, b"reset/shared-bytes", &a, "one algorithm's key").await?;
        let kept = probe.hit(b"reset/shared-bytes", &b, 1).await?;
        if kept.allowed {
            return fail(format!(
                "a reset under {first} also reset the same key under {second}, which answered \
                 {}: state is kept per (algorithm, key)",
                show(&kept)
            ));
        }
        parts.push(format!(
            "a reset under {first} left the same key under {second} exhausted"
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

const FREE: u32 = 4;
const PRO: u32 = 10;
const PLAN_WINDOW: u64 = 10 * S;
const PLAN_STEPS: u64 = 48;

pub(crate) async fn policy_change(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let free = policy(algorithm, FREE, PLAN_WINDOW)?;
        let pro = policy(algorithm, PRO, PLAN_WINDOW)?;
        let key = format!("plan/{algorithm}").into_bytes();
        // The reference: one state per (algorithm, key), whatever the plan.
        let mut state = None;
        let (mut on_free, mut on_pro) = (0, 0);
        for i in 0..PLAN_STEPS {
            // Upgrades and downgrades inside windows: three requests on the
            // paid plan, two on the free one, one request in seven of cost 2.
            let (plan, name) = if i % 5 < 3 {
                (&pro, "pro")
            } else {
                (&free, "free")
            };
            let cost = if i % 7 == 0 { 2 } else { 1 };
            let at = i * 700 * MS;
            probe.at(at);
            let expected = ratewarden_core::algorithm::apply(&mut state, plan, cost, T0 + at);
            let expected = Decision::from_verdict(expected, plan, "reference");
            let got = probe.hit(&key, plan, cost).await?;
            if seen(&got) != seen(&expected) {
                return fail(format!(
                    "{algorithm}: request {i} (cost {cost}, on the {name} plan, limit {}) at \
                     t0+{} ms was {}, but {} by the key's usage under both plans: usage counted \
                     under one plan must carry over to the other",
                    plan.limit(),
                    at / 1_000,
                    show(&got),
                    show(&expected)
                ));
            }
            if got.allowed {
                if name == "pro" {
                    on_pro += cost;
                } else {
                    on_free += cost;
                }
            }
        }
        parts.push(format!(
            "{algorithm}: {PLAN_STEPS} requests moving between limits {PRO} and {FREE} (same \
             window) decided on the key's whole usage: {on_pro} units admitted on {PRO}, \
             {on_free} on {FREE}"
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

const PENALTY_LIMIT: u32 = 10;
const PENALTY_WINDOW: u64 = 10 * S;

/// One step of the penalty table: at `at` µs after t0, `penalty` units
/// charged (0: none), then a request of `cost` (0: none).
struct Charge {
    at: u64,
    penalty: u32,
    cost: u32,
}

/// A key that has spent some of its limit is charged more than it has
/// left, then charged again while over it, then asked across two windows;
/// a second key is charged before its first request.
const PENALTY_TABLE: [Charge; 11] = [
    Charge {
        at: 0,
        penalty: 0,
        cost: 4,
    },
    Charge {
        at: S,
        penalty: 0,
        cost: 4,
    },
    Charge {
        at: 2 * S,
        penalty: 5,
        cost: 0,
    },
    Charge {
        at: 2 * S + 100 * MS,
        penalty: 0,
        cost: 1,
    },
    Charge {
        at: 3 * S,
        penalty: 7,
        cost: 1,
    },
    Charge {
        at: 9 * S,
        penalty: 0,
        cost: 1,
    },
    Charge {
        at: 11 * S,
        penalty: 0,
        cost: 2,
    },
    Charge {
        at: 12 * S,
        penalty: 0,
        cost: 5,
    },
    Charge {
        at: 14 * S,
        penalty: 3,
        cost: 0,
    },
    Charge {
        at: 15 * S,
        penalty: 0,
        cost: 3,
    },
    Charge {
        at: 25 * S,
        penalty: 0,
        cost: 10,
    },
];

pub(crate) async fn penalty_is_counted(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, PENALTY_LIMIT, PENALTY_WINDOW)?;
        for (key, first) in [("penalty/spent", 0), ("penalty/charged-first", 2)] {
            let key = format!("{key}/{algorithm}").into_bytes();
            // The reference: the algorithm's own transitions, penalties
            // included, on one state.
            let mut state = None;
            let mut refused_after_a_penalty = 0;
            for (i, step) in PENALTY_TABLE.iter().enumerate().skip(first) {
                probe.at(step.at);
                let now = T0 + step.at;
                if step.penalty > 0 {
                    let charged =
                        call::penalize(&probe.store, &key, &p, step.penalty, probe.clock.now())
                            .await;
                    if let Err(e) = charged {
                        return fail(format!(
                            "{algorithm}: a penalty of {} at t0+{} ms returned an error: {e}",
                            step.penalty,
                            step.at / 1_000
                        ));
                    }
                    ratewarden_core::algorithm::penalize(&mut state, &p, step.penalty, now);
                }
                if step.cost == 0 {
                    continue;
                }
                let expected = ratewarden_core::algorithm::apply(&mut state, &p, step.cost, now);
                let expected = Decision::from_verdict(expected, &p, "reference");
                let got = probe.hit(&key, &p, step.cost).await?;
                if seen(&got) != seen(&expected) {
                    return fail(format!(
                        "{algorithm}: step {i} (key {}, cost {}) at t0+{} ms was {}, but {} \
                         with the penalties counted (limit {PENALTY_LIMIT}): a penalty must \
                         record its units whether or not they fit, within algorithm::penalize's \
                         bounds",
                        String::from_utf8_lossy(&key),
                        step.cost,
                        step.at / 1_000,
                        show(&got),
                        show(&expected)
                    ));
                }
                refused_after_a_penalty += u32::from(!got.allowed);
            }
            if refused_after_a_penalty == 0 {
                return fail(format!(
                    "{algorithm}: no request after a penalty was refused; the table is meant to \
                     exhaust the key"
                ));
            }
        }
        parts.push(format!(
            "{algorithm}: penalties on a key over its limit and on a new key decided as the \
             reference's penalize (limit {PENALTY_LIMIT}, {} steps)",
            PENALTY_TABLE.len()
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

const BAN_LIMIT: u32 = 2;
const BAN_WINDOW: u64 = 10 * S;
/// One request every 700 ms for 420 s: a key that hammers through bans of
/// growing length, has one lifted by a reset, goes quiet past `max`, and
/// is banned again for the first length.
const BAN_STEPS: u64 = 600;
const BAN_RESET_AT: u64 = 150;
const BAN_QUIET_FROM: u64 = 250;
const BAN_QUIET_UNTIL: u64 = 580;

/// The ban every algorithm is tried under: the third refusal in a minute
/// bans for 20 s, 40 s, then 80 s at most.
fn the_ban() -> Result<ratewarden_core::Ban, Failure> {
    ratewarden_core::Ban::new(3, Duration::from_secs(60), Duration::from_secs(20))
        .and_then(|b| b.growing(2, Duration::from_secs(80)))
        .map_err(|e| Failure(format!("the scenario's ban is refused: {e}")))
}

pub(crate) async fn bans_are_exact(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let ban = the_ban()?;
    if !probe.store.capabilities().bans {
        // A store that keeps no bans must say so when a rule is built, not
        // accept the policy and decide without its ban.
        let p = policy(
            probe.store.capabilities().algorithms[0],
            BAN_LIMIT,
            BAN_WINDOW,
        )?;
        return match probe.store.check_policy(&p.with_ban(ban)) {
            Err(e) => evidence(vec![format!(
                "the {} store declares no bans and refuses a banning policy: {e}",
                probe.store.name()
            )]),
            Ok(()) => fail(format!(
                "the {} store declares no bans (Capabilities::bans) but its check_policy \
                 accepted \"{}\": the ban would be ignored",
                probe.store.name(),
                p.with_ban(ban)
            )),
        };
    }
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, BAN_LIMIT, BAN_WINDOW)?.with_ban(ban);
        let key = format!("ban/{algorithm}").into_bytes();
        // The reference: the algorithm's state and the ban's, by
        // `ratewarden_core::ban`.
        let (mut state, mut banned) = (None, None);
        let (mut bans, mut longest, mut during) = (0, 0u64, 0);
        let mut after_quiet = None;
        for i in 0..BAN_STEPS {
            if (BAN_QUIET_FROM..BAN_QUIET_UNTIL).contains(&i) {
                continue;
            }
            let at = i * 700 * MS;
            probe.at(at);
            let now = T0 + at;
            if i == BAN_RESET_AT {
                if let Err(e) = call::reset(&probe.store, &key, &p).await {
                    return fail(format!("{algorithm}: a reset returned an error: {e}"));
                }
                (state, banned) = (None, None);
            }
            if i % 4 == 0 {
                let expected = match ratewarden_core::ban::banned(&banned, now) {
                    Some(v) => v,
                    None => ratewarden_core::algorithm::peek(&state, &p, 1, now),
                };
                let expected = Decision::from_verdict(expected, &p, "reference");
                let got = peek(&probe, &key, &p, 1, "before a request").await?;
                if seen(&got) != seen(&expected) {
                    return fail(format!(
                        "{algorithm}: a peek before request {i} at t0+{} ms was {}, but {}: a \
                         peek reports a ban and records nothing",
                        at / 1_000,
                        show(&got),
                        show(&expected)
                    ));
                }
            }
            let (expected, is_ban) = ratewarden_core::ban::decide(&mut banned, &ban, now, || {
                ratewarden_core::algorithm::apply(&mut state, &p, 1, now)
            });
            let got = probe.hit(&key, &p, 1).await?;
            let expected = Decision::from_verdict(expected, &p, "reference");
            if seen(&got) != seen(&expected) || got.source.banned != is_ban {
                return fail(format!(
                    "{algorithm}: request {i} at t0+{} ms was {}{}, but {}{} under \"{p}\": the \
                     third refusal in a minute bans, a banned key's refusals record nothing \
                     (a ban never extends itself), and a ban ends exactly on time",
                    at / 1_000,
                    show(&got),
                    if got.source.banned { " (banned)" } else { "" },
                    show(&expected),
                    if is_ban { " (banned)" } else { "" },
                ));
            }
            if is_ban {
                if i >= BAN_QUIET_UNTIL {
                    after_quiet.get_or_insert(expected.retry_after);
                }
                during += 1;
                if expected.retry_after.as_micros() as u64 > longest {
                    longest = expected.retry_after.as_micros() as u64;
                    bans += 1;
                }
            }
        }
        if after_quiet != Some(ban.block()) {
            return fail(format!(
                "{algorithm}: the first ban after the quiet spell was {after_quiet:?}; the \
                 scenario is meant to show offences forgiven"
            ));
        }
        if bans < 3 || during == 0 {
            return fail(format!(
                "{algorithm}: the scenario banned its key {bans} times; it is meant to ban it \
                 with growing lengths"
            ));
        }
        parts.push(format!(
            "{algorithm}: a key hammering every 700 ms under \"{p}\" decided and peeked as the \
             reference: {during} ban refusals, bans growing to {}, a reset lifting one, \
             offences forgiven after a quiet spell",
            dur(longest)
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}
