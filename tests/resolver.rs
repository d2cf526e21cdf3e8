//! The resolver against every store backend: a reference only locates; resolution runs as the
//! bound identity, and another identity's object is indistinguishable from a missing one, in
//! any encoding.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use turnpike_artifactory::{Conversations, NewConversation, TurnLogs};
use turnpike_resolver::families::{HostedFiles, TurnLogBlocks};
use turnpike_resolver::{ResolveError, Resolver};
use turnpike_schemas::{Block, ConversationId, Identity, RefPath, TurnId};
use turnpike_tests::fixtures::signer;

fn alice() -> Identity {
    "oidc:acme:alice".parse().unwrap()
}

fn bob() -> Identity {
    "oidc:acme:bob".parse().unwrap()
}

/// Alice's conversation with a hosted file and a turn log in turn 1.
async fn setup(store: Arc<dyn ObjectStore>) -> (Resolver, ConversationId) {
    let conversations = Conversations::new(store.clone());
    let (entry, _, _) = conversations
        .create(
            &signer(),
            NewConversation {
                tenant: "acme".parse().unwrap(),
                owner: alice(),
                app: "support".parse().unwrap(),
                agent: "helper".parse().unwrap(),
                at_ms: 1,
                instructions: None,
                started_by: None,
            },
        )
        .await
        .unwrap();
    let prefix = entry.prefix();
    let path = RefPath::parse("out/report.csv").unwrap();
    store
        .put(
            &prefix.hosted_file(TurnId::FIRST, &path),
            PutPayload::from_static(b"a,b\n1,2\n"),
        )
        .await
        .unwrap();
    let logs = TurnLogs::new(store.clone());
    logs.write(
        &prefix,
        &turnpike_tests::fixtures::turn_log(
            entry.conversation,
            TurnId::FIRST,
            vec![Block::UserMessage {
                text: "secret question".into(),
            }],
        ),
    )
    .await
    .unwrap();
    let resolver = Resolver::new(conversations.directory().clone())
        .register(Arc::new(HostedFiles::new(store)))
        .register(Arc::new(TurnLogBlocks::new(logs)));
    (resolver, entry.conversation)
}

/// The outcome of a resolution with the conversation ids blanked, for comparing denials.
fn shape(
    result: Result<turnpike_resolver::Resolved, ResolveError>,
    ids: &[ConversationId],
) -> String {
    let mut text = match result {
        Ok(r) => format!("ok {} bytes", r.bytes.len()),
        Err(ResolveError::NotFound(m)) => format!("not found {m}"),
        Err(ResolveError::Invalid(m)) => format!("invalid {m}"),
        Err(e) => format!("other {e}"),
    };
    for id in ids {
        text = text.replace(&id.to_string(), "<conv>");
        text = text.replace(&id.to_string().to_lowercase(), "<conv>");
    }
    text
}

