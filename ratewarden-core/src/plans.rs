//! [`Plans`]: limits chosen per request.

use std::sync::Arc;

use crate::limiter::rule::check_rule_name;
use crate::{Clock, ConfigError, Limiter, Rule, Store, StoreError, parse_policies};

/// Limits chosen per request: one [`Limiter`] per plan (`free`, `pro`, …),
/// all counting the same usage.
///
/// The plans of a [`Plans`] have the same rules — the same names in the
/// same stores, with the same algorithms and windows — and differ only in
/// their limits. A rule's state is stored under its name and the client's
/// key, not under the plan, so a client who changes plans inside a window
/// (an upgrade, a downgrade) keeps the usage already counted: after an
/// upgrade from 4 to 10 per window with 4 spent, 6 are left, not 10; after a
/// downgrade with 6 spent, nothing is left until the window frees units.
/// Each request is decided on the key's whole usage under the limit of the
/// plan it names, so moving back and forth never admits more in a window
/// than the larger limit (the conformance scenario `policy_change` holds
/// every store to this).
///
/// ```
/// use std::sync::Arc;
/// use ratewarden_core::{ManualClock, Plans, Store};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
/// let plans = Plans::builder("search", store)
///     .clock(ManualClock::new())
///     .plan("free", "4/min")
///     .plan("pro", "10/min")
///     .build()?;
/// for _ in 0..4 {
///     assert!(plans.choose(Some("free")).check(b"alice").await.allowed);
/// }
/// assert!(!plans.choose(Some("free")).check(b"alice").await.allowed);
/// // Alice upgrades: the four requests she made count on the new plan too.
/// assert_eq!(plans.choose(Some("pro")).check(b"alice").await.remaining, 5);
/// // No plan, or one that does not exist, is the default: the first.
/// assert_eq!(plans.choose(None).rules()[0].policy().limit(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Plans {
    /// The default first.
    plans: Arc<[(Box<str>, Limiter)]>,
}

impl Plans {
    /// A builder of plans whose limits are written as text (`"100/h"`,
    /// `"10/s; 1000/h"`): each plan's rules are [`Rule::tiers`]`(rule,
    /// store, …)`, so every plan counts in the same rules.
    pub fn builder(rule: &str, store: Arc<dyn Store>) -> PlansBuilder {
        PlansBuilder {
            rule: rule.to_owned(),
            store,
            clock: None,
            plans: Vec::new(),
            default: None,
        }
    }

    /// Plans from limiters built by hand (with fallbacks, escalation or
    /// their own failure policy), `default` answering a request that names
    /// no plan or an unknown one.
    ///
    /// Refuses an empty list, a plan name that is not 1 to 64 characters of
    /// `A–Z a–z 0–9 _ - .` or that is given twice, a `default` that is not
    /// one of them, and limiters that do not count the same usage: each
    /// must have the same rules in the same order (names, stores,
    /// algorithms and windows; limits may differ) and read the same clock.
    pub fn new<N>(
        default: &str,
        plans: impl IntoIterator<Item = (N, Limiter)>,
    ) -> Result<Self, ConfigError>
    where
        N: Into<Box<str>>,
    {
        let mut list: Vec<(Box<str>, Limiter)> = Vec::new();
        for (name, limiter) in plans {
            let name = name.into();
            check_rule_name(&name)
                .map_err(|_| invalid(format!("plan name {name:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '-' and '.'")))?;
            if list.iter().any(|(n, _)| *n == name) {
                return Err(invalid(format!("plan {name:?} is given twice")));
            }
            list.push((name, limiter));
        }
        let Some(at) = list.iter().position(|(n, _)| &**n == default) else {
            let names: Vec<&str> = list.iter().map(|(n, _)| &**n).collect();
            return Err(invalid(if names.is_empty() {
                "plans need at least one plan".to_owned()
            } else {
                format!("the default plan {default:?} is not one of the plans {names:?}")
            }));
        };
        list[..=at].rotate_right(1);
        let (first, base) = &list[0];
        for (name, limiter) in &list[1..] {
            same_usage(first, base, name, limiter)?;
        }
        Ok(Plans { plans: list.into() })
    }

    /// The limiter of `plan`, if there is one of that name.
    pub fn get(&self, plan: &str) -> Option<&Limiter> {
        self.plans
            .iter()
            .find(|(name, _)| &**name == plan)
            .map(|(_, limiter)| limiter)
    }

    /// The limiter of `plan`, or the default's when `plan` is `None` or
    /// names no plan: a request is never left unlimited for naming a plan
    /// that does not exist. Make the default the strictest plan.
    pub fn choose(&self, plan: Option<&str>) -> &Limiter {
        &self.plans[self.position(plan)].1
    }

    /// Where [`choose`](Self::choose) would find `plan` in
    /// [`iter`](Self::iter)'s order (0, the default, when it finds none).
    pub fn position(&self, plan: Option<&str>) -> usize {
        plan.and_then(|plan| self.plans.iter().position(|(name, _)| &**name == plan))
            .unwrap_or(0)
    }

    /// The default plan's name.
    pub fn default_name(&self) -> &str {
        &self.plans[0].0
    }

