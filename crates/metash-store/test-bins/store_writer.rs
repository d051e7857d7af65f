//! A writer process for the store's concurrency and crash tests (and a small demo of the API):
//!
//! - `metash-store-writer WORKSPACE incr N`: N atomic increments of `variables.counter`
//! - `metash-store-writer WORKSPACE loop`: increments forever, printing `ack V` after each durable update
//! - `metash-store-writer WORKSPACE hold`: takes the store lock, prints `locked`, sleeps until killed

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use metash_store::{Store, StoreError};
use serde_json::{json, Value};

fn incr(store: &Store) -> Result<i64, StoreError> {
    let mut next = 0;
    store.modify_state(None, "variables.counter", |old| {
        next = old.and_then(Value::as_i64).unwrap_or(0) + 1;
        Ok(json!(next))
    })?;
    Ok(next)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(ws), Some(mode)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: metash-store-writer WORKSPACE incr N|loop|hold");
        return ExitCode::from(2);
    };
    let store = match Store::open(Path::new(ws)) {
        Ok(s) => s.with_lock_timeout(std::time::Duration::from_secs(60)),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let result = match mode.as_str() {
        "incr" => {
            let n: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
            (0..n).try_for_each(|_| incr(&store).map(|_| ()))
        }
        "loop" => loop {
            match incr(&store) {
                Ok(v) => {
                    let _ = writeln!(out, "ack {v}");
                    let _ = out.flush();
                }
                Err(e) => break Err(e),
            }
        },
        "hold" => match store.lock() {
            Ok(_guard) => {
                let _ = writeln!(out, "locked");
                let _ = out.flush();
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            Err(e) => Err(e),
        },
        _ => {
            eprintln!("unknown mode {mode}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
