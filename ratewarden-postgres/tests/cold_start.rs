//! Cold-start reset: an application process that restarts (or a serverless
//! instance recycled under load) must not hand an offender a fresh quota.
//! The Postgres store keeps the state in the database, so a new store on the
//! same schema, as a restarted process builds, sees the offender's count.

use ratewarden_conformance::call;
use std::time::Duration;

use ratewarden_conformance::ratewarden_core::{Algorithm, ManualClock, Policy};
use ratewarden_postgres::PostgresStore;
use ratewarden_test_support::postgres as fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_process_does_not_reset_an_offender() {
    let schema = fixture::unique_schema("cold_start");
    let open = || {
        PostgresStore::builder(fixture::server_url())
            .schema(schema.clone())
            .sweep_interval(None)
            .timeout(Duration::from_secs(10))
            .build()
    };
    let t0 = ManualClock::DEFAULT_START;
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, 3, Duration::from_secs(3600)).unwrap();
        let key = format!("offender:{algorithm}");
        let first = open().await.expect("store builds");
        for _ in 0..3 {
            assert!(
                call::decide(&first, key.as_bytes(), &policy, 1, t0)
                    .await
                    .unwrap()
                    .allowed
            );
        }
        let refused = call::decide(&first, key.as_bytes(), &policy, 1, t0)
            .await
            .unwrap();
        assert!(!refused.allowed, "{algorithm}");
        drop(first);

        // The "restarted" process: a new store, new pool, same schema.
        let second = open().await.expect("store builds on an existing schema");
        let again = call::decide(&second, key.as_bytes(), &policy, 1, t0)
            .await
            .unwrap();
        assert!(
            !again.allowed,
            "{algorithm}: a restart reset the offender's count"
        );
        assert_eq!(again.retry_after, refused.retry_after, "{algorithm}");
    }
}
