//! The demo server: six rate-limited endpoints of a small web site, each
//! limited per client. The first three take their limits from flags (or a
//! `--config` file):
//!
//! | endpoint | limit |
//! |---|---|
//! | `POST /api/feedback` | 5 per hour |
//! | `POST /api/contact` | 10 per day |
//! | `GET /api/search` | 60 per minute |
//!
//! `POST /api/login` (password `demo`, as a form field: `-d password=demo`)
//! counts only failed attempts: 5 per 15 minutes, a success spends nothing
//! ([`LOGIN_FAILURES`]).
//!
//! `POST /api/checkout` allows 10 payments an hour, and a declined card
//! (`-d card=declined`) costs 5 of them: the request, then a penalty of 4
//! once the payment has failed ([`CHECKOUTS`], [`DECLINE_PENALTY`]).
//!
//! `GET /api/reports` has a limit per plan: 10 a minute on the free plan,
//! 100 with an API key of the pro plan ([`plans`]).
//!
//! Beside them, `GET /api/quota[?route=NAME]` tells a client its quota on
//! one route (`search` unless named) without spending it, and, only when
//! the server is given an admin token, `POST /admin/reset?client=ADDR
//! [&route=NAME]` lets an operator lift a client's limits ([`admin`]).
//! `GET /health` and, from the binary, `GET /metrics` ([`prometheus`]) are
//! not limited.
//!
//! The binary (`cargo run -p ratewarden-demo -- --help`) parses its flags with
//! [`cli`] into a [`Config`], loads the `--config` file if one is named
//! ([`load_limits`]: `ratewarden::config`, reloaded on `SIGHUP`) and serves
//! [`app`]. Tests build [`app`] directly with a manual clock and their own
//! stores.

// About 780 lines: one program's wiring (its limits, flags, stores and
// routes), kept where a reader of the demo looks for it; the admin, plans,
// metrics and server parts are modules of their own.

pub mod admin;
pub mod plans;
pub mod prometheus;
pub mod server;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get, post};
use clap::{Arg, ArgAction, ArgMatches, Command, value_parser};
use ratewarden::customers::CustomerLayer;
use ratewarden::lease::{LEASE_ALGORITHMS, LeaseConfig, LeasedStore};
use ratewarden::memory::MemoryStore;
use ratewarden::store::DEFAULT_MEMORY_CAPACITY;
use ratewarden::{
    AddressSource, ClientIdentity, Clock, ConfigError, CustomerLimits, FailurePolicy, Limiter,
    Plans, Policy, RateLimitLayer, RateLimitLayerBuilder, Rule, Store,
};

/// The limits of the three routes the flags set (feedback, contact and
/// search): a count per window for each, as the
/// flags give them, unless [`policies`](FlagLimits::policies) gives the route a
/// policy in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagLimits {
    /// `POST /api/feedback` requests per hour.
    pub feedback_per_hour: u32,
    /// `POST /api/contact` requests per day.
    pub contact_per_day: u32,
    /// `GET /api/search` requests per minute.
    pub search_per_minute: u32,
    /// Policies in full (any algorithm, window or burst); a route given
    /// one here uses it instead of its count above.
    pub policies: RoutePolicies,
    /// The routes whose count came from a flag or the environment: the
    /// `--config` file does not decide them.
    pub flagged: Flagged,
}

/// Which routes' counts were given as flags (or environment variables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flagged {
    /// `--feedback-per-hour`.
    pub feedback: bool,
    /// `--contact-per-day`.
    pub contact: bool,
    /// `--search-per-minute`.
    pub search: bool,
}

impl Flagged {
    /// Whether the route `name`'s count was flagged.
    pub fn route(&self, name: &str) -> bool {
        match name {
            "feedback" => self.feedback,
            "contact" => self.contact,
            "search" => self.search,
            _ => false,
        }
    }
}

/// A policy for each route that has one of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoutePolicies {
    /// `POST /api/feedback`.
    pub feedback: Option<Policy>,
    /// `POST /api/contact`.
    pub contact: Option<Policy>,
    /// `GET /api/search`.
    pub search: Option<Policy>,
}

impl Default for FlagLimits {
    /// The built-in limits: 5 per hour, 10 per day, 60 per minute.
    fn default() -> Self {
        FlagLimits {
            feedback_per_hour: 5,
            contact_per_day: 10,
            search_per_minute: 60,
            policies: RoutePolicies::default(),
            flagged: Flagged::default(),
        }
    }
}

