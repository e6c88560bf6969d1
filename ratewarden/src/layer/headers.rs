//! Rate-limit headers and the 429 response, for the layer and for
//! hand-written middleware.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ratewarden_core::{Decision, Limiter};

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Shadow`: `refused` on a response a rule in shadow mode would
/// have refused ([`RateLimitHeaders::with_shadow_header`]).
pub const X_RATELIMIT_SHADOW: HeaderName = HeaderName::from_static("x-ratelimit-shadow");

const SHADOW_REFUSED: HeaderValue = HeaderValue::from_static("refused");

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
/// A quota answer is the client's state at one moment: never to be reused.
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// Which rate-limit headers responses carry. `Retry-After` is written on
/// every refusal whatever the mode: it is plain HTTP (RFC 9110), not a
/// rate-limit header, and clients that know nothing else honour it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderMode {
    /// `RateLimit-Policy` and `RateLimit` and the `X-RateLimit-*` trio.
    Both,
    /// `RateLimit-Policy` and `RateLimit` only
    /// (draft-ietf-httpapi-ratelimit-headers-11), the default: the
    /// standard's fields, two headers a response rather than five.
    #[default]
    Draft11,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
    /// only, as GitHub and many clients read them.
    XRateLimit,
    /// No rate-limit headers.
    None,
}

impl HeaderMode {
    fn draft(self) -> bool {
        matches!(self, HeaderMode::Both | HeaderMode::Draft11)
    }

    fn legacy(self) -> bool {
        matches!(self, HeaderMode::Both | HeaderMode::XRateLimit)
    }
}

/// The rate-limit headers of one [`Limiter`], built once and written on
/// every response: what can be prepared without a decision (the
/// `RateLimit-Policy` value, each policy's name and window) is.
///
/// | header | value |
/// |---|---|
/// | `Retry-After` | (refusals only) seconds to wait, rounded up |
/// | `RateLimit-Policy` | every policy of the limiter: `"burst";q=12;w=300, "hourly";q=40;w=3600` |
/// | `RateLimit` | the deciding policy: `"burst";r=0;t=42` |
/// | `X-RateLimit-Limit` | ([`HeaderMode::XRateLimit`], [`HeaderMode::Both`]) the limit of the deciding policy |
/// | `X-RateLimit-Remaining` | (the same) units still admitted now |
/// | `X-RateLimit-Reset` | (the same) seconds until the full quota is back, rounded up |
///
/// The first two, the default, are the structured fields of
/// draft-ietf-httpapi-ratelimit-headers-11: `RateLimit-Policy` lists one
/// member per policy (a rule's, and an escalating rule's durable policy as
/// `"rule/durable"`), `RateLimit` names the policy that decided: the
/// refusing one, or the admitting one with the least remaining.
///
/// A hand-written middleware writes the same headers as the layer:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use std::net::SocketAddr;
/// use axum::extract::{ConnectInfo, Request, State};
/// use axum::middleware::{self, Next};
/// use axum::response::{IntoResponse, Response};
/// use axum::{Router, routing::get};
/// use ratewarden::{ClientIdentity, Limiter};
/// use ratewarden::layer::{HeaderMode, RateLimitHeaders};
///
/// #[derive(Clone)]
/// struct Limiting { limiter: Limiter, identity: ClientIdentity, headers: std::sync::Arc<RateLimitHeaders> }
///
/// async fn limit(State(l): State<Limiting>, ConnectInfo(peer): ConnectInfo<SocketAddr>,
///                request: Request, next: Next) -> Response {
///     let key = l.identity.key(request.headers(), Some(peer.ip()));
///     let decision = l.limiter.check(key.as_bytes()).await;
///     if !decision.allowed {
///         return l.headers.refusal(&decision).into_response();
///     }
///     let mut response = next.run(request).await;
///     l.headers.write(&decision, response.headers_mut());
///     response
/// }
///
/// # fn app(limiter: Limiter, identity: ClientIdentity) -> Router {
/// let headers = std::sync::Arc::new(RateLimitHeaders::new(&limiter, HeaderMode::Both));
/// let state = Limiting { limiter, identity, headers };
/// Router::new()
///     .route("/api/search", get(|| async { "results" }))
///     .layer(middleware::from_fn_with_state(state, limit))
/// # }
/// # }
/// ```
///
/// Everything else comes from the decision itself: the deciding rule's name
/// ([`Source::rule`](ratewarden_core::Source::rule)) and the policy it was
/// decided under ([`Source::policy`](ratewarden_core::Source::policy)).
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    writer: HeaderWriter,
}

