//! The record suite: one set of cases, run against every object store backend
//! (in-memory, local filesystem, the local SQLite store, and S3 on a real S3-compatible
//! server).

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde_json::Value;
use turnpike_artifactory::mmr::leaf_hash;
use turnpike_artifactory::record::Problem;
use turnpike_artifactory::{ErrorKind, Record, RecordSigner, Transcript, TrustedKeys};
use turnpike_schemas::entry::{TurnAmbiguous, TurnDispatched};
use turnpike_schemas::{EntryBody, TurnId, WorkerId};
use turnpike_tests::fixtures::{self, batch_one, batch_two, record_with_turns, signer};

fn trusted() -> TrustedKeys {
    TrustedKeys::new([signer().verifying_key()])
}

/// Rewrites batch `seq` through a JSON edit, as an attacker with store access would.
async fn tamper(
    record: &Record,
    store: &Arc<dyn ObjectStore>,
    seq: u64,
    edit: impl FnOnce(&mut Value),
) {
    let path = record.prefix().record_batch(seq);
    let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
    let mut batch: Value = serde_json::from_slice(&bytes).unwrap();
    edit(&mut batch);
    store
        .put(&path, PutPayload::from(serde_json::to_vec(&batch).unwrap()))
        .await
        .unwrap();
}

