//! `jbdev serve`: export volumes over NBD.
//!
//! `jbdev serve PATH [--journal JPATH] [--listen ADDR:PORT] [--socket UNIX_PATH]
//! [--export NAME=PATH[,journal=JPATH][,description=TEXT]]... [--read-only] [-s]`. Without
//! `--listen` or `--socket` it listens on 127.0.0.1:10809; when started by
//! systemd-style socket activation (`LISTEN_FDS`) it serves the inherited
//! sockets instead (and exits with its parent); `-s` serves one client on
//! stdin/stdout. SIGINT/SIGTERM/SIGHUP/SIGQUIT finish in-flight requests, then flush and
//! close every volume (leaving the journal clean).
//!
//! TLS, in nbdkit's and qemu-nbd's words: `--tls=off|on|require`,
//! `--tls-certificates DIR` (X.509), `--tls-psk FILE` (pre-shared keys),
//! `--tls-verify-peer` (clients need a certificate signed by
//! `DIR/ca-cert.pem`). Credentials without `--tls` mean `require`.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use jbdev_nbd::{Export, ExportSet, Listener, Server, ServerConfig, Stream, TlsConfig, TlsMode};
use jbdev_volume::{OpenOptions, Volume};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Volume served as the default export (the empty export name).
    /// Without it, a client asking for the default export gets the first
    /// --export, as with nbdkit's default export.
    pub path: Option<PathBuf>,
    /// External journal file or device of PATH (default: the path recorded
    /// at format time), as for info, check and dump. For an --export, add
    /// `,journal=JPATH` after its PATH.
    #[arg(long, value_name = "JPATH", requires = "path")]
    pub journal: Option<PathBuf>,
    /// TCP address to listen on (default 127.0.0.1:10809; other addresses
    /// must be asked for explicitly).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Unix socket to listen on (created; removed on exit).
    #[arg(long, value_name = "UNIX_PATH")]
    pub socket: Option<PathBuf>,
    /// Additional named export (repeatable); `journal=JPATH` names its
    /// external journal (default: the path recorded at format time); the
    /// description, if given, is what clients listing exports see, and runs
    /// to the end of the argument (it may hold commas). Any other `,KEY=`
    /// (a misspelt key) is refused, unless the whole PATH (or JPATH)
    /// with it exists as a file, so a path may still contain commas.
    #[arg(long, value_name = "NAME=PATH[,journal=JPATH][,description=TEXT]")]
    pub export: Vec<String>,
    /// Description of the default export shown to clients (none by default;
    /// the server never shows file paths).
    #[arg(long, value_name = "TEXT", requires = "path")]
    pub description: Option<String>,
    /// Serve every export read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Serve a single client on stdin/stdout (libnbd's connect_command).
    #[arg(short = 's', long = "stdio", conflicts_with_all = ["listen", "socket"])]
    pub stdio: bool,
    /// Worker threads shared by all connections, for requests that would
    /// block a network thread: reads the page cache cannot answer, partial
    /// writes, waits for journal space (default 8 per core, 16 to 64).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Network threads: all connections' socket I/O (accept, handshake,
    /// TLS, requests and replies) is multiplexed on these, whatever the
    /// number of clients (default: one per core).
    #[arg(long, value_name = "N")]
    pub net_threads: Option<usize>,
    /// Connections served at once (in handshake or transmission); more are
    /// refused: every option they send is answered ERR_POLICY "too many
    /// connections" for up to 2 s (16 such refusals at a time; beyond
    /// them, closed at once).
    #[arg(long, default_value_t = 128)]
    pub max_connections: usize,
    /// Seconds a client has for the whole handshake.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub handshake_timeout: u64,
    /// Seconds a reply write may block before a client that does not read
    /// is dropped.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub send_timeout: u64,
    /// Seconds a connection with no request in flight may stay silent
    /// before it is closed, so that idle connections cannot hold every
    /// --max-connections slot for good; also one silent for SECS halfway
    /// through sending a request. 0: never (the default, as in nbdkit
    /// and qemu-nbd; a client that idles, such as qemu, then sees its
    /// connection closed).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub idle_timeout: u64,
    /// Exit when the parent process exits (on by default when socket
    /// activated).
    #[arg(long)]
    pub exit_with_parent: bool,
    /// Exit once the last client disconnects, after the first that reached
    /// transmission (a port probe, a refused client or a failed TLS
    /// handshake does not count).
    #[arg(long)]
    pub once: bool,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 128)]
    pub max_inflight: u32,
    /// I/O backend of the volume: auto, uring or pread.
    #[arg(long, default_value = "auto")]
    pub backend: jbdev_device::Backend,
    /// Keep the page cache out of the home area: O_DIRECT reads and writes
    /// only. By default home reads go through the page cache, like `nbdkit
    /// file`, and so do large direct writes (at least
    /// --direct-write-threshold), so a bulk copy reads back without device
    /// I/O; the journal and the checkpoint always use O_DIRECT, and every
    /// flush ends in fdatasync.
    #[arg(long)]
    pub no_read_cache: bool,
    /// Buffered I/O on the volume's file instead of O_DIRECT: what was
    /// written stays in the page cache for later reads, like `nbdkit file`
    /// (durability is the same: every commit and flush ends in fdatasync).
    #[arg(long)]
    pub buffered: bool,
    /// Group commit's batching wait: adaptive (default), none, or
    /// fixed:N, a wait of N microseconds (the seed's comparison).
    #[arg(long, value_name = "POLICY", default_value = "adaptive")]
    pub batch_policy: jbdev_volume::BatchPolicy,
    /// Commits that may be on the device at once (1 ..= 16; 1: each commit
    /// starts after the previous one is durable).
    #[arg(long, value_name = "N", default_value_t = jbdev_volume::OpenOptions::default().pipeline_depth,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub pipeline_depth: u32,
    /// Pace journaled writes once 7/8 of the log is taken, so writers slow
    /// down smoothly to the checkpoint's rate instead of stalling for a
    /// whole checkpoint round when the log is full: shorter write-latency
    /// tails under sustained random writes, at some cost in throughput.
    #[arg(long)]
    pub write_pacing: bool,
    /// Writes of at least this many bytes go straight to their home
    /// location (old-or-new per sector until a flush; NBD promises no
    /// atomicity) instead of through the journal, so bulk copies write their
    /// data once. `0` or `none`: journal every write that fits in a
    /// transaction (all-or-nothing).
    #[arg(long, value_name = "BYTES", default_value = "256K", value_parser = parse_threshold)]
    pub direct_write_threshold: u64,
    /// Serve Prometheus metrics on http://ADDR:PORT/metrics (a bare PORT
    /// listens on 127.0.0.1).
    #[arg(long, value_name = "ADDR:PORT", value_parser = crate::metrics::parse_metrics_addr)]
    pub metrics: Option<SocketAddr>,
    /// TLS: off, on (clients choose) or require (nothing, not even the
    /// list of exports, before STARTTLS). Default: require when
    /// credentials are given, otherwise off.
    #[arg(long, value_name = "off|on|require", require_equals = false)]
    pub tls: Option<TlsMode>,
    /// X.509 credentials: DIR/server-cert.pem, DIR/server-key.pem and, for
    /// --tls-verify-peer, DIR/ca-cert.pem (nbdkit's layout).
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys: `identity:hexkey` lines, as written by psktool.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Require a client certificate signed by DIR/ca-cert.pem (with
    /// --tls-certificates).
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,
    /// RBD volumes: break the exclusive lock of a holder that is dead (never
    /// done without this flag; librbd blocklists the old holder).
    #[arg(long)]
    pub break_lock: bool,
}

