//! The vault on its own: the passphrase path everywhere, the OS keychain where the machine has
//! one (the kernel keyring on Linux), the clear error with neither, a wrong key refused, a
//! damaged file named with its line and never overwritten, and no secret byte in clear.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use metash_auth::{AuthError, KeyOptions, Keychain, KeychainChoice, Secret, Vault};

fn pass(p: &str) -> KeyOptions {
    KeyOptions {
        passphrase: Some(Secret::new(p)),
        keychain: KeychainChoice::Off,
    }
}

#[test]
fn a_passphrase_vault_seals_opens_and_refuses_a_wrong_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metash/vault.json");
    let planted = "gho_PLANTEDtokenPLANTEDtoken0123456789";
    {
        let mut v = Vault::open(&path, &pass("right")).unwrap();
        v.update(|e| e.put("oauth:x", &serde_json::json!({"access_token": planted})))
            .unwrap();
    }
    let raw = std::fs::read(&path).unwrap();
    assert!(
        !String::from_utf8_lossy(&raw).contains(planted),
        "no token byte in clear"
    );
    assert!(!raw.windows(planted.len()).any(|w| w == planted.as_bytes()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o700,
            "only its owner enters the vault's directory"
        );
    }
    let v = Vault::open(&path, &pass("right")).unwrap();
    let got: serde_json::Value = v.get("oauth:x").unwrap().unwrap();
    assert_eq!(got["access_token"], planted);
    match Vault::open(&path, &pass("wrong")) {
        Err(AuthError::WrongKey { why, .. }) => assert!(why.contains("passphrase"), "{why}"),
        other => panic!(
            "a wrong passphrase opens nothing: {:?}",
            other.map(|v| v.names())
        ),
    }
    // Without a passphrase, a passphrase vault says what it needs.
    let none = KeyOptions {
        passphrase: None,
        keychain: KeychainChoice::Off,
    };
    let err = Vault::open(&path, &none).err().unwrap().to_string();
    assert!(err.contains("METASH_VAULT_PASSPHRASE"), "{err}");
}

#[test]
fn with_neither_keychain_nor_passphrase_there_is_no_vault_and_the_error_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    let none = KeyOptions {
        passphrase: None,
        keychain: KeychainChoice::Off,
    };
    match Vault::open(&path, &none) {
        Err(AuthError::NoKey(why)) => {
            assert!(
                why.contains("keychain") && why.contains("passphrase"),
                "{why}"
            )
        }
        other => panic!("no silent plaintext vault: {:?}", other.map(|v| v.names())),
    }
    assert!(!path.exists(), "nothing written");
}

#[test]
fn a_damaged_vault_is_named_with_its_line_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    Vault::open(&path, &pass("p")).unwrap();
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.insert_str(text.len() / 2, "\n  oops\n");
    std::fs::write(&path, &text).unwrap();
    match Vault::open(&path, &pass("p")) {
        Err(AuthError::Damaged { path: p, why }) => {
            assert_eq!(p, path);
            assert!(why.contains("line"), "{why}");
        }
        other => panic!("{:?}", other.map(|v| v.names())),
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "never overwritten"
    );
}

/// The OS keychain for real: on Linux the kernel keyring (keyutils), in a session keyring this
/// test joins. A machine that has none (a container whose seccomp profile refuses `keyctl`)
/// fails here: the join asserts.
#[test]
fn the_keychain_holds_the_key_and_the_file_does_not() {
    #[cfg(target_os = "linux")]
    metash_testkit::join_session_keyring();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    let keychain = KeyOptions {
        passphrase: None,
        keychain: KeychainChoice::Only(Keychain::legacy()),
    };
    let mut v = match Vault::open(&path, &keychain) {
        Ok(v) => v,
        Err(AuthError::NoKey(why)) => return metash_testkit::skip("keychain vault", &why),
        Err(e) => panic!("{e}"),
    };
    v.update(|e| e.put("oauth:k", &"sealed under the keychain's key"))
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"source\": \"keychain\""), "{text}");
    #[cfg(target_os = "linux")]
    assert!(text.contains("\"keychain\": \"kernel_keyring\""), "{text}");
    assert!(!text.contains("sealed under"));
    // Opened again (as another process of the session would) with the key from the keychain.
    let again = Vault::open(&path, &keychain).unwrap();
    let got: String = again.get("oauth:k").unwrap().unwrap();
    assert_eq!(got, "sealed under the keychain's key");
    // An entry moved to another name does not open (its name is bound into the seal).
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let sealed = doc["entries"]["oauth:k"].clone();
    doc["entries"]["oauth:other"] = sealed;
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    let moved = Vault::open(&path, &keychain).unwrap();
    assert!(moved.get::<String>("oauth:other").is_err());
}
