//! Limits from a TOML file: what it builds, the errors that name the line
//! and key at fault, and a reload while traffic runs that keeps counted
//! usage and refuses a broken file, an empty or cut-short one and a route
//! without `/`, outlives a rebuild that panics, and takes back a store the
//! reload before took away; by a call and by `SIGHUP`.
#![cfg(all(feature = "config", feature = "memory", feature = "axum"))]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratewarden::config::{Limits, LimitsBuilder, Reloader};
use ratewarden::{ClientIdentity, ConfigError, ManualClock, RateLimitLayer};
use ratewarden_test_support::http::{TestClient, serve};

const FILE: &str = r#"
[stores]
local = "memory://?capacity=1000"
durable = "memory://?capacity=1000"

[limits.search]
store = "local"
policy = "5/minute"

[limits.feedback]
rules = [
  { name = "feedback-local", store = "local", policy = "fixed_window 3/hour" },
  { store = "durable", policy = "fixed_window 3/hour", lease = 2, timeout_ms = 50, fallback = "local", on_failure = "closed" },
]

[limits.contact]
store = "local"
policy = "10/day"
escalate = { store = "durable", policy = "10/day", every = 5 }

[routes]
"/search" = "search"
"/feedback" = "feedback"
"#;

async fn parse(text: &str) -> Result<Limits, ConfigError> {
    Limits::builder()
        .clock(Arc::new(ManualClock::new()))
        .parse(text, "limits.toml")
        .await
}

#[tokio::test]
async fn a_file_builds_stores_rules_tiers_leases_escalation_and_routes() {
    let limits = parse(FILE).await.unwrap();
    let names = |limit: &str| -> Vec<String> {
        let limiter = limits.limiter(limit).unwrap();
        limiter
            .rules()
            .iter()
            .map(|r| r.name().to_owned())
            .collect()
    };
    assert_eq!(names("search"), ["search"]);
    assert_eq!(names("feedback"), ["feedback-local", "feedback-2"]);
    let feedback = limits.limiter("feedback").unwrap();
    assert!(
        limits.limiter("contact").unwrap().rules()[0]
            .escalation_policy()
            .is_some()
    );
    let routes: Vec<&str> = limits.routes().map(|(route, _)| route).collect();
    assert_eq!(routes, ["/feedback", "/search"]);
    // Search admits its 5; feedback's two tiers admit 3 together.
    let search = limits.route("/search").unwrap();
    let admitted = futures_admitted(search, 8).await;
    assert_eq!(admitted, 5);
    assert_eq!(futures_admitted(feedback, 5).await, 3);
}

async fn futures_admitted(limiter: &ratewarden::Limiter, n: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u32::from(limiter.check(b"client").await.allowed);
    }
    admitted
}

/// The file with `line` replaced by `with`, and the error it gets.
async fn broken(line: &str, with: &str) -> String {
    assert!(FILE.contains(line), "{line}");
    let err = parse(&FILE.replace(line, with))
        .await
        .unwrap_err()
        .to_string();
    err.strip_prefix("invalid configuration: ")
        .unwrap_or_else(|| panic!("{err}"))
        .to_owned()
}

