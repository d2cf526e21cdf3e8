//! The shape of the house: import circles between the modules of a crate.
//!
//! A module is a source file (`lib.rs`/`main.rs` the crate root, `a/mod.rs` or `a.rs` the module
//! `a`). Module A depends on module B when A's own code names something of B: a `use` of it, or
//! a path through it (`crate::b::f()`, `super::T`, a child's `child::f()`), in code or inside a
//! macro's arguments. Re-exports (`pub use`, `pub(crate) use`) hand names on and are not
//! dependencies; a `mod b;` declaration is not one either; `#[cfg(test)]` modules are not part
//! of the house. A circle is a set of two or more modules that depend on each other.
//!
//! Why our own: `cargo modules dependencies --acyclic` checks the item graph (a type and its own
//! method already make a cycle) and takes minutes per crate on a small machine; `cargo-cycles`
//! counts `mod` declarations as imports, so every child's `use super::X` is a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// One dependency of a module on another, where it is written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub file: PathBuf,
    pub line: usize,
}

/// The modules of one crate and their dependencies.
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Module path (`""` for the root, `a::b`) → its file.
    pub modules: BTreeMap<String, PathBuf>,
    pub edges: Vec<Edge>,
}

impl ModuleGraph {
    /// Reads the crate whose root file is `root` (`src/lib.rs` or `src/main.rs`), following its
    /// `mod` declarations. A file that does not parse is an error naming it.
    pub fn read(root: &Path) -> Result<Self, String> {
        let mut graph = ModuleGraph::default();
        let mut files = Vec::new();
        collect(root, String::new(), true, &mut graph.modules, &mut files)?;
        for (module, file, syntax) in files {
            let mut seen = Seen::default();
            seen.visit_file(&syntax);
            for (path, line) in seen.paths {
                if let Some(to) = resolve(&graph.modules, &module, &path) {
                    if to != module {
                        graph.edges.push(Edge {
                            from: module.clone(),
                            to,
                            file: file.clone(),
                            line,
                        });
                    }
                }
            }
        }
        graph.edges.sort();
        graph
            .edges
            .dedup_by(|a, b| a.from == b.from && a.to == b.to);
        Ok(graph)
    }

    /// Every circle (modules that depend on each other), each in name order, with the edges
    /// that tie it.
    pub fn circles(&self) -> Vec<(Vec<String>, Vec<Edge>)> {
        let names: Vec<&String> = self.modules.keys().collect();
        let index: BTreeMap<&String, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        for e in &self.edges {
            next[index[&e.from]].push(index[&e.to]);
        }
        strongly_connected(&next)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let members: BTreeSet<String> = c.iter().map(|&i| names[i].clone()).collect();
                let ties = self
                    .edges
                    .iter()
                    .filter(|e| members.contains(&e.from) && members.contains(&e.to))
                    .cloned()
                    .collect();
                (members.into_iter().collect(), ties)
            })
            .collect()
    }
}

type Parsed = (String, PathBuf, syn::File);

/// Reads `file` as module `module` and, through its `mod` declarations, its children.
fn collect(
    file: &Path,
    module: String,
    owns_dir: bool,
    modules: &mut BTreeMap<String, PathBuf>,
    files: &mut Vec<Parsed>,
) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let syntax = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    modules.insert(module.clone(), file.to_path_buf());
    // Children live beside a root or `mod.rs`, and in a folder named after any other file.
    let dir = if owns_dir {
        file.parent().expect("a file has a folder").to_path_buf()
    } else {
        file.with_extension("")
    };
    for item in &syntax.items {
        let syn::Item::Mod(m) = item else { continue };
        if m.content.is_some() || is_test(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let child = if module.is_empty() {
            name.clone()
        } else {
            format!("{module}::{name}")
        };
        let flat = dir.join(format!("{name}.rs"));
        let nested = dir.join(&name).join("mod.rs");
        match (flat.exists(), nested.exists()) {
            (true, _) => collect(&flat, child, false, modules, files)?,
            (false, true) => collect(&nested, child, true, modules, files)?,
            (false, false) => return Err(format!("{}: no file for `mod {name}`", file.display())),
        }
    }
    files.push((module, file.to_path_buf(), syntax));
    Ok(())
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().split_whitespace().any(|t| t == "test"))
    })
}

/// The paths a module's own code names (segments, and the line they are on).
#[derive(Default)]
struct Seen {
    paths: Vec<(Vec<String>, usize)>,
}

impl<'ast> Visit<'ast> for Seen {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        // A re-export hands a name on; it is not a dependency of this module's code.
        if matches!(u.vis, syn::Visibility::Inherited) {
            let line = u.use_token.span.start().line;
            use_paths(&u.tree, &mut Vec::new(), line, &mut self.paths);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.paths.push((segments, line));
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        token_paths(m.tokens.clone(), &mut self.paths);
        syn::visit::visit_macro(self, m);
    }
}

fn use_paths(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    line: usize,
    out: &mut Vec<(Vec<String>, usize)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, line, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push((path, line));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push((path, line));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), line)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, line, out);
            }
        }
    }
}

