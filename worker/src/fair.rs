//! Fair share of a worker's turn slots between tenants (DESIGN step 2, invariant 13).
//!
//! A worker takes wakes off the bus as they come — not only when a slot is free — into a
//! [`FairQueue`]: one short queue per tenant. A free slot goes to the tenant with the fewest
//! running turns for its weight (weighted max-min: a tenant with nothing running comes first),
//! never to a tenant at its cap; within a tenant, first come, first served. So the worker sees
//! past a burst: the wakes of a tenant whose queue here is full are put off (nak'd) at once,
//! spaced by the pool's start interval, which lets the wakes of every other tenant behind the
//! burst reach the worker within a moment of being published. A lone worker puts a wake off
//! for at least what its own queue needs; in a fleet the spacing starts from the tenant's last
//! put-off wake only, since a put-off wake comes back to any worker, and one held back behind
//! this worker's own queue waited whole turns while other workers freed slots (`bench
//! fleet`'s tail over first come, first served).
//!
//! # Contract
//! - A tenant's wakes wait here in the order they arrived on the bus; at most `per_tenant` of
//!   them, the earliest seen (but a waiting wake that others ride with keeps its place: an
//!   earlier arrival of another lane is put off instead). The rest are put off, each one an
//!   estimated start interval after the one before it (a put-off wake comes back about when
//!   its turn would come, and takes its place again before any later arrival), capped at
//!   [`MAX_DEFER`]. A wake of a lane (conversation) whose earlier wake waits here or was put
//!   off takes no place in that spacing: it comes back a hold time after that one is due to
//!   start, since the start that drains a lane most often takes its later events too. A wake
//!   of a lane whose earlier wake waits *here* is not put off at all: it rides with that one
//!   (up to `FOLLOWERS_PER_ITEM` per wake, and no more riders in all than the queue's bound
//!   on waiting wakes), takes no place, and leaves with it — to its start, or back to the
//!   bus — so a lane's burst of events costs the bus no deferrals. Nothing is dropped: a wake is
//!   queued, rides with a queued one, or is given back to the bus with a delay.
//! - [`FairQueue::next`] never returns a wake of a tenant whose running turns have reached its
//!   cap, and otherwise returns a wake of the tenant with the least `(running + 1) / weight`
//!   (ties: the one whose first wake arrived first).
//! - Pure: no clock, no I/O; the caller passes `now` and the running counts.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use turnpike_schemas::TenantId;

/// The longest a wake is put off for fairness at once (it is put off again if its tenant's
/// queue is still full when it comes back).
pub const MAX_DEFER: Duration = Duration::from_secs(30);

/// How a deployment shares turn slots between tenants: weights (a tenant of weight 2 gets
/// twice the slots of a tenant of weight 1 when both have work waiting) and caps on a tenant's
/// running turns per worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairShare {
    weights: HashMap<TenantId, u32>,
    default_weight: u32,
    caps: HashMap<TenantId, usize>,
    default_cap: Option<usize>,
}

impl Default for FairShare {
    fn default() -> Self {
        Self {
            weights: HashMap::new(),
            default_weight: 1,
            caps: HashMap::new(),
            default_cap: None,
        }
    }
}

impl FairShare {
    /// Reads `TENANT=N` settings (`*=N`: every tenant not named). Weights are at least 1;
    /// a cap of 0 is refused (a tenant that may run nothing is a deleted tenant, not a cap).
    pub fn parse(weights: &[String], caps: &[String]) -> Result<Self, String> {
        let mut share = FairShare::default();
        for (tenant, weight) in pairs(weights, "--tenant-weight")? {
            if weight == 0 || weight > 1_000 {
                let tenant = tenant.as_ref().map_or("*", |t| t.as_str());
                return Err(format!(
                    "--tenant-weight {tenant}={weight}: a weight is 1 to 1000"
                ));
            }
            let weight = weight as u32;
            match tenant {
                None => share.default_weight = weight,
                Some(t) => {
                    share.weights.insert(t, weight);
                }
            }
        }
        for (tenant, cap) in pairs(caps, "--tenant-cap")? {
            if cap == 0 {
                return Err("--tenant-cap: a cap is at least 1 running turn".into());
            }
            match tenant {
                None => share.default_cap = Some(cap),
                Some(t) => {
                    share.caps.insert(t, cap);
                }
            }
        }
        Ok(share)
    }

    /// The tenant's weight (1 unless set).
    pub fn weight(&self, tenant: &TenantId) -> u32 {
        self.weights
            .get(tenant)
            .copied()
            .unwrap_or(self.default_weight)
    }

