//! TLS for NBD connections (STARTTLS): X.509 certificates through rustls,
//! pre-shared keys (TLS-PSK) through OpenSSL (rustls has no PSK).
//!
//! Credentials use the layouts of nbdkit and qemu-nbd: a certificates
//! directory holds `server-cert.pem`, `server-key.pem` and, to verify
//! client certificates, `ca-cert.pem`; a PSK file holds `identity:hexkey`
//! lines as written by `psktool`.
//!
//! # How a session is driven
//!
//! A connection is read by one task and written by another on the
//! server's network threads (see [`crate::conn`]), but a TLS session is
//! one object. Both engines are used *sans I/O*: the session never touches
//! the socket. It sits behind one mutex together with the ciphertext it has
//! made but nobody has taken yet ([`TlsRead`] and [`TlsWrite`] share it):
//! * the reading half reads ciphertext from the socket with no lock held
//!   (so a read waiting on an idle client never blocks replies), then,
//!   under the lock, feeds it to the session and takes the plaintext out.
//!   Records the session makes while reading (handshake messages, alerts,
//!   key updates) are appended to the shared outgoing buffer, and the
//!   connection's writer is woken (a [`Notify`]) to send them;
//! * the writing half encrypts at most [`WRITE_CHUNK_BYTES`] of plaintext
//!   under the lock, appending the records to the same buffer, and is the
//!   only one that writes to the socket: it moves the buffer's contents to
//!   its own pending bytes (under the lock) and writes those with no lock
//!   held.
//!
//! So records reach the wire in the order the session made them, with one
//! lock and no lock held across a socket operation or an `.await`. During
//! the option haggling, where one task both reads and writes, the
//! handshake's reads flush the writing half whenever the reading half asks
//! for it (see `server::HandshakeIo`). Memory per connection: the session's
//! buffers (about one record each way), one 16 KiB ciphertext read buffer
//! and, while a reply is written, one chunk of records.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use crate::stream::{AsyncIn, AsyncOut};

/// Whether and how clients may or must use TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: STARTTLS is refused (`ERR_POLICY`).
    #[default]
    Off,
    /// Clients choose: STARTTLS is accepted, plain clients are served too.
    On,
    /// Every option but STARTTLS and ABORT gets `ERR_TLS_REQD` until TLS is
    /// up, so nothing (not even the list of exports) is visible without it.
    Require,
}

impl FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "on" => Ok(Self::On),
            "require" => Ok(Self::Require),
            _ => Err(format!("{s:?}: want off, on or require")),
        }
    }
}

/// An error in TLS credentials (files missing or malformed).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(String);

fn setup_err(what: impl Into<String>) -> TlsSetupError {
    TlsSetupError(what.into())
}

/// Longest PSK identity accepted from a key file.
const MAX_PSK_IDENTITY_BYTES: usize = 256;
/// Longest key accepted from a key file (OpenSSL's limit is 512 bytes).
const MAX_PSK_KEY_BYTES: usize = 256;
/// Largest PSK file read.
const MAX_PSK_FILE_BYTES: u64 = 1 << 20;

/// TLS settings of a server: the mode and the credentials.
pub struct TlsConfig {
    pub mode: TlsMode,
    creds: Creds,
}

enum Creds {
    X509(Arc<rustls::ServerConfig>),
    Psk(openssl::ssl::SslContext),
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .field("credentials", &self.describe())
            .finish()
    }
}

/// What is wrong with a server certificate's dates, if anything: one that
/// has expired or is not valid yet is loaded (so is nbdkit's and
/// qemu-nbd's), but every client that checks it refuses the session, and
/// without a word here the operator sees only failing clients. `None` also
/// when the certificate cannot be parsed here (rustls judges it).
pub fn validity_warning(leaf: &[u8], path: &Path) -> Option<String> {
    let cert = openssl::x509::X509::from_der(leaf).ok()?;
    let now = openssl::asn1::Asn1Time::days_from_now(0).ok()?;
    let p = path.display();
    if cert.not_after() < now {
        Some(format!(
            "the server certificate {p} expired on {}: clients that check it refuse every \
             TLS session",
            cert.not_after()
        ))
    } else if cert.not_before() > now {
        Some(format!(
            "the server certificate {p} is not valid before {}: clients that check it \
             refuse every TLS session until then",
            cert.not_before()
        ))
    } else {
        None
    }
}

