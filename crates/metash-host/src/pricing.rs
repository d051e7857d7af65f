//! What a model turn costs while it streams. Every frontend reports token usage as it goes (the
//! API clients per message, the CLIs per model call), but only Claude Code reports dollars, and
//! only at the end. So the host prices usage itself from a per-model table (built in, overridable
//! in `.meta/config.toml` `[prices."MODEL"]`) and stops a turn the moment it would pass the turn's
//! `max_tokens` or the run's `max_cost_usd`, instead of learning it after the money is spent.

use std::collections::BTreeMap;

use metash_protocol::Usage;
use serde::{Deserialize, Serialize};

/// US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Cached input read back (absent: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_mtok: Option<f64>,
    /// Input written to the cache (absent: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<f64>,
}

impl Price {
    const fn of(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Self {
        Self {
            input_per_mtok: input,
            output_per_mtok: output,
            cache_read_per_mtok: Some(cache_read),
            cache_write_per_mtok: Some(cache_write),
        }
    }

    /// The cost of `usage`. `input_tokens` is taken as the uncached input (how both providers
    /// report it once cache fields are split out).
    pub fn cost(&self, usage: &Usage) -> f64 {
        let m = 1_000_000.0;
        let read = self.cache_read_per_mtok.unwrap_or(self.input_per_mtok);
        let write = self.cache_write_per_mtok.unwrap_or(self.input_per_mtok);
        (usage.input_tokens as f64 * self.input_per_mtok
            + usage.output_tokens as f64 * self.output_per_mtok
            + usage.cache_read_tokens.unwrap_or(0) as f64 * read
            + usage.cache_creation_tokens.unwrap_or(0) as f64 * write)
            / m
    }

    /// Every figure finite and not negative.
    pub fn check(&self) -> Result<(), String> {
        let fields = [
            ("input_per_mtok", Some(self.input_per_mtok)),
            ("output_per_mtok", Some(self.output_per_mtok)),
            ("cache_read_per_mtok", self.cache_read_per_mtok),
            ("cache_write_per_mtok", self.cache_write_per_mtok),
        ];
        for (name, v) in fields {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!("{name} must be a number >= 0, not {v}"));
                }
            }
        }
        Ok(())
    }
}

/// Published list prices when this table was written (2026-11), matched by model-name prefix so
/// dated snapshots (`claude-sonnet-4-5-20250929`) find their family. Override any of them in
/// config.toml; a model in neither has no known price, and `max_cost_usd` cannot stop its turns
/// early (the response and the log say so).
const BUILTIN: &[(&str, Price)] = &[
    ("claude-opus-4-1", Price::of(15.0, 75.0, 1.5, 18.75)),
    ("claude-opus-4-5", Price::of(5.0, 25.0, 0.5, 6.25)),
    ("claude-sonnet-4", Price::of(3.0, 15.0, 0.3, 3.75)),
    ("claude-haiku-4-5", Price::of(1.0, 5.0, 0.1, 1.25)),
    ("gpt-5-nano", Price::of(0.05, 0.4, 0.005, 0.05)),
    ("gpt-5-mini", Price::of(0.25, 2.0, 0.025, 0.25)),
    ("gpt-5", Price::of(1.25, 10.0, 0.125, 1.25)),
    ("gpt-4.1-mini", Price::of(0.4, 1.6, 0.1, 0.4)),
    ("gpt-4.1", Price::of(2.0, 8.0, 0.5, 2.0)),
    ("gpt-4o", Price::of(2.5, 10.0, 1.25, 2.5)),
];

/// The built-in table with the project's overrides on top.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    overrides: BTreeMap<String, Price>,
}

impl PriceTable {
    pub fn new(overrides: BTreeMap<String, Price>) -> Self {
        Self { overrides }
    }

    /// An override for exactly this model, else the longest built-in prefix.
    pub fn price(&self, model: &str) -> Option<Price> {
        if let Some(p) = self.overrides.get(model) {
            return Some(*p);
        }
        BUILTIN
            .iter()
            .filter(|(prefix, _)| model.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, p)| *p)
    }
}

/// Why a turn was stopped while it streamed.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    MaxTokens { limit: u64, used: u64 },
    MaxCost { limit: f64, spent: f64 },
}

impl Stop {
    /// What the response says.
    pub fn explain(&self) -> String {
        match self {
            Self::MaxTokens { limit, used } => format!(
                "max_tokens exceeded: the turn used {used} output tokens, more than {limit}, and was stopped"
            ),
            Self::MaxCost { limit, spent } => format!(
                "max_cost_usd exceeded: the run would have spent ${spent:.4}, more than its budget of \
                 ${limit:.4}, and the turn was stopped"
            ),
        }
    }
}

