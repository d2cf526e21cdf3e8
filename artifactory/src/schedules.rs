//! Schedules: what fires an addressed event into a lane with nobody typing (a cron expression
//! in a time zone, or a fixed interval), and the claims that make each firing happen once.
//!
//! # Contract
//! - A schedule belongs to the identity that made it, in its tenant, and fires as that
//!   identity; [`Schedules::get_owned`] of another identity (or tenant) is `NotFound`.
//! - A firing's identity is (schedule, fire time). [`Schedules::claim`] is create-only: of all
//!   the processes that try to claim the same firing, exactly one gets it; the others read the
//!   claim that won. A claim says what the firing does (its conversation and event id, or
//!   that it was skipped or missed and why) before anything is published, so whoever finds a
//!   claim can finish it the same way.
//! - A schedule's cursor is its latest claim: firings are claimed in fire-time order and never
//!   at or before the cursor. Only the newest claims are kept ([`KEPT_FIRINGS`]).
//! - Everything of a schedule sits under one prefix: deleting it deletes its claims.
//!
//! Layout: `schedules/{shard:02}/{schedule}/schedule.json`,
//! `schedules/{shard}/{schedule}/firings/{fire_ms:020}.json` (claims),
//! `schedules/{shard}/{schedule}/done/{fire_ms:020}` (claims seen through),
//! `schedules-deleted/{schedule}` (deleted ids, never written again), and an owner's index
//! `directory/schedules/{tenant}/{sha256(identity)}/{schedule}` (empty markers).

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{AgentId, AppId, ConversationId, EventId, Identity, ScheduleId, TenantId};

use crate::error::{Error, ErrorKind, Result};

/// How many shards schedules are spread over (each is owned by one process at a time).
pub const SHARDS: u32 = 16;

/// How many claims of a schedule are kept (the newest): its recent history.
pub const KEPT_FIRINGS: usize = 32;

/// The shortest interval a schedule may fire at.
pub const MIN_EVERY: Duration = Duration::from_secs(1);

/// The longest interval (and the longest jitter and grace) a schedule may have: a year.
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 24 * 3600);

/// The most schedules one identity may have.
pub const MAX_PER_OWNER: usize = 1_000;

/// The most firings a catch-up may fire at once (`missed = "all"`).
pub const MAX_CATCH_UP: u32 = 1_000;

/// The longest message a schedule may send, in bytes.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;

pub use turnpike_schemas::schedule::{Missed, Overlap, Target, Timing};

/// A schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub id: ScheduleId,
    pub tenant: TenantId,
    /// Who made it: its firings are this identity's messages.
    pub owner: Identity,
    pub app: AppId,
    pub agent: AgentId,
    pub timing: Timing,
    pub target: Target,
    /// The message each firing sends.
    pub text: String,
    pub missed: Missed,
    pub overlap: Overlap,
    /// Each firing is put off by up to this much (the same amount for the same firing in
    /// every process: a hash of the schedule and the fire time).
    pub jitter_ms: u64,
    /// A firing later than this is missed (and follows [`Missed`]).
    pub grace_ms: u64,
    pub paused: bool,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// What a claimed firing does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// A message `event` into `conversation`, published after `lane_after` (the lane's last
    /// sequence when it was claimed: where to look for it). With `stop`, a stop of the
    /// previous firing's turn in `stop` goes first.
    Fired {
        conversation: ConversationId,
        event: EventId,
        lane_after: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop: Option<ConversationId>,
        /// Earlier firings this one stands for that were missed.
        #[serde(default, skip_serializing_if = "is_zero")]
        missed: u64,
    },
    /// Not fired, on purpose (the previous turn still ran, and the policy says skip).
    Skipped { reason: String },
    /// Not fired: it came due while nothing could fire it, and the policy drops it. It stands
    /// for `count` firings up to its fire time.
    Missed { count: u64 },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One claimed firing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Firing {
    /// When it was due (before jitter), ms since the epoch.
    pub fire_ms: u64,
    /// When it was claimed.
    pub claimed_ms: u64,
    pub outcome: Outcome,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This caller's claim is the firing's.
    Won,
    /// Someone claimed it first: theirs.
    Lost(Firing),
}

