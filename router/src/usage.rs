//! The usage ledger: what each tenant's model calls used per UTC day, kept on the bus so every
//! router and worker reads one number, and the budgets checked against it.
//!
//! The record is the authority (one `usage` entry per model call, signed with the turn). The
//! ledger is a roll-up of it a dispatch can read in one round trip: per day, one counter per
//! tenant and one per (tenant, app), each updated with compare-and-set after the turn that
//! used the tokens commits. An owner that dies between its commit and its ledger update leaves
//! that turn out of the ledger (never counted twice); budgets are therefore a ceiling with the
//! slack of the turns running at the time and of such losses, as spending limits are
//! everywhere.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use turnpike_schemas::{AppId, TenantId};

/// Milliseconds in a day.
const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// A UTC day, as days since 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Day(pub u32);

impl Day {
    /// The day `ms` (milliseconds since the epoch) falls on.
    pub fn of_ms(ms: u64) -> Day {
        Day((ms / DAY_MS) as u32)
    }

    /// Today, by this machine's clock.
    pub fn today() -> Day {
        Day::of_ms(crate::clock::now_ms())
    }

    /// The day after.
    pub fn next(self) -> Day {
        Day(self.0 + 1)
    }

    /// `YYYY-MM-DD`.
    pub fn date(self) -> (i64, u32, u32) {
        // Howard Hinnant's days-to-civil.
        let z = i64::from(self.0) + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let y = yoe + era * 400 + i64::from(m <= 2);
        (y, m, d)
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = self.date();
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

impl FromStr for Day {
    type Err = String;

    /// `YYYY-MM-DD`, from 1970 on.
    fn from_str(s: &str) -> Result<Day, String> {
        let bad = || format!("{s:?} is not a date (YYYY-MM-DD)");
        let mut parts = s.splitn(3, '-');
        let mut next = |len: usize| -> Result<i64, String> {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != len || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let (y, m, d) = (next(4)?, next(2)?, next(2)?);
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) || y < 1970 {
            return Err(bad());
        }
        // Civil-to-days (the inverse of `date`).
        let y2 = if m <= 2 { y - 1 } else { y };
        let era = y2.div_euclid(400);
        let yoe = y2 - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        let day = Day(u32::try_from(days).map_err(|_| bad())?);
        // 2026-02-31 would land in March: refuse what does not read back.
        if day.date() != (y, m as u32, d as u32) {
            return Err(bad());
        }
        Ok(day)
    }
}

/// What was used: counts that only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Turns whose model calls are counted here.
    #[serde(default)]
    pub turns: u64,
    /// Model calls.
    #[serde(default)]
    pub calls: u64,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens the provider served from its cache (part of `input_tokens`).
    #[serde(default)]
    pub cached_tokens: u64,
    /// Output tokens spent reasoning (part of `output_tokens`).
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Cost in millionths of a US dollar, from the price table (calls of unpriced models add 0).
    #[serde(default)]
    pub cost_micro_usd: u64,
}

impl UsageTotals {
    /// The sum of two totals (saturating).
    /// What `usage` entries add up to (`turns` counts the distinct turns among them).
    pub fn of_entries<'a>(
        entries: impl IntoIterator<Item = &'a turnpike_schemas::entry::UsageEntry>,
    ) -> UsageTotals {
        let mut turns = std::collections::BTreeSet::new();
        let mut total = UsageTotals::default();
        for e in entries {
            turns.insert(e.turn);
            total = total.plus(UsageTotals {
                turns: 0,
                calls: 1,
                input_tokens: e.input_tokens,
                output_tokens: e.output_tokens,
                cached_tokens: e.cached_tokens,
                reasoning_tokens: e.reasoning_tokens,
                cost_micro_usd: e.cost.as_ref().map_or(0, |c| c.micro_usd),
            });
        }
        total.turns = turns.len() as u64;
        total
    }