/// Everything [`RateLimitHeaders::write`] needs besides the decision, held
/// by value: a response future of the layer carries it instead of a
/// reference to the layer, whose count every request would write.
#[derive(Debug, Clone)]
pub(crate) struct HeaderWriter {
    mode: HeaderMode,
    /// The whole `RateLimit-Policy` value: it depends on the limiter only,
    /// made once over `'static` text ([`ratewarden_core::intern`]: it comes
    /// from configuration), so that a response's copy costs neither an
    /// allocation, nor a reference count on a line every request would
    /// share, nor checking its bytes again.
    policy: Option<HeaderValue>,
    /// Write [`X_RATELIMIT_SHADOW`] on a shadow refusal.
    shadow: bool,
}

impl RateLimitHeaders {
    /// The headers of `limiter`'s decisions, in `mode`.
    ///
    /// `RateLimit-Policy` lists the enforcing rules' policies: a rule in
    /// shadow mode is not the client's limit (all of them when every rule
    /// is in shadow mode, since one of them then answers).
    pub fn new(limiter: &Limiter, mode: HeaderMode) -> Self {
        let mut members = Vec::new();
        let every_shadow = limiter.rules().iter().all(|r| r.is_shadow());
        for rule in limiter
            .rules()
            .iter()
            .filter(|r| every_shadow || !r.is_shadow())
        {
            let durable = rule.escalation_policy().map(|p| (true, p));
            for (durable, policy) in std::iter::once((false, rule.policy())).chain(durable) {
                let mut name = StackBuf::<{ MAX_SF_NAME }>::new();
                name.push_sf_name(rule.name(), durable);
                members.push(format!(
                    "{};q={};w={}",
                    String::from_utf8_lossy(name.as_bytes()),
                    policy.limit(),
                    ceil_secs(policy.window())
                ));
            }
        }
        // The structured-field names are printable ASCII: always a valid
        // value, checked here all the same, since `HeaderValue::from_static`
        // would panic on any other.
        let policy = members.join(", ");
        let policy = HeaderValue::from_str(&policy)
            .is_ok()
            .then(|| HeaderValue::from_static(ratewarden_core::intern(&policy)));
        RateLimitHeaders {
            writer: HeaderWriter {
                mode,
                policy,
                shadow: false,
            },
        }
    }

    /// Also writes `X-RateLimit-Shadow: refused` on every response that a
    /// rule in shadow mode would have refused
    /// ([`Source::shadow_refused`](ratewarden_core::Source::shadow_refused)),
    /// whatever the mode: for watching a new limit from a client while it
    /// refuses no one. Off by default: it tells clients of a limit not yet
    /// enforced.
    pub fn with_shadow_header(mut self) -> Self {
        self.writer.shadow = true;
        self
    }

    /// The header mode.
    pub fn mode(&self) -> HeaderMode {
        self.writer.mode
    }

    /// Writes the headers of `decision` into `headers`, replacing any of the
    /// same names: the rate-limit headers of the mode, and `Retry-After` if
    /// `decision` is a refusal.
    pub fn write(&self, decision: &Decision, headers: &mut HeaderMap) {
        self.writer.write(decision, headers);
    }

    /// What writing a decision's headers takes from these.
    pub(crate) fn writer(&self) -> HeaderWriter {
        self.writer.clone()
    }

    /// The `429 Too Many Requests` response to `decision`: the headers of
    /// [`write`](Self::write) and a JSON body.
    ///
    /// ```json
    /// {"error":"rate_limited","retry_after":57,"limit":60,"remaining":0,"reset":60,
    ///  "policy":"search","window":60,"message":"Too many requests. Retry in 57 s."}
    /// ```
    pub fn refusal(&self, decision: &Decision) -> Refusal {
        let mut response = Response::new(self.refusal_body(decision));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let headers = response.headers_mut();
        // Sized for all of them at once: a map grown from empty allocates
        // its table twice (six headers, then seven), and with the default
        // mode a refusal carries seven.
        *headers = HeaderMap::with_capacity(self.refusal_headers());
        headers.insert(CONTENT_TYPE, APPLICATION_JSON);
        self.write(decision, headers);
        Refusal { response }
    }

