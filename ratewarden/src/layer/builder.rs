//! [`RateLimitLayerBuilder`]: every choice a layer is built with, checked
//! once, at [`build`](RateLimitLayerBuilder::build).

use super::*;

/// Builds a [`RateLimitLayer`]; see [`RateLimitLayer::builder`].
pub struct RateLimitLayerBuilder {
    pub(super) plans: Plans,
    pub(super) choose: Option<Box<ChooseFn>>,
    pub(super) identity: ClientIdentity,
    pub(super) key: Option<Box<dyn KeyExtractor>>,
    pub(super) on_missing_key: MissingKey,
    pub(super) access: AccessList,
    pub(super) skip: Option<Box<SkipFn>>,
    pub(super) cost: Option<Box<CostFn>>,
    pub(super) counts: Option<Box<CountsFn>>,
    pub(super) refusal: Option<Box<RefusalFn>>,
    pub(super) mode: HeaderMode,
    pub(super) shadow_header: bool,
    pub(super) grpc: bool,
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("plans", &self.plans)
            .field("key", &self.key)
            .field("on_missing_key", &self.on_missing_key)
            .field("headers", &self.mode)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// Keys requests with `extractor` instead of by client address (see
    /// [`crate::key`]).
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Some(Box::new(extractor));
        self
    }

    /// What to do with a request whose key cannot be extracted;
    /// [`MissingKey::ClientAddress`] unless set.
    pub fn on_missing_key(mut self, on_missing_key: MissingKey) -> Self {
        self.on_missing_key = on_missing_key;
        self
    }

    /// Passes the requests for which `skip` is true straight to the inner
    /// service: not charged, not refused, and without rate-limit headers
    /// (health checks, internal callers). Runs before the key is extracted.
    ///
    /// Whatever the predicate reads must be something a client cannot
    /// forge, or every client will send it.
    pub fn skip(mut self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.skip = Some(Box::new(skip));
        self
    }

    /// Charges each request what `cost` says instead of 1, in every rule
    /// (times the rule's own [`Rule::with_units_per_request`](ratewarden_core::Rule::with_units_per_request));
    /// see [`Limiter::check_cost`]. A cost of 0 is charged as 1: a request
    /// is never free (skip it instead). A request costing more than some
    /// rule could ever admit is answered `413 Content Too Large`, charged
    /// nothing: no wait would let it through, so a 429 would send its
    /// client into a retry loop.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(cost));
        self
    }

    /// Decides each request under the plan `choose` names, among the
    /// [`Plans`] the layer was built with: the plan an authentication layer
    /// put in the request's extensions, or one looked up from the request.
    /// A request for which it names none, or a plan that does not exist,
    /// gets the default plan. Every plan counts the same usage, so a
    /// client's requests count on its new plan after it changes.
    ///
    /// Whatever `choose` reads must be something a client cannot forge
    /// (a verified token, not a header it writes itself), or every client
    /// will claim the largest plan.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use ratewarden::{ClientIdentity, Plans, RateLimitLayer, Store};
    /// # fn f(store: Arc<dyn Store>) -> Result<(), ratewarden::ConfigError> {
    /// /// Set by the application's authentication layer.
    /// #[derive(Clone)]
    /// struct Customer { plan: &'static str }
    ///
    /// let plans = Plans::builder("api", store)
    ///     .plan("free", "100/h")
    ///     .plan("pro", "1000/h")
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(plans, ClientIdentity::new([7u8; 32])?)
    ///     .plan(|parts| parts.extensions.get::<Customer>().map(|c| c.plan))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn plan<F>(mut self, choose: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.choose = Some(Box::new(choose));
        self
    }

    /// Counts only the requests whose response status `counts` accepts: a
    /// login route counts its failures (`|s| s == StatusCode::UNAUTHORIZED`),
    /// a route can count only its successes (`|s| s.is_success()`). Each
    /// request is still decided before the inner service sees it, so a
    /// refused client never reaches it; one whose response should not count
    /// is given back to every rule once the response is ready
    /// ([`Limiter::check_admission`](ratewarden_core::Limiter::check_admission)),
    /// before the response is returned. The rate-limit headers are those of
    /// the decision, made before the response was known. A request whose
    /// inner service fails (an error, not a status) stays counted.
    ///
    /// ```
    /// use http::StatusCode;
    /// # fn f(b: ratewarden::layer::RateLimitLayerBuilder) -> ratewarden::layer::RateLimitLayerBuilder {
    /// b.count_only(|status| status == StatusCode::UNAUTHORIZED) // failed logins
    /// # }
    /// ```
    pub fn count_only(
        mut self,
        counts: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.counts = Some(Box::new(counts));
        self
    }

    /// Builds refusals with `refusal` instead of the default JSON body. The
    /// rate-limit headers and `Retry-After` are written over the response
    /// it returns, whatever its status. Its body is read whole before it is
    /// sent; should reading fail, the default refusal is sent instead.
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::response::IntoResponse;
    /// use http::StatusCode;
    /// # fn f(b: ratewarden::layer::RateLimitLayerBuilder) -> ratewarden::layer::RateLimitLayerBuilder {
    /// b.refusal(|decision| {
    ///     let wait = decision.retry_after_secs();
    ///     (StatusCode::TOO_MANY_REQUESTS, format!("Slow down: try again in {wait} s.\n"))
    ///         .into_response()
    /// })
    /// # }
    /// # }
    /// ```
    pub fn refusal<F, B>(mut self, refusal: F) -> Self
    where
        F: Fn(&Decision) -> Response<B> + Send + Sync + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: fmt::Display,
    {
        self.refusal = Some(Box::new(move |decision| {
            let (parts, body) = refusal(decision).into_parts();
            Box::pin(async move {
                match body.collect().await {
                    Ok(body) => Some(Response::from_parts(parts, body.to_bytes())),
                    Err(e) => {
                        tracing::warn!(error = %e, "custom refusal body failed; default sent");
                        None
                    }
                }
            })
        }));
        self
    }

    /// Serves a tonic (gRPC) service: every answer the layer gives itself
    /// is a gRPC status in a trailers-only response, which a tonic client
    /// reads as the call's error. A refusal is `RESOURCE_EXHAUSTED`, its
    /// details a `google.rpc.RetryInfo` with the refusal's retry delay
    /// (`tonic_types::StatusExt::get_error_details`), and the rate-limit
    /// headers come as the status's metadata; a request without a key is
    /// `INVALID_ARGUMENT` (or the code nearest the [`MissingKey::Reject`]
    /// status), one costing more than a rule ever admits
    /// `INVALID_ARGUMENT`, one without a client address `INTERNAL`. A
    /// custom [`refusal`](Self::refusal) still answers as it is written.
    /// Refused with [`count_only`](Self::count_only) by
    /// [`build`](Self::build): a gRPC call's outcome is not its HTTP status.
    ///
    /// Requests are keyed by the peer address tonic records for a plain TCP
    /// connection (`TcpConnectInfo`). Behind tonic's own TLS it records
    /// `TlsConnectInfo` instead, which this feature does not read: key
    /// such a server's requests with a [`key`](Self::key) extractor, or
    /// put the peer's `SocketAddr` into each request's extensions.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden::{ClientIdentity, Limiter, Policy, RateLimitLayer, Rule};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = std::sync::Arc::new(ratewarden::memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("grpc", store, Policy::sliding_window(100, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(limiter, ClientIdentity::random()?).grpc().build()?;
    /// // tonic::transport::Server::builder().layer(layer).add_service(…)
    /// # let _ = layer; Ok(()) }
    /// ```
    #[cfg(feature = "grpc")]
    pub fn grpc(mut self) -> Self {
        self.grpc = true;
        self
    }

    /// Which rate-limit headers responses carry: the draft's
    /// `RateLimit-Policy` and `RateLimit` ([`HeaderMode::Draft11`]) unless
    /// set; `Retry-After` on every refusal whatever the mode.
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.mode = mode;
        self
    }

    /// Refuses the clients `list` denies with `403 Forbidden` (gRPC
    /// `PERMISSION_DENIED`) before any store is asked, and passes the
    /// clients it allows unlimited, without rate-limit headers; see
    /// [`crate::access`]. Replaces any list set before.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden::access::AccessList;
    /// use ratewarden::{ClientIdentity, Gate, Limiter, Policy, RateLimitLayer, Rule};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store = std::sync::Arc::new(ratewarden::memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("api", store, Policy::fixed_window(1, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(limiter, ClientIdentity::random()?)
    ///     .access(AccessList::new().deny("192.0.2.0/24")?.allow("10.0.0.0/8")?)
    ///     .build()?;
    /// let from = |addr: [u8; 4]| {
    ///     let mut request = http::Request::new(());
    ///     request.extensions_mut().insert(std::net::SocketAddr::from((addr, 4000)));
    ///     request.into_parts().0
    /// };
    /// let Gate::Respond(denied) = layer.gate(&from([192, 0, 2, 7])).await else { panic!() };
    /// assert_eq!(denied.status(), 403);
    /// for _ in 0..3 {
    ///     assert!(matches!(layer.gate(&from([10, 0, 0, 1])).await, Gate::Pass));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn access(mut self, list: AccessList) -> Self {
        self.access = list;
        self
    }

    /// Writes `X-RateLimit-Shadow: refused` on each response a rule in
    /// shadow mode would have refused
    /// ([`RateLimitHeaders::with_shadow_header`]). Off by default.
    pub fn shadow_header(mut self) -> Self {
        self.shadow_header = true;
        self
    }

    /// Builds the layer. Refuses a [`MissingKey::Reject`] status that is not
    /// a client error (400 to 499), and a [random
    /// identity](ClientIdentity::random) with a rule whose store other
    /// processes share: each process would key a client differently, so a
    /// fleet of `N` would admit `N` times the limit.
    ///
    /// Refuses a [`plan`](Self::plan) chooser with a single plan: every
    /// request would get the same limit whatever it names.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if self.choose.is_some() && self.plans.iter().len() == 1 {
            return Err(ConfigError::Invalid(
                "a plan chooser needs several plans to choose from: build the layer from Plans"
                    .into(),
            ));
        }
        if self.identity.is_random()
            && let Some(rule) = self
                .plans
                .iter()
                .flat_map(|(_, limiter)| limiter.rules())
                .find(|rule| rule.store().capabilities().shared)
        {
            return Err(ConfigError::Invalid(format!(
                "rule {:?} counts in a store other processes share, so every process must \
                 derive the same client keys: give each the same secret with \
                 ClientIdentity::new instead of ClientIdentity::random",
                rule.name()
            )));
        }
        if self.grpc && self.counts.is_some() {
            return Err(ConfigError::Invalid(
                "count_only cannot judge a gRPC call: every call answers HTTP 200 and its \
                 outcome travels in grpc-status"
                    .into(),
            ));
        }
        if let MissingKey::Reject(status) = self.on_missing_key
            && !status.is_client_error()
        {
            return Err(ConfigError::Invalid(format!(
                "a request without a key must be refused with a client error (400 to 499), \
                 not {status}"
            )));
        }
        Ok(self.assemble())
    }

    fn assemble(self) -> RateLimitLayer {
        let limiters = self
            .plans
            .iter()
            .map(|(_, limiter)| {
                let headers = RateLimitHeaders::new(limiter, self.mode);
                let headers = match self.shadow_header {
                    true => headers.with_shadow_header(),
                    false => headers,
                };
                (limiter.clone(), headers)
            })
            .collect();
        let address = || ClientAddress::new(self.identity.clone());
        let (key, missing): (Box<dyn KeyExtractor>, _) = match (self.key, self.on_missing_key) {
            (None, _) => (Box::new(address()), Missing::NoAddress),
            (Some(key), MissingKey::ClientAddress) => (key, Missing::Address(address())),
            (Some(key), MissingKey::Reject(status)) => (key, Missing::Reject(status)),
        };
        RateLimitLayer {
            shared: Arc::new(Shared {
                plans: self.plans,
                limiters,
                choose: self.choose,
                identity: self.identity,
                key,
                missing,
                no_address_logged: AtomicBool::new(false),
                access: self.access,
                skip: self.skip,
                cost: self.cost,
                counts: self.counts,
                refusal: self.refusal,
                grpc: self.grpc,
            }),
        }
    }
}
