//! `ShouldRateLimit` as Envoy calls it: a tonic client over a real socket
//! to a server started from a YAML file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use ratewarden::FailurePolicy;
use ratewarden_server::{Options, ReloadHandle, Server};
use tokio::sync::oneshot;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A file no other test writes.
fn config_file(yaml: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "ratewarden-server-{}-{}.yaml",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A domain name no other test (or earlier run on a shared Redis) uses.
fn unique_domain(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

struct Running {
    grpc: SocketAddr,
    http: SocketAddr,
    reload: ReloadHandle,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), ratewarden_server::StartError>>,
}

impl Running {
    async fn start(options: Options) -> Running {
        let server = Server::bind(options).await.unwrap();
        let (grpc, http, reload) = (
            server.grpc_addr(),
            server.http_addr(),
            server.reload_handle(),
        );
        let (stop, stopped) = oneshot::channel();
        let done = tokio::spawn(server.serve(async move {
            let _ = stopped.await;
        }));
        Running {
            grpc,
            http,
            reload,
            stop: Some(stop),
            done,
        }
    }

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.done.await.unwrap().unwrap();
    }
}

fn options(yaml: &str) -> Options {
    let mut options = Options::new(config_file(yaml));
    options.grpc = "127.0.0.1:0".parse().unwrap();
    options.http = "127.0.0.1:0".parse().unwrap();
    options.watch = None;
    options
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// The overall codes of `n` requests of one descriptor.
async fn codes(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    n: usize,
) -> Vec<i32> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            ask(client, request(domain, vec![descriptor(entries)]))
                .await
                .overall_code,
        );
    }
    out
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

