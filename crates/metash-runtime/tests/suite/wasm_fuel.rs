//! Fuel: a deterministic bound on a WASM guest's work (`AgentSpec::fuel`), next to the wall-clock
//! deadline. A spinning guest with fuel ends `limit_exceeded: fuel` long before its deadline; the
//! same guest without fuel runs until the deadline.

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_runtime::InvocationStatus;

use super::common::*;

const FUEL: u64 = 1_000_000;

#[test]
fn wasm_fuel_stops_a_spinning_guest_before_its_deadline() {
    let f = Fixture::new();
    let mut spec = f.wasm("fuel-spin", &wat_spin(), &[], None);
    spec.timeout = Duration::from_secs(60);
    spec.fuel = Some(FUEL);
    let mut a = f.start(spec);
    let started = &f.events("fuel-spin", LogKind::AgentStarted)[0].data;
    assert_eq!(started["limits"]["fuel"]["value"], FUEL, "{started}");
    assert_eq!(started["limits"]["fuel"]["via"], "wasm-fuel");
    for _ in 0..2 {
        // Every invocation gets the full amount again.
        let t = Instant::now();
        let (o, _) = run(&mut a, "go");
        assert_eq!(
            o.status,
            InvocationStatus::LimitExceeded {
                limit: "fuel".into()
            },
            "{o:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
    let limits = f.events("fuel-spin", LogKind::LimitExceeded);
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert_eq!(limits[0].data["limit"], "fuel");
    assert_eq!(limits[0].data["via"], "wasm-fuel");
    assert_eq!(limits[0].data["max"], FUEL);
    assert!(f.events("fuel-spin", LogKind::AgentTimeout).is_empty());
}

#[test]
fn wasm_without_fuel_spins_until_its_deadline() {
    let f = Fixture::new();
    let mut spec = f.wasm("nofuel-spin", &wat_spin(), &[], None);
    spec.timeout = Duration::from_millis(500);
    let mut a = f.start(spec);
    let started = &f.events("nofuel-spin", LogKind::AgentStarted)[0].data;
    assert!(started["limits"]["fuel"].is_null(), "{started}");
    let t = Instant::now();
    let (o, _) = run(&mut a, "go");
    assert_eq!(o.status, InvocationStatus::Timeout, "{o:?}");
    assert!(t.elapsed() >= Duration::from_millis(500));
    assert!(f.events("nofuel-spin", LogKind::LimitExceeded).is_empty());
}

#[test]
fn wasm_fuel_is_enough_for_a_quick_guest() {
    let f = Fixture::new();
    let mut spec = f.wasm("fuel-echo", &wat_echo(), &[], None);
    spec.fuel = Some(FUEL);
    let mut a = f.start(spec);
    let (o, ev) = run(&mut a, "go");
    assert!(matches!(o.status, InvocationStatus::Done { .. }), "{o:?}");
    assert_eq!(text(&ev), "OK");
    // The same file on the default engine is a separate cache entry (the engine hash differs).
    let mut a = f.start(f.wasm("fuel-echo-plain", &wat_echo(), &[], None));
    let (o, _) = run(&mut a, "go");
    assert!(matches!(o.status, InvocationStatus::Done { .. }), "{o:?}");
    let cached = std::fs::read_dir(f.dir.path().join("cache"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
        .count();
    assert_eq!(cached, 2, "one entry per engine");
}
