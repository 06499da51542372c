//! Pure encoders and decoders of NBD messages: no I/O, no allocation that a
//! peer can size beyond the caller's buffer. Every decoder takes bytes from a
//! socket and returns a typed error for anything malformed — never panics —
//! which is what `fuzz/fuzz_targets/decode.rs` checks.
//!
//! Request lengths are carried as `u64`: compact headers hold 32 bits,
//! extended ones (`NBD_OPT_EXTENDED_HEADERS`, 32-byte requests and replies)
//! 64; see [`HeaderMode`] and [`ChunkStyle`].

use crate::proto::*;

/// Which request/reply header layout the connection uses, chosen during
/// option haggling: compact (28-byte requests, simple or structured
/// replies) unless the client negotiated `NBD_OPT_EXTENDED_HEADERS`
/// (32-byte requests with 64-bit lengths, 32-byte reply chunks only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HeaderMode {
    #[default]
    Compact,
    Extended,
}

impl HeaderMode {
    /// Size of a request header in this mode.
    pub fn request_header_bytes(self) -> usize {
        match self {
            Self::Compact => REQUEST_HEADER_BYTES,
            Self::Extended => EXTENDED_HEADER_BYTES,
        }
    }
}

/// A malformed message that cannot be answered in-band: the connection must
/// be dropped (the stream position is unknown afterwards).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("bad magic 0x{found:x} (expected 0x{expected:x})")]
    BadMagic { found: u64, expected: u64 },
    #[error("message too short: {len} bytes, need {need}")]
    Truncated { len: usize, need: usize },
    #[error("malformed message: {0}")]
    Malformed(&'static str),
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn need(b: &[u8], n: usize) -> Result<(), CodecError> {
    if b.len() < n {
        Err(CodecError::Truncated {
            len: b.len(),
            need: n,
        })
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------- options

/// The fixed 16-byte head of an option request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    /// Length of the option data that follows, in bytes.
    pub length: u32,
}

impl OptionHeader {
    pub fn decode(b: &[u8]) -> Result<Self, CodecError> {
        need(b, OPTION_HEADER_BYTES)?;
        let magic = be64(b, 0).unwrap_or(0);
        if magic != IHAVEOPT {
            return Err(CodecError::BadMagic {
                found: magic,
                expected: IHAVEOPT,
            });
        }
        Ok(Self {
            option: be32(b, 8).unwrap_or(0),
            length: be32(b, 12).unwrap_or(0),
        })
    }

    pub fn encode(&self) -> [u8; OPTION_HEADER_BYTES] {
        let mut out = [0u8; OPTION_HEADER_BYTES];
        out[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

/// Body of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub export: String,
    pub info_types: Vec<u16>,
}

/// Body of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaQuery {
    pub export: String,
    pub queries: Vec<String>,
}

/// A decoded option request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`; `None` if the name is not valid UTF-8 (which
    /// names no export: the server must then drop the connection).
    ExportName(Option<String>),
    Abort,
    List,
    StartTls,
    Info(InfoRequest),
    Go(InfoRequest),
    StructuredReply,
    ExtendedHeaders,
    ListMetaContext(MetaQuery),
    SetMetaContext(MetaQuery),
    /// An option this server does not implement (answered `ERR_UNSUP`).
    Unknown(u32),
}

/// Why a known option was refused; maps to an option error reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionError {
    /// `NBD_REP_ERR_INVALID`.
    #[error("invalid option: {0}")]
    Invalid(&'static str),
    /// `NBD_REP_ERR_TOO_BIG`.
    #[error("option too big: {0}")]
    TooBig(&'static str),
}

impl OptionError {
    pub fn reply_type(&self) -> u32 {
        match self {
            Self::Invalid(_) => REP_ERR_INVALID,
            Self::TooBig(_) => REP_ERR_TOO_BIG,
        }
    }
}

/// Most queries one meta-context option may carry.
pub const MAX_META_QUERIES: u32 = 64;
/// Most information requests one INFO/GO may carry (there are 4 types; a
/// client must not repeat one, so anything far above that is abuse).
pub const MAX_INFO_REQUESTS: u16 = 64;

fn protocol_string(b: &[u8]) -> Result<String, OptionError> {
    if b.len() > MAX_STRING_BYTES {
        return Err(OptionError::TooBig("string longer than 4096 bytes"));
    }
    if b.contains(&0) {
        return Err(OptionError::Invalid("string contains NUL"));
    }
    String::from_utf8(b.to_vec()).map_err(|_| OptionError::Invalid("string is not UTF-8"))
}

/// Reads a 32-bit-length-prefixed string at `*at`, advancing it.
fn prefixed_string(data: &[u8], at: &mut usize) -> Result<String, OptionError> {
    let len = be32(data, *at).ok_or(OptionError::Invalid("truncated string length"))? as usize;
    *at += 4;
    let end = at
        .checked_add(len)
        .filter(|&e| e <= data.len())
        .ok_or(OptionError::Invalid("string runs past the option data"))?;
    let s = protocol_string(&data[*at..end])?;
    *at = end;
    Ok(s)
}

fn parse_info(data: &[u8]) -> Result<InfoRequest, OptionError> {
    let mut at = 0;
    let export = prefixed_string(data, &mut at)?;
    let count = be16(data, at).ok_or(OptionError::Invalid("missing information request count"))?;
    at += 2;
    if count > MAX_INFO_REQUESTS {
        return Err(OptionError::TooBig("too many information requests"));
    }
    if data.len() - at != usize::from(count) * 2 {
        return Err(OptionError::Invalid(
            "information request count does not match the option length",
        ));
    }
    let info_types = (0..usize::from(count))
        .map(|i| be16(data, at + 2 * i).unwrap_or(u16::MAX))
        .collect();
    Ok(InfoRequest { export, info_types })
}

fn parse_meta(data: &[u8]) -> Result<MetaQuery, OptionError> {
    let mut at = 0;
    let export = prefixed_string(data, &mut at)?;
    let count = be32(data, at).ok_or(OptionError::Invalid("missing query count"))?;
    at += 4;
    if count > MAX_META_QUERIES {
        return Err(OptionError::TooBig("too many queries"));
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        queries.push(prefixed_string(data, &mut at)?);
    }
    if at != data.len() {
        return Err(OptionError::Invalid("trailing bytes after the queries"));
    }
    Ok(MetaQuery { export, queries })
}

fn no_data(data: &[u8], what: ClientOption) -> Result<ClientOption, OptionError> {
    if data.is_empty() {
        Ok(what)
    } else {
        Err(OptionError::Invalid("this option takes no data"))
    }
}

/// Decodes the data of option `option`.
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, OptionError> {
    match option {
        OPT_EXPORT_NAME => Ok(ClientOption::ExportName(protocol_string(data).ok())),
        // The spec asks servers to ignore data sent with ABORT.
        OPT_ABORT => Ok(ClientOption::Abort),
        OPT_LIST => no_data(data, ClientOption::List),
        OPT_STARTTLS => no_data(data, ClientOption::StartTls),
        OPT_INFO => parse_info(data).map(ClientOption::Info),
        OPT_GO => parse_info(data).map(ClientOption::Go),
        OPT_STRUCTURED_REPLY => no_data(data, ClientOption::StructuredReply),
        OPT_EXTENDED_HEADERS => no_data(data, ClientOption::ExtendedHeaders),
        OPT_LIST_META_CONTEXT => parse_meta(data).map(ClientOption::ListMetaContext),
        OPT_SET_META_CONTEXT => parse_meta(data).map(ClientOption::SetMetaContext),
        other => Ok(ClientOption::Unknown(other)),
    }
}

/// Encodes an option reply: header and data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Head of an option reply as a client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

impl OptionReplyHeader {
    pub const BYTES: usize = 20;
    pub fn decode(b: &[u8]) -> Result<Self, CodecError> {
        need(b, Self::BYTES)?;
        let magic = be64(b, 0).unwrap_or(0);
        if magic != OPTION_REPLY_MAGIC {
            return Err(CodecError::BadMagic {
                found: magic,
                expected: OPTION_REPLY_MAGIC,
            });
        }
        Ok(Self {
            option: be32(b, 8).unwrap_or(0),
            reply_type: be32(b, 12).unwrap_or(0),
            length: be32(b, 16).unwrap_or(0),
        })
    }
}

/// `NBD_INFO_EXPORT` payload (with its type field).
pub fn info_export(size_bytes: u64, transmission_flags: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    v.extend_from_slice(&size_bytes.to_be_bytes());
    v.extend_from_slice(&transmission_flags.to_be_bytes());
    v
}

/// `NBD_INFO_NAME` / `NBD_INFO_DESCRIPTION` payload.
pub fn info_string(info_type: u16, s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + s.len());
    v.extend_from_slice(&info_type.to_be_bytes());
    v.extend_from_slice(s.as_bytes());
    v
}

/// `NBD_INFO_BLOCK_SIZE` payload.
pub fn info_block_size(minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    v.extend_from_slice(&minimum.to_be_bytes());
    v.extend_from_slice(&preferred.to_be_bytes());
    v.extend_from_slice(&maximum.to_be_bytes());
    v
}

/// Encodes INFO/GO option data (client side).
pub fn encode_info_request(req: &InfoRequest) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(req.export.len() as u32).to_be_bytes());
    v.extend_from_slice(req.export.as_bytes());
    v.extend_from_slice(&(req.info_types.len() as u16).to_be_bytes());
    for t in &req.info_types {
        v.extend_from_slice(&t.to_be_bytes());
    }
    v
}

