//! The answer to one request.

use std::time::Duration;

use crate::algorithm::Verdict;
use crate::failure::FailurePolicy;
use crate::policy::Policy;

/// Who answered a [`Decision`], and whether it was the store the rule names.
///
/// Build one with [`Source::store`] and set the flags that apply; new flags
/// may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Source {
    /// The [`Store::name`](crate::Store::name) of the store that decided, or
    /// of the store that failed when the failure policy decided instead.
    pub store: &'static str,
    /// The rule of a [`Limiter`](crate::Limiter) that produced this decision,
    /// if it came through one. A `&'static str` rather than a shared string:
    /// naming the rule then costs a decision no reference count, which every
    /// thread's decisions would otherwise write on one cache line (rule
    /// names are interned; see [`Rule::new`](crate::Rule::new)).
    pub rule: Option<&'static str>,
    /// The policy that rule decided under, if the decision came through a
    /// [`Limiter`](crate::Limiter): the rule's own, or for an escalating
    /// rule's durable refusal the durable policy. Rate-limit headers
    /// describe this one, so that a limit and its window always belong
    /// together. Interned with the rule, as its name is, so that carrying
    /// it costs a decision one pointer.
    pub policy: Option<&'static Policy>,
    /// The authoritative store failed and a fallback store answered.
    pub fallback: bool,
    /// No store answered: the failure policy (open or closed) decided.
    pub degraded: bool,
    /// An escalating rule consulted its durable store for this request.
    pub escalated: bool,
    /// A refusal repeated from the rule's refusal cache: the store refused
    /// this key moments ago and was not asked again (see
    /// [`Rule::with_refusal_cache`](crate::Rule::with_refusal_cache)).
    pub cached: bool,
    /// A rule in shadow mode would have refused this request, and was not
    /// let to: the request went on as if that rule had admitted it (see
    /// [`Rule::with_shadow`](crate::Rule::with_shadow)). Set on the
    /// limiter's answer, whichever rule that answer names.
    pub shadow_refused: bool,
    /// A refusal of the policy's [`Ban`](crate::Ban): the key was banned
    /// by this request's refusal or is serving a ban (see
    /// [`ban`](crate::ban)). Set by the store.
    pub banned: bool,
}

impl Source {
    /// A plain answer from `store`.
    pub fn store(store: &'static str) -> Self {
        Source {
            store,
            rule: None,
            policy: None,
            fallback: false,
            degraded: false,
            escalated: false,
            cached: false,
            shadow_refused: false,
            banned: false,
        }
    }
}

/// Whether a request is admitted, and everything an HTTP layer needs to say
/// so: the limit, what remains, when the key resets and when to retry, and
/// who answered (through a [`Limiter`](crate::Limiter): which rule, under
/// which policy).
///
/// Build one with [`from_verdict`](Self::from_verdict) (a store applying an
/// [`algorithm`](crate::algorithm)), [`new`](Self::new) or
/// [`degraded`](Self::degraded); fields may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// The request is admitted (and was counted).
    pub allowed: bool,
    /// The policy's limit.
    pub limit: u32,
    /// Units that could still be admitted now, after this request; in the
    /// answer of a peek ([`Limiter::peek`](crate::Limiter::peek)), which
    /// spends nothing, the units available now.
    pub remaining: u32,
    /// Time until the key is back to its full quota if no further request
    /// is admitted.
    pub reset_after: Duration,
    /// Zero when admitted; when refused, the shortest wait after which the
    /// same request would be admitted (one microsecond earlier it would not).
    pub retry_after: Duration,
    /// Who answered.
    pub source: Source,
}

impl Decision {
    /// A decision from an algorithm's verdict, answered by `store`.
    pub fn from_verdict(verdict: Verdict, policy: &Policy, store: &'static str) -> Self {
        Decision::new(
            verdict.allowed,
            policy,
            verdict.remaining,
            Duration::from_micros(verdict.reset_after_us),
            Duration::from_micros(verdict.retry_after_us),
            store,
        )
    }

    /// [`from_verdict`](Self::from_verdict) of what [`ban::decide`](crate::ban::decide)
    /// returns: the verdict, and whether it is a ban's refusal
    /// ([`Source::banned`]).
    pub fn from_ban_verdict(
        (verdict, banned): (Verdict, bool),
        policy: &Policy,
        store: &'static str,
    ) -> Self {
        let mut d = Decision::from_verdict(verdict, policy, store);
        d.source.banned = banned;
        d
    }

    /// A decision under `policy` answered by `store`, with no flags set on
    /// its [`Source`].
    pub fn new(
        allowed: bool,
        policy: &Policy,
        remaining: u32,
        reset_after: Duration,
        retry_after: Duration,
        store: &'static str,
    ) -> Self {
        Decision {
            allowed,
            limit: policy.limit(),
            remaining,
            reset_after,
            retry_after,
            source: Source::store(store),
        }
    }

    /// What `on_failure` answers for a request under `policy` when no store
    /// answered: admitted ([`Open`](FailurePolicy::Open)) or refused
    /// ([`Closed`](FailurePolicy::Closed)), nothing remaining, marked
    /// [`degraded`](Source::degraded); `store` is the store that failed.
    pub fn degraded(on_failure: FailurePolicy, policy: &Policy, store: &'static str) -> Self {
        let allowed = on_failure == FailurePolicy::Open;
        // A failed store says nothing about when it will be back; one
        // second keeps well-behaved clients from retrying in a tight loop.
        let retry_after = if allowed {
            Duration::ZERO
        } else {
            Duration::from_secs(1)
        };
        let mut decision = Decision::new(allowed, policy, 0, Duration::ZERO, retry_after, store);
        decision.source.degraded = true;
        decision
    }

    /// `retry_after` in whole seconds, rounded up, as HTTP `Retry-After`
    /// wants: a client that waits exactly that long is admitted.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after)
    }

    /// `reset_after` in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }
}

fn ceil_secs(d: Duration) -> u64 {
    // Saturating: a store of someone else's may answer `Duration::MAX`.
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }
}
