//! Record signing keys (ed25519).
//!
//! A key is a 32-byte seed, stored as 64 hex characters (a file, or an environment variable).
//! Its id is the hex of the first 8 bytes of SHA-256 of the public key.
//!
//! Signing goes through AWS-LC (linked already for the S3 client's TLS), which signs in about
//! half the time ed25519-dalek takes on x86-64 (7 against 13 µs here; a record signs every
//! batch). Ed25519 signatures are deterministic, so both make the same bytes (a test checks);
//! verifying stays with ed25519-dalek, whose rules `verify` documents.

use std::path::Path;
use std::sync::Arc;

use ed25519_dalek::{Signer as _, SigningKey, Verifier as _, VerifyingKey};
use sha2::{Digest as _, Sha256};

use crate::error::{Error, ErrorKind, Result};
use crate::mmr::Hash;

/// Signs record roots.
#[derive(Clone)]
pub struct RecordSigner {
    key: SigningKey,
    /// The same key in AWS-LC, which signs (see the module docs); `None` only should AWS-LC
    /// refuse the seed, and then `key` signs.
    fast: Option<Arc<aws_lc_rs::signature::Ed25519KeyPair>>,
    id: String,
}

impl std::fmt::Debug for RecordSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSigner")
            .field("key_id", &self.id)
            .finish()
    }
}

/// The message a root signature covers: domain, partition, leaf count, root, and — from batch
/// format 2 on — the SHA-256 of the record state the root carries (`state`), so a reader that
/// checks the last root's signature can trust the state without replaying the record.
/// Format 1 roots (`state: None`) signed no state.
pub fn signed_message(
    partition: &str,
    leaf_count: u64,
    root: &Hash,
    state: Option<&Hash>,
) -> Vec<u8> {
    let mut m = Vec::with_capacity(96 + partition.len());
    match state {
        None => m.extend_from_slice(b"turnpike-record-root-v1\0"),
        Some(_) => m.extend_from_slice(b"turnpike-record-root-v2\0"),
    }
    m.extend_from_slice(&(partition.len() as u64).to_be_bytes());
    m.extend_from_slice(partition.as_bytes());
    m.extend_from_slice(&leaf_count.to_be_bytes());
    m.extend_from_slice(root);
    if let Some(state) = state {
        m.extend_from_slice(state);
    }
    m
}

/// The message an archive's signature covers: a domain, then the SHA-256 of its manifest
/// (without the signature).
pub fn archive_message(manifest_digest: &Hash) -> Vec<u8> {
    let mut m = b"turnpike-archive-v1\0".to_vec();
    m.extend_from_slice(manifest_digest);
    m
}

/// The digest of a record state as a signed root carries it (SHA-256 of its JSON).
pub fn state_digest(state: &turnpike_schemas::entry::RecordState) -> Hash {
    let bytes = serde_json::to_vec(state).expect("record states serialise");
    Sha256::digest(&bytes).into()
}

/// The id of a public key.
pub fn key_id(key: &VerifyingKey) -> String {
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(&digest[..8])
}

