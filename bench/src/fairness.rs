//! `turnpike bench fairness`: one tenant's burst against another tenant's single messages
//! (DESIGN step 2, invariant 13). In-process workers run an agent that takes a fixed time per
//! turn. Tenant B first sends single messages on an idle system, one after another (each once
//! the previous one is answered): its idle wait. Then tenant A sends one message to each of N
//! conversations at once, and B sends the same single messages again while A's burst is being
//! worked off: its wait under the burst. The ratio of the two is the measure (first come,
//! first served gives about N × turn ÷ slots more). On the embedded bus and on JetStream (a
//! nats-server started for each run), for each N.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_trait::async_trait;
use tokio::sync::Notify;
use turnpike_agent::Turn;
use turnpike_artifactory::{Conversations, NewConversation, RecordSigner};
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::{Bus, Ingress, JetStreamBus, JetStreamConfig};
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{ConversationId, EventBody, EventId, Identity, TenantId};
use turnpike_worker::{App, Apps, Worker, WorkerConfig, WorkerPool};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Burst sizes (A's conversations, one message each).
    pub bursts: Vec<usize>,
    pub workers: usize,
    pub slots: usize,
    /// The agent's time per turn.
    pub turn: Duration,
    /// B's single messages in each phase.
    pub singles: usize,
    /// Measure on JetStream too (`nats-server` on the path).
    pub jetstream: bool,
}

/// When each event's turn ended (the agent returned: the reply).
#[derive(Default)]
struct Ends {
    at: Mutex<HashMap<EventId, Instant>>,
    notify: Notify,
}

struct TimedAgent {
    turn: Duration,
    ends: Arc<Ends>,
}

#[async_trait]
impl App for TimedAgent {
    async fn on_reactive_event(&self, turn: &dyn Turn) -> turnpike_agent::Result<TurnOutcome> {
        tokio::time::sleep(self.turn).await;
        let now = Instant::now();
        let mut at = self.ends.at.lock().expect("ends lock");
        for e in turn.inputs() {
            at.entry(e.id).or_insert(now);
        }
        drop(at);
        self.ends.notify.notify_waiters();
        Ok(TurnOutcome::Replied)
    }
}

/// `turnpike bench fairness`.
pub async fn run(plan: Plan) -> Result<ExitCode> {
    println!(
        "turnpike bench fairness: {} worker(s) x {} slots in-process, {} ms per turn; B sends {} single messages idle, then while A's burst of N is worked off",
        plan.workers,
        plan.slots,
        plan.turn.as_millis(),
        plan.singles
    );
    println!(
        "\n{:<12} {:>7} {:>14} {:>16} {:>8} {:>18}",
        "bus", "N", "B idle p50 ms", "B burst p50 ms", "ratio", "B burst max ms"
    );
    for &n in &plan.bursts {
        for jetstream in [false, true] {
            if jetstream && !plan.jetstream {
                continue;
            }
            let (idle, burst) = measure(&plan, n, jetstream).await?;
            let (mut idle, mut burst) = (idle, burst);
            let idle_p50 = crate::series::percentile_ms(&mut idle, 0.5);
            let burst_p50 = crate::series::percentile_ms(&mut burst, 0.5);
            let burst_max = crate::series::percentile_ms(&mut burst, 1.0);
            println!(
                "{:<12} {:>7} {:>14.1} {:>16.1} {:>7.2}x {:>18.1}",
                if jetstream { "JetStream" } else { "embedded" },
                n,
                idle_p50,
                burst_p50,
                burst_p50 / idle_p50,
                burst_max
            );
        }
    }
    println!("\nfirst come, first served would add about N x turn / (workers x slots) to B's wait under the burst");
    Ok(ExitCode::SUCCESS)
}

/// B's waits (accept → reply) idle and under a burst of `n`.
async fn measure(plan: &Plan, n: usize, jetstream: bool) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let dir = tempfile::tempdir()?;
    let mut _nats = None;
    let bus: Arc<dyn Bus> = if jetstream {
        let nats = crate::lanes::start_nats().await?;
        let bus = JetStreamBus::connect(JetStreamConfig {
            url: nats.url.clone(),
            ..Default::default()
        })
        .await?;
        _nats = Some(nats);
        bus
    } else {
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default())?
    };
    let store = turnpike_artifactory::open_store(&format!(
        "sqlite://{}",
        dir.path().join("store.db").display()
    ))?;
    let conversations = Conversations::new(store);
    let signer = RecordSigner::generate()?;
    let ends = Arc::new(Ends::default());
    let agent = Arc::new(TimedAgent {
        turn: plan.turn,
        ends: ends.clone(),
    });
    let pool = WorkerPool::start((0..plan.workers).map(|_| {
        Worker::new(
            bus.clone(),
            conversations.clone(),
            signer.clone(),
            Arc::new(Apps::new().with_fallback(agent.clone())),
            WorkerConfig {
                slots: plan.slots,
                workspace_root: dir.path().join("workspaces"),
                ..WorkerConfig::default()
            },
        )
    }));
    let create = |tenant: &'static str, count: usize| {
        let conversations = conversations.clone();
        let signer = signer.clone();
        async move {
            let mut out = Vec::with_capacity(count);
            for _ in 0..count {
                let (entry, _, _) = conversations
                    .create(
                        &signer,
                        NewConversation {
                            tenant: tenant.parse()?,
                            owner: owner(tenant)?,
                            app: "bench".parse()?,
                            agent: "timed".parse()?,
                            at_ms: 0,
                            instructions: None,
                            started_by: None,
                        },
                    )
                    .await?;
                out.push(entry.conversation);
            }
            anyhow::Ok(out)
        }
    };
    let a = create("alpha", n).await?;
    let b = create("beta", plan.singles * 2).await?;
    let ingress = Ingress::new(bus.clone(), conversations.clone());
    let (b_idle, b_burst) = b.split_at(plan.singles);
    let idle = singles(&ingress, &ends, b_idle).await?;
    // A's burst: every message accepted at once, then B's messages one after another.
    let sends = a.iter().map(|conv| send(&ingress, "alpha", *conv));
    for sent in futures::future::join_all(sends).await {
        sent?;
    }
    let burst = singles(&ingress, &ends, b_burst).await?;
    pool.crash().await;
    Ok((idle, burst))
}

fn owner(tenant: &str) -> Result<Identity> {
    Ok(format!("oidc:{tenant}:bench").parse()?)
}

async fn send(ingress: &Ingress, tenant: &str, conv: ConversationId) -> Result<EventId> {
    let tenant_id: TenantId = tenant.parse()?;
    let (event, _) = ingress
        .submit(
            &tenant_id,
            &owner(tenant)?,
            conv,
            EventBody::Message { text: "hi".into() },
            None,
        )
        .await?;
    Ok(event.id)
}

/// B's messages one after another, each once the previous one is answered: accept → reply.
async fn singles(
    ingress: &Ingress,
    ends: &Ends,
    convs: &[ConversationId],
) -> Result<Vec<Duration>> {
    let mut waits = Vec::with_capacity(convs.len());
    for conv in convs {
        let id = send(ingress, "beta", *conv).await?;
        let accepted = Instant::now();
        let deadline = accepted + Duration::from_secs(600);
        loop {
            let notified = ends.notify.notified();
            if let Some(at) = ends.at.lock().expect("ends lock").get(&id) {
                waits.push(at.saturating_duration_since(accepted));
                break;
            }
            tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), notified)
                .await
                .context("B's message was not answered within 600 s")?;
        }
    }
    Ok(waits)
}
