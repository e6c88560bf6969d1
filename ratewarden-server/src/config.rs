//! Descriptors in the YAML format of envoyproxy/ratelimit, built into
//! limiters on one store.
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   # Every client address: 10 per second each.
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   # One exact value: the login path, 5 per minute per address.
//!   - key: path
//!     value: /login
//!     descriptors:
//!       - key: remote_address
//!         rate_limit:
//!           unit: minute
//!           requests_per_unit: 5
//!           algorithm: sliding_window   # ratewarden's own: also gcra, sliding_log
//!   # Counted and reported, never refused.
//!   - key: plan
//!     value: free
//!     shadow_mode: true
//!     rate_limit: { unit: hour, requests_per_unit: 1000 }
//! ```
//!
//! **Matching** is envoyproxy/ratelimit's. A request's descriptor is a
//! list of `(key, value)` entries; each entry is looked up among the
//! children of the node the previous one matched: first a node with the
//! same key and value, then one whose value ends in `*` and is a prefix of
//! the entry's value (the longest such), then one with the key and no value.
//! The limit is the `rate_limit` of the node the last entry matched. A
//! descriptor that matches no node, or ends on a node without a
//! `rate_limit`, or with `unlimited: true`, is not limited.
//!
//! **Counting.** Each limited node is a rule of its own; a client is the
//! descriptor's entry values, so `remote_address=10.0.0.1` and
//! `remote_address=10.0.0.2` count apart under one node. A rule is named
//! after its domain and its `rate_limit.name` (`edge.login`), or else its
//! node's path (`edge.remote_address`; characters a rule name cannot hold
//! become `_`, followed by a digest of the whole), so that its keys can be
//! listed in the store and a reload that keeps a node keeps its counts.
//!
//! **Accepted fields**: `domain`, `descriptors`, `key`, `value`,
//! `rate_limit` (`unit`, `requests_per_unit`, `name`, `unlimited`),
//! `shadow_mode` and `detailed_metric`, and ratewarden's own:
//! `rate_limit.algorithm` (`fixed_window`, the default; `sliding_window`,
//! `sliding_log`, `gcra`), `rate_limit.burst` (GCRA) and `rate_limit.policy`
//! (a whole policy in ratewarden's text, bans included, in place of `unit`
//! and `requests_per_unit`), and `rate_limit.limit`: the name of a limit in
//! a file of the library's format ([`ratewarden::config`], `--limits`),
//! whose rules apply with their tiers, leases, fallbacks and escalation.
//! Such a node's clients are counted under its path, so two nodes naming
//! one limit do not share counts. Anything else (`replaces`, `value_to_metric`,
//! units `month` and `year`, a field misspelt) is refused when the file is
//! loaded, with its line and column: a limit that is silently not what its
//! file says is worse than a server that does not start.
//!
//! **Difference from envoyproxy/ratelimit**: a fixed window opens at a
//! client's first request, not at the top of the second, minute or hour:
//! the limit per window is the same, but a client cannot spend two windows'
//! worth across a boundary it did not choose.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;
use ratewarden::config::Limits;
use ratewarden::layer::{HeaderMode, RateLimitHeaders};
use ratewarden::{FailurePolicy, Limiter, Policy, Rule, Store};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// One YAML file: a domain and its descriptors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorSpec {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimitSpec>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<DescriptorSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSpec {
    name: Option<String>,
    unit: Option<String>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    algorithm: Option<String>,
    burst: Option<u32>,
    policy: Option<String>,
    limit: Option<String>,
}

/// How the rules of a [`Domains`] are built: the store they count in and
/// what they answer when it fails.
#[derive(Debug, Clone)]
pub struct RuleOptions {
    /// The store every rule counts in.
    pub store: Arc<dyn Store>,
    /// What a rule answers when the store does not answer in time.
    pub on_failure: FailurePolicy,
    /// How long a rule waits for the store.
    pub timeout: Duration,
    /// The rate-limit headers of each response (`response_headers_to_add`).
    /// `Retry-After` is added to every refusal whatever the mode.
    pub headers: HeaderMode,
    /// The limits a `rate_limit: { limit: NAME }` names: a file in the
    /// library's format ([`ratewarden::config`]), with its tiers, leases,
    /// fallbacks and escalations.
    pub limits: Option<Limits>,
}