/// One limited endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The rule name, shown in the `RateLimit-Policy` header.
    pub name: &'static str,
    /// The HTTP method.
    pub method: &'static str,
    /// The path.
    pub path: &'static str,
    /// Its policy.
    pub policy: Policy,
}

const HOUR: Duration = Duration::from_secs(3600);

/// `POST /api/login`: failed attempts allowed per client, per 15 minutes.
pub const LOGIN_FAILURES: u32 = 5;

/// `POST /api/login`'s ban: a client refused twice in 15 minutes is banned
/// for an hour, four times longer on each repeat, up to a day.
pub const LOGIN_BAN: &str = "ban after 2 in 15min for 1h growing x4 up to 1d";

/// `policy` with [`LOGIN_BAN`].
fn login_ban(policy: Policy) -> Result<Policy, ConfigError> {
    format!("{policy} {LOGIN_BAN}")
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("{e}")))
}

/// `POST /api/login`'s policy on `stores`: it counts only failures, so a
/// right password spends nothing, a client that guesses is locked out after
/// [`LOGIN_FAILURES`], and one that keeps guessing is banned
/// ([`LOGIN_BAN`]) where the store keeps bans.
pub fn login_policy(stores: &Stores) -> Result<Policy, ConfigError> {
    let policy = Policy::fixed_window(LOGIN_FAILURES, 15 * MINUTE)?;
    let banned = login_ban(policy)?;
    Ok(if stores.deciding(&banned).capabilities().bans {
        banned
    } else {
        policy
    })
}

const DAY: Duration = Duration::from_secs(86_400);
const MINUTE: Duration = Duration::from_secs(60);

impl FlagLimits {
    /// The three flag-limited endpoints with these limits: a route's own
    /// policy, else a sliding-window log of its count (exact: no burst at a
    /// window's edge).
    /// Refuses a count the log cannot represent (zero, or above its
    /// maximum).
    pub fn endpoints(&self) -> Result<[Endpoint; 3], ConfigError> {
        let policy = |own: Option<Policy>, count: u32, window: Duration| match own {
            Some(p) => Ok(p),
            None => Policy::sliding_log(count, window),
        };
        Ok([
            Endpoint {
                name: "feedback",
                method: "POST",
                path: "/api/feedback",
                policy: policy(self.policies.feedback, self.feedback_per_hour, HOUR)?,
            },
            Endpoint {
                name: "contact",
                method: "POST",
                path: "/api/contact",
                policy: policy(self.policies.contact, self.contact_per_day, DAY)?,
            },
            Endpoint {
                name: "search",
                method: "GET",
                path: "/api/search",
                policy: policy(self.policies.search, self.search_per_minute, MINUTE)?,
            },
        ])
    }
}

/// Where the counters live.
#[derive(Debug, Clone)]
pub struct Stores {
    /// The store every decision goes to (memory by default, or a shared
    /// Redis/Postgres store).
    pub primary: Arc<dyn Store>,
    /// With `--tiered`: an in-process store consulted first. It refuses an
    /// over-limit client without a network call; only requests it admits
    /// reach the shared store, which holds the limit across processes.
    pub local_tier: Option<Arc<dyn Store>>,
    /// With `--lease UNITS`: the shared store bought in batches
    /// ([`LeasedStore`]), deciding the routes whose policy a lease is sound
    /// for (fixed and sliding windows); the others go to `primary`.
    /// Handed back to the shared store at shutdown
    /// ([`LeasedStore::release`]).
    pub leased: Option<Arc<LeasedStore>>,
}

impl Stores {
    /// The store that decides `policy`: the lease when there is one and it
    /// is sound for the policy's algorithm, else the primary store.
    pub fn deciding(&self, policy: &Policy) -> Arc<dyn Store> {
        match &self.leased {
            // A lease cannot count a ban's refusals: those policies decide
            // in the shared store.
            Some(leased)
                if LEASE_ALGORITHMS.contains(&policy.algorithm()) && policy.ban().is_none() =>
            {
                leased.clone()
            }
            _ => self.primary.clone(),
        }
    }
}