/// The TLS configuration the flags ask for (`None`: no TLS).
fn tls_config(a: &ServeArgs) -> anyhow::Result<Option<Arc<TlsConfig>>> {
    let mode = tls_mode(a);
    if a.tls_verify_peer && a.tls_certificates.is_none() {
        usage_bail!("--tls-verify-peer checks client certificates: it needs --tls-certificates DIR (PSK clients have no certificate)");
    }
    if a.tls_verify_peer && mode == TlsMode::On {
        // With `on`, a client that never starts TLS is served in plain
        // text, so without any certificate: the check would be bypassed.
        usage_bail!("--tls-verify-peer with --tls=on would still serve clients without TLS, and so without a certificate: use --tls=require");
    }
    let cfg = match (mode, &a.tls_certificates, &a.tls_psk) {
        (TlsMode::Off, None, None) => return Ok(None),
        (TlsMode::Off, _, _) => {
            usage_bail!(
                "--tls=off with TLS credentials: drop the credentials or use --tls=on|require"
            )
        }
        (_, None, None) => {
            usage_bail!(
                "--tls={} needs --tls-certificates DIR or --tls-psk FILE",
                mode_name(mode)
            )
        }
        (_, Some(dir), _) => TlsConfig::from_certificates(dir, a.tls_verify_peer, mode)
            .context("cannot load the TLS certificates")?,
        (_, None, Some(file)) => {
            TlsConfig::from_psk_file(file, mode).context("cannot load the TLS PSK file")?
        }
    };
    tracing::info!("TLS {} with {}", mode_name(mode), cfg.describe());
    Ok(Some(Arc::new(cfg)))
}

/// `--tls` as given, or what the credentials imply (`require` with them,
/// `off` without).
fn tls_mode(a: &ServeArgs) -> TlsMode {
    let have_creds = a.tls_certificates.is_some() || a.tls_psk.is_some();
    a.tls.unwrap_or(if have_creds {
        TlsMode::Require
    } else {
        TlsMode::Off
    })
}

/// The warning for a TCP listener that other machines can reach while
/// clients may still talk in plain text (`--tls=off` or `on`), if any.
fn plain_text_warning(addr: SocketAddr, mode: TlsMode) -> Option<String> {
    if addr.ip().is_loopback() || mode == TlsMode::Require {
        return None;
    }
    let how = match mode {
        TlsMode::Off => "without TLS",
        _ => "with TLS optional (--tls=on)",
    };
    Some(format!(
        "jbdev serve: warning: {addr} accepts connections from other machines {how}: \
         whoever can reach it can read and write the exports, and the data crosses the \
         network in plain text. Use --tls=require with --tls-certificates DIR or \
         --tls-psk FILE, or listen on 127.0.0.1"
    ))
}

fn mode_name(m: TlsMode) -> &'static str {
    match m {
        TlsMode::Off => "off",
        TlsMode::On => "on",
        TlsMode::Require => "require",
    }
}

