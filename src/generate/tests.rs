//! The man pages' own promises: `dlock.toml(5)` names every key the config file accepts and
//! its example is a valid config file; the exit-status table is read whole from `TABLE`.

use super::*;
use crate::config::FileConfig;

/// The top-level keys the config file accepts, as its parser lists them for an unknown one.
fn accepted_keys() -> Vec<String> {
    let tables: Vec<&str> = crate::backend::config_tables().collect();
    let err =
        FileConfig::parse("no_such_key = 1\n", &tables).expect_err("an unknown key is refused");
    let expected = err
        .split("expected one of")
        .nth(1)
        .unwrap_or_else(|| panic!("the parser does not list the keys: {err}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_config_page_names_every_key_and_table() {
    let keys = accepted_keys();
    assert!(keys.len() >= 10, "{keys:?}");
    let page = pages::config_file();
    for key in &keys {
        let documented = pages::CONFIG_KEYS
            .iter()
            .any(|(item, _)| item.starts_with(&format!("{key} =")));
        assert!(documented, "dlock.toml(5) does not describe the key {key}");
    }
    for (item, _) in pages::CONFIG_KEYS {
        let key = item.split(' ').next().unwrap_or_default();
        assert!(
            keys.iter().any(|k| k == key),
            "dlock.toml(5) describes {key}, which the config file does not accept"
        );
    }
    for table in crate::backend::config_tables() {
        assert!(
            page.contains(&format!("[{}]", roff(table))),
            "dlock.toml(5) does not name the table [{table}]"
        );
    }
}

#[test]
fn the_config_page_example_is_a_valid_config_file() {
    let tables: Vec<&str> = crate::backend::config_tables().collect();
    let parsed = FileConfig::parse(pages::CONFIG_EXAMPLE, &tables);
    assert!(parsed.is_ok(), "{:?}", parsed.err());
}

#[test]
fn the_exit_status_table_is_read_whole() {
    let rows = exit_statuses(crate::exit::TABLE);
    let statuses: Vec<&str> = rows.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        statuses,
        ["N", "128+S", "75", "124", "64", "69", "70", "73", "77", "78", "126", "127", "128+N"]
    );
    assert!(rows.iter().all(|(_, meaning)| !meaning.is_empty()));
}

#[test]
fn roff_protects_control_characters_and_escapes() {
    assert_eq!(roff("a-b\\c"), "a\\-b\\ec");
    assert_eq!(roff(".x\n'y"), "\\&.x\n\\&'y");
}