    /// The `200 OK` answer to a quota request, from a peeked `decision`
    /// ([`Limiter::peek`](ratewarden_core::Limiter::peek)): the headers of
    /// [`write`](Self::write) and a JSON body. `remaining` is the units the
    /// client has now, as the last admitted response said (a fresh client
    /// of 60 per minute has 60).
    ///
    /// ```json
    /// {"allowed":true,"limit":60,"remaining":60,"reset":60,"retry_after":0,
    ///  "policy":"search","window":60}
    /// ```
    pub fn quota(&self, decision: &Decision) -> Response<Bytes> {
        let name = decision.source.rule.map_or("default", json_safe);
        let window = decision.source.policy.map_or(0, |p| ceil_secs(p.window()));
        let mut body = StackBuf::<{ MAX_REFUSAL_BODY }>::new();
        body.push(b"{\"allowed\":");
        body.push(if decision.allowed { b"true" } else { b"false" });
        body.push(b",\"limit\":");
        body.push_u64(u64::from(decision.limit));
        body.push(b",\"remaining\":");
        body.push_u64(u64::from(decision.remaining));
        body.push(b",\"reset\":");
        body.push_u64(decision.reset_after_secs());
        body.push(b",\"retry_after\":");
        body.push_u64(if decision.allowed {
            0
        } else {
            decision.retry_after_secs()
        });
        body.push(b",\"policy\":\"");
        body.push(name.as_bytes());
        if durable(decision) && name != "default" {
            body.push(b"/durable");
        }
        body.push(b"\",\"window\":");
        body.push_u64(window);
        body.push(b"}");
        let mut response = Response::new(Bytes::copy_from_slice(body.as_bytes()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, APPLICATION_JSON);
        headers.insert(CACHE_CONTROL, NO_STORE);
        self.write(decision, headers);
        response
    }

    /// How many headers [`refusal`](Self::refusal) writes: `Content-Type`,
    /// the mode's and `Retry-After`.
    fn refusal_headers(&self) -> usize {
        let mode = self.writer.mode;
        2 + 3 * usize::from(mode.legacy()) + 2 * usize::from(mode.draft())
    }

    fn refusal_body(&self, decision: &Decision) -> Bytes {
        let retry_after = decision.retry_after_secs();
        let name = decision.source.rule.map_or("default", json_safe);
        let window = decision.source.policy.map_or(0, |p| ceil_secs(p.window()));
        // Written by hand rather than through serde: a handful of integers
        // and one name that needs no escaping (rule names are
        // `A-Z a-z 0-9 _ - .`, with `/durable` at most), in the documented
        // field order. On the stack, then copied once: a `Vec` with room to
        // spare would cost `Bytes` a second allocation for its shared header.
        let mut body = StackBuf::<{ MAX_REFUSAL_BODY }>::new();
        body.push(b"{\"error\":\"rate_limited\",\"retry_after\":");
        body.push_u64(retry_after);
        body.push(b",\"limit\":");
        body.push_u64(u64::from(decision.limit));
        body.push(b",\"remaining\":");
        body.push_u64(u64::from(decision.remaining));
        body.push(b",\"reset\":");
        body.push_u64(decision.reset_after_secs());
        body.push(b",\"policy\":\"");
        body.push(name.as_bytes());
        if durable(decision) && name != "default" {
            body.push(b"/durable");
        }
        body.push(b"\",\"window\":");
        body.push_u64(window);
        body.push(b",\"message\":\"Too many requests. Retry in ");
        body.push_u64(retry_after);
        body.push(b" s.\"}");
        Bytes::copy_from_slice(body.as_bytes())
    }
}

impl HeaderWriter {
    /// [`RateLimitHeaders::write`].
    pub(crate) fn write(&self, decision: &Decision, headers: &mut HeaderMap) {
        let reset = decision.reset_after_secs();
        if self.mode.legacy() {
            headers.insert(X_RATELIMIT_LIMIT, number(u64::from(decision.limit)));
            headers.insert(X_RATELIMIT_REMAINING, number(u64::from(decision.remaining)));
            headers.insert(X_RATELIMIT_RESET, number(reset));
        }
        if self.mode.draft() {
            if let Some(policy) = &self.policy {
                headers.insert(RATELIMIT_POLICY, policy.clone());
            }
            if let Some(rule) = decision.source.rule {
                let mut buf = StackBuf::<{ MAX_RATELIMIT_LEN }>::new();
                buf.push_sf_name(rule, durable(decision));
                buf.push(b";r=");
                buf.push_u64(u64::from(decision.remaining));
                buf.push(b";t=");
                buf.push_u64(reset);
                if let Ok(value) = HeaderValue::from_bytes(buf.as_bytes()) {
                    headers.insert(RATELIMIT, value);
                }
            }
        }
        if !decision.allowed {
            headers.insert(RETRY_AFTER, number(decision.retry_after_secs()));
        }
        if self.shadow && decision.source.shadow_refused {
            headers.insert(X_RATELIMIT_SHADOW, SHADOW_REFUSED);
        }
    }
}

/// A `429 Too Many Requests` response, from [`RateLimitHeaders::refusal`].
///
/// With the `axum` feature it is an `IntoResponse`; otherwise
/// [`into_http`](Self::into_http) gives the response.
#[derive(Debug)]
pub struct Refusal {
    response: Response<Bytes>,
}

impl Refusal {
    /// The response.
    pub fn into_http(self) -> Response<Bytes> {
        self.response
    }
}

impl From<Refusal> for Response<Bytes> {
    fn from(refusal: Refusal) -> Self {
        refusal.response
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        self.response.map(axum::body::Body::from)
    }
}

/// The decision is an escalating rule's durable refusal, made under the
/// durable policy, which the headers name `{rule}/durable`.
fn durable(decision: &Decision) -> bool {
    decision.source.escalated && !decision.allowed
}

/// Rule names are validated by `ratewarden-core`; this keeps a body valid JSON
/// even if that rule were ever relaxed.
fn json_safe(name: &str) -> &str {
    if name
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    {
        name
    } else {
        "default"
    }
}

/// Numbers below this have their header value copied from [`DIGITS`].
const STATIC_NUMBERS: u64 = 10_000;

/// For each width of 1 to 5 digits, the first number of that width and
/// where its text starts in [`DIGITS`]: after every shorter number's (10 of
/// one digit, 90 of two, 900 of three, 9,000 of four). The fifth is where
/// the text ends.
const WIDTHS: [(u64, usize); 5] = {
    let mut out = [(0u64, 0usize); 5];
    let mut width = 1;
    while width < 5 {
        let (first, start) = out[width - 1];
        let next = if first == 0 { 10 } else { first * 10 };
        out[width] = (next, start + (next - first) as usize * width);
        width += 1;
    }
    out
};

const _: () = assert!(WIDTHS[4].0 == STATIC_NUMBERS);

/// Bytes of the decimal text of 0 to 9,999, one after another.
const DIGITS_LEN: usize = WIDTHS[4].1;

/// The text of every number below [`STATIC_NUMBERS`], built at compile
/// time. `HeaderValue::from(u32)` allocates the bytes of its text, and a
/// response's remaining units and seconds to reset are nearly always small:
/// a value sliced from static text is written with no allocation and
/// dropped with no free. Written by hand: no crate offers static decimal
/// text, and `itoa` (used for the larger numbers) formats into a buffer
/// that a `HeaderValue` must then copy.
static DIGITS: &str = match std::str::from_utf8(&DIGIT_BYTES) {
    Ok(text) => text,
    Err(_) => panic!("decimal digits are ASCII"),
};

/// The bytes of [`DIGITS`].
static DIGIT_BYTES: [u8; DIGITS_LEN] = {
    let mut out = [0u8; DIGITS_LEN];
    let (mut n, mut at) = (0, 0);
    while n < STATIC_NUMBERS {
        let width = number_width(n);
        let (mut i, mut rest) = (width, n);
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
};

/// The number of decimal digits of `n`, for `n` below [`STATIC_NUMBERS`].
const fn number_width(n: u64) -> usize {
    match n {
        0..10 => 1,
        10..100 => 2,
        100..1_000 => 3,
        _ => 4,
    }
}

/// `n` as a header value: sliced from [`DIGITS`] below [`STATIC_NUMBERS`],
/// formatted (one allocation) above.
fn number(n: u64) -> HeaderValue {
    if n >= STATIC_NUMBERS {
        return HeaderValue::from(n);
    }
    let width = number_width(n);
    let (first, start) = WIDTHS[width - 1];
    // Below 10,000: the offsets are below DIGITS_LEN, far from overflow.
    let at = start + (n - first) as usize * width;
    match DIGITS.get(at..at + width) {
        Some(text) => HeaderValue::from_static(text),
        None => HeaderValue::from(n),
    }
}

/// The longest `RateLimit` value: a name of at most 64 characters and
/// `/durable` (escaped: at most twice as long, and quotes), then two
/// integers of at most 20 digits.
const MAX_RATELIMIT_LEN: usize = MAX_SF_NAME + 3 + 20 + 3 + 20;

/// The longest structured-field name: a rule name of at most 64 characters
/// and `/durable`, escaped (at most twice as long), and quotes.
const MAX_SF_NAME: usize = 2 * 72 + 2;

/// The longest refusal body: its fixed text (136 bytes), a policy name of
/// at most [`MAX_RULE_NAME`](ratewarden_core::MAX_RULE_NAME) and `/durable`,
/// two `u32`s (at most 10 digits) and four `u64`s (20).
const MAX_REFUSAL_BODY: usize = 136 + ratewarden_core::MAX_RULE_NAME + 8 + 2 * 10 + 4 * 20;

/// A byte buffer on the stack, so a header value costs no allocation
/// before the one `HeaderValue` makes. Written by hand: the one crate doing
/// this (`arrayvec`) would be a dependency for six lines.
struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }

