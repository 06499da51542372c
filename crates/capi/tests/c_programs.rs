//! Builds C programs with gcc against the libjbdev.so / libjbdev.a that cargo
//! built for this test run, and runs them:
//! - `tests/c/error_paths.c` under AddressSanitizer and under valgrind
//!   (every misuse is an error, never a crash or leak), linked through the
//!   pkg-config file;
//! - `examples/c/osync_writers.c` (the seed-000 experiment), briefly, linked
//!   statically, checking that its output is sane;
//! - `tests/c/handle_kinds.c`, `journal_lost.c` and `store_full.c`, each
//!   checking one report's fix;
//! - the header compiled as C++.
//!
//! Skips with a message where gcc (or valgrind, for that run) is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_root() -> PathBuf {
    crate_dir().join("../..")
}

/// Where cargo put the libjbdev.{so,a} it built for this test run: next to
/// the test binary, in `target/<profile>/deps` (cargo builds every
/// crate-type of the library for integration tests but only uplifts them to
/// `target/<profile>` in `cargo build`). This follows CARGO_TARGET_DIR and
/// the profile without guessing.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe
        .parent()
        .expect("test binary has a directory")
        .to_path_buf();
    for lib in ["libjbdev.so", "libjbdev.a"] {
        assert!(
            deps.join(lib).exists(),
            "{} is missing; run this through `cargo test -p jbdev-capi`",
            deps.join(lib).display()
        );
    }
    deps
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> Output {
    // cargo test puts target/<profile> on LD_LIBRARY_PATH, which outranks
    // the programs' rpath and may hold an older libjbdev.so from
    // `cargo build`: make them load the library this test linked.
    cmd.env_remove("LD_LIBRARY_PATH");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    eprintln!(
        "$ {cmd:?}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed: {}", out.status);
    out
}

/// Compiler and linker flags for libjbdev.so: from the pkg-config file
/// `crates/capi/jbdev.pc.in` filled in for this build tree (as
/// examples/c/Makefile does), or the equivalent flags without pkg-config.
fn shared_link_flags(work: &Path, lib_dir: &Path) -> Vec<String> {
    let include = repo_root().join("include");
    write_pc_files(work, lib_dir);
    let mut flags: Vec<String> = if have("pkg-config") {
        let out = run_ok(
            Command::new("pkg-config")
                .args(["--cflags", "--libs", "jbdev"])
                .env("PKG_CONFIG_PATH", work),
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    } else {
        eprintln!("pkg-config not found: using the equivalent flags directly");
        vec![
            format!("-I{}", include.display()),
            format!("-L{}", lib_dir.display()),
            "-ljbdev".to_owned(),
        ]
    };
    assert!(flags.iter().any(|f| f == "-ljbdev"), "flags {flags:?}");
    flags.push(format!("-Wl,-rpath,{}", lib_dir.display()));
    flags.push("-lpthread".to_owned());
    flags
}

/// Builds `tests/c/NAME.c` with warnings as errors against libjbdev.so
/// (through the pkg-config file) in a new temporary directory; None (the
/// caller skips) where gcc is missing.
fn test_program(name: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    if !have("gcc") {
        eprintln!("SKIP: gcc not found; cannot build tests/c/{name}.c");
        return None;
    }
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join(name);
    let flags = shared_link_flags(work.path(), &lib_dir());
    run_ok(
        Command::new("gcc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
            .arg(crate_dir().join(format!("tests/c/{name}.c")))
            .arg("-o")
            .arg(&exe)
            .args(&flags),
    );
    Some((work, exe))
}

/// Report #5 of session 19: a C program could not tell that the salvage
/// after a journal failure completed (`jbdev_stats` had no such field),
/// the library's log went nowhere, and the error text pointed to a log
/// the program does not have. `tests/c/journal_lost.c` deletes the
/// external journal file under an open volume and checks the error texts
/// and the version-3 stats fields; here, the log: on stderr with
/// `JBDEV_LOG` set, and nothing on stderr without it.
#[test]
fn a_c_program_sees_the_salvage_after_its_journal_file_is_deleted() {
    let Some((work, exe)) = test_program("journal_lost") else {
        return;
    };
    for log in [Some("warn"), None] {
        let dir = work.path().join(format!("run-{}", log.unwrap_or("quiet")));
        std::fs::create_dir(&dir).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.arg(&dir)
            .env_remove("JBDEV_LOG")
            .env("RUST_BACKTRACE", "0");
        if let Some(l) = log {
            cmd.env("JBDEV_LOG", l);
        }
        let out = run_ok(&mut cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stdout.contains(" checks passed"), "{stdout}");
        if log.is_some() {
            assert!(
                stderr.contains("was deleted while the volume was open")
                    && stderr.contains("salvage complete: "),
                "no salvage log on stderr with JBDEV_LOG=warn:\n{stderr}"
            );
        } else {
            assert!(
                stderr.is_empty(),
                "the library wrote to stderr unasked:\n{stderr}"
            );
        }
    }
}

/// Report #5 of session 21: a transaction handle passed where a volume
/// handle is expected (the first of each had the same value) wrote the
/// volume, and a close of a handle not issued yet made the volume that
/// later got it fail every call with -EBADF. `tests/c/handle_kinds.c`, in
/// a fresh process so its handles are the library's first, checks that
/// every call given a handle of the wrong kind fails with -EBADF and a
/// message naming both kinds and changes nothing, and that volumes opened
/// after closes of unissued handles work.
#[test]
fn handles_of_the_wrong_kind_and_closes_of_unissued_ones_change_nothing() {
    let Some((work, exe)) = test_program("handle_kinds") else {
        return;
    };
    let out = run_ok(
        Command::new(&exe)
            .arg(work.path())
            .env_remove("JBDEV_LOG")
            .env("RUST_BACKTRACE", "0"),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" checks passed"));
}

/// A forked child's calls on handles it inherited are refused (-EBADF) and
/// leave the parent's volume alone; a close from an `atexit` handler, after
/// glibc destroyed the thread's io_uring, makes every plain write durable
/// and prints nothing; `jbdev_grow` refuses what it must and grows a closed
/// volume (see tests/c/lifecycle.c).
#[test]
fn a_forked_child_and_an_atexit_close_leave_the_volume_whole() {
    let Some((work, exe)) = test_program("lifecycle") else {
        return;
    };
    let run_mode = |mode: &str| {
        run_ok(
            Command::new(&exe)
                .arg(work.path())
                .arg(mode)
                .env_remove("JBDEV_LOG")
                .env("RUST_BACKTRACE", "0"),
        )
    };
    let out = run_mode("fork");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("lifecycle child: ") && stdout.contains("lifecycle: "),
        "{stdout}"
    );
    let out = run_mode("atexit");
    assert!(
        out.stderr.is_empty(),
        "the atexit close printed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run_mode("check-atexit");
    let out = run_mode("grow");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("lifecycle: "), "{stdout}");
}

