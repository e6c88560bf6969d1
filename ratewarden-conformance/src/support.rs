//! What every scenario needs: a store with a manual clock, exact
//! expectations, and readable numbers in evidence and failures.

use crate::call;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use ratewarden_core::{
    Algorithm, Clock, Decision, ManualClock, Policy, Store, StoreError, Timestamp,
};
use tokio::sync::Barrier;

use crate::{Evidence, Failure, ScenarioResult, StoreFactory};

/// One second, in µs.
pub(crate) const S: u64 = 1_000_000;
/// One millisecond, in µs.
pub(crate) const MS: u64 = 1_000;
/// Where every scenario's clock starts: day-aligned, so every epoch-aligned
/// window of whole seconds up to a day opens exactly here.
pub(crate) const T0: u64 = ManualClock::DEFAULT_START.as_micros();

/// Runs a scenario, turning a panic anywhere below it into a failure: a
/// store must never panic, and a scorecard must survive one that does.
///
/// A payload that is not a message is passed on instead: that is how a
/// factory that cannot set up its store at all (no Docker for its server)
/// unwinds with `std::panic::resume_unwind` after printing one line of
/// what is missing, and the test then fails with that line alone rather
/// than as a store's panic.
pub(crate) async fn guarded(fut: impl Future<Output = ScenarioResult>) -> ScenarioResult {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(result) => result,
        Err(payload) if !is_message(payload.as_ref()) => std::panic::resume_unwind(payload),
        Err(payload) => Err(Failure(format!(
            "the store (or its factory) panicked: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

fn is_message(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.is::<&str>() || payload.is::<String>()
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-string panic payload)".to_string()
    }
}

pub(crate) fn fail<T>(message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(message.into()))
}

pub(crate) fn evidence(parts: Vec<String>) -> ScenarioResult {
    Ok(Evidence(parts.join("; ")))
}

/// A policy the scenario knows to be valid.
pub(crate) fn policy(algorithm: Algorithm, limit: u32, window_us: u64) -> Result<Policy, Failure> {
    Policy::new(algorithm, limit, Duration::from_micros(window_us))
        .map_err(|e| Failure(format!("scenario bug: invalid policy: {e}")))
}

/// A store's two entry points for one operation: the inline answer a
/// `Limiter` asks for first, and the awaited call it falls back to when the
/// store gives none. Both must keep the whole contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// [`Store::decide`] and [`Store::refund`].
    Awaited,
    /// [`Store::decide_inline`] and [`Store::refund_inline`].
    Inline,
}

impl Path {
    /// Both, awaited first.
    pub(crate) const BOTH: [Path; 2] = [Path::Awaited, Path::Inline];

    /// The name of the deciding method on this path.
    pub(crate) fn decide(self) -> &'static str {
        match self {
            Path::Awaited => "decide",
            Path::Inline => "decide_inline",
        }
    }

    /// The name of the refunding method on this path.
    pub(crate) fn refund(self) -> &'static str {
        match self {
            Path::Awaited => "refund",
            Path::Inline => "refund_inline",
        }
    }
}

/// `store`'s answer on `path`, or `None` when that is the inline path and
/// the store answers nothing there (it must be awaited: no failure).
pub(crate) async fn decide_on(
    store: &dyn Store,
    path: Path,
    key: &[u8],
    p: &Policy,
    cost: u32,
    now: Timestamp,
) -> Option<Result<Decision, StoreError>> {
    match path {
        Path::Awaited => Some(call::decide(store, key, p, cost, now).await),
        Path::Inline => call::decide_inline(store, key, p, cost, now),
    }
}

/// `store`'s answer on `path` if it gives one there, else the awaited
/// answer, as a `Limiter` asks; with the path that answered.
pub(crate) async fn decide_preferring(
    store: &dyn Store,
    path: Path,
    key: &[u8],
    p: &Policy,
    cost: u32,
    now: Timestamp,
) -> (Path, Result<Decision, StoreError>) {
    match decide_on(store, path, key, p, cost, now).await {
        Some(answer) => (path, answer),
        None => (Path::Awaited, call::decide(store, key, p, cost, now).await),
    }
}

/// The path for the `n`-th of a series of calls (0-based): every other one
/// inline, starting awaited.
fn alternate(n: u64) -> Path {
    if n % 2 == 1 {
        Path::Inline
    } else {
        Path::Awaited
    }
}