    pub fn plus(self, o: UsageTotals) -> UsageTotals {
        UsageTotals {
            turns: self.turns.saturating_add(o.turns),
            calls: self.calls.saturating_add(o.calls),
            input_tokens: self.input_tokens.saturating_add(o.input_tokens),
            output_tokens: self.output_tokens.saturating_add(o.output_tokens),
            cached_tokens: self.cached_tokens.saturating_add(o.cached_tokens),
            reasoning_tokens: self.reasoning_tokens.saturating_add(o.reasoning_tokens),
            cost_micro_usd: self.cost_micro_usd.saturating_add(o.cost_micro_usd),
        }
    }

    /// Input plus output tokens.
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Whose usage a ledger counter holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UsageScope {
    /// Everything of a tenant.
    Tenant(TenantId),
    /// A tenant's use of one app.
    App(TenantId, AppId),
}

impl UsageScope {
    /// The scope's key on the bus, for `day` (ids are slugs: safe in a subject token).
    pub fn key(&self, day: Day) -> String {
        match self {
            UsageScope::Tenant(t) => format!("{t}.{}._all", day.0),
            UsageScope::App(t, a) => format!("{t}.{}.app-{a}", day.0),
        }
    }
}

/// What a budget limits, per UTC day.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// Input plus output tokens.
    Tokens(u64),
    /// Cost in millionths of a US dollar.
    MicroUsd(u64),
}

/// Whom a budget applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetScope {
    /// All of one tenant's apps.
    Tenant(TenantId),
    /// Each tenant's use of one app.
    App(AppId),
}

/// A daily spending limit, set by the operator: `tenant=ID:tokens=N`, `app=ID:usd=X`.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub scope: BudgetScope,
    pub limit: Limit,
}

impl FromStr for Budget {
    type Err = String;

    fn from_str(s: &str) -> Result<Budget, String> {
        let usage = "a budget is SCOPE=ID:LIMIT=N per UTC day: tenant=acme:tokens=1000000 or app=demo:usd=5.50";
        let (scope, limit) = s.split_once(':').ok_or_else(|| format!("{s:?}: {usage}"))?;
        let scope = match scope.split_once('=') {
            Some(("tenant", id)) => {
                BudgetScope::Tenant(id.parse().map_err(|e| format!("{s:?}: {e}"))?)
            }
            Some(("app", id)) => BudgetScope::App(id.parse().map_err(|e| format!("{s:?}: {e}"))?),
            _ => return Err(format!("{s:?}: {usage}")),
        };
        let limit = match limit.split_once('=') {
            Some(("tokens", n)) => Limit::Tokens(
                n.parse()
                    .map_err(|_| format!("{s:?}: {n:?} is not a number of tokens"))?,
            ),
            Some(("usd", x)) => {
                let dollars: f64 = x
                    .parse()
                    .ok()
                    .filter(|d: &f64| d.is_finite() && *d >= 0.0 && *d < 1e12)
                    .ok_or_else(|| format!("{s:?}: {x:?} is not an amount in dollars"))?;
                Limit::MicroUsd((dollars * 1e6).round() as u64)
            }
            _ => return Err(format!("{s:?}: {usage}")),
        };
        Ok(Budget { scope, limit })
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            BudgetScope::Tenant(t) => write!(f, "tenant={t}")?,
            BudgetScope::App(a) => write!(f, "app={a}")?,
        }
        match self.limit {
            Limit::Tokens(n) => write!(f, ":tokens={n}"),
            Limit::MicroUsd(m) => write!(f, ":usd={}", m as f64 / 1e6),
        }
    }
}

impl Budget {
    /// The ledger counter this budget reads for a turn of `app` in `tenant`, if it applies.
    pub fn counter(&self, tenant: &TenantId, app: &AppId) -> Option<UsageScope> {
        match &self.scope {
            BudgetScope::Tenant(t) if t == tenant => Some(UsageScope::Tenant(t.clone())),
            BudgetScope::App(a) if a == app => Some(UsageScope::App(tenant.clone(), a.clone())),
            _ => None,
        }
    }