    /// How many of the tenant's turns a worker runs at once at most (`None`: no cap).
    pub fn cap(&self, tenant: &TenantId) -> Option<usize> {
        self.caps.get(tenant).copied().or(self.default_cap)
    }
}

/// `TENANT=N` pairs; `None` for `*`.
fn pairs(items: &[String], flag: &str) -> Result<Vec<(Option<TenantId>, usize)>, String> {
    items
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let (tenant, n) = item
                .split_once('=')
                .ok_or_else(|| format!("{flag} {item:?}: expected TENANT=N (or *=N)"))?;
            let n: usize = n
                .trim()
                .parse()
                .map_err(|_| format!("{flag} {item:?}: {n:?} is not a number"))?;
            let tenant = match tenant.trim() {
                "*" => None,
                t => Some(
                    t.parse::<TenantId>()
                        .map_err(|e| format!("{flag} {item:?}: {e}"))?,
                ),
            };
            Ok((tenant, n))
        })
        .collect()
}

/// What became of an item offered to the queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit<T> {
    /// It waits here for a slot.
    Queued,
    /// An earlier item of its lane waits here: it rides with that one, taking no place of its
    /// own, and leaves with it ([`FairQueue::next`], [`FairQueue::take_older`],
    /// [`FairQueue::drain`]).
    Follows,
    /// Its tenant's queue is full: give it back to the bus for this long.
    Defer(T, Duration),
}

/// An item waiting here for a slot, with the later items of its lane that ride with it.
struct Waiting<T> {
    /// When it was taken here.
    since: Instant,
    /// When it arrived on the bus (its place in its tenant's order).
    arrived: u64,
    lane: Option<u64>,
    item: T,
    /// Later items of its lane that came while it waited: the start that drains the lane
    /// takes their events too, so they take no place and are not put off (see
    /// [`Admit::Follows`]); they leave with it.
    followers: Vec<T>,
}

impl<T> Waiting<T> {
    /// The item and its followers.
    fn all(self) -> impl Iterator<Item = T> {
        std::iter::once(self.item).chain(self.followers)
    }
}

struct Tenant<T> {
    /// In order of arrival.
    waiting: VecDeque<Waiting<T>>,
    /// When the last item put off for this tenant is due back.
    due: Option<Instant>,
    /// Lanes with an item waiting here or put off: when that item is due to start, and when it
    /// arrived on the bus. A later item of the same lane most often needs no start of its own
    /// (the start that drains the lane takes its event too), so it is put off to just after
    /// that one instead of taking a place in the tenant's spacing. Entries older than a hold
    /// time are stale.
    lanes: HashMap<u64, (Instant, u64)>,
}

/// How many lanes a tenant's entry remembers before stale ones are forgotten.
const LANES_KEPT: usize = 65_536;

/// Notes that an item of `lane` that arrived at `arrived` waits here from `now`, unless an
/// earlier item of the lane still holds a place (one that is not stale).
fn note_lane(
    lanes: &mut HashMap<u64, (Instant, u64)>,
    lane: u64,
    now: Instant,
    arrived: u64,
    hold: Duration,
) {
    let held = lanes
        .get(&lane)
        .is_some_and(|(due, first)| *due + hold > now && *first <= arrived);
    if !held {
        lanes.insert(lane, (now, arrived));
    }
}

/// How many later items of its lane ride with a waiting item at most.
const FOLLOWERS_PER_ITEM: usize = 64;

/// Per-tenant queues of wakes waiting for a slot. See the module docs.
pub struct FairQueue<T> {
    tenants: HashMap<TenantId, Tenant<T>>,
    per_tenant: usize,
    /// Past this many waiting in all, everything is put off (and past this many followers,
    /// no more ride along).
    total: usize,
    len: usize,
    /// Items riding with a waiting item (not counted in `len`).
    followers: usize,
    /// How long a slot is held per start, on average (an estimate updated by `finished`).
    hold: Duration,
    slots: usize,
    /// The time between two starts while items kept waiting (the rate this worker really
    /// starts at when busy, which CPU may hold below `slots / hold`), on average.
    gap: Option<Duration>,
    /// The last start that left items waiting.
    busy_since: Option<Instant>,
}

/// How many tenants' full queues a worker keeps at once.
const TENANTS_AT_ONCE: usize = 64;

impl<T> FairQueue<T> {
    /// A queue for a worker with `slots` slots, keeping up to `per_tenant` waiting per tenant;
    /// `hold` is the first estimate of how long a start holds its slot.
    pub fn new(slots: usize, per_tenant: usize, hold: Duration) -> Self {
        let per_tenant = per_tenant.max(1);
        Self {
            tenants: HashMap::new(),
            per_tenant,
            total: per_tenant * TENANTS_AT_ONCE,
            len: 0,
            followers: 0,
            hold: hold.max(Duration::from_millis(1)),
            slots: slots.max(1),
            gap: None,
            busy_since: None,
        }
    }