impl TlsConfig {
    /// X.509: `DIR/server-cert.pem` (the chain, leaf first),
    /// `DIR/server-key.pem`; with `verify_peer`, clients must present a
    /// certificate signed by a CA in `DIR/ca-cert.pem`.
    pub fn from_certificates(
        dir: &Path,
        verify_peer: bool,
        mode: TlsMode,
    ) -> Result<Self, TlsSetupError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};

        let file = |name: &str| -> PathBuf { dir.join(name) };
        let certs = |p: &Path| -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
            let certs = CertificateDer::pem_file_iter(p)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| setup_err(format!("cannot read certificates {}: {e}", p.display())))?;
            if certs.is_empty() {
                return Err(setup_err(format!("no certificate in {}", p.display())));
            }
            Ok(certs)
        };
        let chain = certs(&file("server-cert.pem"))?;
        if let Some(w) = validity_warning(&chain[0], &file("server-cert.pem")) {
            tracing::warn!("{w}");
        }
        let key_path = file("server-key.pem");
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| {
            setup_err(format!(
                "cannot read the private key {}: {e}",
                key_path.display()
            ))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| setup_err(format!("TLS setup: {e}")))?;
        let builder = if verify_peer {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(&file("ca-cert.pem"))? {
                roots
                    .add(c)
                    .map_err(|e| setup_err(format!("ca-cert.pem: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| setup_err(format!("client verification: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let cfg = builder
            .with_single_cert(chain, key)
            .map_err(|e| setup_err(format!("server certificate and key: {e}")))?;
        Ok(Self {
            mode,
            creds: Creds::X509(Arc::new(cfg)),
        })
    }

    /// TLS-PSK with the keys of `path`: `identity:hexkey` lines (psktool's
    /// format); empty lines and `#` comments are skipped.
    pub fn from_psk_file(path: &Path, mode: TlsMode) -> Result<Self, TlsSetupError> {
        use openssl::ssl::{SslContext, SslMethod, SslOptions, SslVersion};

        let text = read_bounded(path)?;
        let keys =
            parse_psk_file(&text).map_err(|e| setup_err(format!("{}: {e}", path.display())))?;
        let mut b = SslContext::builder(SslMethod::tls_server())
            .map_err(|e| setup_err(format!("TLS setup: {e}")))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| setup_err(format!("TLS setup: {e}")))?;
        // TLS 1.2 suites that authenticate by PSK (TLS 1.3 uses the same
        // callback with its own suites).
        b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK:!aNULL:!eNULL:!NULL:!3DES:!RC4")
            .map_err(|e| setup_err(format!("TLS setup: {e}")))?;
        // No session tickets: resumption buys nothing for long connections.
        b.set_options(SslOptions::NO_TICKET);
        b.set_num_tickets(0)
            .map_err(|e| setup_err(format!("TLS setup: {e}")))?;
        b.set_psk_server_callback(move |_ssl, identity, out| {
            let key = identity.and_then(|id| keys.get(id));
            match key.and_then(|k| out.get_mut(..k.len()).map(|o| (o, k))) {
                Some((o, k)) => {
                    o.copy_from_slice(k);
                    Ok(k.len())
                }
                None => {
                    // The handshake's failure is logged (rate-limited)
                    // with the peer; this only says why.
                    tracing::debug!("TLS-PSK: client offered an unknown identity");
                    Ok(0) // the handshake fails
                }
            }
        });
        Ok(Self {
            mode,
            creds: Creds::Psk(b.build()),
        })
    }

    pub fn describe(&self) -> &'static str {
        match self.creds {
            Creds::X509(_) => "X.509 certificates",
            Creds::Psk(_) => "PSK",
        }
    }

    /// Wraps a connection's raw halves in a new server session. `ahead`:
    /// bytes already read from the socket after the STARTTLS option (they
    /// belong to the TLS handshake). `wake` is notified when the reading
    /// half made records that the writing half must send.
    pub(crate) fn wrap(
        &self,
        raw_in: AsyncIn,
        raw_out: AsyncOut,
        ahead: &[u8],
        wake: Arc<Notify>,
    ) -> io::Result<(TlsRead, TlsWrite)> {
        let engine: Box<dyn Engine> = match &self.creds {
            Creds::X509(cfg) => {
                let mut c = rustls::ServerConnection::new(cfg.clone())
                    .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
                // Our writer bounds what it hands over per call.
                c.set_buffer_limit(None);
                Box::new(RustlsEngine(c))
            }
            Creds::Psk(ctx) => {
                let ssl = openssl::ssl::Ssl::new(ctx)
                    .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
                let s = openssl::ssl::SslStream::new(ssl, MemIo::default())
                    .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
                Box::new(OpensslEngine {
                    s,
                    handshaken: false,
                })
            }
        };
        let shared = Arc::new(Mutex::new(Session {
            engine,
            out: Vec::new(),
        }));
        let mut raw = vec![0u8; RAW_READ_BYTES.max(ahead.len())];
        let end = ahead.len();
        if let Some(dst) = raw.get_mut(..end) {
            dst.copy_from_slice(ahead);
        }
        Ok((
            TlsRead {
                shared: shared.clone(),
                sock: raw_in,
                raw,
                start: 0,
                end,
                wake,
            },
            TlsWrite {
                shared,
                sock: raw_out,
                pending: Vec::new(),
                sent: 0,
                closed: false,
            },
        ))
    }
}

fn read_bounded(path: &Path) -> Result<String, TlsSetupError> {
    let f = std::fs::File::open(path)
        .map_err(|e| setup_err(format!("cannot open {}: {e}", path.display())))?;
    let mut text = String::new();
    f.take(MAX_PSK_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| setup_err(format!("cannot read {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_PSK_FILE_BYTES {
        return Err(setup_err(format!(
            "{} is larger than {MAX_PSK_FILE_BYTES} bytes",
            path.display()
        )));
    }
    Ok(text)
}

/// Parses psktool's `identity:hexkey` lines. Errors name the line, never
/// the key.
pub fn parse_psk_file(text: &str) -> Result<HashMap<Vec<u8>, Vec<u8>>, String> {
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        let Some((id, hex)) = line.rsplit_once(':') else {
            return Err(format!("line {n}: want identity:hexkey"));
        };
        if id.is_empty() || id.len() > MAX_PSK_IDENTITY_BYTES {
            return Err(format!(
                "line {n}: the identity must be 1 to {MAX_PSK_IDENTITY_BYTES} bytes"
            ));
        }
        let key = decode_hex(hex).ok_or_else(|| format!("line {n}: the key is not hex"))?;
        if key.is_empty() || key.len() > MAX_PSK_KEY_BYTES {
            return Err(format!(
                "line {n}: the key must be 1 to {MAX_PSK_KEY_BYTES} bytes"
            ));
        }
        if keys.insert(id.as_bytes().to_vec(), key).is_some() {
            return Err(format!("line {n}: identity {id:?} appears twice"));
        }
    }
    if keys.is_empty() {
        return Err("no keys".into());
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.as_bytes()
        .chunks(2)
        .map(|p| {
            let hi = (*p.first()? as char).to_digit(16)?;
            let lo = (*p.get(1)? as char).to_digit(16)?;
            Some((hi * 16 + lo) as u8)
        })
        .collect()
}

// ------------------------------------------------------------- engines

/// A TLS server session used without I/O of its own.
trait Engine: Send {
    /// Takes ciphertext from the peer; returns how much was consumed. An
    /// error is fatal (a failed handshake, a bad record); alerts for the
    /// peer may then be waiting in [`Engine::take_outgoing`].
    fn feed(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Decrypted bytes: `WouldBlock` when none are buffered, `Ok(0)` once
    /// the peer closed the session.
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Encrypts `data` (or a prefix of it).
    fn write_plain(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Appends the records waiting to be sent to `out`.
    fn take_outgoing(&mut self, out: &mut Vec<u8>) -> io::Result<()>;
    /// Queues a close_notify alert.
    fn close(&mut self);
}

fn tls_error(e: impl std::fmt::Display) -> io::Error {
    // InvalidData: the connection's end is logged at info level.
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

struct RustlsEngine(rustls::ServerConnection);

impl Engine for RustlsEngine {
    fn feed(&mut self, mut data: &[u8]) -> io::Result<usize> {
        let n = self.0.read_tls(&mut data)?;
        self.0.process_new_packets().map_err(tls_error)?;
        Ok(n)
    }
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.reader().read(buf)
    }
    fn write_plain(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0.writer().write(data)
    }
    fn take_outgoing(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.0.wants_write() {
            self.0.write_tls(out)?;
        }
        Ok(())
    }
    fn close(&mut self) {
        self.0.send_close_notify();
    }
}

/// The memory "socket" under OpenSSL: ciphertext in and out.
#[derive(Default)]
struct MemIo {
    incoming: Vec<u8>,
    pos: usize,
    outgoing: Vec<u8>,
}

impl Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = self.incoming.get(self.pos..).unwrap_or_default();
        if avail.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = avail.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), avail.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.pos += n;
        if self.pos == self.incoming.len() {
            self.incoming.clear();
            self.pos = 0;
        }
        Ok(n)
    }
}

impl Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct OpensslEngine {
    s: openssl::ssl::SslStream<MemIo>,
    handshaken: bool,
}

impl Engine for OpensslEngine {
    fn feed(&mut self, data: &[u8]) -> io::Result<usize> {
        self.s.get_mut().incoming.extend_from_slice(data);
        if !self.handshaken {
            match self.s.accept() {
                Ok(()) => self.handshaken = true,
                Err(e) if e.code() == openssl::ssl::ErrorCode::WANT_READ => {}
                Err(e) => return Err(tls_error(format!("handshake failed: {e}"))),
            }
        }
        Ok(data.len())
    }
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use openssl::ssl::ErrorCode;
        if !self.handshaken {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match self.s.ssl_read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Ok(0),
            Err(e) if e.code() == ErrorCode::WANT_READ => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(tls_error(e)),
        }
    }
    fn write_plain(&mut self, data: &[u8]) -> io::Result<usize> {
        if !self.handshaken {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "TLS handshake not finished",
            ));
        }
        self.s.ssl_write(data).map_err(tls_error)
    }
    fn take_outgoing(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        out.append(&mut self.s.get_mut().outgoing);
        Ok(())
    }
    fn close(&mut self) {
        if self.handshaken {
            let _ = self.s.shutdown();
        }
    }
}

