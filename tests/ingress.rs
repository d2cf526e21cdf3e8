//! Ingress remembers directory entries and closed conversations between events; these tests
//! try to make that memory wrong: a revoked grant, a close through the same process, another
//! process's view.

use std::sync::Arc;

use object_store::memory::InMemory;
use turnpike_artifactory::Conversations;
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::{Bus, ErrorKind, Ingress};
use turnpike_schemas::{EventBody, Identity};
use turnpike_tests::fixtures::{owner, support_conversation, tenant};

fn message() -> EventBody {
    EventBody::Message { text: "hi".into() }
}

#[tokio::test]
async fn remembered_entries_never_outlive_a_revoked_grant_or_a_close() {
    let dir = tempfile::tempdir().unwrap();
    let conversations = Conversations::new(Arc::new(InMemory::new()));
    let bus: Arc<dyn Bus> =
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default()).unwrap();
    let conv = support_conversation(&conversations, owner())
        .await
        .conversation;
    let ingress = Ingress::new(bus.clone(), conversations.clone());
    let guest: Identity = "oidc:acme:guest".parse().unwrap();
    let send = |who: Identity| {
        let ingress = ingress.clone();
        async move { ingress.submit(&tenant(), &who, conv, message(), None).await }
    };

    // The entry is remembered after the owner's first event.
    send(owner()).await.unwrap();
    assert_eq!(
        send(guest.clone()).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // Another tenant's caller with the owner's name: not found, cached entry or not.
    let other = ingress
        .submit(&"other".parse().unwrap(), &owner(), conv, message(), None)
        .await
        .unwrap_err();
    assert_eq!(other.kind(), ErrorKind::NotFound);
    conversations.directory().grant(conv, &guest).await.unwrap();
    send(guest.clone()).await.unwrap();
    conversations
        .directory()
        .revoke(conv, &guest)
        .await
        .unwrap();
    assert_eq!(
        send(guest.clone()).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // Closed through this process: refused at once, though it was just seen open.
    conversations.directory().close(conv, 5).await.unwrap();
    ingress.forget_open(conv);
    assert_eq!(send(owner()).await.unwrap_err().kind(), ErrorKind::Closed);
    // Another process (an ingress that had not seen it) finds it closed too; closed stays.
    let elsewhere = Ingress::new(bus, conversations);
    let refused = elsewhere
        .submit(&tenant(), &owner(), conv, message(), None)
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Closed);
    assert_eq!(send(owner()).await.unwrap_err().kind(), ErrorKind::Closed);
}