/// A fresh store and the clock that drives it.
pub(crate) struct Probe {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: ManualClock,
    /// Requests sent so far by [`hit`](Probe::hit), which alternates
    /// between the store's two ways of deciding.
    hits: AtomicU64,
    /// Refunds sent so far by [`refund`](Probe::refund), which alternates
    /// the same way.
    refunds: AtomicU64,
    /// The store has answered `decide_inline` at least once.
    decided_inline: AtomicBool,
    /// The store has answered `refund_inline` at least once.
    refunded_inline: AtomicBool,
}

impl Probe {
    pub(crate) async fn new(factory: &dyn StoreFactory) -> Result<Probe, Failure> {
        let store = factory.fresh().await;
        let caps = store.capabilities();
        if caps.server_clock {
            return fail(format!(
                "the {} store decides with its server's clock, so the suite cannot drive time; \
                 the factory must return a store in client-clock mode",
                store.name()
            ));
        }
        if caps.algorithms.is_empty() {
            return fail(format!(
                "the {} store lists no algorithms in its capabilities: every scenario would \
                 pass without testing anything",
                store.name()
            ));
        }
        Ok(Probe {
            store,
            clock: ManualClock::new(),
            hits: AtomicU64::new(0),
            refunds: AtomicU64::new(0),
            decided_inline: AtomicBool::new(false),
            refunded_inline: AtomicBool::new(false),
        })
    }

    /// Sets the clock to `T0 + offset_us`.
    pub(crate) fn at(&self, offset_us: u64) {
        self.clock.set(Timestamp::from_micros(T0 + offset_us));
    }

    /// Sets the clock to an absolute time, which may be before `T0`.
    pub(crate) fn set(&self, micros: u64) {
        self.clock.set(Timestamp::from_micros(micros));
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// Splits `wanted` into the algorithms the store supports and a note
    /// naming those it skips (empty if none).
    pub(crate) fn supported(&self, wanted: &[Algorithm]) -> (Vec<Algorithm>, Option<String>) {
        let caps = self.store.capabilities();
        let (yes, no): (Vec<Algorithm>, Vec<Algorithm>) =
            wanted.iter().partition(|a| caps.algorithms.contains(a));
        let note = (!no.is_empty()).then(|| {
            format!(
                "skipped {} (not supported by the {} store)",
                list(&no),
                self.store.name()
            )
        });
        (yes, note)
    }

    /// One request at the clock's current time; a store error fails the
    /// scenario, naming the request.
    ///
    /// Every other request goes to [`Store::decide_inline`] (when the store
    /// answers there, as an in-process store does), the rest to
    /// [`Store::decide`]: a `Limiter` uses the first whenever it answers, so
    /// both must keep the whole contract, and a difference between them
    /// shows up as a broken scenario.
    pub(crate) async fn hit(&self, key: &[u8], p: &Policy, cost: u32) -> Result<Decision, Failure> {
        let now = self.clock.now();
        let path = alternate(self.hits.fetch_add(1, Ordering::Relaxed));
        let (path, answer) = decide_preferring(&*self.store, path, key, p, cost, now).await;
        if path == Path::Inline {
            self.decided_inline.store(true, Ordering::Relaxed);
        }
        answer.map_err(|e| {
            Failure(format!(
                "{}: request (key {}, cost {cost}) at {} returned an error from {}: {e}",
                p.algorithm(),
                show_key(key),
                rel(now.as_micros()),
                path.decide()
            ))
        })
    }

    /// A refund at the clock's current time on `path` only; `None` when the
    /// store answers nothing inline.
    pub(crate) async fn refund_by(
        &self,
        path: Path,
        key: &[u8],
        p: &Policy,
        cost: u32,
        admitted: &Decision,
    ) -> Option<Result<(), StoreError>> {
        let now = self.clock.now();
        let answer = match path {
            Path::Awaited => Some(call::refund(&self.store, key, p, cost, now, admitted).await),
            Path::Inline => call::refund_inline(&self.store, key, p, cost, now, admitted),
        };
        if path == Path::Inline && answer.is_some() {
            self.refunded_inline.store(true, Ordering::Relaxed);
        }
        answer
    }

    /// A refund at the clock's current time, every other one to
    /// [`Store::refund_inline`] (when the store answers there) as
    /// [`hit`](Probe::hit) does for decisions; with the path that answered.
    pub(crate) async fn refund(
        &self,
        key: &[u8],
        p: &Policy,
        cost: u32,
        admitted: &Decision,
    ) -> (Path, Result<(), StoreError>) {
        let path = alternate(self.refunds.fetch_add(1, Ordering::Relaxed));
        match self.refund_by(path, key, p, cost, admitted).await {
            Some(answer) => (path, answer),
            None => {
                let now = self.clock.now();
                (
                    Path::Awaited,
                    call::refund(&self.store, key, p, cost, now, admitted).await,
                )
            }
        }
    }

    /// The deciding methods the store has answered so far, for evidence:
    /// `"decide and decide_inline"`, or a note that it answers nothing
    /// inline.
    pub(crate) fn decided_by(&self) -> &'static str {
        if self.decided_inline.load(Ordering::Relaxed) {
            "decide and decide_inline"
        } else {
            "decide (the store answers nothing inline)"
        }
    }