/// Encodes LIST/SET_META_CONTEXT option data (client side).
pub fn encode_meta_query(q: &MetaQuery) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(q.export.len() as u32).to_be_bytes());
    v.extend_from_slice(q.export.as_bytes());
    v.extend_from_slice(&(q.queries.len() as u32).to_be_bytes());
    for s in &q.queries {
        v.extend_from_slice(&(s.len() as u32).to_be_bytes());
        v.extend_from_slice(s.as_bytes());
    }
    v
}

// ---------------------------------------------------------------- requests

/// A transmission request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    /// Command type (`CMD_*`), possibly unknown.
    pub kind: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    pub offset: u64,
    /// 32 bits in compact headers; 64 in extended ones.
    pub length: u64,
}

impl Request {
    pub fn decode(mode: HeaderMode, b: &[u8]) -> Result<Self, CodecError> {
        match mode {
            HeaderMode::Extended => {
                need(b, EXTENDED_HEADER_BYTES)?;
                let magic = be32(b, 0).unwrap_or(0);
                if magic != EXTENDED_REQUEST_MAGIC {
                    return Err(CodecError::BadMagic {
                        found: magic.into(),
                        expected: EXTENDED_REQUEST_MAGIC.into(),
                    });
                }
                Ok(Self {
                    flags: be16(b, 4).unwrap_or(0),
                    kind: be16(b, 6).unwrap_or(0),
                    cookie: be64(b, 8).unwrap_or(0),
                    offset: be64(b, 16).unwrap_or(0),
                    length: be64(b, 24).unwrap_or(0),
                })
            }
            HeaderMode::Compact => {
                need(b, REQUEST_HEADER_BYTES)?;
                let magic = be32(b, 0).unwrap_or(0);
                if magic != REQUEST_MAGIC {
                    return Err(CodecError::BadMagic {
                        found: magic.into(),
                        expected: REQUEST_MAGIC.into(),
                    });
                }
                Ok(Self {
                    flags: be16(b, 4).unwrap_or(0),
                    kind: be16(b, 6).unwrap_or(0),
                    cookie: be64(b, 8).unwrap_or(0),
                    offset: be64(b, 16).unwrap_or(0),
                    length: be32(b, 24).unwrap_or(0).into(),
                })
            }
        }
    }