macro_rules! resolver_suite {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn the_owner_reads_files_and_turn_logs() {
                let keep = $make;
                let (resolver, conv) = setup(keep.store.clone()).await;
                let file = resolver
                    .resolve_str(&alice(), &format!("conv:fi:{conv}/turn_1/out/report.csv"))
                    .await
                    .unwrap();
                assert_eq!(
                    (&file.bytes[..], file.media_type.as_str()),
                    (&b"a,b\n1,2\n"[..], "text/csv")
                );
                // The same object through an encoded (but equivalent) path.
                let encoded = resolver
                    .resolve_str(&alice(), &format!("conv:fi:{conv}/turn_1/out/report%2Ecsv"))
                    .await
                    .unwrap();
                assert_eq!(encoded, file);
                let log = resolver
                    .resolve_str(&alice(), &format!("conv:tl:{conv}/turn_1/log.json"))
                    .await
                    .unwrap();
                assert!(String::from_utf8_lossy(&log.bytes).contains("secret question"));
                let block = resolver
                    .resolve_str(&alice(), &format!("conv:tl:{conv}/turn_1/blocks/0"))
                    .await
                    .unwrap();
                assert!(String::from_utf8_lossy(&block.bytes).contains("user_message"));
                for missing in [
                    format!("conv:fi:{conv}/turn_1/out/other.csv"),
                    format!("conv:fi:{conv}/turn_2/out/report.csv"),
                    format!("conv:tl:{conv}/turn_1/blocks/9"),
                    format!("conv:tl:{conv}/turn_1/blocks/x"),
                    format!("conv:zz:{conv}/turn_1/out/report.csv"),
                ] {
                    let err = resolver.resolve_str(&alice(), &missing).await.unwrap_err();
                    assert!(matches!(err, ResolveError::NotFound(_)), "{missing}: {err}");
                }
            }

            #[tokio::test]
            async fn a_large_file_is_streamed_as_it_is_read_and_only_to_its_readers() {
                use futures::StreamExt as _;
                let keep = $make;
                let (resolver, conv) = setup(keep.store.clone()).await;
                let prefix =
                    turnpike_artifactory::ConversationPrefix::new("acme".parse().unwrap(), conv);
                let big: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
                keep.store
                    .put(
                        &prefix.hosted_file(TurnId::FIRST, &RefPath::parse("out/big.bin").unwrap()),
                        PutPayload::from(big.clone()),
                    )
                    .await
                    .unwrap();
                let reference = format!("conv:fi:{conv}/turn_1/out/big.bin");
                let mut opened = resolver.open_str(&alice(), &reference).await.unwrap();
                assert_eq!(opened.size, Some(big.len() as u64));
                let (mut chunks, mut read) = (0, Vec::new());
                while let Some(chunk) = opened.stream.next().await {
                    chunks += 1;
                    read.extend_from_slice(&chunk.unwrap());
                }
                assert!(read == big, "the streamed bytes are the file's");
                if stringify!($backend) != "memory" {
                    assert!(chunks > 1, "read whole, not streamed ({chunks} chunk)");
                }
                let denied = resolver.open_str(&bob(), &reference).await.err().unwrap();
                assert!(matches!(denied, ResolveError::NotFound(_)), "{denied}");
            }

            #[tokio::test]
            async fn another_identity_gets_what_a_missing_object_gets_in_any_encoding() {
                let keep = $make;
                let (resolver, conv) = setup(keep.store.clone()).await;
                let nowhere = ConversationId::new();
                let forms = [
                    "conv:fi:{c}/turn_1/out/report.csv",
                    "conv:fi:{c}/turn_1/out/report%2Ecsv",
                    "conv:fi:{c}/turn_1/out%2Freport.csv",
                    "conv:fi:{c}/turn_1/out/../out/report.csv",
                    "conv:fi:{c}/turn_1/out/%2e%2e/report.csv",
                    "conv:fi:{c}/turn_1/out/%252e%252e/report.csv",
                    "conv:fi:{c}/turn_1//out/report.csv",
                    "conv:fi:{c}/turn_01/out/report.csv",
                    "conv:fi:{lc}/turn_1/out/report.csv",
                    "conv:tl:{c}/turn_1/log.json",
                    "conv:tl:{c}/turn_1/blocks/0",
                    "conv:tl:{c}/turn_1/blocks%2F0",
                ];
                for form in forms {
                    let of = |id: ConversationId| {
                        form.replace("{c}", &id.to_string())
                            .replace("{lc}", &id.to_string().to_lowercase())
                    };
                    let theirs = resolver.resolve_str(&bob(), &of(conv)).await;
                    assert!(theirs.is_err(), "{form}: bob read alice's object");
                    let missing = resolver.resolve_str(&bob(), &of(nowhere)).await;
                    assert_eq!(
                        shape(theirs, &[conv, nowhere]),
                        shape(missing, &[conv, nowhere]),
                        "{form}"
                    );
                }
            }
        }
    };
}

resolver_suite!(memory, turnpike_tests::stores::memory());
resolver_suite!(local_fs, turnpike_tests::stores::local());
resolver_suite!(s3, turnpike_tests::stores::s3());