    /// The refunding methods the store has answered so far, as
    /// [`decided_by`](Probe::decided_by).
    pub(crate) fn refunded_by(&self) -> &'static str {
        if self.refunded_inline.load(Ordering::Relaxed) {
            "refund and refund_inline"
        } else {
            "refund (the store answers nothing inline)"
        }
    }
}

/// What a decision must say, exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expect {
    pub(crate) allowed: bool,
    pub(crate) remaining: u32,
    pub(crate) reset_us: u64,
    pub(crate) retry_us: u64,
}

/// Admitted, with `remaining` left and a reset `reset_us` away.
pub(crate) const fn admit(remaining: u32, reset_us: u64) -> Expect {
    Expect {
        allowed: true,
        remaining,
        reset_us,
        retry_us: 0,
    }
}

/// Refused, with `remaining` left, a reset `reset_us` away and a retry
/// `retry_us` away.
pub(crate) const fn refuse(remaining: u32, reset_us: u64, retry_us: u64) -> Expect {
    Expect {
        allowed: false,
        remaining,
        reset_us,
        retry_us,
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, remaining {}, reset_after {}, retry_after {}",
            if self.allowed { "admitted" } else { "refused" },
            self.remaining,
            dur(self.reset_us),
            dur(self.retry_us)
        )
    }
}

