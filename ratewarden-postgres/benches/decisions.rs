//! Decisions per second and latency of the PostgreSQL store, beside
//! `pgbench` running the same statement with the same number of clients.
//!
//! ```text
//! cargo bench -p ratewarden-postgres --bench decisions
//! ```
//!
//! Starts `ratewarden-test-postgres:15` (or `RATEWARDEN_POSTGRES_IMAGE`) with
//! durable settings (`fsync`, `synchronous_commit` and `full_page_writes`
//! on), or uses `RATEWARDEN_POSTGRES_URL`. For each durability mode (logged
//! tables; unlogged tables; `synchronous_commit = off`), each concurrency
//! (1, 16, 64 tasks over as many pooled connections) and each key set (one
//! hot key; 10,000 keys drawn uniformly), it runs GCRA decisions that are
//! all admitted (every one writes) for `BENCH_SECONDS` (default 5) after a
//! one-second warm-up, then runs `pgbench -M prepared` with the same
//! statement, clients and duration over the same TCP path. Every key's row
//! exists before the first run of each mode, so both contenders update
//! rows and neither pays for creating them. Prints a Markdown table.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratewarden_core::{Policy, Request, Store, Timestamp};
use ratewarden_postgres::PostgresStore;
use ratewarden_test_support::Rng;
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{GenericImage, ImageExt};

const KEYS: u64 = 10_000;

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    schema: &'static str,
    unlogged: bool,
    synchronous_commit: bool,
}

const MODES: [Mode; 3] = [
    Mode {
        name: "logged",
        schema: "bench_logged",
        unlogged: false,
        synchronous_commit: true,
    },
    Mode {
        name: "UNLOGGED",
        schema: "bench_unlogged",
        unlogged: true,
        synchronous_commit: true,
    },
    Mode {
        name: "synchronous_commit=off",
        schema: "bench_async",
        unlogged: false,
        synchronous_commit: false,
    },
];