/// Limits that must be at least 1: 0 used to be raised to 1 silently.
fn check_limits(a: &ServeArgs) -> anyhow::Result<()> {
    for (flag, v) in [
        ("--max-connections", a.max_connections as u64),
        ("--max-inflight", u64::from(a.max_inflight)),
        ("--handshake-timeout", a.handshake_timeout),
        ("--send-timeout", a.send_timeout),
    ] {
        if v == 0 {
            usage_bail!("{flag} must be at least 1");
        }
    }
    if let Some(n) = a.threads.filter(|&n| n == 0) {
        usage_bail!("--threads must be at least 1 (got {n})");
    }
    if let Some(n) = a.net_threads.filter(|&n| n == 0) {
        usage_bail!("--net-threads must be at least 1 (got {n})");
    }
    Ok(())
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    reexec_with_malloc_tuning();
    check_limits(&a)?;
    // Credentials are checked before any volume is opened.
    let tls = tls_config(&a)?;
    let mut named: Vec<ExportSpec> = Vec::new();
    if let Some(p) = &a.path {
        named.push(ExportSpec {
            name: String::new(),
            path: p.clone(),
            journal: a.journal.clone(),
            description: a.description.clone().unwrap_or_default(),
        });
    }
    for spec in &a.export {
        let e = parse_export(spec)?;
        if named.iter().any(|o| o.name == e.name) {
            // Refused before anything is opened: a usage error (exit 64).
            usage_bail!("export name {:?} given twice", e.name);
        }
        named.push(e);
    }
    if named.is_empty() {
        usage_bail!("nothing to serve: give a volume PATH or --export NAME=PATH (create one with `jbdev format PATH --size 1G`)");
    }
    // Refused before anything is opened (a journal replayed, a lock
    // broken): usage errors, as a repeated name is.
    for e in &named {
        if let Err(why) = jbdev_nbd::export::check_export_strings(&e.name, &e.description) {
            usage_bail!("{why}");
        }
    }
    agree_on_journals(&mut named)?;

    // Listeners before any volume is opened: a `--listen` or `--metrics`
    // that cannot be bound must fail before a `--break-lock` breaks a
    // lock, and before recovery or the session stamp writes anything
    // (found by a new-user pass: the lock was broken, then the bind failed).
    let listeners = if a.stdio {
        None
    } else {
        Some(make_listeners(&a)?)
    };
    let metrics_listener = crate::metrics::bind(a.metrics)?;
    // A socket file made here goes again if serving never starts.
    let mut made_sockets = SocketFiles(
        listeners
            .iter()
            .flat_map(|l| &l.listeners)
            .filter_map(|l| match l {
                Listener::Unix {
                    unlink: Some(p), ..
                } => Some(p.clone()),
                _ => None,
            })
            .collect(),
    );

    // One open volume per file, shared by every export that names it.
    let mut volumes: Vec<(PathBuf, Arc<Volume>)> = Vec::new();
    let mut by_path: HashMap<PathBuf, Arc<Volume>> = HashMap::new();
    let opts = OpenOptions {
        read_only: a.read_only,
        backend: a.backend,
        read_cache: !a.no_read_cache,
        write_cache: !a.no_read_cache,
        direct_io: !a.buffered,
        batch_policy: a.batch_policy,
        pipeline_depth: a.pipeline_depth,
        write_pacing: a.write_pacing,
        break_lock: a.break_lock,
        direct_write_threshold: a.direct_write_threshold,
        ..OpenOptions::default()
    };
    let mut exports = Vec::new();
    let metrics = a
        .metrics
        .map(|_| Arc::new(crate::metrics::Metrics::default()));
    if a.break_lock && !a.read_only {
        // Every volume is checked before any lock is broken: a serve that
        // ends up refused must not have fenced a live holder on the way.
        for ExportSpec { path, journal, .. } in &named {
            let opts = OpenOptions {
                journal_path: journal.clone(),
                ..opts.clone()
            };
            Volume::check_openable(path, &opts)
                .map_err(anyhow::Error::new)
                .with_context(|| {
                    format!("cannot open volume {} (no lock was broken)", path.display())
                })?;
        }
    }
    for ExportSpec {
        name,
        path,
        journal,
        description,
    } in &named
    {
        let key = if jbdev_device::is_rbd_target(path) {
            // One image however spelled (`rbd:rbd/v`, `rbd:rbd/v:conf=…`):
            // the spelling seen first, so the exports share its volume.
            same_rbd_key(by_path.keys(), path).unwrap_or_else(|| path.clone())
        } else {
            std::fs::canonicalize(path)
                .with_context(|| format!("cannot open volume {}", path.display()))?
        };
        let vol = match by_path.get(&key) {
            Some(v) => v.clone(),
            None => {
                let opts = OpenOptions {
                    journal_path: journal.clone(),
                    ..opts.clone()
                };
                let v = Arc::new(Volume::open(path, &opts).map_err(|e| {
                    if matches!(e, jbdev_volume::VolumeError::NotAVolume(_)) {
                        if let Some(said) = crate::admin::journal_instead_of_volume(path) {
                            return anyhow::anyhow!(
                                "cannot open volume {}: {said}",
                                path.display()
                            );
                        }
                    }
                    let hint = open_hint(&e, path, a.read_only);
                    anyhow::Error::new(e)
                        .context(format!("cannot open volume {}{hint}", path.display()))
                })?);
                if !a.read_only {
                    // A read-only server writes nothing: no ENOSPC to warn of.
                    warn_if_sparse_on_a_small_fs(path);
                }
                by_path.insert(key.clone(), v.clone());
                volumes.push((key.clone(), v.clone()));
                v
            }
        };
        let backend = crate::metrics::backend(metrics.as_ref(), name, &key, vol, a.read_only);
        exports.push(Export::new(name.clone(), description.clone(), backend));
    }
    drop(by_path);
    let exports = ExportSet::new(exports).map_err(anyhow::Error::msg)?;
    let cfg = ServerConfig {
        worker_threads: a
            .threads
            .unwrap_or_else(jbdev_nbd::server::default_worker_threads)
            .max(1),
        net_threads: a
            .net_threads
            .unwrap_or_else(jbdev_nbd::server::default_net_threads)
            .max(1),
        max_inflight_requests_per_conn: a.max_inflight.max(1),
        max_connections: a.max_connections.max(1),
        // A socket-activated server belongs to whoever started it.
        exit_with_parent: a.exit_with_parent || listeners.as_ref().is_some_and(|l| l.activated),
        exit_when_idle: a.once,
        handshake_timeout: Duration::from_secs(a.handshake_timeout.max(1)),
        send_timeout: Duration::from_secs(a.send_timeout.max(1)),
        idle_timeout: (a.idle_timeout > 0).then(|| Duration::from_secs(a.idle_timeout)),
        tls,
        ..ServerConfig::default()
    };
    let server = Server::new(exports, cfg);
    crate::metrics::start(metrics.as_ref(), metrics_listener, &server)?;

    // From here the server removes its socket files itself.
    made_sockets.0.clear();
    if let Some(Listeners { listeners, .. }) = listeners {
        // Signals first: whoever reads the announcement may stop us at once.
        let signals = server.install_signals()?;
        for l in &listeners {
            // Tests and scripts read this line to find the address.
            eprintln!("jbdev serve: listening on {}", l.describe());
            if let Listener::Tcp(t) = l {
                if let Some(w) = t
                    .local_addr()
                    .ok()
                    .and_then(|addr| plain_text_warning(addr, tls_mode(&a)))
                {
                    eprintln!("{w}");
                }
            }
        }
        server.serve(listeners);
        drop(signals);
    } else {
        let stream = Stream::from_stdio().context("cannot use stdin/stdout")?;
        server.run_one_with_signals(stream)?;
    }
    drop(server);
    close_volumes(volumes)
}

