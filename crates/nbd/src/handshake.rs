//! The fixed-newstyle handshake (option haggling), server side.
//!
//! Runs as the connection's task on the server's network threads before
//! transmission starts (`async`, over a [`Transport`]). It reads with a
//! bounded buffer: option data larger than
//! [`MAX_OPTION_DATA_BYTES`] is consumed without being stored and answered
//! `ERR_TOO_BIG` (or dropped past [`MAX_OPTION_DISCARD_BYTES`]), and a client
//! that sends more than `max_options` options is dropped, so haggling cannot
//! exhaust memory or hold a connection slot forever (the server bounds the
//! whole negotiation by one deadline).
//!
//! TLS (`NBD_OPT_STARTTLS`) follows the spec's modes: [`TlsMode::Off`] is
//! NOTLS (STARTTLS gets `ERR_POLICY`), [`TlsMode::Require`] is FORCEDTLS
//! (every option but STARTTLS and ABORT gets `ERR_TLS_REQD` before TLS,
//! `EXPORT_NAME` ends the session) and [`TlsMode::On`] is SELECTIVETLS with
//! no TLS-only export. After the STARTTLS ACK the transport is upgraded
//! and everything negotiated before it is forgotten (structured replies,
//! extended headers, meta contexts), as the spec's servers do: options
//! sent in the clear could have been altered.

use std::io;
use std::sync::Arc;

use crate::codec::{self, ClientOption, HeaderMode, InfoRequest, MetaQuery, OptionHeader};
use crate::export::{Export, ExportSet};
use crate::proto::*;
use crate::tls::TlsMode;

/// The connection as the handshake sees it: bytes both ways, and the
/// upgrade to TLS once STARTTLS has been acknowledged.
// `async fn` in a public trait: callers use concrete transports only (the
// server's), so the futures' `Send` is known where they are spawned.
#[allow(async_fn_in_trait)]
pub trait Transport {
    /// Fills `buf` from the client.
    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `bytes` to the client and flushes them.
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Wraps the stream in a TLS server session; every later byte is
    /// encrypted. The TLS handshake itself runs as the next option is read.
    async fn start_tls(&mut self) -> io::Result<()>;
}

/// Option data we buffer and parse; larger options are refused.
pub const MAX_OPTION_DATA_BYTES: u32 = 64 << 10;
/// Largest option data we skip to stay in sync; beyond it we hang up.
pub const MAX_OPTION_DISCARD_BYTES: u32 = 16 << 20;

/// What the transmission phase needs from the handshake.
pub struct Session {
    pub export: Arc<Export>,
    pub structured_replies: bool,
    /// `base:allocation` was selected for this export.
    pub base_allocation: bool,
    pub header_mode: HeaderMode,
    /// The connection upgraded to TLS.
    pub tls: bool,
}

/// How the handshake ended.
pub enum Outcome {
    Transmission(Session),
    /// The client aborted or went away, or was dropped for a protocol
    /// violation (already logged).
    Closed,
}

/// Per-connection negotiation state.
struct State {
    no_zeroes: bool,
    structured: bool,
    /// Extended headers negotiated (implies `structured`).
    extended: bool,
    /// Export name the last SET_META_CONTEXT selected `base:allocation` for.
    meta_export: Option<String>,
    /// STARTTLS succeeded.
    tls: bool,
}

impl State {
    fn new(no_zeroes: bool, tls: bool) -> Self {
        Self {
            no_zeroes,
            structured: false,
            extended: false,
            meta_export: None,
            tls,
        }
    }
}

/// Knobs of the handshake.
#[derive(Clone, Debug)]
pub struct HandshakeLimits {
    pub max_options: u32,
    /// Whether STARTTLS is offered or required (the transport must be able
    /// to upgrade unless this is `Off`).
    pub tls: TlsMode,
}

