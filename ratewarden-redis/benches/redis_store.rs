//! Decisions per second and latency of the Redis store at 1, 16 and 64
//! concurrent tasks on loopback, for the store on its two multiplexed
//! connections (the default) and on one, for the same script call on one
//! and two bare connections and through a deadpool-redis pool (built here:
//! the store offers no pool, since this comparison is why), beside
//! `redis-benchmark` running the same script with the same arguments and
//! concurrency (the ceiling), in alternating rounds.
//!
//! Every client gets the same share of the machine: the server runs on CPU
//! 0, and this process and `redis-benchmark` (in a container of its own)
//! on CPU 1, each on one thread (a current-thread runtime here, since
//! `redis-benchmark` is one thread). Unpinned, where the scheduler puts
//! each client beside or away from the server moves a one-task round trip
//! by a fifth, more than any difference between the clients.
//!
//! Run: `cargo bench -p ratewarden-redis --bench redis_store`
//! (needs Docker, `taskset` and the `ratewarden-test-redis:7` image, or
//! `RATEWARDEN_REDIS_IMAGE`). `RATEWARDEN_BENCH_OPS` sets the decisions per
//! run (default 200000), `RATEWARDEN_BENCH_ROUNDS` the rounds (default 3),
//! `RATEWARDEN_BENCH_PIN=0` leaves placement to the scheduler and
//! `RATEWARDEN_BENCH_RUNTIME=multi` gives this process Tokio's
//! multi-thread runtime, and `RATEWARDEN_BENCH_ONLY=two connections` (or
//! `one connection`, `deadpool`: part of a row's name) runs the clients it
//! names
//! beside `redis-benchmark`, for a profiler or `strace -c`.

use std::future::Future;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden_core::{Algorithm, ManualClock, Policy, Request, Store, Timestamp};
use ratewarden_redis::{RedisStore, script_source};

const T0: u64 = ManualClock::DEFAULT_START.as_micros();