/// Settings for glibc's allocator that `jbdev serve` runs with unless the
/// operator set their own: a fixed mmap threshold and trim threshold of
/// 128 KiB. Why: glibc raises its mmap threshold each time a large mmapped
/// block is freed, after which large buffers come from per-thread arenas
/// whose freed memory stays resident. With the workers' journal and payload
/// buffers that left 94-318 MiB resident when idle after a load; with these
/// settings 65-137 MiB after the same loads, with no loss of throughput
/// measured. They can only be set before the process's first allocation,
/// so the server re-executes itself once with them in its environment.
const MALLOC_TUNING: [(&str, &str); 2] = [
    ("MALLOC_MMAP_THRESHOLD_", "131072"),
    ("MALLOC_TRIM_THRESHOLD_", "131072"),
];

/// Re-executes this process with [`MALLOC_TUNING`] unless any of it (or
/// `GLIBC_TUNABLES`) is already in the environment. Same pid, arguments and
/// descriptors, so socket activation (`LISTEN_PID`), `-s` and supervisors
/// are unaffected. If exec fails the server runs untuned.
fn reexec_with_malloc_tuning() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        let set_by_operator = MALLOC_TUNING
            .iter()
            .map(|(k, _)| *k)
            .chain(["GLIBC_TUNABLES"])
            .any(|k| std::env::var_os(k).is_some());
        if set_by_operator {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let err = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .envs(MALLOC_TUNING)
            .exec();
        tracing::warn!("cannot re-execute with allocator settings ({err}); running untuned");
    }
}

/// One export from the command line.
struct ExportSpec {
    name: String,
    path: PathBuf,
    /// `journal=JPATH`: the external journal (`--journal` of the default
    /// export).
    journal: Option<PathBuf>,
    description: String,
}

/// The keys an `--export` takes after its PATH.
const EXPORT_KEYS: &str = "journal, description";

/// The first `,KEY=` in `path` whose KEY is a word (letters, digits, `-`,
/// `_`): what a misspelt `--export` key looks like.
fn key_like(path: &str) -> Option<&str> {
    path.match_indices(',').find_map(|(at, _)| {
        let rest = path.get(at + 1..)?;
        let (word, _) = rest.split_once('=')?;
        let is_word = !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        is_word.then_some(word)
    })
}

/// `NAME=PATH[,journal=JPATH][,description=TEXT]`. The description runs to
/// the end of the argument, so it may itself contain commas. Any other
/// `,KEY=` in PATH or JPATH is refused as an unknown key unless that whole
/// path exists (a file whose name holds `,KEY=`).
fn parse_export(spec: &str) -> anyhow::Result<ExportSpec> {
    parse_export_with(spec, |p| Path::new(p).exists())
}

fn parse_export_with(spec: &str, exists: impl Fn(&str) -> bool) -> anyhow::Result<ExportSpec> {
    let Some((name, rest)) = spec.split_once('=') else {
        usage_bail!("--export wants NAME=PATH[,journal=JPATH][,description=TEXT], got {spec:?}");
    };
    if name.is_empty() {
        usage_bail!(
            "--export {spec:?}: the name is empty (the default export is the PATH argument)"
        );
    }
    let (path, description) = match rest.split_once(",description=") {
        Some((p, d)) => (p, d.to_string()),
        None => (rest, String::new()),
    };
    let (path, journal) = match path.split_once(",journal=") {
        Some((_, "")) => usage_bail!("--export {spec:?}: the journal path is empty"),
        Some((p, j)) => (p, Some(PathBuf::from(j))),
        None => (path, None),
    };
    if path.is_empty() {
        usage_bail!("--export {spec:?}: the path is empty");
    }
    let journal_str = journal.as_ref().and_then(|j| j.to_str());
    for p in std::iter::once(path).chain(journal_str) {
        if let Some(key) = key_like(p).filter(|_| !exists(p)) {
            usage_bail!(
                "--export {spec:?}: unknown key {key:?} (the keys are {EXPORT_KEYS}; \
                 a path that really holds \",{key}=\" must exist)"
            );
        }
    }
    Ok(ExportSpec {
        name: name.to_string(),
        path: PathBuf::from(path),
        journal,
        description,
    })
}

