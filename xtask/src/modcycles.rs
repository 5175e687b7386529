//! No import cycle between the modules of a crate, checked: every file under `src/` (the
//! crate root and `src/bin/` excepted) is a module, and a path in its code (`crate::a::b`,
//! `super::x`, `self::x`, `use child::x`) makes it depend on the deepest module the path
//! names. The modules must form no cycle (docs/architecture.md, "One-way modules"). Test code
//! (`#[cfg(test)]` items) does not count. Inherent methods (`impl T` in another file) are
//! not imports: a call to one is not an edge here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::util::{XtaskError, workspace_root};

/// The crates whose modules must form no cycle.
pub const CHECKED: &[&str] = &["connectx"];

/// Returns one message per cycle (the modules of one strongly connected component), and the
/// number of modules and edges seen.
pub fn check() -> Result<(Vec<String>, usize, usize), XtaskError> {
    let mut problems = Vec::new();
    let (mut modules, mut edges) = (0, 0);
    for krate in CHECKED {
        let src = workspace_root().join(krate).join("src");
        let files = sources(&src)?;
        let graph = graph(&files);
        modules += graph.len();
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        for cycle in cycles(&graph) {
            problems.push(format!(
                "{krate}: modules import each other in a cycle: {}",
                cycle.join(", ")
            ));
        }
    }
    Ok((problems, modules, edges))
}

/// The module path (`a::b`) and text of every `.rs` file under `src`, but the crate root and
/// `bin/`.
fn sources(src: &Path) -> Result<Vec<(String, String)>, XtaskError> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| io_error(&dir, e))?;
        for entry in entries {
            let path = entry.map_err(|e| io_error(&dir, e))?.path();
            let rel = path.strip_prefix(src).unwrap_or(&path);
            if path.is_dir() {
                if rel != Path::new("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || rel == Path::new("lib.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
            out.push((module_of(rel), text));
        }
    }
    Ok(out)
}

fn io_error(path: &Path, e: std::io::Error) -> XtaskError {
    XtaskError::Other(format!("{}: {e}", path.display()))
}

/// `engine/mod.rs` -> `engine`, `engine/poll.rs` -> `engine::poll`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The import graph of `files` (module path, source text): module -> the modules it names.
fn graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<&str> = files.iter().map(|(m, _)| m.as_str()).collect();
    let mut g = BTreeMap::new();
    for (module, text) in files {
        let here: Vec<&str> = module.split("::").collect();
        let mut deps = BTreeSet::new();
        for path in paths(&code_only(text)) {
            let full: Vec<&str> = match path.first().copied() {
                Some("crate") => path[1..].to_vec(),
                Some("super") => {
                    // `super` of `a::b` is `a` (the file's parent module), repeated.
                    let ups = path.iter().take_while(|s| **s == "super").count();
                    let base = here.len().saturating_sub(ups);
                    here[..base].iter().chain(&path[ups..]).copied().collect()
                }
                Some("self") => here.iter().chain(&path[1..]).copied().collect(),
                // `use child::x` (a module declared in this file).
                Some(_) => here.iter().chain(&path[..]).copied().collect(),
                None => continue,
            };
            // The deepest module the path names (the rest is an item in it).
            let target = (1..=full.len())
                .rev()
                .map(|n| full[..n].join("::"))
                .find(|m| known.contains(m.as_str()));
            if let Some(t) = target
                && t != *module
            {
                deps.insert(t);
            }
        }
        g.insert(module.clone(), deps);
    }
    g
}