/// Runs the handshake. `Err` is an I/O error (connection gone).
pub async fn negotiate<T: Transport>(
    io: &mut T,
    exports: &ExportSet,
    limits: &HandshakeLimits,
    shutting_down: &(dyn Fn() -> bool + Sync),
) -> io::Result<Outcome> {
    let Some(client_flags) = greet(io).await? else {
        return Ok(Outcome::Closed);
    };
    let mut st = State::new(client_flags & FLAG_C_NO_ZEROES != 0, false);

    let mut data = Vec::new();
    for _ in 0..limits.max_options {
        let mut hb = [0u8; OPTION_HEADER_BYTES];
        io.read_exact(&mut hb).await?;
        let head = match OptionHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => {
                crate::trouble::client_trouble(format_args!(
                    "dropping client during haggling: {e}"
                ));
                return Ok(Outcome::Closed);
            }
        };
        if head.length > MAX_OPTION_DATA_BYTES {
            if head.length > MAX_OPTION_DISCARD_BYTES {
                crate::trouble::client_trouble(format_args!(
                    "dropping client: option {} carries {} bytes",
                    head.option, head.length
                ));
                return Ok(Outcome::Closed);
            }
            discard(io, head.length.into()).await?;
            send_error(io, head.option, REP_ERR_TOO_BIG, "option data too large").await?;
            continue;
        }
        data.clear();
        data.resize(head.length as usize, 0);
        io.read_exact(&mut data).await?;

        if shutting_down() && head.option != OPT_ABORT {
            send_error(io, head.option, REP_ERR_SHUTDOWN, "server is shutting down").await?;
            continue;
        }
        if limits.tls == TlsMode::Require && !st.tls {
            match head.option {
                OPT_STARTTLS | OPT_ABORT => {}
                OPT_EXPORT_NAME => {
                    // Cannot be answered with an error: the spec says hang up.
                    crate::trouble::client_trouble(format_args!(
                        "dropping client: EXPORT_NAME before STARTTLS (TLS is required)"
                    ));
                    return Ok(Outcome::Closed);
                }
                o => {
                    send_error(io, o, REP_ERR_TLS_REQD, "TLS is required").await?;
                    continue;
                }
            }
        }
        let opt = match codec::parse_option(head.option, &data) {
            Ok(o) => o,
            Err(e) => {
                if matches!(head.option, OPT_SET_META_CONTEXT) {
                    st.meta_export = None; // a failed SET still replaces the set
                }
                send_error(io, head.option, e.reply_type(), &e.to_string()).await?;
                continue;
            }
        };
        match opt {
            ClientOption::ExportName(name) => {
                let Some(export) = name.as_deref().and_then(|n| exports.find(n)) else {
                    crate::trouble::client_trouble(format_args!(
                        "dropping client: EXPORT_NAME of an unknown export"
                    ));
                    return Ok(Outcome::Closed);
                };
                let flags = transmission_flags(&export, &st);
                let mut out = Vec::with_capacity(10 + 124);
                out.extend_from_slice(&export.size_bytes().to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                if !st.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                io.send(&out).await?;
                return Ok(Outcome::Transmission(session(export, &st, name.as_deref())));
            }
            ClientOption::Abort => {
                // The client may already have hung up; that is fine.
                let _ = send(io, &codec::encode_option_reply(OPT_ABORT, REP_ACK, &[])).await;
                return Ok(Outcome::Closed);
            }
            ClientOption::List => {
                for e in exports.iter() {
                    let mut d = Vec::new();
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    // Only what the operator set (`--export NAME=PATH,description=...`):
                    // never a path or anything else about the host.
                    d.extend_from_slice(e.description.as_bytes());
                    send(io, &codec::encode_option_reply(OPT_LIST, REP_SERVER, &d)).await?;
                }
                send(io, &codec::encode_option_reply(OPT_LIST, REP_ACK, &[])).await?;
            }
            ClientOption::StartTls => {
                if limits.tls == TlsMode::Off {
                    send_error(io, OPT_STARTTLS, REP_ERR_POLICY, "TLS is not enabled").await?;
                } else if st.tls {
                    send_error(io, OPT_STARTTLS, REP_ERR_INVALID, "TLS is already on").await?;
                } else {
                    send(io, &codec::encode_option_reply(OPT_STARTTLS, REP_ACK, &[])).await?;
                    // No downgrade after the ACK: a failure ends the session.
                    io.start_tls().await?;
                    // Forget what was negotiated in the clear.
                    st = State::new(st.no_zeroes, true);
                }
            }
            ClientOption::Info(req) | ClientOption::Go(req) => {
                let go = head.option == OPT_GO;
                if let Some(export) = answer_info(io, head.option, &req, exports, &st).await? {
                    if go {
                        return Ok(Outcome::Transmission(session(
                            export,
                            &st,
                            Some(req.export.as_str()),
                        )));
                    }
                }
            }
            ClientOption::ExtendedHeaders => {
                if st.extended {
                    send_error(
                        io,
                        head.option,
                        REP_ERR_INVALID,
                        "extended headers already negotiated",
                    )
                    .await?;
                } else {
                    // Supersedes structured replies if those came first.
                    st.extended = true;
                    st.structured = true;
                    send(io, &codec::encode_option_reply(head.option, REP_ACK, &[])).await?;
                }
            }
            ClientOption::StructuredReply if st.extended => {
                send_error(
                    io,
                    head.option,
                    REP_ERR_EXT_HEADER_REQD,
                    "extended headers already negotiated",
                )
                .await?;
            }
            ClientOption::StructuredReply => {
                if st.structured {
                    send_error(
                        io,
                        head.option,
                        REP_ERR_INVALID,
                        "structured replies already negotiated",
                    )
                    .await?;
                } else {
                    st.structured = true;
                    send(io, &codec::encode_option_reply(head.option, REP_ACK, &[])).await?;
                }
            }
            ClientOption::ListMetaContext(q) => {
                answer_meta(io, head.option, &q, exports, &mut st, false).await?;
            }
            ClientOption::SetMetaContext(q) => {
                answer_meta(io, head.option, &q, exports, &mut st, true).await?;
            }
            ClientOption::Unknown(o) => {
                send_error(io, o, REP_ERR_UNSUP, "option not supported").await?;
            }
        }
    }
    crate::trouble::client_trouble(format_args!(
        "dropping client after {} options without entering transmission",
        limits.max_options
    ));
    Ok(Outcome::Closed)
}

