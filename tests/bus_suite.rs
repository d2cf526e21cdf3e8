//! The bus suite: one set of cases, run against both backends (JetStream on a real
//! nats-server, and the embedded backend on local disk).

use std::sync::Arc;
use std::time::Duration;

use turnpike_router::bus::Bus;
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::{ErrorKind, Heartbeat, JetStreamBus, JetStreamConfig};
use turnpike_schemas::{Address, ConversationId, Event, EventBody, WorkerId};
use turnpike_tests::nats::NatsServer;

/// A backend under test and what keeps it alive.
struct Backend {
    bus: Arc<dyn Bus>,
    /// The same bus as another process sees it (JetStream: a second connection; embedded: the
    /// one bus, which only one process opens).
    peer: Arc<dyn Bus>,
    _nats: Option<NatsServer>,
    _dir: Option<tempfile::TempDir>,
}

const ACK_WAIT: Duration = Duration::from_secs(1);

async fn jetstream() -> Backend {
    let nats = NatsServer::start().expect("nats-server");
    let connect = || {
        JetStreamBus::connect(JetStreamConfig {
            url: nats.url(),
            ack_wait: ACK_WAIT,
            ..Default::default()
        })
    };
    let bus = connect().await.expect("connecting to nats");
    let peer = connect().await.expect("connecting to nats again");
    Backend {
        bus,
        peer,
        _nats: Some(nats),
        _dir: None,
    }
}

async fn embedded() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open(
        &dir.path().join("bus.redb"),
        EmbeddedConfig {
            ack_wait: ACK_WAIT,
            ..Default::default()
        },
    )
    .unwrap();
    Backend {
        peer: bus.clone(),
        bus,
        _nats: None,
        _dir: Some(dir),
    }
}

fn event(conversation: ConversationId, text: &str) -> Event {
    Event::new(
        Address {
            tenant: "acme".parse().unwrap(),
            app: "support".parse().unwrap(),
            agent: "helper".parse().unwrap(),
            conversation,
            identity: "oidc:acme:u-17".parse().unwrap(),
        },
        EventBody::Message { text: text.into() },
        1,
    )
}

fn text(e: &Event) -> &str {
    match &e.body {
        EventBody::Message { text } => text,
        _ => "",
    }
}

/// The next wake, or `None` if none arrives within `wait`.
async fn wake_within(bus: &Arc<dyn Bus>, wait: Duration) -> Option<turnpike_router::Wake> {
    tokio::time::timeout(wait, bus.next_wake())
        .await
        .ok()
        .map(|w| w.unwrap())
}

