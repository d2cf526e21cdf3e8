//! What a turn's model calls used: one `usage` entry per call in the turn's batch two, its
//! cost from the operator's price table, the ledger counters added once the turn commits
//! ([`turnpike_router::usage`]), and the budget check a turn passes before it runs.
//!
//! # The price table
//! A TOML file (`--prices FILE`), versioned so each entry says which prices made its cost:
//!
//! ```toml
//! version = "2026-12-01"
//!
//! [[price]]
//! provider = "openai"
//! model = "gpt-4o-mini"            # also matches dated snapshots: gpt-4o-mini-2024-07-18
//! input_usd_per_mtok = 0.15
//! cached_input_usd_per_mtok = 0.075  # optional: cached input at the input price otherwise
//! output_usd_per_mtok = 0.60
//! ```
//!
//! Prices are US dollars per million tokens, so a token costs exactly that many millionths of
//! a dollar. A model the table lacks has no cost (its tokens still count).

use std::path::Path;

use serde::Deserialize;
#[cfg(test)]
use turnpike_router::usage::UsageTotals;
use turnpike_schemas::entry::{Cost, UsageEntry};
use turnpike_schemas::{EntryBody, TurnId};

use turnpike_agent::model::CallUsage;

/// One model's prices.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub provider: String,
    pub model: String,
    pub input_usd_per_mtok: f64,
    #[serde(default)]
    pub cached_input_usd_per_mtok: Option<f64>,
    pub output_usd_per_mtok: f64,
}

/// The operator's price table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    pub version: String,
    #[serde(default)]
    pub price: Vec<Price>,
}

impl PriceTable {
    /// Reads a price table file.
    pub fn load(path: &Path) -> Result<PriceTable, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("price table {}: {e}", path.display()))?;
        PriceTable::parse(&text).map_err(|e| format!("price table {}: {e}", path.display()))
    }

    /// Parses a price table, refusing negative or non-finite prices and an empty version.
    pub fn parse(text: &str) -> Result<PriceTable, String> {
        let table: PriceTable = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        if table.version.trim().is_empty() {
            return Err("version: must name the table's version".into());
        }
        for p in &table.price {
            let prices = [
                Some(p.input_usd_per_mtok),
                p.cached_input_usd_per_mtok,
                Some(p.output_usd_per_mtok),
            ];
            if prices
                .into_iter()
                .flatten()
                .any(|x| !x.is_finite() || !(0.0..1e6).contains(&x))
            {
                return Err(format!(
                    "{}/{}: prices are dollars per million tokens, from 0 to 1e6",
                    p.provider, p.model
                ));
            }
        }
        Ok(table)
    }

    /// The prices of `model` of `provider`: an exact entry, else the longest entry the model
    /// name extends with `-…` (a dated snapshot of it).
    fn price(&self, provider: &str, model: &str) -> Option<&Price> {
        let ours = self.price.iter().filter(|p| p.provider == provider);
        ours.clone().find(|p| p.model == model).or_else(|| {
            ours.filter(|p| {
                model
                    .strip_prefix(p.model.as_str())
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|p| p.model.len())
        })
    }

    /// What a call cost, when the table prices its model.
    pub fn cost(&self, call: &CallUsage) -> Option<Cost> {
        let p = self.price(&call.provider, &call.model)?;
        let u = &call.usage;
        let cached = u.cached_tokens.min(u.prompt_tokens);
        let micro = (u.prompt_tokens - cached) as f64 * p.input_usd_per_mtok
            + cached as f64 * p.cached_input_usd_per_mtok.unwrap_or(p.input_usd_per_mtok)
            + u.completion_tokens as f64 * p.output_usd_per_mtok;
        Some(Cost {
            micro_usd: micro.round() as u64,
            prices: self.version.clone(),
        })
    }
}