impl RuleOptions {
    /// Rules on `store` that fail open after [`ratewarden::DEFAULT_TIMEOUT`],
    /// with the draft's two headers, and no named limits.
    pub fn new(store: Arc<dyn Store>) -> Self {
        RuleOptions {
            store,
            on_failure: FailurePolicy::Open,
            timeout: ratewarden::DEFAULT_TIMEOUT,
            headers: HeaderMode::default(),
            limits: None,
        }
    }
}

/// A descriptor node's limit: its limiter and what the response says of it.
#[derive(Debug)]
pub struct Limit {
    /// The limiter of this node: one rule.
    pub limiter: Limiter,
    /// The rule's name, which leads its keys in the store; for a named
    /// limit, the limit's name.
    pub rule: String,
    /// What leads each client key: the node's path when the limiter is a
    /// named limit, which other nodes may count in too.
    pub scope: Option<String>,
    /// `rate_limit.name`, reported in each status's `current_limit`.
    pub name: String,
    /// The limit as written: requests per unit.
    pub requests_per_unit: u32,
    /// The unit as written, as Envoy's enum value.
    pub unit: i32,
    /// Counted and reported, never refused.
    pub shadow: bool,
    /// Metrics carry the request's values, not only the node's path.
    pub detailed_metric: bool,
    /// The headers of this limit's decisions.
    pub headers: RateLimitHeaders,
    /// `ratewarden_server_descriptors_total` of this node, by code.
    pub(crate) counters: Codes,
}

/// A node's descriptor counters, registered once: a counter looked up by
/// its labels on every request would hash and allocate them each time.
pub(crate) struct Codes {
    pub(crate) ok: Counter,
    pub(crate) over_limit: Counter,
    pub(crate) shadow_over_limit: Counter,
}

impl Codes {
    fn new(domain: &str, path: &str) -> Self {
        let counter = |code: &'static str| {
            metrics::counter!(
                "ratewarden_server_descriptors_total",
                "domain" => domain.to_owned(),
                "descriptor" => path.to_owned(),
                "code" => code,
            )
        };
        Codes {
            ok: counter("ok"),
            over_limit: counter("over_limit"),
            shadow_over_limit: counter("shadow_over_limit"),
        }
    }
}

impl fmt::Debug for Codes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Codes")
    }
}

/// `ratewarden_server_requests_total` of a domain: OK and OVER_LIMIT.
struct Requests([Counter; 2]);

impl fmt::Debug for Requests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Requests")
    }
}

#[derive(Debug, Default)]
struct Node {
    /// Children by key, then value.
    exact: HashMap<String, HashMap<String, Node>>,
    /// Children whose value ends in `*`, by key: `(prefix, node)`, longest
    /// prefix first.
    prefix: HashMap<String, Vec<(String, Node)>>,
    /// Children with a key and no value.
    any: HashMap<String, Node>,
    limit: Option<Arc<Limit>>,
}

impl Node {
    fn child(&self, key: &str, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some(node);
        }
        if let Some(node) = self
            .prefix
            .get(key)
            .and_then(|list| list.iter().find(|(p, _)| value.starts_with(p.as_str())))
        {
            return Some(&node.1);
        }
        self.any.get(key)
    }
}

/// Every domain of a configuration, each a tree of descriptor nodes.
#[derive(Debug, Default)]
pub struct Domains {
    domains: HashMap<String, Node>,
    requests: HashMap<String, Requests>,
    rules: usize,
}

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct LoadError {
    origin: String,
    message: String,
}

impl LoadError {
    pub(crate) fn new(origin: &str, message: impl fmt::Display) -> Self {
        LoadError {
            origin: origin.to_owned(),
            message: message.to_string(),
        }
    }
}