    /// Items waiting, besides those riding with them ([`FairQueue::followers`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Items riding with a waiting item of their lane.
    pub fn followers(&self) -> usize {
        self.followers
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether another item could be queued for some tenant.
    pub fn has_room(&self) -> bool {
        self.len < self.total
    }

    /// How many of a tenant's items wait here at most from now on (at least 1, at most the
    /// queue's bound on all waiting items). Items waiting already stay.
    pub fn set_per_tenant(&mut self, per_tenant: usize) {
        self.per_tenant = per_tenant.clamp(1, self.total);
    }

    /// Offers `item` of `tenant`, which arrived on the bus at `arrived` (ms; its place in the
    /// tenant's order, kept however often it was put off). A tenant's queue holds its
    /// `per_tenant` earliest arrivals seen: a later one is put off, or, when an earlier one
    /// comes (back), the latest waiting is put off in its stead. `workers` is how many workers
    /// share the tenant's backlog (put-off items come back to any of them); `cap`, the
    /// tenant's cap on running turns here.
    pub fn admit(
        &mut self,
        tenant: &TenantId,
        item: T,
        arrived: u64,
        now: Instant,
        workers: usize,
        cap: Option<usize>,
    ) -> Admit<T> {
        self.admit_in(tenant, None, item, arrived, now, workers, cap)
    }

    /// [`FairQueue::admit`] for an item of `lane` (a conversation, hashed), when known: an item
    /// put off while an earlier one of its lane waits here or is put off comes back just after
    /// that one is due to start (most often, the start that drains the lane takes its event
    /// too) instead of taking a place of its own in the tenant's spacing.
    #[allow(clippy::too_many_arguments)]
    pub fn admit_in(
        &mut self,
        tenant: &TenantId,
        lane: Option<u64>,
        item: T,
        arrived: u64,
        now: Instant,
        workers: usize,
        cap: Option<usize>,
    ) -> Admit<T> {
        let per_tenant = self.per_tenant;
        let full = self.len >= self.total;
        let hold = self.hold;
        // The time between two of a tenant's starts if it had the whole pool (or as much of it
        // as its cap allows): a put-off item that comes back early is put off again (a nak);
        // one that comes back late would leave slots idle. So the estimate leans early.
        let slots = cap.map_or(self.slots, |cap| cap.clamp(1, self.slots));
        let workers = workers.max(1) as u32;
        let interval =
            (hold / (slots as u32 * workers)).max(self.gap.unwrap_or_default() / workers);
        let entry = self
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| Tenant {
                waiting: VecDeque::new(),
                due: None,
                lanes: HashMap::new(),
            });
        if entry.lanes.len() >= LANES_KEPT {
            entry.lanes.retain(|_, (due, _)| *due + hold > now);
        }
        // An earlier item of its lane waits here: it rides with that one.
        if let Some(l) = lane.filter(|_| self.followers < self.total) {
            if let Some(leader) = entry.waiting.iter_mut().find(|w| {
                w.lane == Some(l) && w.arrived <= arrived && w.followers.len() < FOLLOWERS_PER_ITEM
            }) {
                leader.followers.push(item);
                self.followers += 1;
                return Admit::Follows;
            }
        }
        let at = entry.waiting.partition_point(|w| w.arrived <= arrived);
        let waiting = |item| Waiting {
            since: now,
            arrived,
            lane,
            item,
            followers: Vec::new(),
        };
        // The latest waiting gives its place to an earlier arrival unless others ride with it.
        let displace = at < entry.waiting.len()
            && entry.waiting.back().is_some_and(|w| w.followers.is_empty());
        let (lane, arrived, item) = if entry.waiting.len() < per_tenant && !full {
            entry.waiting.insert(at, waiting(item));
            if let Some(lane) = lane {
                note_lane(&mut entry.lanes, lane, now, arrived, hold);
            }
            self.len += 1;
            return Admit::Queued;
        } else if displace {
            // Earlier than the latest waiting: that one is put off instead.
            entry.waiting.insert(at, waiting(item));
            if let Some(lane) = lane {
                note_lane(&mut entry.lanes, lane, now, arrived, hold);
            }
            let Waiting {
                arrived: latest_arrived,
                lane: latest_lane,
                item: latest,
                ..
            } = entry.waiting.pop_back().expect("not empty");
            // It no longer waits here: the place it held for its lane goes with it.
            if let Some(l) = latest_lane {
                let held = entry
                    .lanes
                    .get(&l)
                    .is_some_and(|(_, first)| *first == latest_arrived);
                if held && !entry.waiting.iter().any(|w| w.lane == Some(l)) {
                    entry.lanes.remove(&l);
                }
            }
            (latest_lane, latest_arrived, latest)
        } else {
            (lane, arrived, item)
        };
        // An earlier item of its lane is due to start: just after that one.
        let leader = lane
            .and_then(|l| entry.lanes.get(&l))
            .filter(|(due, first)| *due + hold > now && *first < arrived);
        if let Some((due, _)) = leader {
            let delay = (due.saturating_duration_since(now) + hold).min(MAX_DEFER);
            return Admit::Defer(item, delay);
        }
        // One start of the pool after the item put off before this one. A lone worker gets
        // it back itself, so it also waits for what waits here (back sooner, it finds the same
        // queue, cannot displace an earlier arrival, and goes to the end of the line). In a
        // fleet it may come back to any worker, and what waits at this one is no measure of
        // when a slot is free for it: counting it held wakes whole turns behind the other
        // workers' free slots.
        let ahead = if workers == 1 {
            interval * entry.waiting.len() as u32
        } else {
            Duration::ZERO
        };
        let after_last = entry
            .due
            .map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        let delay = (ahead.max(after_last) + interval).min(MAX_DEFER);
        if delay < MAX_DEFER {
            entry.due = Some(now + delay);
        }
        if let Some(lane) = lane {
            entry.lanes.insert(lane, (now + delay, arrived));
        }
        Admit::Defer(item, delay)
    }

