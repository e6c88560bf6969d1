//! Store URLs: which schemes the builder accepts, their parsing (the `url`
//! crate's, through [`ratewarden_core::url`], never hand splitting of a
//! password) and what an error or `Debug` output may show of them
//! ([`ratewarden_core::url::redact`], the workspace's one redaction).

use ratewarden_core::ConfigError;
use ratewarden_core::url::{Url, redact};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// The URL schemes [`RedisStore::builder`](crate::RedisStore::builder)
/// recognises, without `://`: `redis` (TCP), `rediss` (TLS), `redis+unix`
/// and `unix` (a Unix socket), `redis+cluster` and `rediss+cluster` (a
/// Redis Cluster, the second over TLS) and `redis+sentinel` (the master of
/// a group Redis Sentinel monitors).
///
/// `rediss` and `rediss+cluster` are listed whatever the features, so that a
/// router of store URLs (such as the `ratewarden` crate's `from_url`) sends
/// them here; a store built without the `tls` feature refuses them at
/// construction, with an error that names the feature. Any other scheme is
/// refused.
///
/// ```
/// use ratewarden_redis::{RedisStore, URL_SCHEMES};
///
/// for scheme in URL_SCHEMES {
///     let url = match *scheme {
///         "redis+unix" | "unix" => format!("{scheme}:///run/redis.sock"),
///         "redis+sentinel" => format!("{scheme}://10.0.0.1:26379,10.0.0.2:26379/mymaster"),
///         _ => format!("{scheme}://127.0.0.1:6379"),
///     };
///     let built = RedisStore::from_url(&url);
///     if scheme.starts_with("rediss") && !cfg!(feature = "tls") {
///         assert!(built.unwrap_err().to_string().contains("`tls` feature"));
///     } else {
///         assert!(built.is_ok(), "{url}");
///     }
/// }
/// ```
pub const URL_SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
];

/// Where a URL points, checked but not contacted.
pub(crate) enum Endpoint {
    /// One server: TCP, TLS or a Unix socket.
    Single(Box<ConnectionInfo>),
    /// Any reachable nodes of a Redis Cluster; the rest are discovered.
    Cluster(Vec<ConnectionInfo>),
    /// The master of the group `master` that the sentinels monitor,
    /// reached with `node`'s credentials and database.
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        master: String,
        node: Box<redis::RedisConnectionInfo>,
    },
}

/// A parsed URL and what may be shown of it.
pub(crate) struct Parsed {
    pub(crate) endpoint: Endpoint,
    /// The URL without its secrets.
    pub(crate) display: String,
}

/// Parses and checks `url`. Every error shows the URL through
/// [`redact`] only.
pub(crate) fn parse(url: &str) -> Result<Parsed, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: redact(url),
        reason,
    };
    // Only the scheme is read by hand, to choose the parser: a cluster's
    // comma-separated hosts are not one URL authority.
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(format!(
            "expected a scheme: one of {}",
            schemes_for_humans()
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" | "rediss" | "redis+unix" | "unix" => single(url).map_err(invalid),
        "redis+cluster" => cluster(rest, false).map_err(invalid),
        "rediss+cluster" => cluster(rest, true).map_err(invalid),
        "redis+sentinel" => sentinel(rest).map_err(invalid),
        // Only a well-formed scheme is echoed: text before the first `://`
        // of a malformed URL may be anything, a password included (the
        // store_url fuzz target found one).
        other if is_scheme(other) => Err(invalid(format!(
            "unsupported scheme {other:?}: use one of {}",
            schemes_for_humans()
        ))),
        _ => Err(invalid(format!(
            "not a URL with a scheme this store accepts: use one of {}",
            schemes_for_humans()
        ))),
    }
}