    /// Appends what fits; a value longer than `N` is cut, and a cut value
    /// is still ASCII.
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// `name` (and `/durable`) as a structured-field string (RFC 9651
    /// §3.3.3): printable ASCII, with `"` and `\` escaped. Other characters
    /// cannot be represented and become `_`, so any name yields a valid
    /// header.
    fn push_sf_name(&mut self, name: &str, durable: bool) {
        self.push(b"\"");
        // A rule's name (`A–Z a–z 0–9 _ - .`) needs no escaping: copied at
        // once, not byte by byte, on the path of every response.
        let plain = |b: &u8| (b' '..=b'~').contains(b) && *b != b'"' && *b != b'\\';
        if name.as_bytes().iter().all(plain) {
            self.push(name.as_bytes());
        } else {
            self.push_escaped(name);
        }
        if durable {
            self.push(b"/durable");
        }
        self.push(b"\"");
    }

    /// `name` inside an sf-string: `"` and `\` escaped, anything outside
    /// printable ASCII replaced by `_`.
    fn push_escaped(&mut self, name: &str) {
        for c in name.chars() {
            match c {
                '"' | '\\' => self.push(&[b'\\', c as u8]),
                ' '..='~' => self.push(&[c as u8]),
                _ => self.push(b"_"),
            }
        }
    }