    /// The default plan's limiter.
    pub fn default_limiter(&self) -> &Limiter {
        &self.plans[0].1
    }

    /// Every plan, its name and limiter, the default first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Limiter)> {
        self.plans.iter().map(|(name, limiter)| (&**name, limiter))
    }

    /// Forgets `key`'s usage on every plan ([`Limiter::reset`]): the
    /// stores once, through the default plan, since every plan counts in
    /// the same state. Every plan's refusal cache drops the key with it, as
    /// every limiter's in the process does after a reset or a give-back.
    pub async fn reset(&self, key: &[u8]) -> Result<(), StoreError> {
        self.plans[0].1.reset(key).await
    }
}

/// A single limiter is one plan, named `default`.
impl From<Limiter> for Plans {
    fn from(limiter: Limiter) -> Self {
        Plans {
            plans: Arc::new([("default".into(), limiter)]),
        }
    }
}

/// Builds [`Plans`] from text; see [`Plans::builder`].
#[derive(Debug)]
pub struct PlansBuilder {
    rule: String,
    store: Arc<dyn Store>,
    clock: Option<Arc<dyn Clock>>,
    plans: Vec<(String, String)>,
    default: Option<String>,
}

impl PlansBuilder {
    /// Adds plan `name` with the limits `policies` says
    /// ([`parse_policies`]: `"100/h"`, `"10/s; 1000/h"`); read by
    /// [`build`](Self::build). The first plan added is the default unless
    /// [`default`](Self::default) says otherwise.
    pub fn plan(mut self, name: &str, policies: &str) -> Self {
        self.plans.push((name.to_owned(), policies.to_owned()));
        self
    }

    /// The plan a request that names none (or an unknown one) is decided
    /// under.
    pub fn default(mut self, name: &str) -> Self {
        self.default = Some(name.to_owned());
        self
    }

    /// The clock every plan reads; the system clock unless set.
    pub fn clock(self, clock: impl Clock) -> Self {
        self.shared_clock(Arc::new(clock))
    }

    /// The clock every plan reads, shared with other limiters.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The plans. Refuses text that is not a list of policies (the error
    /// names the plan and the part at fault), plans whose lists differ in
    /// anything but their limits, and what [`Plans::new`] refuses.
    pub fn build(self) -> Result<Plans, ConfigError> {
        let clock = self.clock.unwrap_or_else(|| Arc::new(crate::SystemClock));
        let mut limiters = Vec::with_capacity(self.plans.len());
        for (name, text) in &self.plans {
            let policies =
                parse_policies(text).map_err(|e| invalid(format!("plan {name:?}: {e}")))?;
            let limiter = tiers_limiter(&self.rule, &self.store, &clock, &policies)
                .map_err(|e| invalid(format!("plan {name:?}: {e}")))?;
            limiters.push((name.clone(), limiter));
        }
        let default = match self.default {
            Some(default) => default,
            None => limiters
                .first()
                .map(|(name, _)| name.clone())
                .unwrap_or_default(),
        };
        Plans::new(&default, limiters)
    }
}

/// A limiter of [`Rule::tiers`]`(rule, store, policies)` on `clock`: a
/// plan's, or a customer's limit ([`CustomerLimits`](crate::CustomerLimits)).
pub(crate) fn tiers_limiter(
    rule: &str,
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    policies: &[crate::Policy],
) -> Result<Limiter, ConfigError> {
    Limiter::builder()
        .shared_clock(clock.clone())
        .rules(Rule::tiers(rule, store.clone(), policies)?)
        .build()
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(message)
}

/// Refuses a plan whose limiter would count apart from the default's.
fn same_usage(
    first: &str,
    base: &Limiter,
    name: &str,
    limiter: &Limiter,
) -> Result<(), ConfigError> {
    let why = "every plan needs the same rules (names, stores, algorithms and windows) and \
               clock, differing only in limits, so that usage carries over between plans";
    if !std::ptr::addr_eq(Arc::as_ptr(base.clock()), Arc::as_ptr(limiter.clock())) {
        return Err(invalid(format!(
            "plan {name:?} reads another clock than plan {first:?}: {why}"
        )));
    }
    let describe = |l: &Limiter| -> Vec<String> {
        l.rules()
            .iter()
            .map(|r| {
                format!(
                    "{} ({}, {:?}, store {})",
                    r.name(),
                    r.policy().algorithm(),
                    r.policy().window(),
                    r.store().name()
                )
            })
            .collect()
    };
    let same = base.rules().len() == limiter.rules().len()
        && base.rules().iter().zip(limiter.rules()).all(|(a, b)| {
            a.name() == b.name()
                && std::ptr::addr_eq(Arc::as_ptr(a.store()), Arc::as_ptr(b.store()))
                && a.policy().algorithm() == b.policy().algorithm()
                && a.policy().window() == b.policy().window()
        });
    if same {
        Ok(())
    } else {
        Err(invalid(format!(
            "plan {name:?} has rules {:?}, plan {first:?} {:?}: {why}",
            describe(limiter),
            describe(base)
        )))
    }
}