impl RecordSigner {
    /// A fresh random key.
    pub fn generate() -> Result<Self> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed)
            .map_err(|e| Error::new(ErrorKind::Key, format!("no randomness for a new key: {e}")))?;
        Ok(Self::from_seed(seed))
    }

    /// The key with this seed.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&seed);
        let id = key_id(&key.verifying_key());
        // AWS-LC derives the public key again and must arrive at dalek's (checked in constant
        // time): the signatures this key makes are remembered as valid for dalek's key.
        let fast = aws_lc_rs::signature::Ed25519KeyPair::from_seed_and_public_key(
            &seed,
            key.verifying_key().as_bytes(),
        )
        .inspect_err(|e| tracing::warn!(error = %e, "AWS-LC refused the record key; signing with ed25519-dalek"))
        .ok()
        .map(Arc::new);
        Self { key, fast, id }
    }

    /// The Ed25519 signature of `message` by this key.
    fn sign_bytes(&self, message: &[u8]) -> [u8; 64] {
        self.fast
            .as_ref()
            .and_then(|k| k.try_sign(message).ok())
            .and_then(|signature| <[u8; 64]>::try_from(signature.as_ref()).ok())
            .unwrap_or_else(|| self.key.sign(message).to_bytes())
    }

    /// Parses 64 hex characters (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim()).map_err(|_| {
            Error::new(
                ErrorKind::Key,
                "a signing key must be 64 hex characters (a 32-byte seed)",
            )
        })?;
        let seed: [u8; 32] = bytes.try_into().map_err(|_| {
            Error::new(
                ErrorKind::Key,
                "a signing key must be 64 hex characters (a 32-byte seed)",
            )
        })?;
        Ok(Self::from_seed(seed))
    }

    /// Reads a key file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::with_source(
                ErrorKind::Key,
                format!("cannot read the signing key {}: {e}", path.display()),
                e,
            )
        })?;
        Self::from_hex(&text)
            .map_err(|e| Error::new(ErrorKind::Key, format!("{}: {e}", path.display())))
    }

    /// Reads the key file at `path`, creating it (mode 0600) with a fresh key if absent.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        if path.exists() {
            return Self::load(path);
        }
        let signer = Self::generate()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::with_source(
                    ErrorKind::Key,
                    format!("cannot create {}: {e}", dir.display()),
                    e,
                )
            })?;
        }
        write_private(path, &signer.to_hex()).map_err(|e| {
            Error::with_source(
                ErrorKind::Key,
                format!("cannot write the signing key {}: {e}", path.display()),
                e,
            )
        })?;
        Ok(signer)
    }

    /// The seed as hex, for writing to a key file.
    pub fn to_hex(&self) -> String {
        hex::encode(self.key.to_bytes())
    }

    /// The key id.
    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The public half.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// Signs an archive's manifest digest (see [`archive_message`]).
    pub fn sign_archive(&self, manifest_digest: &Hash) -> [u8; 64] {
        self.sign_bytes(&archive_message(manifest_digest))
    }

    /// Signs a root of `partition` covering `leaf_count` leaves and, when given, the digest of
    /// the state the root carries (see [`signed_message`]). The signature is remembered as
    /// valid for this key (`crate::verified`): reading the batch back does not verify it again.
    pub fn sign(
        &self,
        partition: &str,
        leaf_count: u64,
        root: &Hash,
        state: Option<&Hash>,
    ) -> [u8; 64] {
        let message = signed_message(partition, leaf_count, root, state);
        let signature = self.sign_bytes(&message);
        crate::verified::remember(&self.key.verifying_key(), &message, &signature);
        signature
    }
}

/// The public keys a verifier trusts (several during a key rotation).
#[derive(Debug, Clone, Default)]
pub struct TrustedKeys {
    keys: Vec<(String, VerifyingKey)>,
}

impl TrustedKeys {
    /// Trusts these keys.
    pub fn new(keys: impl IntoIterator<Item = VerifyingKey>) -> Self {
        Self {
            keys: keys.into_iter().map(|k| (key_id(&k), k)).collect(),
        }
    }

    /// The trusted public key with id `key_id`.
    pub fn public_key(&self, key_id: &str) -> Option<VerifyingKey> {
        self.keys
            .iter()
            .find(|(id, _)| id == key_id)
            .map(|(_, key)| *key)
    }

    /// Parses a public key from 64 hex characters.
    pub fn parse_public(text: &str) -> Result<VerifyingKey> {
        let bytes: [u8; 32] = hex::decode(text.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Error::new(ErrorKind::Key, "a public key must be 64 hex characters"))?;
        VerifyingKey::from_bytes(&bytes)
            .map_err(|e| Error::with_source(ErrorKind::Key, "not a valid ed25519 public key", e))
    }

    /// Whether a batch's signed root is signed by a trusted key over `root_hash` (the MMR root
    /// the caller derived or parsed), its leaf count and — for batch format 2 and later — the
    /// state it carries.
    pub fn verify_root(
        &self,
        partition: &str,
        root: &turnpike_schemas::entry::SignedRoot,
        root_hash: &Hash,
        format: u16,
    ) -> SignatureCheck {
        let state = (format >= 2).then(|| state_digest(&root.state));
        let signature = hex::decode(&root.signature).unwrap_or_default();
        self.verify(
            &root.key_id,
            partition,
            root.leaf_count,
            root_hash,
            state.as_ref(),
            &signature,
        )
    }

