//! Streamed answers in OpenAI's wire formats for [`crate::anthropic::ModelServer`] (which serves
//! whatever SSE body it is given): the Responses API (Codex) and chat completions (pi).

use serde_json::{json, Value};

fn event(out: &mut String, data: Value) {
    let name = data["type"].as_str().unwrap_or("").to_string();
    out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
}

fn completed(out: &mut String, id: &str) {
    completed_with(out, id, 5);
}

fn completed_with(out: &mut String, id: &str, output_tokens: u64) {
    event(
        out,
        json!({"type":"response.completed","response":{"id":id,"object":"response","status":"completed","output":[],"usage":{"input_tokens":13,"input_tokens_details":{"cached_tokens":0},"output_tokens":output_tokens,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":13 + output_tokens}}}),
    );
}

/// A Responses stream with one assistant message.
pub fn responses_text(text: &str) -> String {
    let mut s = String::new();
    event(
        &mut s,
        json!({"type":"response.created","response":{"id":"resp_t","object":"response","status":"in_progress","output":[]}}),
    );
    event(
        &mut s,
        json!({"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}),
    );
    event(
        &mut s,
        json!({"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":text}),
    );
    event(
        &mut s,
        json!({"type":"response.output_item.done","output_index":0,"item":{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":text,"annotations":[]}]}}),
    );
    completed(&mut s, "resp_t");
    s
}

/// A Responses stream with one function call (`args` is the JSON text of its arguments).
pub fn responses_function_call(call_id: &str, name: &str, args: &str) -> String {
    responses_function_call_with(call_id, name, args, 5)
}

/// [`responses_function_call`] reporting `output_tokens` of usage.
pub fn responses_function_call_with(
    call_id: &str,
    name: &str,
    args: &str,
    output_tokens: u64,
) -> String {
    let mut s = String::new();
    event(
        &mut s,
        json!({"type":"response.created","response":{"id":"resp_f","object":"response","status":"in_progress","output":[]}}),
    );
    event(
        &mut s,
        json!({"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","status":"in_progress","call_id":call_id,"name":name,"arguments":""}}),
    );
    event(
        &mut s,
        json!({"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":args}),
    );
    event(
        &mut s,
        json!({"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc_1","status":"completed","call_id":call_id,"name":name,"arguments":args}}),
    );
    completed_with(&mut s, "resp_f", output_tokens);
    s
}

fn chunk(out: &mut String, delta: Value, finish: Option<&str>) {
    let c = json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1_700_000_000,"model":"test-model","choices":[{"index":0,"delta":delta,"finish_reason":finish}]});
    out.push_str(&format!("data: {c}\n\n"));
}

fn chat_end(out: &mut String) {
    chat_end_with(out, 4);
}

fn chat_end_with(out: &mut String, completion_tokens: u64) {
    let u = json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1_700_000_000,"model":"test-model","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":completion_tokens,"total_tokens":9 + completion_tokens}});
    out.push_str(&format!("data: {u}\n\ndata: [DONE]\n\n"));
}

/// A chat-completions stream with one assistant message.
pub fn chat_text(text: &str) -> String {
    let mut s = String::new();
    chunk(&mut s, json!({"role":"assistant","content":""}), None);
    chunk(&mut s, json!({"content":text}), None);
    chunk(&mut s, json!({}), Some("stop"));
    chat_end(&mut s);
    s
}

/// A chat-completions stream with one tool call.
pub fn chat_tool_call(id: &str, name: &str, args: &str) -> String {
    chat_tool_call_with(id, name, args, 4)
}

/// [`chat_tool_call`] reporting `completion_tokens` of usage.
pub fn chat_tool_call_with(id: &str, name: &str, args: &str, completion_tokens: u64) -> String {
    let mut s = String::new();
    chunk(
        &mut s,
        json!({"role":"assistant","content":null,"tool_calls":[{"index":0,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}),
        None,
    );
    chunk(
        &mut s,
        json!({"tool_calls":[{"index":0,"function":{"arguments":args}}]}),
        None,
    );
    chunk(&mut s, json!({}), Some("tool_calls"));
    chat_end_with(&mut s, completion_tokens);
    s
}

/// The names of the tools a request offers (Responses, chat completions or Anthropic).
pub fn offered_tools(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    t["name"]
                        .as_str()
                        .or_else(|| t["function"]["name"].as_str())
                })
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}