impl Schedule {
    /// Checks what a caller may set: a known time zone, a cron expression that ever fires, an
    /// interval of at least [`MIN_EVERY`], a message within [`MAX_TEXT_BYTES`], a catch-up cap
    /// within [`MAX_CATCH_UP`].
    pub fn validate(&self) -> Result<()> {
        let invalid = |why: String| Err(Error::new(ErrorKind::InvalidInput, why));
        match &self.timing {
            Timing::Every { every_ms } if *every_ms < MIN_EVERY.as_millis() as u64 => {
                return invalid(format!(
                    "a schedule fires at most once a second (every_ms ≥ 1000, not {every_ms})"
                ));
            }
            Timing::Every { every_ms } if *every_ms > MAX_EVERY.as_millis() as u64 => {
                return invalid(format!(
                    "a schedule fires at least once a year (every_ms ≤ {}, not {every_ms})",
                    MAX_EVERY.as_millis()
                ));
            }
            Timing::Every { .. } => {}
            Timing::Cron { cron, zone } => {
                parse_cron(cron)?;
                parse_zone(zone)?;
            }
        }
        if self.text.trim().is_empty() {
            return invalid("a schedule's message is empty".into());
        }
        if self.text.len() > MAX_TEXT_BYTES {
            return invalid(format!(
                "a schedule's message is {} bytes, more than {MAX_TEXT_BYTES}",
                self.text.len()
            ));
        }
        if let Missed::All { cap } = self.missed {
            if cap == 0 || cap > MAX_CATCH_UP {
                return invalid(format!(
                    "missed = all takes a cap of 1–{MAX_CATCH_UP}, not {cap}"
                ));
            }
        }
        let year = MAX_EVERY.as_millis() as u64;
        if self.jitter_ms > year || self.grace_ms > year {
            return invalid("jitter and grace are at most a year".into());
        }
        if self.next_after(self.created_ms).is_none() {
            return invalid("the cron expression never fires".into());
        }
        Ok(())
    }

    /// The first fire time strictly after `after_ms` (before jitter); `None` when there is
    /// none (or the timing cannot be read: [`Self::validate`] refuses such a schedule).
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        match &self.timing {
            Timing::Every { every_ms } => {
                // Fire times are `created + k·every`, k ≥ 1.
                let every = (*every_ms).max(1);
                let start = self.created_ms;
                let k = after_ms.saturating_sub(start) / every + 1;
                k.checked_mul(every)?.checked_add(start)
            }
            Timing::Cron { cron, zone } => {
                let cron = parse_cron(cron).ok()?;
                let zone = parse_zone(zone).ok()?;
                let at = jiff::Timestamp::from_millisecond(after_ms as i64)
                    .ok()?
                    .to_zoned(zone);
                let next = cron.find_next_occurrence(&at, false).ok()?;
                u64::try_from(next.timestamp().as_millisecond()).ok()
            }
        }
    }

    /// The firing's jitter: the same in every process.
    pub fn jitter_of(&self, fire_ms: u64) -> u64 {
        if self.jitter_ms == 0 {
            return 0;
        }
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(format!("{}:{fire_ms}", self.id).as_bytes());
        let mut word = [0u8; 8];
        word.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(word) % (self.jitter_ms + 1)
    }

    /// The shard this schedule is fired from.
    pub fn shard(&self) -> u32 {
        shard_of(self.id)
    }
}

/// The shard of a schedule id.
pub fn shard_of(id: ScheduleId) -> u32 {
    (id.ulid().0 % u128::from(SHARDS)) as u32
}

fn parse_cron(text: &str) -> Result<croner::Cron> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(text)
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("cron expression {text:?}: {e}"),
            )
        })
}

