//! The vault's key in a real Secret Service (a Linux desktop's keychain): a private D-Bus
//! session with GNOME Keyring on it, started by the test. Its own test binary, because the
//! Secret Service is found through this process's `DBUS_SESSION_BUS_ADDRESS`.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use metash_auth::{AuthError, KeyOptions, Keychain, KeychainChoice, Vault};
use metash_testkit::secret_service::{prerequisites, SecretService};

const PLANTED: &str = "gho_PLANTEDsecretSERVICEtoken0123456789";

fn keys(keychain: KeychainChoice) -> KeyOptions {
    KeyOptions {
        passphrase: None,
        keychain,
    }
}

fn set_bus(address: &str) {
    // The only test in this binary: no other thread reads the environment meanwhile.
    std::env::set_var("DBUS_SESSION_BUS_ADDRESS", address);
}

/// The token the vault at `path` holds, opened as a new process would.
fn token_in(path: &std::path::Path) -> serde_json::Value {
    let got: serde_json::Value = Vault::open(path, &keys(KeychainChoice::Auto))
        .unwrap()
        .get("oauth:gh")
        .unwrap()
        .unwrap();
    got["access_token"].clone()
}

#[test]
fn a_desktop_vault_keeps_its_key_in_the_secret_service() {
    if let Err(why) = prerequisites() {
        return metash_testkit::skip("secret service vault", &why);
    }
    metash_testkit::join_session_keyring();
    let dir = tempfile::tempdir().unwrap();
    let service = SecretService::start(&dir.path().join("desktop"), "login-password").unwrap();
    set_bus(&service.address);

    // A new vault on a desktop: the key goes to the Secret Service, the file says so.
    let path = dir.path().join("vault.json");
    let mut v = Vault::open(&path, &keys(KeychainChoice::Auto)).unwrap();
    v.update(|e| e.put("oauth:gh", &serde_json::json!({"access_token": PLANTED})))
        .unwrap();
    drop(v);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"keychain\": \"secret_service\""), "{text}");
    assert!(!text.contains(PLANTED), "no token in clear");
    let keyring_file = service.data_home.join("keyrings/login.keyring");
    assert!(keyring_file.is_file(), "the login keyring holds the key");
    assert_eq!(token_in(&path), PLANTED);

    // The key is only there: with the Secret Service gone, the vault does not open, and says
    // where its key was.
    let data = dir.path().join("desktop");
    drop(service);
    match Vault::open(&path, &keys(KeychainChoice::Auto)) {
        Err(AuthError::NoKey(why)) => assert!(why.contains("Secret Service"), "{why}"),
        other => panic!("{:?}", other.map(|v| v.names())),
    }

    // A desktop's keyring outlives a reboot (unlike the kernel keyring): the same keyring files,
    // unlocked again at the next login, give the key back.
    let again = SecretService::start(&data, "login-password").unwrap();
    set_bus(&again.address);
    assert_eq!(token_in(&path), PLANTED);
    drop(again);

    // A session bus with no Secret Service on it: a new vault falls back to the kernel keyring
    // (a keychain still, never plaintext), and asking for the Secret Service alone is an error
    // that says which keychain failed.
    set_bus(&format!(
        "unix:path={}",
        dir.path().join("no-such-bus").display()
    ));
    let only = dir.path().join("only.json");
    match Vault::open(&only, &keys(KeychainChoice::Only(Keychain::SecretService))) {
        Err(AuthError::NoKey(why)) => {
            assert!(
                why.contains("Secret Service") && why.contains("passphrase"),
                "{why}"
            )
        }
        other => panic!("{:?}", other.map(|v| v.names())),
    }
    assert!(!only.exists(), "nothing written");
    let fallback = dir.path().join("fallback.json");
    Vault::open(&fallback, &keys(KeychainChoice::Auto)).unwrap();
    let text = std::fs::read_to_string(&fallback).unwrap();
    assert!(text.contains("\"keychain\": \"kernel_keyring\""), "{text}");
}