/// The `usage` entries of a turn's calls, in order.
pub fn entries(turn: TurnId, calls: &[CallUsage], prices: Option<&PriceTable>) -> Vec<EntryBody> {
    calls
        .iter()
        .map(|call| {
            EntryBody::Usage(UsageEntry {
                turn,
                provider: call.provider.clone(),
                model: call.model.clone(),
                input_tokens: call.usage.prompt_tokens,
                output_tokens: call.usage.completion_tokens,
                cached_tokens: call.usage.cached_tokens,
                reasoning_tokens: call.usage.reasoning_tokens,
                estimated: call.estimated,
                cost: prices.and_then(|t| t.cost(call)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_agent::model::Usage;

    const TABLE: &str = r#"
version = "2026-12-01"

[[price]]
provider = "openai"
model = "gpt-4o-mini"
input_usd_per_mtok = 0.15
cached_input_usd_per_mtok = 0.075
output_usd_per_mtok = 0.60

[[price]]
provider = "openai"
model = "gpt-4o"
input_usd_per_mtok = 2.5
output_usd_per_mtok = 10
"#;

    fn call(model: &str, prompt: u64, cached: u64, completion: u64) -> CallUsage {
        CallUsage {
            provider: "openai".into(),
            model: model.into(),
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                cached_tokens: cached,
                reasoning_tokens: 0,
            },
            estimated: false,
        }
    }

    #[test]
    fn costs_follow_the_table_and_snapshots_take_their_models_prices() {
        let t = PriceTable::parse(TABLE).unwrap();
        // 1M input of which 400k cached, 100k output: 0.6·0.15 + 0.4·0.075 + 0.1·0.60 dollars.
        let c = t
            .cost(&call("gpt-4o-mini", 1_000_000, 400_000, 100_000))
            .unwrap();
        assert_eq!(c.micro_usd, 90_000 + 30_000 + 60_000);
        assert_eq!(c.prices, "2026-12-01");
        // A dated snapshot is priced as its model, not as the shorter `gpt-4o`.
        let snap = t
            .cost(&call("gpt-4o-mini-2024-07-18", 1_000_000, 0, 0))
            .unwrap();
        assert_eq!(snap.micro_usd, 150_000);
        // Without a cached price, cached input costs the input price.
        assert_eq!(
            t.cost(&call("gpt-4o", 1000, 500, 0)).unwrap().micro_usd,
            2_500
        );
        // Unknown models, other providers and look-alike names have no price.
        assert!(t.cost(&call("gpt-4omini", 1, 0, 1)).is_none());
        assert!(t.cost(&call("o3", 1, 0, 1)).is_none());
        let mut other = call("gpt-4o", 1, 0, 1);
        other.provider = "script".into();
        assert!(t.cost(&other).is_none());
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        for (bad, says) in [
            ("version = \"\"", "version"),
            ("[[price]]\nprovider='a'\nmodel='b'\ninput_usd_per_mtok=1\noutput_usd_per_mtok=1", "version"),
            ("version='1'\n[[price]]\nprovider='a'\nmodel='b'\ninput_usd_per_mtok=-1\noutput_usd_per_mtok=1", "a/b"),
            ("version='1'\n[[price]]\nprovider='a'\nmodel='b'\ninput_usd_per_mtok=1\noutput_usd_per_mtok=nan", "a/b"),
            ("version='1'\n[[price]]\nprovider='a'\nmodel='b'\ninput_usd_per_mtok=1\noutput_usd_per_mtok=1\nextra=2", "extra"),
        ] {
            let err = PriceTable::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn entries_and_totals_agree() {
        let t = PriceTable::parse(TABLE).unwrap();
        let turn = TurnId::new(3).unwrap();
        let calls = [
            call("gpt-4o-mini", 100, 0, 10),
            call("gpt-4o", 1000, 0, 100),
        ];
        let bodies = entries(turn, &calls, Some(&t));
        let usage: Vec<&UsageEntry> = bodies
            .iter()
            .map(|b| match b {
                EntryBody::Usage(u) => u,
                _ => unreachable!(),
            })
            .collect();
        let total = UsageTotals::of_entries(usage);
        assert_eq!(
            (
                total.turns,
                total.calls,
                total.input_tokens,
                total.output_tokens
            ),
            (1, 2, 1100, 110)
        );
        assert_eq!(total.cost_micro_usd, 15 + 6 + 2_500 + 1_000);
    }
}