pub(crate) fn observed(d: &Decision) -> Expect {
    Expect {
        allowed: d.allowed,
        remaining: d.remaining,
        reset_us: micros(d.reset_after),
        retry_us: micros(d.retry_after),
    }
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Fails unless `d` is exactly `want` and carries the policy's limit.
pub(crate) fn check(d: &Decision, want: Expect, p: &Policy, what: &str) -> Result<(), Failure> {
    let got = observed(d);
    if got != want {
        return fail(format!(
            "{} ({p}) {what}: must be {want}; the store answered {got}",
            p.algorithm()
        ));
    }
    if d.limit != p.limit() {
        return fail(format!(
            "{} {what}: the decision reports a limit of {}, the policy's is {}",
            p.algorithm(),
            d.limit,
            p.limit()
        ));
    }
    Ok(())
}

/// `n` with thousands separators: 3,000.
pub(crate) fn num(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A duration in µs, in the largest unit that shows it exactly.
pub(crate) fn dur(us: u64) -> String {
    if us == u64::MAX {
        "forever".to_string()
    } else if us == 0 {
        "0".to_string()
    } else if us.is_multiple_of(S) {
        format!("{} s", num(us / S))
    } else if us.is_multiple_of(MS) {
        format!("{} ms", num(us / MS))
    } else {
        format!("{} µs", num(us))
    }
}

/// A time relative to `T0`: `t0+9 s`, `t0−25 s`.
pub(crate) fn rel(micros: u64) -> String {
    if micros == 0 {
        "the epoch".to_string()
    } else if micros >= T0 {
        format!("t0+{}", dur(micros - T0))
    } else {
        format!("t0−{}", dur(T0 - micros))
    }
}

/// A key as a reader can see it: escaped, and shortened if long.
pub(crate) fn show_key(key: &[u8]) -> String {
    let escaped: String = key.escape_ascii().to_string();
    if escaped.len() > 40 {
        format!("{:?}… ({} bytes)", &escaped[..32], num(key.len() as u64))
    } else {
        format!("{escaped:?}")
    }
}

pub(crate) fn list(algorithms: &[Algorithm]) -> String {
    algorithms
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long a caller that has passed the start line spins, at most, for
/// the other workers' callers: enough for a parked worker thread to wake,
/// even on a loaded machine; on a runtime whose other workers never come
/// (they are all busy elsewhere) the crowd then starts anyway.
const START_SPIN: Duration = Duration::from_millis(20);

/// Where concurrent callers spawned as tasks start together: a barrier for
/// all of them, then a spin until as many have passed it as the runtime has
/// worker threads. The barrier alone wakes its waiters on the worker that
/// arrived last while the other workers are still waking from their park,
/// and an in-process store can answer a whole crowd in that time, on one
/// thread, losing nothing however racy it is; held at the line, the first
/// requests run on every worker at once.
struct StartLine {
    barrier: Barrier,
    passed: AtomicUsize,
    /// The callers that run at once: one per worker thread.
    together: usize,
}

impl StartLine {
    fn new(callers: usize) -> Self {
        let workers =
            tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers());
        StartLine {
            barrier: Barrier::new(callers),
            passed: AtomicUsize::new(0),
            together: workers.clamp(1, callers.max(1)),
        }
    }

    async fn wait(&self) {
        self.barrier.wait().await;
        let passed = self.passed.fetch_add(1, Ordering::SeqCst) + 1;
        if passed >= self.together {
            return;
        }
        let started = Instant::now();
        while self.passed.load(Ordering::SeqCst) < self.together && started.elapsed() < START_SPIN {
            std::hint::spin_loop();
        }
    }
}

/// What a crowd of concurrent requests was answered.
pub(crate) struct Crowd {
    /// The `remaining` of each admitted request, in ascending order.
    pub(crate) remaining: Vec<u32>,
    /// The requests answered inline.
    pub(crate) inline: usize,
}

/// One caller's answers, each with the path that gave it.
type Answers = Vec<(Path, Result<Decision, StoreError>)>;

impl Crowd {
    /// The crowd from every caller's answers; an error fails it.
    fn of(p: &Policy, callers: Vec<Answers>) -> Result<Crowd, Failure> {
        let mut crowd = Crowd {
            remaining: Vec::new(),
            inline: 0,
        };
        for (path, r) in callers.into_iter().flatten() {
            crowd.inline += usize::from(path == Path::Inline);
            match r {
                Ok(d) if d.allowed => crowd.remaining.push(d.remaining),
                Ok(_) => {}
                Err(e) => {
                    return fail(format!(
                        "{}: a concurrent request returned an error: {e}",
                        p.algorithm()
                    ));
                }
            }
        }
        crowd.remaining.sort_unstable();
        Ok(crowd)
    }
}

/// `tasks × per_task` requests of cost 1 on `key` at `now`, from `tasks`
/// tasks started together ([`StartLine`]), every other request inline where
/// the store answers there: that path must be as atomic as the awaited one.
/// A panic, a failed task or an error fails the crowd.
pub(crate) async fn crowd_of_tasks(
    store: &Arc<dyn Store>,
    key: &[u8],
    p: &Policy,
    now: Timestamp,
    tasks: usize,
    per_task: usize,
) -> Result<Crowd, Failure> {
    let algorithm = p.algorithm();
    let key: Arc<[u8]> = key.into();
    let line = Arc::new(StartLine::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, key, line, p) =
                (Arc::clone(store), Arc::clone(&key), Arc::clone(&line), *p);
            tokio::spawn(async move {
                line.wait().await;
                let mut out = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let path = alternate((t + i) as u64);
                    out.push(decide_preferring(&*store, path, &key, &p, 1, now).await);
                }
                out
            })
        })
        .collect();
    let mut callers = Vec::with_capacity(tasks);
    for handle in handles {
        callers.push(match handle.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => {
                return fail(format!(
                    "{algorithm}: the store panicked under concurrent calls: {}",
                    panic_message(e.into_panic().as_ref())
                ));
            }
            Err(e) => return fail(format!("{algorithm}: a caller task failed: {e}")),
        });
    }
    Crowd::of(p, callers)
}