macro_rules! bus_suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn a_purged_lane_is_empty_and_its_neighbours_keep_theirs() {
                let b = super::$backend().await;
                let (a, c) = (ConversationId::new(), ConversationId::new());
                for i in 0..3 {
                    b.bus.publish(&event(a, &format!("a{i}"))).await.unwrap();
                    b.bus.publish(&event(c, &format!("c{i}"))).await.unwrap();
                }
                let last = b.bus.lane_last(a).await.unwrap();
                b.bus.purge_lane(a).await.unwrap();
                assert!(b.bus.read_lane(a, 0, None, 100).await.unwrap().is_empty());
                assert_eq!(b.bus.read_lane(c, 0, None, 100).await.unwrap().len(), 3);
                // Idempotent; a later message follows the last, never reusing a sequence.
                b.bus.purge_lane(a).await.unwrap();
                let next = b.bus.publish(&event(a, "late")).await.unwrap().seq;
                assert!(next > last, "{next} after {last}");
            }

            #[tokio::test]
            async fn lanes_keep_order_per_conversation() {
                let b = super::$backend().await;
                let (a, c) = (ConversationId::new(), ConversationId::new());
                let mut seqs = Vec::new();
                for i in 0..3 {
                    seqs.push(
                        b.bus
                            .publish(&event(a, &format!("a{i}")))
                            .await
                            .unwrap()
                            .seq,
                    );
                    b.bus.publish(&event(c, &format!("c{i}"))).await.unwrap();
                }
                assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
                let lane = b.bus.read_lane(a, 0, None, 100).await.unwrap();
                assert_eq!(
                    lane.iter().map(|m| text(&m.event)).collect::<Vec<_>>(),
                    ["a0", "a1", "a2"]
                );
                assert_eq!(lane.iter().map(|m| m.seq).collect::<Vec<_>>(), seqs);
                let rest = b.bus.read_lane(a, seqs[0], None, 100).await.unwrap();
                assert_eq!(rest.len(), 2);
                assert_eq!(b.bus.read_lane(a, seqs[0], None, 1).await.unwrap().len(), 1);
                // Reading up to a known sequence returns at least everything up to it.
                let upto = b.bus.read_lane(a, 0, Some(seqs[1]), 100).await.unwrap();
                assert!(upto.len() >= 2 && upto[1].seq == seqs[1], "{upto:?}");
                assert_eq!(b.bus.lane_last(a).await.unwrap(), seqs[2]);
                let nobody = ConversationId::new();
                assert!(b
                    .bus
                    .read_lane(nobody, 0, None, 10)
                    .await
                    .unwrap()
                    .is_empty());
                assert_eq!(b.bus.lane_last(nobody).await.unwrap(), 0);
            }

            #[tokio::test]
            async fn live_messages_reach_subscribers_of_their_conversation_only() {
                use futures::StreamExt as _;
                let b = super::$backend().await;
                let (a, c) = (ConversationId::new(), ConversationId::new());
                let mut sub_a = b.bus.subscribe_live(a).await.unwrap();
                let mut sub_c = b.bus.subscribe_live(c).await.unwrap();
                b.bus.live(c, "for c".into()).await;
                b.bus.live(a, "for a 1".into()).await;
                b.bus.live(a, "for a 2".into()).await;
                let wait = Duration::from_secs(10);
                let a1 = tokio::time::timeout(wait, sub_a.next())
                    .await
                    .unwrap()
                    .unwrap();
                let a2 = tokio::time::timeout(wait, sub_a.next())
                    .await
                    .unwrap()
                    .unwrap();
                let c1 = tokio::time::timeout(wait, sub_c.next())
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(&a1[..], b"for a 1");
                assert_eq!(&a2[..], b"for a 2");
                assert_eq!(&c1[..], b"for c");
            }

            #[tokio::test]
            async fn a_retried_publish_is_stored_once() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                let mut first = None;
                for attempt in 0..3 {
                    // Each retry is a new event object (new id) with the same key.
                    let mut e = event(conv, "once");
                    e.idempotency_key = Some("client-key-1".into());
                    let published = b.bus.publish(&e).await.unwrap();
                    assert_eq!(published.duplicate, attempt > 0);
                    assert_eq!(*first.get_or_insert(published.seq), published.seq);
                }
                // The same key on another conversation is another event.
                let mut other = event(ConversationId::new(), "elsewhere");
                other.idempotency_key = Some("client-key-1".into());
                assert!(!b.bus.publish(&other).await.unwrap().duplicate);
                // Without a key, the event id deduplicates.
                let plain = event(conv, "plain");
                b.bus.publish(&plain).await.unwrap();
                assert!(b.bus.publish(&plain).await.unwrap().duplicate);
                let lane = b.bus.read_lane(conv, 0, None, 100).await.unwrap();
                assert_eq!(
                    lane.iter().map(|m| text(&m.event)).collect::<Vec<_>>(),
                    ["once", "plain"]
                );
            }

            #[tokio::test]
            async fn wakes_come_back_until_acked() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                let seq = b.bus.publish(&event(conv, "wake me")).await.unwrap().seq;
                let wake = wake_within(&b.bus, Duration::from_secs(30))
                    .await
                    .expect("a wake");
                assert_eq!(
                    (wake.conversation, wake.seq, wake.deliveries),
                    (conv, seq, 1)
                );
                // Nak: delivered again.
                wake.nak(Duration::from_millis(10)).await.unwrap();
                let again = wake_within(&b.bus, Duration::from_secs(30))
                    .await
                    .expect("the wake again");
                assert_eq!((again.seq, again.deliveries), (seq, 2));
                // Neither acked nor extended: delivered again after the ack wait.
                drop(again);
                let third = wake_within(&b.bus, Duration::from_secs(30))
                    .await
                    .expect("redelivery after the ack wait");
                assert_eq!(third.seq, seq);
                assert!(third.deliveries >= 3);
                // Acked: gone for good (waiting three ack waits).
                third.ack().await.unwrap();
                assert!(wake_within(&b.bus, ACK_WAIT * 3).await.is_none());
            }

            #[tokio::test]
            async fn wakes_count_as_unsettled_until_acked_delivered_or_put_off_alike() {
                let b = super::$backend().await;
                // The count as it stands once it stops moving (the server's view of acks
                // follows them a moment later), waiting for `want`.
                let unsettled_reaches = |want: u64| {
                    let bus = b.bus.clone();
                    async move {
                        let deadline = std::time::Instant::now() + Duration::from_secs(30);
                        loop {
                            let n = bus.unsettled().await.unwrap().expect("this bus counts");
                            if n == want {
                                return;
                            }
                            assert!(std::time::Instant::now() < deadline, "{n} unsettled, not {want}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                };
                unsettled_reaches(0).await;
                let (one, two) = (ConversationId::new(), ConversationId::new());
                b.bus.publish(&event(one, "first")).await.unwrap();
                b.bus.publish(&event(two, "second")).await.unwrap();
                b.bus.publish(&event(two, "third")).await.unwrap();
                unsettled_reaches(3).await;
                // Delivered and not acked, or put off: still unsettled.
                let first = wake_within(&b.bus, Duration::from_secs(30)).await.expect("a wake");
                first.nak(Duration::from_secs(600)).await.unwrap();
                let second = wake_within(&b.bus, Duration::from_secs(30)).await.expect("a wake");
                unsettled_reaches(3).await;
                second.ack().await.unwrap();
                unsettled_reaches(2).await;
                let third = wake_within(&b.bus, Duration::from_secs(30)).await.expect("a wake");
                third.ack().await.unwrap();
                // The one put off for ten minutes is all that is left.
                unsettled_reaches(1).await;
            }

            #[tokio::test]
            async fn progress_keeps_a_wake_from_coming_back() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                b.bus.publish(&event(conv, "long turn")).await.unwrap();
                let wake = wake_within(&b.bus, Duration::from_secs(30))
                    .await
                    .expect("a wake");
                for _ in 0..8 {
                    // Another receiver sees nothing while the owner reports progress (four times
                    // per ack wait, so a stalled machine has margin).
                    assert!(wake_within(&b.bus, ACK_WAIT / 4).await.is_none());
                    wake.progress().await.unwrap();
                }
                wake.ack().await.unwrap();
            }

            #[tokio::test]
            async fn a_lease_has_one_holder_and_expires() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                let (w1, w2) = (WorkerId::new(), WorkerId::new());
                let ttl = Duration::from_secs(60);
                let l1 = b
                    .bus
                    .claim(conv, w1, ttl)
                    .await
                    .unwrap()
                    .expect("free lease");
                assert!(b.bus.claim(conv, w2, ttl).await.unwrap().is_none());
                // Not even its holder takes a live lease twice.
                assert!(b.bus.claim(conv, w1, ttl).await.unwrap().is_none());
                let renewed = b.bus.renew(&l1, ttl).await.unwrap();
                assert!(renewed.revision > l1.revision, "the epoch moves on");
                // The stale lease handle can no longer renew.
                assert_eq!(
                    b.bus.renew(&l1, ttl).await.unwrap_err().kind(),
                    ErrorKind::LeaseLost
                );
                b.bus.release(&renewed).await.unwrap();
                let l2 = b
                    .bus
                    .claim(conv, w2, Duration::from_millis(200))
                    .await
                    .unwrap()
                    .expect("released lease");
                assert!(l2.revision > renewed.revision);
                // Not renewed within its TTL: anyone may take it, and the old holder is fenced.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                let l3 = loop {
                    if let Some(l) = b.bus.claim(conv, w1, ttl).await.unwrap() {
                        break l;
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the lease never expired"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                assert_eq!(l3.owner, w1);
                assert_eq!(
                    b.bus.renew(&l2, ttl).await.unwrap_err().kind(),
                    ErrorKind::LeaseLost
                );
                // Releasing a lost lease is harmless and does not free the new holder's.
                b.bus.release(&l2).await.unwrap();
                assert!(b.bus.claim(conv, w2, ttl).await.unwrap().is_none());
            }

            #[tokio::test]
            async fn concurrent_usage_adds_all_count_once_per_scope_and_day() {
                use turnpike_router::usage::{Day, UsageScope, UsageTotals};
                let b = super::$backend().await;
                let acme: turnpike_schemas::TenantId = "acme".parse().unwrap();
                let app = UsageScope::App(acme.clone(), "support".parse().unwrap());
                let other_app = UsageScope::App(acme.clone(), "sales".parse().unwrap());
                let tenant = UsageScope::Tenant(acme.clone());
                let other = UsageScope::Tenant("globex".parse().unwrap());
                let today = Day(20_000);
                assert_eq!(b.bus.usage(&app, today).await.unwrap(), UsageTotals::default());
                let one = UsageTotals {
                    turns: 1,
                    calls: 2,
                    input_tokens: 100,
                    output_tokens: 10,
                    cached_tokens: 40,
                    reasoning_tokens: 3,
                    cost_micro_usd: 7,
                };
                // Sixteen concurrent adders (several processes in a fleet): none is lost.
                let mut tasks = Vec::new();
                for _ in 0..16 {
                    let (bus, app, tenant) = (b.bus.clone(), app.clone(), tenant.clone());
                    tasks.push(tokio::spawn(async move {
                        bus.add_usage(&app, today, &one).await.unwrap();
                        bus.add_usage(&tenant, today, &one).await.unwrap();
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                let sixteen = (0..16).fold(UsageTotals::default(), |acc, _| acc.plus(one));
                assert_eq!(b.bus.usage(&app, today).await.unwrap(), sixteen);
                assert_eq!(b.bus.usage(&tenant, today).await.unwrap(), sixteen);
                // Other days, apps and tenants saw nothing.
                for (scope, day) in [
                    (&app, today.next()),
                    (&app, Day(19_999)),
                    (&other_app, today),
                    (&other, today),
                ] {
                    assert_eq!(b.bus.usage(scope, day).await.unwrap(), UsageTotals::default());
                }
            }

            #[tokio::test]
            async fn a_trace_context_travels_beside_the_event_and_never_in_it() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
                let mut traced = event(conv, "traced");
                traced.traceparent = Some(tp.into());
                b.bus.publish(&traced).await.unwrap();
                b.bus.publish(&event(conv, "plain")).await.unwrap();
                let lane = b.bus.read_lane(conv, 0, None, 10).await.unwrap();
                assert_eq!(lane[0].event.traceparent.as_deref(), Some(tp));
                assert_eq!(lane[1].event.traceparent, None);
                // The event's bytes (what a record keeps) do not hold it.
                let bytes = serde_json::to_string(&lane[0].event).unwrap();
                assert!(!bytes.contains("4bf92f3577b34da6"), "{bytes}");
            }

            #[tokio::test]
            async fn concurrent_claims_have_one_winner() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                let mut tasks = Vec::new();
                for _ in 0..8 {
                    let bus = b.bus.clone();
                    tasks.push(tokio::spawn(async move {
                        bus.claim(conv, WorkerId::new(), Duration::from_secs(60))
                            .await
                            .unwrap()
                    }));
                }
                let mut winners = 0;
                for t in tasks {
                    winners += t.await.unwrap().is_some() as usize;
                }
                assert_eq!(winners, 1);
            }

            #[tokio::test]
            async fn reading_stops_before_a_message_it_cannot_read_and_hands_over_its_bytes() {
                let b = super::$backend().await;
                let conv = ConversationId::new();
                let first = b.bus.publish(&event(conv, "first")).await.unwrap().seq;
                // A newer event kind: the address reads, the body does not.
                let mut future = serde_json::to_value(event(conv, "x")).unwrap();
                future["body"] = serde_json::json!({ "kind": "poll", "question": "?" });
                let raw = serde_json::to_vec(&future).unwrap();
                let odd = b.bus.republish(conv, &raw, "k1").await.unwrap();
                assert!(odd.seq > first && !odd.duplicate);
                // Its wake still comes (the owner parks it). A retried requeue is one message;
                // another key is another message.
                let retried = b.bus.republish(conv, &raw, "k1").await.unwrap();
                assert!(retried.duplicate && retried.seq == odd.seq, "{retried:?}");
                let again = b.bus.republish(conv, &raw, "k2").await.unwrap();
                assert!(again.seq > odd.seq && !again.duplicate);
                b.bus.publish(&event(conv, "last")).await.unwrap();
                let lane = b.bus.read_lane(conv, 0, None, 100).await.unwrap();
                assert_eq!(lane.iter().map(|m| text(&m.event)).collect::<Vec<_>>(), ["first"]);
                let e = b.bus.read_lane(conv, first, None, 100).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Unreadable);
                let unreadable = e.unreadable().unwrap();
                assert_eq!((unreadable.seq, unreadable.bytes.as_slice()), (odd.seq, raw.as_slice()));
                let rest = b.bus.read_lane(conv, again.seq, None, 100).await.unwrap();
                assert_eq!(rest.iter().map(|m| text(&m.event)).collect::<Vec<_>>(), ["last"]);
                let mut woken = Vec::new();
                while let Some(w) = wake_within(&b.bus, Duration::from_secs(5)).await {
                    assert_eq!(w.conversation, conv);
                    woken.push(w.seq);
                    w.ack().await.unwrap();
                    if woken.len() == 4 {
                        break;
                    }
                }
                woken.sort_unstable();
                assert!(woken.contains(&odd.seq), "{woken:?}");
                // Bytes addressed elsewhere, or with no address, are refused.
                let other = serde_json::to_vec(&event(ConversationId::new(), "y")).unwrap();
                let refused = b.bus.republish(conv, &other, "k3").await.unwrap_err();
                assert_eq!(refused.kind(), ErrorKind::Invalid);
                let refused = b.bus.republish(conv, b"\xff not json", "k4").await.unwrap_err();
                assert_eq!(refused.kind(), ErrorKind::Invalid);
            }

            #[tokio::test]
            async fn a_lane_signals_each_publish_to_it_and_only_to_it() {
                use futures::StreamExt as _;
                let b = super::$backend().await;
                let (mine, other) = (ConversationId::new(), ConversationId::new());
                let mut signals = b.bus.lane_signals(mine).await.unwrap();
                b.bus.publish(&event(other, "elsewhere")).await.unwrap();
                b.bus.publish(&event(mine, "here")).await.unwrap();
                tokio::time::timeout(Duration::from_secs(10), signals.next())
                    .await
                    .expect("a signal for the publish")
                    .expect("the signals go on");
                // The other lane's publish signalled nothing here; nothing else is waiting.
                assert!(
                    tokio::time::timeout(Duration::from_millis(300), signals.next())
                        .await
                        .is_err(),
                    "a signal for another lane"
                );
                // And the lane the signal was for holds the message.
                let lane = b.bus.read_lane(mine, 0, None, 10).await.unwrap();
                assert_eq!(lane.iter().map(|m| text(&m.event)).collect::<Vec<_>>(), ["here"]);
            }

            #[tokio::test]
            async fn heartbeats_sent_in_the_window_are_listed_newest_per_worker() {
                let b = super::$backend().await;
                let (w1, w2) = (WorkerId::new(), WorkerId::new());
                let listening = {
                    let bus = b.bus.clone();
                    tokio::spawn(async move { bus.heartbeats(Duration::from_secs(2)).await })
                };
                // Beat until the listener has returned (it may subscribe after the first beats).
                let mut n = 0u64;
                while !listening.is_finished() {
                    n += 1;
                    for (worker, owned) in [(w1, n as usize), (w2, 7)] {
                        let beat = Heartbeat { worker, owned, slots: 64, at_ms: n, every_ms: 50 };
                        b.bus.heartbeat(&beat).await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let listed = listening.await.unwrap().unwrap();
                assert_eq!(listed.len(), 2, "{listed:?}");
                let one = listed.iter().find(|h| h.worker == w1).unwrap();
                let two = listed.iter().find(|h| h.worker == w2).unwrap();
                // The newest beat of each: w1's `owned` counted up with its beats.
                assert_eq!(one.owned as u64, one.at_ms);
                assert!(one.at_ms > 1 && one.slots == 64, "{one:?}");
                assert_eq!(two.owned, 7);
                // After the window, nothing more is listed: a listing is of who spoke in it.
                let later = b.bus.heartbeats(Duration::from_millis(200)).await.unwrap();
                assert!(later.is_empty(), "{later:?}");
            }

            #[tokio::test]
            async fn a_heartbeat_watch_sees_every_beat_sent_after_it_returns() {
                use futures::StreamExt as _;
                let b = super::$backend().await;
                let mut watch = b.bus.watch_heartbeats().await.unwrap();
                let (w1, w2) = (WorkerId::new(), WorkerId::new());
                // Sent at once after the watch returned, by another process: none may be
                // missed (no retries here).
                for (worker, at_ms) in [(w1, 1), (w2, 2), (w1, 3)] {
                    let beat = Heartbeat { worker, owned: 0, slots: 4, at_ms, every_ms: 1000 };
                    b.peer.heartbeat(&beat).await;
                }
                let mut seen = Vec::new();
                while seen.len() < 3 {
                    let beat = tokio::time::timeout(Duration::from_secs(10), watch.next())
                        .await
                        .expect("a beat sent after the watch returned was not seen")
                        .expect("the watch ended");
                    seen.push((beat.worker, beat.at_ms, beat.every_ms));
                }
                assert_eq!(seen, [(w1, 1, 1000), (w2, 2, 1000), (w1, 3, 1000)]);
            }
        }
    };
}

bus_suite!(jetstream);
bus_suite!(embedded);

/// Leases run on the clock tokio can pause: a ten-minute lease lapses at once in virtual time,
/// and not a moment before.
#[tokio::test(start_paused = true)]
async fn a_lease_expires_on_the_paused_clock_and_not_before() {
    let b = embedded().await;
    let conv = ConversationId::new();
    let (w1, w2) = (WorkerId::new(), WorkerId::new());
    let ttl = Duration::from_secs(600);
    let l1 = b
        .bus
        .claim(conv, w1, ttl)
        .await
        .unwrap()
        .expect("free lease");
    tokio::time::advance(Duration::from_secs(590)).await;
    assert!(
        b.bus.claim(conv, w2, ttl).await.unwrap().is_none(),
        "still held"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    let l2 = b.bus.claim(conv, w2, ttl).await.unwrap().expect("expired");
    assert!(l2.revision > l1.revision);
    assert_eq!(
        b.bus.renew(&l1, ttl).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
}

#[tokio::test]
async fn the_embedded_bus_keeps_accepted_events_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bus.redb");
    let conv = ConversationId::new();
    {
        let bus = EmbeddedBus::open(&path, EmbeddedConfig::default()).unwrap();
        for i in 0..3 {
            bus.publish(&event(conv, &format!("m{i}"))).await.unwrap();
        }
    }
    let bus: Arc<dyn Bus> = EmbeddedBus::open(&path, EmbeddedConfig::default()).unwrap();
    let lane = bus.read_lane(conv, 0, None, 10).await.unwrap();
    assert_eq!(
        lane.iter().map(|m| text(&m.event)).collect::<Vec<_>>(),
        ["m0", "m1", "m2"]
    );
    // One wake per lane is queued again at open, at the lane's last sequence.
    let wake = wake_within(&bus, Duration::from_secs(5))
        .await
        .expect("a wake after restart");
    assert_eq!((wake.conversation, wake.seq), (conv, 3));
    // Idempotency keys survive too.
    let mut e = event(conv, "keyed");
    e.idempotency_key = Some("k".into());
    assert!(!bus.publish(&e).await.unwrap().duplicate);
    drop(bus);
    let bus = EmbeddedBus::open(&path, EmbeddedConfig::default()).unwrap();
    let mut retry = event(conv, "keyed");
    retry.idempotency_key = Some("k".into());
    assert!(bus.publish(&retry).await.unwrap().duplicate);
}

#[tokio::test]
async fn ingress_fails_loudly_while_nats_is_down_and_recovers() {
    let mut nats = NatsServer::start().unwrap();
    let bus = JetStreamBus::connect(JetStreamConfig {
        url: nats.url(),
        ..Default::default()
    })
    .await
    .unwrap();
    let conv = ConversationId::new();
    bus.publish(&event(conv, "before")).await.unwrap();
    nats.stop().unwrap();
    let mut e = event(conv, "during");
    e.idempotency_key = Some("retry-me".into());
    let err = bus.publish(&e).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    nats.restart().unwrap();
    // The client reconnects by itself; the retried publish is accepted once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match bus.publish(&e).await {
            Ok(p) => {
                assert!(!p.duplicate);
                break;
            }
            Err(err) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no reconnect: {err}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(bus.publish(&e).await.unwrap().duplicate);
    let lane = bus.read_lane(conv, 0, None, 10).await.unwrap();
    assert_eq!(
        lane.iter().map(|m| text(&m.event)).collect::<Vec<_>>(),
        ["before", "during"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_reports_the_wakes_waiting_per_shard_and_they_drain_when_taken() {
    let backend = jetstream().await;
    let bus = &backend.bus;
    // Wakes waiting on every shard together.
    let pending = || async {
        bus.pending_per_shard()
            .await
            .unwrap()
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert_eq!(pending().await, 0);
    let conversations: Vec<ConversationId> = (0..3).map(|_| ConversationId::new()).collect();
    for c in &conversations {
        bus.publish(&event(*c, "waiting")).await.unwrap();
    }
    let shards = bus.pending_per_shard().await.unwrap();
    assert_eq!(shards.len(), 8, "one figure per shard: {shards:?}");
    assert_eq!(shards.iter().map(|(_, n)| n).sum::<u64>(), 3, "{shards:?}");
    // Taken by a worker (and acked): nothing waits.
    for _ in 0..3 {
        let wake = wake_within(bus, Duration::from_secs(30))
            .await
            .expect("a wake");
        wake.ack().await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = pending().await;
        if left == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{left} still pending");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
