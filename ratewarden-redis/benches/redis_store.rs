//! Decisions per second and latency of the Redis store at 1, 16 and 64
//! concurrent tasks on loopback, for the store's multiplexed connection and
//! for the same script call through a deadpool-redis pool (built here: the
//! store offers no pool, since this comparison is why), beside
//! `redis-benchmark` running the same script with the same arguments and
//! concurrency (the ceiling).
//!
//! Run: `cargo bench -p ratewarden-redis`
//! (needs Docker and the `ratewarden-test-redis:7` image, or `RATEWARDEN_REDIS_IMAGE`).
//! `RATEWARDEN_BENCH_OPS` sets the decisions per run (default 200000).

use std::future::Future;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden_core::{Algorithm, ManualClock, Policy, Store, Timestamp};
use ratewarden_redis::{RedisStore, script_source};

const T0: u64 = ManualClock::DEFAULT_START.as_micros();
const CONCURRENCY: [usize; 3] = [1, 16, 64];

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

struct Row {
    who: String,
    tasks: usize,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
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

fn main() {
    let ops: usize = std::env::var("RATEWARDEN_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let image = std::env::var("RATEWARDEN_REDIS_IMAGE")
        .unwrap_or_else(|_| "ratewarden-test-redis:7".into());
    let port = free_port();
    // Host networking: the store and redis-benchmark both reach the server
    // over the host's loopback, with no userland proxy in between.
    let id = docker(&[
        "run",
        "-d",
        "--rm",
        "--network",
        "host",
        &image,
        "--port",
        &port.to_string(),
    ]);
    let url = format!("redis://127.0.0.1:{port}");
    // RATEWARDEN_BENCH_RUNTIME=current: one thread runs the callers and the
    // connection's task alike, so no answer crosses threads.
    let rt = match std::env::var("RATEWARDEN_BENCH_RUNTIME").as_deref() {
        Ok("current") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
    .expect("runtime");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(bench(&id, &url, port, ops))
    }));
    docker(&["rm", "-f", &id]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
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

async fn bench(id: &str, url: &str, port: u16, ops: usize) {
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
    let store = move || {
        let store = managed.clone();
        async move {
            store
                .decide(b"bench", &policy, 1, Timestamp::from_micros(T0))
                .await
                .expect("decision");
        }
    };
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
    // The same call on the redis crate's own multiplexed connection, with
    // nothing of the store around it: what the store adds over its client.
    let bare_conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let bare = {
        let (script, key) = (
            Arc::new(redis::Script::new(script_source(Algorithm::FixedWindow))),
            key.clone(),
        );
        move || {
            let (mut conn, script, key) = (bare_conn.clone(), script.clone(), key.clone());
            async move {
                invocation(&script, key, &policy)
                    .invoke_async::<redis::Value>(&mut conn)
                    .await
                    .expect("decision");
            }
        }
    };
    // Warm up each (connects, loads the script).
    run(store.clone(), 16, 10_000).await;
    run(bare.clone(), 16, 10_000).await;
    run(pooled.clone(), 16, 10_000).await;

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
    for &tasks in &CONCURRENCY {
        let n = if tasks == 1 { ops / 4 } else { ops };
        let (rps, p50, p99) = run(store.clone(), tasks, n).await;
        rows.push(Row {
            who: "RedisStore, multiplexed (ConnectionManager)".into(),
            tasks,
            rps,
            p50_us: p50,
            p99_us: p99,
        });
        let (rps, p50, p99) = run(bare.clone(), tasks, n).await;
        rows.push(Row {
            who: "the same script call, bare redis MultiplexedConnection".into(),
            tasks,
            rps,
            p50_us: p50,
            p99_us: p99,
        });
        let (rps, p50, p99) = run(pooled.clone(), tasks, n).await;
        rows.push(Row {
            who: "the same script call, deadpool (64 connections)".into(),
            tasks,
            rps,
            p50_us: p50,
            p99_us: p99,
        });

        // The ceiling at equal concurrency, and for 16 tasks and more the
        // pipelined one (`-P 16`): the shape a multiplexed connection has.
        let pipelines: &[usize] = if tasks >= 16 { &[1, 16] } else { &[1] };
        for &pipeline in pipelines {
            let mut cmd: Vec<String> = vec![
                "exec".into(),
                id.into(),
                "redis-benchmark".into(),
                "-h".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
                "-c".into(),
                tasks.to_string(),
                "-n".into(),
                n.to_string(),
                "-P".into(),
                pipeline.to_string(),
                "--csv".into(),
            ];
            cmd.extend(args.iter().cloned());
            let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
            if tasks == 1 || pipeline > 1 {
                eprintln!("redis-benchmark command: docker {}", refs.join(" "));
            }
            let csv = docker(&refs);
            // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
            let line = csv.lines().last().unwrap_or_default().replace('"', "");
            let f: Vec<&str> = line.split(',').collect();
            let num = |i: usize| {
                f.get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            rows.push(Row {
                who: if pipeline == 1 {
                    "redis-benchmark (ceiling)".into()
                } else {
                    format!("redis-benchmark -P {pipeline} (pipelined ceiling)")
                },
                tasks,
                rps: num(1),
                p50_us: num(4) * 1000.0,
                p99_us: num(6) * 1000.0,
            });
        }
    }

    println!("| client | tasks | decisions/s | p50 µs | p99 µs | % of ceiling |");
    println!("|---|---:|---:|---:|---:|---:|");
    for tasks in CONCURRENCY {
        let ceiling = rows
            .iter()
            .find(|r| r.tasks == tasks && r.who == "redis-benchmark (ceiling)")
            .map(|r| r.rps)
            .unwrap_or(f64::NAN);
        for r in rows.iter().filter(|r| r.tasks == tasks) {
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0}% |",
                r.who,
                r.tasks,
                r.rps,
                r.p50_us,
                r.p99_us,
                100.0 * r.rps / ceiling
            );
        }
    }
}