/// Recomputes an entry's digest so that only the batch root can catch the change.
fn rehash(entry: &mut Value) {
    let position = entry["position"].as_u64().unwrap();
    let kind = entry["kind"].as_str().unwrap().to_owned();
    let payload = serde_json::to_vec(&entry["payload"]).unwrap();
    entry["digest"] = Value::String(hex_encode(&leaf_hash(position, &kind, &payload)));
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn failure(record: &Record) -> turnpike_artifactory::record::VerifyFailure {
    record
        .verify(&trusted(), None)
        .await
        .unwrap()
        .expect_err("tampering must be detected")
}

macro_rules! record_suite {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            fn store() -> (turnpike_tests::stores::TestStore, Arc<dyn ObjectStore>) {
                let t = $make;
                let s = t.store.clone();
                (t, s)
            }

            #[tokio::test]
            async fn appends_read_back_and_verify() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store, 3).await;
                // 1 opening batch + 2 per turn; each batch adds its entries plus a signed root.
                assert_eq!(head.batches(), 7);
                assert_eq!(head.leaves(), 2 + 6 * 3);
                assert_eq!(record.head().await.unwrap(), head);
                let entries = record.entries().await.unwrap();
                assert_eq!(entries.len() as u64, head.leaves());
                assert!(entries
                    .iter()
                    .enumerate()
                    .all(|(i, e)| e.position == i as u64));
                let report = record.verify(&trusted(), None).await.unwrap().unwrap();
                assert_eq!(report.entries_checked, head.leaves());
                assert_eq!(report.checkpoint.batches, 7);
            }

            #[tokio::test]
            async fn concurrent_appenders_at_one_head_exactly_one_wins() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store, 1).await;
                let conversation = record.prefix().conversation();
                let mut tasks = Vec::new();
                for i in 0..8u64 {
                    let record = record.clone();
                    let head = head.clone();
                    tasks.push(tokio::spawn(async move {
                        record
                            .append(
                                &signer(),
                                &head,
                                &batch_one(conversation, 2, &format!("racer {i}")),
                            )
                            .await
                    }));
                }
                let mut wins = 0;
                for task in tasks {
                    match task.await.unwrap() {
                        Ok(_) => wins += 1,
                        Err(e) => assert_eq!(e.kind(), ErrorKind::HeadMoved, "{e}"),
                    }
                }
                assert_eq!(wins, 1);
                let after = record.head().await.unwrap();
                assert_eq!(after.batches(), head.batches() + 1);
                record.verify(&trusted(), None).await.unwrap().unwrap();
                let transcript = Transcript::from_entries(&record.entries().await.unwrap());
                assert_eq!(
                    transcript.incomplete.len(),
                    1,
                    "exactly one turn 2 was opened"
                );
            }

            #[tokio::test]
            async fn the_head_is_found_whatever_the_hint_says() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 12).await;
                let hint = record.prefix().record_hint();
                for text in [
                    None,
                    Some("0"),
                    Some("3"),
                    Some("999"),
                    Some("not a number"),
                ] {
                    match text {
                        None => {
                            let _ = store.delete(&hint).await;
                        }
                        Some(t) => {
                            store
                                .put(&hint, PutPayload::from(t.as_bytes().to_vec()))
                                .await
                                .unwrap();
                        }
                    }
                    assert_eq!(record.head().await.unwrap(), head, "hint {text:?}");
                }
                // From a known head: unchanged, and after more appends.
                assert_eq!(record.head_after(Some(&head)).await.unwrap(), head);
                let conversation = record.prefix().conversation();
                let newer = record
                    .append(&signer(), &head, &batch_one(conversation, 13, "q"))
                    .await
                    .unwrap();
                assert_eq!(record.head_after(Some(&head)).await.unwrap(), newer);
            }

            #[tokio::test]
            async fn a_stale_head_fails_and_writes_nothing() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store, 1).await;
                let stale = record.head().await.unwrap();
                let conversation = record.prefix().conversation();
                record
                    .append(&signer(), &head, &batch_one(conversation, 2, "first"))
                    .await
                    .unwrap();
                let before = record.entries().await.unwrap();
                let err = record
                    .append(&signer(), &stale, &batch_one(conversation, 2, "late"))
                    .await
                    .unwrap_err();
                assert_eq!(err.kind(), ErrorKind::HeadMoved);
                assert_eq!(record.entries().await.unwrap(), before);
            }

            #[tokio::test]
            async fn entries_that_break_the_rules_are_refused_and_nothing_is_written() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store, 1).await;
                let conversation = record.prefix().conversation();
                let before = record.entries().await.unwrap();
                // A second completion of turn 1.
                let err = record
                    .append(&signer(), &head, &batch_two(1, "again"))
                    .await
                    .unwrap_err();
                assert_eq!(err.kind(), ErrorKind::InvalidInput);
                assert!(err.to_string().contains("turn_1 is not open"), "{err}");
                // Turn 1 again.
                let err = record
                    .append(&signer(), &head, &batch_one(conversation, 1, "again"))
                    .await
                    .unwrap_err();
                assert!(
                    err.to_string().contains("turn_1 is not after turn_1"),
                    "{err}"
                );
                assert_eq!(record.entries().await.unwrap(), before);
                // Lane inputs only in increasing lane order.
                let head = record
                    .append(
                        &signer(),
                        &head,
                        &[fixtures::message_at(conversation, "five", Some(5))],
                    )
                    .await
                    .unwrap();
                assert_eq!(head.state().lane_through, 5);
                assert_eq!(record.head().await.unwrap().state().lane_through, 5);
                for seq in [5, 4] {
                    let err = record
                        .append(
                            &signer(),
                            &head,
                            &[fixtures::message_at(conversation, "dup", Some(seq))],
                        )
                        .await
                        .unwrap_err();
                    assert!(err.to_string().contains("applied twice"), "{err}");
                }
                record.verify(&trusted(), None).await.unwrap().unwrap();
            }

            #[tokio::test]
            async fn bad_batches_are_refused() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 0).await;
                for bodies in [vec![], vec![fixtures::opened()]] {
                    let err = record.append(&signer(), &head, &bodies).await.unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::InvalidInput);
                }
                let fresh = Record::new(
                    store,
                    turnpike_artifactory::ConversationPrefix::new(
                        fixtures::tenant(),
                        turnpike_schemas::ConversationId::new(),
                    ),
                );
                let empty = fresh.head().await.unwrap();
                let err = fresh
                    .append(&signer(), &empty, &batch_two(1, "x"))
                    .await
                    .unwrap_err();
                assert!(err.to_string().contains("conversation_opened"), "{err}");
            }

            #[tokio::test]
            async fn an_edited_entry_is_found_at_its_position() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 3).await;
                // Batch 3 is turn 2's batch one; its first entry is at position 2 + 6 = 8.
                tamper(&record, &store, 3, |b| {
                    b["entries"][0]["payload"]["event"]["body"]["text"] = "forged".into();
                })
                .await;
                let f = failure(&record).await;
                assert_eq!((f.position, f.batch, f.problem), (8, 3, Problem::Edited));
            }

            #[tokio::test]
            async fn an_edit_with_recomputed_digest_breaks_the_root() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 3).await;
                tamper(&record, &store, 4, |b| {
                    b["entries"][0]["payload"]["text"] = "forged".into();
                    rehash(&mut b["entries"][0]);
                })
                .await;
                let f = failure(&record).await;
                // The whole batch (starting at position 11) is no longer trusted.
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (11, 4, Problem::RootMismatch)
                );
            }

            #[tokio::test]
            async fn reordered_entries_are_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                tamper(&record, &store, 1, |b| {
                    let entries = b["entries"].as_array_mut().unwrap();
                    entries.swap(0, 1);
                })
                .await;
                let f = failure(&record).await;
                assert_eq!(
                    (f.position, f.problem),
                    (2, Problem::OutOfOrder { found: 3 })
                );
            }

            #[tokio::test]
            async fn an_inserted_entry_is_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                tamper(&record, &store, 2, |b| {
                    let entries = b["entries"].as_array_mut().unwrap();
                    let mut extra = entries[0].clone();
                    extra["payload"]["text"] = "inserted".into();
                    rehash(&mut extra);
                    entries.insert(1, extra);
                })
                .await;
                let f = failure(&record).await;
                // Batch 2 starts at position 5; the inserted copy claims position 5 again at 6.
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (6, 2, Problem::OutOfOrder { found: 5 })
                );
            }

            #[tokio::test]
            async fn a_dropped_entry_is_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                tamper(&record, &store, 2, |b| {
                    b["entries"].as_array_mut().unwrap().remove(0);
                    b["first_position"] = 6.into();
                })
                .await;
                let f = failure(&record).await;
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (5, 2, Problem::OutOfOrder { found: 6 })
                );
            }

            #[tokio::test]
            async fn a_dropped_batch_is_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                store
                    .delete(&record.prefix().record_batch(2))
                    .await
                    .unwrap();
                let f = failure(&record).await;
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (5, 2, Problem::MissingBatch { found: 3 })
                );
            }

            #[tokio::test]
            async fn truncation_is_detected_against_a_checkpoint() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 2).await;
                let known = record
                    .verify(&trusted(), None)
                    .await
                    .unwrap()
                    .unwrap()
                    .checkpoint;
                store
                    .delete(&record.prefix().record_batch(head.batches() - 1))
                    .await
                    .unwrap();
                let full = record
                    .verify(&trusted(), Some(&known))
                    .await
                    .unwrap()
                    .unwrap_err();
                assert_eq!(
                    full.problem,
                    Problem::Truncated {
                        expected_leaves: head.leaves()
                    }
                );
                assert_eq!(full.position, head.leaves() - 3);
                let incremental = record
                    .verify_from(&trusted(), &known)
                    .await
                    .unwrap()
                    .unwrap_err();
                assert_eq!(
                    incremental.problem,
                    Problem::Truncated {
                        expected_leaves: head.leaves()
                    }
                );
            }

            #[tokio::test]
            async fn a_batch_cut_short_is_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                tamper(&record, &store, 4, |b| {
                    b["entries"].as_array_mut().unwrap().pop();
                })
                .await;
                let f = failure(&record).await;
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (13, 4, Problem::MissingSignedRoot)
                );
            }

            #[tokio::test]
            async fn a_forged_root_is_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                tamper(&record, &store, 2, |b| {
                    let closing = b["entries"].as_array_mut().unwrap().last_mut().unwrap();
                    closing["payload"]["root"] = "00".repeat(32).into();
                    rehash(closing);
                })
                .await;
                let f = failure(&record).await;
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (5, 2, Problem::RootMismatch)
                );
            }

            #[tokio::test]
            async fn a_forged_state_in_the_last_root_is_detected_and_not_trusted() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 2).await;
                let checkpoint = record.verify(&trusted(), None).await.unwrap().unwrap();
                let last = head.batches() - 1;
                // Claim the lane is committed far beyond what it is, and that the project is
                // at another version; recompute the root entry's unkeyed digest.
                tamper(&record, &store, last, |b| {
                    let closing = b["entries"].as_array_mut().unwrap().last_mut().unwrap();
                    closing["payload"]["state"]["lane_through"] = 1_000_000.into();
                    closing["payload"]["state"]["version"] = "f".repeat(40).into();
                    rehash(closing);
                })
                .await;
                let f = failure(&record).await;
                assert_eq!(f.batch, last);
                assert!(
                    matches!(f.problem, Problem::ForgedState | Problem::BadSignature),
                    "{f:?}"
                );
                // With the checkpoint a machine kept before the forgery, too.
                assert!(record
                    .verify(&trusted(), Some(&checkpoint.checkpoint))
                    .await
                    .unwrap()
                    .is_err());
                // A reader that checks signatures refuses the head; one that does not would
                // have trusted the forged position.
                assert_eq!(record.head().await.unwrap().state().lane_through, 1_000_000);
                let checked = record.clone().trusting(Arc::new(trusted()));
                let err = checked
                    .head()
                    .await
                    .expect_err("a forged state is not trusted");
                assert_eq!(err.kind(), ErrorKind::Corrupt);
            }

            #[tokio::test]
            async fn a_forged_state_is_found_by_incremental_verify_from_a_checkpoint() {
                let (_keep, store) = store();
                let (record, mut head) = record_with_turns(store.clone(), 1).await;
                let checkpoint = record.verify(&trusted(), None).await.unwrap().unwrap();
                let conversation = record.prefix().conversation();
                head = record
                    .append(&signer(), &head, &batch_one(conversation, 2, "two"))
                    .await
                    .unwrap();
                let last = head.batches() - 1;
                tamper(&record, &store, last, |b| {
                    let closing = b["entries"].as_array_mut().unwrap().last_mut().unwrap();
                    closing["payload"]["state"]["turn_open"] = false.into();
                    rehash(closing);
                })
                .await;
                let f = record
                    .verify(&trusted(), Some(&checkpoint.checkpoint))
                    .await
                    .unwrap()
                    .expect_err("the forgery is after the checkpoint");
                assert_eq!(f.batch, last);
                assert!(
                    matches!(f.problem, Problem::ForgedState | Problem::BadSignature),
                    "{f:?}"
                );
            }

            #[tokio::test]
            async fn a_bad_signature_is_detected() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 2).await;
                tamper(&record, &store, 3, |b| {
                    let closing = b["entries"].as_array_mut().unwrap().last_mut().unwrap();
                    let sig = closing["payload"]["signature"].as_str().unwrap().to_owned();
                    let flipped = if sig.starts_with('0') { "1" } else { "0" };
                    closing["payload"]["signature"] = format!("{flipped}{}", &sig[1..]).into();
                    rehash(closing);
                })
                .await;
                let f = failure(&record).await;
                assert_eq!(
                    (f.position, f.batch, f.problem),
                    (10, 3, Problem::BadSignature)
                );
            }

            #[tokio::test]
            async fn a_root_signed_by_another_key_is_detected() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 1).await;
                let intruder = RecordSigner::from_seed([9; 32]);
                let conversation = record.prefix().conversation();
                record
                    .append(&intruder, &head, &batch_one(conversation, 2, "intruder"))
                    .await
                    .unwrap();
                let f = failure(&record).await;
                assert_eq!(f.position, head.leaves() + 2);
                assert_eq!(f.problem, Problem::UnknownKey(intruder.key_id().to_owned()));
                // Trusting both keys (a rotation) accepts it.
                let both = TrustedKeys::new([signer().verifying_key(), intruder.verifying_key()]);
                record.verify(&both, None).await.unwrap().unwrap();
            }

            #[tokio::test]
            async fn incremental_verify_agrees_with_full_verify() {
                let (_keep, store) = store();
                let (record, mut head) = record_with_turns(store.clone(), 3).await;
                let early = record.verify(&trusted(), None).await.unwrap().unwrap();
                let conversation = record.prefix().conversation();
                for n in 4..=6 {
                    head = record
                        .append(&signer(), &head, &batch_one(conversation, n, "q"))
                        .await
                        .unwrap();
                    head = record
                        .append(&signer(), &head, &batch_two(n, "a"))
                        .await
                        .unwrap();
                }
                let full = record.verify(&trusted(), None).await.unwrap().unwrap();
                let incremental = record
                    .verify_from(&trusted(), &early.checkpoint)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(incremental.checkpoint, full.checkpoint);
                assert_eq!(
                    incremental.entries_checked,
                    full.entries_checked - early.entries_checked
                );
                assert_eq!(incremental.batches_checked, 6);
                // Nothing new: nothing checked, same checkpoint.
                let again = record
                    .verify_from(&trusted(), &full.checkpoint)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    (again.entries_checked, again.checkpoint),
                    (0, full.checkpoint.clone())
                );
                // A tamper in the new part is found at the same position by both.
                tamper(&record, &store, 9, |b| {
                    b["entries"][0]["payload"]["text"] = "forged".into();
                })
                .await;
                let f_full = record.verify(&trusted(), None).await.unwrap().unwrap_err();
                let f_inc = record
                    .verify_from(&trusted(), &early.checkpoint)
                    .await
                    .unwrap()
                    .unwrap_err();
                assert_eq!(f_full, f_inc);
                assert_eq!(f_full.problem, Problem::Edited);
                // A full verify against the old checkpoint notices rewritten history.
                let mut rewritten = early.checkpoint.clone();
                rewritten.root = full.checkpoint.root.clone();
                let bad = record
                    .verify_from(&trusted(), &rewritten)
                    .await
                    .unwrap()
                    .unwrap_err();
                assert_eq!(bad.problem, Problem::BadCheckpoint);
            }

            #[tokio::test]
            async fn transcripts_show_only_turns_with_both_markers() {
                let (_keep, store) = store();
                let (record, mut head) = record_with_turns(store, 2).await;
                let conversation = record.prefix().conversation();
                // Turn 3: quarantined (a side-effecting call's outcome is unknown).
                let turn = TurnId::new(3).unwrap();
                head = record
                    .append(
                        &signer(),
                        &head,
                        &[
                            EntryBody::TurnDispatched(TurnDispatched {
                                turn,
                                worker: WorkerId::new(),
                                agent: "helper".parse().unwrap(),
                                epoch: turnpike_schemas::Epoch(2),
                                at_ms: 5,
                            }),
                            EntryBody::TurnAmbiguous(TurnAmbiguous {
                                turn,
                                tool: "send_email".into(),
                                call_id: "c1".into(),
                                reason: "worker died".into(),
                            }),
                        ],
                    )
                    .await
                    .unwrap();
                // Turn 4: dispatched, never completed (its worker died between the batches).
                head = record
                    .append(&signer(), &head, &batch_one(conversation, 4, "lost"))
                    .await
                    .unwrap();
                // An input waiting for the next turn.
                record
                    .append(&signer(), &head, &[fixtures::message(conversation, "next")])
                    .await
                    .unwrap();
                let t = Transcript::from_entries(&record.entries().await.unwrap());
                let turns = |v: &[turnpike_artifactory::record::TurnView]| {
                    v.iter().map(|t| t.turn.number()).collect::<Vec<_>>()
                };
                assert_eq!(turns(&t.committed), [1, 2]);
                assert_eq!(turns(&t.incomplete), [4]);
                assert_eq!(turns(&t.quarantined), [3]);
                // An input committed while turn 4 is open belongs to turn 4.
                assert!(t.pending.is_empty());
                assert_eq!(t.incomplete[0].entries.len(), 3);
                assert_eq!(t.next_turn().number(), 5);
                assert!(t.opened.is_some());
                // A committed turn carries its input, its reply and both markers.
                assert_eq!(t.committed[0].entries.len(), 4);
            }

            #[tokio::test]
            async fn repair_removes_unreadable_entries_and_re_signs() {
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 3).await;
                let path = record.prefix().record_batch(3);
                store
                    .put(&path, PutPayload::from_static(b"{not json"))
                    .await
                    .unwrap();
                tamper(&record, &store, 6, |b| {
                    b["entries"][0]["payload"]["text"] = "forged".into();
                })
                .await;
                assert!(record.verify(&trusted(), None).await.unwrap().is_err());
                let report = record.repair(&signer(), &trusted(), 77).await.unwrap();
                // Batch 3 (turn 2's input and dispatch) is gone, so turn 2's reply and completion
                // (positions 11, 12) no longer fit the record's rules; entry 17 was edited.
                let removed: Vec<_> = report
                    .removed
                    .iter()
                    .map(|r| (r.batch, r.position))
                    .collect();
                assert_eq!(
                    removed,
                    [(3, None), (4, Some(11)), (4, Some(12)), (6, Some(17))],
                    "{report:?}"
                );
                assert_eq!(report.batches_after, 5);
                record.verify(&trusted(), None).await.unwrap().unwrap();
                let t = Transcript::from_entries(&record.entries().await.unwrap());
                assert_eq!(
                    t.committed
                        .iter()
                        .map(|v| v.turn.number())
                        .collect::<Vec<_>>(),
                    [1, 3]
                );
                // The originals were kept.
                let kept = store
                    .get(&record.prefix().repaired_batch(77, 3))
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                assert_eq!(&kept[..], b"{not json");
                // And the record can be appended to again.
                let head = record.head().await.unwrap();
                let conversation = record.prefix().conversation();
                record
                    .append(
                        &signer(),
                        &head,
                        &batch_one(conversation, 4, "after repair"),
                    )
                    .await
                    .unwrap();
            }

            #[tokio::test]
            async fn a_repair_cut_short_at_any_write_leaves_the_old_record_or_rolls_forward_to_the_new() {
                /// The record's batch objects, in order.
                async fn batches(record: &Record, store: &Arc<dyn ObjectStore>) -> Vec<Vec<u8>> {
                    use futures::TryStreamExt as _;
                    let mut metas: Vec<_> = store
                        .list(Some(&record.prefix().record_dir()))
                        .try_collect()
                        .await
                        .unwrap();
                    metas.sort_by(|a, b| a.location.cmp(&b.location));
                    let mut out = Vec::new();
                    for m in metas {
                        out.push(store.get(&m.location).await.unwrap().bytes().await.unwrap().to_vec());
                    }
                    out
                }
                /// A record of 3 turns with batch 3 unreadable, on a fresh store.
                async fn damaged() -> (turnpike_tests::stores::TestStore, Arc<dyn ObjectStore>, Record) {
                    let (keep, store) = store();
                    let (record, _) = record_with_turns(store.clone(), 3).await;
                    store
                        .put(&record.prefix().record_batch(3), PutPayload::from_static(b"{not json"))
                        .await
                        .unwrap();
                    (keep, store, record)
                }
                // Kill it after each of its writes in turn.
                let mut cut_at_least_once = false;
                for budget in 0.. {
                    let (_keep, store, record) = damaged().await;
                    let old = batches(&record, &store).await;
                    // What a repair that runs to its end makes of the same record (on a copy).
                    let copy: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
                    {
                        use futures::TryStreamExt as _;
                        let metas: Vec<_> = store.list(None).try_collect().await.unwrap();
                        for m in metas {
                            let bytes = store.get(&m.location).await.unwrap().bytes().await.unwrap();
                            copy.put(&m.location, PutPayload::from(bytes)).await.unwrap();
                        }
                    }
                    let whole = Record::new(copy.clone(), record.prefix().clone());
                    whole.repair(&signer(), &trusted(), 81).await.unwrap();
                    let new = batches(&whole, &copy).await;
                    assert_ne!(old, new);
                    let faulty: Arc<dyn ObjectStore> =
                        turnpike_tests::faulty::FaultyStore::new(store.clone(), budget);
                    let cut = Record::new(faulty, record.prefix().clone());
                    if cut.repair(&signer(), &trusted(), 81).await.is_ok() {
                        break;
                    }
                    cut_at_least_once = true;
                    let now = batches(&record, &store).await;
                    if now != old {
                        // Past the commit point: whoever comes next finishes it.
                        assert!(record.finish_repair().await.unwrap(), "budget {budget}: half a repair and no journal");
                        assert_eq!(batches(&record, &store).await, new, "budget {budget}");
                    } else if record.finish_repair().await.unwrap() {
                        assert_eq!(batches(&record, &store).await, new, "budget {budget}");
                    }
                    let after = batches(&record, &store).await;
                    assert!(after == old || after == new, "budget {budget}: a mix of old and new");
                    if after == new {
                        record.verify(&trusted(), None).await.unwrap().unwrap();
                        assert!(!record.finish_repair().await.unwrap(), "the journal is gone");
                    }
                }
                assert!(cut_at_least_once);
            }

            #[tokio::test]
            async fn repair_drops_forged_batches_instead_of_signing_them() {
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 2).await;
                let conversation = record.prefix().conversation();
                // An intruder appends a batch signed with its own key …
                let intruder = RecordSigner::from_seed([9; 32]);
                record
                    .append(&intruder, &head, &batch_one(conversation, 3, "planted"))
                    .await
                    .unwrap();
                // … and edits turn 1's reply, recomputing every digest and even the root
                // (but it cannot sign it).
                tamper(&record, &store, 2, |b| {
                    let entries = b["entries"].as_array_mut().unwrap();
                    entries[0]["payload"]["text"] = "forged reply".into();
                    rehash(&mut entries[0]);
                })
                .await;
                assert!(record.verify(&trusted(), None).await.unwrap().is_err());
                let report = record.repair(&signer(), &trusted(), 78).await.unwrap();
                let dropped: Vec<_> = report
                    .removed
                    .iter()
                    .filter(|r| r.position.is_none())
                    .map(|r| r.batch)
                    .collect();
                assert_eq!(dropped, [2, head.batches()], "{report:?}");
                record.verify(&trusted(), None).await.unwrap().unwrap();
                let text = serde_json::to_string(
                    &record
                        .entries()
                        .await
                        .unwrap()
                        .iter()
                        .map(|e| format!("{:?}", e.body))
                        .collect::<Vec<_>>(),
                )
                .unwrap();
                assert!(
                    !text.contains("planted"),
                    "the intruder's batch was re-signed"
                );
                assert!(
                    !text.contains("forged reply"),
                    "the edited batch was re-signed"
                );
            }

            /// A turn's batch one committed with the batch two of the turn before: the open
            /// turn's entries start after that turn's close (a side-effecting call the turn
            /// before left unanswered, parked for approval, is not the open turn's), and the
            /// record says which kind of opening it was.
            #[tokio::test]
            async fn an_open_turn_opened_with_the_close_before_it_holds_only_its_own_entries() {
                use turnpike_schemas::entry::ToolCall;
                let (_keep, store) = store();
                let (record, head) = record_with_turns(store.clone(), 0).await;
                let conversation = record.prefix().conversation();
                let head = record
                    .append(&signer(), &head, &batch_one(conversation, 1, "send it"))
                    .await
                    .unwrap();
                assert!(!record.opened_with_close(&head).await.unwrap());
                let mut closing_and_opening = vec![EntryBody::ToolCall(ToolCall {
                    turn: TurnId::FIRST,
                    call_id: "c1".into(),
                    tool: "send".into(),
                    arguments: serde_json::json!({}),
                    side_effects: true,
                })];
                closing_and_opening.extend(batch_two(1, "waiting for approval"));
                closing_and_opening.extend(batch_one(conversation, 2, "and this"));
                let head = record
                    .append(&signer(), &head, &closing_and_opening)
                    .await
                    .unwrap();
                let (turn, entries) = record.open_turn(&head).await.unwrap().unwrap();
                assert_eq!(turn, TurnId::new(2).unwrap());
                let kinds: Vec<_> = entries.iter().map(|e| e.body.kind()).collect();
                use turnpike_schemas::EntryKind::{SignedRoot, TurnDispatched, UserMessage};
                assert_eq!(kinds, [UserMessage, TurnDispatched, SignedRoot]);
                assert!(record.opened_with_close(&head).await.unwrap());
                // Later entries of the open turn follow, from the batches after.
                let head = record
                    .append(&signer(), &head, &[batch_two(2, "x")[0].clone()])
                    .await
                    .unwrap();
                let (_, entries) = record.open_turn(&head).await.unwrap().unwrap();
                assert_eq!(entries.len(), 5);
                assert!(record.opened_with_close(&head).await.unwrap());
                // Closed: no open turn, nothing opened.
                let head = record
                    .append(&signer(), &head, &[batch_two(2, "x")[1].clone()])
                    .await
                    .unwrap();
                assert!(record.open_turn(&head).await.unwrap().is_none());
                assert!(!record.opened_with_close(&head).await.unwrap());
            }

            /// A committed attempt's log is promoted to its key: moved where the store
            /// renames create-only, copied (its attempt copy left for the clearing after)
            /// where it cannot (S3 without copy-if-not-exists). Either way the key holds the
            /// committed bytes, promoting again is success, and other bytes are never put there.
            #[tokio::test]
            async fn a_promoted_log_is_at_its_key_moved_or_copied_never_overwritten() {
                use turnpike_schemas::Block;
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 1).await;
                let prefix = record.prefix();
                let logs = turnpike_artifactory::TurnLogs::new(store.clone());
                let log = fixtures::turn_log(
                    prefix.conversation(),
                    TurnId::FIRST,
                    vec![Block::AssistantMessage { text: "a".into() }],
                );
                let canonical = prefix.turn_log(TurnId::FIRST);
                let attempt = |a| prefix.in_attempt(&canonical, TurnId::FIRST, a);
                logs.write_attempt(prefix, &log, 7).await.unwrap();
                let moved = logs.promote(prefix, &log, 7).await.unwrap();
                assert_eq!(moved, stringify!($backend) != "s3", "moved by the store");
                assert_eq!(store.head(&attempt(7)).await.is_ok(), !moved);
                assert_eq!(logs.read(prefix, TurnId::FIRST).await.unwrap(), log);
                // Whoever finishes a promotion it found unfinished: success, the same bytes.
                assert!(!logs.promote(prefix, &log, 7).await.unwrap());
                assert_eq!(logs.read(prefix, TurnId::FIRST).await.unwrap(), log);
                // Another attempt's bytes are refused, and its copy is not moved over.
                let mut other = log.clone();
                other.blocks = vec![Block::AssistantMessage { text: "b".into() }];
                logs.write_attempt(prefix, &other, 8).await.unwrap();
                let refused = logs.promote(prefix, &other, 8).await.unwrap_err();
                assert_eq!(refused.kind(), ErrorKind::AlreadyExists);
                assert!(store.head(&attempt(8)).await.is_ok());
                assert_eq!(logs.read(prefix, TurnId::FIRST).await.unwrap(), log);
            }

            #[tokio::test]
            async fn turn_logs_are_one_object_per_turn() {
                use turnpike_schemas::Block;
                let (_keep, store) = store();
                let (record, _) = record_with_turns(store.clone(), 1).await;
                let logs = turnpike_artifactory::TurnLogs::new(store.clone());
                let log = fixtures::turn_log(
                    record.prefix().conversation(),
                    TurnId::FIRST,
                    vec![
                        Block::UserMessage { text: "q".into() },
                        Block::AssistantMessage { text: "a".into() },
                    ],
                );
                logs.write(record.prefix(), &log).await.unwrap();
                assert_eq!(
                    logs.read(record.prefix(), TurnId::FIRST).await.unwrap(),
                    log
                );
                let missing = logs
                    .read(record.prefix(), TurnId::new(2).unwrap())
                    .await
                    .unwrap_err();
                assert_eq!(missing.kind(), ErrorKind::NotFound);
            }
        }
    };
}

record_suite!(memory, turnpike_tests::stores::memory());
record_suite!(local_fs, turnpike_tests::stores::local());
record_suite!(sqlite, turnpike_tests::stores::sqlite());
record_suite!(s3, turnpike_tests::stores::s3());
