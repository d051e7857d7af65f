//! Discovery in the project and the user's config dir, entry resolution, registration events.

use std::ffi::OsString;
use std::path::PathBuf;

use metash_policy::{AgentDirs, Registry, Source};

use super::common::{manifest_with, Project, SEED};

fn registered(p: &Project) -> usize {
    p.kinds()
        .iter()
        .filter(|k| *k == "agent_registered")
        .count()
}

#[test]
fn discovers_project_and_user_agents_and_resolves_entry() {
    let p = Project::new();
    let m = p.add_agent("claude", SEED);
    p.add_user_agent("helper", &manifest_with(&["codegen"], "wasm"));
    let reg = Registry::discover(&p.dirs());
    let ids: Vec<_> = reg.agents().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["claude", "helper"]);
    let c = reg.get("claude").unwrap();
    assert_eq!(c.source, Source::Project);
    assert_eq!(c.manifest_path, m);
    assert_eq!(c.entry_path, m.parent().unwrap().join("claude_agent.wasm"));
    assert_eq!(reg.get("helper").unwrap().source, Source::User);
    let declared: Vec<String> = c.declared.iter().map(|c| c.to_string()).collect();
    assert!(
        declared.contains(&"oauth:github.repo".to_string()),
        "{declared:?}"
    );
}

#[test]
fn a_project_agent_shadows_a_user_agent_of_the_same_id() {
    let p = Project::new();
    p.add_agent("a", &manifest_with(&["codegen"], "wasm"));
    p.add_user_agent("a", &manifest_with(&["network"], "wasm"));
    let reg = Registry::discover(&p.dirs());
    let a = reg.get("a").unwrap();
    assert_eq!(a.source, Source::Project);
    assert_eq!(a.manifest.capabilities, ["codegen"]);
}

#[test]
fn invalid_manifests_are_listed_not_fatal() {
    let p = Project::new();
    p.add_agent("good", SEED);
    let bad = p.add_agent("bad", "name = 1\n");
    let reg = Registry::discover(&p.dirs());
    assert!(reg.get("good").is_some());
    assert_eq!(reg.invalid().len(), 1);
    assert_eq!(reg.invalid()[0].manifest_path, bad);
    assert!(
        reg.invalid()[0]
            .error
            .contains(&format!("{}:1:8: field `name`", bad.display())),
        "{}",
        reg.invalid()[0].error
    );
}

#[test]
fn registration_is_recorded_once_per_new_or_changed_manifest() {
    let p = Project::new();
    let m = p.add_agent("claude", SEED);
    let store = p.store();
    assert_eq!(
        Registry::discover(&p.dirs()).record(&store).unwrap(),
        ["claude"]
    );
    assert!(Registry::discover(&p.dirs())
        .record(&store)
        .unwrap()
        .is_empty());
    assert_eq!(registered(&p), 1);
    std::fs::write(&m, SEED.replace("0.1.0", "0.2.0")).unwrap();
    assert_eq!(
        Registry::discover(&p.dirs()).record(&store).unwrap(),
        ["claude"]
    );
    assert_eq!(registered(&p), 2);
    let last = store.log().read_all().unwrap().pop().unwrap();
    assert_eq!(last.agent.as_deref(), Some("claude"));
    assert_eq!(last.data["version"], "0.2.0");
    assert_eq!(last.data["sandbox"], "wasm");
}

#[test]
fn xdg_config_home_then_home() {
    let ws = PathBuf::from("/w");
    let env = |pairs: Vec<(&'static str, &'static str)>| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    };
    let d = AgentDirs::from_env(&ws, env(vec![("XDG_CONFIG_HOME", "/x"), ("HOME", "/h")]));
    assert_eq!(d.user, Some(PathBuf::from("/x/metash/agents")));
    assert_eq!(d.project, PathBuf::from("/w/.meta/agents"));
    let d = AgentDirs::from_env(
        &ws,
        env(vec![("XDG_CONFIG_HOME", "relative"), ("HOME", "/h")]),
    );
    assert_eq!(d.user, Some(PathBuf::from("/h/.config/metash/agents")));
    let d = AgentDirs::from_env(&ws, env(vec![]));
    assert_eq!(d.user, None);
}
