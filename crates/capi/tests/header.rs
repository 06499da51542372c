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
