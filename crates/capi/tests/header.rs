//! `include/jbdev.h` must be exactly what cbindgen generates from this crate,
//! so the checked-in header can never drift from the library.
//! `JBDEV_BLESS=1 cargo test -p jbdev-capi --test header` rewrites it.

use std::path::PathBuf;

#[test]
fn checked_in_header_is_up_to_date() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("../../include/jbdev.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("read crates/capi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed to generate the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);

    if std::env::var_os("JBDEV_BLESS").is_some() {
        std::fs::create_dir_all(header_path.parent().unwrap()).unwrap();
        std::fs::write(&header_path, &generated).unwrap();
        eprintln!("wrote {}", header_path.display());
        return;
    }
    let checked_in = std::fs::read(&header_path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/jbdev.h is stale or missing; regenerate it with\n    \
         JBDEV_BLESS=1 cargo test -p jbdev-capi --test header\n\
         --- generated ---\n{}",
        String::from_utf8_lossy(&generated)
    );
}

/// The comment block cbindgen puts above `decl` in the checked-in header.
fn doc_of(header: &str, decl: &str) -> String {
    let lines: Vec<&str> = header.lines().collect();
    // The declaration, not a mention in a comment.
    let at = lines
        .iter()
        .position(|l| !l.starts_with("//") && !l.starts_with(" *") && l.contains(decl))
        .unwrap_or_else(|| panic!("{decl} not declared in the header"));
    let start = lines[..at]
        .iter()
        .rposition(|l| !l.starts_with("//"))
        .map_or(0, |i| i + 1);
    lines[start..at].join("\n")
}

/// A failed commit or write may or may not have happened (ARCHITECTURE
/// 25): the header used to promise that a failed `jbdev_txn_commit` applied
/// nothing, when its data could be visible at once and applied after a
/// reopen (/work/s18/fail/txn_error_applied.sh), and listed -ENOSPC for
/// writes only "past the end", not for a full backing store.
#[test]
fn the_header_promises_nothing_about_a_failed_write() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(crate_dir.join("../../include/jbdev.h")).unwrap();
    let commit = doc_of(&header, "jbdev_txn_commit(");
    assert!(
        !commit.contains("an error nothing was applied")
            && commit.contains("may or may not have happened"),
        "{commit}"
    );
    let write = words(&doc_of(&header, "jbdev_write("));
    assert!(write.contains("backing store is full"), "{write}");
    assert!(header.contains("may or may not have happened: its data"));
}

/// Report #7 of session 19: the header said a full backing store aborts
/// the journal ("-ENOSPC when what aborted it was a full backing store
/// (free space, then reopen)", and for `jbdev_write` "the journal then
/// aborts; free space, then reopen"); since session 18 it is no abort and
/// the same handle writes again once space is freed (what
/// `c_programs.rs::a_full_store_gives_enospc_and_the_same_handle_writes_again`
/// checks against the library).
/// `text` as one line of words, without the `//` and ` *` of comments.
fn words(text: &str) -> String {
    text.lines()
        .map(|l| {
            l.trim_start()
                .trim_start_matches("//")
                .trim_start_matches('*')
        })
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_header_says_a_full_store_is_no_abort() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(crate_dir.join("../../include/jbdev.h")).unwrap();
    let flat = words(&header);
    for stale in [
        "aborted it was a full backing store",
        "the journal then aborts",
    ] {
        assert!(!flat.contains(stale), "the header still says {stale:?}");
    }
    assert!(
        flat.contains("A full backing store (ENOSPC or EDQUOT")
            && flat.contains("is not an abort")
            && flat.contains("the same handle writes again, no reopen"),
        "the header's rules do not say what a full store does"
    );
    let write = words(&doc_of(&header, "jbdev_write("));
    assert!(
        write.contains(
            "the backing store is full: no abort; free space and write again on the same handle"
        ),
        "{write}"
    );
}

/// Report #11 of session 19: the header's return codes disagreed with the
/// library. `jbdev_get_stats` refuses sizes under 4 (the header implied
/// they were accepted), `jbdev_txn_begin` refuses a read-only volume with
/// -EROFS (the header put it at commit), and lengths past the end, even
/// `SIZE_MAX`, are -ENOSPC (now the library's behaviour too, checked by
/// tests/c/error_paths.c, as is the refused `journal_path` of an
/// internal-journal volume).
#[test]
fn the_header_states_the_return_codes_the_library_gives() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(crate_dir.join("../../include/jbdev.h")).unwrap();
    let stats = words(&doc_of(&header, "jbdev_get_stats("));
    assert!(
        stats.contains("at least 4") && stats.contains("smaller size is refused with -EINVAL"),
        "{stats}"
    );
    let begin = words(&doc_of(&header, "jbdev_txn_begin("));
    assert!(
        begin.contains("-EROFS for a volume opened read-only"),
        "{begin}"
    );
    let commit = words(&doc_of(&header, "jbdev_txn_commit("));
    assert!(
        !commit.contains("-EROFS for a read-only volume"),
        "{commit}"
    );
    let read = words(&doc_of(&header, "jbdev_read("));
    assert!(read.contains("`SIZE_MAX` too"), "{read}");
    let open = words(&doc_of(&header, "jbdev_open("));
    assert!(
        open.contains("`journal_path` set for a volume whose journal is internal"),
        "{open}"
    );
}