/// `text` without comments, string and character literals, and `#[cfg(test)]` items.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
                && (i == 0 || !is_ident(b[i - 1])) =>
            {
                // A raw string r"..." or r#"..."#.
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                let open = i + 1 + hashes;
                if b.get(open) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                i = open + 1;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A character literal ('x', '\n', '\''), or a lifetime ('a), kept.
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else if let Some(len) = text[i + 1..].chars().next().map(char::len_utf8)
                    && b.get(i + 1 + len) == Some(&b'\'')
                {
                    i += len + 2;
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
            _ => {
                let c = text[i..].chars().next().unwrap_or(' ');
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    strip_test_items(&out)
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `code` without the items that follow a `#[cfg(test)]` (up to their `;` or balanced `}`).
fn strip_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Every path in `code` that starts with `crate`, `super` or `self`, or follows `use`, with
/// the groups of a `use` tree (`crate::{a, b::{c, d}}`) expanded.
fn paths(code: &str) -> Vec<Vec<&str>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        let word = &code[start..i];
        let after_use = word == "use";
        if after_use {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            let first = &code[s..i];
            if first.is_empty() || ["std", "core", "alloc"].contains(&first) {
                continue;
            }
            i = tree(code, s, Vec::new(), &mut out);
        } else if ["crate", "super", "self"].contains(&word) && code[i..].starts_with("::") {
            i = tree(code, start, Vec::new(), &mut out);
        }
    }
    out
}

/// Reads the path (or `use` tree) at `at` with prefix `prefix` into `out`; returns the index
/// after it.
fn tree<'a>(
    code: &'a str,
    mut at: usize,
    mut prefix: Vec<&'a str>,
    out: &mut Vec<Vec<&'a str>>,
) -> usize {
    let b = code.as_bytes();
    loop {
        while at < b.len() && b[at].is_ascii_whitespace() {
            at += 1;
        }
        if b.get(at) == Some(&b'{') {
            at += 1;
            loop {
                at = tree(code, at, prefix.clone(), out);
                while at < b.len() && b[at].is_ascii_whitespace() {
                    at += 1;
                }
                match b.get(at) {
                    Some(b',') => at += 1,
                    Some(b'}') => return at + 1,
                    _ => return at,
                }
                while at < b.len() && b[at].is_ascii_whitespace() {
                    at += 1;
                }
                if b.get(at) == Some(&b'}') {
                    return at + 1;
                }
            }
        }
        let s = at;
        while at < b.len() && is_ident(b[at]) {
            at += 1;
        }
        if at == s {
            // `*` or the end of the path.
            if !prefix.is_empty() {
                out.push(prefix);
            }
            return at;
        }
        prefix.push(&code[s..at]);
        if code[at..].starts_with("::") {
            at += 2;
        } else {
            out.push(prefix);
            return at;
        }
    }
}

/// The strongly connected components of `g` with more than one module (Tarjan), each sorted.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.found.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(m, t)| (m.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn paths_of_every_form_are_edges() {
        let g = graph(&files(&[
            ("a", "use crate::{b::{X, Y}, c};\nfn f() { crate::d::g(); }"),
            ("b", "use super::e::Z;"),
            ("c", "use self::inner::W;"),
            ("c::inner", "pub struct W;"),
            ("d", "mod k; use k::V;"),
            ("d::k", "fn h(x: crate::e::Z) {}"),
            ("e", "pub struct Z;"),
        ]));
        let deps = |m: &str| g[m].iter().cloned().collect::<Vec<_>>();
        assert_eq!(deps("a"), ["b", "c", "d"]);
        assert_eq!(deps("b"), ["e"]);
        assert_eq!(deps("c"), ["c::inner"]);
        assert_eq!(deps("d"), ["d::k"]);
        assert_eq!(deps("d::k"), ["e"]);
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn comments_strings_and_tests_are_not_edges() {
        let g = graph(&files(&[
            (
                "a",
                "// crate::b::x\n/* crate::b::y */ const S: &str = \"crate::b::z\";\nconst C: char = '\"';\nfn f<'a>(x: &'a u8) {}\nconst R: &str = r#\"crate::b\"#;\n#[cfg(test)]\nmod tests { use crate::b::T; }\nuse crate::c::D;",
            ),
            ("b", "use crate::a::E;"),
            ("c", ""),
        ]));
        assert_eq!(g["a"].iter().collect::<Vec<_>>(), ["c"]);
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn a_cycle_is_found_with_all_its_modules() {
        let g = graph(&files(&[
            ("a", "use crate::b::X;"),
            ("b", "fn f() { crate::c::g() }"),
            ("c", "use crate::a::Y;"),
            ("d", "use crate::a::Y;"),
            ("e::f", "use super::g::Z;"),
            ("e::g", "use crate::e::f::W;"),
        ]));
        let found = cycles(&g);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&vec!["a".to_string(), "b".into(), "c".into()]));
        assert!(found.contains(&vec!["e::f".to_string(), "e::g".into()]));
    }

    /// The real tree: this test fails as soon as a change brings an import cycle back.
    #[test]
    fn connectx_modules_form_no_cycle() {
        let (problems, modules, edges) = check().expect("sources readable");
        assert!(problems.is_empty(), "{problems:#?}");
        assert!(
            modules > 30 && edges > 100,
            "{modules} modules, {edges} edges"
        );
    }
}