// -------------------------------------------------------------- halves

/// Ciphertext read from the socket at once.
const RAW_READ_BYTES: usize = 16 << 10;
/// Plaintext encrypted per write call (records are written before the
/// next chunk is taken, so this bounds the writer's buffer).
pub const WRITE_CHUNK_BYTES: usize = 64 << 10;

/// The session and the records it made that are not yet taken by the
/// writing half, in the order it made them.
struct Session {
    engine: Box<dyn Engine>,
    out: Vec<u8>,
}

impl Session {
    /// Moves the session's new records to `out`; true if there were any.
    fn collect(&mut self) -> io::Result<bool> {
        let before = self.out.len();
        self.engine.take_outgoing(&mut self.out)?;
        Ok(self.out.len() > before)
    }
}

/// The reading half of a TLS connection.
pub struct TlsRead {
    shared: Arc<Mutex<Session>>,
    sock: AsyncIn,
    /// Ciphertext read but not yet taken by the session: `raw[start..end]`.
    raw: Vec<u8>,
    start: usize,
    end: usize,
    wake: Arc<Notify>,
}

impl AsyncRead for TlsRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut st = this.shared.lock();
            match st.engine.read_plain(buf.initialize_unfilled()) {
                Ok(n) => {
                    let made = st.collect();
                    drop(st);
                    if made? {
                        this.wake.notify_one();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            if let Some(pending) = this.raw.get(this.start..this.end).filter(|p| !p.is_empty()) {
                let fed = st.engine.feed(pending);
                // On an error the records are alerts telling the peer why
                // (best effort).
                let made = st.collect();
                drop(st);
                if matches!(made, Ok(true)) {
                    this.wake.notify_one();
                }
                match fed {
                    Ok(0) => {
                        return Poll::Ready(Err(tls_error("the session accepts no more input")))
                    }
                    Ok(n) => {
                        this.start += n;
                        made?;
                        continue;
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            drop(st);
            // No lock held while waiting for the client.
            let mut rb = ReadBuf::new(&mut this.raw);
            ready!(Pin::new(&mut this.sock).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(())); // end of stream
            }
            this.start = 0;
            this.end = n;
        }
    }
}

/// The writing half of a TLS connection: the only one that writes to the
/// socket. `shutdown` sends close_notify.
pub struct TlsWrite {
    shared: Arc<Mutex<Session>>,
    sock: AsyncOut,
    /// Records taken from the session, sent up to `sent`.
    pending: Vec<u8>,
    sent: usize,
    closed: bool,
}

impl TlsWrite {
    /// Sends every record the session has made so far (by either half).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.sent == self.pending.len() {
                self.pending.clear();
                self.sent = 0;
                let mut st = self.shared.lock();
                if st.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                std::mem::swap(&mut self.pending, &mut st.out);
                continue;
            }
            let rest = self.pending.get(self.sent..).unwrap_or_default();
            let n = ready!(Pin::new(&mut self.sock).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
    }
}

impl AsyncWrite for TlsWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Earlier records first: this bounds what waits here to one chunk.
        ready!(this.poll_drain(cx))?;
        let mut st = this.shared.lock();
        let mut taken = 0;
        'bufs: for b in bufs {
            let mut rest: &[u8] = b;
            while !rest.is_empty() {
                let room = WRITE_CHUNK_BYTES - taken;
                if room == 0 {
                    break 'bufs;
                }
                let part = rest.get(..rest.len().min(room)).unwrap_or(rest);
                let n = st.engine.write_plain(part)?;
                if n == 0 {
                    break 'bufs;
                }
                taken += n;
                rest = rest.get(n..).unwrap_or_default();
            }
        }
        st.collect()?;
        drop(st);
        // Send now what the socket takes; the rest goes with the next write
        // or flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.sock).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !std::mem::replace(&mut this.closed, true) {
            let mut st = this.shared.lock();
            st.engine.close();
            st.collect()?;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.sock).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_parse_and_bad_lines_are_refused() {
        let k = parse_psk_file("# comment\nalice:00ff10\n\nbob:0102\n").unwrap();
        assert_eq!(k.get(&b"alice"[..]), Some(&vec![0x00, 0xff, 0x10]));
        assert_eq!(k.get(&b"bob"[..]), Some(&vec![1, 2]));
        for bad in [
            "",
            "alice",
            "alice:0g",
            "alice:123",
            ":00",
            "alice:",
            "a:00\na:01",
        ] {
            let e = parse_psk_file(bad).unwrap_err();
            assert!(!e.contains("00ff"), "{e}");
        }
        // An identity may contain ':'; the key is after the last one.
        let k = parse_psk_file("a:b:0a").unwrap();
        assert_eq!(k.get(&b"a:b"[..]), Some(&vec![10]));
    }

    #[test]
    fn modes_parse() {
        assert_eq!("off".parse::<TlsMode>(), Ok(TlsMode::Off));
        assert_eq!("on".parse::<TlsMode>(), Ok(TlsMode::On));
        assert_eq!("require".parse::<TlsMode>(), Ok(TlsMode::Require));
        assert!("yes".parse::<TlsMode>().is_err());
    }

    /// A self-signed certificate valid from `from` to `to` (Unix seconds).
    fn cert_valid(from: i64, to: i64) -> Vec<u8> {
        use openssl::{asn1::Asn1Time, ec, hash::MessageDigest, nid::Nid, pkey::PKey, x509};
        let group = ec::EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(ec::EcKey::generate(&group).unwrap()).unwrap();
        let mut name = x509::X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "localhost").unwrap();
        let name = name.build();
        let mut b = x509::X509Builder::new().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&Asn1Time::from_unix(from).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::from_unix(to).unwrap()).unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        b.build().to_der().unwrap()
    }

    #[test]
    fn a_certificate_out_of_its_dates_is_warned_about() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let p = Path::new("/etc/x/server-cert.pem");
        let day = 86_400;
        assert_eq!(validity_warning(&cert_valid(now - day, now + day), p), None);
        let w = validity_warning(&cert_valid(now - 3 * day, now - day), p).unwrap();
        assert!(w.contains("/etc/x/server-cert.pem expired on"), "{w}");
        let w = validity_warning(&cert_valid(now + day, now + 3 * day), p).unwrap();
        assert!(w.contains("is not valid before"), "{w}");
        assert_eq!(validity_warning(b"not a certificate", p), None);
    }
}
