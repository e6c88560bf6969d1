//! The conformance scorecard: runs every scenario of `ratewarden-conformance`
//! against one backend and prints one line per scenario with its evidence.
//!
//! ```text
//! cargo run -p ratewarden-scorecard -- memory
//! cargo run -p ratewarden-scorecard --features redis -- redis://127.0.0.1:6379
//! cargo run -p ratewarden-scorecard --features postgres -- postgres://postgres@127.0.0.1/postgres
//! cargo run -p ratewarden-scorecard -- broken:insertion-order-eviction
//! ```
//!
//! Exits 0 when every scenario passes, 1 when any fails, 2 on bad usage.
//! Against a shared server each scenario isolates itself (a unique key
//! prefix, its own schema) and never wipes what is already there.

use std::process::ExitCode;
use std::sync::Arc;

use ratewarden::Store;
use ratewarden_conformance::broken::{BrokenStore, Defect};
use ratewarden_conformance::{StoreFactory, run_all};

const USAGE: &str = "usage: ratewarden-conformance <target>

targets:
  memory                      the in-process store with a capacity of 1000 keys
  memory://?capacity=N        the in-process store with N keys
  redis://HOST:PORT[/DB]      a Redis server (needs the `redis` feature)
  postgres://USER@HOST/DB     a PostgreSQL server (needs the `postgres` feature)
  broken:DEFECT               a deliberately broken test store, to see the suite catch it;
                              DEFECT is one of:";

/// A broken store's name on the command line: its store name without the
/// `broken-` every one of them starts with, so that a new defect is named
/// here as soon as it exists.
fn defect_name(defect: Defect) -> &'static str {
    let name = defect.store_name();
    name.strip_prefix("broken-").unwrap_or(name)
}

/// The key capacity of the bounded stores the scorecard builds: small enough
/// that the flood scenario (three times the capacity) runs in a moment.
const CAPACITY: usize = 1_000;

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    for defect in Defect::ALL {
        eprintln!("                                {}", defect_name(defect));
    }
    ExitCode::from(2)
}

async fn factory(target: &str) -> Result<Arc<dyn StoreFactory>, String> {
    if let Some(defect) = target.strip_prefix("broken:") {
        let Some(defect) = Defect::ALL.into_iter().find(|d| defect_name(*d) == defect) else {
            return Err(format!("unknown defect {defect:?}"));
        };
        return Ok(Arc::new(move || async move {
            Arc::new(BrokenStore::new(defect, CAPACITY)) as Arc<dyn Store>
        }));
    }
    if target == "memory" || target.starts_with("memory://") {
        let target = if target == "memory" {
            format!("memory://?capacity={CAPACITY}")
        } else {
            target.to_owned()
        };
        // Validate the URL once, then build fresh stores of the same shape.
        ratewarden::store::from_url(&target)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(Arc::new(move || {
            let target = target.clone();
            async move {
                ratewarden::store::from_url(&target)
                    .await
                    .expect("the URL was validated above")
            }
        }));
    }
    shared_factory(target)
}

/// Names unique to this run, so that scenarios on a shared server never see
/// each other's state or anything already there.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn unique(separator: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let started = ratewarden::Timestamp::now_system().as_micros();
    format!("scorecard{separator}{started}{separator}{n}")
}

/// The scorecard checks what a store decides, not how fast: a generous
/// timeout keeps 64 concurrent callers on a busy machine from failing a
/// scenario by waiting for a pooled connection.
#[cfg(any(feature = "redis", feature = "postgres"))]
const SCENARIO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn shared_factory(target: &str) -> Result<Arc<dyn StoreFactory>, String> {
    let scheme = target.split_once("://").map_or("", |(s, _)| s);
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" | "redis+sentinel" => {
            // Validate once, so a malformed URL is reported before any scenario.
            ratewarden::redis::RedisStore::from_url(target).map_err(|e| e.to_string())?;
            let url = target.to_owned();
            Ok(Arc::new(move || {
                let store = ratewarden::redis::RedisStore::builder(url.clone())
                    .key_prefix(format!("{}:", unique(":")))
                    .timeout(SCENARIO_TIMEOUT)
                    .build()
                    .expect("the URL was validated above");
                async move { Arc::new(store) as Arc<dyn Store> }
            }))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let url = target.to_owned();
            Ok(Arc::new(move || {
                let url = url.clone();
                async move {
                    let store = ratewarden::postgres::PostgresStore::builder(url)
                        .schema(unique("_"))
                        .timeout(SCENARIO_TIMEOUT)
                        .build()
                        .await
                        .unwrap_or_else(|e| panic!("cannot open the Postgres store: {e}"));
                    Arc::new(store) as Arc<dyn Store>
                }
            }))
        }
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" | "redis+cluster" | "redis+sentinel" => {
            Err("redis URLs need the `redis` feature: cargo run -p ratewarden-scorecard --features redis -- URL".into())
        }
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => {
            Err("postgres URLs need the `postgres` feature: cargo run -p ratewarden-scorecard --features postgres -- URL".into())
        }
        _ => Err(format!("unknown target {target:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target] = args.as_slice() else {
        return usage();
    };
    if target == "-h" || target == "--help" {
        return usage();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let factory = match factory(target).await {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        println!("conformance scorecard for {target}");
        let results = run_all(factory).await;
        let width = results.iter().map(|(s, _)| s.name.len()).max().unwrap_or(0);
        let mut failed = 0;
        for (scenario, result) in &results {
            match result {
                Ok(evidence) => println!("PASS  {:width$}  {evidence}", scenario.name),
                Err(failure) => {
                    failed += 1;
                    println!("FAIL  {:width$}  {failure}", scenario.name);
                }
            }
        }
        let passed = results.len() - failed;
        println!("{passed} passed, {failed} failed");
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}
