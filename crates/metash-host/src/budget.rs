//! The run-wide budget: tokens (and cost where the provider reports it) summed over every spawn of
//! the session in `.meta/budget.json`, checked before a spawn so the host asks instead of spending.

use metash_protocol::LogKind;
use metash_store::{NewEvent, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::Budget;
use crate::error::Result;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetUsed {
    #[serde(default)]
    pub tokens_used: u64,
    #[serde(default)]
    pub cost_usd: f64,
    #[serde(default)]
    pub spawns: u64,
}

pub fn used(store: &Store) -> Result<BudgetUsed> {
    let doc = store.read_doc("budget")?;
    if doc.is_null() {
        return Ok(BudgetUsed::default());
    }
    Ok(serde_json::from_value(doc)
        .map_err(|e| StoreError::Rejected(format!("budget.json: {e}")))?)
}

/// Adds one spawn's usage.
pub fn charge(
    store: &Store,
    agent: &str,
    tokens: u64,
    cost_usd: Option<f64>,
) -> Result<BudgetUsed> {
    let mut after = BudgetUsed::default();
    store.update_doc("budget", |doc| {
        let mut used: BudgetUsed = if doc.is_null() {
            BudgetUsed::default()
        } else {
            serde_json::from_value(doc.clone())
                .map_err(|e| StoreError::Rejected(format!("budget.json: {e}")))?
        };
        used.tokens_used += tokens;
        used.cost_usd += cost_usd.unwrap_or(0.0);
        used.spawns += 1;
        *doc = serde_json::to_value(&used).map_err(|e| StoreError::Rejected(e.to_string()))?;
        after = used.clone();
        Ok(NewEvent::new(
            LogKind::BudgetCharge,
            Some(agent),
            json!({"tokens": tokens, "cost_usd": cost_usd, "total_tokens": used.tokens_used,
                   "total_cost_usd": used.cost_usd}),
        ))
    })?;
    Ok(after)
}

/// Why a spawn that may use up to `reserve` tokens would break the budget, if it would.
pub fn would_exceed(budget: &Budget, used: &BudgetUsed, reserve: u64) -> Option<String> {
    if let Some(max) = budget.max_tokens {
        if used.tokens_used.saturating_add(reserve) > max {
            return Some(format!(
                "the run budget is {max} tokens; {} are used and this spawn may use up to {reserve}",
                used.tokens_used
            ));
        }
    }
    if let Some(max) = budget.max_cost_usd {
        if used.cost_usd >= max {
            return Some(format!(
                "the run budget is ${max:.2}; ${:.2} is spent",
                used.cost_usd
            ));
        }
    }
    None
}