fn session(export: Arc<Export>, st: &State, name: Option<&str>) -> Session {
    // BLOCK_STATUS is allowed only if the last SET_META_CONTEXT named the
    // same export that the client went on to select.
    let base_allocation = st.structured
        && match (&st.meta_export, name) {
            (Some(m), Some(n)) => m == n,
            _ => false,
        };
    Session {
        export,
        structured_replies: st.structured,
        base_allocation,
        header_mode: if st.extended {
            HeaderMode::Extended
        } else {
            HeaderMode::Compact
        },
        tls: st.tls,
    }
}

/// The transmission flags of `export` for this connection's state.
fn transmission_flags(export: &Export, st: &State) -> u16 {
    let mut f = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_CACHE
        // Honest: every connection shares one volume whose flush covers all
        // writes that returned before it, on any connection.
        | FLAG_CAN_MULTI_CONN;
    if export.backend.read_only() {
        f |= FLAG_READ_ONLY;
    } else {
        f |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    }
    if st.structured {
        f |= FLAG_SEND_DF;
    }
    f
}

async fn answer_info<T: Transport>(
    writer: &mut T,
    option: u32,
    req: &InfoRequest,
    exports: &ExportSet,
    st: &State,
) -> io::Result<Option<Arc<Export>>> {
    let Some(export) = exports.find(&req.export) else {
        send_error(writer, option, REP_ERR_UNKNOWN, "no such export").await?;
        return Ok(None);
    };
    let mut out = Vec::new();
    let flags = transmission_flags(&export, st);
    out.extend(codec::encode_option_reply(
        option,
        REP_INFO,
        &codec::info_export(export.size_bytes(), flags),
    ));
    let mut seen = [false; 4];
    for &t in &req.info_types {
        let Some(slot) = seen.get_mut(usize::from(t)) else {
            continue; // unknown information types are ignored
        };
        if std::mem::replace(slot, true) {
            continue;
        }
        let payload = match t {
            INFO_NAME => codec::info_string(INFO_NAME, &export.name),
            INFO_DESCRIPTION if export.description.is_empty() => continue,
            INFO_DESCRIPTION => codec::info_string(INFO_DESCRIPTION, &export.description),
            INFO_BLOCK_SIZE => codec::info_block_size(
                export.min_block_bytes,
                export.backend.preferred_block_bytes().max(512),
                MAX_PAYLOAD_BYTES,
            ),
            _ => continue, // INFO_EXPORT is always sent above
        };
        out.extend(codec::encode_option_reply(option, REP_INFO, &payload));
    }
    out.extend(codec::encode_option_reply(option, REP_ACK, &[]));
    send(writer, &out).await?;
    Ok(Some(export))
}

