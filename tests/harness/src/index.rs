//! The real embedding model for index tests, loaded once per test binary.

use std::sync::{Arc, OnceLock};

use turnpike_index::embed::MiniLm;
use turnpike_index::Embedder;

/// Where the all-MiniLM-L6-v2 files are: `$TURNPIKE_EMBEDDING_MODEL`, else where the services
/// script puts them.
pub fn model_dir() -> std::path::PathBuf {
    std::env::var("TURNPIKE_EMBEDDING_MODEL")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services/models/all-MiniLM-L6-v2".into())
        .into()
}

/// The local embedder (all-MiniLM-L6-v2, 384 dimensions).
pub fn embedder() -> Arc<dyn Embedder> {
    static MODEL: OnceLock<Arc<MiniLm>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            Arc::new(
                MiniLm::load(&model_dir())
                    .expect("the embedding model: `scripts/services install tests` fetches it"),
            )
        })
        .clone()
}