impl Domains {
    /// Loads `path`: one YAML file, or every `*.yaml` and `*.yml` file of a
    /// directory (one domain each, as envoyproxy/ratelimit reads its
    /// runtime directory).
    pub fn load(path: &Path, options: &RuleOptions) -> Result<Domains, LoadError> {
        let origin = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| LoadError::new(&origin, e))?;
        let mut files = Vec::new();
        if meta.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| LoadError::new(&origin, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| LoadError::new(&origin, e))?;
                let p = entry.path();
                if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                    files.push(p);
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(LoadError::new(&origin, "no *.yaml file in this directory"));
            }
        } else {
            files.push(path.to_owned());
        }
        let mut texts = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| LoadError::new(&file.display().to_string(), e))?;
            texts.push((file.display().to_string(), text));
        }
        Domains::parse(texts.iter().map(|(o, t)| (o.as_str(), t.as_str())), options)
    }

    /// Builds the domains of several YAML documents, each named by its
    /// origin (a file name) in errors.
    pub fn parse<'a>(
        documents: impl IntoIterator<Item = (&'a str, &'a str)>,
        options: &RuleOptions,
    ) -> Result<Domains, LoadError> {
        let mut domains = Domains::default();
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        for (origin, text) in documents {
            let file: DomainFile =
                serde_yaml_ng::from_str(text).map_err(|e| LoadError::new(origin, e))?;
            if file.domain.is_empty() {
                return Err(LoadError::new(origin, "`domain` must not be empty"));
            }
            if domains.domains.contains_key(&file.domain) {
                return Err(LoadError::new(
                    origin,
                    format!("domain {:?} is defined twice", file.domain),
                ));
            }
            let mut root = Node::default();
            for spec in &file.descriptors {
                let where_ = |m: String| LoadError::new(origin, m);
                add(
                    &mut root,
                    spec,
                    &file.domain,
                    "",
                    options,
                    &mut names,
                    &mut domains.rules,
                )
                .map_err(where_)?;
            }
            let counter = |code: &'static str| {
                metrics::counter!(
                    "ratewarden_server_requests_total",
                    "domain" => file.domain.clone(),
                    "code" => code,
                )
            };
            let requests = Requests([counter("ok"), counter("over_limit")]);
            domains.requests.insert(file.domain.clone(), requests);
            domains.domains.insert(file.domain, root);
        }
        Ok(domains)
    }

    /// The limit of the node `entries` match in `domain`; `None` when
    /// nothing matches or the node is not limited.
    pub fn find<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&Arc<Limit>> {
        let mut node = self.domains.get(domain)?;
        let mut any = false;
        for (key, value) in entries {
            node = node.child(key, value)?;
            any = true;
        }
        node.limit.as_ref().filter(|_| any)
    }

    /// `ratewarden_server_requests_total` of `domain`, if it is configured.
    pub(crate) fn requests(&self, domain: &str, over: bool) -> Option<&Counter> {
        self.requests.get(domain).map(|r| &r.0[usize::from(over)])
    }

    /// The number of limited descriptor nodes.
    pub fn rules(&self) -> usize {
        self.rules
    }

    /// Every limit, for a shutdown that hands leased units back or an
    /// admin's listing.
    pub fn limits(&self) -> Vec<Arc<Limit>> {
        fn walk(node: &Node, out: &mut Vec<Arc<Limit>>) {
            out.extend(node.limit.iter().cloned());
            node.exact
                .values()
                .flatten()
                .for_each(|(_, n)| walk(n, out));
            node.prefix
                .values()
                .flatten()
                .for_each(|(_, n)| walk(n, out));
            node.any.values().for_each(|n| walk(n, out));
        }
        let mut out = Vec::new();
        self.domains.values().for_each(|n| walk(n, &mut out));
        out
    }
}

