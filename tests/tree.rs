//! The tree stays readable (STYLE habit 11): no function in `src/` longer than
//! [`MAX_FN_LINES`] lines, and the repository's text speaks of the project only — no words about
//! who worked on it or when, in text or in file names. Cheap: no GPU, no build of anything.
//!
//! Each scanner is also run on an inline bad sample (the negative controls below), so a scanner
//! that finds nothing because it is broken fails too.

use std::path::{Path, PathBuf};

/// The longest function body allowed, in lines from the `fn` line to its closing brace.
const MAX_FN_LINES: usize = 120;

/// Words that describe how the code came to be rather than what it does (whole words, any case;
/// `_` and `-` separate words, so `x_id` and `x-only` forms are caught too). They are spelt in
/// pieces here so that this file passes its own scan. The last two (the usual name for a small
/// assisting function) are banned with the others: the project's text never needs them (say
/// "function" or name the job), and identifiers are unaffected unless they hold the whole word.
const PROCESS_WORDS: &[&str] = &[
    concat!("ses", "sion"),
    concat!("ses", "sions"),
    concat!("engin", "eer"),
    concat!("engin", "eers"),
    concat!("hel", "per"),
    concat!("hel", "pers"),
];

/// Where the text lives, relative to the crate root.
const TEXT_ROOTS: &[&str] = &[
    "src",
    "tests",
    "shaders",
    "benches",
    "examples",
    "docs",
    "README.md",
    ".ci",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `path` (or `path` itself), sorted; a missing root yields nothing.
fn files_under(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        files_under(&p, out);
    }
}