    /// Why `used` leaves nothing of this budget, or `None` while some is left.
    pub fn exhausted_by(&self, used: &UsageTotals) -> Option<String> {
        let whose = match &self.scope {
            BudgetScope::Tenant(t) => format!("tenant {t}"),
            BudgetScope::App(a) => format!("app {a}"),
        };
        match self.limit {
            Limit::Tokens(n) if used.tokens() >= n => Some(format!(
                "the daily budget of {whose} is spent: {} of {n} tokens used today (UTC); it renews at midnight UTC",
                used.tokens()
            )),
            Limit::MicroUsd(m) if used.cost_micro_usd >= m => Some(format!(
                "the daily budget of {whose} is spent: ${:.4} of ${:.4} used today (UTC); it renews at midnight UTC",
                used.cost_micro_usd as f64 / 1e6,
                m as f64 / 1e6
            )),
            _ => None,
        }
    }
}

/// The first budget among `budgets` that a new turn of `app` in `tenant` may not start under,
/// with why; reads each applicable counter once.
pub async fn check_budgets(
    bus: &dyn crate::Bus,
    budgets: &[Budget],
    tenant: &TenantId,
    app: &AppId,
) -> crate::Result<Option<String>> {
    let today = Day::today();
    for budget in budgets {
        if let Some(scope) = budget.counter(tenant, app) {
            let used = bus.usage(&scope, today).await?;
            if let Some(why) = budget.exhausted_by(&used) {
                return Ok(Some(why));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_read_and_print_as_dates() {
        assert_eq!(Day(0).to_string(), "1970-01-01");
        assert_eq!("1970-01-01".parse::<Day>().unwrap(), Day(0));
        for d in [0, 59, 60, 365, 10_957, 20_000, 20_788, 40_000] {
            let day = Day(d);
            assert_eq!(day.to_string().parse::<Day>().unwrap(), day, "{day}");
        }
        assert_eq!(
            "2026-12-01".parse::<Day>().unwrap().to_string(),
            "2026-12-01"
        );
        assert_eq!(Day::of_ms(1_764_547_200_000).to_string(), "2025-12-01");
        for bad in [
            "2026-02-30",
            "2026-13-01",
            "26-01-01",
            "2026-1-01",
            "x",
            "1969-12-31",
            "",
        ] {
            assert!(bad.parse::<Day>().is_err(), "{bad}");
        }
    }

    #[test]
    fn budgets_parse_print_and_apply_to_their_scope_only() {
        let b: Budget = "tenant=acme:tokens=100".parse().unwrap();
        assert_eq!(b.to_string(), "tenant=acme:tokens=100");
        let acme: TenantId = "acme".parse().unwrap();
        let other: TenantId = "other".parse().unwrap();
        let demo: AppId = "demo".parse().unwrap();
        assert_eq!(
            b.counter(&acme, &demo),
            Some(UsageScope::Tenant(acme.clone()))
        );
        assert_eq!(b.counter(&other, &demo), None);
        let used = |tokens| UsageTotals {
            input_tokens: tokens,
            ..Default::default()
        };
        assert!(b.exhausted_by(&used(99)).is_none());
        assert!(b
            .exhausted_by(&used(100))
            .unwrap()
            .contains("100 of 100 tokens"));

        let b: Budget = "app=demo:usd=0.25".parse().unwrap();
        assert_eq!(b.limit, Limit::MicroUsd(250_000));
        assert_eq!(
            b.counter(&other, &demo),
            Some(UsageScope::App(other.clone(), demo.clone()))
        );
        let spent = UsageTotals {
            cost_micro_usd: 250_000,
            ..Default::default()
        };
        assert!(b
            .exhausted_by(&spent)
            .unwrap()
            .contains("$0.2500 of $0.2500"));
        for bad in [
            "",
            "tenant=acme",
            "tenant=ACME:tokens=1",
            "user=x:tokens=1",
            "app=demo:tokens=-1",
            "app=demo:usd=NaN",
            "app=demo:usd=-1",
            "app=demo:euros=1",
        ] {
            assert!(bad.parse::<Budget>().is_err(), "{bad}");
        }
    }

    #[test]
    fn scopes_have_distinct_keys_per_day() {
        let t: TenantId = "acme".parse().unwrap();
        let a: AppId = "all".parse().unwrap();
        let keys = [
            UsageScope::Tenant(t.clone()).key(Day(1)),
            UsageScope::Tenant(t.clone()).key(Day(2)),
            UsageScope::App(t.clone(), a.clone()).key(Day(1)),
        ];
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
    }
}
