//! WASM agents for tests, written as WAT: a WASI preview-1 command module that writes fixed
//! agent-protocol lines to stdout, so the host and runtime paths run a real module without a
//! wasm32 toolchain.

/// An agent-protocol message: `json` (an object) with the protocol's `schema_version` first.
pub fn agent_msg(json: &str) -> String {
    format!("{{\"schema_version\":\"0.1\",{}", &json[1..])
}

/// A module that writes each of `lines` (plus a newline) to stdout and exits; with `spin`, loops
/// forever after writing them.
pub fn wat_agent(lines: &[&str], spin: bool) -> String {
    let mut data = String::new();
    let mut calls = String::new();
    let mut offset = 64usize;
    for line in lines {
        let bytes = format!("{line}\n");
        let escaped: String = bytes.bytes().map(|b| format!("\\{b:02x}")).collect();
        data.push_str(&format!("(data (i32.const {offset}) \"{escaped}\")\n"));
        calls.push_str(&format!(
            "(i32.store (i32.const 0) (i32.const {offset})) (i32.store (i32.const 4) (i32.const {len}))\n\
             (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))\n",
            len = bytes.len()
        ));
        offset += bytes.len() + 8;
    }
    let tail = if spin { "(loop $l (br $l))" } else { "" };
    format!(
        "(module\n (import \"wasi_snapshot_preview1\" \"fd_write\" (func $fd_write (param i32 i32 i32 i32) (result i32)))\n\
         (memory (export \"memory\") 1)\n{data}(func (export \"_start\")\n{calls}{tail})\n)\n"
    )
}