#[tokio::test]
async fn errors_name_the_line_and_the_key_at_fault() {
    let err = broken("policy = \"5/minute\"", "policy = \"5/mnute\"").await;
    assert!(
        err.starts_with("limits.toml: line 8, column 10: `policy = \"5/mnute\"`:"),
        "{err}"
    );
    let err = broken(
        "store = \"local\"\npolicy = \"5/minute\"",
        "stor = \"local\"\npolicy = \"5/minute\"",
    )
    .await;
    assert!(
        err.starts_with("limits.toml: line 7, column 1: `stor = \"local\"`:"),
        "{err}"
    );
    assert!(err.contains("unknown field `stor`"), "{err}");
    let err = broken(
        "store = \"local\"\npolicy = \"5/minute\"",
        "store = \"locl\"\npolicy = \"5/minute\"",
    )
    .await;
    assert!(
        err.starts_with("limits.toml: line 7, column 9: `store = \"locl\"`:"),
        "{err}"
    );
    assert!(
        err.contains("no store is named \"locl\" (stores: durable, local)"),
        "{err}"
    );
    let err = broken("\"/search\" = \"search\"", "\"/search\" = \"serch\"").await;
    assert!(
        err.starts_with("limits.toml: line 22, column 13:")
            && err.contains("no limit is named \"serch\""),
        "{err}"
    );
    let err = broken("lease = 2,", "lease = 0,").await;
    assert!(
        err.contains("line 13") && err.contains("`{ store = \"durable\""),
        "{err}"
    );
    let err = broken("on_failure = \"closed\"", "on_failure = \"shut\"").await;
    assert!(
        err.contains("on_failure is \"open\" or \"closed\", not \"shut\""),
        "{err}"
    );
    let err = broken(
        "local = \"memory://?capacity=1000\"",
        "local = \"memcache://x\"",
    )
    .await;
    assert!(
        err.starts_with("limits.toml: line 3, column 9:") && err.contains("unknown store scheme"),
        "{err}"
    );
    // Two limits whose rules would share a name, and so their counts.
    let err = parse(&format!(
        "{FILE}\n[limits.feedback-2]\nstore = \"local\"\npolicy = \"1/day\"\n"
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("has a rule named \"feedback-2\", as limit"),
        "{err}"
    );
    // The lease is built: a sliding log cannot be leased.
    let err = broken(
        "policy = \"fixed_window 3/hour\", lease",
        "policy = \"3/hour\", lease",
    )
    .await;
    assert!(
        err.contains("line 13")
            && err.contains("the leased store does not support the sliding_log algorithm"),
        "{err}"
    );
    let err = parse("[limits.a]\nstore = \"x\"\nrules = []\n")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("both `rules` and the fields of a single rule"),
        "{err}"
    );
}

