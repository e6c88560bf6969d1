//! Redis-specific behaviour the conformance suite cannot see: one round trip
//! per decision, what a refusal writes, TTLs, the server-clock mode, and
//! failures (a paused, stopped, silent or misbehaving server).
//!
//! About 800 lines: one test per Redis behaviour; most share one container,
//! the failure tests start their own.

use ratewarden_conformance::call;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ratewarden_conformance::model::{algorithm_differential, refund_differential};
use ratewarden_core::{Algorithm, ErrorKind, ManualClock, Policy, Store, StoreError, Timestamp};
use ratewarden_redis::{DEFAULT_EXPIRY_MARGIN, RedisStore, RedisStoreBuilder};
use ratewarden_test_support::policy;
use ratewarden_test_support::redis as fixture;
use ratewarden_test_support::stores::{first_admission, refund_all_and_ghosts};
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const S: u64 = 1_000_000;
const T0: u64 = ManualClock::DEFAULT_START.as_micros();
/// Hangs are caught by this, far above any timeout under test; it is a
/// guard, not a measurement.
const HANG_GUARD: Duration = Duration::from_secs(20);
/// The timeout of stores whose tests are about semantics, not failures: a
/// loaded machine must not turn a slow answer into a failed test.
const GENEROUS: Duration = Duration::from_secs(10);

/// A store on `url` with a prefix of its own and the [`GENEROUS`] timeout.
fn builder(url: &str, what: &str) -> RedisStoreBuilder {
    RedisStore::builder(url)
        .key_prefix(fixture::unique_prefix(what))
        // MONITOR would see its notice subscription's heartbeats: these
        // tests watch the store's own commands (`tests/notices.rs` has the
        // notices).
        .notices(false)
        .timeout(GENEROUS)
}

/// A [`builder`] store on the shared server, and a connection for the
/// test's own commands there.
async fn on_shared_server(what: &str) -> (RedisStore, MultiplexedConnection) {
    let url = fixture::shared_url();
    let store = builder(url, what).build().unwrap();
    (store, fixture::admin(url).await)
}

fn policies() -> Vec<Policy> {
    policy::of_every_algorithm(5, Duration::from_secs(60))
}

async fn decide_guarded(
    store: &RedisStore,
    key: &[u8],
    policy: &Policy,
    now: u64,
) -> Result<ratewarden_core::Decision, StoreError> {
    tokio::time::timeout(
        HANG_GUARD,
        call::decide(store, key, policy, 1, Timestamp::from_micros(now)),
    )
    .await
    .expect("a decision hung instead of failing within its timeout")
}