/// Unix socket files `serve` created, removed when dropped (an error
/// before serving started).
struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

struct Listeners {
    listeners: Vec<Listener>,
    /// Passed by socket activation rather than opened here.
    activated: bool,
}

fn make_listeners(a: &ServeArgs) -> anyhow::Result<Listeners> {
    if let Some(ls) = jbdev_nbd::server::activated_listeners()
        .context("cannot adopt the sockets passed by socket activation (LISTEN_FDS)")?
    {
        if ls.is_empty() {
            bail!("LISTEN_FDS is set but no passed descriptor is a listening socket");
        }
        if !a.listen.is_empty() || a.socket.is_some() {
            bail!(
                "socket activation (LISTEN_FDS) passes the sockets to serve: drop --listen and --socket"
            );
        }
        return Ok(Listeners {
            listeners: ls,
            activated: true,
        });
    }
    let mut out = Vec::new();
    let mut addrs = a.listen.clone();
    if addrs.is_empty() && a.socket.is_none() {
        addrs.push(SocketAddr::from(([127, 0, 0, 1], 10809)));
    }
    for addr in addrs {
        let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        out.push(Listener::Tcp(l));
    }
    if let Some(p) = &a.socket {
        out.push(bind_unix(p)?);
    }
    Ok(Listeners {
        listeners: out,
        activated: false,
    })
}

fn bind_unix(p: &Path) -> anyhow::Result<Listener> {
    use std::os::unix::fs::FileTypeExt;
    // A stale socket file from a killed server would make bind fail; remove
    // it only if it is a socket and nothing answers on it. Anything else at
    // the path (a volume image, a typo'd path to a file) is never removed.
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if !m.file_type().is_socket() {
            bail!(
                "cannot listen on {}: it exists and is not a socket (refusing to replace it)",
                p.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(p).is_ok() {
            bail!(
                "cannot listen on {}: another server is listening there",
                p.display()
            );
        }
        let _ = std::fs::remove_file(p);
    }
    let l = UnixListener::bind(p).with_context(|| format!("cannot listen on {}", p.display()))?;
    Ok(Listener::Unix {
        listener: l,
        unlink: Some(p.to_path_buf()),
    })
}

/// How long closing one volume at exit may go without progress before the
/// server gives up on it (a close checkpoints the journal, and a store that
/// stopped answering would hold the process and the volume's lock for as
/// long as it hangs: the file backend has no I/O timeout). Progress is the
/// journal's bytes in use going down: a close that writes a large journal
/// home at the store's pace is not a hung store (session 26's pass: a 4 GiB
/// journal would have needed about two minutes, and a fixed limit gave up
/// on it saying the store did not answer). Giving up is as safe as a
/// crash: everything acknowledged as durable is in the journal, which the
/// next open replays.
const CLOSE_LIMIT: Duration = Duration::from_secs(60);
/// The same for the flush of a volume a connection still held after the
/// shutdown grace time: the store is then most likely what holds it.
const FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// Gives every export of one volume file (by canonical path) the journal
/// one of them names (`,journal=`), so two exports of one file may name it
/// once. Two that name different journals are refused before anything is
/// opened (session 33's multi-export pass: the second was ignored without
/// a word, even when it named another volume's journal). Paths that do not
/// resolve (RBD images, missing files) are left to the open.
fn agree_on_journals(named: &mut [ExportSpec]) -> anyhow::Result<()> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut journals: HashMap<PathBuf, (Option<PathBuf>, &str)> = HashMap::new();
    for e in named.iter() {
        if jbdev_device::is_rbd_target(&e.path) {
            continue;
        }
        let Ok(key) = std::fs::canonicalize(&e.path) else {
            continue;
        };
        let (journal, by) = journals.entry(key).or_insert((None, &e.name));
        match (&*journal, &e.journal) {
            (Some(a), Some(b)) if canonical(a) != canonical(b) => {
                let name = |n: &str| {
                    if n.is_empty() {
                        "the default export".to_string()
                    } else {
                        format!("export {n:?}")
                    }
                };
                usage_bail!(
                    "{} and {} serve the same volume {} but name different journals ({} and \
                     {}): give its journal once, or the same one",
                    name(by),
                    name(&e.name),
                    e.path.display(),
                    a.display(),
                    b.display()
                );
            }
            (None, Some(b)) => {
                *journal = Some(b.clone());
                *by = &e.name;
            }
            _ => {}
        }
    }
    let agreed: HashMap<PathBuf, PathBuf> = journals
        .into_iter()
        .filter_map(|(k, (j, _))| Some((k, j?)))
        .collect();
    for e in named.iter_mut() {
        if let Some(j) = std::fs::canonicalize(&e.path)
            .ok()
            .and_then(|k| agreed.get(&k))
        {
            e.journal = Some(j.clone());
        }
    }
    Ok(())
}