const EDGE: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit: { name: login, unit: hour, requests_per_unit: 2, algorithm: sliding_window }
  - key: path
    value: /static/*
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: path
    descriptors:
      - key: remote_address
        rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: api_key
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: source_cluster
    value: internal
    rate_limit: { unlimited: true }
";

#[tokio::test]
async fn descriptors_match_exact_values_prefixes_any_value_and_nested_entries() {
    let server = Running::start(options(EDGE)).await;
    let mut c = server.client().await;

    // Any value of remote_address: 3 a minute, each address apart.
    let a = [("remote_address", "10.0.0.1")];
    assert_eq!(codes(&mut c, "edge", &a, 4).await, [OK, OK, OK, OVER]);
    let b = [("remote_address", "10.0.0.2")];
    assert_eq!(codes(&mut c, "edge", &b, 1).await, [OK]);

    // An exact value, then a nested entry: the login limit, not the
    // address's (which is spent) nor any path's (4).
    let login = [("path", "/login"), ("remote_address", "10.0.0.1")];
    assert_eq!(codes(&mut c, "edge", &login, 3).await, [OK, OK, OVER]);
    // Another path with the same address: the any-path node's 4.
    let search = [("path", "/search"), ("remote_address", "10.0.0.1")];
    assert_eq!(
        codes(&mut c, "edge", &search, 5).await,
        [OK, OK, OK, OK, OVER]
    );

    // A value ending in `*` matches by prefix; every path under it counts
    // apart (the client is the whole value).
    let css = [("path", "/static/site.css")];
    assert_eq!(codes(&mut c, "edge", &css, 2).await, [OK, OVER]);
    let js = [("path", "/static/app.js")];
    assert_eq!(codes(&mut c, "edge", &js, 1).await, [OK]);

    // Unknown descriptors, a node without a limit (`path` alone ends on
    // the any-path node, which has none), `unlimited`, an unknown domain:
    // never limited, and no current limit in their status.
    for (domain, entries) in [
        ("edge", vec![("user", "u1")]),
        ("edge", vec![("path", "/search")]),
        ("edge", vec![("remote_address", "10.0.0.1"), ("extra", "x")]),
        ("edge", vec![("source_cluster", "internal")]),
        ("elsewhere", vec![("remote_address", "10.0.0.1")]),
    ] {
        for _ in 0..5 {
            let r = ask(&mut c, request(domain, vec![descriptor(&entries)])).await;
            assert_eq!(r.overall_code, OK, "{domain} {entries:?}");
            assert_eq!(r.statuses.len(), 1);
            assert_eq!(r.statuses[0].current_limit, None, "{entries:?}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn each_descriptor_gets_a_status_and_one_over_limit_makes_the_request_over_limit() {
    let server = Running::start(options(EDGE)).await;
    let mut c = server.client().await;
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.0.0.9")]),
                descriptor(&[("path", "/login"), ("remote_address", "10.0.0.9")]),
                descriptor(&[("user", "nobody")]),
            ],
        )
    };
    let first = ask(&mut c, both()).await;
    assert_eq!(first.overall_code, OK);
    let [address, login, unknown]: [DescriptorStatus; 3] = first.statuses.try_into().unwrap();
    assert_eq!(address.code, OK);
    assert_eq!(address.limit_remaining, 2);
    let limit = address.current_limit.unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Minute as i32)
    );
    let reset = address.duration_until_reset.unwrap();
    assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    assert_eq!(login.limit_remaining, 1);
    let limit = login.current_limit.unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.unit),
        ("login", Unit::Hour as i32)
    );
    assert_eq!(unknown.code, OK);

    ask(&mut c, both()).await;
    let third = ask(&mut c, both()).await;
    assert_eq!(third.overall_code, OVER);
    let codes: Vec<i32> = third.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OK, OVER, OK]);
    server.stop().await;
}

#[tokio::test]
async fn hits_addend_is_the_cost_and_zero_asks_without_spending() {
    let yaml = "
domain: cost
descriptors:
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 5 }
";
    let server = Running::start(options(yaml)).await;
    let mut c = server.client().await;
    let tenant = || descriptor(&[("tenant", "t1")]);
    let mut r = request("cost", vec![tenant()]);
    r.hits_addend = 2;
    let remaining = |resp: RateLimitResponse| (resp.overall_code, resp.statuses[0].limit_remaining);
    assert_eq!(remaining(ask(&mut c, r.clone()).await), (OK, 3));
    assert_eq!(remaining(ask(&mut c, r.clone()).await), (OK, 1));
    assert_eq!(remaining(ask(&mut c, r.clone()).await), (OVER, 1));

    // A descriptor's own hits_addend wins over the request's; 0 reports
    // the quota and spends nothing.
    let mut peek = tenant();
    peek.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..3 {
        assert_eq!(
            remaining(ask(&mut c, request("cost", vec![peek.clone()])).await),
            (OK, 1)
        );
    }
    let mut one = tenant();
    one.hits_addend = Some(UInt64Value { value: 1 });
    let mut r = request("cost", vec![one]);
    r.hits_addend = 5;
    assert_eq!(remaining(ask(&mut c, r).await), (OK, 0));

    // A cost above the limit can never be admitted: refused, nothing spent.
    let mut huge = descriptor(&[("tenant", "t2")]);
    huge.hits_addend = Some(UInt64Value { value: 6 });
    assert_eq!(
        remaining(ask(&mut c, request("cost", vec![huge.clone()])).await),
        (OVER, 5)
    );
    huge.hits_addend = Some(UInt64Value { value: u64::MAX });
    assert_eq!(
        remaining(ask(&mut c, request("cost", vec![huge])).await),
        (OVER, 5)
    );
    server.stop().await;
}

#[tokio::test]
async fn shadow_mode_counts_and_reports_but_never_refuses() {
    let server = Running::start(options(EDGE)).await;
    let mut c = server.client().await;
    let key = [("api_key", "k1")];
    assert_eq!(codes(&mut c, "edge", &key, 3).await, [OK, OK, OK]);
    let metrics = http_get(server.http, "/metrics").await;
    let shadow = metrics
        .lines()
        .find(|l| {
            l.starts_with("ratewarden_server_descriptors_total")
                && l.contains("descriptor=\"api_key\"")
                && l.contains("code=\"shadow_over_limit\"")
        })
        .unwrap_or_else(|| panic!("no shadow series in:\n{metrics}"));
    assert!(shadow.ends_with(" 2"), "{shadow}");
    server.stop().await;
}

#[tokio::test]
async fn responses_carry_the_draft_headers_and_retry_after_on_a_refusal() {
    let server = Running::start(options(EDGE)).await;
    let mut c = server.client().await;
    let a = || request("edge", vec![descriptor(&[("remote_address", "10.1.0.1")])]);
    let first = ask(&mut c, a()).await;
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"edge.remote_address\";q=3;w=60")
    );
    let value = header(&first, "ratelimit").unwrap();
    assert!(
        value.starts_with("\"edge.remote_address\";r=2;t="),
        "{value}"
    );
    assert_eq!(header(&first, "retry-after"), None);
    ask(&mut c, a()).await;
    ask(&mut c, a()).await;
    let refused = ask(&mut c, a()).await;
    assert_eq!(refused.overall_code, OVER);
    let wait: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");

    // The legacy trio on request.
    let mut legacy = options(EDGE);
    legacy.headers = ratewarden::layer::HeaderMode::XRateLimit;
    let legacy = Running::start(legacy).await;
    let r = ask(&mut legacy.client().await, a()).await;
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    assert_eq!(header(&r, "ratelimit"), None);
    legacy.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_refused_with_invalid_argument() {
    let server = Running::start(options(EDGE)).await;
    let mut c = server.client().await;
    let cases = [
        (request("", vec![descriptor(&[("a", "b")])]), "domain"),
        (request("edge", vec![]), "descriptors"),
        (request("edge", vec![descriptor(&[])]), "no entries"),
        (
            request("edge", vec![descriptor(&[("k", &"v".repeat(5000))])]),
            "bytes",
        ),
        (
            request("edge", vec![descriptor(&[("a", "b")]); 65]),
            "at most 64 descriptors",
        ),
    ];
    for (request, says) in cases {
        let status = c.should_rate_limit(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(says), "{}", status.message());
    }
    let mut negative = descriptor(&[("remote_address", "x")]);
    negative.is_negative_hits = true;
    let status = c
        .should_rate_limit(request("edge", vec![negative]))
        .await
        .unwrap_err();
    assert!(status.message().contains("is_negative_hits"));
    server.stop().await;
}

#[tokio::test]
async fn a_file_with_what_is_not_supported_is_refused_at_load_with_its_place() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n    replaces: [{ name: x }]\n",
            "replaces",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: month, requests_per_unit: 1 }\n",
            "unit \"month\" is not supported",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limt: { unit: second, requests_per_unit: 1 }\n",
            "line 4",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second }\n",
            "needs `unit` and `requests_per_unit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, burst: 5 }\n",
            "`burst` applies to `algorithm: gcra` only",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 0 }\n",
            "limit must be at least 1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
            "defined twice",
        ),
        ("descriptors: []\n", "domain"),
    ];
    for (yaml, says) in cases {
        let err = Server::bind(options(yaml)).await.unwrap_err().to_string();
        assert!(err.contains(says), "{yaml}\n=> {err}");
        assert!(err.contains(".yaml"), "names its file: {err}");
    }
}

#[tokio::test]
async fn health_checks_and_metrics() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let server = Running::start(options(EDGE)).await;
    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    assert_eq!(http_get(server.http, "/healthcheck").await, "OK");
    let mut c = server.client().await;
    codes(&mut c, "edge", &[("remote_address", "10.9.0.1")], 4).await;
    let metrics = http_get(server.http, "/metrics").await;
    assert!(
        metrics.contains("ratewarden_server_requests_total{domain=\"edge\",code=\"over_limit\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("ratewarden_decisions_total"), "{metrics}");
    server.stop().await;
}

/// The recorder holds every histogram sample (each awaited store call's
/// latency) until upkeep folds it into the buckets: a thread of the
/// server's keeps it, so that a server nobody scrapes does not grow by
/// every call it makes.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_metrics_recorder_is_kept_with_no_scrape() {
    let server = Running::start(options(EDGE)).await;
    assert!(
        ratewarden_test_support::threads::has_thread("metrics-upkeep"),
        "{:?}",
        ratewarden_test_support::threads::thread_names()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_reload_changes_limits_and_keeps_counts_and_a_bad_file_changes_nothing() {
    let opts = options(EDGE);
    let path = opts.config.clone();
    let server = Running::start(opts).await;
    let mut c = server.client().await;
    let a = [("remote_address", "10.2.0.1")];
    assert_eq!(codes(&mut c, "edge", &a, 2).await, [OK, OK]);

    // Raised from 3 to 5 a minute: two spent, three left.
    std::fs::write(
        &path,
        EDGE.replace("requests_per_unit: 3", "requests_per_unit: 5"),
    )
    .unwrap();
    server.reload.reload().await.unwrap();
    assert_eq!(codes(&mut c, "edge", &a, 4).await, [OK, OK, OK, OVER]);

    // A file that does not load leaves the one in force.
    std::fs::write(&path, "domain: edge\ndescriptors: [ {").unwrap();
    assert!(server.reload.reload().await.is_err());
    assert_eq!(codes(&mut c, "edge", &a, 1).await, [OVER]);
    let b = [("remote_address", "10.2.0.2")];
    assert_eq!(codes(&mut c, "edge", &b, 6).await[4..], [OK, OVER]);
    server.stop().await;
}

#[tokio::test]
async fn a_changed_file_is_reloaded_while_requests_run_and_none_fails() {
    let yaml = |n: u32| {
        format!(
            "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n"
        )
    };
    let mut opts = options(&yaml(100));
    opts.watch = Some(Duration::from_millis(20));
    let path = opts.config.clone();
    let server = Running::start(opts).await;
    let traffic: Vec<_> = (0..4)
        .map(|_| {
            let grpc = server.grpc;
            tokio::spawn(async move {
                let mut c = RateLimitServiceClient::connect(format!("http://{grpc}"))
                    .await
                    .unwrap();
                let mut admitted = 0;
                for _ in 0..100 {
                    let r = c
                        .should_rate_limit(request("live", vec![descriptor(&[("k", "one")])]))
                        .await
                        .expect("every request is answered during reloads");
                    admitted += u32::from(r.into_inner().overall_code == OK);
                }
                admitted
            })
        })
        .collect();
    // Alternate 100 and 101 while the 400 requests run: the watcher
    // reloads each change (the file's length changes, so does its time).
    for i in 0..10 {
        std::fs::write(&path, yaml(100 + i % 2)).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(&path, yaml(100)).unwrap();
    let mut admitted = 0;
    for t in traffic {
        admitted += t.await.unwrap();
    }
    // Never more than the largest limit in force; usage carried across
    // every reload (a reload that lost counts would admit up to 400).
    assert!((100..=101).contains(&admitted), "{admitted}");
    let metrics = http_get(server.http, "/metrics").await;
    assert!(
        metrics.contains("ratewarden_server_config_loads_total{result=\"loaded\"}"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_fleet_of_two_servers_on_one_redis_is_exact_to_the_limit() {
    fleet_is_exact(ratewarden_test_support::redis::shared_url()).await;
}

#[tokio::test]
async fn a_fleet_of_two_servers_on_one_postgres_is_exact_to_the_limit() {
    fleet_is_exact(&ratewarden_test_support::postgres::server_url()).await;
}

/// Two servers on the store at `url`, four clients each, 80 calls for one
/// client whose limit is 25: the fleet admits exactly 25.
async fn fleet_is_exact(url: &str) {
    let domain = unique_domain("fleet");
    let yaml = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: 25, algorithm: sliding_window }}\n"
    );
    let mut fleet = Vec::new();
    for _ in 0..2 {
        let mut opts = options(&yaml);
        opts.store = Some(url.to_owned());
        fleet.push(Running::start(opts).await);
    }
    let mut tasks = Vec::new();
    for (i, server) in fleet.iter().enumerate() {
        for _ in 0..4 {
            let (grpc, domain) = (server.grpc, domain.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = RateLimitServiceClient::connect(format!("http://{grpc}"))
                    .await
                    .unwrap();
                let mut admitted = 0u32;
                for _ in 0..10 {
                    let r = ask(&mut c, request(&domain, vec![descriptor(&[("user", "u")])])).await;
                    admitted += u32::from(r.overall_code == OK);
                }
                (i, admitted)
            }));
        }
    }
    let mut per_server = [0u32; 2];
    for t in tasks {
        let (i, n) = t.await.unwrap();
        per_server[i] += n;
    }
    assert_eq!(per_server.iter().sum::<u32>(), 25, "{per_server:?}");
    assert!(
        per_server.iter().all(|&n| n > 0),
        "both served: {per_server:?}"
    );
    for server in fleet {
        server.stop().await;
    }
}

#[tokio::test]
async fn a_store_that_does_not_answer_gets_the_failure_policys_answer_in_bounded_time() {
    let (container, url) = ratewarden_test_support::redis::start_redis().await;
    let domain = unique_domain("down");
    let yaml = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: 100 }}\n"
    );
    let mut servers = Vec::new();
    for on_failure in [FailurePolicy::Open, FailurePolicy::Closed] {
        let mut opts = options(&yaml);
        opts.store = Some(url.clone());
        opts.on_failure = on_failure;
        opts.timeout = Duration::from_millis(200);
        servers.push(Running::start(opts).await);
    }
    let one = || request(&domain, vec![descriptor(&[("user", "u")])]);
    for server in &servers {
        assert_eq!(
            ask(&mut server.client().await, one()).await.overall_code,
            OK
        );
    }
    container.pause().await.unwrap();
    for (server, expect) in servers.iter().zip([OK, OVER]) {
        let mut c = server.client().await;
        for _ in 0..3 {
            // Bounded: the rule's timeout, not the paused server's silence.
            let r = tokio::time::timeout(Duration::from_secs(10), ask(&mut c, one()))
                .await
                .expect("answered while the store is paused");
            assert_eq!(r.overall_code, expect);
        }
    }
    container.unpause().await.unwrap();
    for server in servers {
        server.stop().await;
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[tokio::test]
async fn leases_cut_round_trips_and_a_shutdown_hands_unspent_units_back() {
    let url = ratewarden_test_support::redis::shared_url();
    let domain = unique_domain("lease");
    let yaml = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: 40 }}\n"
    );
    let one = || request(&domain, vec![descriptor(&[("user", "u")])]);
    let mut leased = options(&yaml);
    leased.store = Some(url.to_owned());
    leased.lease = Some(10);
    let leased = Running::start(leased).await;
    let mut c = leased.client().await;
    for _ in 0..4 {
        assert_eq!(ask(&mut c, one()).await.overall_code, OK);
    }
    // A server without leases sees what the store holds: batches of 1, 2
    // and 4 bought for four requests (three round trips), 3 units still
    // in the other server's hand.
    let mut plain = options(&yaml);
    plain.store = Some(url.to_owned());
    let plain = Running::start(plain).await;
    let mut p = plain.client().await;
    let mut peek = descriptor(&[("user", "u")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let remaining = |r: RateLimitResponse| r.statuses[0].limit_remaining;
    assert_eq!(
        remaining(ask(&mut p, request(&domain, vec![peek.clone()])).await),
        33
    );
    leased.stop().await;
    assert_eq!(
        remaining(ask(&mut p, request(&domain, vec![peek])).await),
        36
    );
    plain.stop().await;
}

#[tokio::test]
async fn the_example_file_loads_and_answers() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/envoy.yaml");
    let mut opts = options("");
    opts.config = path.into();
    let server = Running::start(opts).await;
    let mut c = server.client().await;
    let login = [("path", "/login"), ("remote_address", "10.3.0.1")];
    assert_eq!(
        codes(&mut c, "edge", &login, 6).await,
        [OK, OK, OK, OK, OK, OVER]
    );
    // The limit's name names its rule: in the headers, as in the store.
    let r = ask(&mut c, request("edge", vec![descriptor(&login)])).await;
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"edge.login\";q=5;w=60")
    );
    let internal = [("source_cluster", "internal")];
    let r = ask(&mut c, request("edge", vec![descriptor(&internal)])).await;
    assert_eq!(r.statuses[0].current_limit, None);
    server.stop().await;
}

fn limits_file(toml: &str) -> PathBuf {
    let path = config_file("");
    let path = path.with_extension("toml");
    std::fs::write(&path, toml).unwrap();
    path
}

#[tokio::test]
async fn descriptors_name_limits_of_a_library_limits_file() {
    let toml = r#"
        [stores]
        default = "memory://"
        local = "memory://?capacity=1000"

        [limits.login]
        rules = [
          { name = "login-burst", store = "local", policy = "2/minute" },
          { name = "login-daily", policy = "3/day" },
        ]
    "#;
    let yaml = "
domain: named
descriptors:
  - key: path
    value: /login
    descriptors:
      - key: user
        rate_limit: { limit: login }
  - key: path
    value: /reset
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit: { limit: login, name: reset }
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 1 }
";
    let mut opts = options(yaml);
    opts.limits = Some(limits_file(toml));
    let server = Running::start(opts).await;
    let mut c = server.client().await;
    let login = [("path", "/login"), ("user", "ann")];
    // Both rules of the limit apply: the burst refuses the third.
    assert_eq!(codes(&mut c, "named", &login, 3).await, [OK, OK, OVER]);
    let r = ask(&mut c, request("named", vec![descriptor(&login)])).await;
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("login", 2, Unit::Minute as i32)
    );
    // Another node naming the same limit counts apart, and its shadow mode
    // reports the refusal without making it.
    let reset = [("path", "/reset"), ("user", "ann")];
    assert_eq!(codes(&mut c, "named", &reset, 3).await, [OK, OK, OK]);
    // The file's `default` store counts the plain descriptors.
    assert_eq!(
        codes(&mut c, "named", &[("plain", "x")], 2).await,
        [OK, OVER]
    );
    server.stop().await;

    // What cannot work is refused at start.
    let missing = "domain: m\ndescriptors:\n  - key: a\n    rate_limit: { limit: nope }\n";
    let mut opts = options(missing);
    opts.limits = Some(limits_file(toml));
    let err = Server::bind(opts).await.unwrap_err().to_string();
    assert!(err.contains("\"nope\"") && err.contains("login"), "{err}");
    let err = Server::bind(options(missing))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no limits file was given"), "{err}");
    let mut both = options(yaml);
    both.limits = Some(limits_file(toml));
    both.store = Some("memory://".into());
    let err = Server::bind(both).await.unwrap_err().to_string();
    assert!(err.contains("the store is given twice"), "{err}");
}

#[tokio::test]
async fn a_fleet_on_a_tiered_leased_limit_admits_exactly_the_limit_across_a_shutdown() {
    let url = ratewarden_test_support::redis::shared_url();
    let domain = unique_domain("tiers");
    let toml = format!(
        r#"
        [stores]
        local = "memory://"
        shared = "{url}"

        [limits.{domain}]
        rules = [
          {{ name = "{domain}-local", store = "local", policy = "sliding_window 30/hour" }},
          {{ name = "{domain}", store = "shared", policy = "sliding_window 30/hour", lease = 8 }},
        ]
    "#
    );
    let yaml = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ limit: {domain} }}\n"
    );
    let limits = limits_file(&toml);
    let mut fleet = Vec::new();
    for _ in 0..2 {
        let mut opts = options(&yaml);
        opts.limits = Some(limits.clone());
        fleet.push(Running::start(opts).await);
    }
    let one = || request(&domain, vec![descriptor(&[("user", "u")])]);
    // Five requests on each instance: each has bought more than it spent.
    for _ in 0..5 {
        for server in &fleet {
            let r = ask(&mut server.client().await, one()).await;
            assert_eq!(r.overall_code, OK);
        }
    }
    // One shuts down: what its leases still hold goes back to Redis, and
    // the other instance (whose local tier has room) spends it. The fleet
    // admits exactly the limit; units stranded by the shutdown would make
    // it fewer, a lease counted twice more.
    let first = fleet.remove(0);
    first.stop().await;
    let mut c = fleet[0].client().await;
    let mut more = 0;
    for _ in 0..40 {
        more += u32::from(ask(&mut c, one()).await.overall_code == OK);
    }
    assert_eq!(10 + more, 30);
    for server in fleet {
        server.stop().await;
    }
}

#[tokio::test]
async fn a_policy_in_ratewardens_text_applies_with_its_ban() {
    let yaml = r#"
domain: text
descriptors:
  - key: user
    rate_limit: { policy: "2/min ban after 2 in 1h for 1h" }
"#;
    let server = Running::start(options(yaml)).await;
    let mut c = server.client().await;
    let user = [("user", "u")];
    assert_eq!(codes(&mut c, "text", &user, 4).await, [OK, OK, OVER, OVER]);
    // The second refusal banned the client: an hour to wait, not a minute.
    let r = ask(&mut c, request("text", vec![descriptor(&user)])).await;
    assert_eq!(r.overall_code, OVER);
    let wait: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!(wait > 3000, "{wait}");
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, Unit::Minute as i32)
    );
    server.stop().await;
}
