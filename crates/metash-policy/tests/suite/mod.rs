mod common;
mod consent;
mod ledger;
mod manifest;
mod migrate;
mod props;
mod registry;
