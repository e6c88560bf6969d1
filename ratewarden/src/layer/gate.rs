//! [`Gate`]: the road of a request a store must be awaited for, and the
//! whole road for a server other than tower's.

use super::*;

/// What the layer makes of a request, from its head alone: the one road
/// every request takes that is not decided inline, and the whole road for
/// a server adapter other than tower's (`ratewarden-actix`), so that the
/// adapters cannot drift apart. From [`RateLimitLayer::gate`].
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
    /// assert_eq!(headers["x-ratelimit-remaining"], "0");
    /// let Gate::Respond(refusal) = layer.gate(&head()).await else { panic!() };
    /// assert_eq!(refusal.status(), 429);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn gate(&self, parts: &Parts) -> Gate {
        let classified = self.shared.classify(parts);
        through(&self.shared, classified, None).await
    }
}

/// The [`Gate`] of a `classified` request, awaiting `pending` if the
/// limiter began deciding it inline.
pub(super) async fn through(
    shared: &Arc<Shared>,
    classified: Classified,
    pending: Option<PendingCheck>,
) -> Gate {
    let (key, cost, plan) = match classified {
        Classified::Check(key, cost, plan) => (key, cost, plan),
        Classified::Skip => return Gate::Pass,
        Classified::Reject(status) => return Gate::Respond(shared.own(Own::MissingKey(status))),
        Classified::NoAddress => return Gate::Respond(shared.own(Own::NoAddress)),
    };
    let limiter = shared.limiter(plan);
    let (decision, admission) = if shared.counts.is_some() {
        match limiter.check_admission(key.as_bytes(), cost).await {
            Ok(admission) => (admission.decision().clone(), Some(Box::new(admission))),
            Err(_) => return Gate::Respond(shared.own(Own::Cost)),
        }
    } else {
        match pending {
            Some(pending) => (pending.decide().await, None),
            None => match limiter.check_cost(key.as_bytes(), cost).await {
                Ok(decision) => (decision, None),
                Err(_) => return Gate::Respond(shared.own(Own::Cost)),
            },
        }
    };
    if !decision.allowed {
        return Gate::Respond(shared.refusal(&decision, plan).await);
    }
    Gate::Admitted(Admitted {
        decision,
        plan,
        shared: shared.clone(),
        admission,
    })
}