fn add(
    parent: &mut Node,
    spec: &DescriptorSpec,
    domain: &str,
    parent_path: &str,
    options: &RuleOptions,
    names: &mut BTreeMap<String, String>,
    rules: &mut usize,
) -> Result<(), String> {
    if spec.key.is_empty() {
        return Err(format!(
            "a descriptor under {parent_path:?} has an empty `key`"
        ));
    }
    let step = match &spec.value {
        Some(v) => format!("{}_{}", spec.key, v),
        None => spec.key.clone(),
    };
    let path = if parent_path.is_empty() {
        step
    } else {
        format!("{parent_path}.{step}")
    };
    let mut node = Node::default();
    if let Some(rl) = &spec.rate_limit {
        let limited = rl.unit.is_some()
            || rl.requests_per_unit.is_some()
            || rl.policy.is_some()
            || rl.limit.is_some();
        if rl.unlimited && limited {
            return Err(format!(
                "descriptor {path:?} is `unlimited` and has a limit: keep one of the two"
            ));
        }
        if let Some(name) = &rl.limit {
            node.limit = Some(Arc::new(named(rl, name, spec, domain, &path, options)?));
            *rules += 1;
        } else if !rl.unlimited {
            let policy = policy(rl).map_err(|e| format!("descriptor {path:?}: {e}"))?;
            // A limit's own name, when it has one, names its rule: its keys
            // and its headers then read as the file's author wrote them.
            let rule = match &rl.name {
                Some(name) if !name.is_empty() => rule_name(domain, name),
                _ => rule_name(domain, &path),
            };
            if let Some(other) = names.insert(rule.clone(), path.clone()) {
                return Err(format!(
                    "descriptors {other:?} and {path:?} would share the rule name {rule:?}"
                ));
            }
            let built = Rule::new(rule.as_str(), options.store.clone(), policy)
                .and_then(|r| r.with_timeout(options.timeout))
                .map(|r| {
                    r.on_failure(options.on_failure)
                        .with_shadow(spec.shadow_mode)
                })
                .and_then(|r| Limiter::builder().rule(r).build())
                .map_err(|e| format!("descriptor {path:?}: {e}"))?;
            let written = rl.unit.as_deref().zip(rl.requests_per_unit);
            let (requests_per_unit, unit) = as_written(written, &policy);
            node.limit = Some(Arc::new(Limit {
                headers: RateLimitHeaders::new(&built, options.headers),
                limiter: built,
                rule,
                scope: None,
                name: rl.name.clone().unwrap_or_default(),
                requests_per_unit,
                unit,
                shadow: spec.shadow_mode,
                detailed_metric: spec.detailed_metric,
                counters: Codes::new(domain, &path),
            }));
            *rules += 1;
        }
    }
    for child in &spec.descriptors {
        add(&mut node, child, domain, &path, options, names, rules)?;
    }
    let duplicate = match &spec.value {
        Some(v) if v.ends_with('*') => {
            let prefix = v.trim_end_matches('*').to_owned();
            let list = parent.prefix.entry(spec.key.clone()).or_default();
            let dup = list.iter().any(|(p, _)| *p == prefix);
            list.push((prefix, node));
            list.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
            dup
        }
        Some(v) => parent
            .exact
            .entry(spec.key.clone())
            .or_default()
            .insert(v.clone(), node)
            .is_some(),
        None => parent.any.insert(spec.key.clone(), node).is_some(),
    };
    if duplicate {
        return Err(format!("descriptor {path:?} is defined twice"));
    }
    Ok(())
}

/// A node whose `rate_limit` names a limit of the `--limits` file.
fn named(
    rl: &RateLimitSpec,
    name: &str,
    spec: &DescriptorSpec,
    domain: &str,
    path: &str,
    options: &RuleOptions,
) -> Result<Limit, String> {
    if rl.unit.is_some()
        || rl.requests_per_unit.is_some()
        || rl.policy.is_some()
        || rl.algorithm.is_some()
        || rl.burst.is_some()
    {
        return Err(format!(
            "descriptor {path:?}: `limit` names a limit of the limits file, whose policies \
             apply: give no `unit`, `requests_per_unit`, `algorithm`, `burst` or `policy`"
        ));
    }
    let Some(limits) = &options.limits else {
        return Err(format!(
            "descriptor {path:?} names the limit {name:?}, but no limits file was given \
             (--limits FILE.toml)"
        ));
    };
    let Some(limiter) = limits.limiter(name) else {
        let known: Vec<&str> = limits.limiters().map(|(n, _)| n).collect();
        return Err(format!(
            "descriptor {path:?} names the limit {name:?}, which the limits file does not \
             have (it has: {})",
            known.join(", ")
        ));
    };
    // The first rule that refuses for real is the client's limit.
    let rules = limiter.rules();
    let first = rules.iter().find(|r| !r.is_shadow()).unwrap_or(&rules[0]);
    let (requests_per_unit, unit) = as_written(None, first.policy());
    Ok(Limit {
        headers: RateLimitHeaders::new(limiter, options.headers),
        limiter: limiter.clone(),
        rule: name.to_owned(),
        scope: Some(path.to_owned()),
        name: rl.name.clone().unwrap_or_else(|| name.to_owned()),
        requests_per_unit,
        unit,
        shadow: spec.shadow_mode,
        detailed_metric: spec.detailed_metric,
        counters: Codes::new(domain, path),
    })
}