fn parse_zone(zone: &str) -> Result<jiff::tz::TimeZone> {
    jiff::tz::TimeZone::get(zone).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("time zone {zone:?} is not known: {e}"),
        )
    })
}

/// The schedules in one object store.
#[derive(Debug, Clone)]
pub struct Schedules {
    store: Arc<dyn ObjectStore>,
}

fn schedule_dir(id: ScheduleId) -> Path {
    Path::from(format!("schedules/{:02}/{id}", shard_of(id)))
}

fn schedule_object(id: ScheduleId) -> Path {
    Path::from(format!("schedules/{:02}/{id}/schedule.json", shard_of(id)))
}

fn firings_dir(id: ScheduleId) -> Path {
    Path::from(format!("schedules/{:02}/{id}/firings", shard_of(id)))
}

fn firing_object(id: ScheduleId, fire_ms: u64) -> Path {
    Path::from(format!(
        "schedules/{:02}/{id}/firings/{fire_ms:020}.json",
        shard_of(id)
    ))
}

fn done_object(id: ScheduleId, fire_ms: u64) -> Path {
    Path::from(format!(
        "schedules/{:02}/{id}/done/{fire_ms:020}",
        shard_of(id)
    ))
}

/// The mark of a deleted schedule (beside the schedules, never under one: deleting a
/// schedule's objects leaves it).
fn deleted_marker(id: ScheduleId) -> Path {
    Path::from(format!("schedules-deleted/{id}"))
}

fn owned_dir(tenant: &TenantId, owner: &Identity) -> Path {
    Path::from(format!(
        "directory/schedules/{tenant}/{}",
        crate::layout::identity_key(owner)
    ))
}

fn owned_marker(tenant: &TenantId, owner: &Identity, id: ScheduleId) -> Path {
    Path::from(format!(
        "directory/schedules/{tenant}/{}/{id}",
        crate::layout::identity_key(owner)
    ))
}