/// Everything [`app`] needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Per-endpoint limits.
    pub limits: FlagLimits,
    /// The stores.
    pub stores: Stores,
    /// How clients are identified.
    pub identity: ClientIdentity,
    /// The clock every decision reads (a `ManualClock` in tests).
    pub clock: Arc<dyn Clock>,
    /// What a failing store answers.
    pub on_failure: FailurePolicy,
    /// The token `POST /admin/reset` requires; without one the route does
    /// not exist.
    pub admin_token: Option<admin::AdminToken>,
    /// The API keys that put a caller on the pro plan of `GET /api/reports`.
    pub api_keys: plans::ApiKeys,
    /// The `--config` file's limits ([`load_limits`]): a route it names
    /// takes its limit from there unless a flag gave the route's count.
    pub file: Option<FileLimits>,
    /// The routes (among [`ROUTES`]) whose limits are in shadow mode
    /// (`--shadow`): decided and counted, never refused.
    pub shadow: Vec<String>,
}

/// The names of the demo's six limited routes, as `--shadow` and the
/// `RateLimit` header name them.
pub const ROUTES: [&str; 6] = [
    "feedback", "contact", "search", "login", "reports", "checkout",
];

/// The limits of a `--config` file, built by [`ratewarden::config`] on the
/// demo's stores: `default`, the store `--store` names, and with
/// `--tiered`, `local`, the memory tier in front of it. The file may open
/// stores of its own under `[stores]`.
///
/// ```toml
/// # A bare policy: the demo's own composition (tier, lease, --fail-closed).
/// [limits.search]
/// policy = "gcra 2/s burst 30"
///
/// # Anything more: the rules as written.
/// [limits.feedback]
/// rules = [{ store = "local", policy = "5/hour" }, { store = "default", policy = "5/hour", on_failure = "closed" }]
/// ```
///
/// The limits it may name are the routes': `feedback`, `contact` and
/// `search`; `[routes]` is refused, since the demo's routes are its own.
pub type FileLimits = ratewarden::config::Limits;

/// The routes a `--config` file may give limits to.
pub const FILE_ROUTES: [&str; 3] = ["feedback", "contact", "search"];

/// Loads the `--config` file at `path` on `stores` (see [`FileLimits`]),
/// refusing limits for anything but [`FILE_ROUTES`].
pub async fn load_limits(
    path: &std::path::Path,
    stores: &Stores,
    clock: Arc<dyn Clock>,
) -> Result<FileLimits, ConfigError> {
    let mut builder = FileLimits::builder()
        .store(ratewarden::config::DEFAULT_STORE, stores.primary.clone())
        .clock(clock);
    if let Some(local) = &stores.local_tier {
        builder = builder.store("local", local.clone());
    }
    let limits = builder.load(path).await?;
    check_names(&limits, path)?;
    Ok(limits)
}

/// Refuses limits for anything but [`FILE_ROUTES`], and `[routes]`.
pub fn check_names(limits: &FileLimits, path: &std::path::Path) -> Result<(), ConfigError> {
    if let Some((name, _)) = limits
        .limiters()
        .find(|(name, _)| !FILE_ROUTES.contains(name))
    {
        return Err(ConfigError::Invalid(format!(
            "{}: no route of the demo is named {name:?}; limits are for {}",
            path.display(),
            FILE_ROUTES.join(", ")
        )));
    }
    if limits.routes().next().is_some() {
        return Err(ConfigError::Invalid(format!(
            "{}: [routes] is not for the demo, whose routes are its own; name the limits {}",
            path.display(),
            FILE_ROUTES.join(", ")
        )));
    }
    Ok(())
}