    /// Encodes a compact header (client side). `length` must fit 32 bits.
    pub fn encode(&self) -> Result<[u8; REQUEST_HEADER_BYTES], CodecError> {
        let length = u32::try_from(self.length)
            .map_err(|_| CodecError::Malformed("length does not fit a compact header"))?;
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..].copy_from_slice(&length.to_be_bytes());
        Ok(out)
    }

    /// Encodes an extended header (client side).
    pub fn encode_extended(&self) -> [u8; EXTENDED_HEADER_BYTES] {
        let mut out = [0u8; EXTENDED_HEADER_BYTES];
        out[..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    /// How many payload bytes follow this header on a compact connection.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes_in(HeaderMode::Compact)
    }

    /// How many payload bytes follow this header: a WRITE's data, and with
    /// extended headers whatever a request flagged `PAYLOAD_LEN` carries
    /// (read and dropped if the command does not take one).
    pub fn payload_bytes_in(&self, mode: HeaderMode) -> u64 {
        let flagged = mode == HeaderMode::Extended && self.flags & CMD_FLAG_PAYLOAD_LEN != 0;
        if self.kind == CMD_WRITE || flagged {
            self.length
        } else {
            0
        }
    }
}

/// What the server knows about the connection when it validates a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportContext {
    pub size_bytes: u64,
    pub read_only: bool,
    pub structured_replies: bool,
    /// `base:allocation` was selected for this export.
    pub base_allocation: bool,
    /// Extended headers were negotiated (implies structured replies).
    pub extended_headers: bool,
}

/// A validated command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Disconnect,
    Flush,
    Trim {
        offset: u64,
        length: u64,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u64,
    },
    WriteZeroes {
        offset: u64,
        length: u64,
        fua: bool,
        no_hole: bool,
        fast: bool,
    },
    BlockStatus {
        offset: u64,
        length: u64,
        req_one: bool,
    },
}