fn close_volumes(volumes: Vec<(PathBuf, Arc<Volume>)>) -> anyhow::Result<()> {
    // Every volume's failure is reported, not only the last one's: each
    // says what became of its acknowledged writes (salvaged, kept in the
    // journal, copied aside).
    let mut failures: Vec<anyhow::Error> = Vec::new();
    for (path, vol) in volumes {
        // Worker threads drop their last references just after their final
        // reply is sent; give them a moment before settling for a flush.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&vol) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let shown = path.display().to_string();
        let probe = vol.journal_probe();
        let left = move || {
            Some(CloseProgress {
                journal_left: probe.used_bytes(),
                home_written: probe.home_written_bytes(),
                cache_unwritten: probe.home_unwritten_bytes(),
            })
        };
        let done = match Arc::try_unwrap(vol) {
            Ok(v) => within(&format!("closing {shown}"), CLOSE_LIMIT, left, move || {
                // With the salvage's outcome: the abort's message was
                // written before it was known (session 25's docs pass: the
                // last line said nothing of it).
                let (r, stats) = v.close_with_stats();
                r.map_err(|e| {
                    let outcome = stats.close_outcome(&e);
                    anyhow::anyhow!("{e}{outcome}")
                })
            }),
            Err(v) => {
                // A connection outlived the grace time and still holds it.
                tracing::warn!("{shown} still in use at exit; flushing only");
                within(
                    &format!("flushing {shown}"),
                    FLUSH_LIMIT,
                    || None,
                    move || v.flush().map_err(anyhow::Error::from),
                )
            }
        };
        match done {
            Some(Ok(())) => {}
            Some(Err(e)) => failures.push(e.context(format!("closing {shown}"))),
            None => failures.push(anyhow::anyhow!(
                "{shown} was not closed (see above); exiting without its final \
                 flush. Writes acknowledged as durable are in its journal, \
                 which the next open replays; writes not yet flushed may be lost, as \
                 in a crash"
            )),
        }
    }
    match failures.len() {
        0 => {
            tracing::info!("all volumes flushed and closed");
            Ok(())
        }
        1 => Err(failures.remove(0)),
        n => {
            let all: Vec<String> = failures.iter().map(|e| format!("{e:#}")).collect();
            Err(anyhow::anyhow!(
                "{n} volumes failed to close:\n- {}",
                all.join("\n- ")
            ))
        }
    }
}

/// What a close has left to do, as [`within`] reads it.
#[derive(Clone, Copy, Debug)]
struct CloseProgress {
    /// Bytes of the journal still to write home.
    journal_left: u64,
    /// Bytes the checkpoint wrote home so far.
    home_written: u64,
    /// Bytes of the home's page cache still to write back (None: not
    /// known).
    cache_unwritten: Option<u64>,
}

impl CloseProgress {
    /// What moved since `was`, said in words; None if nothing did.
    fn since(&self, was: &CloseProgress, secs: u64) -> Option<String> {
        if self.journal_left < was.journal_left || self.home_written > was.home_written {
            return Some(format!(
                "{} MiB of the journal still to write home ({} MiB written home in the last {secs} s)",
                self.journal_left >> 20,
                self.home_written.saturating_sub(was.home_written) >> 20,
            ));
        }
        match (self.cache_unwritten, was.cache_unwritten) {
            (Some(now), Some(then)) if now < then => Some(format!(
                "{} MiB of the home's page cache still to write back ({} MiB written back in \
                 the last {secs} s)",
                now >> 20,
                (then - now) >> 20,
            )),
            _ => None,
        }
    }
}

/// Runs `f` on its own thread and waits for it at most `limit` without
/// progress, saying every 10 s that it still waits. Progress (`left`): the
/// bytes of the journal still to write home went down, or the bytes the
/// checkpoint wrote home went up (a round frees log space only when it
/// ends, and one round on a slow store can take minutes: session 27's pass
/// had a close writing 2.5 MiB every 10 s given up as hung), or the home's
/// dirty page cache went down (the final flush of a `--buffered` home
/// writes all of it back: session 28's pass had one on a 128 KiB/s store
/// given up as hung after 60 s). None if `f` did not finish in time: its
/// thread is left behind (blocked on the store; the process exits without
/// it).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    left: impl Fn() -> Option<CloseProgress>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let rx = match jbdev_device::bounded::spawn_with_result("jbdev-close", f) {
        Ok(rx) => rx,
        Err(e) => {
            tracing::error!("{what}: cannot start a thread ({e})");
            return None;
        }
    };
    let start = std::time::Instant::now();
    // The limit runs from the last progress (`left`: bytes still to write
    // home, going down), not from the start.
    let mut progress_at = start;
    let mut last_left = left();
    loop {
        let quiet = progress_at.elapsed();
        match rx.recv_timeout(limit.saturating_sub(quiet).min(Duration::from_secs(10))) {
            Ok(v) => return Some(v),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                tracing::error!("{what}: failed without a result (a panic)");
                return None;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let now_left = left();
                if let (Some(was), Some(now)) = (last_left, now_left) {
                    if let Some(said) = now.since(&was, progress_at.elapsed().as_secs()) {
                        tracing::info!("{what}: {said}");
                        progress_at = std::time::Instant::now();
                        last_left = now_left;
                        continue;
                    }
                }
                let quiet = progress_at.elapsed();
                if quiet >= limit {
                    tracing::error!(
                        "{what}: no progress and no answer from the store in {} s; giving up",
                        quiet.as_secs()
                    );
                    return None;
                }
                tracing::warn!(
                    "{what}: still waiting for the store after {} s without progress (at most \
                     {} s)",
                    quiet.as_secs(),
                    limit.as_secs()
                );
            }
        }
    }
}