/// The policy of a `rate_limit`: ratewarden's text, or the fields
/// envoyproxy/ratelimit has, with an algorithm and a burst.
fn policy(rl: &RateLimitSpec) -> Result<Policy, String> {
    if let Some(text) = &rl.policy {
        if rl.unit.is_some() || rl.requests_per_unit.is_some() || rl.algorithm.is_some() {
            return Err(
                "`policy` replaces `unit`, `requests_per_unit` and `algorithm`: \
                        give either it or them"
                    .into(),
            );
        }
        return text.parse::<Policy>().map_err(|e| e.to_string());
    }
    let (Some(unit), Some(n)) = (&rl.unit, rl.requests_per_unit) else {
        return Err("`rate_limit` needs `unit` and `requests_per_unit` (or `policy`)".into());
    };
    let unit = match unit.to_ascii_lowercase().as_str() {
        "second" => "s",
        "minute" => "min",
        "hour" => "h",
        "day" => "d",
        "week" => "w",
        other => {
            return Err(format!(
                "unit {other:?} is not supported: use second, minute, hour, day or week \
                 (a month or a year is not one length; write `policy: 1000/30d`)"
            ));
        }
    };
    let algorithm = rl.algorithm.as_deref().unwrap_or("fixed_window");
    if !matches!(
        algorithm,
        "fixed_window" | "sliding_window" | "sliding_log" | "gcra"
    ) {
        return Err(format!(
            "algorithm {algorithm:?} is not one of fixed_window, sliding_window, sliding_log, gcra"
        ));
    }
    let burst = match rl.burst {
        Some(b) if algorithm == "gcra" => format!(" burst {b}"),
        Some(_) => return Err("`burst` applies to `algorithm: gcra` only".into()),
        None => String::new(),
    };
    format!("{algorithm} {n}/{unit}{burst}")
        .parse::<Policy>()
        .map_err(|e| e.to_string())
}

/// `requests_per_unit` and Envoy's unit for a status's `current_limit`:
/// as written, or for a `policy` the nearest unit its window is a whole
/// number of.
fn as_written(written: Option<(&str, u32)>, policy: &Policy) -> (u32, i32) {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    let unit_of = |s: &str| match s {
        "second" => Unit::Second,
        "minute" => Unit::Minute,
        "hour" => Unit::Hour,
        "day" => Unit::Day,
        _ => Unit::Week,
    };
    if let Some((unit, n)) = written {
        return (n, unit_of(&unit.to_ascii_lowercase()) as i32);
    }
    let window = policy.window().as_secs().max(1);
    for (secs, unit) in [
        (604_800, Unit::Week),
        (86_400, Unit::Day),
        (3_600, Unit::Hour),
        (60, Unit::Minute),
    ] {
        if window == secs {
            return (policy.limit(), unit as i32);
        }
    }
    // A window of no single unit: the rate per second, rounded up, which
    // is what a client may spend on average.
    let per_second = u64::from(policy.limit()).div_ceil(window);
    (
        u32::try_from(per_second).unwrap_or(u32::MAX),
        Unit::Second as i32,
    )
}

/// The rule name of a node: `domain.path` when it is a valid rule name,
/// or its valid characters cut short and a digest of the whole, so that
/// any value (`/api/v1`, `a:b`) names a rule of its own.
fn rule_name(domain: &str, path: &str) -> String {
    let whole = format!("{domain}.{path}");
    let valid = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    if whole.len() <= ratewarden::MAX_RULE_NAME && whole.bytes().all(valid) {
        return whole;
    }
    let digest = Sha256::digest(whole.as_bytes());
    let tag = hex::encode(&digest[..6]);
    let readable: String = whole
        .chars()
        .map(|c| {
            if c.is_ascii() && valid(c as u8) {
                c
            } else {
                '_'
            }
        })
        .take(ratewarden::MAX_RULE_NAME - tag.len() - 1)
        .collect();
    format!("{readable}-{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_valid_and_distinct() {
        assert_eq!(rule_name("edge", "remote_address"), "edge.remote_address");
        let a = rule_name("edge", "path_/api/v1.remote_address");
        let b = rule_name("edge", "path_/api/v2.remote_address");
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n.len() <= ratewarden::MAX_RULE_NAME, "{n}");
            assert!(n.starts_with("edge.path__api_v"), "{n}");
        }
        let long = rule_name("edge", &"k".repeat(200));
        assert_eq!(long.len(), ratewarden::MAX_RULE_NAME);
    }
}