/// LIST_META_CONTEXT (`set == false`) and SET_META_CONTEXT.
async fn answer_meta<T: Transport>(
    writer: &mut T,
    option: u32,
    q: &MetaQuery,
    exports: &ExportSet,
    st: &mut State,
    set: bool,
) -> io::Result<()> {
    if set {
        st.meta_export = None;
    }
    if !st.structured {
        return send_error(
            writer,
            option,
            REP_ERR_INVALID,
            "negotiate structured replies first",
        )
        .await;
    }
    if exports.find(&q.export).is_none() {
        return send_error(writer, option, REP_ERR_UNKNOWN, "no such export").await;
    }
    let matches = if set {
        q.queries.iter().any(|s| s == CONTEXT_BASE_ALLOCATION)
    } else {
        q.queries.is_empty()
            || q.queries
                .iter()
                .any(|s| s == "base:" || s == CONTEXT_BASE_ALLOCATION)
    };
    let mut out = Vec::new();
    if matches {
        let id = if set { CONTEXT_ID_BASE_ALLOCATION } else { 0 };
        let mut d = Vec::new();
        d.extend_from_slice(&id.to_be_bytes());
        d.extend_from_slice(CONTEXT_BASE_ALLOCATION.as_bytes());
        out.extend(codec::encode_option_reply(option, REP_META_CONTEXT, &d));
        if set {
            st.meta_export = Some(q.export.clone());
        }
    }
    out.extend(codec::encode_option_reply(option, REP_ACK, &[]));
    send(writer, &out).await
}

/// Sends the fixed-newstyle greeting and reads the client's flags: `None`
/// (logged) if they have bits the server does not know.
async fn greet<T: Transport>(io: &mut T) -> io::Result<Option<u32>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&INIT_PASSWD.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    io.send(&hello).await?;
    let mut cf = [0u8; 4];
    io.read_exact(&mut cf).await?;
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        crate::trouble::client_trouble(format_args!(
            "dropping client with unknown handshake flags 0x{client_flags:x}"
        ));
        return Ok(None);
    }
    Ok(Some(client_flags))
}

/// Options a refused client may send before it is dropped.
pub const REFUSAL_MAX_OPTIONS: u32 = 8;

/// The handshake of a client the server will not serve (its connection
/// limit is reached): the greeting, then every option the client sends is
/// answered `ERR_POLICY` with `why`, so the client can print the reason
/// instead of "server disconnected unexpectedly". No export is named and
/// no TLS is started; `EXPORT_NAME` (which cannot be answered with an
/// error), `ABORT`, option data above [`MAX_OPTION_DATA_BYTES`] or more
/// than [`REFUSAL_MAX_OPTIONS`] options end it. The caller bounds it in
/// time. `Ok` once the client is done with (always [`Outcome::Closed`]).
pub async fn refuse<T: Transport>(io: &mut T, why: &str) -> io::Result<Outcome> {
    if greet(io).await?.is_none() {
        return Ok(Outcome::Closed);
    }
    let mut data = Vec::new();
    for _ in 0..REFUSAL_MAX_OPTIONS {
        let mut hb = [0u8; OPTION_HEADER_BYTES];
        io.read_exact(&mut hb).await?;
        let Ok(head) = OptionHeader::decode(&hb) else {
            return Ok(Outcome::Closed);
        };
        if head.length > MAX_OPTION_DATA_BYTES || matches!(head.option, OPT_ABORT | OPT_EXPORT_NAME)
        {
            return Ok(Outcome::Closed);
        }
        data.clear();
        data.resize(head.length as usize, 0);
        io.read_exact(&mut data).await?;
        send_error(io, head.option, REP_ERR_POLICY, why).await?;
    }
    Ok(Outcome::Closed)
}

async fn send<T: Transport>(io: &mut T, bytes: &[u8]) -> io::Result<()> {
    io.send(bytes).await
}

async fn send_error<T: Transport>(io: &mut T, option: u32, rep: u32, msg: &str) -> io::Result<()> {
    io.send(&codec::encode_option_reply(option, rep, msg.as_bytes()))
        .await
}

/// Reads and drops `n` bytes with a small fixed buffer.
async fn discard<T: Transport>(io: &mut T, n: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 16 << 10];
    let mut left = n;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        io.read_exact(&mut buf[..k]).await?;
        left -= k as u64;
    }
    Ok(())
}
