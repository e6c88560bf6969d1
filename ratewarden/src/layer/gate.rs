//! The road of every request: [`Shared::begin`] takes it as far as it goes
//! without awaiting, making each choice about it once, and
//! [`Awaiting::gate`] awaits what is left. [`Gate`] is where it ends, for
//! tower's service and for a server other than tower's.

use super::*;

/// What the layer makes of a request, from its head alone: the road tower's
/// service takes, whole, for a server adapter other than tower's
/// (`ratewarden-actix`), so that the adapters cannot drift apart. From
/// [`RateLimitLayer::gate`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Gate {
    /// Not limited ([`RateLimitLayerBuilder::skip`]): call the handler and
    /// send its response as it is.
    Pass,
    /// Admitted: call the handler, then [`finish`](Admitted::finish) its
    /// response.
    Admitted(Admitted),
    /// Send this response instead of calling the handler: a refusal, or an
    /// error of the layer's own (no key, no client address, a cost no
    /// rule admits).
    Respond(Response<Bytes>),
}

/// An admitted request whose response is still to come; see [`Gate`].
#[must_use = "an admitted request is finished with its response's status and headers"]
pub struct Admitted {
    decision: Decision,
    plan: usize,
    shared: Arc<Shared>,
    /// Kept to give the request back if its response must not count
    /// ([`RateLimitLayerBuilder::count_only`]); boxed, since few layers
    /// count only some responses and every `Gate` is moved.
    admission: Option<Box<Admission>>,
}

impl fmt::Debug for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admitted")
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    /// The decision, which the tower layer also puts in the request's
    /// extensions for the handler.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Writes `decision`'s headers instead of the admission's when the
    /// request is [finished](Self::finish): what the handler learned of the
    /// client's quota since (the state after a penalty,
    /// [`RateLimitLayer::penalize_and_peek`]). The tower layer does this
    /// for a [`Decision`] the handler puts in its response's extensions.
    pub fn show(&mut self, decision: Decision) {
        self.decision = decision;
    }

    /// Completes the request once the handler has answered with `status`:
    /// gives the request back if a [`count_only`](RateLimitLayerBuilder::count_only)
    /// rule says that status does not count, and writes the rate-limit
    /// headers into the response's `headers`.
    pub async fn finish(self, status: StatusCode, headers: &mut http::HeaderMap) {
        if let (Some(admission), Some(counts)) = (self.admission, &self.shared.counts)
            && !counts(status)
        {
            admission.refund().await;
        }
        self.shared
            .headers(self.plan)
            .write(&self.decision, headers);
    }
}

impl RateLimitLayer {
    /// Decides a request from its head as the layer would: for serving
    /// through a framework that is not tower's. The peer address, if
    /// requests are keyed by it, goes in `parts.extensions` as a
    /// [`SocketAddr`](std::net::SocketAddr).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden::{ClientIdentity, Gate, Limiter, Policy, RateLimitLayer, Rule};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store = std::sync::Arc::new(ratewarden::memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("api", store, Policy::fixed_window(1, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// let layer = RateLimitLayer::new(limiter, ClientIdentity::new([7u8; 32])?)?;
    /// let head = || {
    ///     let mut request = http::Request::new(());
    ///     request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 4000)));
    ///     request.into_parts().0
    /// };
    /// let Gate::Admitted(admitted) = layer.gate(&head()).await else { panic!() };
    /// let mut headers = http::HeaderMap::new(); // the handler's response's
    /// admitted.finish(http::StatusCode::OK, &mut headers).await;
    /// assert_eq!(headers["ratelimit"], "\"api\";r=0;t=60");
    /// let Gate::Respond(refusal) = layer.gate(&head()).await else { panic!() };
    /// assert_eq!(refusal.status(), 429);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn gate(&self, parts: &Parts) -> Gate {
        match self.shared.begin(parts) {
            Step::Pass => Gate::Pass,
            Step::Respond(response) => Gate::Respond(response),
            Step::Admitted(decision, plan) => Gate::Admitted(Admitted {
                decision,
                plan,
                shared: self.shared.clone(),
                admission: None,
            }),
            Step::Await(awaiting) => awaiting.gate(&self.shared).await,
        }
    }
}