/// A tmpfs of a given size mounted for a test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// None where mounting is not allowed (not root).
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Report #7 of session 19: jbdev.h said a full backing store aborts the
/// journal ("free space, then reopen"); since session 18 it does not.
/// `tests/c/store_full.c`, on a 24 MiB tmpfs, checks what the header says
/// now: -ENOSPC, `store_full` = 1 and `aborted` = 0, reads and flushes
/// work, and after space is freed the same handle writes again; every
/// acknowledged block reads back after a reopen.
#[test]
fn a_full_store_gives_enospc_and_the_same_handle_writes_again() {
    let Some((work, exe)) = test_program("store_full") else {
        return;
    };
    let Some(fs) = Tmpfs::mount(&work.path().join("fs"), "24M") else {
        let uid = run(Command::new("id").arg("-u")).stdout;
        assert_ne!(uid.trim_ascii(), b"0", "root, but mounting a tmpfs failed");
        eprintln!("SKIP: mounting a tmpfs needs root");
        return;
    };
    // 8 MiB the program deletes to free space.
    let filler = fs.0.join("filler");
    std::fs::write(&filler, vec![0x5a; 8 << 20]).unwrap();
    let out = run_ok(
        Command::new(&exe)
            .arg(&fs.0)
            .arg(&filler)
            .env_remove("JBDEV_LOG")
            .env("RUST_BACKTRACE", "0"),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" checks passed"));
}

/// Fills in the pkg-config templates of the crate (`jbdev.pc.in`,
/// `jbdev-static.pc.in`) for this build tree, into `work`, as
/// examples/c/Makefile does.
fn write_pc_files(work: &Path, lib_dir: &Path) {
    let include = repo_root().join("include");
    for entry in std::fs::read_dir(crate_dir()).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(pc) = name.strip_suffix(".in").filter(|n| n.ends_with(".pc")) else {
            continue;
        };
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("@LIBDIR@", lib_dir.to_str().unwrap())
            .replace("@INCLUDEDIR@", include.to_str().unwrap())
            .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
        std::fs::write(work.join(pc), text).unwrap();
    }
}

