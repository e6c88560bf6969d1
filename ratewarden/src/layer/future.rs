//! [`ResponseFuture`]: the inner service's future with the decision's
//! headers to write, a ready response, or a boxed future for a request a
//! store must be awaited for.

use super::*;

type BoxResponseFuture<B, E> = BoxFuture<Result<Response<RateLimitBody<B>>, E>>;

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`] service's response.
    ///
    /// A request decided at once (see
    /// [`Limiter::try_check`](ratewarden_core::Limiter::try_check)) is
    /// the inner service's future and the decision's headers, written when
    /// the response comes; a refusal is a ready response; anything that
    /// waits on a store is boxed.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Inner {
            #[pin]
            future: F,
            // The decision whose headers the response gets; none for a
            // request the layer does not limit.
            decided: Option<(Decision, HeaderWriter)>,
        },
        Ready { response: Option<Response<RateLimitBody<B>>> },
        Boxed { future: BoxResponseFuture<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(super) fn inner(future: F, decided: Option<(Decision, HeaderWriter)>) -> Self {
        ResponseFuture {
            state: State::Inner { future, decided },
        }
    }

    pub(super) fn ready(response: Response<RateLimitBody<B>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(super) fn boxed(
        future: impl Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Inner { .. } => "inner",
            State::Ready { .. } => "ready",
            State::Boxed { .. } => "boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future, decided } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some((decision, headers)) = decided {
                    // A decision the handler put in its response (the
                    // state after a penalty) is shown instead.
                    match response.extensions_mut().remove::<Decision>() {
                        Some(shown) => headers.write(&shown, response.headers_mut()),
                        None => headers.write(decision, response.headers_mut()),
                    }
                }
                Poll::Ready(Ok(response.map(RateLimitBody::inner)))
            }
            StateProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("a ResponseFuture is not polled after it is ready"))),
            StateProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}