async fn reset_stats(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

async fn key_ttl(conn: &mut MultiplexedConnection, key: &[u8]) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn key_exists(conn: &mut MultiplexedConnection, key: &[u8]) -> i64 {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// What `key` holds, serialized (`DUMP`), and its TTL in milliseconds.
async fn key_state(conn: &mut MultiplexedConnection, key: &[u8]) -> (Vec<u8>, i64) {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    (dump, key_ttl(conn, key).await)
}

/// What MONITOR saw between [`Monitor::start`] and [`Monitor::finish`]:
/// every command with its origin, `[db host:port]` for a client's, `[db
/// lua]` for those a script runs inside the server.
struct Monitor {
    lines: std::pin::Pin<Box<dyn futures::Stream<Item = String> + Send>>,
    /// The test's own commands come from this address; they are not counted.
    admin_addr: String,
}

impl Monitor {
    async fn start(url: &str, conn: &mut MultiplexedConnection) -> Monitor {
        let monitor = redis::Client::open(url)
            .unwrap()
            .get_async_monitor()
            .await
            .unwrap();
        let lines = Box::pin(monitor.into_on_message::<String>());
        let me: String = redis::cmd("CLIENT")
            .arg("INFO")
            .query_async(conn)
            .await
            .unwrap();
        let admin_addr = me
            .split_whitespace()
            .find_map(|f| f.strip_prefix("addr="))
            .map(|a| format!(" {a}"))
            .expect("CLIENT INFO has addr=");
        Monitor { lines, admin_addr }
    }

    /// (commands sent by clients other than the test's own connection, by
    /// name; commands run by scripts).
    async fn finish(mut self, conn: &mut MultiplexedConnection) -> (BTreeMap<String, u64>, u64) {
        let _: String = redis::cmd("ECHO")
            .arg("ratewarden-monitor-done")
            .query_async(conn)
            .await
            .unwrap();
        let mut from_clients: BTreeMap<String, u64> = BTreeMap::new();
        let mut from_scripts = 0u64;
        loop {
            let line = tokio::time::timeout(HANG_GUARD, self.lines.next())
                .await
                .expect("MONITOR went silent")
                .expect("MONITOR stream ended");
            if line.contains("ratewarden-monitor-done") {
                break;
            }
            let origin = line
                .split('[')
                .nth(1)
                .and_then(|r| r.split(']').next())
                .unwrap_or("");
            let command = line
                .split('"')
                .nth(1)
                .unwrap_or_default()
                .to_ascii_uppercase();
            if origin.ends_with(" lua") {
                from_scripts += 1;
            } else if !origin.ends_with(&self.admin_addr) {
                *from_clients.entry(command).or_default() += 1;
            }
        }
        (from_clients, from_scripts)
    }
}

/// Checks that since `monitor` started (and the statistics were reset) the
/// store sent exactly `n` EVALSHA and nothing else, and that the server's
/// count agrees: `n` script calls, none failed, no load. Returns how many
/// commands the scripts ran inside the server.
async fn assert_only_evalsha(monitor: Monitor, conn: &mut MultiplexedConnection, n: u64) -> u64 {
    let calls = fixture::command_calls(conn).await;
    let (from_clients, from_scripts) = monitor.finish(conn).await;
    let expected = BTreeMap::from([("EVALSHA".to_string(), n)]);
    assert_eq!(
        from_clients, expected,
        "the store sent exactly {n} EVALSHA and nothing else"
    );
    assert_eq!(calls.get("evalsha"), Some(&n), "{calls:?}");
    assert_eq!(calls.get("script|load"), None, "{calls:?}");
    assert_eq!(calls.get("eval"), None, "{calls:?}");
    from_scripts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evalsha_per_decision_and_nothing_else() {
    // A server of its own: nothing else may run commands on it.
    let (_container, url) = fixture::start_redis().await;
    let mut conn = fixture::admin(&url).await;
    let store = builder(&url, "round-trips").build().unwrap();
    store.connect().await.unwrap();

    // First use of each script: EVALSHA answers NOSCRIPT, the store loads
    // the script and calls EVALSHA again. That happens once per server.
    reset_stats(&mut conn).await;
    for p in policies() {
        decide_guarded(&store, b"warm-up", &p, T0).await.unwrap();
    }
    let first_use = fixture::command_calls(&mut conn).await;
    let loads = first_use.get("script|load").copied().unwrap_or(0);
    assert_eq!(loads, 4, "one SCRIPT LOAD per algorithm: {first_use:?}");
    assert_eq!(first_use.get("evalsha"), Some(&8), "{first_use:?}");

    let monitor = Monitor::start(&url, &mut conn).await;
    reset_stats(&mut conn).await;
    let mut n = 0u64;
    let mut refused = 0;
    for p in policies() {
        for i in 0..50u64 {
            let key = format!("client-{}", i % 3);
            let d = decide_guarded(&store, key.as_bytes(), &p, T0 + i * 1000)
                .await
                .unwrap();
            refused += u32::from(!d.allowed);
            n += 1;
        }
    }
    assert!(refused > 0, "the run should include refusals");
    let from_scripts = assert_only_evalsha(monitor, &mut conn, n).await;
    assert!(
        from_scripts > 0,
        "the scripts' own commands run inside the server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evalsha_per_refund_and_nothing_else() {
    // A server of its own: nothing else may run commands on it.
    let (_container, url) = fixture::start_redis().await;
    let mut conn = fixture::admin(&url).await;
    let store = builder(&url, "refund-round-trips").build().unwrap();
    // Loads the decision and refund scripts: a refund of another key's
    // admission finds nothing, but its script runs.
    reset_stats(&mut conn).await;
    for p in policies() {
        let d = decide_guarded(&store, b"warm-up", &p, T0).await.unwrap();
        call::refund(
            &store,
            b"warm-up-ghost",
            &p,
            1,
            Timestamp::from_micros(T0),
            &d,
        )
        .await
        .unwrap();
    }
    let first_use = fixture::command_calls(&mut conn).await;
    assert_eq!(
        first_use.get("script|load"),
        Some(&8),
        "one SCRIPT LOAD per algorithm and operation: {first_use:?}"
    );

    // Admissions to refund, made before counting.
    let mut admitted = Vec::new();
    for p in policies() {
        for i in 0..3u64 {
            let now = T0 + i * 1000;
            let key = format!("client-{i}");
            let d = decide_guarded(&store, key.as_bytes(), &p, now)
                .await
                .unwrap();
            assert!(d.allowed);
            admitted.push((p, key, now, d));
        }
    }
    let monitor = Monitor::start(&url, &mut conn).await;
    reset_stats(&mut conn).await;
    // A refund on a key that holds nothing is a round trip too, and no more.
    let n = refund_all_and_ghosts(&store, &admitted, &policies()).await;
    let from_scripts = assert_only_evalsha(monitor, &mut conn, n).await;
    assert!(from_scripts > 0, "the refunds ran their scripts");
    // Each refund gave its unit back: the keys are as they were.
    for (p, key, now, d) in &admitted {
        let again = decide_guarded(&store, key.as_bytes(), p, *now)
            .await
            .unwrap();
        assert_eq!(again, *d, "{p}: {key} after its refund");
    }
}

/// Seen from outside: a penalty is one `EVALSHA`, on a held key or a new
/// one, and inside an open fixed window it counts the units without moving
/// the expiry the window's opening set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_is_one_evalsha_and_keeps_a_windows_expiry() {
    // A server of its own: nothing else may run commands on it.
    let (_container, url) = fixture::start_redis().await;
    let mut conn = fixture::admin(&url).await;
    let store = builder(&url, "penalties").build().unwrap();
    for p in policies() {
        // Loads the script, and holds a key to penalize.
        decide_guarded(&store, b"held", &p, T0).await.unwrap();
    }
    let fixed = policies()
        .into_iter()
        .find(|p| p.algorithm() == Algorithm::FixedWindow)
        .unwrap();
    let fixed_key = store.redis_key(b"held", Algorithm::FixedWindow);
    let (_, ttl) = key_state(&mut conn, &fixed_key).await;
    let monitor = Monitor::start(&url, &mut conn).await;
    reset_stats(&mut conn).await;
    let mut n = 0;
    for p in policies() {
        for key in [&b"held"[..], b"fresh"] {
            let now = Timestamp::from_micros(T0 + 10_000);
            call::penalize(&store, key, &p, 2, now).await.unwrap();
            n += 1;
        }
    }
    assert_only_evalsha(monitor, &mut conn, n).await;
    let (_, after) = key_state(&mut conn, &fixed_key).await;
    assert!(
        after <= ttl,
        "a penalty moved the window's expiry: {ttl} -> {after}"
    );
    let count: i64 = redis::cmd("HGET")
        .arg(&fixed_key)
        .arg("n")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 3, "one admitted, two charged");
    let left = call::peek(
        &store,
        b"held",
        &fixed,
        1,
        Timestamp::from_micros(T0 + 20_000),
    )
    .await
    .unwrap();
    assert_eq!(left.remaining, 1);
}

/// Seen from outside, as `redis-cli` would: a peek is one `EVALSHA` whose
/// script runs read commands only (no write appears in the server's
/// command statistics), it leaves a held key's value and expiry as they
/// were and creates no key; a reset is one `DEL`, announced with one
/// `PUBLISH` in the same round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_is_one_evalsha_that_writes_nothing_and_a_reset_is_one_del() {
    // A server of its own: nothing else may run commands on it.
    let (_container, url) = fixture::start_redis().await;
    let mut conn = fixture::admin(&url).await;
    let store = builder(&url, "peeks").build().unwrap();
    for p in policies() {
        // Loads the script, and holds a key with some state to peek at.
        for i in 0..3 {
            decide_guarded(&store, b"held", &p, T0 + i * 1000)
                .await
                .unwrap();
        }
    }
    let held: Vec<_> = policies()
        .iter()
        .map(|p| store.redis_key(b"held", p.algorithm()))
        .collect();
    let mut before = Vec::new();
    for key in &held {
        before.push(key_state(&mut conn, key).await);
    }
    let monitor = Monitor::start(&url, &mut conn).await;
    reset_stats(&mut conn).await;
    let mut n = 0;
    for p in policies() {
        for (key, cost) in [
            (&b"held"[..], 1),
            (b"held", 5),
            (b"fresh", 1),
            (b"fresh", 5),
        ] {
            let now = Timestamp::from_micros(T0 + 10_000);
            call::peek(&store, key, &p, cost, now).await.unwrap();
            n += 1;
        }
    }
    let calls = fixture::command_calls(&mut conn).await;
    assert_only_evalsha(monitor, &mut conn, n).await;
    let writes = ["hset", "hincrby", "pexpire", "rpush", "ltrim", "set", "del"];
    for w in writes {
        assert_eq!(calls.get(w), None, "a peek's script ran {w}: {calls:?}");
    }
    for (key, (dump, ttl)) in held.iter().zip(before) {
        let (now_dump, now_ttl) = key_state(&mut conn, key).await;
        assert_eq!(now_dump, dump, "a peek changed the value");
        assert!(
            now_ttl <= ttl,
            "a peek moved the expiry: {ttl} -> {now_ttl}"
        );
    }
    for p in policies() {
        let key = store.redis_key(b"fresh", p.algorithm());
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "{p}: a peek created the key");
    }

    let monitor = Monitor::start(&url, &mut conn).await;
    for p in policies() {
        call::reset(&store, b"held", &p).await.unwrap();
    }
    let (from_clients, _) = monitor.finish(&mut conn).await;
    assert_eq!(
        from_clients,
        BTreeMap::from([("DEL".to_string(), 4), ("PUBLISH".to_string(), 4)])
    );
    for key in &held {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "a reset left the key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_write_nothing_and_ttls_are_bounded() {
    let (store, mut conn) = on_shared_server("writes").await;
    let margin_ms = DEFAULT_EXPIRY_MARGIN.as_millis() as i64;
    for p in policies() {
        let key = store.redis_key(b"k", p.algorithm());
        let window_ms = (p.window_micros() / 1000) as i64;
        let bound = match p.algorithm() {
            Algorithm::SlidingWindow => 2 * window_ms + margin_ms,
            _ => window_ms + margin_ms,
        };
        // Five admissions a millisecond apart, then the first refusal: a
        // sixth admission is a failure, not the end of the loop.
        let mut t = T0;
        for i in 0..5 {
            let d = decide_guarded(&store, b"k", &p, t).await.unwrap();
            assert!(d.allowed, "{p}: admission {} of 5 refused: {d:?}", i + 1);
            t += 1000;
        }
        let sixth = decide_guarded(&store, b"k", &p, t).await.unwrap();
        assert!(!sixth.allowed, "{p}: a sixth admission: {sixth:?}");
        let (dump, ttl) = key_state(&mut conn, &key).await;
        assert!(
            ttl > 0 && ttl <= bound,
            "{p}: PTTL {ttl} not in (0, {bound}]"
        );
        for i in 0..20 {
            let d = decide_guarded(&store, b"k", &p, t + i * 1000)
                .await
                .unwrap();
            assert!(!d.allowed, "{p}");
            assert!(
                d.reset_after > Duration::ZERO,
                "{p}: a refusal still answers its reset"
            );
        }
        let (after, ttl_after) = key_state(&mut conn, &key).await;
        assert_eq!(dump, after, "{p}: a refusal changed the stored state");
        assert!(
            ttl_after > 0 && ttl_after <= ttl,
            "{p}: over the refusals, PTTL {ttl} -> {ttl_after}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_expiry_is_set_when_the_window_opens() {
    let (store, mut conn) = on_shared_server("expiry").await;
    let p = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
    let key = store.redis_key(b"k", Algorithm::FixedWindow);
    decide_guarded(&store, b"k", &p, T0).await.unwrap();
    let mut last = key_ttl(&mut conn, &key).await;
    for i in 1..30u64 {
        // Hits later in the window (caller's time) must not move the expiry.
        assert!(
            decide_guarded(&store, b"k", &p, T0 + i * S)
                .await
                .unwrap()
                .allowed
        );
        let ttl = key_ttl(&mut conn, &key).await;
        assert!(ttl > 0, "hit {i} left PTTL {ttl}");
        assert!(ttl <= last, "hit {i} renewed the expiry: {last} -> {ttl}");
        last = ttl;
    }
    // A new window (caller's time) sets a fresh expiry.
    decide_guarded(&store, b"k", &p, T0 + 61 * S).await.unwrap();
    let ttl = key_ttl(&mut conn, &key).await;
    assert!(
        ttl > last,
        "a new window must set its own expiry: {last} -> {ttl}"
    );
}

/// What the sliding-window script sets when a window opens: the state is
/// dead two windows after the window's start, as a TTL of
/// `ceil((start + 2w - now) / 1 ms) + margin` milliseconds.
fn sliding_window_ttl_ms(start: u64, w: u64, now: u64) -> i64 {
    let margin_ms = DEFAULT_EXPIRY_MARGIN.as_millis() as i64;
    (start + 2 * w - now).div_ceil(1000) as i64 + margin_ms
}

/// Reads the PTTL of `key` and checks it is `expected` less the real time
/// since `since` (the moment before the PEXPIRE that set it could run): the
/// expiry is where `expected` puts it, and nowhere later or earlier.
async fn assert_expires_as_set(
    conn: &mut MultiplexedConnection,
    key: &[u8],
    expected: i64,
    since: Instant,
    what: &str,
) -> i64 {
    let ttl = key_ttl(conn, key).await;
    // +1: PTTL counts whole milliseconds of the server's clock.
    let passed = since.elapsed().as_millis() as i64 + 1;
    assert!(
        ttl <= expected && ttl >= expected - passed,
        "{what}: PTTL {ttl}, set to {expected} at most {passed} ms ago"
    );
    ttl
}

/// The sliding window's expiry is fixed when its window opens: admissions
/// later in that window (in the caller's time) leave the PTTL falling with
/// real time only, and the next window sets its own, each exactly as the
/// script's formula says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_expiry_is_set_when_the_window_opens() {
    let (store, mut conn) = on_shared_server("sw-expiry").await;
    let w = 60 * S;
    let p = Policy::sliding_window(100, Duration::from_micros(w)).unwrap();
    let key = store.redis_key(b"k", Algorithm::SlidingWindow);
    let start = T0 - T0 % w;
    // Half a millisecond past a whole one, so that the rounding up shows.
    let open = start + 10 * S + 500;
    let set_at = Instant::now();
    assert!(
        decide_guarded(&store, b"k", &p, open)
            .await
            .unwrap()
            .allowed
    );
    let expected = sliding_window_ttl_ms(start, w, open);
    assert_eq!(expected, 111_000, "120 s - 10.0005 s, rounded up, plus 1 s");
    let mut last = assert_expires_as_set(&mut conn, &key, expected, set_at, "opened").await;
    // Forty admissions a second apart in the caller's time, all in the
    // window: a script that set the expiry again would lose a second of
    // PTTL at each.
    for i in 1..=40u64 {
        assert!(
            decide_guarded(&store, b"k", &p, open + i * S)
                .await
                .unwrap()
                .allowed
        );
        let what = format!("admission {i} in the window");
        let ttl = assert_expires_as_set(&mut conn, &key, expected, set_at, &what).await;
        assert!(ttl <= last, "{what} pushed the expiry: {last} -> {ttl}");
        last = ttl;
    }
    // The next window opens and sets its own expiry, which its admissions
    // leave alone in turn.
    let next = start + w;
    let opened = next + 5 * S + 250;
    let set_at = Instant::now();
    assert!(
        decide_guarded(&store, b"k", &p, opened)
            .await
            .unwrap()
            .allowed
    );
    let expected = sliding_window_ttl_ms(next, w, opened);
    assert_eq!(expected, 116_000, "120 s - 5.00025 s, rounded up, plus 1 s");
    assert_expires_as_set(&mut conn, &key, expected, set_at, "the next window").await;
    for i in 1..=10u64 {
        assert!(
            decide_guarded(&store, b"k", &p, opened + i * S)
                .await
                .unwrap()
                .allowed
        );
        let what = format!("admission {i} in the next window");
        assert_expires_as_set(&mut conn, &key, expected, set_at, &what).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_an_error_not_a_panic() {
    let (store, mut conn) = on_shared_server("wrongtype").await;
    for p in policies() {
        let key = store.redis_key(b"k", p.algorithm());
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // A stream is a type none of the scripts reads or writes.
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("f")
            .arg("v")
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = decide_guarded(&store, b"k", &p, T0).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol, "{p}: {err}");
        assert!(!err.is_transient());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_mode_decides_with_real_time() {
    // The only test that lets real time pass: the server's clock cannot be
    // driven. Counts are asserted only in windows far longer than the
    // calls; the short window is only waited for, by polling.
    let store = builder(fixture::shared_url(), "server-clock")
        .server_clock(true)
        .build()
        .unwrap();
    assert!(store.capabilities().server_clock);
    let hour = Duration::from_secs(3600);
    for algorithm in Algorithm::ALL {
        // The caller's clock jumps two hours at each call: in the caller's
        // time every call would be in a window of its own.
        let p = Policy::new(algorithm, 2, hour).unwrap();
        let mut allowed = Vec::new();
        for i in 0..3u64 {
            let d = decide_guarded(&store, b"hour", &p, i * 7200 * S).await;
            allowed.push(d.unwrap().allowed);
        }
        assert_eq!(allowed, [true, true, false], "{algorithm}: server time");

        // Real time reopens a short window: refused once the limit is
        // reached, admitted again once the server's clock has moved on.
        let window = Duration::from_millis(500);
        let p = Policy::new(algorithm, 2, window).unwrap();
        let mut refused = None;
        for _ in 0..1_000 {
            let d = decide_guarded(&store, b"short", &p, 0).await.unwrap();
            if !d.allowed {
                refused = Some(d);
                break;
            }
        }
        let refused = refused.expect("the limit is reached in real time");
        // A sliding window's wait may reach into the next window.
        assert!(
            refused.retry_after <= 2 * window,
            "{algorithm}: {refused:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if decide_guarded(&store, b"short", &p, 0)
                .await
                .unwrap()
                .allowed
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{algorithm}: never admitted again as the server's time passed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_mode_refuses_refunds_without_a_round_trip() {
    // Nothing listens here: an answer other than Unsupported would mean the
    // store tried to reach a server.
    let port = fixture::free_port(false);
    let store = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .server_clock(true)
        .build()
        .unwrap();
    for p in policies() {
        let admitted = first_admission(&p, "redis");
        let err = tokio::time::timeout(
            HANG_GUARD,
            call::refund(&store, b"k", &p, 1, Timestamp::from_micros(T0), &admitted),
        )
        .await
        .expect("a refusal needs no server")
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{p}: {err}");
        assert!(!err.is_transient(), "{p}: {err}");
        assert!(err.to_string().contains("clock"), "{p}: {err}");
    }

    // The same against a live server, on a real admission.
    let store = builder(fixture::shared_url(), "server-clock-refund")
        .server_clock(true)
        .build()
        .unwrap();
    let p = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    let d = call::decide(&store, b"k", &p, 1, now).await.unwrap();
    assert!(d.allowed);
    let err = call::refund(&store, b"k", &p, 1, now, &d)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let after = call::decide(&store, b"k", &p, 1, now).await.unwrap();
    assert_eq!(after.remaining, 1, "the admission was kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_create_nothing_and_never_extend_a_ttl() {
    let (store, mut conn) = on_shared_server("refund-ttl").await;
    for p in policies() {
        let now = Timestamp::from_micros(T0);
        let first = decide_guarded(&store, b"k", &p, T0).await.unwrap();
        let second = decide_guarded(&store, b"k", &p, T0 + S).await.unwrap();
        let key = store.redis_key(b"k", p.algorithm());
        // Real time has visibly passed since the admission set the TTL, so
        // that a TTL set again would show.
        let set = key_ttl(&mut conn, &key).await;
        assert!(set > 0, "{p}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let before = loop {
            let ttl = key_ttl(&mut conn, &key).await;
            if ttl < set {
                break ttl;
            }
            assert!(Instant::now() < deadline, "{p}: PTTL stuck at {ttl}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        assert!(before > 0, "{p}");
        call::refund(&store, b"k", &p, 1, Timestamp::from_micros(T0 + S), &second)
            .await
            .unwrap();
        // Not `<`: within one millisecond PTTL reads the same. A refund
        // that set the expiry again would read at least `set`, above
        // `before`.
        let after = key_ttl(&mut conn, &key).await;
        assert!(
            after > 0 && after <= before,
            "{p}: PTTL {before} -> {after} over a refund"
        );
        // With the first admission refunded too, a log or a fixed window
        // holds nothing and is deleted; the counters and the arrival time
        // stay, under the expiry they had.
        call::refund(&store, b"k", &p, 1, now, &first)
            .await
            .unwrap();
        let exists = key_exists(&mut conn, &key).await;
        match p.algorithm() {
            Algorithm::SlidingLog | Algorithm::FixedWindow => {
                assert_eq!(exists, 0, "{p}: an emptied state is deleted");
            }
            Algorithm::SlidingWindow | Algorithm::Gcra => {
                let last = key_ttl(&mut conn, &key).await;
                assert!(
                    last > 0 && last <= after,
                    "{p}: PTTL {after} -> {last} over the last refund"
                );
            }
        }
        // A key that holds nothing stays absent.
        let ghost = store.redis_key(b"ghost", p.algorithm());
        call::refund(&store, b"ghost", &p, 1, now, &first)
            .await
            .unwrap();
        let exists = key_exists(&mut conn, &ghost).await;
        assert_eq!(exists, 0, "{p}: a refund created {ghost:?}");
    }
}

/// The timeout of the failure tests' stores: long enough that an answer
/// from a healthy server on a loaded machine is never taken for a failure,
/// and below [`HANG_GUARD`], which only a decision ignoring it reaches.
const FAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A store on `url` with the [`FAULT_TIMEOUT`], the failure tests' policy,
/// and a first decision made while the server is up.
async fn answering(url: &str, what: &str) -> (RedisStore, Policy) {
    let store = RedisStore::builder(url)
        .key_prefix(fixture::unique_prefix(what))
        .timeout(FAULT_TIMEOUT)
        .build()
        .unwrap();
    let p = Policy::gcra(1_000, Duration::from_secs(1)).unwrap();
    decide_guarded(&store, b"k", &p, T0).await.unwrap();
    (store, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_times_out_then_recovers() {
    let (container, url) = fixture::start_redis().await;
    let (store, p) = answering(&url, "pause").await;

    container.pause().await.expect("docker pause");
    let calls = (0..8).map(|i| {
        let store = store.clone();
        async move { decide_guarded(&store, b"k", &p, T0 + i).await }
    });
    for result in futures_join(calls).await {
        let err = result.expect_err("a paused server cannot answer");
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(err.is_transient());
    }

    container.unpause().await.expect("docker unpause");
    assert_recovers(&store, &p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_server_fails_then_recovers_after_restart() {
    let (container, url) = fixture::start_redis_on_fixed_port().await;
    let (store, p) = answering(&url, "stop").await;

    container.stop().await.expect("docker stop");
    for i in 0..3 {
        let err = decide_guarded(&store, b"k", &p, T0 + i)
            .await
            .expect_err("a stopped server cannot answer");
        assert!(
            matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "{err}"
        );
        assert!(err.is_transient(), "{err}");
    }

    container.start().await.expect("docker start");
    assert_recovers(&store, &p).await;
}

/// Polls until a decision succeeds; the server needs a moment to come back.
async fn assert_recovers(store: &RedisStore, p: &Policy) {
    for i in 0..100 {
        if decide_guarded(store, b"k", p, T0 + S + i).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store must answer again once the server is back");
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}

/// A TCP server that answers every RESP command with `reply`, or never
/// answers when `reply` is `None`.
async fn fake_server(reply: Option<&'static [u8]>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(len) = resp_command_len(&buf) {
                        buf.drain(..len);
                        if let Some(reply) = reply
                            && socket.write_all(reply).await.is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    format!("redis://127.0.0.1:{port}")
}

/// The length of the first complete RESP array of bulk strings in `buf`.
fn resp_command_len(buf: &[u8]) -> Option<usize> {
    fn line(buf: &[u8], from: usize) -> Option<(i64, usize)> {
        let end = buf[from..].windows(2).position(|w| w == b"\r\n")? + from;
        let n = std::str::from_utf8(&buf[from + 1..end])
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    }
    let (items, mut at) = line(buf, 0)?;
    for _ in 0..items {
        let (len, next) = line(buf, at)?;
        at = next + usize::try_from(len).ok()? + 2;
        if at > buf.len() {
            return None;
        }
    }
    Some(at)
}

/// What a store with `timeout` answers, under each of [`policies`], from a
/// [`fake_server`] answering `reply`: an error every time.
async fn fake_server_errors(reply: Option<&'static [u8]>, timeout: Duration) -> Vec<StoreError> {
    let url = fake_server(reply).await;
    let store = RedisStore::builder(&url).timeout(timeout).build().unwrap();
    let mut errors = Vec::new();
    for p in policies() {
        errors.push(decide_guarded(&store, b"k", &p, T0).await.unwrap_err());
    }
    errors
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_times_out() {
    for err in fake_server_errors(None, Duration::from_millis(200)).await {
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_of_the_wrong_type_are_protocol_errors() {
    for reply in [
        &b":1\r\n"[..],
        b"+OK\r\n",
        b"*2\r\n:1\r\n:0\r\n",
        b"$-1\r\n",
    ] {
        for err in fake_server_errors(Some(reply), GENEROUS).await {
            assert_eq!(
                err.kind(),
                ErrorKind::Protocol,
                "{:?}: {err}",
                String::from_utf8_lossy(reply)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_an_error_not_a_panic_or_a_hang() {
    let garbage = Some(&b"this is not RESP\r\n"[..]);
    for err in fake_server_errors(garbage, Duration::from_millis(500)).await {
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Protocol | ErrorKind::Unavailable | ErrorKind::Timeout
            ),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_unavailable() {
    let port = fixture::free_port(false);
    let store = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let p = Policy::gcra(1, Duration::from_secs(1)).unwrap();
    let err = decide_guarded(&store, b"k", &p, T0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_match_the_reference_algorithm_decision_for_decision() {
    let store = builder(fixture::shared_url(), "differential")
        .build()
        .unwrap();
    let checked = algorithm_differential(&store, 300)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(checked, 4 * 5 * 300);
}

/// Decisions interleaved with refunds of earlier admissions (each at most
/// once, in any order, some long after the fact): the scripts and
/// `algorithm::refund` leave every key in the same state, as the decisions
/// that follow show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_match_the_reference_algorithm_decision_for_decision() {
    let store = builder(fixture::shared_url(), "refund-differential")
        // Keys expire in real time; the caller's time here runs faster, but
        // a loaded machine must not lose state the reference still holds.
        .expiry_margin(Duration::from_secs(3600))
        .build()
        .unwrap();
    let counts = refund_differential(&store, 200)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert!(counts.refunds > 500, "{counts:?}");
    assert!(counts.decisions > 1_000, "{counts:?}");
}