fn in_range(offset: u64, length: u64, size: u64) -> bool {
    offset.checked_add(length).is_some_and(|end| end <= size)
}

/// Validates a request against the export; the error is the protocol error
/// value to reply with (the connection stays usable).
pub fn validate(req: &Request, ctx: &ExportContext) -> Result<Command, u32> {
    let allowed = match req.kind {
        // With extended headers a WRITE may say its length is its payload.
        CMD_WRITE if ctx.extended_headers => CMD_FLAG_FUA | CMD_FLAG_PAYLOAD_LEN,
        CMD_READ if ctx.structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        CMD_READ | CMD_WRITE | CMD_DISC | CMD_FLUSH | CMD_TRIM | CMD_CACHE => CMD_FLAG_FUA,
        _ => return Err(EINVAL),
    };
    if req.flags & !allowed != 0 {
        return Err(EINVAL);
    }
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (offset, length, size) = (req.offset, req.length, ctx.size_bytes);
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && ctx.read_only {
        return Err(EPERM);
    }
    match req.kind {
        CMD_DISC => Ok(Command::Disconnect),
        CMD_FLUSH => {
            if offset != 0 || length != 0 {
                return Err(EINVAL);
            }
            Ok(Command::Flush)
        }
        CMD_READ | CMD_WRITE => {
            if length > u64::from(MAX_PAYLOAD_BYTES) {
                // The spec's hint for "longer than the advertised maximum
                // payload"; the connection stays usable.
                return Err(EOVERFLOW);
            }
            if !in_range(offset, length, size) {
                return Err(if req.kind == CMD_WRITE {
                    ENOSPC
                } else {
                    EINVAL
                });
            }
            let length = length as u32; // <= MAX_PAYLOAD_BYTES
            Ok(if req.kind == CMD_READ {
                Command::Read {
                    offset,
                    length,
                    df: req.flags & CMD_FLAG_DF != 0,
                }
            } else {
                Command::Write {
                    offset,
                    length,
                    fua,
                }
            })
        }
        CMD_TRIM | CMD_CACHE | CMD_BLOCK_STATUS => {
            if !in_range(offset, length, size) {
                return Err(EINVAL);
            }
            match req.kind {
                CMD_TRIM => Ok(Command::Trim {
                    offset,
                    length,
                    fua,
                }),
                CMD_CACHE => Ok(Command::Cache { offset, length }),
                _ => {
                    if !ctx.base_allocation || length == 0 {
                        return Err(EINVAL);
                    }
                    Ok(Command::BlockStatus {
                        offset,
                        length,
                        req_one: req.flags & CMD_FLAG_REQ_ONE != 0,
                    })
                }
            }
        }
        CMD_WRITE_ZEROES => {
            if !in_range(offset, length, size) {
                return Err(ENOSPC);
            }
            Ok(Command::WriteZeroes {
                offset,
                length,
                fua,
                no_hole: req.flags & CMD_FLAG_NO_HOLE != 0,
                fast: req.flags & CMD_FLAG_FAST_ZERO != 0,
            })
        }
        _ => Err(EINVAL),
    }
}

// ---------------------------------------------------------------- replies

/// A simple reply header.
pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    out[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// How reply chunks are framed on a connection: compact structured chunks
/// (20-byte header, 32-bit length) or extended ones (32-byte header with
/// the request's offset and a 64-bit length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkStyle {
    pub extended: bool,
    /// The offset of the request answered (extended headers echo it).
    pub request_offset: u64,
}

impl ChunkStyle {
    pub const COMPACT: Self = Self {
        extended: false,
        request_offset: 0,
    };
}

/// A reply chunk header; `length` is the payload that follows. In the
/// compact style the caller keeps `length` within 32 bits (payloads here
/// are at most [`MAX_PAYLOAD_BYTES`] plus a few bytes of framing).
pub fn encode_chunk_header(
    style: ChunkStyle,
    flags: u16,
    chunk_type: u16,
    cookie: u64,
    length: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(EXTENDED_HEADER_BYTES);
    let magic = if style.extended {
        EXTENDED_REPLY_MAGIC
    } else {
        STRUCTURED_REPLY_MAGIC
    };
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&chunk_type.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    if style.extended {
        out.extend_from_slice(&style.request_offset.to_be_bytes());
        out.extend_from_slice(&length.to_be_bytes());
    } else {
        debug_assert!(length <= u64::from(u32::MAX));
        out.extend_from_slice(&(length.min(u64::from(u32::MAX)) as u32).to_be_bytes());
    }
    out
}