/// `src` with comments, string and char literals blanked out (newlines kept, so line numbers
/// survive): what is left is code whose braces can be matched.
fn strip(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::with_capacity(c.len());
    let blank = |out: &mut Vec<char>, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |j: usize| c.get(j).copied().unwrap_or('\0');
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= c.len() {
                    break;
                }
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.extend([' ', ' ']);
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.extend([' ', ' ']);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if !ident_before && (at(i) == 'r' || (at(i) == 'b' && at(i + 1) == 'r')) && {
            let s = if at(i) == 'b' { i + 2 } else { i + 1 };
            let mut j = s;
            while at(j) == '#' {
                j += 1;
            }
            at(j) == '"'
        } {
            // Raw string r#"…"#: ends at a quote followed by as many hashes.
            let s = if at(i) == 'b' { i + 2 } else { i + 1 };
            let mut j = s;
            while at(j) == '#' {
                j += 1;
            }
            let hashes = j - s;
            let mut k = j + 1;
            while k < c.len() && !(c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#')) {
                k += 1;
            }
            let end = (k + 1 + hashes).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if at(i) == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                let n = if c[i] == '\\' { 2 } else { 1 };
                for _ in 0..n.min(c.len() - i) {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if at(i) == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{7f}'); a lifetime ('a) has no closing quote.
            let mut k = i + 2;
            while k < c.len() && c[k] != '\'' {
                k += 1;
            }
            for &ch in &c[i..(k + 1).min(c.len())] {
                blank(&mut out, ch);
            }
            i = k + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// `(name, first line, lines)` of every function with a body in `src` (1-based lines, counted
/// from the `fn` line to the closing brace, both included).
fn functions(src: &str) -> Vec<(String, usize, usize)> {
    let code = strip(src);
    let line_of = |pos: usize| 1 + code[..pos].iter().filter(|&&c| c == '\n').count();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 < code.len() {
        let keyword = code[i] == 'f'
            && code[i + 1] == 'n'
            && (i == 0 || !is_ident(code[i - 1]))
            && code[i + 2].is_whitespace();
        if !keyword {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < code.len() && code[j].is_whitespace() {
            j += 1;
        }
        let name: String = code[j..].iter().take_while(|&&c| is_ident(c)).collect();
        if name.is_empty() {
            // `fn(u32) -> u32`, a pointer type.
            i += 2;
            continue;
        }
        // The body starts at the first `{` after the signature; a `;` first means none
        // (outside brackets: `-> [f32; 4]` is a return type).
        let mut k = j + name.len();
        let mut nest = 0i32;
        while k < code.len() && !(nest == 0 && (code[k] == '{' || code[k] == ';')) {
            match code[k] {
                '(' | '[' => nest += 1,
                ')' | ']' => nest -= 1,
                _ => {}
            }
            k += 1;
        }
        if k >= code.len() || code[k] == ';' {
            i = k;
            continue;
        }
        let mut depth = 0usize;
        let mut end = k;
        while end < code.len() {
            match code[end] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        let first = line_of(i);
        found.push((name, first, line_of(end.min(code.len() - 1)) - first + 1));
        // Go on inside the body too: nested functions are measured on their own.
        i = k + 1;
    }
    found
}

/// `file:line: fn name is N lines` for each function over the limit.
fn long_functions(file: &str, src: &str) -> Vec<String> {
    functions(src)
        .into_iter()
        .filter(|&(_, _, n)| n > MAX_FN_LINES)
        .map(|(name, line, n)| format!("{file}:{line}: fn {name} is {n} lines"))
        .collect()
}

/// `file:line: "word"` for each process word in `text`.
fn process_words(file: &str, text: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for word in line
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let w = word.to_lowercase();
            if PROCESS_WORDS.contains(&w.as_str()) {
                hits.push(format!("{file}:{}: {word:?}", n + 1));
            }
        }
    }
    hits
}

/// Whether a file name carries a work-period tag such as `-s2` / `-s3` (`-s` and digits, then
/// a `-`, a `.` or the end of the name).
fn period_tag_in_name(name: &str) -> bool {
    let b = name.as_bytes();
    (0..b.len()).any(|i| {
        if !name[i..].starts_with("-s") {
            return false;
        }
        let digits = b[i + 2..].iter().take_while(|c| c.is_ascii_digit()).count();
        let after = b.get(i + 2 + digits).copied();
        digits > 0 && matches!(after, None | Some(b'-') | Some(b'.') | Some(b'_'))
    })
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn no_function_in_src_is_longer_than_the_limit() {
    let mut files = Vec::new();
    files_under(&root().join("src"), &mut files);
    let rs: Vec<PathBuf> = files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    assert!(rs.len() > 20, "the scan found only {} .rs files", rs.len());
    let mut counted = 0;
    let mut long = Vec::new();
    for p in &rs {
        let src = std::fs::read_to_string(p).unwrap();
        counted += functions(&src).len();
        long.extend(long_functions(&relative(p), &src));
    }
    assert!(
        counted > 200,
        "only {counted} functions found: the scanner is broken"
    );
    assert!(
        long.is_empty(),
        "{} functions over {MAX_FN_LINES} lines; split them into named steps:\n{}",
        long.len(),
        long.join("\n")
    );
}

#[test]
fn the_text_speaks_of_the_project_only() {
    let mut files = Vec::new();
    for r in TEXT_ROOTS {
        files_under(&root().join(r), &mut files);
    }
    assert!(
        files.len() > 50,
        "the scan found only {} files",
        files.len()
    );
    let mut hits = Vec::new();
    let mut read = 0;
    for p in &files {
        let rel = relative(p);
        let name = p.file_name().unwrap().to_string_lossy();
        if period_tag_in_name(&name) {
            hits.push(format!("{rel}: file name carries a work-period tag"));
        }
        // Binary files (none expected, but a model file may sit in a test folder) are skipped.
        if let Ok(text) = std::fs::read_to_string(p) {
            read += 1;
            hits.extend(process_words(&rel, &text));
        }
    }
    assert!(read > 50, "only {read} text files read");
    assert!(
        hits.is_empty(),
        "{} places name the process instead of the project:\n{}",
        hits.len(),
        hits.join("\n")
    );
}

// Negative controls: the scanners must flag a bad sample, and must not be fooled by braces and
// keywords inside strings, chars and comments.

#[test]
fn the_function_scanner_flags_a_long_function_and_reads_braces_in_literals() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let sample = format!(
        "/// Doc with a brace {{ and fn fake() {{\nfn short() -> u32 {{\n    let s = \"}} fn a() {{\";\n    \
         let r = r#\"}}\"}}\"#;\n    let c = '}}';\n    let l: &'static str = \"\";\n    /* }} /* {{ */ }} */\n    \
         // }}\n    1\n}}\n\npub(crate) fn long_one<T: Fn(u32) -> u32>(f: T) -> impl Fn() -> u32 {{\n{body}    \
         move || f(1)\n}}\n\ntrait T {{\n    fn declared(&self);\n}}\nfn pointer(f: fn(u32) -> u32) -> [u32; 1] {{ [f(2)] }}\n"
    );
    let fns = functions(&sample);
    let names: Vec<&str> = fns.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["short", "long_one", "pointer"], "{fns:?}");
    assert_eq!(fns[0].1, 2, "short starts on line 2");
    assert_eq!(fns[0].2, 9, "short is 9 lines: {fns:?}");
    assert_eq!(fns[1].2, MAX_FN_LINES + 3);
    let long = long_functions("sample.rs", &sample);
    assert_eq!(long.len(), 1, "{long:?}");
    assert!(
        long[0].starts_with("sample.rs:12: fn long_one is"),
        "{long:?}"
    );
    // One line shorter is within the limit.
    let ok = format!("fn f() {{\n{}}}\n", "    g();\n".repeat(MAX_FN_LINES - 2));
    assert!(long_functions("ok.rs", &ok).is_empty());
    let over = format!("fn f() {{\n{}}}\n", "    g();\n".repeat(MAX_FN_LINES - 1));
    assert_eq!(long_functions("over.rs", &over).len(), 1);
}

#[test]
fn the_word_scanner_flags_process_words_and_period_tags() {
    let [s, _, e, es, h, hs] = PROCESS_WORDS else {
        panic!("six words")
    };
    let cap = |w: &str| w[..1].to_uppercase() + &w[1..];
    let sample = format!(
        "fn main() {{}}\n// Measured in {} 3 by two {}.\nlet {s}_id = {h}();\n\
         // a {s}less ob{s}; the {e}ing of {h}ful things; {hs}-only\n",
        s.to_uppercase(),
        cap(es)
    );
    let hits = process_words("sample.md", &sample);
    let want = [
        format!("sample.md:2: {:?}", s.to_uppercase()),
        format!("sample.md:2: {:?}", cap(es)),
        format!("sample.md:3: {s:?}"),
        format!("sample.md:3: {h:?}"),
        format!("sample.md:4: {hs:?}"),
    ];
    assert_eq!(hits, want, "{sample}");
    for bad in [
        "2026-11-21-h200-s2.csv",
        "run-s3-top-p.csv",
        "x-s12_a.log",
        "a-s3",
    ] {
        assert!(period_tag_in_name(bad), "{bad}");
    }
    for good in [
        "2026-11-21-h200.csv",
        "fast-sum.rs",
        "k-s.csv",
        "a-s2x.csv",
        "smollm2.rs",
    ] {
        assert!(!period_tag_in_name(good), "{good}");
    }
}