    /// Whether [`FairQueue::next`] would return something now.
    pub fn has_eligible(&self, running: impl Fn(&TenantId) -> usize, share: &FairShare) -> bool {
        self.has_eligible_besides(None, running, share)
    }

    /// Whether [`FairQueue::next`] would return something now of a tenant other than
    /// `besides` (any tenant: `None`).
    pub fn has_eligible_besides(
        &self,
        besides: Option<&TenantId>,
        running: impl Fn(&TenantId) -> usize,
        share: &FairShare,
    ) -> bool {
        self.tenants.iter().any(|(tenant, t)| {
            Some(tenant) != besides
                && !t.waiting.is_empty()
                && share.cap(tenant).is_none_or(|cap| running(tenant) < cap)
        })
    }

    /// The next item to start, with the later items of its lane that ride with it: see the
    /// module docs.
    pub fn next(
        &mut self,
        running: impl Fn(&TenantId) -> usize,
        share: &FairShare,
    ) -> Option<(TenantId, T, Vec<T>)> {
        let mut best: Option<(&TenantId, f64, u64)> = None;
        for (tenant, t) in &self.tenants {
            let Some(Waiting { arrived: since, .. }) = t.waiting.front() else {
                continue;
            };
            let n = running(tenant);
            if share.cap(tenant).is_some_and(|cap| n >= cap) {
                continue;
            }
            let load = (n as f64 + 1.0) / f64::from(share.weight(tenant));
            let better = match best {
                None => true,
                Some((_, l, s)) => load < l || (load == l && *since < s),
            };
            if better {
                best = Some((tenant, load, *since));
            }
        }
        let tenant = best?.0.clone();
        let t = self.tenants.get_mut(&tenant)?;
        let Waiting {
            item, followers, ..
        } = t.waiting.pop_front()?;
        self.len -= 1;
        self.followers -= followers.len();
        Some((tenant, item, followers))
    }

    /// An item taken by [`FairQueue::next`] started at `now`: while items keep waiting, the
    /// time between starts is the rate put-off items are spaced by.
    pub fn started(&mut self, now: Instant) {
        if let Some(since) = self.busy_since {
            let gap = now.saturating_duration_since(since);
            self.gap = Some(self.gap.map_or(gap, |g| (g * 7 + gap) / 8));
        }
        self.busy_since = (self.len > 0).then_some(now);
    }

    /// How long a start holds its slot, as estimated now.
    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// A start held its slot for `held`: the estimate of hold times follows.
    pub fn finished(&mut self, held: Duration) {
        self.hold = (self.hold * 7 + held) / 8;
        self.hold = self.hold.max(Duration::from_millis(1));
    }

    /// Forgets tenants with nothing waiting and nothing due back (bounded memory).
    pub fn forget_idle(&mut self, now: Instant) {
        let hold = self.hold;
        for t in self.tenants.values_mut() {
            t.lanes.retain(|_, (due, _)| *due + hold > now);
        }
        self.tenants.retain(|_, t| {
            !t.waiting.is_empty() || t.due.is_some_and(|d| d > now) || !t.lanes.is_empty()
        });
    }

