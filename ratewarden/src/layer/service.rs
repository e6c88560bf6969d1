//! [`RateLimit`], the service a layer wraps around another: where every
//! request enters, is taken as far as it goes without awaiting
//! ([`Shared::begin`]), and is answered at once or boxed with what is left.

use super::*;

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service a [`RateLimitLayer`] wraps around another.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What the layer does with one request, decided before its future is built.
pub(super) enum Classified {
    Skip,
    /// On the layer's deny list.
    Deny,
    Reject(StatusCode),
    /// Keyed by address, with none to be had: the server's mistake.
    NoAddress,
    /// The key, the cost, and the plan's place in the layer's plans.
    Check(ClientKey, u32, usize),
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    // Held while a response that must not count is given back
    // ([`RateLimitLayerBuilder::count_only`]).
    ResBody: Send,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // Moving the head out and back is two moves, and gives the
        // extractor and the closures one type to read, whatever the body.
        let (parts, body) = request.into_parts();
        let step = self.shared.begin(&parts);
        let mut request = Request::from_parts(parts, body);
        // A request decided without waiting (rules on memory stores, a
        // skipped request, a refusal of the layer's own) gets no boxed
        // future, no clone of the inner service and no count on the shared
        // layer state; one that must wait carries what was asked into the
        // boxed future, which asks nothing again.
        let awaiting = match step {
            Step::Pass => return ResponseFuture::inner(self.inner.call(request), None),
            Step::Admitted(decision, plan) => {
                let headers = self.shared.headers(plan).writer();
                request.extensions_mut().insert(decision.clone());
                return ResponseFuture::inner(self.inner.call(request), Some((decision, headers)));
            }
            Step::Respond(response) => {
                return ResponseFuture::ready(response.map(RateLimitBody::full));
            }
            Step::Await(awaiting) => awaiting,
        };
        let shared = self.shared.clone();
        // The inner service was driven to readiness in poll_ready; take that
        // one and leave a clone in its place (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::boxed(async move {
            match awaiting.gate(&shared).await {
                Gate::Pass => {
                    let response = inner.call(request).await?;
                    Ok(response.map(RateLimitBody::inner))
                }
                Gate::Respond(response) => Ok(response.map(RateLimitBody::full)),
                Gate::Admitted(mut admitted) => {
                    request.extensions_mut().insert(admitted.decision().clone());
                    let mut response = inner.call(request).await?;
                    if let Some(shown) = response.extensions_mut().remove::<Decision>() {
                        admitted.show(shown);
                    }
                    admitted
                        .finish(response.status(), response.headers_mut())
                        .await;
                    Ok(response.map(RateLimitBody::inner))
                }
            }
        })
    }
}