impl Schedules {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Writes `schedule` (a new one, or a change: pause, resume, edit), after
    /// [`Schedule::validate`].
    pub async fn put(&self, schedule: &Schedule) -> Result<()> {
        schedule.validate()?;
        let bytes = serde_json::to_vec(schedule).expect("schedules serialise");
        self.store
            .put(&schedule_object(schedule.id), PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store(&format!("writing {}", schedule.id), e))?;
        self.store
            .put(
                &owned_marker(&schedule.tenant, &schedule.owner, schedule.id),
                PutPayload::from_static(b""),
            )
            .await
            .map_err(|e| Error::store(&format!("listing {} under its owner", schedule.id), e))?;
        // A write racing a deletion (a pause as the owner deletes it) must not bring it back:
        // the deletion marks the id first, so either this sees the mark and takes its write
        // back, or the deletion comes after the write and removes it.
        match self.store.head(&deleted_marker(schedule.id)).await {
            Ok(_) => {
                for path in [
                    schedule_object(schedule.id),
                    owned_marker(&schedule.tenant, &schedule.owner, schedule.id),
                ] {
                    match self.store.delete(&path).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(Error::store("taking back a write", e)),
                    }
                }
                Err(Error::new(
                    ErrorKind::NotFound,
                    format!("schedule {} was deleted", schedule.id),
                ))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store("looking for a deletion mark", e)),
        }
    }

    /// A schedule, whoever owns it (the scheduler's view).
    pub async fn get(&self, id: ScheduleId) -> Result<Schedule> {
        let what = format!("schedule {id}");
        let bytes = self
            .store
            .get(&schedule_object(id))
            .await
            .map_err(|e| Error::store(&what, e))?
            .bytes()
            .await
            .map_err(|e| Error::store(&what, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("{what} is unreadable"), e))
    }

    /// A schedule of `owner` in `tenant`; anyone else's is `NotFound`.
    pub async fn get_owned(
        &self,
        id: ScheduleId,
        tenant: &TenantId,
        owner: &Identity,
    ) -> Result<Schedule> {
        let schedule = self.get(id).await?;
        if &schedule.tenant != tenant || &schedule.owner != owner {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("schedule {id} not found"),
            ));
        }
        Ok(schedule)
    }

    /// The ids of `owner`'s schedules in `tenant`, oldest first.
    pub async fn owned(&self, tenant: &TenantId, owner: &Identity) -> Result<Vec<ScheduleId>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&owned_dir(tenant, owner)))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing schedules", e))?;
        let mut ids: Vec<ScheduleId> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Every schedule of a shard (one unreadable object is skipped, and said so).
    pub async fn in_shard(&self, shard: u32) -> Result<Vec<Schedule>> {
        let prefix = Path::from(format!("schedules/{shard:02}"));
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing a shard's schedules", e))?;
        let mut out = Vec::new();
        for meta in metas {
            if meta.location.filename() != Some("schedule.json") {
                continue;
            }
            let id = crate::layout::segments(&meta.location)
                .get(2)
                .and_then(|s| s.parse::<ScheduleId>().ok());
            let Some(id) = id else { continue };
            match self.get(id).await {
                Ok(schedule) => out.push(schedule),
                // Deleted between the listing and the read.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(schedule = %id, error = %e, "a schedule cannot be read; it does not fire")
                }
            }
        }
        out.sort_by_key(|s| s.id);
        Ok(out)
    }

    /// Deletes a schedule, its claims and its owner's marker. Firing stops at the next
    /// listing of its shard (a firing claimed before finishes).
    pub async fn delete(&self, schedule: &Schedule) -> Result<()> {
        // The mark first: a write racing this deletion takes itself back (see `put`).
        self.store
            .put(&deleted_marker(schedule.id), PutPayload::from_static(b""))
            .await
            .map_err(|e| Error::store("marking a schedule deleted", e))?;
        // Then the definition: a scheduler that sees no schedule fires nothing more.
        match self.store.delete(&schedule_object(schedule.id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store(&format!("deleting {}", schedule.id), e)),
        }
        let metas: Vec<_> = self
            .store
            .list(Some(&schedule_dir(schedule.id)))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing a schedule's claims", e))?;
        for meta in metas {
            match self.store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store("deleting a schedule's claim", e)),
            }
        }
        match self
            .store
            .delete(&owned_marker(
                &schedule.tenant,
                &schedule.owner,
                schedule.id,
            ))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store("deleting a schedule's marker", e)),
        }
    }

    /// Claims firing `firing.fire_ms` of schedule `id`, create-only (see the contract).
    pub async fn claim(&self, id: ScheduleId, firing: &Firing) -> Result<Claim> {
        let path = firing_object(id, firing.fire_ms);
        let bytes = serde_json::to_vec(firing).expect("firings serialise");
        match self
            .store
            .put_opts(
                &path,
                PutPayload::from(bytes),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_) => Ok(Claim::Won),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                Ok(Claim::Lost(self.firing(id, firing.fire_ms).await?))
            }
            Err(e) => Err(Error::store(
                &format!("claiming firing {} of {id}", firing.fire_ms),
                e,
            )),
        }
    }

    /// Notes that firing `fire_ms` was seen through (its message published, or refused for
    /// good): whoever finds its claim later does nothing more with it (idempotent).
    pub async fn mark_done(&self, id: ScheduleId, fire_ms: u64) -> Result<()> {
        match self
            .store
            .put_opts(
                &done_object(id, fire_ms),
                PutPayload::from_static(b""),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_)
            | Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(()),
            Err(e) => Err(Error::store("noting a firing done", e)),
        }
    }

    /// Whether firing `fire_ms` was seen through ([`Self::mark_done`]).
    pub async fn is_done(&self, id: ScheduleId, fire_ms: u64) -> Result<bool> {
        match self.store.head(&done_object(id, fire_ms)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Error::store("reading a firing's mark", e)),
        }
    }

    /// One claimed firing.
    pub async fn firing(&self, id: ScheduleId, fire_ms: u64) -> Result<Firing> {
        let what = format!("firing {fire_ms} of {id}");
        let bytes = self
            .store
            .get(&firing_object(id, fire_ms))
            .await
            .map_err(|e| Error::store(&what, e))?
            .bytes()
            .await
            .map_err(|e| Error::store(&what, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("{what} is unreadable"), e))
    }

    /// The fire times claimed (the kept ones), oldest first.
    pub async fn fire_times(&self, id: ScheduleId) -> Result<Vec<u64>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&firings_dir(id)))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing a schedule's firings", e))?;
        let mut times: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        times.sort_unstable();
        Ok(times)
    }

    /// The newest `limit` claimed firings, newest first.
    pub async fn recent(&self, id: ScheduleId, limit: usize) -> Result<Vec<Firing>> {
        let times = self.fire_times(id).await?;
        let mut out = Vec::new();
        for fire_ms in times.into_iter().rev().take(limit) {
            match self.firing(id, fire_ms).await {
                Ok(f) => out.push(f),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Deletes all but the newest [`KEPT_FIRINGS`] claims.
    pub async fn prune(&self, id: ScheduleId) -> Result<()> {
        let times = self.fire_times(id).await?;
        if times.len() <= KEPT_FIRINGS {
            return Ok(());
        }
        for fire_ms in &times[..times.len() - KEPT_FIRINGS] {
            // The mark first: a claim without its mark is finished again, never the reverse.
            for path in [done_object(id, *fire_ms), firing_object(id, *fire_ms)] {
                match self.store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(Error::store("pruning a schedule's firings", e)),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(timing: Timing) -> Schedule {
        Schedule {
            id: ScheduleId::new(),
            tenant: "acme".parse().unwrap(),
            owner: "u:alice".parse::<Identity>().unwrap(),
            app: "demo".parse().unwrap(),
            agent: "echo".parse().unwrap(),
            timing,
            target: Target::New,
            text: "report".into(),
            missed: Missed::Latest,
            overlap: Overlap::Queue,
            jitter_ms: 0,
            grace_ms: 60_000,
            paused: false,
            created_ms: 1_000_000,
            updated_ms: 1_000_000,
        }
    }

    #[test]
    fn intervals_count_from_creation_and_cron_reads_its_zone() {
        let every = schedule(Timing::Every { every_ms: 1_000 });
        assert_eq!(every.next_after(0), Some(1_001_000));
        assert_eq!(every.next_after(1_000_000), Some(1_001_000));
        assert_eq!(every.next_after(1_001_000), Some(1_002_000));
        assert_eq!(every.next_after(1_000_999), Some(1_001_000));
        // 2026-03-29 is the day Berlin moves to summer time: 09:00 there is 07:00 UTC.
        let cron = schedule(Timing::Cron {
            cron: "0 9 * * *".into(),
            zone: "Europe/Berlin".into(),
        });
        let march_29 = 1_774_742_400_000; // 2026-03-29T00:00:00Z
        assert_eq!(cron.next_after(march_29), Some(march_29 + 7 * 3_600_000));
        let seconds = schedule(Timing::Cron {
            cron: "*/5 * * * * *".into(),
            zone: "UTC".into(),
        });
        assert_eq!(seconds.next_after(march_29), Some(march_29 + 5_000));
    }

    #[test]
    fn bad_timings_and_texts_are_refused() {
        for timing in [
            Timing::Every { every_ms: 999 },
            Timing::Cron {
                cron: "61 * * * *".into(),
                zone: "UTC".into(),
            },
            Timing::Cron {
                cron: "0 9 * * *".into(),
                zone: "Mars/Olympus".into(),
            },
            Timing::Cron {
                cron: "0 0 30 2 *".into(),
                zone: "UTC".into(),
            },
        ] {
            let s = schedule(timing.clone());
            let e = s.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{timing:?}");
        }
        let mut s = schedule(Timing::Every { every_ms: 1_000 });
        s.text = " ".into();
        assert!(s.validate().is_err());
        s.text = "x".repeat(MAX_TEXT_BYTES + 1);
        assert!(s.validate().is_err());
        s.text = "ok".into();
        s.missed = Missed::All { cap: 0 };
        assert!(s.validate().is_err());
    }

    #[test]
    fn jitter_is_bounded_and_the_same_everywhere() {
        let mut s = schedule(Timing::Every { every_ms: 1_000 });
        assert_eq!(s.jitter_of(5), 0);
        s.jitter_ms = 250;
        let all: Vec<u64> = (0..200).map(|i| s.jitter_of(i * 1_000)).collect();
        assert!(all.iter().all(|j| *j <= 250));
        assert!(all.iter().any(|j| *j != all[0]), "jitter varies per firing");
        assert_eq!(s.jitter_of(7_000), s.jitter_of(7_000));
    }

    #[tokio::test]
    async fn one_claim_per_firing_and_only_the_owner_sees_a_schedule() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let schedules = Schedules::new(store);
        let s = schedule(Timing::Every { every_ms: 1_000 });
        schedules.put(&s).await.unwrap();
        assert_eq!(
            schedules.owned(&s.tenant, &s.owner).await.unwrap(),
            vec![s.id]
        );
        let bob = "u:bob".parse::<Identity>().unwrap();
        assert!(schedules.owned(&s.tenant, &bob).await.unwrap().is_empty());
        assert_eq!(
            schedules
                .get_owned(s.id, &s.tenant, &bob)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
        let other: TenantId = "globex".parse().unwrap();
        assert!(schedules.get_owned(s.id, &other, &s.owner).await.is_err());
        assert_eq!(
            schedules.in_shard(s.shard()).await.unwrap(),
            vec![s.clone()]
        );

        let mine = Firing {
            fire_ms: 1_001_000,
            claimed_ms: 1,
            outcome: Outcome::Skipped {
                reason: "first".into(),
            },
        };
        let theirs = Firing {
            claimed_ms: 2,
            outcome: Outcome::Missed { count: 1 },
            ..mine.clone()
        };
        assert_eq!(schedules.claim(s.id, &mine).await.unwrap(), Claim::Won);
        assert_eq!(
            schedules.claim(s.id, &theirs).await.unwrap(),
            Claim::Lost(mine.clone())
        );
        for i in 2..(KEPT_FIRINGS as u64 + 5) {
            let f = Firing {
                fire_ms: 1_000_000 + i * 1_000,
                ..theirs.clone()
            };
            schedules.claim(s.id, &f).await.unwrap();
        }
        schedules.prune(s.id).await.unwrap();
        let times = schedules.fire_times(s.id).await.unwrap();
        assert_eq!(times.len(), KEPT_FIRINGS);
        assert_eq!(
            *times.last().unwrap(),
            1_000_000 + (KEPT_FIRINGS as u64 + 4) * 1_000
        );
        assert_eq!(
            schedules.recent(s.id, 2).await.unwrap()[0].fire_ms,
            *times.last().unwrap()
        );

        schedules.delete(&s).await.unwrap();
        assert!(schedules
            .owned(&s.tenant, &s.owner)
            .await
            .unwrap()
            .is_empty());
        assert!(schedules.in_shard(s.shard()).await.unwrap().is_empty());
        assert!(schedules.fire_times(s.id).await.unwrap().is_empty());
        // A pause that read it before the deletion and writes after it does not bring it back.
        let mut paused = s.clone();
        paused.paused = true;
        assert_eq!(
            schedules.put(&paused).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            schedules.get(s.id).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert!(schedules
            .owned(&s.tenant, &s.owner)
            .await
            .unwrap()
            .is_empty());
    }
}