/// Paths written in a macro's tokens: runs of `ident :: ident …` (the macro is not expanded).
fn token_paths(tokens: TokenStream, out: &mut Vec<(Vec<String>, usize)>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => token_paths(g.stream(), out),
            TokenTree::Ident(first) => {
                let mut path = vec![first.to_string()];
                let line = first.span().start().line;
                let mut j = i + 1;
                while j + 2 < tokens.len() && is_colons(&tokens[j], &tokens[j + 1]) {
                    match &tokens[j + 2] {
                        TokenTree::Ident(next) => path.push(next.to_string()),
                        _ => break,
                    }
                    j += 3;
                }
                if path.len() > 1 {
                    out.push((path, line));
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

fn is_colons(a: &TokenTree, b: &TokenTree) -> bool {
    matches!((a, b), (TokenTree::Punct(x), TokenTree::Punct(y)) if x.as_char() == ':' && y.as_char() == ':' && x.spacing() == proc_macro2::Spacing::Joint)
}

/// The module of this crate a path written in `module` reaches through (the longest known
/// prefix), if any.
fn resolve(modules: &BTreeMap<String, PathBuf>, module: &str, path: &[String]) -> Option<String> {
    let mut base: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        // A bare path reaches a module only through a child of this one.
        Some(first) => {
            let child = if module.is_empty() {
                first.to_owned()
            } else {
                format!("{module}::{first}")
            };
            if !modules.contains_key(&child) {
                return None;
            }
        }
        None => return None,
    }
    // `self` (a value), `crate` or `super` alone name no item.
    if rest.is_empty() {
        return None;
    }
    let mut found = None;
    let mut current = base;
    for segment in rest {
        current.push(segment.clone());
        let name = current.join("::");
        if modules.contains_key(&name) {
            found = Some(name);
        } else {
            break;
        }
    }
    // `crate::T`, `self::T` and `super::T` name an item of the module they start from.
    found.or_else(|| {
        let owner = current[..current.len().saturating_sub(1)].join("::");
        modules.contains_key(&owner).then_some(owner)
    })
}

/// Tarjan's strongly connected components of a graph given as adjacency lists.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'g> {
        next: &'g [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.next[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(i) if s.on_stack[w] => s.low[v] = s.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (path, text) under a fresh folder; returns it.
    fn house(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    fn circles(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let dir = house(files);
        let graph = ModuleGraph::read(&dir.path().join("lib.rs")).unwrap();
        graph.circles().into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn a_planted_circle_is_found_with_what_ties_it() {
        let dir = house(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\nfn f() -> crate::c::C { todo!() }\n"),
            ("c.rs", "pub struct C;\nfn g() { let _ = super::a::A; }\n"),
        ]);
        let graph = ModuleGraph::read(&dir.path().join("lib.rs")).unwrap();
        let found = graph.circles();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, ["a", "b", "c"]);
        let ties: Vec<(&str, &str, usize)> = found[0]
            .1
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str(), e.line))
            .collect();
        assert_eq!(ties, [("a", "b", 1), ("b", "c", 2), ("c", "a", 2)]);
    }

    #[test]
    fn paths_in_macros_groups_globs_and_children_count() {
        // Through a macro's arguments.
        assert_eq!(
            circles(&[
                ("lib.rs", "mod a;\nmod b;\n"),
                ("a.rs", "fn f() { tracing::info!(x = ?crate::b::X); }\n"),
                ("b.rs", "use crate::a::*;\npub const X: u8 = 1;\n"),
            ]),
            [["a", "b"]]
        );
        // A group, a child's bare path and its `super`.
        assert_eq!(
            circles(&[
                ("lib.rs", "mod p;\n"),
                ("p/mod.rs", "mod q;\nuse self::{q::Q};\npub struct P;\n"),
                ("p/q.rs", "pub struct Q(super::P);\n"),
            ]),
            [["p", "p::q"]]
        );
        assert_eq!(
            circles(&[
                ("lib.rs", "mod p;\n"),
                ("p/mod.rs", "mod q;\nfn f() { q::g() }\npub struct P;\n"),
                ("p/q.rs", "use super::P;\npub fn g() {}\n"),
            ]),
            [["p", "p::q"]]
        );
    }

    #[test]
    fn re_exports_declarations_and_tests_are_not_dependencies() {
        assert!(circles(&[
            ("lib.rs", "mod p;\n"),
            (
                "p/mod.rs",
                "mod q;\npub use q::Q;\npub(crate) use q::R;\npub struct P;\n\
                 #[cfg(test)]\nmod tests { use super::q::Q; }\n"
            ),
            ("p/q.rs", "use super::P;\npub struct Q(P);\npub struct R;\n"),
        ])
        .is_empty());
        // Another crate's paths and the root's own items are not this crate's modules.
        assert!(circles(&[
            ("lib.rs", "mod a;\npub struct Root;\n"),
            (
                "a.rs",
                "use std::sync::Arc;\nuse crate::Root;\nfn f(_: Arc<Root>) {}\n"
            ),
        ])
        .is_empty());
    }
}
