//! `turnpike bench schedules`: firing lag at many schedules. N schedules, spread evenly over
//! their interval, each firing into its own conversation (an echo agent answers), run by 1 and
//! by W workers in this process (the embedded bus, the embedded default's store). Measured per
//! firing: fire time → its message accepted on the lane, and fire time → its turn dispatched;
//! beside the floor, in the same run: a bare timer (a task sleeping until each of the same fire
//! times) and how late it wakes under the same load.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use turnpike_artifactory::schedules::{Missed, Overlap, Schedule, Target, Timing};
use turnpike_artifactory::{
    ConversationPrefix, Conversations, NewConversation, RecordSigner, Schedules,
};
use turnpike_router::bus::now_ms;
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::Bus;
use turnpike_schemas::{ConversationId, EntryBody, Identity, ScheduleId, TenantId};
use turnpike_worker::{Apps, Worker, WorkerConfig, WorkerPool};

/// What to run.
pub struct Plan {
    pub schedules: usize,
    /// Each schedule's interval.
    pub every: Duration,
    /// How long firings are measured (after a warm-up of one interval).
    pub window: Duration,
    /// Worker counts to measure.
    pub workers: Vec<usize>,
}

pub async fn run(plan: Plan) -> Result<ExitCode> {
    println!(
        "turnpike bench schedules: {} schedules every {:.0} s, spread evenly (about {:.0} firings/s), each into its own conversation (echo agent); measured over {:.0} s after one interval's warm-up",
        plan.schedules,
        plan.every.as_secs_f64(),
        plan.schedules as f64 / plan.every.as_secs_f64(),
        plan.window.as_secs_f64()
    );
    println!(
        "\n{:>7} {:>9} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "workers",
        "firings",
        "timer p50 ms",
        "timer p99 ms",
        "accept p50 ms",
        "accept p99 ms",
        "start p50 ms",
        "start p99 ms"
    );
    for &workers in &plan.workers {
        let m = measure(&plan, workers.max(1)).await?;
        let (mut timer, mut accept, mut start) = (m.timer, m.accept, m.start);
        let p = |v: &mut Vec<Duration>, q| crate::series::percentile_ms(v, q);
        println!(
            "{:>7} {:>9} {:>14.1} {:>14.1} {:>14.1} {:>14.1} {:>14.1} {:>14.1}",
            workers,
            accept.len(),
            p(&mut timer, 0.5),
            p(&mut timer, 0.99),
            p(&mut accept, 0.5),
            p(&mut accept, 0.99),
            p(&mut start, 0.5),
            p(&mut start, 0.99),
        );
    }
    println!("\naccept: fire time → the firing's message on its lane; start: → its turn dispatched; timer: a bare tokio timer for the same fire times, in the same process and run (the floor)");
    Ok(ExitCode::SUCCESS)
}

struct Measured {
    timer: Vec<Duration>,
    accept: Vec<Duration>,
    start: Vec<Duration>,
}

