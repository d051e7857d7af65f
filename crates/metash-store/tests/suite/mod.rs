mod common;
mod concurrency;
mod crash;
mod kv_artifacts;
mod log_chain;
mod rejections;
mod state;