    /// Whether `signature` by key `key_id` over an archive's manifest digest is valid.
    pub fn verify_archive(
        &self,
        key_id: &str,
        manifest_digest: &Hash,
        signature: &[u8],
    ) -> SignatureCheck {
        let Some((_, key)) = self.keys.iter().find(|(id, _)| id == key_id) else {
            return SignatureCheck::UnknownKey;
        };
        let Ok(signature) = ed25519_dalek::Signature::from_slice(signature) else {
            return SignatureCheck::Invalid;
        };
        match key.verify(&archive_message(manifest_digest), &signature) {
            Ok(()) => SignatureCheck::Valid,
            Err(_) => SignatureCheck::Invalid,
        }
    }

    /// Whether a signature by key `key_id` over this root (and state digest, for format 2) is
    /// valid.
    pub fn verify(
        &self,
        key_id: &str,
        partition: &str,
        leaf_count: u64,
        root: &Hash,
        state: Option<&Hash>,
        signature: &[u8],
    ) -> SignatureCheck {
        let Some((_, key)) = self.keys.iter().find(|(id, _)| id == key_id) else {
            return SignatureCheck::UnknownKey;
        };
        let message = signed_message(partition, leaf_count, root, state);
        // Known valid (verified or made here before): the same answer, without the curve work.
        if crate::verified::is_known(key, &message, signature) {
            return SignatureCheck::Valid;
        }
        let Ok(parsed) = ed25519_dalek::Signature::from_slice(signature) else {
            return SignatureCheck::Invalid;
        };
        match key.verify(&message, &parsed) {
            Ok(()) => {
                crate::verified::remember(key, &message, signature);
                SignatureCheck::Valid
            }
            Err(_) => SignatureCheck::Invalid,
        }
    }
}

/// The outcome of checking one signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureCheck {
    Valid,
    /// Signed by a key that is not trusted.
    UnknownKey,
    /// Not a valid signature of this message by the named key.
    Invalid,
}

#[cfg(unix)]
pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