    /// Takes every item that has waited longer than `older`, with the items riding with it:
    /// a worker gives them back to the bus rather than keep them from a worker with room.
    pub fn take_older(&mut self, now: Instant, older: Duration) -> Vec<T> {
        let mut out = Vec::new();
        for t in self.tenants.values_mut() {
            let (old, young): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut t.waiting)
                .into_iter()
                .partition(|w| now.saturating_duration_since(w.since) > older);
            t.waiting = young;
            for w in old {
                self.len -= 1;
                self.followers -= w.followers.len();
                out.extend(w.all());
            }
        }
        if self.len == 0 {
            self.busy_since = None;
        }
        out
    }

    /// Calls `keep` on every item that has waited here longer than `older` (and on each that
    /// rides with one), and counts their wait from `now` again: they stay, in their places.
    pub fn keep_older(&mut self, now: Instant, older: Duration, mut keep: impl FnMut(&T)) {
        for t in self.tenants.values_mut() {
            for w in t.waiting.iter_mut() {
                if now.saturating_duration_since(w.since) > older {
                    w.since = now;
                    keep(&w.item);
                    w.followers.iter().for_each(&mut keep);
                }
            }
        }
    }

    /// Takes every waiting item and every item riding with one (a stopping worker gives
    /// them back).
    pub fn drain(&mut self) -> Vec<T> {
        self.len = 0;
        self.followers = 0;
        self.busy_since = None;
        self.tenants
            .drain()
            .flat_map(|(_, t)| t.waiting.into_iter().flat_map(Waiting::all))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tenant(name: &str) -> TenantId {
        name.parse().unwrap()
    }

    #[test]
    fn a_later_item_of_a_lane_already_due_comes_back_after_it_without_taking_a_place() {
        // One slot held 100 ms: the tenant's put-off items are spaced 100 ms apart. A lane
        // with ten events has ten wakes, but the start that drains it takes them all: the
        // nine after the first must not push every other lane's wake nine places back.
        let a = tenant("a");
        let now = Instant::now();
        let hold = Duration::from_millis(100);
        let mut q = FairQueue::new(1, 1, hold);
        let mut offer = |lane: u64, item: u32, arrived: u64| {
            q.admit_in(&a, Some(lane), item, arrived, now, 1, None)
        };
        assert_eq!(offer(1, 10, 10), Admit::Queued);
        // Lane 1's second event: it rides with the first, which waits here.
        assert_eq!(offer(1, 11, 11), Admit::Follows);
        // Lane 2 takes the next place: after what waits (one), plus one (a lone worker gets
        // it back itself).
        let Admit::Defer(20, two) = offer(2, 20, 20) else {
            panic!("a full queue puts off");
        };
        assert_eq!(two, 2 * hold);
        // Lane 2's second event follows lane 2's first; lane 1's third, lane 1's first.
        assert_eq!(offer(2, 21, 21), Admit::Defer(21, 3 * hold));
        assert_eq!(offer(1, 12, 12), Admit::Follows);
        // Lane 3 comes right after lane 2, as if the followers had not been there.
        assert_eq!(offer(3, 30, 30), Admit::Defer(30, 3 * hold));
        // Lane 2's first wake, back and still without room, is put off as the lane's first
        // (after lane 3), not as a follower of itself.
        assert_eq!(offer(2, 20, 20), Admit::Defer(20, 4 * hold));
        // Lane 1's first starts with the two that rode with it.
        assert_eq!(
            q.next(|_| 0, &FairShare::default()),
            Some((a.clone(), 10, vec![11, 12]))
        );
        assert_eq!((q.len(), q.followers()), (0, 0));
    }

    #[test]
    fn a_lone_worker_puts_off_behind_its_queue_and_a_fleet_from_the_last_put_off() {
        // 2 slots held 100 ms; the tenant's queue here holds 2. A lone worker gets its put-off
        // items back itself: the first waits for the two queued here (50 ms apart), then one
        // more. In a fleet of two, a put-off item may come back to the other worker, whose
        // slots may be free: it is spaced from the last put-off only, one start of the whole
        // pool (25 ms) apart — counting this worker's queue held it whole turns too long.
        let a = tenant("a");
        let now = Instant::now();
        let hold = Duration::from_millis(100);
        for (workers, first, second) in [
            (1, Duration::from_millis(150), Duration::from_millis(200)),
            (2, Duration::from_millis(25), Duration::from_millis(50)),
        ] {
            let mut q = FairQueue::new(2, 2, hold);
            let mut offer = |item: u32| {
                q.admit_in(
                    &a,
                    Some(u64::from(item)),
                    item,
                    u64::from(item),
                    now,
                    workers,
                    None,
                )
            };
            assert_eq!(offer(1), Admit::Queued);
            assert_eq!(offer(2), Admit::Queued);
            assert_eq!(offer(3), Admit::Defer(3, first), "{workers} worker(s)");
            assert_eq!(offer(4), Admit::Defer(4, second), "{workers} worker(s)");
        }
    }

    #[test]
    fn a_lanes_burst_rides_with_its_first_wake_and_leaves_with_it() {
        let a = tenant("a");
        let now = Instant::now();
        let hold = Duration::from_millis(100);
        let mut q = FairQueue::new(1, 1, hold);
        assert_eq!(q.admit_in(&a, Some(7), 0, 10, now, 1, None), Admit::Queued);
        for i in 1..=FOLLOWERS_PER_ITEM as u32 {
            assert_eq!(
                q.admit_in(&a, Some(7), i, 10 + u64::from(i), now, 1, None),
                Admit::Follows
            );
        }
        assert_eq!((q.len(), q.followers()), (1, FOLLOWERS_PER_ITEM));
        // Past the most that ride with one: put off after it, as a lane's later wake.
        let past = FOLLOWERS_PER_ITEM as u32 + 1;
        assert_eq!(
            q.admit_in(&a, Some(7), past, 10 + u64::from(past), now, 1, None),
            Admit::Defer(past, hold)
        );
        // Another lane's earlier wake neither rides with the lane's first nor displaces it (its
        // followers would have to go back with it).
        assert!(matches!(
            q.admit_in(&a, Some(8), 1000, 5, now, 1, None),
            Admit::Defer(1000, _)
        ));
        // Handed back when it waited too long: every one of them.
        let back = q.take_older(now + Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(back, (0..past).collect::<Vec<_>>());
        assert_eq!((q.len(), q.followers()), (0, 0));
        // And at a stop.
        assert_eq!(q.admit_in(&a, Some(7), 0, 0, now, 1, None), Admit::Queued);
        assert_eq!(q.admit_in(&a, Some(7), 1, 1, now, 1, None), Admit::Follows);
        assert_eq!(q.drain(), vec![0, 1]);
        assert_eq!((q.len(), q.followers()), (0, 0));
    }

    #[test]
    fn a_larger_bound_keeps_what_a_smaller_puts_off_and_a_smaller_evicts_nothing() {
        let a = tenant("a");
        let now = Instant::now();
        let mut q = FairQueue::new(2, 2, Duration::from_millis(100));
        let offer = |q: &mut FairQueue<u32>, i: u32| q.admit(&a, i, u64::from(i), now, 1, None);
        assert_eq!(offer(&mut q, 0), Admit::Queued);
        assert_eq!(offer(&mut q, 1), Admit::Queued);
        assert!(matches!(offer(&mut q, 2), Admit::Defer(2, _)));
        q.set_per_tenant(5);
        for i in 2..5 {
            assert_eq!(offer(&mut q, i), Admit::Queued, "item {i}");
        }
        assert!(matches!(offer(&mut q, 5), Admit::Defer(5, _)));
        // Smaller again: what waits stays, in order; the next is put off.
        q.set_per_tenant(2);
        assert_eq!(q.len(), 5);
        assert!(matches!(offer(&mut q, 6), Admit::Defer(6, _)));
        let order: Vec<u32> = std::iter::from_fn(|| q.next(|_| 0, &FairShare::default()))
            .map(|(_, item, _)| item)
            .collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
        // Never past the bound on all waiting items.
        q.set_per_tenant(usize::MAX);
        assert_eq!(q.per_tenant, q.total);
    }

    #[test]
    fn kept_items_stay_in_their_places_and_wait_again() {
        let a = tenant("a");
        let t0 = Instant::now();
        let mut q = FairQueue::new(1, 4, Duration::from_millis(100));
        assert_eq!(q.admit_in(&a, Some(1), 10, 10, t0, 1, None), Admit::Queued);
        assert_eq!(q.admit_in(&a, Some(1), 11, 11, t0, 1, None), Admit::Follows);
        let later = t0 + Duration::from_millis(600);
        assert_eq!(
            q.admit_in(&a, Some(2), 20, 20, later, 1, None),
            Admit::Queued
        );
        // At 1.2 s, only lane 1's waited over a second: it and its rider are kept.
        let mut kept = Vec::new();
        let at = t0 + Duration::from_millis(1200);
        q.keep_older(at, Duration::from_secs(1), |i| kept.push(*i));
        assert_eq!(kept, [10, 11]);
        // Kept, they wait from then: nothing is older than a second at 1.7 s but lane 2's.
        let at = t0 + Duration::from_millis(1700);
        assert!(q.take_older(at, Duration::from_secs(1)) == [20]);
        assert_eq!(
            q.next(|_| 0, &FairShare::default()),
            Some((a.clone(), 10, vec![11]))
        );
        assert!(q.is_empty());
    }

    #[test]
    fn put_off_items_are_spaced_by_the_measured_start_interval_when_slower_than_slots_allow() {
        // 4 slots held 4 ms each would start one a millisecond; this worker (CPU-bound, say)
        // starts one every 100 ms while items wait, and spaces put-off items by that.
        let a = tenant("a");
        let t0 = Instant::now();
        let mut q = FairQueue::new(4, 1, Duration::from_millis(4));
        let offer = |q: &mut FairQueue<u32>, i: u32, now: Instant| {
            q.admit(&a, i, u64::from(i), now, 1, None)
        };
        assert_eq!(offer(&mut q, 0, t0), Admit::Queued);
        let Admit::Defer(_, early) = offer(&mut q, 1, t0) else {
            panic!("a full queue puts off");
        };
        assert!(early < Duration::from_millis(10), "{early:?}");
        // Starts 100 ms apart, each leaving one waiting.
        for (n, i) in [(0, 2), (100, 3), (200, 4)] {
            let now = t0 + Duration::from_millis(n);
            assert!(q.next(|_| 0, &FairShare::default()).is_some());
            assert_eq!(offer(&mut q, i, now), Admit::Queued);
            q.started(now);
        }
        let later = t0 + Duration::from_millis(200);
        let Admit::Defer(_, spaced) = offer(&mut q, 9, later) else {
            panic!("a full queue puts off");
        };
        assert!(spaced >= Duration::from_millis(100), "{spaced:?}");
        // Once nothing waits, the next gap is not measured across the idle time.
        q.drain();
        q.started(later + Duration::from_secs(10));
        q.started(later + Duration::from_secs(20));
        let Admit::Defer(_, still) = ({
            assert_eq!(offer(&mut q, 10, later), Admit::Queued);
            offer(&mut q, 11, later)
        }) else {
            panic!("a full queue puts off");
        };
        assert!(still < Duration::from_secs(1), "{still:?}");
    }

    #[test]
    fn a_burst_of_one_tenant_does_not_stand_before_another_tenants_single_wake() {
        let now = Instant::now();
        let mut q = FairQueue::new(4, 4, Duration::from_millis(250));
        let (a, b) = (tenant("a"), tenant("b"));
        let mut deferred = Vec::new();
        for i in 0..600 {
            match q.admit(&a, i, i as u64, now, 1, None) {
                Admit::Queued => {}
                Admit::Follows => panic!("no lane given, nothing rides"),
                Admit::Defer(i, delay) => deferred.push((i, delay)),
            }
        }
        assert_eq!(q.len(), 4);
        assert_eq!(deferred.len(), 596);
        // Put-off wakes keep their order: each comes back no sooner than the one before it.
        assert!(deferred.windows(2).all(|w| w[0].1 <= w[1].1));
        assert!(deferred.iter().all(|(_, d)| *d <= MAX_DEFER));
        assert_eq!(q.admit(&b, 1000, 1000, now, 1, None), Admit::Queued);
        // A runs 4 turns; B none: B's wake is next. An owner of A's sees B's wake waiting
        // (it owes its slot after the short quantum), and B's sees A's.
        let running = |t: &TenantId| if *t == a { 4 } else { 0 };
        let share = FairShare::default();
        assert!(q.has_eligible_besides(Some(&a), running, &share));
        assert!(q.has_eligible_besides(Some(&b), running, &share));
        assert_eq!(q.next(running, &share), Some((b.clone(), 1000, vec![])));
        // Only A's own wait now: an owner of A's keeps its slot until the longer quantum.
        assert!(!q.has_eligible_besides(Some(&a), running, &share));
        assert!(q.has_eligible_besides(Some(&b), running, &share));
        assert_eq!(q.next(running, &share), Some((a, 0, vec![])));
    }

    #[test]
    fn a_capped_tenant_gets_nothing_past_its_cap_and_weights_share_slots() {
        let now = Instant::now();
        let share = FairShare::parse(&["heavy=3".into()], &["capped=2".into()]).unwrap();
        let mut q = FairQueue::new(8, 8, Duration::from_millis(100));
        let (capped, heavy, light) = (tenant("capped"), tenant("heavy"), tenant("light"));
        for i in 0..8 {
            for t in [&capped, &heavy, &light] {
                assert_eq!(q.admit(t, i, i as u64, now, 1, None), Admit::Queued);
            }
        }
        let mut running: HashMap<TenantId, usize> = HashMap::new();
        let mut order = Vec::new();
        while let Some((t, _, _)) = q.next(|t| running.get(t).copied().unwrap_or(0), &share) {
            *running.entry(t.clone()).or_default() += 1;
            order.push(t);
            if order.len() == 10 {
                break;
            }
        }
        assert_eq!(running[&capped], 2, "{order:?}");
        // Of the other 8 starts, heavy (weight 3) gets three times light's.
        assert_eq!((running[&heavy], running[&light]), (6, 2), "{order:?}");
        assert!(!q.has_eligible(
            |t| if *t == capped { 2 } else { 100 },
            &FairShare::parse(&[], &["*=100".into(), "capped=2".into()]).unwrap()
        ));
    }

    #[test]
    fn a_wake_that_comes_back_keeps_its_place_before_later_arrivals() {
        let now = Instant::now();
        let mut q = FairQueue::new(2, 2, Duration::from_millis(100));
        let a = tenant("a");
        assert_eq!(q.admit(&a, "ten", 10, now, 1, None), Admit::Queued);
        assert_eq!(q.admit(&a, "twenty", 20, now, 1, None), Admit::Queued);
        // Full: a later arrival is put off; an earlier one (put off before, back now) takes
        // the place of the latest waiting.
        assert!(matches!(
            q.admit(&a, "thirty", 30, now, 1, None),
            Admit::Defer("thirty", _)
        ));
        assert!(matches!(
            q.admit(&a, "five", 5, now, 1, None),
            Admit::Defer("twenty", _)
        ));
        let order: Vec<_> = std::iter::from_fn(|| q.next(|_| 0, &FairShare::default()))
            .map(|(_, item, _)| item)
            .collect();
        assert_eq!(order, ["five", "ten"]);
    }

    #[test]
    fn settings_parse_or_say_why_not() {
        let share = FairShare::parse(&["*=2".into(), "acme=5".into()], &["*=4".into()]).unwrap();
        assert_eq!(share.weight(&tenant("acme")), 5);
        assert_eq!(share.weight(&tenant("other")), 2);
        assert_eq!(share.cap(&tenant("other")), Some(4));
        assert_eq!(FairShare::default().cap(&tenant("x")), None);
        for (w, c) in [
            (vec!["acme".to_string()], vec![]),
            (vec!["acme=0".into()], vec![]),
            (vec!["acme=x".into()], vec![]),
            (vec![], vec!["*=0".into()]),
            (vec!["../x=1".into()], vec![]),
        ] {
            assert!(FairShare::parse(&w, &c).is_err(), "{w:?} {c:?}");
        }
    }

    proptest! {
        #[test]
        fn nothing_is_lost_and_a_tenant_is_served_in_arrival_order(
            arrivals in proptest::collection::vec((0u8..4, 0u64..6, 0u64..400), 1..300),
            per_tenant in 1usize..6,
        ) {
            let now = Instant::now();
            let mut q = FairQueue::new(4, per_tenant, Duration::from_millis(100));
            let mut kept = std::collections::BTreeSet::new();
            let mut given_back = 0;
            for (i, (t, lane, at)) in arrivals.iter().enumerate() {
                match q.admit_in(&tenant(&format!("t{t}")), Some(*lane), i, *at, now, 1, None) {
                    Admit::Queued | Admit::Follows => {
                        kept.insert(i);
                    }
                    Admit::Defer(j, delay) => {
                        prop_assert!(delay > Duration::ZERO && delay <= MAX_DEFER);
                        if j != i {
                            // It displaced a later arrival, which was kept until now.
                            prop_assert!(kept.remove(&j));
                            prop_assert!(arrivals[j].2 > arrivals[i].2);
                            kept.insert(i);
                        }
                        given_back += 1;
                    }
                }
            }
            prop_assert_eq!(kept.len() + given_back, arrivals.len());
            prop_assert_eq!(q.len() + q.followers(), kept.len());
            let mut last: HashMap<TenantId, usize> = HashMap::new();
            let mut out = std::collections::BTreeSet::new();
            while let Some((t, i, followers)) = q.next(|_| 0, &FairShare::default()) {
                // A tenant's starts in the order their wakes arrived.
                if let Some(prev) = last.insert(t.clone(), i) {
                    prop_assert!(arrivals[prev].2 <= arrivals[i].2);
                }
                for f in &followers {
                    // A rider is of its first's tenant and lane, and arrived no sooner.
                    prop_assert_eq!(&arrivals[*f].0, &arrivals[i].0);
                    prop_assert_eq!(&arrivals[*f].1, &arrivals[i].1);
                    prop_assert!(arrivals[*f].2 >= arrivals[i].2);
                }
                prop_assert!(out.insert(i));
                for f in followers {
                    prop_assert!(out.insert(f));
                }
            }
            prop_assert_eq!(out, kept);
            prop_assert!(q.is_empty());
            prop_assert_eq!(q.followers(), 0);
        }
    }
}
