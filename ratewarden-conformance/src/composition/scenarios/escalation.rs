//! Escalation: sampling independent of a client's pace, and abuse writes
//! bounded however many refusals they stand for.

use super::*;

pub(crate) async fn escalation_rate_independent_of_pace(s: &Setup<'_>) -> ScenarioResult {
    // A local tier of 60 per minute escalates one admitted request in 10 to
    // the shared store (10,000 per hour: it never refuses here). A client
    // pacing itself at 1/s and one bursting 60 at the top of each minute are
    // each admitted 600 times and must each be sampled exactly 60 times, one
    // in every run of 10 admitted requests.
    let durable = Switch::<dyn Store>::new(s.shared().await?);
    let tier = |durable: Arc<dyn Store>| -> Result<TierSpec, Failure> {
        let mut t = TierSpec::new("search", local(), log(60, 60)?);
        t.escalation = Some(EscalationSpec {
            policy: windowed(&*durable, 10_000, 3_600)?,
            store: durable,
            every: 10,
            sink: None,
        });
        Ok(t)
    };
    let c = s.compose(vec![tier(durable.clone())?])?;
    let mut parts = Vec::new();
    let mut sampled_positions = Vec::new();
    for (client, offsets) in [
        ("paced", (0..600).map(|i| i * S).collect::<Vec<_>>()),
        (
            "bursty",
            (0..600).map(|i| 600 * S + (i / 60) * 60 * S).collect(),
        ),
    ] {
        let before = durable.calls();
        let mut sampled = Vec::new();
        for (i, &offset) in offsets.iter().enumerate() {
            s.at(offset);
            let d = c.check(client.as_bytes()).await;
            if !d.allowed {
                return fail(format!(
                    "{client} request {} at t0+{}: within the local limit, must be admitted; got {}",
                    i + 1,
                    dur(offset),
                    show(&d)
                ));
            }
            if d.source.escalated {
                sampled.push(i);
            }
        }
        let calls = durable.calls() - before;
        if calls != 60 || sampled.len() != 60 {
            return fail(format!(
                "{client} client, 600 admitted requests: the durable store must be consulted \
                 exactly 60 times (one in 10), got {calls} calls and {} escalated decisions",
                sampled.len()
            ));
        }
        for run in 0..60 {
            let n = sampled.iter().filter(|&&i| i / 10 == run).count();
            if n != 1 {
                return fail(format!(
                    "{client} client: admitted requests {}..={} must contain exactly one sample, \
                     got {n}",
                    run * 10 + 1,
                    run * 10 + 10
                ));
            }
        }
        parts.push(format!(
            "{client}: 60 samples in 600 admitted, one per run of 10"
        ));
        sampled_positions.push(sampled.iter().map(|i| i % 10).collect::<Vec<_>>());
    }
    // The same traffic through a second composition samples other positions:
    // a client cannot learn which of its requests will be checked.
    let durable2 = Switch::<dyn Store>::new(s.shared().await?);
    let c2 = s.compose(vec![tier(durable2)?])?;
    let mut again = Vec::new();
    for i in 0..600 {
        s.at(7_200 * S + i * S);
        if c2.check(b"paced-again").await.source.escalated {
            again.push((i % 10) as usize);
        }
    }
    if again == sampled_positions[0] {
        return fail(
            "two compositions sampled the same 60 positions in the same traffic: the sample \
             is predictable from a client's own count",
        );
    }
    parts.push("a second composition sampled different positions".into());
    evidence(parts)
}

pub(crate) async fn abuse_writes_bounded(s: &Setup<'_>) -> ScenarioResult {
    // 20 keys, each 100 requests in each of 3 windows against 5 per minute:
    // 5,700 refusals. The sink gets one write per key per window (60), each
    // carrying the refusals held back since the key's last one, and a flush
    // writes what the last window held (20 more): 5,700 refusals in 80 writes.
    let sink = Switch::<dyn AbuseSink>::new(Arc::new(Events::default()));
    let mut tier = TierSpec::new("form", local(), log(5, 60)?);
    tier.escalation = Some(s.reporting_to(sink.clone()).await?);
    let c = s.compose(vec![tier])?;
    for window in 0..3u64 {
        s.at(window * 60 * S);
        for k in 0..20 {
            let key = format!("bot-{k}");
            let admitted = {
                let mut n = 0;
                for _ in 0..100 {
                    n += u32::from(c.check(key.as_bytes()).await.allowed);
                }
                n
            };
            if admitted != 5 {
                return fail(format!(
                    "{key} in window {window}: 5 of 100 must be admitted, got {admitted}"
                ));
            }
        }
        let want = 20 * (window + 1);
        if sink.calls() != want {
            return fail(format!(
                "after {} windows of 20 refused keys: the sink must have been written {want} \
                 times (one per key per window), got {}",
                window + 1,
                num(sink.calls())
            ));
        }
    }
    let flushed = c.flush_abuse_events().await;
    if flushed != 20 || sink.calls() != 80 || sink.refusals() != 5_700 {
        return fail(format!(
            "a flush must write the 20 keys' held-back refusals: 80 writes standing for 5,700 \
             refusals in all; got {flushed} flushed, {} writes, {} refusals",
            sink.calls(),
            num(sink.refusals())
        ));
    }
    evidence(vec![
        "5,700 refusals from 20 keys over 3 windows: 60 writes, then 20 at the flush".into(),
        "every refusal counted in the events' totals".into(),
    ])
}