/// Report #9 of session 19: the header's static link line, `pkg-config
/// --static --cflags --libs jbdev`, gave `-ljbdev`, which links
/// libjbdev.so where both libraries sit (here, and in any -dev package),
/// so the "static" program failed to start (exit 127, "error while
/// loading shared libraries: libjbdev.so"). Runs the command the header
/// names for a static link, builds examples/c/hello.c with its flags and
/// no rpath, and runs it where no libjbdev.so can be found.
#[test]
fn the_static_link_the_header_names_needs_no_shared_library() {
    if !have("gcc") || !have("pkg-config") {
        eprintln!("SKIP: gcc or pkg-config not found; the static link test needs both");
        return;
    }
    let lib_dir = lib_dir();
    // hello.c opens with O_DIRECT: on disk, not in a possibly-tmpfs /tmp.
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    write_pc_files(work.path(), &lib_dir);
    let header = std::fs::read_to_string(repo_root().join("include/jbdev.h")).unwrap();
    let line = header
        .lines()
        .find(|l| l.contains("(static, libjbdev.a)"))
        .expect("the header names no static link");
    let command = line
        .trim_start_matches([' ', '*'])
        .trim_start_matches("Link:")
        .split('(')
        .next()
        .unwrap();
    let args: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(args.first(), Some(&"pkg-config"), "{line}");
    let out = run_ok(
        Command::new("pkg-config")
            .args(&args[1..])
            .env("PKG_CONFIG_PATH", work.path()),
    );
    let flags = String::from_utf8(out.stdout).unwrap();
    let flags: Vec<String> = flags.split_whitespace().map(str::to_owned).collect();
    let exe = build_hello(&work.path().join("hello_static"), &flags);
    let out = run(Command::new(&exe).arg(work.path().join("hello.img")));
    assert!(
        out.status.success(),
        "the program linked by `{}` failed ({}): {}",
        command.trim(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
}

#[test]
fn error_paths_under_address_sanitizer() {
    if !have("gcc") {
        eprintln!("SKIP: gcc not found; the C error-path test needs gcc with AddressSanitizer");
        return;
    }
    let lib_dir = lib_dir();
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join("error_paths");
    let flags = shared_link_flags(work.path(), &lib_dir);
    run_ok(
        Command::new("gcc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
            .args(["-fsanitize=address", "-fno-omit-frame-pointer"])
            .arg(crate_dir().join("tests/c/error_paths.c"))
            .arg("-o")
            .arg(&exe)
            .args(&flags),
    );
    let volumes = work.path().join("volumes");
    let run_checks = |asan_options: &str| {
        // Fresh work directory per attempt: the program creates its files.
        let _ = std::fs::remove_dir_all(&volumes);
        std::fs::create_dir(&volumes).unwrap();
        run(Command::new(&exe)
            .arg(&volumes)
            .env("ASAN_OPTIONS", asan_options)
            // A panic caught at the boundary prints a message; a backtrace
            // would only make the log long.
            .env("RUST_BACKTRACE", "0"))
    };
    // Leak checking on; a report fails the run with this exit code.
    let mut out = run_checks("detect_leaks=1:exitcode=23:abort_on_error=0");
    if String::from_utf8_lossy(&out.stderr).contains("LeakSanitizer has encountered a fatal error")
    {
        // LSan cannot work under ptrace or in some sandboxes; the
        // address checks still can.
        eprintln!("NOTE: LeakSanitizer unavailable here; rerunning with detect_leaks=0");
        out = run_checks("detect_leaks=0:exitcode=23:abort_on_error=0");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("AddressSanitizer") && !stderr.contains("LeakSanitizer"),
        "sanitizer report:\n{stderr}"
    );
    assert!(out.status.success(), "error_paths failed: {}", out.status);
    let passed: u32 = stdout
        .trim()
        .strip_prefix("error_paths: ")
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {stdout:?}"));
    assert!(passed > 100, "only {passed} checks ran");
}

/// The same program under valgrind, which, unlike ASan, also checks the
/// Rust side of every call (uninstrumented by gcc) for invalid accesses,
/// uninitialised reads and definite leaks.
#[test]
fn error_paths_under_valgrind() {
    if !have("gcc") || !have("valgrind") {
        eprintln!(
            "SKIP: gcc or valgrind not found; the valgrind run of the C error-path test needs both"
        );
        return;
    }
    let lib_dir = lib_dir();
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join("error_paths_vg");
    let flags = shared_link_flags(work.path(), &lib_dir);
    run_ok(
        Command::new("gcc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
            .arg(crate_dir().join("tests/c/error_paths.c"))
            .arg("-o")
            .arg(&exe)
            .args(&flags),
    );
    let volumes = work.path().join("volumes");
    std::fs::create_dir(&volumes).unwrap();
    let out = run(Command::new("valgrind")
        .args([
            "-q",
            "--error-exitcode=23",
            "--leak-check=full",
            // Thread registries of std and crossbeam live until exit and
            // show as "possibly lost"; a real leak is "definite".
            "--errors-for-leak-kinds=definite",
        ])
        .arg(&exe)
        .arg(&volumes)
        .env("RUST_BACKTRACE", "0"));
    assert!(
        out.status.success(),
        "error_paths under valgrind failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" checks passed"));
}

/// Parses `<f> MiB/s` out of a line.
fn mib_per_s(line: &str) -> Option<f64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words
        .iter()
        .position(|w| w.trim_end_matches(',') == "MiB/s")?;
    words.get(i.checked_sub(1)?)?.parse().ok()
}

#[test]
fn osync_writers_example_runs() {
    if !have("gcc") {
        eprintln!("SKIP: gcc not found; cannot build examples/c/osync_writers.c");
        return;
    }
    let lib_dir = lib_dir();
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join("osync_writers");
    run_ok(
        Command::new("gcc")
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-g", "-pthread",
            ])
            .arg(format!("-I{}", repo_root().join("include").display()))
            .arg(repo_root().join("examples/c/osync_writers.c"))
            .arg("-o")
            .arg(&exe)
            // Static link, with the system libraries rustc reports for a
            // staticlib (the Libs of jbdev-static.pc).
            .arg(lib_dir.join("libjbdev.a"))
            .args([
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
                "-lc",
            ]),
    );
    let image = work.path().join("osync.img");
    let threads = 8;
    // -B: buffered I/O, since the temp directory may be on tmpfs.
    let out = run_ok(
        Command::new(&exe)
            .args(["-t", &threads.to_string(), "-d", "1", "-c", "-B"])
            .arg(&image),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("osync_writers: 8 threads x 64 KiB"),
        "{stdout}"
    );
    let per_second: Vec<f64> = lines
        .iter()
        .filter(|l| l.trim_start().starts_with("1s"))
        .filter_map(|l| mib_per_s(l))
        .collect();
    assert_eq!(
        per_second.len(),
        1,
        "one per-second sample expected:\n{stdout}"
    );
    let total_line = lines
        .iter()
        .find(|l| l.starts_with("total: "))
        .unwrap_or_else(|| panic!("no total line:\n{stdout}"));
    let total = mib_per_s(total_line).unwrap_or_else(|| panic!("bad total: {total_line}"));
    // Sanity, not speed: some data moved and the figures are numbers.
    assert!(total.is_finite() && total > 0.0, "{total_line}");
    assert!(per_second[0].is_finite() && per_second[0] >= 0.0);
    assert!(
        total_line.ends_with(&format!("{threads} threads")),
        "{total_line}"
    );
    assert!(
        lines.contains(&format!("verify: {threads} regions ok").as_str()),
        "{stdout}"
    );

    // Reopening the image (no -c) works and its regions hold valid data.
    let out = run_ok(
        Command::new(&exe)
            .args(["-t", "2", "-d", "1", "-B"])
            .arg(&image),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("verify: 2 regions ok"));

    // The kernel-baseline mode (-K: the seed's own pwrite loop on a plain
    // file) runs and verifies too.
    let out = run_ok(
        Command::new(&exe)
            .args(["-K", "-B", "-t", "2", "-d", "1"])
            .arg(work.path().join("kernel.raw")),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("kernel pwrite O_DIRECT|O_SYNC"), "{stdout}");
    assert!(stdout.contains("verify: 2 regions ok"), "{stdout}");
}

/// Builds examples/c/hello.c into `exe` with the link flags `flags`.
fn build_hello(exe: &Path, flags: &[String]) -> PathBuf {
    run_ok(
        Command::new("gcc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(repo_root().join("examples/c/hello.c"))
            .arg("-o")
            .arg(exe)
            .args(flags),
    );
    exe.to_path_buf()
}

/// The README's smallest example (examples/c/hello.c) builds and works.
#[test]
fn hello_example_runs() {
    if !have("gcc") {
        eprintln!("SKIP: gcc not found; cannot build examples/c/hello.c");
        return;
    }
    let lib_dir = lib_dir();
    // The example opens with O_DIRECT (the default), so keep its image in
    // the target directory, on disk, rather than in a possibly-tmpfs /tmp.
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let flags = shared_link_flags(work.path(), &lib_dir);
    let exe = build_hello(&work.path().join("hello"), &flags);
    let out = run_ok(Command::new(&exe).arg(work.path().join("hello.img")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    // A bad path fails with the library's message, not a crash.
    let out = run(Command::new(&exe).arg(work.path().join("no/such/dir/x.img")));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("jbdev: create "));
}

#[test]
fn header_compiles_as_cxx() {
    if !have("g++") {
        eprintln!("SKIP: g++ not found; cannot check the header from C++");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("use.cpp");
    std::fs::write(
        &src,
        "#include \"jbdev.h\"\n\
         static_assert(JBDEV_ABI_VERSION >= 1, \"abi\");\n\
         int use(jbdev_volume *v) { jbdev_stats s; \
         return jbdev_get_stats(v, &s, sizeof s) + jbdev_flush(v); }\n",
    )
    .unwrap();
    run_ok(
        Command::new("g++")
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
            .arg(format!("-I{}", repo_root().join("include").display()))
            .arg(&src),
    );
}
