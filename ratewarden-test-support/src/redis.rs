//! Redis servers in containers, shared by address only.
//!
//! The image is the locally built `ratewarden-test-redis:7` where this
//! machine has it (`scripts/build-test-images.sh` builds it from Debian's
//! packages when no registry is reachable), else the official `redis:7`;
//! `RATEWARDEN_REDIS_IMAGE` (`name:tag`) names another.
//! `RATEWARDEN_REDIS_URL` points the shared-server tests at an existing
//! server instead.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use testcontainers::core::{ExecCommand, IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::WireCounter;
use crate::containers::{Server, fail, labelled};
pub use crate::containers::{free_port, reap_on_exit, start_shared};

/// The locally built test image, used where this machine has it.
pub const DEFAULT_IMAGE: &str = "ratewarden-test-redis:7";
/// The official image, used where the local one was not built.
pub const OFFICIAL_IMAGE: &str = "redis:7";
const SERVER: Server = Server {
    what: "Redis",
    image_var: "RATEWARDEN_REDIS_IMAGE",
    url_var: "RATEWARDEN_REDIS_URL",
    local: DEFAULT_IMAGE,
    official: OFFICIAL_IMAGE,
};

/// The image to run, as (name, tag): `RATEWARDEN_REDIS_IMAGE`, else
/// [`DEFAULT_IMAGE`] if built here, else [`OFFICIAL_IMAGE`].
pub fn image_name() -> (String, String) {
    static IMAGE: OnceLock<(String, String)> = OnceLock::new();
    IMAGE.get_or_init(|| SERVER.image()).clone()
}

/// The image, waiting for the server to accept connections.
pub fn image() -> GenericImage {
    let (name, tag) = image_name();
    GenericImage::new(name, tag)
        .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
}

/// Starts `request`, registering the container for removal at exit; fails
/// the test with one line saying what to do if it cannot start.
pub async fn start_request(
    request: impl Into<testcontainers::ContainerRequest<GenericImage>>,
    what: &str,
) -> ContainerAsync<GenericImage> {
    SERVER.start(request, &image_name(), what).await
}

/// A Redis container reached through a published port on 127.0.0.1.
pub async fn start_redis() -> (ContainerAsync<GenericImage>, String) {
    let container = start_request(image().with_exposed_port(6379.tcp()), "Redis").await;
    let port = container
        .get_host_port_ipv4(6379.tcp())
        .await
        .unwrap_or_else(|e| panic!("Redis container has no published port: {e}"));
    (container, format!("redis://127.0.0.1:{port}"))
}

/// A Redis container on a fixed host port, so that it keeps its address
/// across a stop and a start.
pub async fn start_redis_on_fixed_port() -> (ContainerAsync<GenericImage>, String) {
    let port = free_port(false);
    let request = image()
        .with_exposed_port(6379.tcp())
        .with_mapped_port(port, 6379.tcp());
    (
        start_request(request, "Redis").await,
        format!("redis://127.0.0.1:{port}"),
    )
}

/// The shared server of this test binary: `RATEWARDEN_REDIS_URL`, or a
/// container started once. Only the address is shared: connections belong
/// to the runtime of the test that opens them.
pub fn shared_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    // A failed start is not kept: each test that needs the server then
    // fails with the same one-line reason, rather than on a poisoned lock.
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("RATEWARDEN_REDIS_URL") {
            return url;
        }
        start_shared("the shared Redis container", start_redis)
    })
}