async fn measure(plan: &Plan, workers: usize) -> Result<Measured> {
    let dir = tempfile::tempdir()?;
    let bus: Arc<dyn Bus> =
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default())?;
    let store = turnpike_artifactory::open_store(&format!(
        "sqlite://{}",
        dir.path().join("store.db").display()
    ))?;
    let conversations = Conversations::new(store.clone());
    let schedules = Schedules::new(store);
    let signer = RecordSigner::generate()?;
    let tenant: TenantId = "bench".parse()?;
    let owner: Identity = "oidc:bench:scheduler".parse()?;
    let manifest = turnpike_agent::apps::Manifest::parse(
        "app = \"bench\"\n[agents.echo]\nprovider = \"echo\"\n",
        dir.path(),
        &turnpike_worker::Registry::builtin(),
    )
    .map_err(anyhow::Error::msg)?;
    let apps = Arc::new(Apps::new().with_manifest(manifest, None));
    let every = plan.every.as_millis() as u64;
    let n = plan.schedules as u64;
    // Conversations and schedules, firing from one interval from now on.
    let mut made: Vec<(ScheduleId, ConversationId)> = Vec::with_capacity(plan.schedules);
    let setup = std::time::Instant::now();
    let creating = futures::stream::iter(0..plan.schedules).map(|_| {
        let (conversations, signer, tenant, owner) = (
            conversations.clone(),
            signer.clone(),
            tenant.clone(),
            owner.clone(),
        );
        async move {
            let (entry, _, _) = conversations
                .create(
                    &signer,
                    NewConversation {
                        tenant,
                        owner,
                        app: "bench".parse()?,
                        agent: "echo".parse()?,
                        at_ms: now_ms(),
                        instructions: None,
                        started_by: None,
                    },
                )
                .await?;
            anyhow::Ok(entry.conversation)
        }
    });
    use futures::StreamExt as _;
    let convs: Vec<ConversationId> = creating
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let base = now_ms() + setup.elapsed().as_millis() as u64 + 5_000;
    let puts = convs.iter().enumerate().map(|(i, conv)| {
        let created_ms = base + (i as u64 * every) / n;
        let s = Schedule {
            id: ScheduleId::new(),
            tenant: tenant.clone(),
            owner: owner.clone(),
            app: "bench".parse().expect("an app id"),
            agent: "echo".parse().expect("an agent id"),
            timing: Timing::Every { every_ms: every },
            target: Target::Same {
                conversation: *conv,
            },
            text: "tick".into(),
            missed: Missed::All { cap: 1_000 },
            overlap: Overlap::Queue,
            jitter_ms: 0,
            grace_ms: 600_000,
            paused: false,
            created_ms,
            updated_ms: created_ms,
        };
        let schedules = schedules.clone();
        async move {
            schedules.put(&s).await?;
            anyhow::Ok((s.id, *conv, created_ms))
        }
    });
    let put: Vec<(ScheduleId, ConversationId, u64)> = futures::stream::iter(puts)
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    made.extend(put.iter().map(|(s, c, _)| (*s, *c)));
    let firsts: Vec<u64> = put.iter().map(|(_, _, c)| c + every).collect();
    let pool = WorkerPool::start((0..workers).map(|_| {
        Worker::new(
            bus.clone(),
            conversations.clone(),
            signer.clone(),
            apps.clone(),
            WorkerConfig {
                slots: 256,
                workspace_root: dir.path().join("workspaces"),
                heartbeat_every: Duration::from_secs(1),
                ..WorkerConfig::default()
            },
        )
    }));
    // The floor: a bare timer for the same fire times.
    let measured_from = base + 2 * every;
    let measured_to = measured_from + plan.window.as_millis() as u64;
    let timer = Arc::new(Mutex::new(Vec::new()));
    let floor = {
        let timer = timer.clone();
        let mut times: Vec<u64> = firsts
            .iter()
            .flat_map(|first| {
                (0..)
                    .map(move |k| first + k * every)
                    .skip_while(move |t| *t < measured_from)
                    .take_while(move |t| *t < measured_to)
            })
            .collect();
        times.sort_unstable();
        tokio::spawn(async move {
            for t in times {
                let wait = t.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let late = now_ms().saturating_sub(t);
                timer
                    .lock()
                    .expect("timer samples")
                    .push(Duration::from_millis(late));
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(
        measured_to.saturating_sub(now_ms()) + 2_000,
    ))
    .await;
    floor.abort();
    // Every firing in the window, from the lanes and the records.
    let mut accept = Vec::new();
    let mut start = Vec::new();
    for (id, conv) in &made {
        let key_prefix = format!("schedule:{id}:");
        let entries = conversations
            .record(ConversationPrefix::new(tenant.clone(), *conv))
            .entries()
            .await?;
        let mut pending: Option<u64> = None;
        for e in entries {
            match &e.body {
                EntryBody::UserMessage(m) => {
                    let fire = m
                        .event
                        .idempotency_key
                        .as_deref()
                        .and_then(|k| k.strip_prefix(&key_prefix))
                        .and_then(|t| t.parse::<u64>().ok());
                    if let Some(fire) = fire.filter(|f| (measured_from..measured_to).contains(f)) {
                        accept.push(Duration::from_millis(
                            m.event.accepted_at_ms.saturating_sub(fire),
                        ));
                        pending = Some(fire);
                    }
                }
                EntryBody::TurnDispatched(d) => {
                    if let Some(fire) = pending.take() {
                        start.push(Duration::from_millis(d.at_ms.saturating_sub(fire)));
                    }
                }
                _ => {}
            }
        }
    }
    pool.crash().await;
    let timer = std::mem::take(&mut *timer.lock().expect("timer samples"));
    Ok(Measured {
        timer,
        accept,
        start,
    })
}