/// The app a file describes: each route limited by its limit, keyed by
/// client address.
fn app(limits: &Limits, identity: &ClientIdentity) -> Result<Router, ConfigError> {
    let mut router = Router::new();
    for (route, limiter) in limits.routes() {
        let layer = RateLimitLayer::new(limiter.clone(), identity.clone())?;
        router = router.route(route, get(|| async { "ok" }).route_layer(layer));
    }
    Ok(router)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_traffic_keeps_counted_usage_and_a_broken_file_keeps_the_old_limits() {
    let dir = std::env::temp_dir().join(format!("ratewarden-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, FILE).unwrap();
    let limits = Limits::builder()
        .clock(Arc::new(ManualClock::new()))
        .load(&path)
        .await
        .unwrap();
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    let build = {
        let identity = identity.clone();
        move |limits: &Limits| app(limits, &identity)
    };
    let (reloader, service) = Reloader::new(limits, build).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Router::new().fallback_service(service);
    tokio::spawn(async move {
        axum::serve(
            listener,
            served.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });

    // Traffic from one client, all along.
    let client = TestClient::new(addr, None);
    let (admitted, refused) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (admitted, refused, stop) = (admitted.clone(), refused.clone(), stop.clone());
        tokio::spawn(async move {
            let mut limits_seen = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let reply = client.get("/search").await;
                match reply.status.as_u16() {
                    200 => admitted.fetch_add(1, Ordering::Relaxed),
                    429 => refused.fetch_add(1, Ordering::Relaxed),
                    other => panic!("a request failed: {other} {reply:?}"),
                };
                limits_seen.insert(reply.limit());
                tokio::task::yield_now().await;
            }
            limits_seen
        })
    };

    // The first limit fills (5 a minute), and refusals follow.
    wait_until(&refused, 3).await;
    assert_eq!(admitted.load(Ordering::Relaxed), 5);

    // A broken file: refused, and the old limit stays in force.
    std::fs::write(
        &path,
        FILE.replace("policy = \"5/minute\"", "policy = \"8/mnute\""),
    )
    .unwrap();
    let err = reloader.reload().await.unwrap_err().to_string();
    assert!(
        err.contains("line 8") && err.contains("`policy = \"8/mnute\"`"),
        "{err}"
    );
    let before = refused.load(Ordering::Relaxed);
    wait_until(&refused, before + 3).await;
    assert_eq!(admitted.load(Ordering::Relaxed), 5);

    // The limit raised to 8 a minute while traffic runs: the 5 already
    // counted stay counted, so 3 more are admitted, not 8.
    std::fs::write(
        &path,
        FILE.replace("policy = \"5/minute\"", "policy = \"8/minute\""),
    )
    .unwrap();
    reloader.reload().await.unwrap();
    let before = refused.load(Ordering::Relaxed);
    wait_until(&refused, before + 5).await;
    stop.store(true, Ordering::Relaxed);
    let limits_seen = traffic.await.unwrap();
    assert_eq!(admitted.load(Ordering::Relaxed), 8);
    assert!(
        limits_seen.contains(&5) && limits_seen.contains(&8),
        "{limits_seen:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Waits, a millisecond at a time, until `counter` reaches `n`; the bound
/// only catches traffic that stopped.
async fn wait_until(counter: &AtomicU32, n: u32) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while counter.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("traffic stopped");
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_file() {
    let _turn = HANGUP.lock().await;
    let dir = std::env::temp_dir().join(format!("ratewarden-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, FILE).unwrap();
    let limits = Limits::builder().load(&path).await.unwrap();
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    let (reloader, _service) = Reloader::new(limits, move |l: &Limits| app(l, &identity)).unwrap();
    let _watch = reloader.clone().reload_on_sighup().unwrap();
    let search_limit = |limits: Limits| {
        limits.limiter("search").unwrap().rules()[0]
            .policy()
            .limit()
    };
    assert_eq!(search_limit(reloader.limits().await), 5);
    std::fs::write(
        &path,
        FILE.replace("policy = \"5/minute\"", "policy = \"9/minute\""),
    )
    .unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tokio::time::timeout(Duration::from_secs(30), async {
        while search_limit(reloader.limits().await) != 9 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the hangup reloaded the file");
    std::fs::remove_dir_all(&dir).ok();
}

/// The app of a limits file served through a [`Reloader`], on a manual
/// clock (no window ends during a test), with the file in a directory of
/// the test's own.
struct Served {
    path: PathBuf,
    reloader: Arc<Reloader<Router>>,
    client: TestClient,
}

impl Served {
    async fn start(test: &str, text: &str) -> Served {
        Served::with(test, text, Limits::builder()).await
    }

    async fn with(test: &str, text: &str, builder: LimitsBuilder) -> Served {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("ratewarden-config")
            .join(test);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("limits.toml");
        std::fs::write(&path, text).unwrap();
        let limits = builder
            .clock(Arc::new(ManualClock::new()))
            .load(&path)
            .await
            .unwrap();
        let identity = ClientIdentity::new([7u8; 32]).unwrap();
        let (reloader, service) =
            Reloader::new(limits, move |limits: &Limits| app(limits, &identity)).unwrap();
        let client = TestClient::new(serve(Router::new().fallback_service(service)).await, None);
        Served {
            path,
            reloader,
            client,
        }
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }

    async fn reload(&self) -> Result<(), String> {
        self.reloader.reload().await.map_err(|e| e.to_string())
    }

    /// The statuses of `n` requests for `route`, one after the other.
    async fn statuses(&self, route: &str, n: usize) -> Vec<u16> {
        let mut statuses = Vec::with_capacity(n);
        for _ in 0..n {
            statuses.push(self.client.get(route).await.status.as_u16());
        }
        statuses
    }

    /// The error `outcome` ends in, with the file's name at its start.
    fn refusal(&self, outcome: Result<(), String>) -> String {
        let err = outcome.expect_err("the reload is refused");
        let at = format!("invalid configuration: {}: ", self.path.display());
        assert!(err.starts_with(&at), "{err}");
        err
    }
}

/// The tests that send `SIGHUP` take turns: a hangup reaches every listener
/// in the process, and one test's must not reload another's limits (nextest
/// runs each test in a process of its own; `cargo test` does not).
#[cfg(unix)]
static HANGUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A reloader's `SIGHUP` loop, told each outcome.
#[cfg(unix)]
struct Hangups {
    outcomes: tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
    task: tokio::task::JoinHandle<()>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

#[cfg(unix)]
impl Hangups {
    async fn listen(reloader: &Arc<Reloader<Router>>) -> Hangups {
        let turn = HANGUP.lock().await;
        let (tx, outcomes) = tokio::sync::mpsc::unbounded_channel();
        let task = reloader
            .clone()
            .reload_on_sighup_with(move |outcome| {
                let _ = tx.send(outcome.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            })
            .unwrap();
        Hangups {
            outcomes,
            task,
            _turn: turn,
        }
    }

    /// Sends this process `SIGHUP`, and waits for the outcome of the reload
    /// it caused; the bound only catches a loop that no longer answers.
    async fn send(&mut self) -> Result<(), String> {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(30), self.outcomes.recv())
            .await
            .expect("the hangup is answered")
            .expect("the reload loop is alive")
    }
}

#[cfg(unix)]
impl Drop for Hangups {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// [`FILE`] cut short: what a reader may see while an editor writes it.
fn cut_short() -> [(&'static str, &'static str); 3] {
    let before = |marker: &str| FILE.split(marker).next().unwrap();
    [
        ("", "no limit is defined"),
        (before("[limits.search]"), "no limit is defined"),
        (
            before("[routes]"),
            "[routes] is gone, so the 2 routes in force would lose their limits",
        ),
    ]
}

#[tokio::test]
async fn a_file_that_limits_nothing_is_refused_at_first_load_unless_allowed() {
    for text in [
        "",
        "# every limit to come\n",
        "[stores]\ndefault = \"memory://\"\n",
    ] {
        let err = parse(text).await.unwrap_err().to_string();
        assert!(
            err.contains("limits.toml: no limit is defined, so nothing would be limited")
                && err.contains("write at least one [limits.NAME]")
                && err.contains("`LimitsBuilder::allow_empty(true)`"),
            "{text:?}: {err}"
        );
        let allowed = Limits::builder()
            .allow_empty(true)
            .parse(text, "limits.toml")
            .await
            .unwrap();
        assert_eq!(allowed.limiters().count(), 0);
    }
    // Limits without routes, for an application that asks for them by name.
    let limits = parse("[stores]\ndefault = \"memory://\"\n[limits.a]\npolicy = \"1/s\"\n")
        .await
        .unwrap();
    assert!(limits.limiter("a").is_some());
}

#[tokio::test]
async fn an_empty_or_cut_short_file_is_refused_keeping_the_limits_and_their_counts() {
    let served = Served::start("empty", FILE).await;
    assert_eq!(
        served.statuses("/search", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    for (text, says) in cut_short() {
        served.write(text);
        let err = served.refusal(served.reload().await);
        assert!(
            err.contains(says) && err.contains("allow_empty(true)"),
            "{err}"
        );
        assert_eq!(served.statuses("/search", 1).await, [429], "after {text:?}");
        assert_eq!(served.statuses("/feedback", 1).await, [200]);
    }
    // The file restored: the 5 counted stay counted.
    served.write(FILE);
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/search", 1).await, [429]);
}

#[tokio::test]
async fn an_empty_file_allowed_lifts_the_limits_and_the_next_reload_restores_their_counts() {
    let served = Served::with("allowed", FILE, Limits::builder().allow_empty(true)).await;
    assert_eq!(
        served.statuses("/search", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    served.write("");
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/search", 1).await, [404]);
    // The stores the empty file dropped were set aside, counts and all.
    served.write(FILE);
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/search", 1).await, [429]);
}

#[tokio::test]
async fn a_route_without_a_leading_slash_is_refused_naming_the_line() {
    let err = broken("\"/search\" = \"search\"", "\"search\" = \"search\"").await;
    assert!(
        err.starts_with("limits.toml: line 22, column 1: `\"search\" = \"search\"`:")
            && err.contains("the route \"search\" does not start with `/` (\"/search\"?)"),
        "{err}"
    );
    let served = Served::start("route", FILE).await;
    served.write(&FILE.replace("\"/feedback\" =", "\"api/feedback\" ="));
    let err = served.refusal(served.reload().await);
    assert!(
        err.contains("line 23") && err.contains("the route \"api/feedback\" does not start"),
        "{err}"
    );
    assert_eq!(served.statuses("/feedback", 1).await, [200]);
}

/// [`FILE`] with a route axum's router panics on: the capture syntax of
/// axum 0.7.
fn axum_refuses() -> String {
    FILE.replace("\"/feedback\" =", "\"/feedback/:id\" =")
}

#[tokio::test]
async fn a_rebuild_that_panics_is_an_error_and_the_old_service_answers() {
    let served = Served::start("panic", FILE).await;
    assert_eq!(
        served.statuses("/search", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    served.write(&axum_refuses());
    let err = served.refusal(served.reload().await);
    assert!(
        err.contains("building the service from these limits panicked")
            && err.contains("Path segments must not start with `:`"),
        "{err}"
    );
    assert_eq!(served.statuses("/search", 1).await, [429]);
    assert_eq!(served.statuses("/feedback", 1).await, [200]);
    // A good file after it applies, on the same counts: 3 more of 8.
    served.write(&FILE.replace("policy = \"5/minute\"", "policy = \"8/minute\""));
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/search", 4).await, [200, 200, 200, 429]);
}

/// Two limits, each on a store of its own; `reports` and its store and
/// route only if `with_reports`.
fn two_stores(with_reports: bool) -> String {
    let mut text = String::from("[stores]\nlocal = \"memory://?capacity=1000\"\n");
    if with_reports {
        text.push_str("reports = \"memory://?capacity=1000\"\n");
    }
    text.push_str("\n[limits.search]\nstore = \"local\"\npolicy = \"fixed_window 5/hour\"\n");
    if with_reports {
        text.push_str(
            "\n[limits.reports]\nstore = \"reports\"\npolicy = \"fixed_window 3/hour\"\n",
        );
    }
    text.push_str("\n[routes]\n\"/search\" = \"search\"\n");
    if with_reports {
        text.push_str("\"/reports\" = \"reports\"\n");
    }
    text
}

#[tokio::test]
async fn a_store_taken_out_and_put_back_by_the_next_reload_keeps_its_counts() {
    let served = Served::start("restored", &two_stores(true)).await;
    assert_eq!(served.statuses("/reports", 4).await, [200, 200, 200, 429]);
    served.write(&two_stores(false));
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/reports", 1).await, [404]);
    served.write(&two_stores(true));
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/reports", 1).await, [429]);

    // Set aside for one reload only: out for two, it comes back new.
    served.write(&two_stores(false));
    served.reload().await.unwrap();
    served.reload().await.unwrap();
    served.write(&two_stores(true));
    served.reload().await.unwrap();
    assert_eq!(served.statuses("/reports", 4).await, [200, 200, 200, 429]);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_refuses_an_empty_or_cut_short_file_keeping_the_counts() {
    let served = Served::start("sighup-empty", FILE).await;
    let mut hangups = Hangups::listen(&served.reloader).await;
    assert_eq!(
        served.statuses("/search", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    for (text, says) in cut_short() {
        served.write(text);
        let err = served.refusal(hangups.send().await);
        assert!(err.contains(says), "{err}");
        assert_eq!(served.statuses("/search", 1).await, [429], "after {text:?}");
    }
    served.write(FILE);
    hangups.send().await.unwrap();
    assert_eq!(served.statuses("/search", 1).await, [429]);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_refuses_a_route_without_a_slash_and_reloads_the_next_file() {
    let served = Served::start("sighup-route", FILE).await;
    let mut hangups = Hangups::listen(&served.reloader).await;
    served.write(&FILE.replace("\"/search\" =", "\"search\" ="));
    let err = served.refusal(hangups.send().await);
    assert!(
        err.contains("line 22") && err.contains("does not start with `/`"),
        "{err}"
    );
    assert_eq!(served.statuses("/search", 1).await, [200]);
    served.write(&FILE.replace("policy = \"5/minute\"", "policy = \"8/minute\""));
    hangups.send().await.unwrap();
    let reply = served.client.get("/search").await;
    assert_eq!(reply.limit(), 8);
    assert_eq!(reply.remaining(), 6);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_outlives_a_rebuild_that_panics() {
    let served = Served::start("sighup-panic", FILE).await;
    let mut hangups = Hangups::listen(&served.reloader).await;
    assert_eq!(
        served.statuses("/search", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    served.write(&axum_refuses());
    let err = served.refusal(hangups.send().await);
    assert!(
        err.contains("building the service from these limits panicked"),
        "{err}"
    );
    assert_eq!(served.statuses("/search", 1).await, [429]);
    served.write(&FILE.replace("policy = \"5/minute\"", "policy = \"8/minute\""));
    hangups.send().await.unwrap();
    assert_eq!(served.statuses("/search", 4).await, [200, 200, 200, 429]);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_takes_back_a_store_the_reload_before_took_out() {
    let served = Served::start("sighup-restored", &two_stores(true)).await;
    let mut hangups = Hangups::listen(&served.reloader).await;
    assert_eq!(served.statuses("/reports", 4).await, [200, 200, 200, 429]);
    served.write(&two_stores(false));
    hangups.send().await.unwrap();
    assert_eq!(served.statuses("/reports", 1).await, [404]);
    served.write(&two_stores(true));
    hangups.send().await.unwrap();
    assert_eq!(served.statuses("/reports", 1).await, [429]);
}

fn shadowed(shadow: bool) -> String {
    format!(
        r#"
[stores]
default = "memory://"

[limits.upload]
policy = "fixed_window 2/minute"
shadow = {shadow}

[limits.search]
rules = [
  {{ name = "search-burst", policy = "fixed_window 1/minute", shadow = {shadow} }},
  {{ policy = "fixed_window 5/minute" }},
]
"#
    )
}

#[tokio::test]
async fn a_limit_in_shadow_mode_refuses_nothing_and_keeps_its_counts_when_switched_on() {
    let limits = parse(&shadowed(true)).await.unwrap();
    let upload = limits.limiter("upload").unwrap();
    assert!(upload.rules()[0].is_shadow());
    let mut seen = Vec::new();
    for _ in 0..4 {
        let d = upload.check(b"client").await;
        seen.push((d.allowed, d.source.shadow_refused));
    }
    assert_eq!(
        seen,
        [(true, false), (true, false), (true, true), (true, true)]
    );
    let search = limits.limiter("search").unwrap();
    let shadows: Vec<bool> = search.rules().iter().map(|r| r.is_shadow()).collect();
    assert_eq!(shadows, [true, false]);
    assert!(search.check(b"client").await.allowed);
    let d = search.check(b"client").await;
    assert!(d.allowed && d.source.shadow_refused, "{d:?}");

    // Switched on by a reload: the same stores, so the same counts.
    let limits = limits.reload_from(&shadowed(false)).await.unwrap();
    assert!(!limits.limiter("upload").unwrap().rules()[0].is_shadow());
    assert!(
        !limits
            .limiter("upload")
            .unwrap()
            .check(b"client")
            .await
            .allowed
    );
    let d = limits.limiter("search").unwrap().check(b"client").await;
    assert_eq!((d.allowed, d.source.rule), (false, Some("search-burst")));

    let text = shadowed(true).replacen("shadow = true", "shadow = \"yes\"", 1);
    let message = parse(&text).await.unwrap_err().to_string();
    assert!(
        message.contains("line 7") && message.contains("shadow = \"yes\""),
        "{message}"
    );
}

fn with_access(deny: &str) -> String {
    format!(
        r#"
[stores]
default = "memory://"

[limits.search]
policy = "fixed_window 2/minute"

[access]
allow = ["10.0.0.0/8"]
deny = [{deny}]
deny_keys = ["0123456789abcdef0123456789abcdef"]
"#
    )
}

#[tokio::test]
async fn the_access_lists_come_from_the_file_and_change_with_a_reload() {
    use ratewarden::access::Access;
    let limits = parse(&with_access("\"192.0.2.0/24\"")).await.unwrap();
    let access = limits.access();
    assert_eq!(access.check_addr([192, 0, 2, 1].into()), Access::Deny);
    assert_eq!(access.check_addr([10, 1, 1, 1].into()), Access::Allow);
    assert_eq!(access.check_addr([198, 51, 100, 1].into()), Access::Limit);
    let key = "0123456789abcdef0123456789abcdef".parse().unwrap();
    assert_eq!(access.check_key(&key), Access::Deny);

    let limits = limits.reload_from(&with_access("")).await.unwrap();
    assert_eq!(
        limits.access().check_addr([192, 0, 2, 1].into()),
        Access::Limit
    );
    let limits = limits
        .reload_from(&with_access("\"192.0.2.0/24\"").replace("[access]", "[access.x]"))
        .await;
    assert!(limits.is_err());

    // A bad entry is refused at its line, naming what to write.
    let err = parse(&with_access("\"192.0.2.1/24\""))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 10") && err.contains("did you mean 192.0.2.0/24"),
        "{err}"
    );
    let err = parse(&with_access("").replace("0123456789abcdef", "XYZ"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 11") && err.contains("32 lowercase hex digits"),
        "{err}"
    );
}

fn with_customers(acme: &str) -> String {
    format!(
        r#"
[stores]
default = "memory://"

[limits.search]
policy = "fixed_window 2/minute"

[customers.api]
default = "free"
plans = {{ free = "fixed_window 2/minute", pro = "fixed_window 5/minute", burst = "gcra 10/s burst 20" }}
overrides = {{ acme = "{acme}" }}
ttl_s = 10
"#
    )
}

/// A source of the application's, read after the file's overrides.
#[derive(Debug)]
struct Billing;

#[ratewarden::async_trait]
impl ratewarden::LimitSource for Billing {
    async fn limit(
        &self,
        customer: &str,
    ) -> Result<Option<ratewarden::CustomerLimit>, ratewarden::StoreError> {
        Ok((customer == "globex" || customer == "acme")
            .then(|| ratewarden::CustomerLimit::Plan("burst".into())))
    }
}

#[tokio::test]
async fn customer_limits_come_from_the_file_and_keep_their_usage_across_a_reload() {
    let limits = Limits::builder()
        .clock(Arc::new(ManualClock::new()))
        .customer_source("api", Arc::new(Billing))
        .parse(&with_customers("pro"), "limits.toml")
        .await
        .unwrap();
    let api = limits.customers("api").unwrap();
    let acme = api.resolve(Some("acme")).await;
    assert_eq!(&*acme.name, "plan:pro", "the file's override comes first");
    assert_eq!(&*api.resolve(Some("globex")).await.name, "plan:burst");
    assert_eq!(&*api.resolve(Some("initech")).await.name, "plan:free");
    for _ in 0..3 {
        assert!(acme.limiter.check(b"acme").await.allowed);
    }
    // Moved to limits of its own by a reload: the three already counted
    // stay counted (same rule, same algorithm).
    let limits = limits
        .reload_from(&with_customers("fixed_window 4/minute"))
        .await
        .unwrap();
    let acme = limits.customers("api").unwrap().resolve(Some("acme")).await;
    assert_eq!(&*acme.name, "own:fixed_window 4/min");
    assert_eq!(acme.limiter.check(b"acme").await.remaining, 0);
    assert!(!acme.limiter.check(b"acme").await.allowed);

    // Errors name their line.
    for (text, expected) in [
        (
            with_customers("platinum"),
            "line 11, column 22: `overrides = { acme = \"platinum\" }`: neither a plan (burst, free, pro) nor limits of its own",
        ),
        (
            with_customers("pro").replace("default = \"free\"", "default = \"gold\""),
            "line 9, column 11: `default = \"gold\"`: the default plan \"gold\" is not one of the plans (burst, free, pro)",
        ),
        (
            with_customers("pro").replace("[customers.api]", "[customers.search]"),
            "customers \"search\" count in rule \"search\", as limit \"search\" does",
        ),
    ] {
        let err = parse(&text).await.unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
    }
}