#[cfg(not(unix))]
pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, format!("{text}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8032, section 7.1, test 1: the key, an empty message, and its signature.
    #[test]
    fn signs_the_standards_test_vector() {
        let hex32 = |h: &str| -> [u8; 32] { hex::decode(h).unwrap().try_into().unwrap() };
        let signer = RecordSigner::from_seed(hex32(
            "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        ));
        assert!(signer.fast.is_some(), "AWS-LC took the key");
        assert_eq!(
            hex::encode(signer.verifying_key().as_bytes()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        assert_eq!(
            hex::encode(signer.sign_bytes(b"")),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        );
    }

    proptest::proptest! {
        /// AWS-LC, which signs, makes the signature ed25519-dalek makes, and it verifies.
        #[test]
        fn both_libraries_make_the_same_signature(
            seed in proptest::prelude::any::<[u8; 32]>(),
            message in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let signer = RecordSigner::from_seed(seed);
            proptest::prop_assert!(signer.fast.is_some(), "AWS-LC took the seed");
            let signature = signer.sign_bytes(&message);
            let dalek = SigningKey::from_bytes(&seed);
            proptest::prop_assert_eq!(signature, dalek.sign(&message).to_bytes());
            let parsed = ed25519_dalek::Signature::from_bytes(&signature);
            proptest::prop_assert!(dalek.verifying_key().verify_strict(&message, &parsed).is_ok());
        }
    }

    #[test]
    fn a_signature_known_valid_stays_valid_only_for_its_key_and_message() {
        // Signed elsewhere (not through `RecordSigner::sign`, which remembers what it signs).
        let elsewhere = SigningKey::from_bytes(&[9; 32]);
        let other = SigningKey::from_bytes(&[10; 32]);
        let root = [3u8; 32];
        let state = [4u8; 32];
        let message = signed_message("conv-m", 5, &root, Some(&state));
        let signature = elsewhere.sign(&message).to_bytes();
        let key = elsewhere.verifying_key();
        let id = key_id(&key);
        let trusted = TrustedKeys::new([key]);
        assert!(!crate::verified::is_known(&key, &message, &signature));
        for _ in 0..2 {
            assert_eq!(
                trusted.verify(&id, "conv-m", 5, &root, Some(&state), &signature),
                SignatureCheck::Valid
            );
            assert!(crate::verified::is_known(&key, &message, &signature));
        }
        // The known signature on anything else is checked in full, and fails.
        let mut flipped = signature;
        flipped[10] ^= 1;
        for (partition, leaves, state, signature) in [
            ("conv-m", 6, Some(&state), signature),
            ("conv-n", 5, Some(&state), signature),
            ("conv-m", 5, None, signature),
            ("conv-m", 5, Some(&root), signature),
            ("conv-m", 5, Some(&state), flipped),
        ] {
            assert_eq!(
                trusted.verify(&id, partition, leaves, &root, state, &signature),
                SignatureCheck::Invalid,
                "{partition} {leaves} {state:?}"
            );
        }
        // Known valid is not trusted: a verifier without the key refuses it.
        let others = TrustedKeys::new([other.verifying_key()]);
        assert_eq!(
            others.verify(&id, "conv-m", 5, &root, Some(&state), &signature),
            SignatureCheck::UnknownKey
        );
        let claimed = key_id(&other.verifying_key());
        assert_eq!(
            others.verify(&claimed, "conv-m", 5, &root, Some(&state), &signature),
            SignatureCheck::Invalid
        );
    }

    #[test]
    fn signs_and_verifies_and_tells_keys_apart() {
        let a = RecordSigner::from_seed([1; 32]);
        let b = RecordSigner::from_seed([2; 32]);
        let trusted = TrustedKeys::new([a.verifying_key()]);
        let root = [7u8; 32];
        let sig = a.sign("conv-x", 3, &root, None);
        assert_eq!(
            trusted.verify(a.key_id(), "conv-x", 3, &root, None, &sig),
            SignatureCheck::Valid
        );
        assert_eq!(
            trusted.verify(a.key_id(), "conv-y", 3, &root, None, &sig),
            SignatureCheck::Invalid
        );
        assert_eq!(
            trusted.verify(a.key_id(), "conv-x", 4, &root, None, &sig),
            SignatureCheck::Invalid
        );
        let forged = b.sign("conv-x", 3, &root, None);
        assert_eq!(
            trusted.verify(b.key_id(), "conv-x", 3, &root, None, &forged),
            SignatureCheck::UnknownKey
        );
        assert_eq!(
            trusted.verify(a.key_id(), "conv-x", 3, &root, None, &forged),
            SignatureCheck::Invalid
        );
        assert_eq!(
            trusted.verify(a.key_id(), "conv-x", 3, &root, None, b"short"),
            SignatureCheck::Invalid
        );
    }

    #[test]
    fn a_signature_over_a_state_binds_that_state() {
        let a = RecordSigner::from_seed([1; 32]);
        let trusted = TrustedKeys::new([a.verifying_key()]);
        let root = [7u8; 32];
        let state = turnpike_schemas::entry::RecordState {
            lane_through: 9,
            ..Default::default()
        };
        let forged = turnpike_schemas::entry::RecordState {
            lane_through: 90,
            ..Default::default()
        };
        let digest = state_digest(&state);
        let sig = a.sign("conv-x", 3, &root, Some(&digest));
        let check = |s: &turnpike_schemas::entry::RecordState| {
            trusted.verify(a.key_id(), "conv-x", 3, &root, Some(&state_digest(s)), &sig)
        };
        assert_eq!(check(&state), SignatureCheck::Valid);
        assert_eq!(check(&forged), SignatureCheck::Invalid);
        // A state-covering signature is not a valid stateless one (no downgrade).
        assert_eq!(
            trusted.verify(a.key_id(), "conv-x", 3, &root, None, &sig),
            SignatureCheck::Invalid
        );
    }

    #[test]
    fn key_files_round_trip_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/record.key");
        let created = RecordSigner::load_or_create(&path).unwrap();
        let loaded = RecordSigner::load_or_create(&path).unwrap();
        assert_eq!(created.key_id(), loaded.key_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, "not hex").unwrap();
        let err = RecordSigner::load(&path).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Key);
        assert!(err.to_string().contains("64 hex"), "{err}");
        assert!(RecordSigner::load(&dir.path().join("missing")).is_err());
    }
}