fn schemes_for_humans() -> String {
    URL_SCHEMES
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn single(url: &str) -> Result<Parsed, String> {
    // The url crate's errors name what is wrong, never the input.
    let parsed = Url::parse(url).map_err(|e| e.to_string())?;
    if parsed.scheme() == "rediss" {
        if !cfg!(feature = "tls") {
            return Err("rediss:// (TLS) needs the `tls` feature of ratewarden-redis".into());
        }
        if parsed.fragment() == Some("insecure") {
            return Err(
                "#insecure would turn off certificate verification; give the server's CA to \
                 RedisStoreBuilder::tls_root_ca instead"
                    .into(),
            );
        }
    }
    let info = parsed
        .into_connection_info()
        .map_err(|e| format!("not a usable Redis URL: {e}"))?;
    check_host(&info)?;
    Ok(Parsed {
        endpoint: Endpoint::Single(Box::new(info)),
        display: redact(url),
    })
}

/// `[user:password@]host1:port1,host2:port2,...[/]`: each node is parsed as
/// a `redis://` (or, with `tls`, `rediss://`) URL of its own, with the
/// shared user information.
fn cluster(rest: &str, tls: bool) -> Result<Parsed, String> {
    if tls && !cfg!(feature = "tls") {
        return Err("rediss+cluster:// (TLS) needs the `tls` feature of ratewarden-redis".into());
    }
    let (auth, hosts) = split_auth(rest);
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    let scheme = if tls { "rediss" } else { "redis" };
    let nodes = nodes(scheme, auth, hosts, "cluster node")?;
    Ok(Parsed {
        display: display(&format!("{scheme}+cluster"), auth, hosts, ""),
        endpoint: Endpoint::Cluster(nodes),
    })
}

/// `[user:password@]host1:port1,host2:port2,.../master-name[/db]`: the
/// sentinels' addresses, the name of the group they monitor, and the
/// database on its master. The user information is the master's (and its
/// replicas'); the sentinels are asked without it.
fn sentinel(rest: &str) -> Result<Parsed, String> {
    let (auth, after) = split_auth(rest);
    let Some((hosts, path)) = after.split_once('/') else {
        return Err(
            "a sentinel URL needs the master's name: redis+sentinel://host:port,.../name".into(),
        );
    };
    let path = path.trim_end_matches('/');
    let (name, db) = match path.split_once('/') {
        Some((name, db)) => (name, Some(db)),
        None => (path, None),
    };
    // Sentinel's own configuration files take names of these characters;
    // anything else is more likely a mistyped URL than a group's name.
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "{name:?} is not a master name (letters, digits, '-', '_' and '.')"
        ));
    }
    let sentinels = nodes("redis", None, hosts, "sentinel")?;
    // The master's settings, read by the url crate and redis-rs as they
    // read any `redis://` URL (a database that is not a number is refused
    // there).
    let node = match auth {
        Some(a) => format!("redis://{a}@master/{}", db.unwrap_or("")),
        None => format!("redis://master/{}", db.unwrap_or("")),
    };
    let node = Url::parse(&node)
        .map_err(|e| e.to_string())?
        .into_connection_info()
        .map_err(|e| format!("not a usable Redis URL: {e}"))?
        .redis_settings()
        .clone();
    Ok(Parsed {
        display: display("redis+sentinel", auth, hosts, &format!("/{path}")),
        endpoint: Endpoint::Sentinel {
            sentinels,
            master: name.to_string(),
            node: Box::new(node),
        },
    })
}

/// The user information of a URL whose hosts are a comma-separated list
/// (not one authority the url crate could parse), and what follows it.
fn split_auth(rest: &str) -> (Option<&str>, &str) {
    match rest.rsplit_once('@') {
        Some((auth, hosts)) => (Some(auth), hosts),
        None => (None, rest),
    }
}

/// `host1:port1,host2:port2,...`, each parsed as a `scheme://` URL of its
/// own with `auth`.
fn nodes(
    scheme: &str,
    auth: Option<&str>,
    hosts: &str,
    what: &str,
) -> Result<Vec<ConnectionInfo>, String> {
    if hosts.is_empty() {
        return Err(format!("expected at least one {what} as host:port"));
    }
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let shape = || format!("{what} {host:?} is not host:port");
        let (h, p) = host.rsplit_once(':').ok_or_else(shape)?;
        if h.is_empty() || h.contains(['/', '?', '#']) {
            return Err(shape());
        }
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{what} {host:?} has an invalid port"))?;
        let node = match auth {
            Some(a) => format!("{scheme}://{a}@{h}:{p}"),
            None => format!("{scheme}://{h}:{p}"),
        };
        let info = Url::parse(&node)
            .map_err(|e| format!("{what} {host:?}: {e}"))?
            .into_connection_info()
            .map_err(|e| format!("{what} {host:?}: {e}"))?;
        check_host(&info)?;
        nodes.push(info);
    }
    Ok(nodes)
}

/// What may be shown of a URL of comma-separated hosts: its user
/// information redacted (as the first host's URL would show it), the
/// hosts, already checked, as they are.
fn display(scheme: &str, auth: Option<&str>, hosts: &str, path: &str) -> String {
    let auth = match auth {
        Some(a) => {
            let shown = redact(&format!("redis://{a}@host"));
            let shown = shown.strip_prefix("redis://").unwrap_or(&shown);
            shown.strip_suffix("host").unwrap_or(shown).to_string()
        }
        None => String::new(),
    };
    format!("{scheme}://{auth}{hosts}{path}")
}

/// The redis crate accepts `redis://` with an empty host or port 0; a store
/// that can never connect is a configuration error.
fn check_host(info: &ConnectionInfo) -> Result<(), String> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. }
            if host.is_empty() || *port == 0 =>
        {
            Err("missing host or port".into())
        }
        _ => Ok(()),
    }
}