/// One turn's usage against its limits. Usage reports are cumulative within a turn (each says the
/// total so far), so the largest seen counts.
#[derive(Debug, Clone)]
pub struct TurnMeter {
    max_output_tokens: Option<u64>,
    /// The run's `max_cost_usd` and what earlier spawns spent.
    cost_budget: Option<(f64, f64)>,
    price: Option<Price>,
    output_tokens: u64,
    total_tokens: u64,
    cost: f64,
}

impl TurnMeter {
    pub fn new(
        max_output_tokens: Option<u64>,
        cost_budget: Option<(f64, f64)>,
        price: Option<Price>,
    ) -> Self {
        Self {
            max_output_tokens,
            cost_budget,
            price,
            output_tokens: 0,
            total_tokens: 0,
            cost: 0.0,
        }
    }

    /// Takes one usage report; `Some` when the turn must stop now.
    pub fn observe(&mut self, usage: &Usage) -> Option<Stop> {
        self.output_tokens = self.output_tokens.max(usage.output_tokens);
        let total = usage.input_tokens + usage.output_tokens;
        self.total_tokens = self.total_tokens.max(total);
        if let Some(p) = self.price {
            self.cost = self.cost.max(p.cost(usage));
        }
        if let Some(limit) = self.max_output_tokens {
            if self.output_tokens > limit {
                return Some(Stop::MaxTokens {
                    limit,
                    used: self.output_tokens,
                });
            }
        }
        if let (Some((limit, spent)), Some(_)) = (self.cost_budget, self.price) {
            if spent + self.cost > limit {
                return Some(Stop::MaxCost {
                    limit,
                    spent: spent + self.cost,
                });
            }
        }
        None
    }

    pub fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// What the turn cost so far, when the model's price is known.
    pub fn cost(&self) -> Option<f64> {
        self.price.map(|_| self.cost)
    }

    pub fn priced(&self) -> bool {
        self.price.is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: None,
            cache_creation_tokens: None,
        }
    }

    #[test]
    fn prices_by_longest_prefix_and_overrides_win() {
        let t = PriceTable::default();
        assert_eq!(t.price("gpt-5-mini-2025").unwrap().output_per_mtok, 2.0);
        assert_eq!(t.price("gpt-5").unwrap().output_per_mtok, 10.0);
        assert_eq!(
            t.price("claude-sonnet-4-5-20250929")
                .unwrap()
                .input_per_mtok,
            3.0
        );
        assert!(t.price("llama3").is_none());
        let mine = Price::of(1.0, 1.0, 1.0, 1.0);
        let t = PriceTable::new([("gpt-5".to_string(), mine)].into());
        assert_eq!(t.price("gpt-5"), Some(mine));
        assert_eq!(t.price("gpt-5-mini").unwrap().output_per_mtok, 2.0);
    }

    #[test]
    fn cost_counts_every_kind_of_token() {
        let p = Price::of(3.0, 15.0, 0.3, 3.75);
        let mut u = usage(1_000_000, 1_000_000);
        assert!((p.cost(&u) - 18.0).abs() < 1e-9);
        u.cache_read_tokens = Some(1_000_000);
        u.cache_creation_tokens = Some(1_000_000);
        assert!((p.cost(&u) - 22.05).abs() < 1e-9);
        assert!(Price::of(f64::NAN, 1.0, 1.0, 1.0).check().is_err());
        assert!(Price::of(-1.0, 1.0, 1.0, 1.0).check().is_err());
    }

    #[test]
    fn meter_stops_at_the_first_report_past_a_limit() {
        let mut m = TurnMeter::new(Some(100), None, None);
        assert_eq!(m.observe(&usage(10, 100)), None);
        assert_eq!(
            m.observe(&usage(10, 101)),
            Some(Stop::MaxTokens {
                limit: 100,
                used: 101
            })
        );
        // $10/Mtok output, $1 budget with $0.50 spent: 50k output tokens is the edge.
        let price = Price::of(0.0, 10.0, 0.0, 0.0);
        let mut m = TurnMeter::new(None, Some((1.0, 0.5)), Some(price));
        assert_eq!(m.observe(&usage(0, 50_000)), None);
        let stop = m.observe(&usage(0, 50_001)).unwrap();
        assert!(matches!(stop, Stop::MaxCost { limit, spent } if limit == 1.0 && spent > 1.0));
        assert!(stop.explain().contains("max_cost_usd"));
        // Reports are cumulative: a smaller one later does not lower the count.
        assert_eq!(m.total_tokens(), 50_001);
        // Without a price, cost cannot stop anything.
        let mut m = TurnMeter::new(None, Some((0.0, 0.0)), None);
        assert_eq!(m.observe(&usage(1_000_000, 1_000_000)), None);
        assert_eq!(m.cost(), None);
    }
}