/// A whole final `NBD_REPLY_TYPE_NONE` chunk: success without data.
pub fn encode_done_chunk(style: ChunkStyle, cookie: u64) -> Vec<u8> {
    encode_chunk_header(style, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0)
}

/// A whole `NBD_REPLY_TYPE_ERROR` chunk (header and payload), final.
pub fn encode_error_chunk(style: ChunkStyle, cookie: u64, error: u32, message: &str) -> Vec<u8> {
    // Messages are ours, but keep the protocol's string limit regardless.
    let msg = &message.as_bytes()[..message.len().min(MAX_STRING_BYTES)];
    let mut out = encode_chunk_header(
        style,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + msg.len() as u64,
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// A whole `NBD_REPLY_TYPE_OFFSET_HOLE` chunk.
pub fn encode_hole_chunk(
    style: ChunkStyle,
    cookie: u64,
    done: bool,
    offset: u64,
    length: u32,
) -> Vec<u8> {
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let mut out = encode_chunk_header(style, flags, REPLY_TYPE_OFFSET_HOLE, cookie, 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out
}

/// Head of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk: header and offset; the
/// `data_len` data bytes follow.
pub fn encode_data_chunk_head(
    style: ChunkStyle,
    cookie: u64,
    done: bool,
    offset: u64,
    data_len: u32,
) -> Vec<u8> {
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let mut out = encode_chunk_header(
        style,
        flags,
        REPLY_TYPE_OFFSET_DATA,
        cookie,
        8 + u64::from(data_len),
    );
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

/// A whole block-status chunk, final. `extents` are (length, flags) pairs;
/// there must be at least one. Compact: `NBD_REPLY_TYPE_BLOCK_STATUS` with
/// 32-bit lengths (the caller splits longer extents); extended:
/// `NBD_REPLY_TYPE_BLOCK_STATUS_EXT` with a count and 64-bit fields.
pub fn encode_block_status_chunk(
    style: ChunkStyle,
    cookie: u64,
    context_id: u32,
    extents: &[(u64, u32)],
) -> Vec<u8> {
    let (chunk_type, payload) = if style.extended {
        (REPLY_TYPE_BLOCK_STATUS_EXT, 8 + 16 * extents.len())
    } else {
        (REPLY_TYPE_BLOCK_STATUS, 4 + 8 * extents.len())
    };
    let mut out = encode_chunk_header(style, REPLY_FLAG_DONE, chunk_type, cookie, payload as u64);
    out.extend_from_slice(&context_id.to_be_bytes());
    if style.extended {
        out.extend_from_slice(&(extents.len() as u32).to_be_bytes());
    }
    for &(len, flags) in extents {
        if style.extended {
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&u64::from(flags).to_be_bytes());
        } else {
            debug_assert!(len <= u64::from(u32::MAX));
            out.extend_from_slice(&(len.min(u64::from(u32::MAX)) as u32).to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
        }
    }
    out
}

/// A reply header as a client decodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    /// Simple reply: error, cookie. (Read data, if any, follows.)
    Simple { error: u32, cookie: u64 },
    /// Structured chunk: flags, type, cookie, payload length.
    Chunk {
        flags: u16,
        chunk_type: u16,
        cookie: u64,
        length: u32,
    },
    /// Extended chunk: as a structured one, plus the request's offset and a
    /// 64-bit payload length.
    Extended {
        flags: u16,
        chunk_type: u16,
        cookie: u64,
        offset: u64,
        length: u64,
    },
}

impl ReplyHeader {
    /// Decodes from the first 4 bytes (magic) plus the rest: a simple reply is
    /// 16 bytes, a chunk header 20; `b` must hold at least as many bytes as
    /// [`ReplyHeader::bytes_for_magic`] says.
    pub fn decode(b: &[u8]) -> Result<Self, CodecError> {
        need(b, 4)?;
        let magic = be32(b, 0).unwrap_or(0);
        match magic {
            SIMPLE_REPLY_MAGIC => {
                need(b, SIMPLE_REPLY_BYTES)?;
                Ok(Self::Simple {
                    error: be32(b, 4).unwrap_or(0),
                    cookie: be64(b, 8).unwrap_or(0),
                })
            }
            STRUCTURED_REPLY_MAGIC => {
                need(b, STRUCTURED_HEADER_BYTES)?;
                Ok(Self::Chunk {
                    flags: be16(b, 4).unwrap_or(0),
                    chunk_type: be16(b, 6).unwrap_or(0),
                    cookie: be64(b, 8).unwrap_or(0),
                    length: be32(b, 16).unwrap_or(0),
                })
            }
            EXTENDED_REPLY_MAGIC => {
                need(b, EXTENDED_HEADER_BYTES)?;
                Ok(Self::Extended {
                    flags: be16(b, 4).unwrap_or(0),
                    chunk_type: be16(b, 6).unwrap_or(0),
                    cookie: be64(b, 8).unwrap_or(0),
                    offset: be64(b, 16).unwrap_or(0),
                    length: be64(b, 24).unwrap_or(0),
                })
            }
            other => Err(CodecError::BadMagic {
                found: other.into(),
                expected: SIMPLE_REPLY_MAGIC.into(),
            }),
        }
    }

    /// Header size implied by a reply magic, if it is one.
    pub fn bytes_for_magic(magic: u32) -> Option<usize> {
        match magic {
            SIMPLE_REPLY_MAGIC => Some(SIMPLE_REPLY_BYTES),
            STRUCTURED_REPLY_MAGIC => Some(STRUCTURED_HEADER_BYTES),
            EXTENDED_REPLY_MAGIC => Some(EXTENDED_HEADER_BYTES),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let b = r.encode().unwrap();
        assert_eq!(Request::decode(HeaderMode::Compact, &b).unwrap(), r);
        assert_eq!(r.payload_bytes(), 4096);
    }

    #[test]
    fn request_rejects_bad_magic_and_truncation() {
        let mut b = Request {
            flags: 0,
            kind: CMD_READ,
            cookie: 1,
            offset: 0,
            length: 1,
        }
        .encode()
        .unwrap();
        assert!(matches!(
            Request::decode(HeaderMode::Compact, &b[..27]),
            Err(CodecError::Truncated { .. })
        ));
        b[0] ^= 0xff;
        assert!(matches!(
            Request::decode(HeaderMode::Compact, &b),
            Err(CodecError::BadMagic { .. })
        ));
    }

    #[test]
    fn option_header_round_trip() {
        let h = OptionHeader {
            option: OPT_GO,
            length: 77,
        };
        assert_eq!(OptionHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn info_request_round_trip() {
        let req = InfoRequest {
            export: "disk1".into(),
            info_types: vec![INFO_NAME, INFO_BLOCK_SIZE],
        };
        let data = encode_info_request(&req);
        assert_eq!(
            parse_option(OPT_GO, &data).unwrap(),
            ClientOption::Go(req.clone())
        );
        assert_eq!(
            parse_option(OPT_INFO, &data).unwrap(),
            ClientOption::Info(req)
        );
    }

    #[test]
    fn info_request_with_wrong_count_is_invalid() {
        let mut data = encode_info_request(&InfoRequest {
            export: "x".into(),
            info_types: vec![1, 2],
        });
        data.pop();
        assert!(matches!(
            parse_option(OPT_GO, &data),
            Err(OptionError::Invalid(_))
        ));
        // Name length pointing past the end.
        let bad = [0xff, 0xff, 0xff, 0xf0, 0, 0];
        assert!(matches!(
            parse_option(OPT_GO, &bad),
            Err(OptionError::Invalid(_))
        ));
    }

    #[test]
    fn meta_query_round_trip() {
        let q = MetaQuery {
            export: "".into(),
            queries: vec!["base:allocation".into(), "qemu:dirty-bitmap:x".into()],
        };
        let data = encode_meta_query(&q);
        assert_eq!(
            parse_option(OPT_SET_META_CONTEXT, &data).unwrap(),
            ClientOption::SetMetaContext(q.clone())
        );
        let mut trailing = data.clone();
        trailing.push(0);
        assert!(parse_option(OPT_LIST_META_CONTEXT, &trailing).is_err());
    }

    #[test]
    fn options_without_data_reject_data() {
        assert_eq!(parse_option(OPT_LIST, &[]).unwrap(), ClientOption::List);
        assert!(parse_option(OPT_LIST, &[1]).is_err());
        assert!(parse_option(OPT_STRUCTURED_REPLY, &[1]).is_err());
        assert_eq!(
            parse_option(OPT_ABORT, &[1, 2]).unwrap(),
            ClientOption::Abort
        );
        assert_eq!(
            parse_option(0x1234, &[9; 10]).unwrap(),
            ClientOption::Unknown(0x1234)
        );
        assert_eq!(
            parse_option(OPT_EXPORT_NAME, &[0xff]).unwrap(),
            ClientOption::ExportName(None)
        );
    }

    #[test]
    fn option_reply_round_trip() {
        let data = info_export(1 << 30, FLAG_HAS_FLAGS | FLAG_SEND_FUA);
        let b = encode_option_reply(OPT_GO, REP_INFO, &data);
        let h = OptionReplyHeader::decode(&b).unwrap();
        assert_eq!(
            h,
            OptionReplyHeader {
                option: OPT_GO,
                reply_type: REP_INFO,
                length: 12
            }
        );
        assert_eq!(&b[20..], &data[..]);
    }

    #[test]
    fn reply_headers_round_trip() {
        let s = encode_simple_reply(EINVAL, 42);
        assert_eq!(
            ReplyHeader::decode(&s).unwrap(),
            ReplyHeader::Simple {
                error: EINVAL,
                cookie: 42
            }
        );
        let e = encode_error_chunk(ChunkStyle::COMPACT, 7, EIO, "boom");
        assert_eq!(
            ReplyHeader::decode(&e).unwrap(),
            ReplyHeader::Chunk {
                flags: REPLY_FLAG_DONE,
                chunk_type: REPLY_TYPE_ERROR,
                cookie: 7,
                length: 10
            }
        );
        let bs = encode_block_status_chunk(
            ChunkStyle::COMPACT,
            9,
            1,
            &[(4096, 0), (8192, STATE_HOLE | STATE_ZERO)],
        );
        assert_eq!(bs.len(), 20 + 4 + 16);
        assert!(ReplyHeader::decode(&[0, 1, 2, 3]).is_err());
    }

    fn ctx() -> ExportContext {
        ExportContext {
            size_bytes: 1 << 20,
            read_only: false,
            structured_replies: true,
            base_allocation: true,
            extended_headers: false,
        }
    }

    fn req(kind: u16, flags: u16, offset: u64, length: u64) -> Request {
        Request {
            flags,
            kind,
            cookie: 1,
            offset,
            length,
        }
    }

    #[test]
    fn validate_maps_errors_as_the_spec_says() {
        let c = ctx();
        assert_eq!(validate(&req(CMD_WRITE, 0, 1 << 20, 1), &c), Err(ENOSPC));
        assert_eq!(
            validate(&req(CMD_WRITE_ZEROES, 0, 1 << 20, 1), &c),
            Err(ENOSPC)
        );
        assert_eq!(validate(&req(CMD_READ, 0, 1 << 20, 1), &c), Err(EINVAL));
        assert_eq!(validate(&req(CMD_TRIM, 0, u64::MAX, 2), &c), Err(EINVAL));
        assert_eq!(validate(&req(99, 0, 0, 0), &c), Err(EINVAL));
        assert_eq!(validate(&req(CMD_READ, 1 << 9, 0, 1), &c), Err(EINVAL));
        assert_eq!(
            validate(&req(CMD_WRITE, CMD_FLAG_DF, 0, 1), &c),
            Err(EINVAL)
        );
        assert_eq!(validate(&req(CMD_FLUSH, 0, 1, 0), &c), Err(EINVAL));
        assert_eq!(
            validate(&req(CMD_READ, 0, 0, u64::from(MAX_PAYLOAD_BYTES) + 1), &c),
            Err(EOVERFLOW)
        );
        assert_eq!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 0), &c), Err(EINVAL));
        let ro = ExportContext {
            read_only: true,
            ..c
        };
        assert_eq!(validate(&req(CMD_WRITE, 0, 0, 1), &ro), Err(EPERM));
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, 1), &ro), Err(EPERM));
        assert!(validate(&req(CMD_READ, CMD_FLAG_FUA, 0, 1), &ro).is_ok());
        let simple = ExportContext {
            structured_replies: false,
            base_allocation: false,
            ..c
        };
        assert_eq!(
            validate(&req(CMD_READ, CMD_FLAG_DF, 0, 1), &simple),
            Err(EINVAL)
        );
        assert_eq!(
            validate(&req(CMD_BLOCK_STATUS, 0, 0, 1), &simple),
            Err(EINVAL)
        );
    }

    #[test]
    fn validate_accepts_good_requests() {
        let c = ctx();
        assert_eq!(
            validate(&req(CMD_WRITE, CMD_FLAG_FUA, 4096, 4096), &c),
            Ok(Command::Write {
                offset: 4096,
                length: 4096,
                fua: true
            })
        );
        assert_eq!(
            validate(
                &req(
                    CMD_WRITE_ZEROES,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                    0,
                    1 << 20
                ),
                &c
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 1 << 20,
                fua: false,
                no_hole: true,
                fast: true
            })
        );
        assert_eq!(
            validate(&req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 512), &c),
            Ok(Command::BlockStatus {
                offset: 0,
                length: 512,
                req_one: true
            })
        );
        assert_eq!(
            validate(&req(CMD_FLUSH, CMD_FLAG_FUA, 0, 0), &c),
            Ok(Command::Flush)
        );
    }

    #[test]
    fn extended_request_round_trip_with_64_bit_length() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE_ZEROES,
            cookie: 77,
            offset: 1 << 41,
            length: (5 << 32) + 4096,
        };
        let b = r.encode_extended();
        assert_eq!(Request::decode(HeaderMode::Extended, &b).unwrap(), r);
        assert!(Request::decode(HeaderMode::Compact, &b).is_err());
        assert!(matches!(
            Request::decode(HeaderMode::Extended, &b[..31]),
            Err(CodecError::Truncated { .. })
        ));
        // PAYLOAD_LEN: the length is a payload, whatever the command.
        let bs = Request {
            flags: CMD_FLAG_PAYLOAD_LEN,
            kind: CMD_BLOCK_STATUS,
            ..r
        };
        assert_eq!(bs.payload_bytes_in(HeaderMode::Extended), bs.length);
        assert_eq!(bs.payload_bytes_in(HeaderMode::Compact), 0);
        let ext = ExportContext {
            extended_headers: true,
            size_bytes: 1 << 50,
            ..ctx()
        };
        assert_eq!(validate(&bs, &ext), Err(EINVAL));
        // 64-bit effect lengths are fine for non-payload commands.
        assert!(matches!(
            validate(&r, &ext),
            Ok(Command::WriteZeroes { length, .. }) if length == (5 << 32) + 4096
        ));
        let w = Request {
            flags: CMD_FLAG_PAYLOAD_LEN,
            kind: CMD_WRITE,
            length: 4096,
            ..r
        };
        assert!(validate(&w, &ext).is_ok());
        assert_eq!(validate(&w, &ctx()), Err(EINVAL));
    }

    #[test]
    fn extended_reply_chunks_decode_back() {
        let style = ChunkStyle {
            extended: true,
            request_offset: 1 << 33,
        };
        let b = encode_error_chunk(style, 5, EOVERFLOW, "too long");
        assert_eq!(b.len(), EXTENDED_HEADER_BYTES + 6 + 8);
        assert_eq!(
            ReplyHeader::decode(&b).unwrap(),
            ReplyHeader::Extended {
                flags: REPLY_FLAG_DONE,
                chunk_type: REPLY_TYPE_ERROR,
                cookie: 5,
                offset: 1 << 33,
                length: 14
            }
        );
        assert_eq!(
            ReplyHeader::bytes_for_magic(EXTENDED_REPLY_MAGIC),
            Some(EXTENDED_HEADER_BYTES)
        );
        let bs = encode_block_status_chunk(style, 6, 1, &[(5 << 32, STATE_ZERO), (4096, 0)]);
        assert_eq!(bs.len(), EXTENDED_HEADER_BYTES + 8 + 32);
        assert_eq!(&bs[32..36], &1u32.to_be_bytes());
        assert_eq!(&bs[36..40], &2u32.to_be_bytes());
        assert_eq!(&bs[40..48], &(5u64 << 32).to_be_bytes());
        assert_eq!(&bs[48..56], &u64::from(STATE_ZERO).to_be_bytes());
        let done = encode_done_chunk(style, 9);
        assert!(matches!(
            ReplyHeader::decode(&done).unwrap(),
            ReplyHeader::Extended {
                chunk_type: REPLY_TYPE_NONE,
                length: 0,
                cookie: 9,
                ..
            }
        ));
    }

    proptest::proptest! {
        #[test]
        fn requests_round_trip_in_both_modes(
            flags: u16, kind: u16, cookie: u64, offset: u64, length: u64,
        ) {
            let r = Request { flags, kind, cookie, offset, length };
            let ext = Request::decode(HeaderMode::Extended, &r.encode_extended()).unwrap();
            proptest::prop_assert_eq!(ext, r);
            let short = Request { length: u64::from(length as u32), ..r };
            let compact = Request::decode(HeaderMode::Compact, &short.encode().unwrap()).unwrap();
            proptest::prop_assert_eq!(compact, short);
        }

        #[test]
        fn decoders_never_panic(bytes: Vec<u8>, mode_ext: bool) {
            let mode = if mode_ext { HeaderMode::Extended } else { HeaderMode::Compact };
            let _ = Request::decode(mode, &bytes);
            let _ = ReplyHeader::decode(&bytes);
            let _ = OptionHeader::decode(&bytes);
            for opt in 0..13 {
                let _ = parse_option(opt, &bytes);
            }
        }
    }
}
