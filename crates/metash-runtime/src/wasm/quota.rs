//! A WASM agent's write quotas: the bytes and files it may add under what it may write (its
//! read-write preopens), as for a native agent (`AgentSpec::write_quota`).
//!
//! WASI gives no hook on a write (wasmtime-wasi's preopens are cap-std directories that write
//! straight to the host), so the native sandbox's watcher measures the directories behind the
//! read-write preopens (`native::disk_quota`). A guest has no process tree to kill: a hit sets
//! the flag the guest's epoch callback checks, so it stops within one epoch tick of the watcher
//! seeing the hit, and the invocation ends `limit_exceeded` naming the quota. What it wrote stays.
//! No rlimit can cap one file here (the guest's writes are the host process's), so between two
//! walks (every 200 ms or more) the guest may write past the quota; the invocation's end measures
//! once more, so the overshoot is always reported.
//!
//! The watcher lives as long as the agent (a spawn): its baseline is taken when the agent starts,
//! and once a quota is passed every later invocation stops at its first epoch.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::Result;
use crate::limits::QuotaHit;
use crate::sink::EventSink;
use crate::spec::AgentSpec;

/// The quotas of one WASM agent, as applied.
pub(super) struct WriteGuard {
    /// Set by the watcher at a hit; the guest's epoch callback checks it.
    stop: Arc<AtomicBool>,
    #[cfg(target_os = "linux")]
    watch: Option<crate::native::disk_quota::DiskWatch>,
    /// The start report's `disk_bytes` and `files`.
    report: Value,
}

impl WriteGuard {
    /// Starts watching what `spec` may write (nothing when it may write nothing) and takes the
    /// baseline now, before any guest runs.
    ///
    /// # Errors
    /// A quota that does not parse; the watcher cannot start (fail closed).
    pub(super) fn start(spec: &AgentSpec, sink: &Arc<dyn EventSink>) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        #[cfg(target_os = "linux")]
        {
            use crate::native::disk_quota::{plan, WatchCfg};
            let planned = plan(WatchCfg::wasm(spec, Arc::clone(&stop), sink))?;
            if let Some(w) = &planned.watch {
                w.baseline_now();
            }
            Ok(Self {
                stop,
                watch: planned.watch,
                report: planned.report,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = sink;
            let (bytes, files) = spec.write_quota.resolve()?;
            let none = |v| {
                crate::limits::Applied::new(v, "none")
                    .with_note("write quotas are measured on Linux only")
            };
            Ok(Self {
                stop,
                report: json!({"disk_bytes": none(bytes), "files": none(files)}),
            })
        }
    }

    /// The flag a hit sets, for the guest's epoch callback.
    pub(super) fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Measures now (the invocation is ending): the hit, if the agent is over a quota now or
    /// was before.
    pub(super) fn check_now(&self) -> Option<QuotaHit> {
        #[cfg(target_os = "linux")]
        {
            self.watch
                .as_ref()
                .and_then(crate::native::disk_quota::DiskWatch::check_now)
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    /// `limits` with the start report's `disk_bytes` and `files` added.
    pub(super) fn with_limits(&self, limits: &impl serde::Serialize) -> Value {
        let mut v = serde_json::to_value(limits).unwrap_or_else(|_| json!({}));
        if let (Some(all), Some(ours)) = (v.as_object_mut(), self.report.as_object()) {
            all.extend(ours.clone());
        }
        v
    }
}