/// A URL scheme as RFC 3986 writes it: a letter, then letters, digits,
/// `+`, `-` or `.`.
fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(url: &str) -> String {
        match parse(url) {
            Ok(_) => panic!("{url} was accepted"),
            Err(ConfigError::InvalidUrl { reason, .. }) => reason,
            Err(other) => panic!("{url}: {other}"),
        }
    }

    #[test]
    fn malformed_urls_are_refused() {
        for url in [
            "",
            "localhost:6379",
            "http://localhost",
            "redis://",
            "redis://host:notaport",
            "redis://:pw@host:99999",
            "redis://host:0",
            "redis://host/notadb",
            "redis+cluster://",
            "redis+cluster://a:1,b",
            "redis+cluster://a:1,:2",
            "redis+cluster://a:0",
            "redis+cluster://a:1/x,b:2",
            "rediss+cluster://",
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:1/my master",
            "redis+sentinel://a:1/m/notadb",
            "redis+sentinel://a:1,b/m",
            "redis+sentinel:///m",
            "valkey://host",
        ] {
            reason(url);
        }
    }

    #[test]
    fn every_listed_scheme_is_recognised() {
        for scheme in URL_SCHEMES {
            let url = match *scheme {
                "redis+unix" | "unix" => format!("{scheme}:///run/redis.sock"),
                "redis+sentinel" => format!("{scheme}://127.0.0.1:26379/mymaster"),
                _ => format!("{scheme}://127.0.0.1:6379"),
            };
            let refused_without_tls = scheme.starts_with("rediss") && !cfg!(feature = "tls");
            match parse(&url) {
                Ok(_) => assert!(!refused_without_tls, "{url}"),
                Err(e) => assert!(refused_without_tls, "{url}: {e}"),
            }
        }
        assert!(parse("REDIS://127.0.0.1").is_ok(), "schemes ignore case");
    }

    #[test]
    fn rediss_without_the_feature_names_it() {
        if cfg!(feature = "tls") {
            assert!(parse("rediss+cluster://a:1,b:2").is_ok());
            assert!(parse("rediss://cache:6379").is_ok());
            assert!(reason("rediss://cache:6379/#insecure").contains("tls_root_ca"));
        } else {
            assert!(reason("rediss+cluster://a:1").contains("`tls` feature"));
            assert!(reason("rediss://cache:6379").contains("`tls` feature"));
        }
    }

    #[test]
    fn cluster_urls_keep_every_node() {
        let parsed = parse("redis+cluster://u:p@a:1,b:2/").unwrap();
        let Endpoint::Cluster(nodes) = parsed.endpoint else {
            panic!("not a cluster")
        };
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        assert_eq!(addrs, ["a:1", "b:2"]);
        assert!(
            nodes
                .iter()
                .all(|n| n.redis_settings().password() == Some("p"))
        );
        assert_eq!(parsed.display, "redis+cluster://u:***@a:1,b:2");
    }

    #[test]
    fn sentinel_urls_keep_every_sentinel_and_give_the_credentials_to_the_master() {
        let parsed = parse("redis+sentinel://u:p@s1:26379,s2:26380/my-master/3").unwrap();
        let Endpoint::Sentinel {
            sentinels,
            master,
            node,
        } = parsed.endpoint
        else {
            panic!("not a sentinel URL")
        };
        let addrs: Vec<String> = sentinels.iter().map(|n| n.addr().to_string()).collect();
        assert_eq!(addrs, ["s1:26379", "s2:26380"]);
        assert!(
            sentinels
                .iter()
                .all(|n| n.redis_settings().password().is_none())
        );
        assert_eq!(master, "my-master");
        assert_eq!(node.password(), Some("p"));
        assert_eq!(node.username(), Some("u"));
        assert_eq!(node.db(), 3);
        assert_eq!(
            parsed.display,
            "redis+sentinel://u:***@s1:26379,s2:26380/my-master/3"
        );
        assert_eq!(
            parse("redis+sentinel://s1:26379/m").unwrap().display,
            "redis+sentinel://s1:26379/m"
        );
    }

    #[test]
    fn passwords_never_reach_an_error_or_a_display() {
        // (URL, fragments of its password that must not be shown)
        let cases: &[(&str, &[&str])] = &[
            ("redis+unix:///s.sock?pass=hunter2", &["hunter2"]),
            ("redis+unix:///s.sock?pass=hunter2&db=x", &["hunter2"]),
            ("redis://:pa/ss@host", &["pa/ss", ":pa", "ss@"]),
            ("redis://user:hunter2@h:x", &["hunter2"]),
            ("redis://user:hunter2@h/notadb", &["hunter2"]),
            ("redis://:hun@ter2@host:1:2", &["hun@ter2", "ter2"]),
            ("redis+cluster://u:hunter2@a:1,b", &["hunter2"]),
            ("redis+cluster://u:hun/ter2@a:1,b:2", &["hun/ter2", "ter2"]),
            ("redis+cluster://u:hunter2@a:1,b:2", &["hunter2"]),
            ("redis+sentinel://u:hunter2@a:1,b:2/m", &["hunter2"]),
            ("redis+sentinel://u:hun/ter2@a:1/m", &["hun/ter2", "ter2"]),
            ("redis+sentinel://u:hunter2@a:1/m/x", &["hunter2"]),
            ("rediss://u:hunter2@h:1/#insecure", &["hunter2"]),
            ("nope://u:hunter2@h", &["hunter2"]),
        ];
        for (url, secrets) in cases {
            let shown = match parse(url) {
                Ok(p) => p.display,
                Err(e) => format!("{e} {e:?}"),
            };
            for secret in *secrets {
                assert!(!shown.contains(secret), "{url}: {shown}");
            }
        }
    }
}