/// A key prefix no other test (in any process) uses.
pub fn unique_prefix(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "test:{what}:{}:{nanos}:{}:",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A connection for a test's own commands (statistics, inspection).
pub async fn admin(url: &str) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// `cmdstat_<name>` → calls, from the server's `INFO commandstats`.
pub async fn command_calls(
    conn: &mut ::redis::aio::MultiplexedConnection,
) -> BTreeMap<String, u64> {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// A [`WireCounter`] in front of the shared server, and the shared
/// server's URL with its address replaced by the counter's: a client of
/// that URL is counted on the wire.
pub async fn shared_through_counter() -> (WireCounter, String) {
    let wire = WireCounter::start(tcp_addr(shared_url()))
        .await
        .unwrap_or_else(|e| panic!("cannot start the counting proxy: {e}"));
    let url = via(shared_url(), wire.addr());
    (wire, url)
}

/// Polls until the server answers PING again after a start.
pub async fn wait_until_up(url: &str) {
    for _ in 0..200 {
        if let Ok(Ok(mut c)) = tokio::time::timeout(
            Duration::from_secs(1),
            ::redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection(),
        )
        .await
        {
            let pong: Result<String, _> = ::redis::cmd("PING").query_async(&mut c).await;
            if pong.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Redis at {url} did not come back within 20 s");
}

/// A port for a cluster node on the host network, with its bus port (port +
/// 10,000) free too. Both are drawn below 32,768, where Linux hands out no
/// ephemeral ports, so that no client connection of a concurrent test takes
/// one between this check and the node's bind.
fn cluster_port(taken: &[u16]) -> u16 {
    static N: AtomicU64 = AtomicU64::new(0);
    for _ in 0..1_000 {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64)
            ^ N.fetch_add(0x9E37_79B9, Ordering::Relaxed)
            ^ u64::from(std::process::id()) << 20;
        let port = 10_000 + (seed % 12_768) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if !taken.contains(&port) && free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free cluster port pair below 32,768 on 127.0.0.1");
}

/// A three-master Redis Cluster on 127.0.0.1 (host networking), returned
/// with its `redis+cluster://` URL.
pub async fn start_cluster() -> (Vec<ContainerAsync<GenericImage>>, String) {
    start_cluster_of(None).await
}

/// A three-master Redis Cluster on 127.0.0.1 (host networking) that speaks
/// TLS only, clients and cluster bus alike, with server certificates from
/// `ca`; returned with its `rediss+cluster://` URL.
#[cfg(feature = "tls")]
pub async fn start_tls_cluster(ca: &crate::tls::Ca) -> (Vec<ContainerAsync<GenericImage>>, String) {
    let (cert, key) = ca.server("ratewarden test cluster node");
    start_cluster_of(Some(Tls {
        ca: ca.pem(),
        cert,
        key,
    }))
    .await
}

/// PEM files a TLS node is started with.
struct Tls {
    ca: String,
    cert: String,
    key: String,
}

/// `redis-cli`'s arguments to reach a node of a TLS cluster.
const CLI_TLS: [&str; 3] = ["--tls", "--cacert", "/tls/ca.crt"];

/// A server's arguments to speak TLS only, on `port`, with the files
/// [`with_tls_files`] copies in.
pub fn tls_args(port: u16) -> Vec<String> {
    [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        "/tls/server.crt",
        "--tls-key-file",
        "/tls/server.key",
        "--tls-ca-cert-file",
        "/tls/ca.crt",
        "--tls-auth-clients",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// `request` with a CA certificate, a server certificate and its key (PEM)
/// where [`tls_args`] points.
pub fn with_tls_files(
    request: impl Into<testcontainers::ContainerRequest<GenericImage>>,
    ca: &str,
    cert: &str,
    key: &str,
) -> testcontainers::ContainerRequest<GenericImage> {
    request
        .into()
        .with_copy_to("/tls/ca.crt", ca.as_bytes().to_vec())
        .with_copy_to("/tls/server.crt", cert.as_bytes().to_vec())
        .with_copy_to("/tls/server.key", key.as_bytes().to_vec())
}

async fn start_cluster_of(tls: Option<Tls>) -> (Vec<ContainerAsync<GenericImage>>, String) {
    let mut ports: Vec<u16> = Vec::new();
    let mut nodes = Vec::new();
    let mut failures = Vec::new();
    let cli_tls: &[&str] = if tls.is_some() { &CLI_TLS } else { &[] };
    while nodes.len() < 3 {
        let port = cluster_port(&ports);
        let mut cmd: Vec<String> = match &tls {
            // The bus port is the TLS port + 10,000, as cluster_port
            // checked.
            Some(_) => {
                let mut args = tls_args(port);
                args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
                args
            }
            None => vec!["--port".into(), port.to_string()],
        };
        cmd.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-announce-ip",
                "127.0.0.1",
                "--cluster-node-timeout",
                "5000",
            ]
            .map(String::from),
        );
        let mut request = image().with_network("host").with_cmd(cmd);
        if let Some(tls) = &tls {
            request = with_tls_files(request, &tls.ca, &tls.cert, &tls.key);
        }
        // A port found free can be taken before the node binds it (by any
        // process on the host): try another rather than fail the test.
        SERVER.require_docker("this Redis Cluster test");
        match labelled(request).start().await {
            Ok(node) => {
                reap_on_exit(node.id());
                ports.push(port);
                nodes.push(node);
            }
            Err(e) if failures.len() < 4 => failures.push(format!("port {port}: {e}")),
            Err(e) => fail(&format!(
                "cannot start a Redis cluster node container ({e}; earlier attempts: {}): {}",
                failures.join("; "),
                SERVER.image_help(&image_name())
            )),
        }
    }
    let mut create = vec!["redis-cli".to_string()];
    create.extend(cli_tls.iter().map(|a| a.to_string()));
    create.extend(["--cluster".into(), "create".into()]);
    create.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
    create.push("--cluster-yes".into());
    let (code, out, err) = exec(&nodes[0], create).await;
    assert!(
        matches!(code, Some(0) | None) && String::from_utf8_lossy(&out).contains("[OK]"),
        "redis-cli --cluster create failed ({code:?}): {}{}",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );
    // Every node must agree the cluster is up before the store connects.
    for (node, port) in nodes.iter().zip(&ports) {
        let port = port.to_string();
        let mut args = vec!["-p", &port];
        args.extend(cli_tls);
        args.extend(["CLUSTER", "INFO"]);
        let mut ok = false;
        for _ in 0..200 {
            if redis_cli(node, &args).await.contains("cluster_state:ok") {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "cluster node {port} never reached cluster_state:ok");
    }
    let scheme = if tls.is_some() {
        "rediss+cluster"
    } else {
        "redis+cluster"
    };
    let url = format!(
        "{scheme}://{}",
        ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    (nodes, url)
}

/// Runs `redis-cli` inside `container` against its own server and returns
/// what it printed; panics, with its error output, if it fails. Without a
/// terminal, redis-cli prints replies raw: one key per line, no quotes.
pub async fn redis_cli(container: &ContainerAsync<GenericImage>, args: &[&str]) -> String {
    let mut command = vec!["redis-cli".to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    let (code, out, err) = exec(container, command).await;
    assert!(
        matches!(code, Some(0) | None),
        "redis-cli {args:?} failed ({code:?}): {}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8(out).expect("redis-cli printed UTF-8")
}

/// Runs `command` inside `container`: its exit code (if known), standard
/// output and standard error.
async fn exec(
    container: &ContainerAsync<GenericImage>,
    command: Vec<String>,
) -> (Option<i64>, Vec<u8>, Vec<u8>) {
    let mut result = container
        .exec(ExecCommand::new(command.clone()))
        .await
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let out = result.stdout_to_vec().await.unwrap_or_default();
    let err = result.stderr_to_vec().await.unwrap_or_default();
    (result.exit_code().await.ok().flatten(), out, err)
}

/// The TCP address of a `redis://` URL.
pub fn tcp_addr(url: &str) -> SocketAddr {
    let parsed = ratewarden_core::url::Url::parse(url).expect("a valid Redis URL");
    let host = parsed.host_str().expect("a TCP Redis URL");
    let port = parsed.port().unwrap_or(6379);
    (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("cannot resolve {host}:{port}"))
}

/// `url` with its host and port replaced by `addr` (a proxy in front of the
/// server), credentials and database kept.
pub fn via(url: &str, addr: SocketAddr) -> String {
    let mut parsed = ratewarden_core::url::Url::parse(url).expect("a valid Redis URL");
    parsed
        .set_host(Some(&addr.ip().to_string()))
        .expect("a URL with a host");
    parsed
        .set_port(Some(addr.port()))
        .expect("a URL with a port");
    parsed.to_string()
}

/// A master, one replica and three sentinels (quorum 2) on 127.0.0.1 (host
/// networking), the sentinels agreeing on the group before it is returned.
pub struct SentinelGroup {
    /// The master the sentinels monitor at first.
    pub master: ContainerAsync<GenericImage>,
    /// `redis://` URL of the first master.
    pub master_url: String,
    /// Its replica, promoted by a failover.
    pub replica: ContainerAsync<GenericImage>,
    /// `redis://` URL of the replica.
    pub replica_url: String,
    /// The sentinels, kept alive with the group.
    pub sentinels: Vec<ContainerAsync<GenericImage>>,
    /// `redis://` URLs of the sentinels.
    pub sentinel_urls: Vec<String>,
    /// `redis+sentinel://…/mymaster` for a store.
    pub url: String,
}

/// The name of the group [`start_sentinel_group`] monitors.
pub const SENTINEL_MASTER: &str = "mymaster";

/// How long the sentinels of [`start_sentinel_group`] wait before they call
/// an unanswering master down.
pub const SENTINEL_DOWN_AFTER: Duration = Duration::from_millis(1_000);

/// Starts a [`SentinelGroup`]. Host networking, so that the address the
/// sentinels hand out (127.0.0.1 and the master's port) is one the test
/// process reaches.
pub async fn start_sentinel_group() -> SentinelGroup {
    SERVER.require_docker("this Redis Sentinel test");
    let mut taken = Vec::new();
    let mut server = |args: Vec<String>| {
        let port = cluster_port(&taken);
        taken.push(port);
        let mut cmd = vec!["--port".to_string(), port.to_string()];
        cmd.extend(args);
        (port, image().with_network("host").with_cmd(cmd))
    };
    let (master_port, request) = server(vec![]);
    let master = start_request(request, "Redis Sentinel group's master").await;
    let master_url = format!("redis://127.0.0.1:{master_port}");
    let (replica_port, request) = server(vec![
        "--replicaof".into(),
        "127.0.0.1".into(),
        master_port.to_string(),
    ]);
    let replica = start_request(request, "Redis Sentinel group's replica").await;
    let replica_url = format!("redis://127.0.0.1:{replica_port}");
    wait_for_info(&replica_url, "replication", "master_link_status:up").await;
    let mut sentinels = Vec::new();
    let mut sentinel_urls = Vec::new();
    for _ in 0..3 {
        let port = cluster_port(&taken);
        taken.push(port);
        // Sentinel rewrites its configuration file, so it needs one of its
        // own; the image's entrypoint runs a command that does not start
        // with '-' as it is.
        let config = [
            format!("port {port}"),
            "bind 127.0.0.1".into(),
            "protected-mode no".into(),
            format!("sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2"),
            format!(
                "sentinel down-after-milliseconds {SENTINEL_MASTER} {}",
                SENTINEL_DOWN_AFTER.as_millis()
            ),
            format!("sentinel failover-timeout {SENTINEL_MASTER} 5000"),
        ]
        .join("\n");
        let script = format!(
            "printf '%s\\n' '{}' > /tmp/sentinel.conf && exec redis-server /tmp/sentinel.conf --sentinel",
            config.replace('\n', "' '")
        );
        let request = GenericImage::new(image_name().0, image_name().1)
            .with_wait_for(WaitFor::message_on_stdout("+monitor master"))
            .with_network("host")
            .with_cmd(["sh".to_string(), "-c".into(), script]);
        sentinels.push(start_request(request, "Redis Sentinel").await);
        sentinel_urls.push(format!("redis://127.0.0.1:{port}"));
    }
    // A failover needs a majority of the sentinels to know each other and
    // the replica; they find each other through the master within seconds.
    for url in &sentinel_urls {
        let mut conn = admin(url).await;
        let mut ready = false;
        for _ in 0..300 {
            let fields: Vec<String> = ::redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(SENTINEL_MASTER)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let field = |name: &str| {
                fields
                    .iter()
                    .position(|f| f == name)
                    .and_then(|i| fields.get(i + 1))
                    .cloned()
                    .unwrap_or_default()
            };
            if field("num-other-sentinels") == "2" && field("num-slaves") == "1" {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            ready,
            "sentinel {url} never saw the two others and the replica"
        );
    }
    let hosts: Vec<&str> = sentinel_urls
        .iter()
        .map(|u| u.trim_start_matches("redis://"))
        .collect();
    let url = format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","));
    SentinelGroup {
        master,
        master_url,
        replica,
        replica_url,
        sentinels,
        sentinel_urls,
        url,
    }
}

/// Waits up to 30 s until the server at `url` reports `needle` in its
/// `INFO section`.
pub async fn wait_for_info(url: &str, section: &str, needle: &str) {
    let mut conn = admin(url).await;
    for _ in 0..300 {
        let info: String = ::redis::cmd("INFO")
            .arg(section)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        if info.contains(needle) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never reported {needle:?} in INFO {section}");
}
