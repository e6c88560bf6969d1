//! A fleet sharing a partner API's quota through one Redis: four instances,
//! each wanting as many calls a second as the quota for 10 seconds, call a
//! mock API over HTTP whose quota (10, then 100 a second) is for all of
//! them, counted as a fixed window that opens at the first call after the
//! last one closed (the fleet's limiter keeps the same kind of window).
//! Every call goes through `WaitLayer` around a hyper client and waits for
//! its permit at most two seconds.
//!
//! Time is simulated: a clock that jumps to the next wake-up only when
//! every caller is asleep on it, so a call in flight (to Redis, to the API)
//! holds time still, and the figures do not depend on the machine's speed.
//! Round trips to Redis are counted on the wire, with and without leases.
#![cfg(feature = "redis")]

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratewarden::lease::{LeaseConfig, LeasedStore};
use ratewarden::outbound::{WaitCallError, WaitLayer};
use ratewarden::redis::RedisStore;
use ratewarden::{Clock, Limiter, ManualClock, Policy, Rule, Store, Timestamp, WaitError};
use ratewarden_test_support::WireCounter;
use ratewarden_test_support::http::serve;
use ratewarden_test_support::redis as redis_fixture;
use tokio::sync::{Notify, oneshot};
use tower::{Layer, ServiceExt};

const INSTANCES: u64 = 4;
const SECONDS: u64 = 10;
const MAX_WAIT: Duration = Duration::from_secs(2);
/// A healthy answer on a loaded machine is never taken for a failure.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Where simulated time starts.
const START: u64 = ManualClock::DEFAULT_START.as_micros();

#[derive(Default)]
struct Sim {
    /// Microseconds since `START`.
    now: u64,
    /// Tasks that take part: time moves only when all of them sleep.
    live: usize,
    sleepers: Vec<(u64, oneshot::Sender<()>)>,
}

/// A clock that moves to the earliest wake-up once every participant is
/// asleep on it.
#[derive(Clone, Default)]
struct SimClock {
    sim: Arc<Mutex<Sim>>,
    changed: Arc<Notify>,
}

impl fmt::Debug for SimClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimClock").finish_non_exhaustive()
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(START + self.sim.lock().unwrap().now)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_micros(self.sim.lock().unwrap().now)
    }

    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut sim = self.sim.lock().unwrap();
            let until = sim.now + d.as_micros() as u64;
            sim.sleepers.push((until, tx));
        }
        self.changed.notify_one();
        Box::pin(async move {
            rx.await.expect("the clock's driver outlives its sleepers");
        })
    }
}

/// One participating task, for as long as it lives.
struct Participant(SimClock);

impl Participant {
    fn join(clock: &SimClock) -> Self {
        clock.sim.lock().unwrap().live += 1;
        Participant(clock.clone())
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.0.sim.lock().unwrap().live -= 1;
        self.0.changed.notify_one();
    }
}

impl SimClock {
    /// Moves time while participants live.
    async fn drive(self) {
        loop {
            {
                let mut sim = self.sim.lock().unwrap();
                if sim.live == 0 {
                    return;
                }
                if sim.sleepers.len() >= sim.live {
                    let next = sim.sleepers.iter().map(|s| s.0).min().unwrap();
                    sim.now = sim.now.max(next);
                    let now = sim.now;
                    for (_, tx) in sim.sleepers.extract_if(.., |s| s.0 <= now) {
                        let _ = tx.send(());
                    }
                }
            }
            self.changed.notified().await;
        }
    }

    fn seconds(&self) -> f64 {
        self.sim.lock().unwrap().now as f64 / 1e6
    }
}

#[derive(Debug, Default)]
struct Outcome {
    /// When the API saw each call, in µs since `START`.
    seen: Vec<u64>,
    /// How long each call that reached the API waited for its permit.
    longest_wait: u64,
    gave_up: usize,
    round_trips: u64,
    /// When the last call ended, in simulated seconds.
    ended: f64,
}

