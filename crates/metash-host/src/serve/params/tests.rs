#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

fn spawn_error(v: Value) -> String {
    decode::<SpawnAgentParams>(&v).unwrap_err().to_string()
}

#[test]
fn errors_name_the_field() {
    assert_eq!(
        spawn_error(json!({"agent_name": 5, "user_message": "x"})),
        "`agent_name` must be a string, got number 5"
    );
    assert_eq!(
        spawn_error(
            json!({"agent_name": "a", "user_message": "x", "options": {"timeout_seconds": "ten"}})
        ),
        "`options.timeout_seconds` must be a number >= 0, got string \"ten\""
    );
    assert_eq!(
        spawn_error(
            json!({"agent_name": "a", "user_message": "x", "options": {"timeout_seconds": -1}})
        ),
        "`options.timeout_seconds` must be a number >= 0, got -1"
    );
    assert_eq!(
        spawn_error(
            json!({"agent_name": "a", "user_message": "x", "options": {"model_hint": "big"}})
        ),
        "`options.model_hint` must be one of \"fast\", \"smart\", got \"big\""
    );
    assert_eq!(
        spawn_error(
            json!({"agent_name": "a", "user_message": "x", "options": {"timeout_seconds": 1e300}})
        ),
        "`options.timeout_seconds` must be at most 2592000 (30 days), got 1e300"
    );
    assert_eq!(
        spawn_error(json!({"agent_name": "a", "user_message": "x", "options": {"budget": 1}})),
        "`options.budget` is not a known parameter (expected one of: model_hint, timeout_seconds, max_tokens, context_refs)"
    );
    assert_eq!(
        spawn_error(json!({"agent_name": " ", "user_message": "x"})),
        "`agent_name` must not be empty"
    );
    assert_eq!(
        spawn_error(json!({"agent_name": "a", "user_message": "x", "options": 3})),
        "`options` must be an object, got number 3"
    );
    let e = decode::<UpdateStateParams>(&json!({"key": "status"})).unwrap_err();
    assert_eq!(e.to_string(), "`value` is required");
    let e = decode::<GetStateParams>(&json!({"kee": "status"})).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`kee` is not a known parameter (expected one of: key)"
    );
    let e = decode::<GetStateParams>(&json!(["status"])).unwrap_err();
    assert_eq!(e.to_string(), "`params` must be an object, got an array");
}

#[test]
fn null_is_a_value_for_update_state_and_absent_for_options() {
    let p: UpdateStateParams = decode(&json!({"key": "variables.x", "value": null})).unwrap();
    assert_eq!(p.value, Value::Null);
    let p: SpawnAgentParams =
        decode(&json!({"agent_name": "a", "user_message": "u", "options": null})).unwrap();
    assert_eq!(p.options, None);
}

#[test]
fn positional_params_map_to_names() {
    let v = positional(UpdateStateParams::NAMES, &[json!("variables.n"), json!(3)]).unwrap();
    let p: UpdateStateParams = decode(&v).unwrap();
    assert_eq!(p.key, "variables.n");
    assert_eq!(p.value, json!(3));
    assert!(positional(GetStateParams::NAMES, &[json!("a"), json!("b")]).is_err());
}

#[test]
fn mcp_decodes_through_the_same_words() {
    let e = serde_json::from_value::<Checked<LogProgressParams>>(
        json!({"message": "m", "level": "loud"}),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("`level` must be one of \"info\", \"warn\", \"error\", got \"loud\""),
        "{e}"
    );
    let Checked(ok) = serde_json::from_value::<Checked<SpawnAgentParams>>(
        json!({"agent_name": "a", "user_message": "u", "options": {"max_tokens": 10, "model_hint": "fast"}}),
    )
    .unwrap();
    assert_eq!(ok.options.unwrap().max_tokens, Some(10));
}

#[test]
fn checked_has_the_schema_of_what_it_wraps() {
    let wrapped = schemars::schema_for!(Checked<UpdateStateParams>);
    let plain = schemars::schema_for!(UpdateStateParams);
    assert_eq!(wrapped, plain);
    assert_eq!(plain.get("additionalProperties"), Some(&json!(false)));
}