    fn push_u64(&mut self, n: u64) {
        self.push(itoa::Buffer::new().format(n).as_bytes());
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn ceil_secs(d: std::time::Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sf_name(name: &str, durable: bool) -> String {
        let mut buf = StackBuf::<{ MAX_SF_NAME }>::new();
        buf.push_sf_name(name, durable);
        String::from_utf8(buf.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn sf_strings_escape_and_replace() {
        assert_eq!(sf_name("search", false), "\"search\"");
        assert_eq!(sf_name("search", true), "\"search/durable\"");
        assert_eq!(sf_name("a\"b\\c", false), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_name("tab\there é", false), "\"tab_here _\"");
    }

    #[test]
    fn windows_round_up_to_seconds() {
        assert_eq!(ceil_secs(Duration::from_secs(60)), 60);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
    }

    #[test]
    fn the_longest_ratelimit_value_fits() {
        let name = "\"".repeat(ratewarden_core::MAX_RULE_NAME);
        let mut buf = StackBuf::<{ MAX_RATELIMIT_LEN }>::new();
        buf.push_sf_name(&name, true);
        buf.push(b";r=");
        buf.push_u64(u64::MAX);
        buf.push(b";t=");
        buf.push_u64(u64::MAX);
        assert!(buf.as_bytes().ends_with(u64::MAX.to_string().as_bytes()));
    }

    #[test]
    fn static_numbers_are_the_numbers() {
        let around_the_edge = [STATIC_NUMBERS, STATIC_NUMBERS + 1, u64::MAX];
        for n in (0..STATIC_NUMBERS + 50).chain(around_the_edge) {
            assert_eq!(number(n), HeaderValue::from(n), "{n}");
        }
    }

    #[test]
    fn json_names_stay_json() {
        assert_eq!(json_safe("search.v2-x_y/durable"), "search.v2-x_y/durable");
        assert_eq!(json_safe("a\"b"), "default");
    }
}
