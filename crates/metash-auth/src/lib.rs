//! The OAuth broker and vault of seed 002 §6. Agents never see a token: a person logs in to a
//! provider through metash (`metash auth login`, by authorization code with PKCE through a
//! loopback redirect, or by the device flow), the tokens are sealed in the vault, refreshed
//! before they expire under a cross-process lock (so two runs never spend one refresh token),
//! and revoked at the provider when the person logs out.
//!
//! - [`provider`]: the providers (config `[oauth.providers.NAME]`, presets, discovery);
//! - [`flow`]: the two login flows and the HTTP client they use;
//! - [`vault`], [`key`] and [`keychain`]: the sealed file, its key, and the OS keychain that
//!   keeps the key;
//! - [`broker`]: login, list, logout, and a live token for the credential proxy.

pub mod broker;
pub mod error;
pub mod flow;
pub mod key;
pub mod keychain;
pub mod provider;
pub mod secret;
pub mod vault;

pub use broker::{Broker, Login, TokenInfo};
pub use error::{AuthError, Result};
pub use keychain::{Keychain, KeychainChoice};
pub use provider::Provider;
pub use secret::Secret;
pub use vault::{KeyCache, KeyOptions, Vault};