/// A caller thread of [`crowd_of_threads`] pauses after every this many
/// requests.
const PAUSE_EVERY: usize = 8;

/// How long a caller thread of [`crowd_of_threads`] waits, at most, for the
/// others to be started before it begins anyway.
const THREADS_START: Duration = Duration::from_secs(1);

/// `threads × per_thread` requests of cost 1 on `key` at `now`, from
/// `threads` threads of their own, every other request inline where the
/// store answers there and the others awaited on the thread
/// ([`Handle::block_on`](tokio::runtime::Handle::block_on)). Each thread
/// pauses for a microsecond (the system rounds it up to tens) after every
/// [`PAUSE_EVERY`] requests: waking, it often preempts the caller that holds
/// its core, at whatever point of a decision that caller is, and decides
/// itself. So a store that answers on its caller's thread with a gap between
/// its read and its write has another decision land in the gap many times
/// per crowd, even on a loaded machine, where callers that never pause are
/// suspended only at the end of a time slice and seldom run on two cores at
/// the same instant. A panic, a thread that cannot start or
/// an error fails the crowd.
pub(crate) async fn crowd_of_threads(
    store: &Arc<dyn Store>,
    key: &[u8],
    p: &Policy,
    now: Timestamp,
    threads: usize,
    per_thread: usize,
) -> Result<Crowd, Failure> {
    let algorithm = p.algorithm();
    let key: Arc<[u8]> = key.into();
    let runtime = tokio::runtime::Handle::current();
    let started = Arc::new(AtomicUsize::new(0));
    let mut receivers = Vec::with_capacity(threads);
    for t in 0..threads {
        let (store, key, p, runtime, started) = (
            Arc::clone(store),
            Arc::clone(&key),
            *p,
            runtime.clone(),
            Arc::clone(&started),
        );
        let (answer, receiver) = tokio::sync::oneshot::channel();
        let caller = move || {
            started.fetch_add(1, Ordering::SeqCst);
            let waiting = Instant::now();
            while started.load(Ordering::SeqCst) < threads && waiting.elapsed() < THREADS_START {
                std::thread::yield_now();
            }
            let answers = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut out: Answers = Vec::with_capacity(per_thread);
                for i in 0..per_thread {
                    let inline = match alternate((t + i) as u64) {
                        Path::Inline => call::decide_inline(&*store, &key, &p, 1, now),
                        Path::Awaited => None,
                    };
                    out.push(match inline {
                        Some(r) => (Path::Inline, r),
                        None => (
                            Path::Awaited,
                            runtime.block_on(call::decide(&*store, &key, &p, 1, now)),
                        ),
                    });
                    if (i + 1) % PAUSE_EVERY == 0 {
                        std::thread::sleep(Duration::from_micros(1));
                    }
                }
                out
            }));
            // The scenario stops listening only once it has failed.
            let _ = answer.send(answers.map_err(|e| panic_message(e.as_ref())));
        };
        if let Err(e) = std::thread::Builder::new()
            .name(format!("caller-{t}"))
            .spawn(caller)
        {
            return fail(format!("{algorithm}: cannot start a caller thread: {e}"));
        }
        receivers.push(receiver);
    }
    let mut callers = Vec::with_capacity(threads);
    for receiver in receivers {
        callers.push(match receiver.await {
            Ok(Ok(answers)) => answers,
            Ok(Err(message)) => {
                return fail(format!(
                    "{algorithm}: the store panicked under concurrent calls: {message}"
                ));
            }
            Err(_) => {
                return fail(format!(
                    "{algorithm}: a caller thread ended without answers"
                ));
            }
        });
    }
    Crowd::of(p, callers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_readable() {
        assert_eq!(num(0), "0");
        assert_eq!(num(999), "999");
        assert_eq!(num(3_000), "3,000");
        assert_eq!(num(1_234_567), "1,234,567");
        assert_eq!(dur(9 * S), "9 s");
        assert_eq!(dur(500 * MS), "500 ms");
        assert_eq!(dur(2 * S + 1), "2,000,001 µs");
        assert_eq!(rel(T0 - 25 * S), "t0−25 s");
        assert_eq!(show_key(b"a\n\0"), "\"a\\\\n\\\\x00\"");
    }
}
