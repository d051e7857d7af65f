mod common;
mod concurrency;
mod crash;
mod kv_artifacts;
mod log_chain;
mod props;
mod rejections;
mod state;