/// `--direct-write-threshold`: a size (`256K`, `1M`, bytes), or `0` / `none`
/// for "never".
fn parse_threshold(s: &str) -> Result<u64, String> {
    match s {
        "0" | "none" => Ok(u64::MAX),
        _ => jbdev_bench::cli::parse_size(s),
    }
}

/// What to add to "cannot open volume PATH" for an open error. "Format it"
/// only where no volume is: one that fails to open may hold acknowledged
/// writes its journal has yet to replay.
fn open_hint(e: &jbdev_volume::VolumeError, path: &std::path::Path, read_only: bool) -> String {
    if !read_only && jbdev_volume::is_not_writable(e.errno()) {
        return " (it cannot be opened for writing here: serve it with --read-only)".into();
    }
    if matches!(e, jbdev_volume::VolumeError::NotAVolume(m) if !m.contains("jbdev format")) {
        format!(
            " (create one with `jbdev format {} --size 1G`)",
            path.display()
        )
    } else if jbdev_volume::is_no_space(e.errno()) {
        " (the backing store is full: recovery writes the journal's blocks home before \
         the volume opens, and the journal keeps them until then. Free space on the \
         file system and start again; do not reformat)"
            .into()
    } else {
        String::new()
    }
}

/// A sparse image whose holes are larger than its file system's free space
/// will make writes fail with ENOSPC once that
/// space runs out: say so at startup, while it can still be fixed.
fn warn_if_sparse_on_a_small_fs(path: &std::path::Path) {
    if let Ok(Some(sp)) = jbdev_device::file::file_space(path) {
        if let Some(w) = crate::admin::space_warning(&sp, path) {
            tracing::warn!("{}: {w}", path.display());
        }
    }
}

/// The key of `by_path` that names the same RBD image as `path`, however
/// spelled (`rbd::same_image`): two exports of one image share one open
/// volume (found by a new-user pass: the second opener was refused by the
/// first one's lock, with "if that holder is dead, --break-lock" advice,
/// and following it the server fenced itself).
#[cfg(feature = "rbd")]
fn same_rbd_key<'a>(
    mut keys: impl Iterator<Item = &'a PathBuf>,
    path: &std::path::Path,
) -> Option<PathBuf> {
    let p = path.to_str()?;
    keys.find(|k| {
        jbdev_device::is_rbd_target(k)
            && k.to_str()
                .is_some_and(|k| jbdev_device::rbd::same_image(k, p))
    })
    .cloned()
}