/// The demo's router: the six limited endpoints, each with its own rate
/// limit (one [`RateLimitLayer`] per route), `GET /api/quota`, `POST
/// /admin/reset` when an admin token is set, and an unlimited `GET /health`.
/// The binary adds `GET /metrics`.
///
/// Policies are [`FlagLimits::endpoints`]'. Refuses limits they cannot
/// represent.
pub fn app(settings: &Settings) -> Result<Router, ConfigError> {
    let mut router = Router::new().route("/health", get(|| async { "ok\n" }));
    let mut layers = Vec::new();
    for mut endpoint in settings.limits.endpoints()? {
        let from_file = settings
            .file
            .as_ref()
            .filter(|_| !settings.limits.flagged.route(endpoint.name));
        let limiter = match from_file {
            Some(file) => match (file.bare_policy(endpoint.name), file.limiter(endpoint.name)) {
                (Some(policy), _) => {
                    endpoint.policy = policy;
                    limiter(settings, &endpoint)?
                }
                (None, Some(limiter)) => shadowed(settings, endpoint.name, limiter)?,
                (None, None) => limiter(settings, &endpoint)?,
            },
            None => limiter(settings, &endpoint)?,
        };
        let layer = route_layer(settings, limiter).build()?;
        let handler: MethodRouter = match endpoint.name {
            "feedback" => post(|| async { json(r#"{"status":"received"}"#) }),
            "contact" => post(|| async { json(r#"{"status":"sent"}"#) }),
            _ => get(|| async { json(r#"{"results":[]}"#) }),
        };
        // `route_layer`, not `layer`: a request for another method (a GET
        // of a POST endpoint, a CORS preflight) is answered 405 by the
        // router and never charged to the client's quota.
        router = router.route(endpoint.path, handler.route_layer(layer.clone()));
        layers.push((endpoint.name, admin::Limited::Layer(layer)));
    }
    let login = Endpoint {
        name: "login",
        method: "POST",
        path: "/api/login",
        policy: login_policy(&settings.stores)?,
    };
    if login.policy.ban().is_none() {
        tracing::info!(
            store = settings.stores.primary.name(),
            "the store keeps no bans: POST /api/login is limited without one"
        );
    }
    let layer = route_layer(settings, limiter(settings, &login)?)
        .count_only(|status| status == StatusCode::UNAUTHORIZED)
        .build()?;
    router = router.route(login.path, post(check_password).route_layer(layer.clone()));
    layers.push((login.name, admin::Limited::Layer(layer)));
    // The customer the authentication middleware found chooses the limit:
    // a plan, or a limit of its own; every limit counts in the rule
    // `reports`, composed as the other routes' are.
    let mut reports = CustomerLimits::builder("reports", settings.stores.primary.clone())
        .shared_clock(settings.clock.clone())
        .source(settings.api_keys.limits());
    for (plan, text) in plans::REPORT_PLANS {
        reports = reports.plan(plan, text);
    }
    let composed = settings.clone();
    let reports = reports
        .limiter_with(move |policies| match policies {
            [policy] => limiter(
                &composed,
                &Endpoint {
                    name: "reports",
                    method: "GET",
                    path: "/api/reports",
                    policy: *policy,
                },
            ),
            _ => Err(ConfigError::Invalid(
                "a limit of /api/reports is one policy".into(),
            )),
        })
        .build()?;
    let base = settings.clone();
    let layer = CustomerLayer::new(
        reports,
        |parts| {
            parts
                .extensions
                .get::<plans::Customer>()
                .map(|c| c.0.clone())
        },
        move |limiter| route_layer(&base, limiter).build(),
    )?;
    let handler = get(|| async { json(r#"{"reports":[]}"#) });
    router = router.route("/api/reports", handler.route_layer(layer.clone()));
    layers.push(("reports", admin::Limited::Customers(layer)));
    // Checkout: a declined card is charged more once the payment fails,
    // a penalty the application decides after the request was admitted.
    let checkout = Endpoint {
        name: "checkout",
        method: "POST",
        path: "/api/checkout",
        policy: Policy::fixed_window(CHECKOUTS, HOUR)?,
    };
    let layer = route_layer(settings, limiter(settings, &checkout)?).build()?;
    let handler = post(pay).with_state(layer.clone());
    router = router.route(checkout.path, handler.route_layer(layer.clone()));
    layers.push((checkout.name, admin::Limited::Layer(layer)));
    let routes = admin::Routes::new(layers, settings.identity.clone());
    router = router.route("/api/quota", get(admin::quota).with_state(routes.clone()));
    if let Some(token) = &settings.admin_token {
        router = router.route(
            "/admin/reset",
            post(admin::reset).with_state((routes, token.clone())),
        );
    }
    // In front of every route, as an application's authentication would
    // be, so that `/api/quota?route=reports` sees the caller's plan too.
    Ok(router.layer(axum::middleware::from_fn_with_state(
        settings.api_keys.clone(),
        plans::authenticate,
    )))
}

/// `POST /api/checkout`: payments allowed per client, per hour.
pub const CHECKOUTS: u32 = 10;

/// What a declined payment costs on top of the request itself
/// ([`RateLimitLayer::penalize`]): a declined card spends
/// `1 + DECLINE_PENALTY` of [`CHECKOUTS`].
pub const DECLINE_PENALTY: u32 = 4;

/// The demo's payment: the card `declined` (`-d card=declined`) is
/// declined with `402`, and its client charged [`DECLINE_PENALTY`] more;
/// any other is paid.
async fn pay(
    axum::extract::State(layer): axum::extract::State<RateLimitLayer>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 4096).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            json(r#"{"error":"body_too_large"}"#),
        )
            .into_response();
    };
    if !body
        .split(|&b| b == b'&')
        .any(|field| field == b"card=declined")
    {
        return (StatusCode::OK, json(r#"{"status":"paid"}"#)).into_response();
    }
    let mut response = (
        StatusCode::PAYMENT_REQUIRED,
        json(r#"{"error":"card_declined"}"#),
    )
        .into_response();
    // The headers then say what the penalty left, not what the admission
    // did.
    match layer.penalize_and_peek(&parts, DECLINE_PENALTY).await {
        Ok(Some(after)) => {
            response.extensions_mut().insert(after);
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "checkout: the decline's penalty was not recorded"),
    }
    response
}

/// The demo's one account: the password `demo`, sent as the form field
/// `password`.
async fn check_password(body: String) -> impl IntoResponse {
    if body.split('&').any(|field| field == "password=demo") {
        (StatusCode::OK, json(r#"{"status":"welcome"}"#)).into_response()
    } else {
        (
            StatusCode::UNAUTHORIZED,
            json(r#"{"error":"wrong_password"}"#),
        )
            .into_response()
    }
}

fn json(body: &'static str) -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], body)
}

/// A route's layer as every route of the demo has it: the shadow header on,
/// and the `--config` file's `[access]` lists, so that a reload changes them.
fn route_layer(settings: &Settings, plans: impl Into<Plans>) -> RateLimitLayerBuilder {
    let builder = RateLimitLayer::builder(plans, settings.identity.clone()).shadow_header();
    match &settings.file {
        Some(file) => builder.access(file.access().clone()),
        None => builder,
    }
}

fn limiter(settings: &Settings, endpoint: &Endpoint) -> Result<Limiter, ConfigError> {
    let policy = endpoint.policy;
    let shadow = settings.shadow.iter().any(|r| r == endpoint.name);
    let mut builder = Limiter::builder().shared_clock(settings.clock.clone());
    if let Some(local) = &settings.stores.local_tier {
        let name = format!("{}-local", endpoint.name);
        builder = builder.rule(
            Rule::new(name, local.clone(), policy)?
                .on_failure(settings.on_failure)
                .with_shadow(shadow),
        );
    }
    builder
        .rule(
            Rule::new(endpoint.name, settings.stores.deciding(&policy), policy)?
                .on_failure(settings.on_failure)
                .with_shadow(shadow),
        )
        .build()
}

/// `limiter`, a `--config` file's, with its rules in shadow mode when
/// `--shadow` names its route; the file's own `shadow` keys otherwise.
fn shadowed(settings: &Settings, route: &str, limiter: &Limiter) -> Result<Limiter, ConfigError> {
    if !settings.shadow.iter().any(|r| r == route) {
        return Ok(limiter.clone());
    }
    Limiter::builder()
        .shared_clock(limiter.clock().clone())
        .rules(limiter.rules().iter().map(|r| r.clone().with_shadow(true)))
        .build()
}

/// The command line. Every flag can also come from the environment
/// variable named in its help.
///
/// FlagLimits come, for each route, from the first of: its flag on the command
/// line, its environment variable, the `--config` file, the built-in
/// default.
pub fn cli() -> Command {
    let defaults = FlagLimits::default();
    Command::new("ratewarden-demo")
        .about("Six rate-limited endpoints (POST /api/feedback, /api/contact, /api/login and /api/checkout; GET /api/search and /api/reports), GET /api/quota, POST /admin/reset with an admin token, GET /health and GET /metrics")
        .arg(
            Arg::new("config")
                .long("config")
                .env("RATEWARDEN_CONFIG")
                .value_name("FILE")
                .value_parser(value_parser!(PathBuf))
                .help("TOML file of limits for the routes feedback, contact and search ([limits.search] policy = \"60/minute\"; see ratewarden::config), reloaded on SIGHUP; a route's --*-per-* flag overrides it"),
        )
        .arg(
            Arg::new("listen")
                .long("listen")
                .env("RATEWARDEN_LISTEN")
                .value_name("ADDR")
                .default_value("127.0.0.1:3000")
                .value_parser(value_parser!(SocketAddr))
                .help("Address to listen on"),
        )
        .arg(
            Arg::new("store")
                .long("store")
                .env("RATEWARDEN_STORE")
                .value_name("URL")
                .default_value("memory://")
                .help("Store URL: memory://[?capacity=N], redis://…, postgres://… (the last two need the demo's redis/postgres features)"),
        )
        .arg(
            Arg::new("tiered")
                .long("tiered")
                .env("RATEWARDEN_TIERED")
                .action(ArgAction::SetTrue)
                .help("Put an in-process memory tier in front of the shared --store"),
        )
        .arg(
            Arg::new("lease")
                .long("lease")
                .env("RATEWARDEN_LEASE")
                .value_name("UNITS")
                .value_parser(value_parser!(u32))
                .help("Buy the shared --store's units in batches of up to UNITS, for the routes on a fixed or sliding window without a ban: checkout, and search, feedback or contact when --config puts them on one (login keeps its ban, which only the shared store can count)"),
        )
        .arg(
            Arg::new("secret")
                .long("secret")
                .env("RATEWARDEN_SECRET")
                .value_name("SECRET")
                .hide_env_values(true)
                .help("Secret for client keys, at least 32 bytes (default: random for this process)"),
        )
        .arg(
            Arg::new("client-address")
                .long("client-address")
                .env("RATEWARDEN_CLIENT_ADDRESS")
                .value_name("SOURCE")
                .default_value("peer")
                .help("Where client addresses come from: peer, x-forwarded-for:N, forwarded:N (N trusted proxy hops) or header:NAME"),
        )
        .arg(
            Arg::new("ipv6-prefix")
                .long("ipv6-prefix")
                .env("RATEWARDEN_IPV6_PREFIX")
                .value_name("BITS")
                .default_value("64")
                .value_parser(value_parser!(u8))
                .help("Group IPv6 clients by this prefix length (1-128)"),
        )
        .arg(
            Arg::new("admin-token")
                .long("admin-token")
                .env("RATEWARDEN_ADMIN_TOKEN")
                .value_name("TOKEN")
                .hide_env_values(true)
                .help("Serve POST /admin/reset, authorized by this bearer token (at least 16 bytes); without a token the route does not exist. Prefer the environment variable or --admin-token-file: a flag's value shows in `ps`"),
        )
        .arg(
            Arg::new("admin-token-file")
                .long("admin-token-file")
                .env("RATEWARDEN_ADMIN_TOKEN_FILE")
                .value_name("PATH")
                .value_parser(value_parser!(PathBuf))
                .conflicts_with("admin-token")
                .help("Read the --admin-token from this file (surrounding whitespace and the final newline are ignored)"),
        )
        .arg(
            Arg::new("api-key")
                .long("api-key")
                .env("RATEWARDEN_API_KEYS")
                .value_name("KEY=PLAN|LIMIT")
                .action(ArgAction::Append)
                .value_delimiter(',')
                .hide_env_values(true)
                .help("An API key (at least 16 bytes) and its customer's limit on GET /api/reports, sent as X-Api-Key: a plan (free or pro) or a policy of its own ('gcra 5/s burst 30'); repeat for more, or comma-separate them in the environment"),
        )
        .arg(
            Arg::new("shadow")
                .long("shadow")
                .env("RATEWARDEN_SHADOW")
                .value_name("ROUTE")
                .action(ArgAction::Append)
                .value_delimiter(',')
                .help("Put a route's limit in shadow mode (feedback, contact, search, login, reports or checkout): decided and counted, never refused; a response it would have refused carries X-RateLimit-Shadow: refused and counts in /metrics as outcome=\"shadow_refused\". Repeat for more, or comma-separate them"),
        )
        .arg(
            Arg::new("fail-closed")
                .long("fail-closed")
                .env("RATEWARDEN_FAIL_CLOSED")
                .action(ArgAction::SetTrue)
                .help("Refuse requests when the store fails (default: admit them)"),
        )
        .arg(limit_arg("feedback-per-hour", "RATEWARDEN_FEEDBACK_PER_HOUR", defaults.feedback_per_hour))
        .arg(limit_arg("contact-per-day", "RATEWARDEN_CONTACT_PER_DAY", defaults.contact_per_day))
        .arg(limit_arg("search-per-minute", "RATEWARDEN_SEARCH_PER_MINUTE", defaults.search_per_minute))
}

fn limit_arg(name: &'static str, env: &'static str, default: u32) -> Arg {
    Arg::new(name)
        .long(name)
        .env(env)
        .value_name("N")
        .value_parser(value_parser!(u32))
        .help(format!(
            "Limit: {} [default: {default}]",
            name.replace('-', " ")
        ))
}

/// Turns "needs the `redis` feature of the ratewarden crate" into advice for
/// this binary, whose own `redis`/`postgres` features turn the limiter's on.
fn with_feature_hint(error: ConfigError) -> ConfigError {
    match error {
        ConfigError::InvalidUrl { url, reason } => {
            let feature = reason
                .split_once("needs the `")
                .and_then(|(_, rest)| rest.split_once('`'))
                .map(|(feature, _)| feature.to_owned());
            let reason = match feature {
                Some(f) => format!("{reason}: cargo run -p ratewarden-demo --features {f} -- …"),
                None => reason,
            };
            ConfigError::InvalidUrl { url, reason }
        }
        other => other,
    }
}

/// The `--shadow` routes, refusing a name that is not one of [`ROUTES`].
fn shadow_routes<'a>(names: impl Iterator<Item = &'a String>) -> Result<Vec<String>, ConfigError> {
    names
        .map(|name| {
            let name = name.trim();
            match ROUTES.contains(&name) {
                true => Ok(name.to_owned()),
                false => Err(ConfigError::Invalid(format!(
                    "--shadow {name:?}: no limited route has that name; the routes are {}",
                    ROUTES.join(", ")
                ))),
            }
        })
        .collect()
}

/// Memory stores by role, for their statistics.
pub type MemoryStores = Vec<(&'static str, Arc<MemoryStore>)>;

/// The capacity a `memory://` URL that [`ratewarden::store::from_url`]
/// accepted asks for; `None` for another scheme.
fn memory_capacity(url: &str) -> Option<usize> {
    let url = ratewarden::url::Url::parse(url).ok()?;
    if !ratewarden::store::MEMORY_SCHEMES.contains(&url.scheme()) {
        return None;
    }
    let capacity = url
        .query_pairs()
        .find(|(name, _)| name == "capacity")
        .and_then(|(_, value)| value.parse().ok());
    Some(capacity.unwrap_or(DEFAULT_MEMORY_CAPACITY))
}

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The store URL.
    pub store: String,
    /// Put memory in front of the store.
    pub tiered: bool,
    /// Buy the shared store's units in batches of up to this many.
    pub lease: Option<u32>,
    /// The secret, if one was given.
    pub secret: Option<String>,
    /// The client address source.
    pub address_source: AddressSource,
    /// The IPv6 grouping prefix.
    pub ipv6_prefix: u8,
    /// What a failing store answers.
    pub on_failure: FailurePolicy,
    /// The limits.
    pub limits: FlagLimits,
    /// The limits file ([`load_limits`]), if one was given.
    pub config_file: Option<PathBuf>,
    /// The admin token, if one was given.
    pub admin_token: Option<admin::AdminToken>,
    /// The API keys given, and their plans.
    pub api_keys: plans::ApiKeys,
    /// The routes in shadow mode (`--shadow`), each one of [`ROUTES`].
    pub shadow: Vec<String>,
}

impl Config {
    /// Reads parsed arguments, and the `--config` file if one is named.
    /// Refuses an invalid address source and a bad file (naming it, and the
    /// offending line).
    pub fn from_matches(m: &ArgMatches) -> Result<Self, ConfigError> {
        let get = |name: &str| m.get_one::<String>(name).cloned();
        let defaults = FlagLimits::default();
        let limit = |name: &str, default: u32| m.get_one::<u32>(name).copied().unwrap_or(default);
        let config_file = m.get_one::<PathBuf>("config").cloned();
        // A count given as a flag or in the environment overrides the file.
        let given = |name: &str| m.get_one::<u32>(name).is_some();
        let flagged = Flagged {
            feedback: given("feedback-per-hour"),
            contact: given("contact-per-day"),
            search: given("search-per-minute"),
        };
        Ok(Config {
            listen: m
                .get_one::<SocketAddr>("listen")
                .copied()
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 3000))),
            store: get("store").unwrap_or_else(|| "memory://".into()),
            tiered: m.get_flag("tiered"),
            lease: m.get_one::<u32>("lease").copied(),
            secret: get("secret"),
            address_source: get("client-address")
                .unwrap_or_else(|| "peer".into())
                .parse()?,
            ipv6_prefix: m.get_one::<u8>("ipv6-prefix").copied().unwrap_or(64),
            on_failure: if m.get_flag("fail-closed") {
                FailurePolicy::Closed
            } else {
                FailurePolicy::Open
            },
            limits: FlagLimits {
                feedback_per_hour: limit("feedback-per-hour", defaults.feedback_per_hour),
                contact_per_day: limit("contact-per-day", defaults.contact_per_day),
                search_per_minute: limit("search-per-minute", defaults.search_per_minute),
                policies: RoutePolicies::default(),
                flagged,
            },
            config_file,
            admin_token: match m.get_one::<PathBuf>("admin-token-file") {
                Some(path) => Some(admin::AdminToken::from_file(path)?),
                None => get("admin-token")
                    .map(|t| admin::AdminToken::new(&t))
                    .transpose()?,
            },
            api_keys: plans::ApiKeys::parse(
                m.get_many::<String>("api-key")
                    .into_iter()
                    .flatten()
                    .map(String::as_str),
            )?,
            shadow: shadow_routes(m.get_many::<String>("shadow").into_iter().flatten())?,
        })
    }

    /// The client identity, with the given secret or
    /// [`ClientIdentity::random`] when none was given. Refuses a short secret and a bad prefix, and a missing secret
    /// when `shared` (the store is shared by a fleet): each instance would
    /// draw its own random secret and derive other keys for the same
    /// client, so a fleet of N would admit N times the limit.
    pub fn identity(&self, shared: bool) -> Result<ClientIdentity, ConfigError> {
        let identity = match &self.secret {
            Some(s) => ClientIdentity::new(s.as_bytes())?,
            None if shared => {
                return Err(ConfigError::Invalid(format!(
                    "{} is shared by every instance using it, so they must derive the same \
                     client keys: give the same --secret (or RATEWARDEN_SECRET) of at least 32 \
                     bytes to each",
                    ratewarden::store::redact(&self.store)
                )));
            }
            None => ClientIdentity::random()?,
        };
        identity
            .with_source(self.address_source.clone())
            .with_ipv6_prefix(self.ipv6_prefix)
    }

    /// Opens the stores: `--store`, and with `--tiered` a memory tier in
    /// front of it. Refuses `--tiered` over a memory store, which would
    /// only count every request twice in the same process.
    pub async fn stores(&self) -> Result<Stores, ConfigError> {
        Ok(self.open_stores().await?.0)
    }

    /// [`stores`](Self::stores), with the memory stores among them by role
    /// (`primary`, `local`), whose key counts and evictions `/metrics`
    /// reports.
    pub async fn open_stores(&self) -> Result<(Stores, MemoryStores), ConfigError> {
        let primary = ratewarden::store::from_url(&self.store)
            .await
            .map_err(with_feature_hint)?;
        let mut memory = MemoryStores::new();
        // A memory store is opened again, typed, for its statistics, which
        // `dyn Store` does not expose; the URL was validated above.
        let primary = match memory_capacity(&self.store) {
            Some(capacity) => {
                let store = Arc::new(MemoryStore::new(capacity));
                memory.push(("primary", store.clone()));
                store as Arc<dyn Store>
            }
            None => primary,
        };
        let local_tier = if self.tiered {
            if !primary.capabilities().shared {
                return Err(ConfigError::Invalid(format!(
                    "--tiered puts memory in front of a shared store, but {} is not shared \
                     (use --store redis://… or postgres://…)",
                    ratewarden::store::redact(&self.store)
                )));
            }
            let store = Arc::new(MemoryStore::new(DEFAULT_MEMORY_CAPACITY));
            memory.push(("local", store.clone()));
            Some(store as Arc<dyn Store>)
        } else {
            None
        };
        let leased = match self.lease {
            Some(_) if !primary.capabilities().shared => {
                return Err(ConfigError::Invalid(format!(
                    "--lease buys units of a shared store in batches, but {} is not shared \
                     (use --store redis://… or postgres://…)",
                    ratewarden::store::redact(&self.store)
                )));
            }
            Some(units) => Some(Arc::new(LeasedStore::new(
                primary.clone(),
                LeaseConfig::new(units)?,
            ))),
            None => None,
        };
        Ok((
            Stores {
                primary,
                local_tier,
                leased,
            },
            memory,
        ))
    }
}
