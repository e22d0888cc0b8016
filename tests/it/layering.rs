//! The map in `src/lib.rs` stays true: its table lists the modules of the library from the
//! bottom up, and a module may use only the modules above it. Read from the source text: every
//! `crate::<module>` path and every `use crate::{…}` group outside a `#[cfg(test)]` module.
//!
//! And every NATS subject comes from `binding` (the space's tree and the broker's own
//! subjects) or `protocol` (the spec's grammar, §3): no subject literal anywhere else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The modules in the order of `lib.rs`'s table.
fn layers(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! | [`"))
        .filter_map(|rest| rest.split_once('`').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The modules `lib.rs` declares.
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';').to_owned())
        .collect()
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src/")
        .map(|e| e.expect("a src/ entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// A source file's text up to its `#[cfg(test)]` module (the tests that follow are not the
/// library).
fn outside_tests(text: &str) -> &str {
    text.split("\n#[cfg(test)]\nmod ")
        .next()
        .unwrap_or_default()
}

/// Every module named by a `crate::` path in `text`.
fn uses(text: &str) -> Vec<String> {
    let mut used = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::{c, d}}`: the first name of each top-level item.
            let (mut depth, mut item_start) = (0usize, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        used.push(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            used.push(ident(rest));
        }
    }
    used.retain(|m| !m.is_empty());
    used
}

/// `(file, module, used module)` for every use that points down the table.
fn downward_uses(src: &Path) -> Vec<(String, String, String)> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read src/lib.rs");
    let rank: BTreeMap<String, usize> = layers(&lib)
        .into_iter()
        .enumerate()
        .map(|(i, m)| (m, i))
        .collect();
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src/");
        let first = relative.components().next().expect("a path");
        let module = first.as_os_str().to_string_lossy();
        let module = module.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let code = outside_tests(&text);
        let own = *rank
            .get(&module)
            .unwrap_or_else(|| panic!("`{module}` is missing from lib.rs's table"));
        for used in uses(code) {
            if used == module {
                continue;
            }
            let theirs = *rank.get(&used).unwrap_or_else(|| {
                panic!(
                    "{}: `crate::{used}` is not in lib.rs's table",
                    file.display()
                )
            });
            if theirs > own {
                found.push((relative.display().to_string(), module.clone(), used));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn every_module_uses_only_those_above_it_in_lib_rs_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read src/lib.rs");
    let mut table = layers(&lib);
    let mut modules = declared(&lib);
    assert!(table.len() > 10, "lib.rs's table was not found: {table:?}");
    table.sort();
    modules.sort();
    assert_eq!(
        table, modules,
        "lib.rs's table and its `pub mod` lines differ"
    );

    let downward = downward_uses(&src);
    let said: Vec<String> = downward
        .iter()
        .map(|(file, module, used)| {
            format!("src/{file}: `{module}` uses `{used}`, listed below it")
        })
        .collect();
    assert!(
        said.is_empty(),
        "uses against lib.rs's layering:\n{}",
        said.join("\n")
    );
}

#[test]
fn the_reader_finds_grouped_and_nested_uses() {
    let text = "use crate::{binding::{self, Creds}, ops};\nfn f() { crate::space::Space::new(); }";
    assert_eq!(uses(text), ["binding", "ops", "space"]);
}

/// What starts a NATS subject in a string literal: the space's tree, the broker's own
/// namespaces, a reply inbox; and the kinds of §3 in a `format!`.
const SUBJECT_STARTS: [&str; 5] = ["\"cotal.", "\"$JS.", "\"$SYS.", "\"$KV.", "\"_INBOX_"];
const SUBJECT_KINDS: [&str; 5] = [".chat.", ".inst.", ".svc.", ".ctl.", ".backstop."];

/// `file:line: text` of every subject literal outside `binding` and `protocol`.
fn subject_literals(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src/");
        if relative.starts_with("binding") || relative.starts_with("protocol") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for (n, line) in outside_tests(&text).lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let literal = SUBJECT_STARTS.iter().any(|s| code.contains(s));
            let formatted =
                code.contains("format!(\"") && SUBJECT_KINDS.iter().any(|k| code.contains(k));
            if literal || formatted {
                found.push(format!("src/{}:{}: {code}", relative.display(), n + 1));
            }
        }
    }
    found
}

#[test]
fn every_subject_comes_from_binding() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = subject_literals(&src);
    assert!(
        found.is_empty(),
        "subjects built outside binding (add them to binding::SpaceNames or binding::system):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_subject_literal_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("services")).unwrap();
    std::fs::write(
        dir.path().join("services/x.rs"),
        "fn f(a: &str) -> String {\n    format!(\"$SYS.REQ.ACCOUNT.{a}.CONNZ\")\n}\n\
         #[cfg(test)]\nmod tests {\n    const T: &str = \"cotal.main.chat.x\";\n}\n",
    )
    .unwrap();
    let found = subject_literals(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("src/services/x.rs:2:"), "{found:?}");
}