#[cfg(not(feature = "rbd"))]
fn same_rbd_key<'a>(
    _keys: impl Iterator<Item = &'a PathBuf>,
    _path: &std::path::Path,
) -> Option<PathBuf> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A close that never returns (a store that stopped answering) is given
    /// up at its limit and the caller goes on; one that returns is waited
    /// for, and a panic in it is an error, not a wait.
    #[test]
    fn a_close_that_hangs_is_given_up_at_its_limit() {
        let (hold, hung) = std::sync::mpsc::channel::<()>();
        let limit = Duration::from_millis(50);
        let got = within(
            "closing hung.img",
            limit,
            || Some(progress(1, 0, Some(1))),
            move || hung.recv().is_ok(),
        );
        assert_eq!(got, None, "a hung close was waited for");
        drop(hold);
        assert_eq!(
            within("closing ok.img", limit * 100, || None, || 7),
            Some(7)
        );
        let panicked: Option<()> =
            within("closing bad.img", limit * 100, || None, || panic!("boom"));
        assert_eq!(panicked, None);
    }

    /// A close that writes its journal home for longer than the limit, but
    /// makes progress all along, is waited for (session 26's pass: a large
    /// journal's close was going to be given up as a hung store).
    #[test]
    fn a_close_that_makes_progress_is_waited_for_past_the_limit() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let left = Arc::new(AtomicU64::new(20));
        let l2 = left.clone();
        let limit = Duration::from_millis(500);
        let got = within(
            "closing big.img",
            limit,
            move || Some(progress(l2.load(Ordering::Acquire), 0, None)),
            move || {
                while left.load(Ordering::Acquire) > 0 {
                    std::thread::sleep(Duration::from_millis(50));
                    left.fetch_sub(1, Ordering::AcqRel);
                }
                7
            },
        );
        assert_eq!(got, Some(7), "a close making progress was given up");
    }

    /// Inside one checkpoint round the log's bytes in use do not go down
    /// until the round ends; the bytes written home are the progress then
    /// (session 27's pass: a round on a store writing 256 KiB/s was given
    /// up as hung after 60 s, while it wrote 2.5 MiB every 10 s).
    #[test]
    fn a_close_writing_one_long_round_is_waited_for_past_the_limit() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let home = Arc::new(AtomicU64::new(0));
        let h2 = home.clone();
        let limit = Duration::from_millis(500);
        let got = within(
            "closing slow.img",
            limit,
            move || Some(progress(64 << 20, h2.load(Ordering::Acquire), None)),
            move || {
                for _ in 0..20 {
                    std::thread::sleep(Duration::from_millis(50));
                    home.fetch_add(4096, Ordering::AcqRel);
                }
                7
            },
        );
        assert_eq!(got, Some(7), "a close writing home was given up");
    }

    fn progress(
        journal_left: u64,
        home_written: u64,
        cache_unwritten: Option<u64>,
    ) -> CloseProgress {
        CloseProgress {
            journal_left,
            home_written,
            cache_unwritten,
        }
    }

    /// The final flush of a `--buffered` home writes its dirty page cache
    /// back after every checkpoint write has returned: neither the journal
    /// nor the bytes written home move then, the cache going down is the
    /// progress (session 28's pass: such a close on a 128 KiB/s store was
    /// given up as hung after 60 s). The cache staying put is no progress.
    #[test]
    fn a_close_writing_the_page_cache_back_is_waited_for_past_the_limit() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let dirty = Arc::new(AtomicU64::new(20 << 20));
        let d2 = dirty.clone();
        let limit = Duration::from_millis(500);
        let got = within(
            "closing buffered.img",
            limit,
            move || Some(progress(64 << 20, 0, Some(d2.load(Ordering::Acquire)))),
            move || {
                while dirty.load(Ordering::Acquire) > 0 {
                    std::thread::sleep(Duration::from_millis(50));
                    dirty.fetch_sub(1 << 20, Ordering::AcqRel);
                }
                7
            },
        );
        assert_eq!(got, Some(7), "a close writing its cache back was given up");
        let was = progress(64 << 20, 0, Some(8 << 20));
        assert!(progress(64 << 20, 0, Some(8 << 20))
            .since(&was, 10)
            .is_none());
        assert!(progress(64 << 20, 0, None).since(&was, 10).is_none());
        let said = progress(64 << 20, 0, Some(5 << 20))
            .since(&was, 10)
            .unwrap();
        assert!(said.contains("5 MiB of the home's page cache"), "{said}");
    }

    #[test]
    fn a_store_not_writable_here_suggests_read_only() {
        let erofs = jbdev_volume::VolumeError::Device(jbdev_device::DeviceError::Io {
            op: "open",
            what: "v.img".into(),
            error: std::io::Error::from_raw_os_error(30),
        });
        let p = Path::new("v.img");
        assert!(open_hint(&erofs, p, false).contains("--read-only"));
        assert_eq!(open_hint(&erofs, p, true), "");
        let missing = jbdev_volume::VolumeError::NotAVolume("v.img is too small".into());
        assert!(open_hint(&missing, p, false).contains("jbdev format"));
    }

    #[test]
    fn an_export_may_name_its_journal() {
        let e = parse_export("a=/v.img,journal=/j.jnl,description=x, y").unwrap();
        assert_eq!(e.path, Path::new("/v.img"));
        assert_eq!(e.journal.as_deref(), Some(Path::new("/j.jnl")));
        assert_eq!(e.description, "x, y");
        let e = parse_export("a=/v.img,journal=/j.jnl").unwrap();
        assert_eq!(
            (e.path.as_path(), e.journal.as_deref()),
            (Path::new("/v.img"), Some(Path::new("/j.jnl")))
        );
        let e = parse_export("a=/v.img").unwrap();
        assert_eq!((e.journal, e.description.as_str()), (None, ""));
        assert!(parse_export("a=/v.img,journal=").is_err());
        assert!(parse_export("a=,journal=/j.jnl").is_err());
    }

    #[test]
    fn an_unknown_export_key_is_refused_unless_the_path_exists() {
        let none = |_: &str| false;
        for (spec, key) in [
            ("a=v.img,descr=typo", "descr"),
            ("a=v.img,Journal=j", "Journal"),
            ("a=v.img,journal=j.jnl,desc=x", "desc"),
            ("a=v.img,read-only=1,description=d", "read-only"),
        ] {
            let e = parse_export_with(spec, none).err().expect(spec);
            let msg = e.to_string();
            assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{spec}");
            assert!(msg.contains(&format!("unknown key {key:?}")), "{msg}");
            assert!(msg.contains("journal, description"), "{msg}");
        }
        // A path that really holds ",x=" is served as it is.
        let e = parse_export_with("a=/d/v,x=1.img", |p| p == "/d/v,x=1.img").unwrap();
        assert_eq!(e.path, Path::new("/d/v,x=1.img"));
        // Commas that are not followed by KEY= are part of the path, and the
        // description may hold anything.
        let e = parse_export_with("a=/d/v,1.img,description=a,b=c", none).unwrap();
        assert_eq!(
            (e.path.as_path(), e.description.as_str()),
            (Path::new("/d/v,1.img"), "a,b=c")
        );
        assert!(parse_export_with("a=/d/v,=1.img", none).is_ok());
    }

    #[test]
    fn plain_text_on_a_reachable_address_is_warned_about() {
        let any: SocketAddr = "0.0.0.0:10809".parse().unwrap();
        let lan: SocketAddr = "192.0.2.7:10809".parse().unwrap();
        for addr in [any, lan] {
            let w = plain_text_warning(addr, TlsMode::Off).expect("warned");
            assert!(
                w.contains("without TLS") && w.contains("--tls=require"),
                "{w}"
            );
            let w = plain_text_warning(addr, TlsMode::On).expect("warned");
            assert!(w.contains("--tls=on"), "{w}");
            assert_eq!(plain_text_warning(addr, TlsMode::Require), None);
        }
        for local in ["127.0.0.1:10809", "[::1]:10809"] {
            let addr: SocketAddr = local.parse().unwrap();
            assert_eq!(plain_text_warning(addr, TlsMode::Off), None, "{local}");
        }
    }
}