/// The task counts measured: `RATEWARDEN_BENCH_TASKS` (say `1,16`), or
/// 1, 16 and 64.
fn concurrency() -> Vec<usize> {
    std::env::var("RATEWARDEN_BENCH_TASKS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 16, 64])
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("docker CLI");
    assert!(out.status.success(), "docker {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The CPU the server runs on, and the one every client runs on.
const SERVER_CPU: &str = "0";
const CLIENT_CPU: &str = "1";

/// Set in the environment of the copy of this bench that `taskset` runs.
const PINNED: &str = "RATEWARDEN_BENCH_PINNED";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    who: String,
    tasks: usize,
    round: usize,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    /// CPU time of the client per call, in µs.
    cpu_us: f64,
}

/// CPU time this process's threads have used, in ns (every thread's
/// `schedstat`, so that a multi-thread runtime counts whole).
fn cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `run`'s figures and this process's CPU time per call, in µs.
async fn measured(
    run: impl Future<Output = (f64, f64, f64)>,
    calls: usize,
) -> (f64, f64, f64, f64) {
    let before = cpu_ns();
    let (rps, p50, p99) = run.await;
    let cpu = (cpu_ns() - before) as f64 / 1000.0 / calls as f64;
    (rps, p50, p99, cpu)
}

/// Runs `ops` calls of `decide` spread over `tasks` tasks; returns calls
/// per second and the p50 and p99 latency in µs.
async fn run<F, Fut>(decide: F, tasks: usize, ops: usize) -> (f64, f64, f64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = ops / tasks;
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let decide = decide.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let t = Instant::now();
                    decide().await;
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::with_capacity(ops);
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |q: f64| all[((all.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (all.len() as f64 / elapsed, pct(0.50), pct(0.99))
}

/// Runs this bench again under `taskset -c CLIENT_CPU`, unless it is that
/// copy or pinning is off; `Some(pinned)` means go on here.
fn pin() -> Option<bool> {
    if std::env::var("RATEWARDEN_BENCH_PIN").as_deref() == Ok("0") {
        return Some(false);
    }
    if std::env::var_os(PINNED).is_some() {
        return Some(true);
    }
    let me = std::env::current_exe().expect("the bench's own path");
    let status = Command::new("taskset")
        .args(["-c", CLIENT_CPU])
        .arg(me)
        .args(std::env::args_os().skip(1))
        .env(PINNED, "1")
        .status()
        .expect(
            "taskset (util-linux) pins the clients to one CPU; install it, \
             or set RATEWARDEN_BENCH_PIN=0 to leave placement to the scheduler",
        );
    std::process::exit(status.code().unwrap_or(1));
}

fn main() {
    let Some(pinned) = pin() else { return };
    let ops = env_usize("RATEWARDEN_BENCH_OPS", 200_000);
    let rounds = env_usize("RATEWARDEN_BENCH_ROUNDS", 3).max(1);
    let image = std::env::var("RATEWARDEN_REDIS_IMAGE")
        .unwrap_or_else(|_| "ratewarden-test-redis:7".into());
    let port = free_port();
    // Host networking: the store and redis-benchmark both reach the server
    // over the host's loopback, with no userland proxy in between.
    let mut run_args = vec!["run", "-d", "--rm", "--network", "host"];
    if pinned {
        run_args.extend(["--cpuset-cpus", SERVER_CPU]);
    }
    let port_arg = port.to_string();
    run_args.extend([image.as_str(), "--port", &port_arg]);
    let id = docker(&run_args);
    let url = format!("redis://127.0.0.1:{port}");
    // One thread, like redis-benchmark, unless asked otherwise.
    let rt = match std::env::var("RATEWARDEN_BENCH_RUNTIME").as_deref() {
        Ok("multi") => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
    .expect("runtime");
    let ceiling = Ceiling {
        image: &image,
        container: &id,
        port,
        pinned,
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(bench(&ceiling, &url, ops, rounds))
    }));
    docker(&["rm", "-f", &id]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// The store's call on the redis crate's own multiplexed connections,
/// taken in turn as the store takes its own, with nothing of the store
/// around it: what the store adds over its client.
#[derive(Clone)]
struct Bare {
    conns: Arc<Vec<redis::aio::MultiplexedConnection>>,
    next: Arc<std::sync::atomic::AtomicUsize>,
    script: Arc<redis::Script>,
    key: String,
    policy: Policy,
}

impl Bare {
    async fn open(client: &redis::Client, n: usize, key: String, policy: Policy) -> Bare {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("a connection"),
            );
        }
        Bare {
            conns: Arc::new(conns),
            next: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            script: Arc::new(redis::Script::new(script_source(Algorithm::FixedWindow))),
            key,
            policy,
        }
    }

    fn call(&self) -> impl Future<Output = ()> + Send + use<> {
        // As `RedisStore` takes its connections: no shared counter to bump
        // when there is one.
        let i = match self.conns.len() {
            1 => 0,
            n => self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n,
        };
        let (mut conn, script, key) =
            (self.conns[i].clone(), self.script.clone(), self.key.clone());
        let policy = self.policy;
        async move {
            invocation(&script, key, &policy)
                .invoke_async::<redis::Value>(&mut conn)
                .await
                .expect("decision");
        }
    }
}

/// The store's call, key and arguments (expiry margin: 1000 ms), for the
/// contenders that make it without the store.
fn invocation<'a>(
    script: &'a redis::Script,
    key: String,
    policy: &Policy,
) -> redis::ScriptInvocation<'a> {
    let mut call = script.key(key);
    call.arg(T0)
        .arg(policy.limit())
        .arg(policy.window_micros())
        .arg(1)
        .arg(1000);
    call
}

async fn bench(ceiling: &Ceiling<'_>, url: &str, ops: usize, rounds: usize) {
    // Wait for the server.
    let client = redis::Client::open(url).unwrap();
    let mut ready = false;
    for _ in 0..200 {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await
            && redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "redis did not start");

    let policy = Policy::fixed_window(1_000_000_000, Duration::from_secs(3600)).unwrap();
    let timeout = Duration::from_secs(5);
    let managed = Arc::new(
        RedisStore::builder(url)
            .key_prefix("bench:")
            .timeout(timeout)
            .build()
            .unwrap(),
    );
    let key = String::from_utf8(managed.redis_key(b"bench", Algorithm::FixedWindow)).unwrap();
    let decider = |managed: Arc<RedisStore>| {
        move || {
            let store = managed.clone();
            async move {
                store
                    .decide(
                        Request::new(&store, b"bench", &policy, 1, Timestamp::from_micros(T0))
                            .expect("a valid request"),
                    )
                    .await
                    .expect("decision");
            }
        }
    };
    let store = decider(managed);
    let store_one = decider(Arc::new(
        RedisStore::builder(url)
            .key_prefix("bench:")
            .timeout(timeout)
            .connections(1)
            .build()
            .unwrap(),
    ));
    let script = Arc::new(redis::Script::new(script_source(Algorithm::FixedWindow)));
    let sha = script.get_hash().to_string();
    // The store's call, key and arguments (expiry margin: 1000 ms), through
    // a pool of 64 connections.
    let mut config = deadpool_redis::Config::from_url(url);
    config.pool = Some(deadpool_redis::PoolConfig::new(64));
    let pool = config
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("a pool");
    let pooled = {
        let key = key.clone();
        move || {
            let (pool, script, key) = (pool.clone(), script.clone(), key.clone());
            async move {
                let call = async {
                    let mut conn = pool.get().await.expect("a pooled connection");
                    invocation(&script, key, &policy)
                        .invoke_async::<redis::Value>(&mut conn)
                        .await
                        .expect("decision");
                };
                tokio::time::timeout(timeout, call).await.expect("in time");
            }
        }
    };
    let bare = {
        let bare = Bare::open(&client, 1, key.clone(), policy).await;
        move || bare.call()
    };
    let bare_two = {
        let bare = Bare::open(&client, 2, key.clone(), policy).await;
        move || bare.call()
    };
    // Warm up each (connects, loads the script).
    let only = std::env::var("RATEWARDEN_BENCH_ONLY").ok();
    let runs = |who: &str| only.as_deref().is_none_or(|o| who.contains(o));
    if runs(STORE) {
        run(store.clone(), 16, 10_000).await;
    }
    if runs(STORE_ONE) {
        run(store_one.clone(), 16, 10_000).await;
    }
    if runs(BARE_TWO) {
        run(bare_two.clone(), 16, 10_000).await;
    }
    if runs(BARE) {
        run(bare.clone(), 16, 10_000).await;
    }
    if runs(POOLED) {
        run(pooled.clone(), 16, 10_000).await;
    }

    let args: Vec<String> = vec![
        "EVALSHA".into(),
        sha,
        "1".into(),
        key,
        T0.to_string(),
        policy.limit().to_string(),
        policy.window_micros().to_string(),
        "1".into(),
        "1000".into(),
    ];

    let mut rows = Vec::new();
    for tasks in concurrency() {
        let n = if tasks == 1 { ops / 4 } else { ops };
        // Rounds alternate the contenders, so that a slow spell of the
        // machine falls on all of them.
        for round in 0..rounds {
            let mut row = |who: &str, (rps, p50_us, p99_us, cpu_us): (f64, f64, f64, f64)| {
                rows.push(Row {
                    who: who.into(),
                    tasks,
                    round,
                    rps,
                    p50_us,
                    p99_us,
                    cpu_us,
                })
            };
            if runs(STORE) {
                row(STORE, measured(run(store.clone(), tasks, n), n).await);
            }
            if runs(STORE_ONE) {
                row(
                    STORE_ONE,
                    measured(run(store_one.clone(), tasks, n), n).await,
                );
            }
            if runs(BARE_TWO) {
                row(BARE_TWO, measured(run(bare_two.clone(), tasks, n), n).await);
            }
            if runs(BARE) {
                row(BARE, measured(run(bare.clone(), tasks, n), n).await);
            }
            if runs(POOLED) {
                row(POOLED, measured(run(pooled.clone(), tasks, n), n).await);
            }

            row(CEILING, ceiling.run(tasks, n, 1, &args));
            // For 16 tasks and more, the pipelined ceiling (`-P 16`): the
            // shape a multiplexed connection has.
            if tasks >= 16 && round == 0 {
                row(PIPELINED, ceiling.run(tasks, n, 16, &args));
            }
        }
    }
    report(&rows);
}

const STORE: &str = "RedisStore, two connections (the default)";
const STORE_ONE: &str = "RedisStore, one connection";
const BARE_TWO: &str = "the same script call, two bare redis MultiplexedConnections in turn";
const BARE: &str = "the same script call, one bare redis MultiplexedConnection";
const POOLED: &str = "the same script call, deadpool (64 connections)";
const CEILING: &str = "redis-benchmark (ceiling)";
const PIPELINED: &str = "redis-benchmark -P 16 (pipelined ceiling)";

/// Where and how `redis-benchmark` runs.
struct Ceiling<'a> {
    image: &'a str,
    container: &'a str,
    port: u16,
    pinned: bool,
}

impl Ceiling<'_> {
    /// `n` calls of `args` at `tasks` connections, `pipeline` deep:
    /// calls per second, p50 and p99 in µs.
    fn run(
        &self,
        tasks: usize,
        n: usize,
        pipeline: usize,
        args: &[String],
    ) -> (f64, f64, f64, f64) {
        let mut cmd: Vec<String> = if self.pinned {
            // A container of its own, so that it can have the clients' CPU
            // (an `exec` would share the server's).
            [
                "run",
                "--rm",
                "--network",
                "host",
                "--cpuset-cpus",
                CLIENT_CPU,
                "--entrypoint",
                "sh",
                self.image,
                "-c",
                // Its container's CPU time in ns, read after it ends
                // (cgroup v2, else v1).
                r#"redis-benchmark "$@" && { sed -n 's/^usage_usec \([0-9]*\)$/\1000/p' /sys/fs/cgroup/cpu.stat 2>/dev/null || cat /sys/fs/cgroup/cpuacct/cpuacct.usage; }"#,
                "redis-benchmark",
            ]
            .map(String::from)
            .to_vec()
        } else {
            ["exec", self.container, "redis-benchmark"]
                .map(String::from)
                .to_vec()
        };
        for arg in [
            "-h".to_string(),
            "127.0.0.1".into(),
            "-p".into(),
            self.port.to_string(),
            "-c".into(),
            tasks.to_string(),
            "-n".into(),
            n.to_string(),
            "-P".into(),
            pipeline.to_string(),
            "--csv".into(),
        ] {
            cmd.push(arg);
        }
        cmd.extend(args.iter().cloned());
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        eprintln!("redis-benchmark command: docker {}", refs.join(" "));
        let csv = docker(&refs);
        // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        let line = csv
            .lines()
            .rfind(|l| l.starts_with('"'))
            .unwrap_or_default()
            .replace('"', "");
        let cpu_us = csv
            .lines()
            .last()
            .and_then(|l| l.trim().parse::<f64>().ok())
            .map_or(f64::NAN, |ns| ns / 1000.0 / n as f64);
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| {
            f.get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        (num(1), num(4) * 1000.0, num(6) * 1000.0, cpu_us)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.2}–{hi:.2}")
}

/// Medians over the rounds, and each contender's ratios to the ceiling of
/// the same round (lowest–highest).
fn report(rows: &[Row]) {
    println!(
        "| client | tasks | decisions/s | p50 µs | p99 µs | client CPU µs/call | ÷ ceiling, throughput | ÷ ceiling, p99 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for tasks in concurrency() {
        for who in [STORE, STORE_ONE, BARE_TWO, BARE, POOLED, CEILING, PIPELINED] {
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| r.tasks == tasks && r.who == who)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let ceiling_of = |round: usize| {
                rows.iter()
                    .find(|r| r.tasks == tasks && r.round == round && r.who == CEILING)
                    .expect("a ceiling every round")
            };
            let rps: Vec<f64> = mine
                .iter()
                .map(|r| r.rps / ceiling_of(r.round).rps)
                .collect();
            let p99: Vec<f64> = mine
                .iter()
                .map(|r| r.p99_us / ceiling_of(r.round).p99_us)
                .collect();
            println!(
                "| {who} | {tasks} | {:.0} | {:.0} | {:.0} | {:.1} | {:.2} ({}) | {:.2} ({}) |",
                median(mine.iter().map(|r| r.rps).collect()),
                median(mine.iter().map(|r| r.p50_us).collect()),
                median(mine.iter().map(|r| r.p99_us).collect()),
                median(mine.iter().map(|r| r.cpu_us).collect()),
                median(rps.clone()),
                range(&rps),
                median(p99.clone()),
                range(&p99),
            );
        }
    }
}