/// How far a request got without awaiting anything, from
/// [`Shared::begin`]: every choice about it is made there, once.
pub(super) enum Step {
    /// Not limited ([`RateLimitLayerBuilder::skip`]).
    Pass,
    /// Admitted under this plan, with nothing to give back later.
    Admitted(Decision, usize),
    /// Answered without the inner service: a refusal, or an error of the
    /// layer's own.
    Respond(Response<Bytes>),
    /// Something must be awaited first.
    Await(Awaiting),
}

/// What a request waits on before the layer knows its [`Gate`].
pub(super) enum Awaiting {
    /// A store, for the limiter's decision under this plan.
    Decision(PendingCheck, usize),
    /// A store, for an admission that a
    /// [`count_only`](RateLimitLayerBuilder::count_only) rule may give back
    /// (key, cost, plan): it has no inline form.
    Admission(ClientKey, u32, usize),
    /// The application's own refusal
    /// ([`RateLimitLayerBuilder::refusal`]) of this decision.
    Refusal(Decision, usize),
}

impl Awaiting {
    /// Awaits what is left and answers with the request's [`Gate`].
    pub(super) async fn gate(self, shared: &Arc<Shared>) -> Gate {
        let (decision, plan, admission) = match self {
            Awaiting::Decision(pending, plan) => (pending.decide().await, plan, None),
            Awaiting::Admission(key, cost, plan) => {
                match shared
                    .limiter(plan)
                    .check_admission(key.as_bytes(), cost)
                    .await
                {
                    Ok(admission) => (
                        admission.decision().clone(),
                        plan,
                        Some(Box::new(admission)),
                    ),
                    Err(_) => return Gate::Respond(shared.own(Own::Cost)),
                }
            }
            Awaiting::Refusal(decision, plan) => {
                return Gate::Respond(shared.custom_refusal(&decision, plan).await);
            }
        };
        if !decision.allowed {
            return Gate::Respond(match shared.refusal_now(decision, plan) {
                Ok(response) => response,
                Err(decision) => shared.custom_refusal(&decision, plan).await,
            });
        }
        Gate::Admitted(Admitted {
            decision,
            plan,
            shared: shared.clone(),
            admission,
        })
    }
}

impl Shared {
    /// Takes a request as far as it goes from its head without awaiting:
    /// classified (skipped, answered for want of a key or an address, or
    /// checked under its key, cost and plan), then decided inline when no
    /// store must be awaited. The one road of every request, tower's and
    /// [`RateLimitLayer::gate`]'s.
    // Inlined into `RateLimit::call`, where the `Step` is matched in place:
    // returned from a call, it was copied, about 85 more instructions per
    // request of the HTTP bench (callgrind).
    #[inline]
    pub(super) fn begin(&self, parts: &Parts) -> Step {
        let (key, cost, plan) = match self.classify(parts) {
            Classified::Check(key, cost, plan) => (key, cost, plan),
            Classified::Skip => return Step::Pass,
            Classified::Reject(status) => return Step::Respond(self.own(Own::MissingKey(status))),
            Classified::NoAddress => return Step::Respond(self.own(Own::NoAddress)),
            Classified::Deny => return Step::Respond(self.own(Own::Denied)),
        };
        if self.counts.is_some() {
            return Step::Await(Awaiting::Admission(key, cost, plan));
        }
        match self.limiter(plan).try_check_cost(key.as_bytes(), cost) {
            Ok(Ok(decision)) if decision.allowed => Step::Admitted(decision, plan),
            Ok(Ok(decision)) => match self.refusal_now(decision, plan) {
                Ok(response) => Step::Respond(response),
                Err(decision) => Step::Await(Awaiting::Refusal(decision, plan)),
            },
            Ok(Err(pending)) => Step::Await(Awaiting::Decision(pending, plan)),
            Err(_) => Step::Respond(self.own(Own::Cost)),
        }
    }

    /// The layer's own refusal of `decision`, at once; or, given the
    /// decision back, the application's is to be awaited
    /// ([`custom_refusal`](Self::custom_refusal)). The one place that
    /// chooses between them.
    fn refusal_now(&self, decision: Decision, plan: usize) -> Result<Response<Bytes>, Decision> {
        match self.refusal {
            None => Ok(self.default_refusal(&decision, plan)),
            Some(_) => Err(decision),
        }
    }
}