/// Runs the fleet against an API allowing `quota` calls a second, each
/// instance wanting as many; with `leases`, each instance's rule on a
/// `LeasedStore` (batches up to half the quota) in front of Redis.
async fn run(shared_url: &str, wire: &WireCounter, quota: u64, leases: bool) -> Outcome {
    let clock = SimClock::default();
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let api = {
        let (clock, seen) = (clock.clone(), seen.clone());
        Router::new().route(
            "/partner",
            get(move || async move {
                seen.lock().unwrap().push(clock.sim.lock().unwrap().now);
                "ok"
            }),
        )
    };
    let api = serve(api).await;
    let prefix = redis_fixture::unique_prefix("outbound");
    let policy = Policy::fixed_window(quota as u32, Duration::from_secs(1)).unwrap();
    let waits: Arc<Mutex<(u64, usize)>> = Arc::default();
    let before = wire.exchanges();
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let redis: Arc<dyn Store> = Arc::new(
            RedisStore::builder(shared_url)
                .key_prefix(prefix.clone())
                // Counted on the wire: calls only, not notice heartbeats.
                .notices(false)
                .timeout(TIMEOUT)
                .build()
                .unwrap(),
        );
        let store: Arc<dyn Store> = if leases {
            let config = LeaseConfig::new(quota as u32 / 2).unwrap();
            Arc::new(LeasedStore::new(redis, config))
        } else {
            redis
        };
        let limiter = Limiter::builder()
            .clock(clock.clone())
            .rule(
                Rule::new("partner-api", store, policy)
                    .unwrap()
                    .with_timeout(TIMEOUT)
                    .unwrap(),
            )
            .build()
            .unwrap();
        let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let client = WaitLayer::new(limiter, "partner", MAX_WAIT).layer(http);
        let me = Participant::join(&clock);
        let (clock, waits) = (clock.clone(), waits.clone());
        instances.push(tokio::spawn(async move {
            let _me = me;
            for _ in 0..quota * SECONDS {
                let call = Participant::join(&clock);
                let (client, waits) = (client.clone(), waits.clone());
                tokio::spawn(async move {
                    let clock = call.0.clone();
                    let _call = call;
                    let asked = clock.monotonic();
                    let request = Request::get(format!("http://{api}/partner"))
                        .body(Empty::new())
                        .unwrap();
                    let result = client.oneshot(request).await;
                    let waited = (clock.monotonic() - asked).as_micros() as u64;
                    let mut waits = waits.lock().unwrap();
                    match result {
                        Ok(response) => {
                            assert!(response.status().is_success());
                            waits.0 = waits.0.max(waited);
                        }
                        Err(WaitCallError::Wait(WaitError::Deadline { .. })) => waits.1 += 1,
                        Err(e) => panic!("a call failed: {e}"),
                    }
                });
                clock.sleep(Duration::from_secs(1) / quota as u32).await;
            }
        }));
    }
    let driver = tokio::spawn(clock.clone().drive());
    for instance in instances {
        instance.await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(300), driver)
        .await
        .expect("every call ends")
        .unwrap();
    let (longest_wait, gave_up) = *waits.lock().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    Outcome {
        seen,
        longest_wait,
        gave_up,
        round_trips: wire.exchanges() - before,
        ended: clock.seconds(),
    }
}

/// Checks the quota and the share of it the fleet got; returns the calls
/// made in the first `SECONDS` seconds.
fn check(outcome: &Outcome, quota: u64, what: &str) -> u64 {
    // The API's windows: a second each, opening at the first call after
    // the last one closed.
    let mut window: Option<(u64, u64)> = None;
    for t in &outcome.seen {
        let (start, calls) = match window {
            Some((start, calls)) if *t < start + 1_000_000 => (start, calls + 1),
            _ => (*t, 1),
        };
        assert!(
            calls <= quota,
            "{what}: the API saw {calls} calls in its window from {start} µs"
        );
        window = Some((start, calls));
    }
    let within = outcome
        .seen
        .iter()
        .filter(|t| **t < SECONDS * 1_000_000)
        .count() as u64;
    assert!(
        within * 10 >= quota * SECONDS * 9,
        "{what}: {within} calls of a quota of {} in {SECONDS} s",
        quota * SECONDS
    );
    assert!(
        outcome.longest_wait <= MAX_WAIT.as_micros() as u64,
        "{what}: a call waited {} µs",
        outcome.longest_wait
    );
    eprintln!(
        "{what}: {within} of {} calls in {SECONDS} s, {} in all (the last at {:.2} s), longest wait {:.3} s, {} gave up, {} Redis round trips ({:.2} per call made)",
        quota * SECONDS,
        outcome.seen.len(),
        outcome.ended,
        outcome.longest_wait as f64 / 1e6,
        outcome.gave_up,
        outcome.round_trips,
        outcome.round_trips as f64 / outcome.seen.len() as f64
    );
    within
}

/// The fleet on the shared store alone, then on leases; their round trips.
async fn fleet(quota: u64) -> (u64, u64) {
    let (wire, url) = redis_fixture::shared_through_counter().await;
    let plain = run(&url, &wire, quota, false).await;
    check(&plain, quota, &format!("{quota}/s, shared store"));
    let leased = run(&url, &wire, quota, true).await;
    check(&leased, quota, &format!("{quota}/s, leases"));
    (plain.round_trips, leased.round_trips)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_stays_under_a_quota_of_10_a_second_and_gets_nearly_all_of_it() {
    let (plain, leased) = fleet(10).await;
    // Every instance must ask at least once a window whatever it holds, and
    // the rule's refusal cache already spares the waiters' retries: leases
    // save little at ten calls a second among four.
    assert!(
        leased <= plain,
        "leases cost more round trips than the shared store alone: {leased} against {plain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_stays_under_a_quota_of_100_a_second_with_far_fewer_round_trips_on_leases() {
    let (plain, leased) = fleet(100).await;
    assert!(
        leased * 4 <= plain,
        "leases should cut the round trips to a quarter at most: {leased} against {plain}"
    );
}