struct Run {
    per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

/// One decision for each of the `KEYS` keys (and the hot one), so that
/// every row exists.
async fn prefill(store: &PostgresStore) {
    let policy = Policy::gcra(1_000_000, Duration::from_secs(1)).expect("policy");
    let keys = (1..=KEYS)
        .map(|k| format!("key-{k}"))
        .chain(["hot".to_string()]);
    for key in keys {
        store
            .decide(
                Request::new(store, key.as_bytes(), &policy, 1, Timestamp::now_system())
                    .expect("a valid request"),
            )
            .await
            .expect("decision");
    }
}

async fn run_store(store: &PostgresStore, tasks: usize, hot: bool, secs: u64) -> Run {
    // Every decision is admitted and writes: 1,000,000 per second per key.
    let policy = Policy::gcra(1_000_000, Duration::from_secs(1)).expect("policy");
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let store = store.clone();
            let stop = Arc::clone(&stop);
            let measuring = Arc::clone(&measuring);
            tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                let mut latencies = Vec::with_capacity(1 << 16);
                while !stop.load(Ordering::Relaxed) {
                    let key = if hot {
                        "hot".to_string()
                    } else {
                        format!("key-{}", 1 + rng.next_u64() % KEYS)
                    };
                    let start = Instant::now();
                    let d = store
                        .decide(
                            Request::new(
                                &store,
                                key.as_bytes(),
                                &policy,
                                1,
                                Timestamp::now_system(),
                            )
                            .expect("a valid request"),
                        )
                        .await
                        .expect("decision");
                    let elapsed = start.elapsed();
                    debug_assert!(d.allowed);
                    if measuring.load(Ordering::Relaxed) {
                        latencies.push(elapsed.as_micros() as u64);
                    }
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    Run {
        per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

/// Runs pgbench with the store's statement; returns (tps, mean latency ms).
fn run_pgbench(url: &str, mode: Mode, clients: usize, hot: bool, secs: u64) -> Option<(f64, f64)> {
    let key = if hot {
        "'hot'::bytea".to_string()
    } else {
        "('key-' || :k)::bytea".to_string()
    };
    // The statement the store sends, with the server's clock for `now`
    // (pgbench has no wall clock).
    let script = format!(
        "\\set k random(1, {KEYS})\n\
         SELECT allowed, remaining, reset_after_us, retry_after_us \
         FROM \"{schema}\".decide_gcra({key}, 1000000, 1000000, 1, NULL, 60000000, NULL);\n",
        schema = mode.schema
    );
    let path = std::env::temp_dir().join(format!(
        "ratewarden-pgbench-{}-{}.sql",
        std::process::id(),
        mode.schema
    ));
    std::fs::write(&path, script).ok()?;
    let mut cmd = Command::new("pgbench");
    cmd.args(["-n", "-M", "prepared", "-T", &secs.to_string()])
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .arg("-f")
        .arg(&path)
        .arg(url);
    if !mode.synchronous_commit {
        cmd.env("PGOPTIONS", "-c synchronous_commit=off");
    }
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!(
            "pgbench failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    // "tps = 1234.5 (without initial connection time)", "latency average = 0.8 ms".
    let number = |label: &str, word: usize| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(label))?
            .split_whitespace()
            .nth(word)?
            .parse()
            .ok()
    };
    Some((number("tps", 2)?, number("latency average", 3)?))
}

fn main() {
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut _container = None;
        let url = match std::env::var("RATEWARDEN_POSTGRES_URL") {
            Ok(url) => url,
            Err(_) => {
                let spec = std::env::var("RATEWARDEN_POSTGRES_IMAGE")
                    .unwrap_or_else(|_| "ratewarden-test-postgres:15".into());
                let (name, tag) = spec.rsplit_once(':').unwrap_or((&spec, "latest"));
                // Arguments starting with '-' are appended to the server's
                // command line by the local image: the durable settings its
                // test defaults turn off.
                let local = spec == "ratewarden-test-postgres:15";
                let container = GenericImage::new(name, tag)
                    .with_exposed_port(5432.tcp())
                    .with_wait_for(WaitFor::message_on_stderr(
                        "database system is ready to accept connections",
                    ))
                    .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
                    .with_cmd(
                        (!local)
                            .then_some("postgres")
                            .into_iter()
                            .chain([
                                "-c",
                                "max_connections=200",
                                "-c",
                                "fsync=on",
                                "-c",
                                "synchronous_commit=on",
                                "-c",
                                "full_page_writes=on",
                            ]),
                    )
                    .start()
                    .await
                    .expect(
                        "could not start the PostgreSQL container: build it with \
                         scripts/build-test-images.sh or set RATEWARDEN_POSTGRES_URL",
                    );
                let port = container
                    .get_host_port_ipv4(5432.tcp())
                    .await
                    .expect("port");
                _container = Some(container);
                format!("postgres://postgres@127.0.0.1:{port}/postgres")
            }
        };
        // The peer is half of every row: a table without it compares
        // nothing, so a missing pgbench stops the bench instead of
        // printing a column of blanks.
        let pgbench = Command::new("pgbench").arg("--version").output();
        if !pgbench.is_ok_and(|out| out.status.success()) {
            eprintln!(
                "error: pgbench does not run here, and every row compares the store with it: \
                 install it (Debian: apt-get install postgresql-client-15) and run this again"
            );
            std::process::exit(2);
        }
        println!(
            "| mode | tasks | keys | store decisions/s | p50 µs | p99 µs | pgbench tps | pgbench mean ms | store / pgbench |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for mode in MODES {
            for tasks in [1usize, 16, 64] {
                let store = PostgresStore::builder(&url)
                    .schema(mode.schema)
                    .pool_size(tasks as u32)
                    .unlogged(mode.unlogged)
                    .synchronous_commit(mode.synchronous_commit)
                    .timeout(Duration::from_secs(10))
                    .sweep_interval(None)
                    .build()
                    .await
                    .expect("store");
                if tasks == 1 {
                    // Every key's row created before either contender runs:
                    // otherwise the store's run (first) pays for inserting
                    // the rows and pgbench (second) only updates them, which
                    // showed as the store at 42-49 % of pgbench on unlogged
                    // tables with 10,000 keys in two runs.
                    prefill(&store).await;
                }
                for hot in [true, false] {
                    let run = run_store(&store, tasks, hot, secs).await;
                    let (tps, mean) = run_pgbench(&url, mode, tasks, hot, secs)
                        .unwrap_or_else(|| {
                            panic!(
                                "pgbench gave no result for {} with {tasks} clients (its \
                                 output is above)",
                                mode.name
                            )
                        });
                    let (tps, mean, ratio) = (
                        format!("{tps:.0}"),
                        format!("{mean:.3}"),
                        format!("{:.0}%", 100.0 * run.per_sec / tps),
                    );
                    println!(
                        "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                        mode.name,
                        tasks,
                        if hot { "1 (hot)" } else { "10,000" },
                        run.per_sec,
                        run.p50_us,
                        run.p99_us,
                        tps,
                        mean,
                        ratio
                    );
                }
            }
        }
    });
}
